package cli_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/cmd/sluice/internal/cli"
)

// moveTaskSQS plays an SQS that supports message move tasks, which the local emulator does not:
// any call outside the move-task path panics through the nil embedded interface.
type moveTaskSQS struct {
	cli.SQSAPI
	mu       sync.Mutex
	started  []sqs.StartMessageMoveTaskInput
	statuses []string // successive ListMessageMoveTasks answers; "" = no task
}

const (
	mtDLQ = "https://sqs.eu-west-1.amazonaws.com/123456789012/billing-dlq"
	mtSrc = "https://sqs.eu-west-1.amazonaws.com/123456789012/billing"
)

func (f *moveTaskSQS) GetQueueAttributes(_ context.Context, in *sqs.GetQueueAttributesInput, _ ...func(*sqs.Options)) (*sqs.GetQueueAttributesOutput, error) {
	name := aws.ToString(in.QueueUrl)[strings.LastIndex(aws.ToString(in.QueueUrl), "/")+1:]
	return &sqs.GetQueueAttributesOutput{Attributes: map[string]string{
		"QueueArn": "arn:aws:sqs:eu-west-1:123456789012:" + name, "ApproximateNumberOfMessages": "40", "MessageRetentionPeriod": "1209600",
	}}, nil
}

func (f *moveTaskSQS) ListDeadLetterSourceQueues(context.Context, *sqs.ListDeadLetterSourceQueuesInput, ...func(*sqs.Options)) (*sqs.ListDeadLetterSourceQueuesOutput, error) {
	return &sqs.ListDeadLetterSourceQueuesOutput{QueueUrls: []string{mtSrc}}, nil
}

func (f *moveTaskSQS) StartMessageMoveTask(_ context.Context, in *sqs.StartMessageMoveTaskInput, _ ...func(*sqs.Options)) (*sqs.StartMessageMoveTaskOutput, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.started = append(f.started, *in)
	return &sqs.StartMessageMoveTaskOutput{TaskHandle: aws.String("h")}, nil
}

func (f *moveTaskSQS) ListMessageMoveTasks(context.Context, *sqs.ListMessageMoveTasksInput, ...func(*sqs.Options)) (*sqs.ListMessageMoveTasksOutput, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	st := f.statuses[0]
	if len(f.statuses) > 1 {
		f.statuses = f.statuses[1:]
	}
	if st == "" {
		return &sqs.ListMessageMoveTasksOutput{}, nil
	}
	moved := int64(10)
	if st == "COMPLETED" {
		moved = 40
	}
	return &sqs.ListMessageMoveTasksOutput{Results: []sqstypes.ListMessageMoveTasksResultEntry{{
		Status: aws.String(st), ApproximateNumberOfMessagesMoved: moved, ApproximateNumberOfMessagesToMove: aws.Int64(40),
	}}}, nil
}

func TestRedriveUsesMessageMoveTaskWhereSupported(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	// No task yet: one is started towards the source queue and followed to completion.
	f := &moveTaskSQS{statuses: []string{"", "RUNNING", "COMPLETED"}}
	var progress strings.Builder
	res, err := cli.Redrive(ctx, f, cli.RedriveOptions{DLQ: mtDLQ, Progress: &progress, PollInterval: time.Millisecond})
	require.NoError(t, err)
	require.Equal(t, "message move task", res.Method)
	require.Equal(t, 40, res.Moved)
	require.Equal(t, mtSrc, res.Destination)
	require.Len(t, f.started, 1)
	require.Equal(t, "arn:aws:sqs:eu-west-1:123456789012:billing-dlq", aws.ToString(f.started[0].SourceArn))
	require.Equal(t, "arn:aws:sqs:eu-west-1:123456789012:billing", aws.ToString(f.started[0].DestinationArn))
	require.Contains(t, progress.String(), "redrive: moved 40 of ~40")

	// A task already running (an earlier, interrupted run): follow it, start nothing.
	f = &moveTaskSQS{statuses: []string{"RUNNING", "RUNNING", "COMPLETED"}}
	res, err = cli.Redrive(ctx, f, cli.RedriveOptions{DLQ: mtDLQ, PollInterval: time.Millisecond})
	require.NoError(t, err)
	require.Empty(t, f.started)
	require.Equal(t, 40, res.Moved)

	// Interrupted while following: the error says the task keeps running in SQS.
	f = &moveTaskSQS{statuses: []string{"", "RUNNING"}}
	ictx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	_, err = cli.Redrive(ictx, f, cli.RedriveOptions{DLQ: mtDLQ, PollInterval: time.Millisecond})
	require.ErrorIs(t, err, cli.ErrInterrupted)
	require.ErrorContains(t, err, "keeps running in SQS")

	// A failed task is an error naming the reason.
	f = &moveTaskSQS{statuses: []string{"", "FAILED"}}
	_, err = cli.Redrive(ctx, f, cli.RedriveOptions{DLQ: mtDLQ, PollInterval: time.Millisecond})
	require.ErrorContains(t, err, "message move task failed")
}
