package outbox

// A seeded fault-schedule simulator for the relay, in the style of FoundationDB's simulation
// and TigerBeetle's VOPR, with a Jepsen-style checker. Each seed gets its own database, two or
// three relays driven only through the package's API (NewRelay, Run, Publisher, ClaimCheck,
// Write, the admin functions), producers writing serialized and unserialized keys with plain
// SQL and Write, and a fault phase drawn from the seed (sim_faults_test.go): destination
// latency, hangs, errors, throttles and lost responses, claim-check store failures, relay
// cancels and kills, terminated backends, operator replays, purges and retries, hostile rows.
// A heal phase follows (faults and producers stop, relays run on) and the checker
// (sim_check_test.go) judges what happened.
//
// PostgreSQL and the goroutines are real, so a seed replays the same schedule and the same
// destination decisions (each a hash of the seed, the event and its attempt), not the same
// interleaving: a finding that depends on timing may need a few runs of its seed.

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/testwait"
)

var (
	simSeeds    = flag.Int("sim.seeds", 160, "number of simulator seeds TestSimulation runs")
	simSeed     = flag.Int64("sim.seed", 1, "first simulator seed")
	simRandom   = flag.Bool("sim.random", false, "start the simulator at a random seed (printed)")
	simParallel = flag.Int("sim.parallel", 8, "simulator seeds run at once")
	simFaultMax = flag.Duration("sim.fault", 1500*time.Millisecond, "longest fault phase of a seed")
	simHeal     = flag.Duration("sim.heal", 15*time.Second, "how long the heal phase may go without settling a pending row")
	simSummary  = flag.String("sim.summary", "", "append TestSimulation's summary line to this file")
)

// simMaxRoundBytes is the relays' MaxRoundBytes: small, so that the memory bound means something.
const simMaxRoundBytes = 64 << 10

// simMu keeps TestSimulatorCatchesBrokenRelay (which breaks the claim for the whole package)
// apart from TestSimulation's seeds.
var simMu sync.RWMutex

// simReplayCommand is the command that replays one seed.
func simReplayCommand(seed int64) string {
	return fmt.Sprintf("go run ./internal/cmd/devenv -- go test -count=1 ./pkg/outbox -run 'TestSimulation/seed=%d$' -sim.seed=%d -sim.seeds=1 -v", seed, seed)
}

func TestSimulation(t *testing.T) {
	simMu.RLock()
	defer simMu.RUnlock()
	base, n := simSeedRange()
	start := time.Now()
	failed := runSeeds(t, base, n, func(t *testing.T, res *simResult) {
		switch {
		case len(res.checker.counts) == 0:
			if testing.Verbose() {
				t.Logf("no findings\n%s", res)
			}
		default:
			t.Errorf("findings:\n%s", res)
		}
	})
	simSummaryLine(t, fmt.Sprintf("simulation: %d seeds from %d, %d failed, %s", n, base, failed, time.Since(start).Round(time.Second)))
}

// simSeedRange returns the first seed and how many to run, from the flags.
func simSeedRange() (base int64, n int) {
	base, n = *simSeed, *simSeeds
	if *simRandom {
		base = time.Now().UnixNano() % 1_000_000_000
		fmt.Fprintf(os.Stderr, "sim: random base seed %d\n", base)
	}
	if testing.Short() {
		n = min(n, 10)
	}
	return base, n
}

// runSeeds runs n seeds from base, -sim.parallel at once, each as a subtest seed=<n> handed to
// judge with its result, and returns how many had findings.
func runSeeds(t *testing.T, base int64, n int, judge func(*testing.T, *simResult)) int {
	prof := simProfile{faultMax: *simFaultMax}
	var found atomic.Int64
	seeds := make(chan int64)
	var wg sync.WaitGroup
	for range max(1, *simParallel) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for seed := range seeds {
				t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
					res := runSim(t, seed, prof)
					if len(res.checker.counts) > 0 {
						found.Add(1)
					}
					judge(t, res)
				})
			}
		}()
	}
	for i := range int64(n) {
		seeds <- base + i
	}
	close(seeds)
	wg.Wait()
	return int(found.Load())
}

