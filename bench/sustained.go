package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluicehq/sluice/pkg/outbox"
	"github.com/sluicehq/sluice/pkg/partition"
)

// SustainedResult is the sustained suite's outcome (issue 11, section 3): the outbox at a steady
// rate for minutes, with retention applied as it runs, on the plain and on the partitioned
// table, each without and with a transaction that holds VACUUM back.
//
// Each run produces without a pause for a warm-up and then a measurement window of Measure:
// the claim, the throughput and the latency are judged over the window only. A run without the
// held-back VACUUM warms up for Warmup (long enough for retention and autovacuum to reach their
// steady state); a run with it opens its snapshot before producing and warms up for HeldWarmup,
// so that the window measures the relay while the snapshot is at least HeldWarmup old (issue
// 11: "a 10-minute-old open transaction").
type SustainedResult struct {
	// Rate events/s, each its own transaction, over Keys keys.
	Rate, Keys int
	// Warmup and HeldWarmup precede the measurement window of Measure, without and with the
	// held-back VACUUM.
	Warmup, HeldWarmup, Measure time.Duration
	// Retention runs every PurgeEvery with a retention of Retention (outbox.Purge on the plain
	// table, partition.Maintain on the partitioned one); sizes are sampled every SampleEvery.
	PurgeEvery, Retention, SampleEvery time.Duration
	// PartitionSize is the ids each partition of the partitioned runs spans (Rate × PurgeEvery).
	PartitionSize int64
	// BurstRows are inserted at once at the end of each run to measure the relay's drain rate
	// in the state the run left (the held-back snapshot still open).
	BurstRows int
	Runs      []SustainedRun
	// Partitioned says why no run used partitioned tables, when none did (results of runs before
	// partitioned tables existed).
	Partitioned string `json:",omitempty"`
}

// SustainedRun is one run of the sustained suite.
type SustainedRun struct {
	Name string
	// Layout is layoutPlain or layoutPartitioned.
	Layout string `json:",omitempty"`
	// HeldBack: a separate session held a REPEATABLE READ snapshot for the whole run.
	HeldBack bool
	// Warmup is how long the run produced before its measurement window of Measure began.
	Warmup, Measure time.Duration
	// Produced events over the whole run at Achieved events/s; Throughput is the events the stub
	// acknowledged during the measurement window, per second of it.
	Produced   int
	Achieved   float64
	Throughput float64
	// Latency is commit (the producer's Commit return) to acknowledgement of the events committed
	// in the measurement window; Missing counts those not acknowledged within 60 s of the end.
	Latency Latencies
	Missing int
	// Claim is a round's lock + read in the measurement window (rounds that read rows),
	// ClaimWarmup the same during the warm-up.
	Claim, ClaimWarmup Latencies
	// Stmts and StmtsWarmup are the relay's statements by kind (lock, read, sweep, poll, settle)
	// in the measurement window and during the warm-up.
	Stmts, StmtsWarmup map[string]Latencies
	// HorizonAtMeasure is the oldest transaction's age (outbox.HorizonOf) when the measurement
	// window began: in the held-back runs, the snapshot's age.
	HorizonAtMeasure time.Duration
	Purges           []PurgeSample
	Sizes            []SizeSample
	// Burst is the drain of BurstRows rows inserted at once after the producer stopped.
	Burst BurstResult
	// Horizon is what outbox.HorizonOf (sluice status) reported at the end of the run.
	HorizonAge    time.Duration
	HorizonHeldBy string
	// Autovacuums and Autoanalyzes on outbox_event (its partitions that still exist) during the
	// run, and its dead tuples at the end.
	Autovacuums, Autoanalyzes, DeadTuples int64
	// Problems are the relay's warnings and errors, with how often each was logged.
	Problems []string `json:",omitempty"`
	// Explains are EXPLAIN (ANALYZE, BUFFERS) of the relay's last read, sweep and settle at the
	// end of the producing phase, as a custom and as a generic plan.
	Explains []StmtExplain `json:",omitempty"`
}

