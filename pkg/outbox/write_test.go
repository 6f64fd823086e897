package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/fixture"
	"github.com/sluicehq/sluice/pkg/outbox"
)

func TestWriteRollbackLeavesNothingCommitLeavesExactlyTheRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	msg := outbox.Message{Topic: testTopic, AggregateType: "order", AggregateID: "o-1", EventType: "OrderCreated", Payload: json.RawMessage(`{"total": 42}`)}

	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	_, err = outbox.Write(ctx, tx, msg, msg)
	require.NoError(t, err)
	require.NoError(t, tx.Rollback(ctx))
	require.Zero(t, b.countWhere(t, "true"), "a rolled-back transaction leaves no outbox row")

	tx, err = b.pool.Begin(ctx)
	require.NoError(t, err)
	written, err := outbox.Write(ctx, tx, msg, msg)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	require.Equal(t, 2, b.countWhere(t, "true"))

	for _, w := range written {
		require.Equal(t, uuid.Version(7), w.EventID.Version(), "event ids are time-ordered UUIDs")
		require.Equal(t, "o-1", w.PartitionKey, "partition key defaults to the aggregate id")
		var topic, key, payload string
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT topic, partition_key, payload::text FROM outbox_event WHERE event_id = $1", w.EventID).Scan(&topic, &key, &payload))
		require.Equal(t, testTopic, topic)
		require.Equal(t, "o-1", key)
		require.JSONEq(t, `{"total": 42}`, payload)
	}
}

func TestWriteManyUsesCopyAndKeepsEveryRow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	written := b.write(t, 1500, 7)
	require.Len(t, written, 1500)
	require.Equal(t, 1500, b.countWhere(t, "published_at IS NULL"))
	require.Equal(t, 1500, b.countWhere(t, "headers = '{}'::jsonb"))
}

func TestWriteRejectsBadInputNamingTheField(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	good := outbox.Message{Topic: testTopic, EventType: "OrderCreated", AggregateID: "o-1", Payload: json.RawMessage(`{}`)}
	with := func(f func(*outbox.Message)) outbox.Message { m := good; f(&m); return m }

	cases := map[string]struct {
		msg   outbox.Message
		field string
	}{
		"empty topic":         {with(func(m *outbox.Message) { m.Topic = " " }), "Topic"},
		"empty event type":    {with(func(m *outbox.Message) { m.EventType = "" }), "EventType"},
		"missing payload":     {with(func(m *outbox.Message) { m.Payload = nil }), "Payload"},
		"payload not JSON":    {with(func(m *outbox.Message) { m.Payload = json.RawMessage(`{"a":`) }), "Payload"},
		"payload too large":   {with(func(m *outbox.Message) { m.Payload = json.RawMessage(`"` + strings.Repeat("x", 256*1024) + `"`) }), "Payload"},
		"header bad name":     {with(func(m *outbox.Message) { m.Headers = map[string]string{"bad name": "x"} }), "Headers[bad name]"},
		"header AWS prefix":   {with(func(m *outbox.Message) { m.Headers = map[string]string{"AWS.trace": "x"} }), "Headers[AWS.trace]"},
		"header reserved":     {with(func(m *outbox.Message) { m.Headers = map[string]string{"messageId": "x"} }), "Headers[messageId]"},
		"header tenant":       {with(func(m *outbox.Message) { m.Headers = map[string]string{outbox.TenantHeader: "x"} }), "Headers[" + outbox.TenantHeader + "]"},
		"header empty value":  {with(func(m *outbox.Message) { m.Headers = map[string]string{"traceparent": ""} }), "Headers[traceparent]"},
		"header bad char":     {with(func(m *outbox.Message) { m.Headers = map[string]string{"x-a": "a\x01b"} }), "Headers[x-a]"},
		"event type bad utf8": {with(func(m *outbox.Message) { m.EventType = "\xff" }), "EventType"},
		"payload bad utf8":    {with(func(m *outbox.Message) { m.Payload = json.RawMessage("\"\xff\"") }), "Payload"},
		"payload nested too deep": {with(func(m *outbox.Message) {
			m.Payload = json.RawMessage(strings.Repeat("[", 1001) + strings.Repeat("]", 1001))
		}), "Payload"},
		"too many headers": {with(func(m *outbox.Message) {
			m.AggregateType = "order"
			m.Headers = map[string]string{"h1": "1", "h2": "2", "h3": "3", "h4": "4", "h5": "5", "h6": "6"}
		}), "Headers"},
		"no attribute left for the claim check": {with(func(m *outbox.Message) {
			m.AggregateType = "order"
			m.Headers = map[string]string{"h1": "1", "h2": "2", "h3": "3", "h4": "4", "h5": "5"}
		}), "Headers"},
		"header claim check name": {with(func(m *outbox.Message) { m.Headers = map[string]string{"ExtendedPayloadSize": "1"} }), "Headers[ExtendedPayloadSize]"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			tx, err := b.pool.Begin(ctx)
			require.NoError(t, err)
			defer tx.Rollback(ctx)
			_, err = outbox.Write(ctx, tx, good, tc.msg)
			var ve *outbox.ValidationError
			require.ErrorAs(t, err, &ve)
			require.True(t, errors.Is(err, outbox.ErrInvalidMessage))
			require.Equal(t, 1, ve.Index, "the error points at the bad message")
			require.Equal(t, tc.field, ve.Field)
			require.Contains(t, err.Error(), tc.field)
			var n int
			require.NoError(t, tx.QueryRow(ctx, "SELECT count(*) FROM outbox_event").Scan(&n))
			require.Zero(t, n, "nothing is written when any message is invalid")
		})
	}
}

