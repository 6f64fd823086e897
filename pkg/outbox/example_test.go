package outbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"log/slog"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluicehq/sluice/internal/testdb"
	"github.com/sluicehq/sluice/pkg/outbox"
)

// exampleDB opens a pool on a fresh migrated database with an orders table, standing in for
// a service's own database.
func exampleDB(name string) *pgxpool.Pool {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testdb.ForExample(name, true))
	if err != nil {
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE orders (id text PRIMARY KEY, total_cents bigint NOT NULL)`); err != nil {
		log.Fatal(err)
	}
	return pool
}

// The order and its event commit together, or neither does: Write runs in the caller's
// transaction and never commits it.
func ExampleWrite() {
	ctx := context.Background()
	pool := exampleDB("ExampleWrite")
	defer pool.Close()

	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO orders (id, total_cents) VALUES ($1, $2)`, "o-42", 4200); err != nil {
			return err
		}
		written, err := outbox.Write(ctx, tx, outbox.Message{
			Topic:         "orders", // mapped to an SNS topic ARN by the relay's configuration
			AggregateType: "order",
			AggregateID:   "o-42", // also the partition key: this order's events stay in order
			EventType:     "OrderCreated",
			Payload:       json.RawMessage(`{"orderId":"o-42","totalCents":4200}`),
		})
		if err != nil {
			return err
		}
		fmt.Println("partition key:", written[0].PartitionKey)
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	var payload string
	if err := pool.QueryRow(ctx, `SELECT payload::text FROM outbox_event WHERE aggregate_id = 'o-42'`).Scan(&payload); err != nil {
		log.Fatal(err)
	}
	fmt.Println("published as:", payload) // the bytes written are the message body
	// Output:
	// partition key: o-42
	// published as: {"orderId":"o-42","totalCents":4200}
}

// Queue puts the outbox insert in the caller's pgx.Batch, beside the business statement: one
// round trip for both.
func ExampleQueue() {
	ctx := context.Background()
	pool := exampleDB("ExampleQueue")
	defer pool.Close()

	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		b := &pgx.Batch{}
		b.Queue(`INSERT INTO orders (id, total_cents) VALUES ($1, $2)`, "o-43", 990)
		if _, err := outbox.Queue(b, outbox.Message{Topic: "orders", AggregateType: "order", AggregateID: "o-43",
			EventType: "OrderCreated", Payload: json.RawMessage(`{"orderId":"o-43"}`)}); err != nil {
			return err
		}
		return tx.SendBatch(ctx, b).Close()
	})
	if err != nil {
		log.Fatal(err)
	}
	var orders, events int
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM orders), (SELECT count(*) FROM outbox_event)`).Scan(&orders, &events); err != nil {
		log.Fatal(err)
	}
	fmt.Println(orders, "order,", events, "event")
	// Output:
	// 1 order, 1 event
}

// printer is a Publisher that prints what it is given and acknowledges it: a stand-in for
// NewSNSPublisher(sns.NewFromConfig(awsCfg)).
type printer struct{}

func (printer) PublishBatch(_ context.Context, destination string, events []*outbox.Event) []error {
	for _, e := range events {
		fmt.Printf("%s %s %s %s\n", destination, e.PartitionKey, e.EventType, e.Payload)
	}
	return make([]error, len(events))
}

// A relay publishes committed rows, each partition key's in order, and marks them published
// only after the broker acknowledged them. RunOnce drains and returns; Run keeps polling.
func ExampleRelay() {
	ctx := context.Background()
	pool := exampleDB("ExampleRelay")
	defer pool.Close()
	for i, typ := range []string{"OrderCreated", "OrderPaid", "OrderShipped"} {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := outbox.Write(ctx, tx, outbox.Message{Topic: "orders", AggregateType: "order", AggregateID: "o-44",
				EventType: typ, Payload: json.RawMessage(fmt.Sprintf(`{"step":%d}`, i+1))})
			return err
		})
		if err != nil {
			log.Fatal(err)
		}
	}

	relay, err := outbox.NewRelay(pool, outbox.RelayConfig{
		Publisher: printer{},
		Topics:    map[string]string{"orders": "arn:aws:sns:eu-west-1:123456789012:orders"},
		Logger:    slog.New(slog.DiscardHandler),
	})
	if err != nil {
		log.Fatal(err)
	}
	stats, err := relay.RunOnce(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("published", stats.Published)
	// Output:
	// arn:aws:sns:eu-west-1:123456789012:orders o-44 OrderCreated {"step":1}
	// arn:aws:sns:eu-west-1:123456789012:orders o-44 OrderPaid {"step":2}
	// arn:aws:sns:eu-west-1:123456789012:orders o-44 OrderShipped {"step":3}
	// published 3
}
