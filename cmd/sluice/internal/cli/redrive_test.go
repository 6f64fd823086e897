package cli_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/cmd/sluice/internal/cli"
)

// faultySQS interrupts a redrive at chosen points: it cancels the command's context right
// after a chosen SendMessageBatch succeeded (Ctrl-C), or fails a chosen DeleteMessageBatch as if
// the process died between send and delete.
type faultySQS struct {
	cli.SQSAPI
	sends, deletes   atomic.Int32
	cancelAfterSends int32
	cancel           context.CancelFunc
	failDelete       int32
}

func (f *faultySQS) SendMessageBatch(ctx context.Context, in *sqs.SendMessageBatchInput, opts ...func(*sqs.Options)) (*sqs.SendMessageBatchOutput, error) {
	out, err := f.SQSAPI.SendMessageBatch(ctx, in, opts...)
	if err == nil && f.sends.Add(1) == f.cancelAfterSends && f.cancel != nil {
		f.cancel()
	}
	return out, err
}

func (f *faultySQS) DeleteMessageBatch(ctx context.Context, in *sqs.DeleteMessageBatchInput, opts ...func(*sqs.Options)) (*sqs.DeleteMessageBatchOutput, error) {
	if f.deletes.Add(1) == f.failDelete {
		return nil, errors.New("connection reset (simulated crash)")
	}
	return f.SQSAPI.DeleteMessageBatch(ctx, in, opts...)
}

var movedRe = regexp.MustCompile(`moved (\d+) messages`)

func moved(t *testing.T, out string) int {
	t.Helper()
	m := movedRe.FindStringSubmatch(out)
	require.NotNil(t, m, out)
	n, _ := strconv.Atoi(m[1])
	return n
}

func TestRedriveSurvivesInterruptionAndKeepsMessages(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	c := b.withAWS(t)
	queueURL, dlqURL := queuePair(t, c, false)
	const total = 25
	for i := range total {
		_, err := c.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(dlqURL), MessageBody: aws.String(fmt.Sprintf(`{"n":%d}`, i)),
			MessageAttributes: map[string]sqstypes.MessageAttributeValue{
				"messageId": {DataType: aws.String("String"), StringValue: aws.String(fmt.Sprintf("m-%d", i))},
				"eventType": {DataType: aws.String("String"), StringValue: aws.String("OrderCreated")},
			}})
		require.NoError(t, err)
	}

	// 1. Ctrl-C after the second batch was sent: what was sent is deleted, the rest stays.
	ictx, cancel := context.WithCancel(ctx)
	defer cancel()
	f := &faultySQS{cancelAfterSends: 2, cancel: cancel}
	r := b.runWith(t, ictx, &cli.Hooks{WrapSQS: func(s cli.SQSAPI) cli.SQSAPI { f.SQSAPI = s; return f }}, "redrive", "--dlq", dlqURL, "--yes")
	require.Equal(t, 1, r.code, r.err)
	require.Contains(t, r.err, "interrupted after moving")
	require.Contains(t, r.err, "run the same command to continue")
	n := moved(t, r.out)
	require.Greater(t, n, 0)
	require.Equal(t, n, queueDepth(t, c, queueURL), "every message reported moved is in the source queue")
	require.Equal(t, total-n, queueDepth(t, c, dlqURL), "nothing lost, nothing duplicated")

	// 2. A crash between send and delete: the batch is in both queues, never in neither.
	f2 := &faultySQS{failDelete: 1}
	r = b.runWith(t, ctx, &cli.Hooks{WrapSQS: func(s cli.SQSAPI) cli.SQSAPI { f2.SQSAPI = s; return f2 }}, "redrive", "--dlq", dlqURL, "--yes")
	require.Equal(t, 1, r.code, r.err)
	require.Contains(t, r.err, "in both queues")
	require.GreaterOrEqual(t, queueDepth(t, c, queueURL)+queueDepth(t, c, dlqURL), total)

	// 3. Re-running moves the rest. The crashed batch's DLQ copies stay invisible until their
	// visibility timeout ends; a later redrive would move them again as duplicates (which the
	// consumer's inbox deduplicates by messageId).
	r = b.runWith(t, ctx, nil, "redrive", "--dlq", dlqURL, "--max", "1000", "--yes")
	require.Equal(t, 0, r.code, r.err)
	require.Contains(t, r.out, "(receive/send/delete)")

	got := drain(t, c, queueURL, total)
	ids := map[string]string{}
	for _, m := range got {
		id := aws.ToString(m.MessageAttributes["messageId"].StringValue)
		require.Equal(t, "OrderCreated", aws.ToString(m.MessageAttributes["eventType"].StringValue), "attributes kept")
		var body struct{ N int }
		require.NoError(t, json.Unmarshal([]byte(aws.ToString(m.Body)), &body))
		require.Equal(t, fmt.Sprintf("m-%d", body.N), id, "body kept with its attributes")
		ids[id] = aws.ToString(m.Body)
	}
	require.Len(t, ids, total, "every message reached the source queue")
	require.Len(t, got, total, "no message was sent twice")
	require.Positive(t, queueDepth(t, c, dlqURL), "the crashed batch's copies wait in the DLQ: never deleted before they were sent")
}

func TestRedriveFIFOKeepsGroupsAndHonoursMax(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	c := b.withAWS(t)
	queueURL, dlqURL := queuePair(t, c, true)
	for i, g := range []string{"g1", "g1", "g2"} {
		_, err := c.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(dlqURL), MessageBody: aws.String(strconv.Itoa(i)),
			MessageGroupId: aws.String(g), MessageDeduplicationId: aws.String("d-" + strconv.Itoa(i))})
		require.NoError(t, err)
	}
	require.Equal(t, 2, moved(t, b.ok(t, "redrive", "--dlq", dlqURL, "--max", "2", "--yes")))
	require.Equal(t, 1, queueDepth(t, c, dlqURL))
	require.Equal(t, 1, moved(t, b.ok(t, "redrive", "--dlq", dlqURL, "--yes")))
	require.Equal(t, 0, queueDepth(t, c, dlqURL))

	got := drain(t, c, queueURL, 3)
	require.Len(t, got, 3)
	var g1 []string
	for _, m := range got {
		i, _ := strconv.Atoi(aws.ToString(m.Body))
		require.Equal(t, []string{"g1", "g1", "g2"}[i], m.Attributes["MessageGroupId"])
		require.Equal(t, "d-"+strconv.Itoa(i), m.Attributes["MessageDeduplicationId"])
		if m.Attributes["MessageGroupId"] == "g1" {
			g1 = append(g1, aws.ToString(m.Body))
		}
	}
	require.Equal(t, []string{"0", "1"}, g1, "order within a group kept")
}
