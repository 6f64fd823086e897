package console_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/aws/aws-lambda-go/events"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/cmd/sluice/internal/cli"
	"github.com/sluicehq/sluice/cmd/sluice/internal/console"
	"github.com/sluicehq/sluice/internal/testdb"
	"github.com/sluicehq/sluice/pkg/inbox"
	"github.com/sluicehq/sluice/pkg/outbox"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// bundle is one test's database and console.
type bundle struct {
	dbURL  string
	pool   *pgxpool.Pool
	srv    *httptest.Server
	client *http.Client
	// ids of the seeded outbox rows.
	quarantinedID, behindID, bigID int64
}

// setup seeds a database (seed) and serves a console over it; mutate adjusts its Config, whose
// Actions are the CLI's (console.Config.Actions = cli.ConsoleActions) when actions is true.
func setup(t *testing.T, actions bool, mutate ...func(*console.Config)) *bundle {
	t.Helper()
	dbURL := testdb.URL(t)
	pool, err := pgxpool.New(context.Background(), dbURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	b := &bundle{pool: pool, dbURL: dbURL}
	b.seed(t)
	cfg := console.Config{DB: pool, Database: "db.test:5432/app"}
	if actions {
		cfg.Actions = cli.ConsoleActions{DB: pool}
	}
	for _, m := range mutate {
		m(&cfg)
	}
	s, err := console.New(cfg)
	require.NoError(t, err)
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.Run(ctx) }() // the lag chart's sampler
	t.Cleanup(func() { stop(); <-done })
	b.srv = httptest.NewServer(s)
	t.Cleanup(b.srv.Close)
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	b.client = &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	return b
}

// serve serves s until the test ends and returns its base URL.
func serve(t *testing.T, s http.Handler) string {
	t.Helper()
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	return srv.URL
}

// seed writes: key order-1 with three pending rows; key order-2 whose head is quarantined with
// one row behind it; key big with a 100 KiB payload carrying a traceparent; and consumer
// billing's dead letters: m-1 and m-2 failing with "ledger N closed" (one group), and a record
// that could not be parsed.
func (b *bundle) seed(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	msg := func(key, payload string) outbox.Message {
		return outbox.Message{Topic: "orders", AggregateType: "order", AggregateID: key, EventType: "OrderCreated",
			PartitionKey: key, Payload: json.RawMessage(payload)}
	}
	big := `{"lines":[` + strings.Repeat(`{"sku":"ABC-123","qty":1},`, 4000) + `{"sku":"END","qty":1}]}`
	bigMsg := msg("big", big)
	bigMsg.Headers = map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	written, err := outbox.Write(ctx, tx, msg("order-1", `{"n":1}`), msg("order-1", `{"n":2}`), msg("order-1", `{"n":3}`),
		msg("order-2", `{"n":4}`), msg("order-2", `{"n":5}`), bigMsg)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	var ids []int64
	rows, err := b.pool.Query(ctx, `SELECT id FROM outbox_event ORDER BY id`)
	require.NoError(t, err)
	ids, err = pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	require.Len(t, ids, len(written))
	b.quarantinedID, b.behindID, b.bigID = ids[3], ids[4], ids[5]
	_, err = b.pool.Exec(ctx, `UPDATE outbox_event SET quarantined_at = now(), attempts = 8,
		last_error = 'SNS rejected the message: InvalidParameter' WHERE id = $1`, b.quarantinedID)
	require.NoError(t, err)

	r := inbox.NewRouter(inbox.FailUnknown)
	r.Handle("OrderCreated", func(_ context.Context, _ pgx.Tx, m inbox.Message) error {
		var p struct{ Ledger int }
		_ = json.Unmarshal(m.Payload, &p)
		return fmt.Errorf("ledger %d closed", p.Ledger)
	})
	c, err := inbox.NewConsumer(b.pool, inbox.ConsumerConfig{Consumer: "billing", Router: r, SQSMaxReceiveCount: 1,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	rep := c.Process(ctx, events.SQSEvent{Records: []events.SQSMessage{
		sqsRecord("sqs-1", "m-1", `{"ledger":17}`), sqsRecord("sqs-2", "m-2", `{"ledger":18}`), sqsRecord("sqs-3", "", "garbage")}})
	for i, res := range rep.Results {
		require.True(t, res.Dead, "record %d is a dead letter", i)
	}
}

// sqsRecord is an SQS record of a sluice message on its last receive, or a body that is no
// message at all when id is "".
func sqsRecord(sqsID, id, body string) events.SQSMessage {
	m := events.SQSMessage{MessageId: sqsID, Body: body, EventSource: "aws:sqs", EventSourceARN: "arn:aws:sqs:eu-west-1:123456789012:billing",
		Attributes: map[string]string{"ApproximateReceiveCount": "1"}, MessageAttributes: map[string]events.SQSMessageAttribute{}}
	if id != "" {
		for k, v := range map[string]string{"messageId": id, "eventType": "OrderCreated"} {
			m.MessageAttributes[k] = events.SQSMessageAttribute{DataType: "String", StringValue: &v}
		}
	}
	return m
}

// get fetches path and returns its status and body.
func (b *bundle) get(t *testing.T, path string) (int, string) {
	t.Helper()
	resp, err := b.client.Get(b.srv.URL + path)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body)
}

// ok fetches path and requires a 200.
func (b *bundle) ok(t *testing.T, path string) string {
	t.Helper()
	status, body := b.get(t, path)
	require.Equal(t, http.StatusOK, status, body)
	return body
}

// post submits form to path.
func (b *bundle) post(t *testing.T, path string, form url.Values) (int, string) {
	t.Helper()
	resp, err := b.client.PostForm(b.srv.URL+path, form)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body)
}

var hiddenField = regexp.MustCompile(`<input type="hidden" name="([a-z]+)" value="([^"]*)">`)

// confirmForm returns the fields of a plan page's confirmation form.
func confirmForm(t *testing.T, page string) url.Values {
	t.Helper()
	form := url.Values{}
	for _, m := range hiddenField.FindAllStringSubmatch(page, -1) {
		form.Add(m[1], htmlUnescape(m[2]))
	}
	require.NotEmpty(t, form.Get("csrf"), "the plan page has a confirmation form:\n%s", page)
	return form
}

func htmlUnescape(s string) string {
	return strings.NewReplacer("&amp;", "&", "&#43;", "+", "&#34;", `"`, "&#39;", "'", "&lt;", "<", "&gt;", ">").Replace(s)
}

// count runs a count query.
func (b *bundle) count(t *testing.T, sql string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

// fingerprint digests the tables the console's actions may change.
func (b *bundle) fingerprint(t *testing.T) string {
	t.Helper()
	var fp string
	err := b.pool.QueryRow(context.Background(), `SELECT md5(
		coalesce((SELECT string_agg(o::text, '|' ORDER BY id) FROM outbox_event o), '') ||
		coalesce((SELECT string_agg(e::text, '|' ORDER BY consumer, message_id) FROM inbox_event e), '') ||
		coalesce((SELECT string_agg(d::text, '|' ORDER BY consumer, record_key) FROM inbox_dead_letter d), ''))`).Scan(&fp)
	require.NoError(t, err)
	return fp
}