// StmtExplain is one EXPLAIN of a relay statement.
type StmtExplain struct {
	Kind     string
	Generic  bool
	Plan     string
	ExecTime string
}

// layout is the run's table layout (results from before partitioned runs have none: plain).
func (r SustainedRun) layout() string {
	if r.Layout == "" {
		return layoutPlain
	}
	return r.Layout
}

// PurgeSample is one retention call of a sustained run (outbox.Purge, or
// partition.Maintain on the partitioned table).
type PurgeSample struct {
	At, Took time.Duration
	// Deleted rows (a dropped partition's counted from PostgreSQL's estimate).
	Deleted int64
	// Created, Dropped and Kept partitions (the partitioned table), and why the first kept one was.
	Created, Dropped, Kept int    `json:",omitempty"`
	KeptReason             string `json:",omitempty"`
}

// SizeSample is outbox_event's state at At into a sustained run.
type SizeSample struct {
	At time.Duration
	// Heap (with TOAST and maps) and all indexes, in bytes; Index by index name.
	Heap, Indexes int64
	Index         map[string]int64
	// Dead and Live tuples as the statistics report them.
	Dead, Live int64
	// Pending is produced minus acknowledged so far.
	Pending int64
	// ClaimP50, SweepP50 and SettleP50 are the medians of the claims, sweeps and settles that
	// ended since the previous sample.
	ClaimP50, SweepP50, SettleP50 time.Duration
	// SettlePlan names the indexes the relay's last settle statement would scan now (EXPLAIN,
	// without running it): "custom plan / generic plan".
	SettlePlan string `json:",omitempty"`
}

// BurstResult is the drain of rows inserted at once.
type BurstResult struct {
	// Rows acknowledged in Elapsed; TimedOut: not every row was within burstBound.
	Rows     int
	Elapsed  time.Duration
	TimedOut bool
	Claim    Latencies
}

// burstBound bounds the wait for a sustained run's final burst.
const burstBound = 2 * time.Minute

// Rate is rows per second.
func (b BurstResult) Rate() float64 {
	if b.Elapsed <= 0 {
		return 0
	}
	return float64(b.Rows) / b.Elapsed.Seconds()
}

// sustainedTarget is issue 11's bound: claim latency (p50) and throughput with VACUUM held back
// within this factor of the run without.
const sustainedTarget = 1.5

// sustainedHeldAge is the age issue 11 asks of the transaction that holds VACUUM back while the
// held-back runs are measured.
const sustainedHeldAge = 10 * time.Minute

// slowdown is how many times worse held is than base: held ÷ base for latencies (higher is
// worse), base ÷ held for rates (lower is worse). ok is false when base or held is not positive.
func slowdown(base, held float64, higherIsWorse bool) (factor float64, ok bool) {
	if base <= 0 || held <= 0 {
		return 0, false
	}
	if higherIsWorse {
		return held / base, true
	}
	return base / held, true
}

// The outbox table layouts of the sustained runs.
const (
	layoutPlain       = "plain table"
	layoutPartitioned = "partitioned table"
)

// sustainedRunName names a run by its layout and whether VACUUM was held back.
func sustainedRunName(layout string, held bool) string {
	if held {
		return layout + ", VACUUM held back"
	}
	return layout
}

// runSustainedSuite runs the producer, one relay and periodic retention for Duration, on the
// plain outbox table and on the partitioned one, each first without and then with a
// transaction holding VACUUM back, each run in a fresh database.
func runSustainedSuite(ctx context.Context, log *slog.Logger, env *Env, sz Sizes, rep *Report) error {
	res := &SustainedResult{Rate: 1000, Keys: 1000, Warmup: sz.SustainedWarmup, HeldWarmup: sz.SustainedHeldWarmup,
		Measure: sz.SustainedMeasure, PurgeEvery: sz.SustainedPurgeEvery,
		Retention: sz.SustainedRetention, SampleEvery: sz.SustainedSampleEvery, BurstRows: sz.SustainedBurst}
	res.PartitionSize = int64(float64(res.Rate) * res.PurgeEvery.Seconds())
	for _, layout := range []string{layoutPlain, layoutPartitioned} {
		for _, held := range []bool{false, true} {
			run, err := runSustained(ctx, log, env, res, layout, held)
			if err != nil {
				return fmt.Errorf("%s: %w", sustainedRunName(layout, held), err)
			}
			res.Runs = append(res.Runs, run)
		}
	}
	rep.Sustained = res
	return nil
}

