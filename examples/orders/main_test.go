package main

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/sluicehq/sluice/internal/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

func TestTheREADMEExampleCommitsTheOrderAndItsEventTogether(t *testing.T) {
	ctx := context.Background()
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	defer func() { _ = tp.Shutdown(ctx) }()
	otel.SetTracerProvider(tp)
	url := testdb.EmptyURL(t) // the example migrates for itself
	require.NoError(t, run(ctx, url))

	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer conn.Close(ctx)
	var orders, events int
	require.NoError(t, conn.QueryRow(ctx, `SELECT (SELECT count(*) FROM orders), (SELECT count(*) FROM outbox_event
		WHERE event_type = 'OrderCreated' AND partition_key = 'o-42' AND headers ? 'traceparent')`).Scan(&orders, &events))
	require.Equal(t, 1, orders)
	require.Equal(t, 1, events)

	// The event carries the span that placed the order, not a constant: its consumer's span
	// will link to PlaceOrder.
	ended := spans.Ended()
	require.Len(t, ended, 1)
	sc := ended[0].SpanContext()
	var traceparent string
	require.NoError(t, conn.QueryRow(ctx, `SELECT headers->>'traceparent' FROM outbox_event`).Scan(&traceparent))
	require.Equal(t, "00-"+sc.TraceID().String()+"-"+sc.SpanID().String()+"-01", traceparent)

	// A second run violates the orders primary key: the whole transaction rolls back,
	// so no second event exists without its order.
	require.Error(t, run(ctx, url))
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM outbox_event`).Scan(&events))
	require.Equal(t, 1, events)
}
