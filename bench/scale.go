package main

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
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
	// Latency of the relay's claims that returned rows (a round's lock and read statements),
	// timed at the client.
	Latency Latencies
	// Settle is the latency of the relay's settle batches (marking rows published), timed at the client.
	Settle Latencies
	// Explain is EXPLAIN (ANALYZE, BUFFERS) of one claim's read (the largest round), and ExplainTime
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

// runScaleSuite measures the relay's claim latency with 0 and millions of published rows
// retained, then purges the retained rows with outbox.Purge and records the table's size.
func runScaleSuite(ctx context.Context, log *slog.Logger, env *Env, sz Sizes, rep *Report) error {
	tracer := newRelayTracer()
	pool, _, err := env.NewDatabase(ctx, "scale", 8, tracer)
	if err != nil {
		return err
	}
	defer pool.Close()
	res := &ScaleResult{}
	// Relay rows use ids far above the retained history's.
	const pendingBase = int64(1) << 40

	retained := 0
	measure := func(label string) error {
		tracer.reset()
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
			d, st2 := durations(tracer.take("claim")), durations(tracer.take(stmtSettle))
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

// relayPlanGuards are the settings the relay's transactions run with (planGuards in
// pkg/outbox/claim.go, which is not exported; keep the two the same): an EXPLAIN of its
// statements must plan under them, as the relay does. Without jit = off, the disabled plan
// nodes' cost penalty makes PostgreSQL JIT-compile the statement for seconds.
const relayPlanGuards = "SET LOCAL enable_seqscan = off; SET LOCAL enable_bitmapscan = off; " +
	"SET LOCAL enable_hashjoin = off; SET LOCAL enable_mergejoin = off; " +
	"SET LOCAL jit = off; SET LOCAL max_parallel_workers_per_gather = 0"

// explainClaim runs EXPLAIN (ANALYZE, BUFFERS) of the relay's read statement (the claim's
// scan: each locked key's rows after its floor), as the relay sent it in the round that read the
// most rows since the tracer's reset, under the relay's plan guards, in a transaction it rolls
// back. The claim's other statement, the advisory locks, reads no table.
func explainClaim(ctx context.Context, pool *pgxpool.Pool, t *relayTracer) (plan, execTime string, err error) {
	sql, args, _ := t.biggest()
	if sql == "" {
		return "", "", fmt.Errorf("no read statement of the relay captured")
	}
	return explainAsRelay(ctx, pool, sentStmt{sql, args}, false)
}

// explainAsRelay runs EXPLAIN (ANALYZE, BUFFERS) of st under the relay's plan guards in a
// transaction it rolls back (so a settle's UPDATE changes nothing), and returns the plan and its
// execution time. generic plans it as a prepared statement's generic plan (what pgx's statement
// cache gets once PostgreSQL stops making custom plans).
func explainAsRelay(ctx context.Context, pool *pgxpool.Pool, st sentStmt, generic bool) (plan, execTime string, err error) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return "", "", err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	guards := relayPlanGuards + "; SET LOCAL statement_timeout = '20s'"
	if generic {
		guards += "; SET LOCAL plan_cache_mode = force_generic_plan"
	}
	if _, err := tx.Exec(ctx, guards); err != nil {
		return "", "", err
	}
	rows, err := tx.Query(ctx, "EXPLAIN (ANALYZE, BUFFERS) "+st.SQL, st.Args...)
	if err != nil {
		return "", "", fmt.Errorf("explain: %w", err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return "", "", fmt.Errorf("explain: %w", err)
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