func runSustained(ctx context.Context, log *slog.Logger, env *Env, res *SustainedResult, layout string, held bool) (SustainedRun, error) {
	run := SustainedRun{Name: sustainedRunName(layout, held), Layout: layout, HeldBack: held, Warmup: res.Warmup, Measure: res.Measure}
	if held {
		run.Warmup = res.HeldWarmup
	}
	suite := "sustained"
	if layout == layoutPartitioned {
		suite += "_part"
	}
	if held {
		suite += "_held"
	}
	tracer := newRelayTracer()
	relayPool, dbURL, err := env.NewDatabase(ctx, suite, 8, tracer)
	if err != nil {
		return run, err
	}
	defer relayPool.Close()
	pool, err := openPool(ctx, dbURL, 12)
	if err != nil {
		return run, err
	}
	defer pool.Close()
	partOpts := &partition.Options{Size: res.PartitionSize, Retention: res.Retention}
	if layout == layoutPartitioned {
		// The empty plain table becomes the first partition; partitions of PartitionSize ids are
		// created ahead of the newest id.
		if _, err := partition.Convert(ctx, pool, partition.Outbox, partOpts, nil); err != nil {
			return run, err
		}
	}

	if held {
		holder, err := pgx.Connect(ctx, dbURL)
		if err != nil {
			return run, err
		}
		defer holder.Close(context.WithoutCancel(ctx))
		// The snapshot is taken by the first statement after BEGIN and kept until the end.
		if _, err := holder.Exec(ctx, "BEGIN ISOLATION LEVEL REPEATABLE READ"); err != nil {
			return run, err
		}
		if _, err := holder.Exec(ctx, "SELECT 1 FROM outbox_event LIMIT 1"); err != nil {
			return run, err
		}
		defer func() { _, _ = holder.Exec(context.WithoutCancel(ctx), "ROLLBACK") }()
	}

	book := newWaitBook()
	pub := &ackPublisher{book: book}
	problems := newProblemLog()
	r, err := outbox.NewRelay(relayPool, outbox.RelayConfig{Publisher: pub, Topics: map[string]string{"orders": ordersARN}, Logger: slog.New(problems)})
	if err != nil {
		return run, err
	}
	rctx, stopRelay := context.WithCancel(ctx)
	var relayWG sync.WaitGroup
	relayWG.Add(1)
	go func() { defer relayWG.Done(); _ = r.Run(rctx) }()
	defer func() { stopRelay(); relayWG.Wait() }()

	// Background work while the producer runs: size samples and retention.
	var (
		mu    sync.Mutex
		bgErr error
		bgWG  sync.WaitGroup
	)
	bctx, stopBG := context.WithCancel(ctx)
	defer stopBG()
	start := time.Now()
	tracer.reset()
	every := func(d time.Duration, fn func() error) {
		bgWG.Add(1)
		go func() {
			defer bgWG.Done()
			t := time.NewTicker(d)
			defer t.Stop()
			for {
				select {
				case <-bctx.Done():
					return
				case <-t.C:
				}
				if err := fn(); err != nil && bctx.Err() == nil {
					mu.Lock()
					bgErr = err
					mu.Unlock()
					return
				}
			}
		}()
	}
	every(res.SampleEvery, func() error {
		s, err := sampleSize(bctx, pool)
		if err != nil {
			return fmt.Errorf("sample sizes: %w", err)
		}
		if st, ok := tracer.lastOf(stmtSettle); ok {
			custom, err1 := planIndexes(bctx, pool, st, false)
			generic, err2 := planIndexes(bctx, pool, st, true)
			if err := errors.Join(err1, err2); err != nil {
				return fmt.Errorf("explain the settle: %w", err)
			}
			s.SettlePlan = custom + " / " + generic
		}
		s.At = time.Since(start)
		s.Pending = int64(book.committedCount() - book.ackedCount())
		mu.Lock()
		run.Sizes = append(run.Sizes, s)
		mu.Unlock()
		return nil
	})
	every(res.PurgeEvery, func() error {
		t0 := time.Now()
		p := PurgeSample{At: t0.Sub(start)}
		if layout == layoutPartitioned {
			// What the relay Lambda runs at each invocation: partitions created ahead, expired
			// ones dropped.
			r, err := partition.Maintain(bctx, pool, partition.Outbox, partOpts)
			if err != nil {
				return fmt.Errorf("maintain partitions: %w", err)
			}
			p.Deleted, p.Created, p.Dropped, p.Kept = r.Purged, len(r.Created), len(r.Dropped), len(r.Kept)
			for _, d := range r.Dropped {
				p.Deleted += max(d.Rows, 0)
			}
			if len(r.Kept) > 0 {
				p.KeptReason = r.Kept[0].Reason
			}
		} else {
			n, err := outbox.Purge(bctx, pool, res.Retention, nil)
			if err != nil {
				return fmt.Errorf("purge: %w", err)
			}
			p.Deleted = n
		}
		p.Took = time.Since(t0)
		mu.Lock()
		run.Purges = append(run.Purges, p)
		mu.Unlock()
		return nil
	})
	// The measurement window opens after the warm-up, the producer running on: note the
	// acknowledgements so far and how old the oldest transaction (the held snapshot) is.
	var ackedAtWindow int64
	bgWG.Add(1)
	go func() {
		defer bgWG.Done()
		if sleepCtx(bctx, time.Until(start.Add(run.Warmup))) != nil {
			return
		}
		a := pub.events.Load()
		h, err := outbox.HorizonOf(bctx, pool)
		mu.Lock()
		defer mu.Unlock()
		ackedAtWindow = a
		if err != nil && bctx.Err() == nil {
			bgErr = fmt.Errorf("read the horizon: %w", err)
		}
		run.HorizonAtMeasure = h.OldestTransactionAge
	}()
	ids, achieved, err := produceAtRate(ctx, pool, book, res.Rate, res.Keys, run.Warmup+run.Measure, "s")
	produced := time.Since(start)
	acked := pub.events.Load()
	stopBG()
	bgWG.Wait()
	if err != nil {
		return run, err
	}
	if bgErr != nil {
		return run, bgErr
	}
	windowLen := produced - run.Warmup
	if windowLen <= 0 || ackedAtWindow == 0 {
		return run, fmt.Errorf("the producer stopped before the measurement window (%s of %s produced)", produced.Round(time.Second), run.Warmup)
	}
	run.Produced, run.Achieved, run.Throughput = len(ids), achieved, float64(acked-ackedAtWindow)/windowLen.Seconds()
	for until := time.Now().Add(60 * time.Second); book.pending(ids) > 0 && time.Now().Before(until); {
		if err := sleepCtx(ctx, 20*time.Millisecond); err != nil {
			return run, err
		}
	}
	waits, missing := book.waits(book.committedSince(ids, start.Add(run.Warmup)))
	run.Latency, run.Missing = summarize(waits), missing

	// The relay's statements while producing: in the measurement window, and during the warm-up.
	run.Stmts, run.StmtsWarmup = map[string]Latencies{}, map[string]Latencies{}
	claims := tracer.take("claim")
	run.Claim, run.ClaimWarmup = summarize(durations(after(claims, run.Warmup))), summarize(durations(before(claims, run.Warmup)))
	byKind := map[string][]stmtSample{}
	for _, k := range []string{stmtLock, stmtRead, stmtSweep, stmtPoll, stmtSettle} {
		s := tracer.take(k)
		byKind[k] = s
		run.Stmts[k], run.StmtsWarmup[k] = summarize(durations(after(s, run.Warmup))), summarize(durations(before(s, run.Warmup)))
	}
	fillWindowMedians(run.Sizes, claims, byKind[stmtSweep], byKind[stmtSettle])

	// How the relay's statements run in the state the producing phase left.
	for _, kind := range []string{stmtRead, stmtSweep, stmtSettle} {
		st, ok := tracer.lastOf(kind)
		if !ok {
			continue
		}
		for _, generic := range []bool{false, true} {
			plan, exec, err := explainAsRelay(ctx, pool, st, generic)
			if err != nil {
				if ctx.Err() != nil {
					return run, ctx.Err()
				}
				plan, exec = "EXPLAIN failed: "+err.Error(), "n/a"
			}
			run.Explains = append(run.Explains, StmtExplain{Kind: kind, Generic: generic, Plan: plan, ExecTime: exec})
		}
	}

	// A burst in the state the run left: the relay's drain rate with every dead entry still there.
	before := book.ackedCount()
	tracer.reset()
	if err := insertOutboxRows(ctx, pool, int64(1)<<40, res.BurstRows, res.Keys, false); err != nil {
		return run, err
	}
	t0 := time.Now()
	for book.ackedCount() < before+res.BurstRows && time.Since(t0) < burstBound {
		if err := sleepCtx(ctx, 2*time.Millisecond); err != nil {
			return run, err
		}
	}
	run.Burst = BurstResult{Rows: book.ackedCount() - before, Elapsed: time.Since(t0), Claim: summarize(durations(tracer.take("claim")))}
	run.Burst.TimedOut = run.Burst.Rows < res.BurstRows

	if h, err := outbox.HorizonOf(ctx, pool); err == nil {
		run.HorizonAge, run.HorizonHeldBy = h.OldestTransactionAge, h.HeldBy
	} else {
		run.HorizonHeldBy = "HorizonOf failed: " + err.Error()
	}
	if err := pool.QueryRow(ctx, leavesOf("outbox_event")+`
		SELECT coalesce(sum(st.autovacuum_count), 0)::bigint, coalesce(sum(st.autoanalyze_count), 0)::bigint, coalesce(sum(st.n_dead_tup), 0)::bigint
		FROM leaves l JOIN pg_stat_user_tables st ON st.relid = l.relid`).
		Scan(&run.Autovacuums, &run.Autoanalyzes, &run.DeadTuples); err != nil {
		return run, err
	}
	counts := problems.counts()
	for _, msg := range slices.Sorted(maps.Keys(counts)) {
		run.Problems = append(run.Problems, fmt.Sprintf("%s (%d×)", msg, counts[msg]))
	}
	log.Info("sustained", "run", run.Name, "produced", run.Produced, "throughput", int(run.Throughput), "latency_p50", run.Latency.P50,
		"latency_p99", run.Latency.P99, "claim_p50", run.Claim.P50, "claim_warmup_p50", run.ClaimWarmup.P50, "sweep_p50", run.Stmts[stmtSweep].P50,
		"horizon_at_measure", run.HorizonAtMeasure.Round(time.Second),
		"burst_rows/s", int(run.Burst.Rate()), "purges", len(run.Purges), "autovacuums", run.Autovacuums, "horizon", run.HorizonAge.Round(time.Second))
	return run, nil
}