// Issue 10, scenario 4: what is published is what was written. Write, Queue and plain SQL (text
// and jsonb values) store the bytes given; the column returns them and the relay publishes them.
func TestWriteStoresAndPublishesTheBytesWritten(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	msg := func(p string) outbox.Message {
		return outbox.Message{Topic: testTopic, EventType: "E", AggregateID: "a", Payload: json.RawMessage(p)}
	}
	want := map[uuid.UUID]string{} // event id -> the bytes that must come back
	record := func(written []outbox.Message, payloads []string) {
		require.Len(t, written, len(payloads))
		for i, w := range written {
			require.Equal(t, payloads[i], string(w.Payload), "Write returns the payload unchanged")
			want[w.EventID] = payloads[i]
		}
	}
	many := make([]string, 0, 120) // enough for COPY (CopyThreshold 100)
	for len(many) < 120 {
		many = append(many, fixture.VerbatimJSON...)
	}
	many = many[:120]

	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	for _, p := range fixture.VerbatimJSON { // one row: VALUES
		written, err := outbox.Write(ctx, tx, msg(p))
		require.NoError(t, err)
		record(written, []string{p})
	}
	for _, ps := range [][]string{fixture.VerbatimJSON, many} { // unnest, then COPY
		msgs := make([]outbox.Message, len(ps))
		for i, p := range ps {
			msgs[i] = msg(p)
		}
		written, err := outbox.Write(ctx, tx, msgs...)
		require.NoError(t, err)
		record(written, ps)
	}
	batch := &pgx.Batch{}
	for _, ps := range [][]string{fixture.VerbatimJSON[:1], fixture.VerbatimJSON} { // Queue: one row, then unnest
		msgs := make([]outbox.Message, len(ps))
		for i, p := range ps {
			msgs[i] = msg(p)
		}
		written, err := outbox.Queue(batch, msgs...)
		require.NoError(t, err)
		record(written, ps)
	}
	require.NoError(t, tx.SendBatch(ctx, batch).Close())
	// Plain SQL: a text value is stored as given; a jsonb value as jsonb's text of it.
	for _, p := range fixture.VerbatimJSON {
		id := uuid.New()
		_, err := tx.Exec(ctx, `INSERT INTO outbox_event (event_id, topic, aggregate_type, aggregate_id, event_type, partition_key, payload)
			VALUES ($1, $2, '', 'a', 'E', 'a', $3::text::json)`, id, testTopic, p)
		require.NoError(t, err)
		want[id] = p
	}
	for _, p := range []string{`{"z": 2, "a": 1}`, `{"n":1.50e1}`} {
		id := uuid.New()
		var rendered string
		require.NoError(t, tx.QueryRow(ctx, `INSERT INTO outbox_event (event_id, topic, aggregate_type, aggregate_id, event_type, partition_key, payload)
			VALUES ($1, $2, '', 'a', 'E', 'a', $3::text::jsonb) RETURNING payload::text`, id, testTopic, p).Scan(&rendered))
		var jsonbText string
		require.NoError(t, tx.QueryRow(ctx, `SELECT $1::text::jsonb::text`, p).Scan(&jsonbText))
		require.Equal(t, jsonbText, rendered, "a jsonb value is stored as its text")
		want[id] = jsonbText
	}
	require.NoError(t, tx.Commit(ctx))

	rows, err := b.pool.Query(ctx, `SELECT event_id, payload::text FROM outbox_event`)
	require.NoError(t, err)
	stored := map[uuid.UUID]string{}
	for rows.Next() {
		var id uuid.UUID
		var p string
		require.NoError(t, rows.Scan(&id, &p))
		stored[id] = p
	}
	require.NoError(t, rows.Err())
	require.Equal(t, want, stored, "the column returns the bytes written")

	_, err = b.relay(t).RunOnce(ctx)
	require.NoError(t, err)
	published := map[uuid.UUID]string{}
	for _, e := range b.rec.received {
		published[e.EventID] = string(e.Payload)
	}
	require.Equal(t, want, published, "the relay publishes the bytes written")
}

