package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/demoapp"
	"github.com/sluicehq/sluice/internal/localaws"
	"github.com/sluicehq/sluice/internal/localrun"
	"github.com/sluicehq/sluice/internal/wire"
	"github.com/sluicehq/sluice/pkg/lambdaenv"
	"github.com/sluicehq/sluice/pkg/outbox"
)

// bigOrder is the demo's OrderCreated with an attachment that makes it as large as asked; the
// ledger decodes the order's fields and ignores the rest.
type bigOrder struct {
	demoapp.OrderCreated
	Attachment string `json:"attachment,omitempty"`
}

// placeBig commits an order and its event, as demoapp.PlaceOrder does, with a writer that
// accepts payloads up to the claim check's maximum.
func (b *bundle) placeBig(t *testing.T, w *outbox.Writer, o bigOrder) uuid.UUID {
	t.Helper()
	payload, err := json.Marshal(o)
	require.NoError(t, err)
	var id uuid.UUID
	require.NoError(t, pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(b.ctx, `INSERT INTO demo_orders (order_id, customer, seq, amount_cents, currency) VALUES ($1, $2, $3, $4, $5)`,
			o.OrderID, o.Customer, o.Seq, o.AmountCents, o.Currency); err != nil {
			return err
		}
		written, err := w.Write(b.ctx, tx, outbox.Message{Topic: demoapp.Topic, AggregateType: "order", AggregateID: o.OrderID,
			EventType: demoapp.EventOrderCreated, PartitionKey: o.Customer, Payload: payload})
		if err != nil {
			return err
		}
		id = written[0].EventID
		return nil
	}))
	b.written++
	return id
}

