package main

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluicehq/sluice/internal/pgcluster"
	"github.com/sluicehq/sluice/pkg/outbox"
)

// WALWakeResult is the WAL wake-up suite's outcome (issue 44): one relay at its defaults, with
// and without RelayConfig.WAL, side by side on the same server (wal_level=logical).
type WALWakeResult struct {
	// Runs are the relay's runs, polling and following the WAL, at each rate.
	Runs []WALWakeRun
	// Duration is how long each run's producer commits.
	Duration time.Duration
	// Keys the producer spreads its events over.
	Keys int
	// RetainedStopped is the WAL the relay's slots held while it was stopped for Stopped (bytes,
	// summed over sluice_relay_* slots); RetainedRunning what its slot held behind the server's
	// current position 2 s after it restarted and followed again.
	Stopped                          time.Duration
	RetainedStopped, RetainedRunning int64
	SlotsWhileStopped                int
}

// WALWakeRun is one relay's run.
type WALWakeRun struct {
	// Mode is "poll" (without RelayConfig.WAL) or "wal".
	Mode string
	Rate int
	// Achieved is the producer's rate; Produced its events.
	Achieved float64
	Produced int
	// Latency is each event's Commit return to the stub's acknowledgement; Missing those not
	// acknowledged 10 s after the producer stopped.
	Latency Latencies
	Missing int
	// IdleStatements and BusyStatements are the relay's statements per second on its pool, idle
	// before the producer starts and while relaying (the replication connection sends no
	// statements: its keepalives and position confirmations are not counted).
	IdleStatements, BusyStatements float64
	// LateWait is the commit-to-publish latency of a row whose transaction stayed open 2 s while
	// others committed (its id below theirs).
	LateWait time.Duration
	// Following says the WAL run's relay followed the stream when the producer started.
	Following bool
	// FallBack (WAL runs at the highest rate) is the time from the relay's walsender being
	// terminated, mid-run, to the relay polling; Returned the time until it follows again;
	// AfterKillMax the worst latency of the events committed in the 2 s after the kill.
	FallBack, Returned, AfterKillMax time.Duration
}

// walWakeTarget is issue 44's bound on the p99 commit-to-publish latency at 100 events/s with
// the stream and a 0 ms publisher.
const walWakeTarget = 20 * time.Millisecond

// walWakeRates are the offered rates (events/s).
var walWakeRates = []int{100, 1000}

// runWALWakeSuite runs the suite on a throwaway cluster with wal_level=logical (both modes on
// it, so that only the relay's configuration differs), or on DATABASE_URL's server when it
// decodes WAL.
func runWALWakeSuite(ctx context.Context, log *slog.Logger, env *Env, sz Sizes, rep *Report) error {
	lenv, err := env.logicalEnv(ctx)
	if err != nil {
		return err
	}
	res := &WALWakeResult{Duration: sz.WakeupDuration, Keys: 50, Stopped: sz.WALWakeStopped}
	for _, rate := range walWakeRates {
		for _, mode := range []string{"poll", "wal"} {
			run, err := runWALWakeOnce(ctx, log, lenv, res, mode, rate, rate == walWakeRates[len(walWakeRates)-1])
			if err != nil {
				return fmt.Errorf("%s at %d events/s: %w", mode, rate, err)
			}
			res.Runs = append(res.Runs, run)
		}
	}
	rep.WALWake = res
	return nil
}