// Write refuses a payload exactly when PostgreSQL's json input refuses it (the nesting
// bound aside), so a refusal never surfaces at commit and nothing the server stores is turned away.
func TestWriteRefusesWhatPostgreSQLRefuses(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	cases := []string{
		`{}`, `[]`, `1`, `-0`, `-`, `+1`, `01`, `1.`, `.5`, `1e`, `1E+2`, `1e-2`, `0.0e0`, `-01`, `1.5e+`, `0x10`,
		`true`, `tru`, `truex`, `null`, `NaN`, `Infinity`, `[1,]`, `{"a":1,}`, `{"a"}`, `{a:1}`, `{'a':1}`, `1 2`, `[1] [2]`,
		` `, "\t{}\n", "\v{}", "\f{}", "\u00a0{}", "\ufeff{}", "{}\x00", `"a` + "\t" + `b"`, `"a` + "\n" + `b"`, `"a` + "\x7f" + `b"`,
		`"\x"`, `"\u12"`, `"\u12g4"`, `"\U0041"`, `"\/"`, `"\'"`, `"\u0000"`, `"\ud800"`, `"\udc00"`, `"\ud800\udc00"`, `"\ud800x"`,
		`"\ud800\u0041"`, `"é"`, "\"\xff\"", "\"\xc3\"", "\"\xed\xa0\x80\"", "\"\xf4\x90\x80\x80\"", `[1e400, 0e-16383, 1e99999999999999]`,
		`{"a":1,"a":2}`, `[[[[]]]]`, strings.Repeat("[", 1000) + strings.Repeat("]", 1000), `"` + strings.Repeat("x", 1000) + `"`,
		`[1,2`, `{"a":[1,{"b":}]}`, `/*c*/1`, `1//c`, `"\"`, `""`,
	}
	for _, p := range cases {
		var serverErr error
		tx, err := b.pool.Begin(ctx)
		require.NoError(t, err)
		var stored string
		if serverErr = tx.QueryRow(ctx, `SELECT $1::text::json::text`, p).Scan(&stored); serverErr == nil {
			require.Equal(t, p, stored, "json keeps the bytes")
		}
		require.NoError(t, tx.Rollback(ctx))

		_, err = outbox.Queue(&pgx.Batch{}, outbox.Message{Topic: testTopic, EventType: "E", Payload: json.RawMessage(p)})
		if serverErr == nil {
			require.NoError(t, err, "PostgreSQL stores %q: Write must accept it", p)
			continue
		}
		var ve *outbox.ValidationError
		require.ErrorAs(t, err, &ve, "PostgreSQL refuses %q (%v): Write must refuse it", p, serverErr)
		require.Equal(t, "Payload", ve.Field)
	}
}

func TestWriterConfigIsValidated(t *testing.T) {
	t.Parallel()
	_, err := outbox.NewWriter(outbox.WriterConfig{MaxMessageBytes: int(outbox.RelaySetting("ClaimCheck.MaxPayloadBytes").Max) + 1})
	require.ErrorContains(t, err, "MaxMessageBytes")
	w, err := outbox.NewWriter(outbox.WriterConfig{MaxMessageBytes: 1024})
	require.NoError(t, err)
	_, err = w.Write(context.Background(), nil, outbox.Message{Topic: "t", EventType: "E", Payload: json.RawMessage(`"` + strings.Repeat("x", 2000) + `"`)})
	require.ErrorContains(t, err, "above the publishable 1024 bytes")
}

func TestQueueSendsTheOutboxInsertWithTheBusinessStatement(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	_, err := b.pool.Exec(ctx, `CREATE TABLE orders (id text PRIMARY KEY)`)
	require.NoError(t, err)

	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	batch := &pgx.Batch{}
	batch.Queue(`INSERT INTO orders (id) VALUES ('o-7')`)
	written, err := outbox.Queue(batch, outbox.Message{Topic: testTopic, AggregateType: "order", AggregateID: "o-7", EventType: "OrderCreated", Payload: json.RawMessage(`{}`)})
	require.NoError(t, err)
	require.Len(t, written, 1)
	require.NoError(t, tx.SendBatch(ctx, batch).Close(), "one round trip for both statements")
	require.NoError(t, tx.Commit(ctx))
	require.Equal(t, 1, b.countWhere(t, "event_id = '"+written[0].EventID.String()+"' AND partition_key = 'o-7'"))

	// Invalid input is refused before anything is queued.
	batch = &pgx.Batch{}
	_, err = outbox.Queue(batch, outbox.Message{Topic: testTopic, EventType: "E", Payload: json.RawMessage(`nope`)})
	require.ErrorIs(t, err, outbox.ErrInvalidMessage)
	require.Zero(t, batch.Len())
}
