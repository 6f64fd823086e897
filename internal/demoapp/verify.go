package demoapp

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Querier reads rows: a *pgxpool.Pool, *pgx.Conn or pgx.Tx.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Progress is a snapshot of one run, identified by its order id prefix.
type Progress struct {
	// Produced is the number of committed orders (each with its event).
	Produced int
	// Published is the number of their events the broker acknowledged.
	Published int
	// Applied is the number of distinct events in the ledger.
	Applied int
	// OldestPending is the age of the run's oldest unpublished event; zero when none.
	OldestPending time.Duration
}

// ProgressOf reads the progress of the run whose order ids start with prefix.
func ProgressOf(ctx context.Context, db Querier, prefix string) (Progress, error) {
	var p Progress
	var oldest float64
	err := db.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM demo_orders WHERE order_id LIKE $1),
		(SELECT count(*) FROM outbox_event WHERE aggregate_id LIKE $1 AND published_at IS NOT NULL),
		(SELECT count(DISTINCT message_id) FROM demo_ledger WHERE order_id LIKE $1),
		coalesce((SELECT extract(epoch FROM now() - min(created_at)) FROM outbox_event WHERE aggregate_id LIKE $1 AND published_at IS NULL), 0)`,
		likePrefix(prefix)).Scan(&p.Produced, &p.Published, &p.Applied, &oldest)
	if err != nil {
		return Progress{}, fmt.Errorf("read progress: %w", err)
	}
	p.OldestPending = time.Duration(oldest * float64(time.Second))
	return p, nil
}

// Verification is the end-of-run check.
type Verification struct {
	// Produced is the number of committed orders; Events the number of their outbox events.
	Produced, Events int
	// ExactlyOnce is the number of events applied exactly once.
	ExactlyOnce int
	// Lost is the number of committed events never applied.
	Lost int
	// AppliedTwice is the number of events applied more than once.
	AppliedTwice int
	// Unexpected is the number of ledger entries for messages that were never committed.
	Unexpected int
	// OrderViolations counts ledger entries applied before an earlier order of the same customer.
	// Only FIFO promises per-key order, so only FIFO runs require zero.
	OrderViolations int
	// P50 and P99 are the commit-to-apply latencies (outbox created_at to the ledger insert).
	P50, P99 time.Duration
	// PublishP50 and PublishP99 are the relay's share of them: commit to the moment the relay
	// recorded the broker's acknowledgement (outbox created_at to published_at), over the
	// applied events.
	PublishP50, PublishP99 time.Duration
}

// OK reports whether every committed event was applied exactly once (and, when fifo, in
// per-customer order).
func (v Verification) OK(fifo bool) bool {
	return v.Produced == v.Events && v.ExactlyOnce == v.Events && v.Lost == 0 && v.AppliedTwice == 0 &&
		v.Unexpected == 0 && (!fifo || v.OrderViolations == 0)
}

// Problems lists what is wrong, one phrase per discrepancy; empty when OK(fifo).
func (v Verification) Problems(fifo bool) []string {
	var out []string
	if v.Produced != v.Events {
		out = append(out, fmt.Sprintf("%d orders but %d outbox events", v.Produced, v.Events))
	}
	if v.Lost > 0 {
		out = append(out, fmt.Sprintf("%d events lost", v.Lost))
	}
	if v.AppliedTwice > 0 {
		out = append(out, fmt.Sprintf("%d events applied twice", v.AppliedTwice))
	}
	if v.Unexpected > 0 {
		out = append(out, fmt.Sprintf("%d ledger entries for events never committed", v.Unexpected))
	}
	if fifo && v.OrderViolations > 0 {
		out = append(out, fmt.Sprintf("%d entries out of per-customer order", v.OrderViolations))
	}
	return out
}

// Verify checks the run whose order ids start with prefix.
func Verify(ctx context.Context, db Querier, prefix string) (Verification, error) {
	var v Verification
	var p50, p99, pub50, pub99 *float64
	err := db.QueryRow(ctx, `
		WITH produced AS (
			SELECT event_id::text AS message_id, created_at, published_at FROM outbox_event
			WHERE aggregate_id LIKE $1 AND event_type = 'OrderCreated'
		), applied AS (
			SELECT message_id, count(*) AS n, min(applied_at) AS first_at FROM demo_ledger
			WHERE order_id LIKE $1 GROUP BY message_id
		), joined AS (
			SELECT p.message_id, p.created_at, p.published_at, a.n, a.first_at FROM produced p LEFT JOIN applied a USING (message_id)
		), ordered AS (
			SELECT seq, lag(seq) OVER (PARTITION BY customer ORDER BY entry_id) AS prev
			FROM demo_ledger WHERE order_id LIKE $1
		)
		SELECT
			(SELECT count(*) FROM demo_orders WHERE order_id LIKE $1),
			(SELECT count(*) FROM produced),
			(SELECT count(*) FROM joined WHERE n = 1),
			(SELECT count(*) FROM joined WHERE n IS NULL),
			(SELECT count(*) FROM joined WHERE n > 1),
			(SELECT count(*) FROM applied WHERE message_id NOT IN (SELECT message_id FROM produced)),
			(SELECT count(*) FROM ordered WHERE prev IS NOT NULL AND seq <= prev),
			(SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM first_at - created_at)) FROM joined WHERE n IS NOT NULL),
			(SELECT percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM first_at - created_at)) FROM joined WHERE n IS NOT NULL),
			(SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM published_at - created_at)) FROM joined WHERE n IS NOT NULL),
			(SELECT percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM published_at - created_at)) FROM joined WHERE n IS NOT NULL)`,
		likePrefix(prefix)).Scan(&v.Produced, &v.Events, &v.ExactlyOnce, &v.Lost, &v.AppliedTwice, &v.Unexpected,
		&v.OrderViolations, &p50, &p99, &pub50, &pub99)
	if err != nil {
		return Verification{}, fmt.Errorf("verify run %s: %w", prefix, err)
	}
	seconds := func(f *float64) time.Duration {
		if f == nil {
			return 0
		}
		return time.Duration(*f * float64(time.Second))
	}
	v.P50, v.P99, v.PublishP50, v.PublishP99 = seconds(p50), seconds(p99), seconds(pub50), seconds(pub99)
	return v, nil
}

// likePrefix turns a run prefix into a LIKE pattern, escaping LIKE's wildcards.
func likePrefix(prefix string) string {
	r := strings.NewReplacer(`\`, `\\`, `%`, `\%`, `_`, `\_`)
	return r.Replace(prefix) + "%"
}