// sampleSize reads outbox_event's size, its indexes' sizes and its tuple counts, summed over
// its partitions when it is partitioned.
func sampleSize(ctx context.Context, pool *pgxpool.Pool) (SizeSample, error) {
	s := SizeSample{Index: map[string]int64{}}
	err := pool.QueryRow(ctx, leavesOf("outbox_event")+`
		SELECT coalesce(sum(pg_table_size(l.relid)), 0)::bigint, coalesce(sum(pg_indexes_size(l.relid)), 0)::bigint,
		       coalesce(sum(st.n_dead_tup), 0)::bigint, coalesce(sum(st.n_live_tup), 0)::bigint
		FROM leaves l LEFT JOIN pg_stat_user_tables st ON st.relid = l.relid`).Scan(&s.Heap, &s.Indexes, &s.Dead, &s.Live)
	if err != nil {
		return s, err
	}
	// Each index of outbox_event, summed over the partitions' indexes attached to it.
	rows, err := pool.Query(ctx, `SELECT c.relname::text,
		       coalesce((SELECT sum(pg_relation_size(t.relid)) FROM pg_partition_tree(c.oid) t), pg_relation_size(c.oid))::bigint
		FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = 'outbox_event'::regclass`)
	if err != nil {
		return s, err
	}
	var (
		name string
		size int64
	)
	_, err = pgx.ForEachRow(rows, []any{&name, &size}, func() error {
		s.Index[name] = size
		return nil
	})
	return s, err
}

