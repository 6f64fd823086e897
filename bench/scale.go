package main

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluicehq/sluice/pkg/outbox"
)

// scaleRounds is the number of backlogs drained at each scale (the first is a warm-up).
const scaleRounds = 3

// ScaleResult is the scale suite's outcome.
type ScaleResult struct {
	Claims []ClaimResult
	Purge  PurgeResult
}

// ClaimResult is the claim latency with Retained published rows in the table.
type ClaimResult struct {
	Label    string
	Retained int
	// Latency of the relay's claim statements that returned rows, timed at the client.
	Latency Latencies
	// Settle is the latency of the relay's settle batches (marking rows published), timed at the client.
	Settle Latencies
	// Explain is EXPLAIN (ANALYZE, BUFFERS) of one claim of ScalePending rows, and ExplainTime
	// its reported execution time.
	Explain     string
	ExplainTime string
}

// PurgeResult is one retention purge of the retained rows.
type PurgeResult struct {
	Deleted int64
	Elapsed time.Duration
	// Sizes before the purge, right after it, and after a plain VACUUM.
	Before, After, AfterVacuum RelSize
}

// Rate is rows deleted per second.
func (p PurgeResult) Rate() float64 { return float64(p.Deleted) / p.Elapsed.Seconds() }

// RelSize is outbox_event's size.
type RelSize struct {
	Rows         int64
	Table, Index int64 // bytes: heap (with TOAST and maps) and all indexes
}

// claimTracer times the relay's claim statement (recognised by its text) on every connection
// of the pool, and keeps its SQL and arguments for EXPLAIN.
type claimTracer struct {
	mu   sync.Mutex
	durs []time.Duration
	sql  string
	args []any
	// settles are the durations of the relay's settle batches (every pgx.Batch on the pool).
	settles []time.Duration
}

type batchKey struct{}

var _ pgx.BatchTracer = (*claimTracer)(nil)

func (t *claimTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return context.WithValue(ctx, batchKey{}, time.Now())
}

func (t *claimTracer) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

func (t *claimTracer) TraceBatchEnd(ctx context.Context, _ *pgx.Conn, data pgx.TraceBatchEndData) {
	start, ok := ctx.Value(batchKey{}).(time.Time)
	if !ok || data.Err != nil {
		return
	}
	t.mu.Lock()
	t.settles = append(t.settles, time.Since(start))
	t.mu.Unlock()
}

func (t *claimTracer) takeSettles() []time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	d := t.settles
	t.settles = nil
	return d
}

type traceKey struct{}

func isClaim(sql string) bool {
	return strings.Contains(sql, "WITH cand AS") && strings.Contains(sql, "SKIP LOCKED")
}

func (t *claimTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if !isClaim(data.SQL) {
		return ctx
	}
	t.mu.Lock()
	t.sql, t.args = data.SQL, data.Args
	t.mu.Unlock()
	return context.WithValue(ctx, traceKey{}, time.Now())
}

func (t *claimTracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryEndData) {
	start, ok := ctx.Value(traceKey{}).(time.Time)
	if !ok || data.Err != nil || data.CommandTag.RowsAffected() == 0 {
		return
	}
	t.mu.Lock()
	t.durs = append(t.durs, time.Since(start))
	t.mu.Unlock()
}

func (t *claimTracer) take() []time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	d := t.durs
	t.durs = nil
	return d
}

