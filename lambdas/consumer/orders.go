package main

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/sluicehq/sluice/internal/demoapp"
	"github.com/sluicehq/sluice/pkg/inbox"
)

// orderCreated applies an OrderCreated event inside the inbox transaction tx: a ledger entry and
// the customer's balance. It never commits; returning an error rolls everything back (the inbox
// row included) and the record comes back from SQS.
func orderCreated(ctx context.Context, tx pgx.Tx, msg inbox.Message) error {
	var o demoapp.OrderCreated
	if err := msg.Decode(&o); err != nil {
		return err
	}
	// Test hooks carried by the payload (absent in normal traffic): a transient failure for the
	// first deliveries, and a transaction held open so tests can cut the connection mid-way.
	if o.FailAttempts > 0 && msg.ReceiveCount <= o.FailAttempts {
		return fmt.Errorf("order %s: injected transient failure (delivery %d of the first %d)", o.OrderID, msg.ReceiveCount, o.FailAttempts)
	}
	if o.HoldMillis > 0 {
		if _, err := tx.Exec(ctx, "SELECT pg_sleep($1::float8 / 1000)", o.HoldMillis); err != nil {
			return fmt.Errorf("order %s: hold transaction: %w", o.OrderID, err)
		}
	}
	return demoapp.ApplyOrderCreated(ctx, tx, msg.ID, o)
}