// simSummaryLine logs line and appends it to -sim.summary's file, if set.
func simSummaryLine(t *testing.T, line string) {
	t.Log(line)
	if *simSummary != "" {
		f, err := os.OpenFile(*simSummary, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		require.NoError(t, err)
		_, _ = fmt.Fprintln(f, line)
		require.NoError(t, f.Close())
	}
}

// TestSimulatorCatchesBrokenRelay breaks the claim on purpose (brokenClaimSkipsHead: a round
// skips a key's first row when it read a second) and expects the checker to see rows of a
// serialized key go out of order within a handful of calm seeds.
func TestSimulatorCatchesBrokenRelay(t *testing.T) {
	simMu.Lock()
	defer simMu.Unlock()
	brokenClaimSkipsHead.Store(true)
	t.Cleanup(func() { brokenClaimSkipsHead.Store(false) })
	prof := simProfile{calm: true, faultMax: time.Second}
	for seed := int64(1); seed <= 5; seed++ {
		res := runSim(t, seed, prof)
		if res.checker.counts[findOrder] > 0 {
			t.Logf("seed %d caught the broken claim:\n%s", seed, res.checker)
			return
		}
	}
	t.Fatal("the simulator did not catch a relay that skips each key's head row in 5 seeds")
}

// simResult is what a seed found, with what is needed to understand it.
type simResult struct {
	seed    int64
	sched   *simSchedule
	stream  *simStream
	checker *simChecker
	log     string
	took    time.Duration
}

func (r *simResult) String() string {
	return fmt.Sprintf("%s\nseed %d (took %s), replay with:\n  %s\nschedule:\n  %s\nwhat happened:\n%s",
		r.checker, r.seed, r.took.Round(time.Millisecond), simReplayCommand(r.seed),
		strings.ReplaceAll(r.sched.String()+r.stream.String(), "\n", "\n  "), r.log)
}

// simWorld is one seed's run: its database, relays, producers and fakes.
type simWorld struct {
	t     *testing.T
	seed  int64
	sched *simSchedule
	url   string
	admin *pgxpool.Pool
	start time.Time // the fault phase's start

	faulty atomic.Bool
	stream *simStream // nil: the relays poll (sim_stream_test.go)
	dest   *simDestination
	store  *simStore
	hist   *simHistory
	relays []*simRelay
	// live counts relays whose Run has not returned; maxLive is its peak (the memory bound).
	live, maxLive atomic.Int64
	// late counts the late commits (actLateCommit) in progress.
	late sync.WaitGroup

	logMu sync.Mutex
	log   strings.Builder
}

// simRelay is one relay slot; a restart replaces its generation.
type simRelay struct {
	name   string
	pool   *pgxpool.Pool
	cancel context.CancelFunc
	done   chan struct{}
	gen    int
	relay  *Relay // the generation's relay
}

// runSim runs seed and returns what the checker found.
func runSim(t *testing.T, seed int64, prof simProfile) *simResult {
	fmt.Fprintf(os.Stderr, "sim: seed %d starting; replay: %s\n", seed, simReplayCommand(seed))
	began := time.Now()
	rng := rand.New(rand.NewPCG(uint64(seed), 0x5eed))
	w := &simWorld{t: t, seed: seed, sched: drawSchedule(seed, rng, prof), hist: newSimHistory()}
	w.stream = drawStream(seed, w.sched, prof)
	w.url = simStreamURL(w)
	w.admin = w.pool("admin", 8, false)
	w.start = time.Now()
	w.hist.start = w.start
	if w.sched.claimCheck {
		w.store = newSimStore(seed, w.sched.rates.storeErr, &w.faulty, w.start)
	}
	w.dest = newSimDestination(seed, w.sched.rates, &w.faulty, w.store, w.start)
	w.dest.keyOrder = w.sched.keyOrder
	w.dest.timeout = w.relayConfig().PublishTimeout
	w.dest.slowCall = simSlowCall(w.relayConfig())
	w.dest.terminate = w.terminateRelays
	w.relays = make([]*simRelay, w.sched.relays)
	for i := range w.relays {
		w.relays[i] = &simRelay{}
		w.startRelay(i)
	}
	w.awaitStream()
	checker := newSimChecker(w.hist, w.dest, w.store, 0)
	checker.cfg = w.relayConfig()

	// Fault phase: producers write while the timeline plays.
	w.faulty.Store(!prof.calm)
	stop := make(chan struct{})
	var producers sync.WaitGroup
	for p := range w.sched.producers {
		producers.Add(1)
		prod := &simProducer{w: w, rng: rand.New(rand.NewPCG(uint64(seed), uint64(p+1))), pool: w.pool(fmt.Sprintf("producer-%d", p), 2, false)}
		go func() {
			defer producers.Done()
			prod.run(stop)
		}()
	}
	streamPlayed := w.playStream()
	for _, a := range w.sched.actions {
		time.Sleep(time.Until(w.start.Add(a.at)))
		w.do(rng, a)
	}
	streamPlayed()
	time.Sleep(time.Until(w.start.Add(w.sched.faultPhase)))

	// Heal phase: faults and producers stop, the relays publish what is left.
	w.faulty.Store(false)
	close(stop)
	producers.Wait()
	w.late.Wait()
	w.logf("heal: %d rows written", len(w.hist.rows))
	w.streamAccount()
	ctx := context.Background()
	quarantined, err := ListQuarantined(ctx, w.admin, 100000)
	require.NoError(t, err)
	checker.checkQuarantined(quarantined)
	_, err = RetryAllQuarantined(ctx, w.admin)
	require.NoError(t, err)
	w.heal(ctx, *simHeal)
	for i := range w.relays {
		if err := w.stopRelay(i, false); err != nil {
			checker.report(findRelay, "%v", err)
		}
	}
	w.dest.mu.Lock()
	w.logf("destination: %d calls carried several rows of one key; %d entries acknowledged behind a failed one of their key, %d reported by the relays",
		w.dest.sharedCalls, w.dest.overtaken, w.dest.reported.Load())
	w.dest.mu.Unlock()
	checker.bound = w.sched.pipelines * int(w.maxLive.Load()) * simMaxRoundBytes
	checker.check(w.table())
	return &simResult{seed: seed, sched: w.sched, stream: w.stream, checker: checker, log: w.log.String(), took: time.Since(began)}
}

// logf adds a line to the seed's account of what happened.
func (w *simWorld) logf(format string, args ...any) {
	w.logMu.Lock()
	defer w.logMu.Unlock()
	fmt.Fprintf(&w.log, "  +%dms %s\n", time.Since(w.start).Milliseconds(), fmt.Sprintf(format, args...))
}

// pool opens a pool on the seed's database whose sessions carry application_name
// sim-<seed>-<role>, so that they can be found and terminated; dedicated to relays of
// relayConfig when dedicate is set (DedicatePool).
func (w *simWorld) pool(role string, conns int32, dedicate bool) *pgxpool.Pool {
	cfg, err := pgxpool.ParseConfig(w.url)
	require.NoError(w.t, err)
	cfg.ConnConfig.RuntimeParams["application_name"] = w.appName(role)
	cfg.MaxConns = conns
	if dedicate {
		DedicatePool(cfg, w.relayConfig())
	}
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(w.t, err)
	w.t.Cleanup(p.Close)
	return p
}

func (w *simWorld) appName(role string) string { return fmt.Sprintf("sim-%d-%s", w.seed, role) }

// terminate ends the backends of role's sessions, mid-statement, and returns how many.
func (w *simWorld) terminate(role string) int {
	var n int
	err := w.admin.QueryRow(context.Background(), `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE application_name = $1 AND datname = current_database()`, w.appName(role)).Scan(&n)
	if err != nil {
		w.logf("terminate %s: %v", role, err)
	}
	return n
}

// terminateRelays ends every relay's sessions at once, mid-round (rates.midRound): the
// rounds lose their advisory locks.
func (w *simWorld) terminateRelays() {
	from := time.Since(w.start)
	var n int
	err := w.admin.QueryRow(context.Background(), `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE application_name LIKE $1 AND datname = current_database()`, w.appName("relay-")+"%").Scan(&n)
	w.logf("terminate every relay mid-call: %d backends %s", n, errOrEmpty(err))
	w.dest.crash("", from)
}

// lateCommit inserts a row on a key of its own in a transaction it holds open for hold while
// the producers commit higher ids, then commits it: a row that commits below the relays'
// frontier (and below a pass's jump).
func (w *simWorld) lateCommit(rng *rand.Rand, hold time.Duration) {
	row := &simRow{event: simUUID(rng), key: "late-" + simUUID(rng).String()[:8], dest: simFIFOARN}
	row.body = simPayload(rng, row.key, 0, false)
	w.late.Add(1)
	go func() {
		defer w.late.Done()
		ctx := context.Background()
		status := rowRolledBack
		w.hist.add(row)
		defer func() { w.hist.settle([]*simRow{row}, status) }()
		tx, err := w.admin.Begin(ctx)
		if err != nil {
			return
		}
		defer func() { _ = tx.Rollback(ctx) }()
		if err := tx.QueryRow(ctx, simInsertSQL, row.event, simFIFOTopic, row.key, row.key, string(row.body)).Scan(&row.id); err != nil {
			return
		}
		time.Sleep(hold)
		status = rowMaybe
		if err := tx.Commit(ctx); err == nil {
			status = rowCommitted
		}
		w.logf("late commit: row %d (key %s) after %dms", row.id, row.key, hold.Milliseconds())
	}()
}

// lockRows holds the row locks of the pending rows of one key (the one with the most) in an
// operator's transaction for hold, as a hand-run UPDATE would: the settle of the round that
// publishes them waits for it (the key stays locked meanwhile); claims, calls and other rounds
// do not.
func (w *simWorld) lockRows(hold time.Duration) {
	w.late.Add(1)
	go func() {
		defer w.late.Done()
		ctx := context.Background()
		tx, err := w.admin.Begin(ctx)
		if err != nil {
			return
		}
		defer func() { _ = tx.Rollback(ctx) }()
		var n int
		err = tx.QueryRow(ctx, `SELECT count(*) FROM (SELECT id FROM outbox_event WHERE published_at IS NULL AND quarantined_at IS NULL
			AND partition_key = (SELECT partition_key FROM outbox_event WHERE published_at IS NULL AND quarantined_at IS NULL
				GROUP BY partition_key ORDER BY count(*) DESC, partition_key LIMIT 1) FOR UPDATE) l`).Scan(&n)
		w.logf("row locks: %d pending rows for %dms %s", n, hold.Milliseconds(), errOrEmpty(err))
		time.Sleep(hold)
	}()
}

// relayConfig is every simulated relay's configuration.
func (w *simWorld) relayConfig() RelayConfig {
	cfg := RelayConfig{
		Topics:         map[string]string{simFIFOTopic: simFIFOARN},
		Pipelines:      w.sched.pipelines,
		MaxRoundBytes:  simMaxRoundBytes,
		PublishTimeout: 300 * time.Millisecond,
		Lease:          2 * time.Second,
		MaxAttempts:    1000,
		BackoffBase:    5 * time.Millisecond,
		BackoffMax:     100 * time.Millisecond,
		PollInterval:   10 * time.Millisecond,
		RescanInterval: 100 * time.Millisecond,
		Logger:         slog.New(slog.NewTextHandler(io.Discard, nil)),
		bookCapacity:   w.sched.bookCap,
	}
	if w.sched.shortGrace {
		cfg.stopGrace = simShortGrace
	}
	if os.Getenv("RELAY_DEBUG") != "" {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	cfg.Logger = slog.New(simOvertakeLog{cfg.Logger.Handler(), w.dest, ""})
	w.streamConfig(&cfg)
	cfg.Publisher = simPublisher{w.dest, ""}
	if w.sched.keyOrder {
		cfg.Publisher = simKeyOrderDestination{simPublisher{w.dest, ""}}
	}
	if w.sched.secondDest {
		cfg.Topics[simOtherTopic] = simOtherARN
	}
	if w.store != nil {
		cfg.ClaimCheck = &ClaimCheck{Store: w.store, Bucket: "sim", Threshold: 1024}
	}
	return cfg
}

// startRelay starts relay slot i's next generation.
func (w *simWorld) startRelay(i int) {
	r := w.relays[i]
	r.gen++
	r.name = fmt.Sprintf("relay-%d-%d", i, r.gen)
	r.pool = w.pool(r.name, 6, i < w.sched.dedicated)
	cfg := w.relayConfig()
	cfg.Logger = slog.New(simOvertakeLog{cfg.Logger.Handler().(simOvertakeLog).Handler, w.dest, r.name})
	cfg.Publisher = simPublisher{w.dest, r.name}
	if w.sched.keyOrder {
		cfg.Publisher = simKeyOrderDestination{simPublisher{w.dest, r.name}}
	}
	relay, err := NewRelay(r.pool, cfg)
	require.NoError(w.t, err)
	w.tapStream(relay)
	r.relay = relay
	passes := i >= w.sched.relays-w.sched.passes
	if passes {
		relay.watch.pageRows = w.sched.pageRows
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel, r.done = cancel, make(chan struct{})
	name := r.name
	w.maxLive.Store(max(w.maxLive.Load(), w.live.Add(1)))
	go func() {
		defer close(r.done)
		defer w.live.Add(-1)
		if !passes {
			_ = relay.Run(ctx)
			return
		}
		for ctx.Err() == nil { // a relay started on a schedule: a drain, then the next start
			w.drain(ctx, relay, name)
			sleep(ctx, max(cfg.PollInterval, w.sched.passPause))
		}
	}()
}

// drain runs one RunOnce of a passes slot, cut after passRun when that falls in the fault
// phase: a cut is a stop (calls in flight cancelled after the stop grace), recorded as a crash
// of the relay, as is a drain that ended with an error (a round failed: what it sent may not
// be recorded, and goes again).
func (w *simWorld) drain(ctx context.Context, relay *Relay, name string) {
	began := time.Since(w.start)
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var cutAt atomic.Int64
	if w.sched.passRun > 0 {
		cut := time.AfterFunc(w.sched.passRun, func() {
			if w.faulty.Load() {
				cutAt.Store(int64(time.Since(w.start)))
				cancel()
			}
		})
		defer cut.Stop()
	}
	_, err := relay.RunOnce(rctx)
	switch at := cutAt.Load(); {
	case ctx.Err() != nil:
	case at != 0:
		w.dest.crash(name, time.Duration(at))
	case err != nil: // a round failed at most a Lease after it began
		w.dest.crash(name, max(began, time.Since(w.start)-w.relayConfig().Lease))
	}
}

// stopRelay stops relay slot i: with kill, its backends are terminated mid-statement as its
// context ends, as when its process dies.
func (w *simWorld) stopRelay(i int, kill bool) error {
	r := w.relays[i]
	from := time.Since(w.start)
	defer w.dest.crash(r.name, from)
	if kill {
		n := w.terminate(r.name)
		w.logf("kill %s (%d backends)", r.name, n)
	}
	r.cancel()
	select {
	case <-r.done:
	case <-time.After(testwait.Stall): // a liveness bound far beyond a busy machine's pauses
		return fmt.Errorf("%s: Run did not return %s after its context ended", r.name, testwait.Stall)
	}
	r.pool.Close()
	return nil
}

// do plays one action of the timeline.
func (w *simWorld) do(rng *rand.Rand, a simAction) {
	ctx := context.Background()
	switch a.kind {
	case actCancel, actKill:
		if err := w.stopRelay(a.relay, a.kind == actKill); err != nil {
			w.logf("%v", err)
		}
		time.Sleep(a.down)
		w.startRelay(a.relay)
		w.logf("%s r%d, restarted as %s", a.kind, a.relay, w.relays[a.relay].name)
	case actTerminate:
		from := time.Since(w.start)
		name := w.relays[a.relay].name
		w.logf("terminate %s: %d backends", name, w.terminate(name))
		w.dest.crash(name, from)
	case actTerminateProducer:
		n := 0
		for p := range w.sched.producers {
			n += w.terminate(fmt.Sprintf("producer-%d", p))
		}
		w.logf("terminate producers: %d backends", n)
	case actReplay:
		w.logf("replay: %s", w.replay(ctx, a.arg))
	case actPurge:
		n, err := Purge(ctx, w.admin, time.Millisecond, nil)
		w.logf("purge: %d rows %v", n, errOrEmpty(err))
	case actRetryAll:
		n, err := RetryAllQuarantined(ctx, w.admin)
		w.logf("retry-all: %d rows %v", n, errOrEmpty(err))
	case actOutage:
		w.dest.outage.Store(true)
		time.AfterFunc(a.down, func() { w.dest.outage.Store(false) })
		w.logf("outage for %dms", a.down.Milliseconds())
	case actHostile:
		w.insertHostile(rng, a.arg, a.key)
	case actLateCommit:
		w.lateCommit(rng, a.down)
	case actRowLocks:
		w.lockRows(a.down)
	}
}

func errOrEmpty(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// replay replays a retired key (no producer writes it any more, every row published), starting
// with retired key first: the checker's order history of the key restarts just before.
func (w *simWorld) replay(ctx context.Context, first int) string {
	for j := range w.sched.retiring {
		key := fmt.Sprintf("s%d", (first+j)%w.sched.retiring)
		if w.hist.busy(key) {
			continue
		}
		var pending, total int
		err := w.admin.QueryRow(ctx, `SELECT count(*) FILTER (WHERE published_at IS NULL), count(*)
			FROM outbox_event WHERE partition_key = $1`, key).Scan(&pending, &total)
		if err != nil {
			return err.Error()
		}
		if total == 0 || pending > 0 {
			continue
		}
		w.dest.resetKey(key)
		n, err := Replay(ctx, w.admin, ReplayFilter{Since: w.start.Add(-time.Hour), AggregateID: key})
		return fmt.Sprintf("key %s: %d rows %s", key, n, errOrEmpty(err))
	}
	return "no retired key is fully published"
}

// insertHostile inserts a hostile row of kind with plain SQL, on a key of its own or, with key,
// on that serialized key, followed there by a few ordinary rows, one transaction each: a
// producer's bad row in the middle of its key's stream. On a serialized key each transaction
// takes the key's lock, so that its rows still commit in id order.
func (w *simWorld) insertHostile(rng *rand.Rand, kind int, key string) {
	payload, topic := hostilePayload(kind)
	row := &simRow{event: simUUID(rng), key: key, serialized: key != "", hostile: simHostileKinds[kind]}
	if key == "" {
		row.key = "h-" + simUUID(rng).String()[:8]
	}
	var followers []*simRow
	if key != "" {
		for range 2 + rng.IntN(4) {
			followers = append(followers, &simRow{event: simUUID(rng), key: key, dest: simFIFOARN, serialized: true,
				body: simPayload(rng, key, 0, w.sched.claimCheck)})
		}
	}
	gap := time.Duration(10+rng.IntN(50)) * time.Millisecond
	w.late.Add(1)
	go func() { // a producer holding the key's lock may keep it a while: the timeline goes on
		defer w.late.Done()
		w.hist.begin(row.key)
		defer w.hist.end(row.key)
		if err := w.insertOne(row, topic, simHostileAggregate, payload); err != nil {
			w.logf("hostile %s on %s: refused: %v", row.hostile, row.key, err)
			return
		}
		w.logf("hostile %s: row %d on %s, then %d rows", row.hostile, row.id, row.key, len(followers))
		for _, f := range followers {
			time.Sleep(gap)
			if err := w.insertOne(f, simFIFOTopic, f.key, string(f.body)); err != nil {
				return
			}
		}
	}()
}

// insertOne inserts row with plain SQL in a transaction of its own (taking its key's lock
// when the key is serialized) and records it in the history.
func (w *simWorld) insertOne(row *simRow, topic, aggregateID, payload string) error {
	ctx := context.Background()
	w.hist.add(row)
	status := rowRolledBack
	defer func() { w.hist.settle([]*simRow{row}, status) }()
	tx, err := w.admin.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if row.serialized {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('sim:' || $1))`, row.key); err != nil {
			return err
		}
	}
	if err := tx.QueryRow(ctx, simInsertSQL, row.event, topic, aggregateID, row.key, payload).Scan(&row.id); err != nil {
		return err
	}
	status = rowMaybe
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	status = rowCommitted
	return nil
}

// simHostileAggregate is the aggregate id of every hostile row.
const simHostileAggregate = "hostile"

// simInsertSQL is a plain-SQL producer's insert of the classic columns. The payload is a text
// parameter that PostgreSQL casts to the column's type, json or jsonb.
const simInsertSQL = `INSERT INTO outbox_event (event_id, topic, aggregate_type, aggregate_id, event_type, partition_key, payload)
	VALUES ($1, $2, 'sim', $3, 'SimEvent', $4, $5) RETURNING id`

// heal waits until no row is pending but quarantined ones and those held behind a quarantined
// hostile row of their key (for good: no operator acts on it), releasing again the rows a
// Permanent error quarantined after the fault phase (a call in flight when it ended). It gives
// up (the checker then reports what is pending) when no pending row was settled for stall: a
// bound on progress, not on how fast a busy machine publishes them all.
func (w *simWorld) heal(ctx context.Context, stall time.Duration) {
	last, changed := -1, time.Now()
	for n := 0; ; n++ {
		var pending int
		// Rows behind a quarantined hostile row of their key are held for good: not waited for.
		err := w.admin.QueryRow(ctx, `SELECT count(*) FROM outbox_event e WHERE published_at IS NULL AND quarantined_at IS NULL
			AND NOT EXISTS (SELECT FROM outbox_event q WHERE q.partition_key = e.partition_key AND q.id < e.id
				AND q.quarantined_at IS NOT NULL AND q.aggregate_id = $1)`, simHostileAggregate).Scan(&pending)
		require.NoError(w.t, err)
		if pending == 0 {
			w.logf("healed")
			return
		}
		if pending != last {
			last, changed = pending, time.Now()
		}
		if time.Since(changed) > stall {
			w.logf("heal: %d rows still pending, none settled for %s", pending, stall)
			return
		}
		if n%10 == 9 {
			w.releaseRefused(ctx)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// releaseRefused releases the quarantined rows that are not hostile: a Permanent error drawn
// in the fault phase quarantined them, and they block their keys.
func (w *simWorld) releaseRefused(ctx context.Context) {
	rows, err := ListQuarantined(ctx, w.admin, 100000)
	require.NoError(w.t, err)
	var ids []int64
	w.hist.mu.Lock()
	for _, q := range rows {
		if r := w.hist.rows[q.EventID]; r == nil || r.hostile == "" {
			ids = append(ids, q.ID)
		}
	}
	w.hist.mu.Unlock()
	if len(ids) > 0 {
		n, err := RetryQuarantined(ctx, w.admin, ids)
		w.logf("heal: released %d quarantined rows %s", n, errOrEmpty(err))
	}
}

// table reads every row's final state.
func (w *simWorld) table() map[uuid.UUID]simDBRow {
	rows, err := w.admin.Query(context.Background(), `SELECT event_id, published_at IS NOT NULL, quarantined_at IS NOT NULL, coalesce(last_error, '') FROM outbox_event`)
	require.NoError(w.t, err)
	defer rows.Close()
	out := map[uuid.UUID]simDBRow{}
	for rows.Next() {
		var (
			ev uuid.UUID
			r  simDBRow
		)
		require.NoError(w.t, rows.Scan(&ev, &r.published, &r.quarantined, &r.lastError))
		out[ev] = r
	}
	require.NoError(w.t, rows.Err())
	return out
}

// simUUID draws an event id from rng, so that a seed's events, and the fates hashed from them,
// are the same on every run.
func simUUID(rng *rand.Rand) uuid.UUID {
	var u uuid.UUID
	for i := range u {
		u[i] = byte(rng.Uint32())
	}
	u[6] = u[6]&0x0f | 0x40
	u[8] = u[8]&0x3f | 0x80
	return u
}

// simProducer writes transactions until stopped, its choices drawn from its own rng.
type simProducer struct {
	w    *simWorld
	rng  *rand.Rand
	pool *pgxpool.Pool
	seq  int
}

func (p *simProducer) run(stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		default:
		}
		if p.w.producersPaused() {
			time.Sleep(5 * time.Millisecond)
			continue
		}
		p.txn()
		time.Sleep(time.Duration(2+p.rng.IntN(20)) * time.Millisecond)
	}
}

// pickKey draws a key: s<i> serialized, u<i> not; retired keys are not drawn after retireAt.
func (p *simProducer) pickKey() (string, bool) {
	s := p.w.sched
	retired := time.Since(p.w.start) >= s.retireAt
	if !retired && s.retiring > 0 && p.rng.IntN(2) == 0 {
		// Retiring keys get many rows while they are written, for the replays to reorder.
		return fmt.Sprintf("s%d", p.rng.IntN(s.retiring)), true
	}
	for {
		i := p.rng.IntN(s.keys)
		switch {
		case i < s.retiring && retired:
		case i < s.serialized:
			return fmt.Sprintf("s%d", i), true
		default:
			return fmt.Sprintf("u%d", i), false
		}
	}
}

// isRetiring reports whether key is one of the retiring keys (replayed once retired).
func (p *simProducer) isRetiring(key string) bool {
	for i := range p.w.sched.retiring {
		if key == fmt.Sprintf("s%d", i) {
			return true
		}
	}
	return false
}

// txn writes one transaction of 1..maxRows rows of one key, mixing plain SQL and Write; it may
// hold the transaction open a while, and may roll it back.
func (p *simProducer) txn() {
	key, serialized := p.pickKey()
	n := 1 + p.rng.IntN(p.w.sched.maxRows)
	if strings.HasPrefix(key, "s") && p.isRetiring(key) {
		n = 1 + p.rng.IntN(8) // more than a round takes of a key (MaxPerKey): replays span rounds
	}
	var hold time.Duration
	if p.rng.IntN(8) == 0 {
		hold = time.Duration(p.rng.IntN(1500)) * time.Millisecond
	}
	rollback := p.rng.IntN(20) == 0
	h := p.w.hist
	h.begin(key)
	defer h.end(key)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var rows []*simRow
	status := rowRolledBack
	defer func() { h.settle(rows, status) }()
	tx, err := p.pool.Begin(ctx)
	if err != nil {
		return
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if serialized {
		// The key's lock: its rows commit in id order, so its order is checked.
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('sim:' || $1))`, key); err != nil {
			return
		}
	}
	for range n {
		p.seq++
		topic := simFIFOTopic
		if p.w.sched.secondDest && p.rng.IntN(4) == 0 {
			topic = simOtherTopic
		}
		row := &simRow{event: simUUID(p.rng), key: key, dest: simFIFOARN, serialized: serialized, body: simPayload(p.rng, key, p.seq, p.w.sched.claimCheck)}
		if topic == simOtherTopic {
			row.dest = simOtherARN
		}
		if p.rng.IntN(2) == 0 {
			err = tx.QueryRow(ctx, simInsertSQL, row.event, topic, key, key, string(row.body)).Scan(&row.id)
		} else {
			var written []Message
			written, err = Write(ctx, tx, Message{EventID: row.event, Topic: topic, AggregateType: "sim", AggregateID: key,
				EventType: "SimEvent", PartitionKey: key, Payload: row.body})
			if err == nil {
				row.body = written[0].Payload // what Write promises to publish
				err = tx.QueryRow(ctx, `SELECT id FROM outbox_event WHERE event_id = $1`, row.event).Scan(&row.id)
			}
		}
		if err != nil {
			return
		}
		rows = append(rows, row)
		h.add(row)
	}
	time.Sleep(hold)
	if rollback {
		return
	}
	status = rowMaybe
	if err := tx.Commit(ctx); err == nil {
		status = rowCommitted
	}
}

// simPayload draws an ordinary payload for key: mostly small, sometimes several KB (above the
// claim check's threshold, 1 KiB, a third of them when large is set), in one of several
// spellings (spacing, key order, number forms, a duplicate key) that must be published exactly
// as written.
func simPayload(rng *rand.Rand, key string, n int, large bool) []byte {
	var pad int
	switch x := rng.IntN(100); {
	case large && x < 33:
		pad = 1024 + rng.IntN(3000)
	case x < 85:
		pad = rng.IntN(64)
	case x < 98:
		pad = 200 + rng.IntN(3000)
	default:
		pad = 3000 + rng.IntN(20000)
	}
	padding := strings.Repeat(string(rune('a'+rng.IntN(26))), pad)
	switch rng.IntN(3) {
	case 0:
		return fmt.Appendf(nil, `{"pad":%q,"n":%d.0,"k":%q}`, padding, n, key)
	case 1:
		return fmt.Appendf(nil, "{ \"n\" : %de0 ,\n \"k\" : %q, \"pad\": %q, \"n\": %d }", n, key, padding, n)
	default:
		return fmt.Appendf(nil, `{"k": %q, "n": %d, "pad": %q}`, key, n, padding)
	}
}