// logicalEnv returns the server with wal_level=logical: a third throwaway cluster, or the
// server named by DATABASE_URL when it decodes WAL.
func (e *Env) logicalEnv(ctx context.Context) (*Env, error) {
	if e.cluster == nil {
		conn, err := pgx.Connect(ctx, e.AdminURL)
		if err != nil {
			return nil, err
		}
		defer conn.Close(ctx)
		var level string
		if err := conn.QueryRow(ctx, "SHOW wal_level").Scan(&level); err != nil {
			return nil, err
		}
		if level != "logical" {
			return nil, fmt.Errorf("the walwake suite needs wal_level=logical on %s (it has %s)", e.Source, level)
		}
		return e, nil
	}
	// Durable, as production is: with synchronous_commit off a commit's WAL is flushed by the
	// WAL writer up to wal_writer_delay (200 ms) later, and logical decoding reads only
	// flushed WAL, so the stream would lag by up to that much.
	e.log.Info("starting a durable throwaway PostgreSQL cluster with wal_level=logical")
	c, err := pgcluster.Start(ctx, pgcluster.Options{MaxConnections: 100, Durable: true, Settings: map[string]string{
		"wal_level": "logical", "max_replication_slots": "10", "max_wal_senders": "10"}})
	if err != nil {
		return nil, fmt.Errorf("start the wal_level=logical cluster: %w", err)
	}
	env := &Env{AdminURL: c.URL, Source: "a durable throwaway cluster with wal_level=logical started by the harness", Durable: true, cluster: c, log: e.log}
	e.closers = append(e.closers, env.Close)
	return env, nil
}

