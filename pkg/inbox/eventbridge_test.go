package inbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/fixture"
	"github.com/sluicehq/sluice/pkg/inbox"
)

// An EventBridge rule with an SQS target delivers the event itself as the SQS body; its detail
// is the relay's envelope. Parse reads the contract from detail.metadata and the payload, byte
// for byte, from detail.data.
func TestParseEventBridgeEventFromSQS(t *testing.T) {
	t.Parallel()
	ev := fixture.Load[events.SQSEvent](t, "testdata/sqs_eventbridge.json")
	msg, err := inbox.Parse(ev.Records[0])
	require.NoError(t, err)
	require.Equal(t, "0193a2b4-7c1d-7e3f-8a9b-0c1d2e3f6001", msg.ID)
	require.Equal(t, inbox.IDFromAttribute, msg.IDSource)
	require.Equal(t, "OrderCreated", msg.EventType)
	require.Equal(t, "order", msg.AggregateType)
	require.Equal(t, "ord-3003", msg.AggregateID)
	require.Equal(t, time.Date(2026, 11, 29, 10, 41, 59, 500_000_000, time.UTC), msg.CreatedAt)
	require.Equal(t, map[string]string{"traceparent": "00-5bf92f3577b34da6a3ce929d0e0e4736-10f067aa0ba902b7-01"}, msg.Headers)
	require.Equal(t, `{"orderId":"ord-3003","customerId":"cus-9","totalCents":700,"currency":"EUR","schemaVersion":1}`, string(msg.Payload))
	require.Equal(t, "aws:sqs", msg.Source)
	require.Equal(t, ev.Records[0].MessageId, msg.ItemID)
	require.False(t, msg.Enveloped, "Enveloped is the SNS envelope")
	require.Empty(t, msg.GroupID, "EventBridge keeps no key's order: no group on a standard queue")

	// No metadata.messageId: the EventBridge event id, which EventBridge keeps across its retries.
	msg, err = inbox.Parse(ev.Records[1])
	require.NoError(t, err)
	require.Equal(t, "7b8f9a0c-c5a2-4d08-b0a2-c08144578829", msg.ID)
	require.Equal(t, inbox.IDFromEventBridge, msg.IDSource)
	require.Equal(t, "OrderCancelled", msg.EventType)
}

func TestParseEventBridgeBadInput(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, body, want string }{
		{"detail not an envelope", `{"version":"0","id":"e1","detail-type":"X","source":"s","detail":{"orderId":1}}`, "not a sluice envelope: no metadata"},
		{"detail not an object", `{"version":"0","id":"e1","detail-type":"X","source":"s","detail":[1]}`, "not a sluice envelope"},
		{"no eventType", `{"version":"0","id":"e1","detail-type":"X","source":"s","detail":{"metadata":{"messageId":"m"},"data":{}}}`, "missing metadata field eventType"},
		{"no data", `{"version":"0","id":"e1","detail-type":"X","source":"s","detail":{"metadata":{"messageId":"m","eventType":"X"}}}`, "empty body"},
		{"mistyped messageId", `{"version":"0","id":"e1","detail-type":"X","source":"s","detail":{"metadata":{"messageId":7,"eventType":"X"},"data":{}}}`, "not a sluice envelope"},
		{"empty messageId", `{"version":"0","id":"e1","detail-type":"X","source":"s","detail":{"metadata":{"messageId":" ","eventType":"X"},"data":{}}}`, "messageId is empty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := inbox.Parse(record("s", tc.body, nil))
			require.ErrorIs(t, err, inbox.ErrBadMessage)
			require.Contains(t, err.Error(), tc.want)
		})
	}
}

// The consumer applies EventBridge events from SQS like any other delivery, and dedups a
// redelivery on the envelope's messageId.
func TestConsumerAppliesEventBridgeEventsOnce(t *testing.T) {
	t.Parallel()
	forModes(t, func(t *testing.T, mode inbox.Mode) {
		b := setup(t)
		var applied []string
		r := inbox.NewRouter(inbox.FailUnknown)
		for _, typ := range []string{"OrderCreated", "OrderCancelled"} {
			r.Handle(typ, func(ctx context.Context, tx pgx.Tx, msg inbox.Message) error {
				applied = append(applied, msg.ID)
				_, err := tx.Exec(ctx, `INSERT INTO effect VALUES ('eb', $1, 1)`, msg.ID)
				return err
			})
		}
		c, err := inbox.NewConsumer(b.pool, inbox.ConsumerConfig{Consumer: "eb", Router: r, Mode: mode, Logger: quiet})
		require.NoError(t, err)
		ev := fixture.Load[events.SQSEvent](t, "testdata/sqs_eventbridge.json")
		for range 2 {
			resp, err := c.HandleSQS(context.Background(), ev)
			require.NoError(t, err)
			require.Empty(t, resp.BatchItemFailures)
		}
		require.Equal(t, []string{"0193a2b4-7c1d-7e3f-8a9b-0c1d2e3f6001", "7b8f9a0c-c5a2-4d08-b0a2-c08144578829"}, applied, "each once")
		require.Equal(t, 2, count(t, b.pool, `SELECT count(*) FROM effect`))
	})
}
