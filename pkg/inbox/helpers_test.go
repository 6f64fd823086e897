package inbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/aws/aws-lambda-go/events"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/testdb"
	"github.com/sluicehq/sluice/pkg/inbox"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// quiet discards the logs of tests that fail records on purpose.
var quiet = slog.New(slog.DiscardHandler)

// testBundle is one test's database with an effects table the scripted handler writes to.
type testBundle struct {
	pool *pgxpool.Pool
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	pool := testdb.Pool(t)
	_, err := pool.Exec(context.Background(), `CREATE TABLE effect (consumer text NOT NULL, message_id text NOT NULL, n int NOT NULL)`)
	require.NoError(t, err)
	return &testBundle{pool: pool}
}

// script is the payload the scripted handler understands.
type script struct {
	N    int    `json:"n"`
	Fail string `json:"fail,omitempty"` // "", "error", "panic" or "swallow"
}

// scripted writes an effect row, then fails as the payload says, so a rollback must undo the
// effect. "swallow" ignores a failed statement and returns nil, leaving the transaction aborted.
func scripted(consumer string) inbox.Handler {
	return func(ctx context.Context, tx pgx.Tx, msg inbox.Message) error {
		s, err := inbox.Decode[script](msg)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO effect VALUES ($1, $2, $3)`, consumer, msg.ID, s.N); err != nil {
			return err
		}
		switch s.Fail {
		case "error":
			return errors.New("scripted failure")
		case "panic":
			panic("scripted panic")
		case "swallow":
			_, _ = tx.Exec(ctx, `SELECT 1/0`) // error ignored: the transaction is aborted, the handler says nil
		}
		return nil
	}
}

func router(consumer string) *inbox.Router {
	r := inbox.NewRouter(inbox.FailUnknown)
	r.Handle("Scripted", scripted(consumer))
	return r
}

func newConsumer(t *testing.T, db inbox.Beginner, name string, mode inbox.Mode) *inbox.Consumer {
	t.Helper()
	c, err := inbox.NewConsumer(db, inbox.ConsumerConfig{Consumer: name, Router: router(name), Mode: mode, Logger: quiet})
	require.NoError(t, err)
	return c
}

// rec builds a raw-delivery record of event type Scripted; sqsID defaults to "sqs-"+id.
func rec(id string, s script) events.SQSMessage {
	body, _ := json.Marshal(s)
	return record("sqs-"+id, string(body), map[string]string{
		"messageId": id, "eventType": "Scripted", "aggregateType": "test", "aggregateId": id,
		"createdAt": "2026-11-29T10:00:00Z",
	})
}

func record(sqsID, body string, attrs map[string]string) events.SQSMessage {
	m := events.SQSMessage{
		MessageId: sqsID, Body: body, EventSource: "aws:sqs",
		Attributes:        map[string]string{"ApproximateReceiveCount": "1"},
		MessageAttributes: map[string]events.SQSMessageAttribute{},
	}
	for k, v := range attrs {
		m.MessageAttributes[k] = events.SQSMessageAttribute{DataType: "String", StringValue: &v}
	}
	return m
}

func fifo(r events.SQSMessage, group string) events.SQSMessage {
	r.Attributes["MessageGroupId"] = group
	return r
}

func batchOf(recs ...events.SQSMessage) events.SQSEvent { return events.SQSEvent{Records: recs} }

func loadEvent(t *testing.T, name string) events.SQSEvent {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	require.NoError(t, err)
	var ev events.SQSEvent
	require.NoError(t, json.Unmarshal(b, &ev))
	return ev
}

// state is what a test compares: the inbox rows and effects of the database.
type state struct {
	Inbox   []string // consumer/message_id/processed
	Effects []string // consumer/message_id/n
}

func dbState(t *testing.T, db *pgxpool.Pool) state {
	t.Helper()
	ctx := context.Background()
	var s state
	rows, err := db.Query(ctx, `SELECT consumer || '/' || message_id || '/' || (processed_at IS NOT NULL)::text FROM inbox_event ORDER BY 1`)
	require.NoError(t, err)
	s.Inbox, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	rows, err = db.Query(ctx, `SELECT consumer || '/' || message_id || '/' || n FROM effect ORDER BY 1`)
	require.NoError(t, err)
	s.Effects, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return s
}

func outcomes(rep inbox.Report) []string {
	out := make([]string, len(rep.Results))
	for i, r := range rep.Results {
		out[i] = r.SQSMessageID + ":" + r.Outcome.String()
	}
	return out
}

func failedIDs(resp events.SQSEventResponse) []string {
	out := []string{}
	for _, f := range resp.BatchItemFailures {
		out = append(out, f.ItemIdentifier)
	}
	return out
}

func count(t *testing.T, db *pgxpool.Pool, query string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, db.QueryRow(context.Background(), query, args...).Scan(&n), query)
	return n
}

var modes = []inbox.Mode{inbox.PerRecord, inbox.Batched}

func forModes(t *testing.T, f func(t *testing.T, mode inbox.Mode)) {
	for _, m := range modes {
		t.Run(m.String(), func(t *testing.T) {
			t.Parallel()
			f(t, m)
		})
	}
}

func ids(n int, prefix string) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%04d", prefix, i)
	}
	return out
}