// runWALWakeOnce runs one relay in mode at rate on a fresh database.
func runWALWakeOnce(ctx context.Context, log *slog.Logger, env *Env, res *WALWakeResult, mode string, rate int, faults bool) (WALWakeRun, error) {
	run := WALWakeRun{Mode: mode, Rate: rate}
	tracer := newRelayTracer()
	relayPool, dbURL, err := env.NewDatabase(ctx, fmt.Sprintf("walwake_%s_%d", mode, rate), int32(outbox.RelayConfig{}.PoolSize()), tracer)
	if err != nil {
		return run, err
	}
	defer relayPool.Close()
	pool, err := openPool(ctx, dbURL, 16)
	if err != nil {
		return run, err
	}
	defer pool.Close()
	book := newWaitBook()
	cfg := outbox.RelayConfig{Publisher: &ackPublisher{book: book}, Topics: map[string]string{"orders": ordersARN}}
	if mode == "wal" {
		cfg.WAL = &outbox.WALWake{RetryAfter: time.Second}
	}
	start := func() (*outbox.Relay, func(), error) {
		r, err := outbox.NewRelay(relayPool, cfg)
		if err != nil {
			return nil, nil, err
		}
		rctx, stop := context.WithCancel(ctx)
		var wg sync.WaitGroup
		wg.Add(1)
		go func() { defer wg.Done(); _ = r.Run(rctx) }()
		return r, func() { stop(); wg.Wait() }, nil
	}
	r, stop, err := start()
	if err != nil {
		return run, err
	}
	defer func() { stop() }()
	if mode == "wal" {
		for until := time.Now().Add(10 * time.Second); !r.FollowingWAL() && time.Now().Before(until); {
			if err := sleepCtx(ctx, 10*time.Millisecond); err != nil {
				return run, err
			}
		}
		run.Following = r.FollowingWAL()
	}
	if err := sleepCtx(ctx, time.Second); err != nil {
		return run, err
	}
	tracer.reset()
	if err := sleepCtx(ctx, 3*time.Second); err != nil {
		return run, err
	}
	run.IdleStatements = tracer.rate()
	tracer.reset()

	// Beside the producer: a late commit (its transaction open 2 s while others commit) and,
	// in the WAL run at the highest rate, the relay's walsender terminated halfway.
	var (
		late    uuid.UUID
		lateErr error
		side    sync.WaitGroup
		killAt  time.Time
	)
	side.Add(1)
	go func() {
		defer side.Done()
		lateErr = lateCommit(ctx, pool, book, &late)
	}()
	if faults && mode == "wal" {
		side.Add(1)
		go func() {
			defer side.Done()
			if sleepCtx(ctx, res.Duration/2) != nil {
				return
			}
			killAt = time.Now()
			_, _ = pool.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_replication WHERE application_name = 'sluice-relay-wal'`)
			for !killAt.IsZero() && r.FollowingWAL() && time.Since(killAt) < 10*time.Second {
				_ = sleepCtx(ctx, time.Millisecond)
			}
			run.FallBack = time.Since(killAt)
			for !r.FollowingWAL() && time.Since(killAt) < 30*time.Second {
				_ = sleepCtx(ctx, 5*time.Millisecond)
			}
			run.Returned = time.Since(killAt)
		}()
	}
	ids, achieved, err := produceAtRate(ctx, pool, book, rate, res.Keys, res.Duration, "w")
	side.Wait()
	if err != nil {
		return run, err
	}
	if lateErr != nil {
		return run, lateErr
	}
	run.BusyStatements = tracer.rate()
	run.Produced, run.Achieved = len(ids), achieved
	all := append(ids, late)
	for until := time.Now().Add(10 * time.Second); book.pending(all) > 0 && time.Now().Before(until); {
		if err := sleepCtx(ctx, 10*time.Millisecond); err != nil {
			return run, err
		}
	}
	waits, missing := book.waits(ids)
	run.Latency, run.Missing = summarize(waits), missing
	if w, _ := book.waits([]uuid.UUID{late}); len(w) == 1 {
		run.LateWait = w[0]
	}
	if !killAt.IsZero() {
		after, _ := book.waits(book.committedBetween(ids, killAt, killAt.Add(2*time.Second)))
		run.AfterKillMax = summarize(after).Max
	}
	if faults && mode == "wal" {
		// Retained WAL: the relay stopped (its temporary slot goes with its session) while the
		// producer goes on, then restarted.
		stop()
		stop = func() {}
		if _, _, err := produceAtRate(ctx, pool, book, 100, res.Keys, res.Stopped, "s"); err != nil {
			return run, err
		}
		if err := pool.QueryRow(ctx, `SELECT count(*), coalesce(sum(pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)), 0)::bigint
			FROM pg_replication_slots WHERE slot_name LIKE 'sluice_relay_%'`).Scan(&res.SlotsWhileStopped, &res.RetainedStopped); err != nil {
			return run, err
		}
		r2, stop2, err := start()
		if err != nil {
			return run, err
		}
		stop = stop2
		for until := time.Now().Add(10 * time.Second); !r2.FollowingWAL() && time.Now().Before(until); {
			_ = sleepCtx(ctx, 10*time.Millisecond)
		}
		if _, _, err := produceAtRate(ctx, pool, book, 100, res.Keys, 2*time.Second, "t"); err != nil {
			return run, err
		}
		if err := pool.QueryRow(ctx, `SELECT coalesce(max(pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)), 0)::bigint
			FROM pg_replication_slots WHERE slot_name LIKE 'sluice_relay_%'`).Scan(&res.RetainedRunning); err != nil {
			return run, err
		}
	}
	log.Info("walwake", "mode", mode, "rate", rate, "p50", run.Latency.P50, "p99", run.Latency.P99, "missing", run.Missing,
		"idle_statements/s", run.IdleStatements, "late", run.LateWait, "fallback", run.FallBack)
	return run, nil
}

// lateCommit writes one row in a transaction it keeps open 2 s, then commits it: its id is
// below the rows the producer commits meanwhile.
func lateCommit(ctx context.Context, pool *pgxpool.Pool, book *waitBook, id *uuid.UUID) error {
	if err := sleepCtx(ctx, time.Second); err != nil {
		return nil
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	written, err := outbox.Write(ctx, tx, outbox.Message{Topic: "orders", AggregateType: "order", AggregateID: "late",
		EventType: "OrderCreated", Payload: []byte(`{"late":true}`)})
	if err != nil {
		return err
	}
	if err := sleepCtx(ctx, 2*time.Second); err != nil {
		return nil
	}
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	book.commit(time.Now(), written[0].EventID)
	*id = written[0].EventID
	return nil
}

func (r *Report) walWakeTargets() []target {
	ww := r.WALWake
	if ww == nil {
		return nil
	}
	var ts []target
	for _, run := range ww.Runs {
		if run.Mode != "wal" || run.Rate != walWakeRates[0] {
			continue
		}
		measured := fmt.Sprintf("p99 %s, p50 %s over %s events (polling, same server and run: see section)", dur(run.Latency.P99), dur(run.Latency.P50), num(float64(run.Produced)))
		ok := run.Following && run.Missing == 0 && run.Latency.N > 0 && run.Latency.P99 <= walWakeTarget
		if !run.Following {
			measured += "; the relay did not follow the WAL"
		}
		ts = append(ts, target{44, "WAL wake-up at 100 events/s", "p99 commit-to-publish < 20 ms (0 ms publisher)", measured, verdict(ok)})
		ts = append(ts, target{44, "WAL wake-up, idle outbox", "0 statements/s beyond the stream's keepalive",
			fmt.Sprintf("%s statements/s (the stream stands in for polls and sweeps while it reports no change)", num(run.IdleStatements)),
			verdict(run.IdleStatements == 0)})
	}
	ts = append(ts, target{44, "WAL wake-up, relay stopped", "no WAL retained by the relay's slot while it is stopped",
		fmt.Sprintf("%d slots, %s bytes retained after %s stopped; %s bytes behind 2 s after its restart", ww.SlotsWhileStopped,
			num(float64(ww.RetainedStopped)), ww.Stopped, num(float64(ww.RetainedRunning))), verdict(ww.SlotsWhileStopped == 0 && ww.RetainedStopped == 0)})
	return ts
}

func (r *Report) walWakeMarkdown(w func(string, ...any)) {
	ww := r.WALWake
	if ww == nil {
		return
	}
	w("## WAL wake-up (issue 44)\n\n")
	w("One relay at its defaults (`Run`, a pool of `RelayConfig.PoolSize()` connections, a stub broker that acknowledges at once) "+
		"polling (`poll`) or following the WAL (`wal`, `RelayConfig.WAL`), each on a fresh database of the same throwaway server with "+
		"`wal_level=logical` and durable commits (`fsync`, `synchronous_commit` on: logical decoding reads only flushed WAL), while a producer commits each event in its own transaction over %d keys for %s. Latency runs from the "+
		"producer's `Commit` return to the stub's acknowledgement. Statements are counted on the relay's pool (the replication "+
		"connection sends none). The late row's transaction stays open 2 s while the others commit. In the `wal` run at the highest "+
		"rate the relay's walsender is terminated halfway (as at a failover): fall-back is the time until the relay polls, return "+
		"until it follows a new slot, and the worst latency of the events committed in the 2 s after.\n\n", ww.Keys, ww.Duration)
	w("| mode | offered | reached | p50 | p95 | p99 | max | not acknowledged | statements/s idle | relaying | late row's wait | fall-back | return | worst after the kill |\n")
	w("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, run := range ww.Runs {
		fb, ret, ak := "–", "–", "–"
		if run.FallBack > 0 {
			fb, ret, ak = dur(run.FallBack), dur(run.Returned), dur(run.AfterKillMax)
		}
		w("| %s | %d/s | %s/s | %s | %s | **%s** | %s | %d | %s | %s | %s | %s | %s | %s |\n", run.Mode, run.Rate, num(run.Achieved),
			dur(run.Latency.P50), dur(run.Latency.P95), dur(run.Latency.P99), dur(run.Latency.Max), run.Missing,
			num(run.IdleStatements), num(run.BusyStatements), dur(run.LateWait), fb, ret, ak)
	}
	w("\nStopped for %s while 100 events/s were committed, the relay left %d replication slots holding %s bytes of WAL (its slot is "+
		"temporary: it ends with the relay's session); 2 s after it restarted, its new slot was %s bytes behind the server's position.\n\n",
		ww.Stopped, ww.SlotsWhileStopped, num(float64(ww.RetainedStopped)), num(float64(ww.RetainedRunning)))
}