// runScaleSuite measures the relay's claim latency with 0 and millions of published rows
// retained, then purges the retained rows with outbox.Purge and records the table's size.
func runScaleSuite(ctx context.Context, log *slog.Logger, env *Env, sz Sizes, rep *Report) error {
	tracer := &claimTracer{}
	pool, _, err := env.NewDatabase(ctx, "scale", 8, tracer)
	if err != nil {
		return err
	}
	defer pool.Close()
	res := &ScaleResult{}
	// Relay rows use ids far above the retained history's.
	const pendingBase = int64(1) << 40

	// One tiny drain to capture the claim statement for EXPLAIN.
	if err := insertOutboxRows(ctx, pool, pendingBase, 10, 10, false); err != nil {
		return err
	}
	if _, err := drain(ctx, pool); err != nil {
		return err
	}
	_, _ = tracer.take(), tracer.takeSettles()

	retained := 0
	measure := func(label string) error {
		if _, err := pool.Exec(ctx, "DELETE FROM outbox_event WHERE created_at > now() - interval '1 day'"); err != nil {
			return err
		}
		if _, err := pool.Exec(ctx, "VACUUM ANALYZE outbox_event"); err != nil {
			return err
		}
		cr := ClaimResult{Label: label, Retained: retained}
		var durs, settles []time.Duration
		// scaleRounds backlogs in a row; the first warms the caches up and is not counted.
		for round := range scaleRounds {
			if err := insertOutboxRows(ctx, pool, pendingBase+int64(round)*int64(sz.ScalePending), sz.ScalePending, 1000, false); err != nil {
				return err
			}
			if _, err := pool.Exec(ctx, "ANALYZE outbox_event"); err != nil {
				return err
			}
			if round == scaleRounds-1 {
				plan, execTime, err := explainClaim(ctx, pool, tracer)
				if err != nil {
					return err
				}
				cr.Explain, cr.ExplainTime = plan, execTime
			}
			st, err := drain(ctx, pool)
			if err != nil {
				return err
			}
			if st.Published != sz.ScalePending {
				return fmt.Errorf("scale %s: relay published %d of %d", label, st.Published, sz.ScalePending)
			}
			d, st2 := tracer.take(), tracer.takeSettles()
			if round > 0 {
				durs = append(durs, d...)
				settles = append(settles, st2...)
			}
		}
		cr.Latency, cr.Settle = summarize(durs), summarize(settles)
		log.Info("claim latency", "label", label, "retained", retained, "claims", cr.Latency.N, "p50", cr.Latency.P50, "mean", cr.Latency.Mean, "explain", cr.ExplainTime)
		res.Claims = append(res.Claims, cr)
		return nil
	}
	for _, target := range sz.ScaleRetained {
		if target > retained {
			t0 := time.Now()
			if err := insertOutboxRows(ctx, pool, int64(retained), target-retained, 1000, true); err != nil {
				return err
			}
			log.Info("retained rows inserted", "rows", target-retained, "took", time.Since(t0).Round(time.Millisecond))
			retained = target
		}
		if err := measure(fmt.Sprintf("%d retained", retained)); err != nil {
			return err
		}
	}

	// Purge cycle: every retained row is 30 days old; a 7-day retention deletes them all.
	if _, err := pool.Exec(ctx, "DELETE FROM outbox_event WHERE created_at > now() - interval '1 day'"); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, "VACUUM ANALYZE outbox_event"); err != nil {
		return err
	}
	if res.Purge.Before, err = relSize(ctx, pool); err != nil {
		return err
	}
	t0 := time.Now()
	deleted, err := outbox.Purge(ctx, pool, 7*24*time.Hour, nil)
	if err != nil {
		return err
	}
	res.Purge.Deleted, res.Purge.Elapsed = deleted, time.Since(t0)
	if res.Purge.After, err = relSize(ctx, pool); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, "VACUUM outbox_event"); err != nil {
		return err
	}
	if res.Purge.AfterVacuum, err = relSize(ctx, pool); err != nil {
		return err
	}
	log.Info("purge", "deleted", deleted, "took", res.Purge.Elapsed.Round(time.Millisecond), "rows/s", int(res.Purge.Rate()))
	retained = 0
	if err := measure("after the purge and VACUUM"); err != nil {
		return err
	}
	rep.Scale = res
	return nil
}

// drain publishes every pending row with sluice's relay (defaults, 0 ms stub publisher).
func drain(ctx context.Context, pool *pgxpool.Pool) (outbox.Stats, error) {
	r, err := outbox.NewRelay(pool, outbox.RelayConfig{Publisher: &stubPublisher{}, Topics: map[string]string{"orders": "arn:aws:sns:us-east-1:000000000000:orders"}})
	if err != nil {
		return outbox.Stats{}, err
	}
	return r.RunOnce(ctx)
}

// explainClaim runs EXPLAIN (ANALYZE, BUFFERS) of the relay's claim statement, as the relay
// last sent it, in a transaction it rolls back (the claim is an UPDATE).
func explainClaim(ctx context.Context, pool *pgxpool.Pool, t *claimTracer) (plan, execTime string, err error) {
	t.mu.Lock()
	sql, args := t.sql, t.args
	t.mu.Unlock()
	if sql == "" {
		return "", "", fmt.Errorf("no claim statement captured")
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		return "", "", err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	rows, err := tx.Query(ctx, "EXPLAIN (ANALYZE, BUFFERS) "+sql, args...)
	if err != nil {
		return "", "", fmt.Errorf("explain claim: %w", err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return "", "", fmt.Errorf("explain claim: %w", err)
	}
	for _, l := range lines {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "Execution Time: "); ok {
			execTime = v
		}
	}
	return strings.Join(lines, "\n"), execTime, nil
}

func relSize(ctx context.Context, pool *pgxpool.Pool) (RelSize, error) {
	var s RelSize
	err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM outbox_event), pg_table_size('outbox_event'), pg_indexes_size('outbox_event')`).
		Scan(&s.Rows, &s.Table, &s.Index)
	return s, err
}
