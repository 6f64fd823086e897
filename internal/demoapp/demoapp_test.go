package demoapp

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// The verifier notices every kind of discrepancy it reports, so a passing demo means something.
func TestVerifyDetectsLostDuplicateAndOutOfOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	require.NoError(t, ApplySchema(ctx, pool))
	require.NoError(t, ApplySchema(ctx, pool), "the schema is idempotent")

	orders := []OrderCreated{
		{OrderID: "run1-1", Customer: "c", Seq: 1, AmountCents: 100, Currency: "EUR"},
		{OrderID: "run1-2", Customer: "c", Seq: 2, AmountCents: 200, Currency: "EUR"},
		{OrderID: "run1-3", Customer: "c", Seq: 3, AmountCents: 300, Currency: "EUR"},
	}
	ids := make([]string, len(orders))
	for i, o := range orders {
		id, err := PlaceOrder(ctx, pool, o)
		require.NoError(t, err)
		ids[i] = id.String()
	}
	v, err := Verify(ctx, pool, "run1-")
	require.NoError(t, err)
	require.Equal(t, 3, v.Produced)
	require.Equal(t, 3, v.Lost)
	require.False(t, v.OK(false))

	// Apply 3 before 1 (out of order), 1 twice, and 2 never.
	apply := func(id string, o OrderCreated) {
		_, err := pool.Exec(ctx, `INSERT INTO demo_ledger (message_id, order_id, customer, seq, amount_cents, currency)
			VALUES ($1, $2, $3, $4, $5, $6)`, id, o.OrderID, o.Customer, o.Seq, o.AmountCents, o.Currency)
		require.NoError(t, err)
	}
	apply(ids[2], orders[2])
	apply(ids[0], orders[0])
	apply(ids[0], orders[0])
	v, err = Verify(ctx, pool, "run1-")
	require.NoError(t, err)
	require.Equal(t, 1, v.ExactlyOnce)
	require.Equal(t, 1, v.Lost)
	require.Equal(t, 1, v.AppliedTwice)
	require.Equal(t, 2, v.OrderViolations)
	require.Len(t, v.Problems(true), 3)

	p, err := ProgressOf(ctx, pool, "run1-")
	require.NoError(t, err)
	require.Equal(t, Progress{Produced: 3, Published: 0, Applied: 2, OldestPending: p.OldestPending}, p)
	require.Positive(t, p.OldestPending)

	// Another run's prefix sees nothing; LIKE wildcards in a prefix are literal.
	v, err = Verify(ctx, pool, "run_")
	require.NoError(t, err)
	require.Zero(t, v.Produced)
}
