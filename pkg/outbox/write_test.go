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
		"empty topic":              {with(func(m *outbox.Message) { m.Topic = " " }), "Topic"},
		"empty event type":         {with(func(m *outbox.Message) { m.EventType = "" }), "EventType"},
		"missing payload":          {with(func(m *outbox.Message) { m.Payload = nil }), "Payload"},
		"payload not JSON":         {with(func(m *outbox.Message) { m.Payload = json.RawMessage(`{"a":`) }), "Payload"},
		"payload too large":        {with(func(m *outbox.Message) { m.Payload = json.RawMessage(`"` + strings.Repeat("x", 256*1024) + `"`) }), "Payload"},
		"payload with NUL":         {with(func(m *outbox.Message) { m.Payload = json.RawMessage(`{"a":"\u0000"}`) }), "Payload"},
		"header bad name":          {with(func(m *outbox.Message) { m.Headers = map[string]string{"bad name": "x"} }), "Headers[bad name]"},
		"header AWS prefix":        {with(func(m *outbox.Message) { m.Headers = map[string]string{"AWS.trace": "x"} }), "Headers[AWS.trace]"},
		"header reserved":          {with(func(m *outbox.Message) { m.Headers = map[string]string{"messageId": "x"} }), "Headers[messageId]"},
		"header empty value":       {with(func(m *outbox.Message) { m.Headers = map[string]string{"traceparent": ""} }), "Headers[traceparent]"},
		"header bad char":          {with(func(m *outbox.Message) { m.Headers = map[string]string{"x-a": "a\x01b"} }), "Headers[x-a]"},
		"event type bad utf8":      {with(func(m *outbox.Message) { m.EventType = "\xff" }), "EventType"},
		"number printed in full":   {with(func(m *outbox.Message) { m.Payload = json.RawMessage(`[1e131071]`) }), "Payload"},
		"zero with 16383 decimals": {with(func(m *outbox.Message) { m.Payload = json.RawMessage(`{"a":0e-16383}`) }), "Payload"},
		"lone surrogate":           {with(func(m *outbox.Message) { m.Payload = json.RawMessage(`"\ud800"`) }), "Payload"},
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

// Issue 10, scenario 4: the relay publishes PostgreSQL's text of the stored jsonb, so Write
// checks that text, byte for byte, and returns it.
func TestWriteChecksAndReturnsTheBytesThatArePublished(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	write := func(payload string) ([]outbox.Message, error) {
		tx, err := b.pool.Begin(ctx)
		require.NoError(t, err)
		defer tx.Rollback(ctx)
		msgs, err := outbox.Write(ctx, tx, outbox.Message{Topic: testTopic, EventType: "E", AggregateID: "a", Payload: json.RawMessage(payload)})
		if err == nil {
			require.NoError(t, tx.Commit(ctx))
		}
		return msgs, err
	}

	// 240 KB of compact JSON is 290 KB once PostgreSQL prints it: refused at Write, not at the relay.
	var compact strings.Builder
	compact.WriteString("[")
	for i := range 30000 {
		if i > 0 {
			compact.WriteString(",")
		}
		compact.WriteString(`{"k":1}`)
	}
	compact.WriteString("]")
	require.Less(t, compact.Len(), outbox.MaxMessageBytes)
	_, err := write(compact.String())
	require.ErrorContains(t, err, "as PostgreSQL stores and publishes it")

	// An escaped backslash followed by "u0000" is text, not a NUL: accepted.
	msgs, err := write(`{"z":2,"a":"\\u0000","a":1}`)
	require.NoError(t, err)
	require.Equal(t, `{"a": 1, "z": 2}`, string(msgs[0].Payload), "Write returns the published form")
	msgs, err = write(`{"b":"\\u0000","n":1.50e1}`)
	require.NoError(t, err)
	require.Equal(t, `{"b": "\\u0000", "n": 15.0}`, string(msgs[0].Payload))

	// What the relay publishes is what Write returned, byte for byte.
	st, err := b.relay(t).RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, st.Published)
	bodies := map[string]string{}
	for _, e := range b.rec.received {
		bodies[e.EventID.String()] = string(e.Payload)
	}
	require.Equal(t, string(msgs[0].Payload), bodies[msgs[0].EventID.String()])
}

func TestWriterConfigIsValidated(t *testing.T) {
	t.Parallel()
	_, err := outbox.NewWriter(outbox.WriterConfig{MaxMessageBytes: outbox.MaxOffloadBytes + 1})
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
