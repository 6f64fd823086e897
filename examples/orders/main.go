// Command orders is the README's example: it saves an order and its OrderCreated event in one
// PostgreSQL transaction with outbox.Write. Run it with DATABASE_URL set:
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

	"github.com/sluicehq/sluice/migrations"
	"github.com/sluicehq/sluice/pkg/outbox"
)

func main() {
	if err := run(context.Background(), os.Getenv("DATABASE_URL")); err != nil {
		log.Fatal(err)
	}
	fmt.Println("order o-42 saved; its OrderCreated event will be published by the relay")
}

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

	// The business write and the event commit together, or not at all.
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO orders (id, total_cents) VALUES ($1, $2)`, "o-42", 4200); err != nil {
			return err
		}
		_, err := outbox.Write(ctx, tx, outbox.Message{
			Topic:         "orders", // mapped to an SNS topic ARN by the relay's configuration
			AggregateType: "order",
			AggregateID:   "o-42", // also the partition key: this order's events stay in order
			EventType:     "OrderCreated",
			Payload:       json.RawMessage(`{"orderId": "o-42", "totalCents": 4200}`),
			Headers:       map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
		})
		return err
	})
}