// leavesOf is a WITH clause naming the tables that hold table's rows: its partitions when it is
// partitioned (pg_partition_tree's leaves), else the table itself (pg_partition_tree returns
// no row for a plain table).
func leavesOf(table string) string {
	return `WITH leaves AS (
		    SELECT relid FROM pg_partition_tree('` + table + `') WHERE isleaf
		    UNION ALL
		    SELECT '` + table + `'::regclass WHERE NOT EXISTS (SELECT 1 FROM pg_partition_tree('` + table + `')))`
}

// fillWindowMedians sets each sample's ClaimP50, SweepP50 and SettleP50 from the claims,
// sweeps and settles that ended after the previous sample and up to it.
func fillWindowMedians(samples []SizeSample, claims, sweeps, settles []stmtSample) {
	var from time.Duration
	for i := range samples {
		to := samples[i].At
		window := func(s []stmtSample) time.Duration {
			var d []time.Duration
			for _, x := range s {
				if x.At > from && x.At <= to {
					d = append(d, x.Took)
				}
			}
			return summarize(d).P50
		}
		samples[i].ClaimP50, samples[i].SweepP50, samples[i].SettleP50 = window(claims), window(sweeps), window(settles)
		from = to
	}
}

// planIndexes returns the indexes the plan of st uses (EXPLAIN without ANALYZE, under the
// relay's plan guards), comma-separated in plan order; generic plans it as a generic plan.
func planIndexes(ctx context.Context, pool *pgxpool.Pool, st sentStmt, generic bool) (string, error) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return "", err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	guards := relayPlanGuards
	if generic {
		guards += "; SET LOCAL plan_cache_mode = force_generic_plan"
	}
	if _, err := tx.Exec(ctx, guards); err != nil {
		return "", err
	}
	rows, err := tx.Query(ctx, "EXPLAIN "+st.SQL, st.Args...)
	if err != nil {
		return "", err
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return "", err
	}
	return indexesInPlan(lines), nil
}

// partitionIndex matches the name of an index of one partition of outbox_event.
var partitionIndex = regexp.MustCompile(`^(outbox_event_)(p\d+|default)_(.+)$`)

// indexesInPlan returns the index names of a text plan's index scans, comma-separated, in order,
// each once; the indexes of outbox_event's partitions are named outbox_event_*_<index>.
func indexesInPlan(lines []string) string {
	var out []string
	for _, l := range lines {
		_, rest, ok := strings.Cut(l, " using ")
		if !ok || !strings.Contains(l, "Scan") {
			continue
		}
		name, _, _ := strings.Cut(rest, " ")
		// A partition's index stands for the same index on every partition.
		name = partitionIndex.ReplaceAllString(name, "${1}*_$3")
		if !slices.Contains(out, name) {
			out = append(out, name)
		}
	}
	if len(out) == 0 {
		return "no index"
	}
	return strings.Join(out, ", ")
}
