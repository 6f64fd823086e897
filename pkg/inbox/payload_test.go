package inbox_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/aws/aws-lambda-go/events"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/fixture"
	"github.com/sluicehq/sluice/pkg/inbox"
)

func verbatimBatch() (events.SQSEvent, map[string]string) {
	var recs []events.SQSMessage
	want := map[string]string{}
	for i, body := range fixture.VerbatimJSON {
		id := fmt.Sprintf("v%d", i)
		recs = append(recs, record("sqs-"+id, body, map[string]string{"messageId": id, "eventType": "Verbatim"}))
		want[id] = body
	}
	return batchOf(recs...), want
}

func storedPayloads(t *testing.T, db interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, consumer string) map[string]string {
	t.Helper()
	rows, err := db.Query(context.Background(), `SELECT message_id, payload::text FROM inbox_event WHERE consumer = $1`, consumer)
	require.NoError(t, err)
	got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) ([2]string, error) {
		var kv [2]string
		return kv, r.Scan(&kv[0], &kv[1])
	})
	require.NoError(t, err)
	out := map[string]string{}
	for _, kv := range got {
		out[kv[0]] = kv[1]
	}
	return out
}

// The inbox stores the body byte for byte, and every handler gets the bytes that arrived: in the
// synchronous modes (with StorePayload) and from the asynchronous processor.
func TestInboxKeepsTheBytesThatArrived(t *testing.T) {
	t.Parallel()
	for _, mode := range []inbox.Mode{inbox.PerRecord, inbox.Batched, inbox.Async} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			b := setup(t)
			var mu sync.Mutex
			handled := map[string]string{}
			r := inbox.NewRouter(inbox.FailUnknown)
			r.Handle("Verbatim", func(_ context.Context, _ pgx.Tx, msg inbox.Message) error {
				mu.Lock()
				defer mu.Unlock()
				handled[msg.ID] = string(msg.Payload)
				return nil
			})
			c, err := inbox.NewConsumer(b.pool, inbox.ConsumerConfig{Consumer: "c", Router: r, Mode: mode, StorePayload: true, Logger: quiet})
			require.NoError(t, err)
			batch, want := verbatimBatch()
			rep := c.Process(ctx, batch)
			for _, res := range rep.Results {
				require.NoError(t, res.Err)
			}
			require.Equal(t, want, storedPayloads(t, b.pool, "c"), "stored as it arrived")
			if mode == inbox.Async {
				p, err := inbox.NewProcessor(b.pool, inbox.ProcessorConfig{Consumer: "c", Router: r, Logger: quiet})
				require.NoError(t, err)
				st, err := p.Drain(ctx)
				require.NoError(t, err)
				require.Equal(t, len(want), st.Applied)
			}
			require.Equal(t, want, handled, "the handler gets the bytes that arrived")
		})
	}
}
