// Package demoapp is the demo domain shared by `make demo`, the end-to-end tests, the benchmarks
// and the demo's ledger consumer (examples/ledger): the OrderCreated event contract, an orders
// service that saves an order and its event in one transaction (outbox.Write), the tables of
// both sides (orders; the ledger and a per-customer projection), and the queries that verify
// every committed event was applied exactly once.
//
// Its schema (schema.sql) is deliberately not in migrations/, which is sluice's own schema.
package demoapp

import (
	"context"
	_ "embed"
	"encoding/json"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/sluicehq/sluice/pkg/outbox"
)

//go:embed schema.sql
var schema string

// Topic is the logical outbox topic of the orders service's events.
const Topic = "orders"

// EventOrderCreated is the event type the orders service writes and the ledger consumer applies.
const EventOrderCreated = "OrderCreated"

// OrderCreated is the payload of an OrderCreated event (version 1 of the event contract).
type OrderCreated struct {
	// OrderID is the order's id; it starts with the run's prefix in demos and tests.
	OrderID string `json:"order_id"`
	// Customer owns the order and is the partition key (the FIFO message group).
	Customer string `json:"customer"`
	// Seq numbers the customer's orders from 1, in commit order.
	Seq int `json:"seq"`
	// AmountCents and Currency are the order's total.
	AmountCents int64  `json:"amount_cents"`
	Currency    string `json:"currency"`
	// FailAttempts makes the ledger consumer (examples/ledger) fail this message while its SQS receive count
	// is at most this number: a transient fault for the end-to-end tests. Normally absent.
	FailAttempts int `json:"fail_attempts,omitempty"`
	// HoldMillis makes the ledger consumer hold its transaction open this long (pg_sleep),
	// so tests can terminate its database connection mid-transaction. Normally absent.
	HoldMillis int `json:"hold_ms,omitempty"`
}

// Beginner opens transactions: a *pgxpool.Pool or *pgx.Conn.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// ApplySchema creates the demo tables if they do not exist. Concurrent callers (several Lambda
// cold starts) serialise on an advisory lock.
func ApplySchema(ctx context.Context, db Beginner) error {
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtext('sluice-demoapp-schema'))"); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, schema)
		return err
	})
	if err != nil {
		return fmt.Errorf("apply demo schema: %w", err)
	}
	return nil
}

// PlaceOrder is the orders service's write: the order row and its OrderCreated event commit in
// one transaction, or neither does. It returns the event id.
func PlaceOrder(ctx context.Context, db Beginner, o OrderCreated) (uuid.UUID, error) {
	payload, err := json.Marshal(o)
	if err != nil {
		return uuid.Nil, fmt.Errorf("encode order %s: %w", o.OrderID, err)
	}
	var id uuid.UUID
	err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO demo_orders (order_id, customer, seq, amount_cents, currency) VALUES ($1, $2, $3, $4, $5)`,
			o.OrderID, o.Customer, o.Seq, o.AmountCents, o.Currency); err != nil {
			return fmt.Errorf("insert order: %w", err)
		}
		written, err := outbox.Write(ctx, tx, outbox.Message{
			Topic: Topic, AggregateType: "order", AggregateID: o.OrderID, EventType: EventOrderCreated,
			PartitionKey: o.Customer, Payload: payload,
		})
		if err != nil {
			return err
		}
		id = written[0].EventID
		return nil
	})
	if err != nil {
		return uuid.Nil, fmt.Errorf("place order %s: %w", o.OrderID, err)
	}
	return id, nil
}
