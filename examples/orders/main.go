// Command orders is the README's example: it saves an order and its OrderCreated event in one
// PostgreSQL transaction with outbox.Write, inside the span of the request that placed the
// order, so the event carries that span's trace. Run it with DATABASE_URL set:
//
//	go run ./examples/orders
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/sluicehq/sluice/migrations"
	"github.com/sluicehq/sluice/pkg/outbox"
)

func main() {
	// Your service's tracer provider (here without an exporter; yours sends spans to X-Ray or
	// an OTLP collector). sluice needs no tracing setup of its own: Write reads the span from ctx.
	tp := sdktrace.NewTracerProvider()
	defer func() { _ = tp.Shutdown(context.Background()) }()
	otel.SetTracerProvider(tp)

	if err := run(context.Background(), os.Getenv("DATABASE_URL")); err != nil {
		log.Fatal(err)
	}
	fmt.Println("order o-42 saved; its OrderCreated event will be published by the relay")
}

// run migrates, then saves order o-42 and its event in one transaction, inside a span standing
// for the request that placed the order (in a real service, your HTTP or RPC middleware starts it).
func run(ctx context.Context, databaseURL string) error {
	pool, err := pgxpool.New(ctx, databaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()

	// Once per deploy: sluice's tables (safe when several processes run it at once).
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	if err := migrations.Up(ctx, conn.Conn()); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS orders (id text PRIMARY KEY, total_cents bigint NOT NULL)`); err != nil {
		return err
	}

	ctx, span := otel.Tracer("orders").Start(ctx, "PlaceOrder")
	defer span.End()

	// The business write and the event commit together, or not at all. Write copies the span
	// in ctx into the row's traceparent header: the consumer's span links to it.
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO orders (id, total_cents) VALUES ($1, $2)`, "o-42", 4200); err != nil {
			return err
		}
		_, err := outbox.Write(ctx, tx, outbox.Message{
			Topic:         "orders", // mapped to a destination (SNS topic, EventBridge bus, stream) by the relay's configuration
			AggregateType: "order",
			AggregateID:   "o-42", // also the partition key: this order's events stay in order
			EventType:     "OrderCreated",
			Payload:       json.RawMessage(`{"orderId": "o-42", "totalCents": 4200}`),
		})
		return err
	})
}