// The claim check end to end through the real relay and consumer Lambdas (runtime interface
// emulator) on a FIFO topic and queue, with the emulator's S3: orders of up to 5 MB, mixed with
// small ones, are each applied exactly once and in per-customer order; each large one's payload
// went to S3 at prefix + event id, byte for byte what the outbox row holds; a message produced
// by hand in the AWS extended clients' format is applied by the consumer Lambda; one whose
// object is missing fails every delivery and reaches the DLQ after maxReceiveCount.
func TestClaimCheckMultiMegabytePayloadsThroughTheLambdas(t *testing.T) {
	t.Parallel()
	s3c := s3.NewFromConfig(localaws.TestConfig(t), func(o *s3.Options) { o.UsePathStyle, o.DisableLogOutputChecksumValidationSkipped = true, true })
	bucket := "sluice-e2e-" + strings.ReplaceAll(uuid.NewString(), "-", "")[:16]
	_, err := s3c.CreateBucket(context.Background(), &s3.CreateBucketInput{Bucket: aws.String(bucket)})
	require.NoError(t, err)
	const prefix = "e2e/"
	b := setup(t, func(o *localrun.StackOptions) {
		o.FIFO = true
		o.RelayEnv = append(o.RelayEnv, lambdaenv.ClaimCheckBucket+"="+bucket, lambdaenv.ClaimCheckPrefix+"="+prefix,
			lambdaenv.ClaimCheckMaxPayload+"="+strconv.Itoa(8<<20))
		o.ConsumerEnv = append(o.ConsumerEnv, lambdaenv.ClaimCheckBucket+"="+bucket, lambdaenv.ClaimCheckMaxPayload+"="+strconv.Itoa(8<<20))
	})
	w, err := outbox.NewWriter(outbox.WriterConfig{MaxMessageBytes: 8 << 20})
	require.NoError(t, err)

	large := map[uuid.UUID]bool{}
	seq := map[string]int{}
	for i := range 24 {
		customer := fmt.Sprintf("c%d", i%4)
		seq[customer]++
		o := bigOrder{OrderCreated: demoapp.OrderCreated{OrderID: fmt.Sprintf("%s%05d", b.prefix, i), Customer: customer, Seq: seq[customer],
			AmountCents: int64(100 + i), Currency: "EUR"}}
		switch {
		case i == 5:
			o.Attachment = strings.Repeat("5", 5<<20)
		case i%3 == 0:
			o.Attachment = strings.Repeat(strconv.Itoa(i%10), (1+i%3)<<20+i)
		}
		id := b.placeBig(t, w, o)
		if o.Attachment != "" {
			large[id] = true
		}
	}
	v := b.waitApplied(t, 3*time.Minute)
	require.Zero(t, v.OrderViolations)

	// Every large payload is in S3, once, at prefix + event id; no small one is.
	out, err := s3c.ListObjectsV2(b.ctx, &s3.ListObjectsV2Input{Bucket: aws.String(bucket), Prefix: aws.String(prefix)})
	require.NoError(t, err)
	require.Len(t, out.Contents, len(large))
	for _, obj := range out.Contents {
		id, err := uuid.Parse(strings.TrimPrefix(aws.ToString(obj.Key), prefix))
		require.NoError(t, err)
		require.True(t, large[id], "object %s is a large event's", aws.ToString(obj.Key))
		var payload string
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT payload::text FROM outbox_event WHERE event_id = $1`, id).Scan(&payload))
		got, err := s3c.GetObject(b.ctx, &s3.GetObjectInput{Bucket: aws.String(bucket), Key: obj.Key})
		require.NoError(t, err)
		body, err := io.ReadAll(got.Body)
		got.Body.Close()
		require.NoError(t, err)
		require.Equal(t, len(payload), len(body))
		require.True(t, payload == string(body), "object %s holds the row's payload", id)
	}

	// By hand, as an AWS extended client sends it: the payload in S3, a pointer and
	// ExtendedPayloadSize straight to the queue. One object exists, the other does not.
	handMade := demoapp.OrderCreated{OrderID: "java-" + uuid.NewString()[:8], Customer: "java", Seq: 1, AmountCents: 4200, Currency: "EUR"}
	payload, _ := json.Marshal(bigOrder{OrderCreated: handMade, Attachment: strings.Repeat("j", 3<<20)})
	_, err = s3c.PutObject(b.ctx, &s3.PutObjectInput{Bucket: aws.String(bucket), Key: aws.String("java/" + handMade.OrderID), Body: bytes.NewReader(payload)})
	require.NoError(t, err)
	send := func(key string, size int) string {
		id := uuid.NewString()
		_, err := b.stack.SQS.SendMessage(b.ctx, &sqs.SendMessageInput{QueueUrl: aws.String(b.stack.Pipeline.QueueURL),
			MessageBody:    aws.String(fmt.Sprintf(`["%s",{"s3BucketName":"%s","s3Key":"%s"}]`, wire.PointerClass, bucket, key)),
			MessageGroupId: aws.String("java-" + key), MessageDeduplicationId: aws.String(id),
			MessageAttributes: map[string]sqstypes.MessageAttributeValue{
				wire.ExtendedPayloadSize: {DataType: aws.String("Number"), StringValue: aws.String(strconv.Itoa(size))},
				wire.EventType:           {DataType: aws.String("String"), StringValue: aws.String(demoapp.EventOrderCreated)},
				wire.MessageID:           {DataType: aws.String("String"), StringValue: aws.String(id)},
			}})
		require.NoError(t, err)
		return id
	}
	send("java/"+handMade.OrderID, len(payload))
	send("java/never-stored", 1234)
	b.waitUntil(t, 2*time.Minute, "the hand-made message applied and the one without its object dead-lettered", func() (bool, string) {
		var applied int
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM demo_ledger WHERE order_id = $1 AND amount_cents = 4200`, handMade.OrderID).Scan(&applied))
		dlq, err := localrun.Depth(b.ctx, b.stack.SQS, b.stack.Pipeline.DLQURL)
		require.NoError(t, err)
		return applied == 1 && dlq == 1, fmt.Sprintf("applied %d, DLQ depth %d", applied, dlq)
	})
	_, err = s3c.HeadObject(b.ctx, &s3.HeadObjectInput{Bucket: aws.String(bucket), Key: aws.String("java/" + handMade.OrderID)})
	require.NoError(t, err, "the consumer never deletes objects")
}
