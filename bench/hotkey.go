package main

// The hot key suite (issue 25, item 1): how fast one key with a long backlog drains when the
// destination keeps a key's order inside one call (outbox.Limits.KeyOrderInCall, what the Kafka
// publisher declares), against the same destination without it (one row of a key per call, what
// SNS, EventBridge and Kinesis get). The stub takes hotKeyDelay per call and declares Kafka's
// limits (the KafkaPublisher's, 500 records a call), differing only in KeyOrderInCall. Idle keys
// commit a row each before the relay starts and in waves while the hot key drains; their
// commit-to-acknowledgement waits are judged against the isolation suite's bound. The stub
// checks every key's order of first acknowledgements.

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluicehq/sluice/pkg/outbox"
)

const (
	// hotKeyDelay is the stub's time per call.
	hotKeyDelay = 10 * time.Millisecond
	// hotKeyIdleKeys is the number of idle keys; each wave commits one row of each.
	hotKeyIdleKeys = 100
	// hotKeyTarget is issue 25's goal: the hot key drains this many times faster.
	hotKeyTarget = 10.0
)

// HotKeyResult is the hot key suite's runs.
type HotKeyResult struct {
	Delay    time.Duration
	HotRows  int
	IdleKeys int
	// Waves of idle rows are committed WaveEvery apart while the hot key drains (after one
	// committed before the relay starts), as long as it does.
	Waves     int
	WaveEvery time.Duration
	Runs      []HotKeyRun
}

// HotKeyRun is one destination variant.
type HotKeyRun struct {
	Name           string
	KeyOrderInCall bool
	// MaxPerKey is the relay's setting (0: its default, 10).
	MaxPerKey int
	// Drain is from the relay's start to the hot key's last row's first acknowledgement.
	Drain time.Duration
	// Calls the stub answered; MaxKeyRows is the most rows of one key one call carried.
	Calls, MaxKeyRows int
	// OutOfOrder counts first acknowledgements of a key's row after a later row of that key;
	// Duplicates counts acknowledgements of a row acknowledged before.
	OutOfOrder, Duplicates int
	// Idle are the idle keys' commit-to-acknowledgement waits over IdleRows rows, IdleMissing of
	// them not acknowledged.
	Idle        Latencies
	IdleRows    int
	IdleMissing int
	// Problems counts the relay's logged warnings and errors.
	Problems int
}

// hotKeyStub is the suite's broker: ackPublisher's latency and acknowledgements, Kafka's limits
// with or without KeyOrderInCall, and a record of each key's acknowledged rows.
type hotKeyStub struct {
	*ackPublisher
	lim   outbox.Limits
	kafka *outbox.KafkaPublisher // measures messages as Kafka does; never produces

	mu         sync.Mutex
	seen       map[uuid.UUID]bool
	last       map[string]int64
	hotAcked   int
	hotDone    time.Time
	hotRows    int
	maxKeyRows int
	outOfOrder int
	duplicates int
}

var _ outbox.LimitedPublisher = (*hotKeyStub)(nil)

func newHotKeyStub(book *waitBook, keyOrder bool, hotRows int) *hotKeyStub {
	k := outbox.NewKafkaPublisher(nil, 0)
	lim := k.Limits("kafka://orders")
	lim.KeyOrderInCall = keyOrder
	return &hotKeyStub{ackPublisher: &ackPublisher{Delay: hotKeyDelay, book: book}, lim: lim, kafka: k,
		seen: map[uuid.UUID]bool{}, last: map[string]int64{}, hotRows: hotRows}
}

func (s *hotKeyStub) Limits(string) outbox.Limits { return s.lim }

func (s *hotKeyStub) MessageSize(dest string, e *outbox.Event, payloadLen int) int {
	return s.kafka.MessageSize(dest, e, payloadLen)
}

func (s *hotKeyStub) PublishBatch(ctx context.Context, dest string, events []*outbox.Event) []error {
	errs := s.ackPublisher.PublishBatch(ctx, dest, events)
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	rows := map[string]int{}
	for i, e := range events {
		rows[e.PartitionKey]++
		s.maxKeyRows = max(s.maxKeyRows, rows[e.PartitionKey])
		if errs[i] != nil {
			continue
		}
		if s.seen[e.EventID] {
			s.duplicates++
			continue
		}
		s.seen[e.EventID] = true
		if e.ID < s.last[e.PartitionKey] {
			s.outOfOrder++
		}
		s.last[e.PartitionKey] = max(s.last[e.PartitionKey], e.ID)
		if e.PartitionKey == "hot" {
			s.hotAcked++
			if s.hotAcked == s.hotRows {
				s.hotDone = now
			}
		}
	}
	return errs
}

// hotDrained returns when the hot key's last row was first acknowledged (zero if not yet).
func (s *hotKeyStub) hotDrained() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.hotDone
}

func hotKeySizes(sz Sizes) int {
	if sz.Name == "quick" {
		return 2_000
	}
	return 10_000
}

func runHotKeySuite(ctx context.Context, log *slog.Logger, env *Env, sz Sizes, rep *Report) error {
	pool, _, err := env.NewDatabase(ctx, "hotkey", 16, nil)
	if err != nil {
		return err
	}
	defer pool.Close()
	res := &HotKeyResult{Delay: hotKeyDelay, HotRows: hotKeySizes(sz), IdleKeys: hotKeyIdleKeys, Waves: sz.IsolationWaves, WaveEvery: sz.IsolationWaveEvery}
	for _, v := range hotKeyVariants {
		run, err := hotKeyRun(ctx, pool, res, v.keyOrder, v.maxPerKey, sz.RelayTimeout*3)
		if err != nil {
			return fmt.Errorf("hot key, KeyOrderInCall %t, MaxPerKey %d: %w", v.keyOrder, v.maxPerKey, err)
		}
		log.Info("hot key", "variant", run.Name, "drain", run.Drain.Round(time.Millisecond), "rows/s", int(run.rate(res.HotRows)),
			"calls", run.Calls, "max_key_rows", run.MaxKeyRows, "out_of_order", run.OutOfOrder, "idle_p50", run.Idle.P50, "idle_max", run.Idle.Max,
			"idle_missing", run.IdleMissing, "problems", run.Problems)
		res.Runs = append(res.Runs, run)
	}
	rep.HotKey = res
	return nil
}

// rate is the hot key's rows per second, of rows rows.
func (r HotKeyRun) rate(rows int) float64 {
	if r.Drain <= 0 {
		return 0
	}
	return float64(rows) / r.Drain.Seconds()
}

// hotKeyVariants are the suite's runs, in pairs with the same MaxPerKey (0: the default, 10):
// one row of a key per call, then several.
var hotKeyVariants = []struct {
	keyOrder  bool
	maxPerKey int
}{{false, 0}, {true, 0}, {false, 100}, {true, 100}}

func hotKeyRun(ctx context.Context, pool *pgxpool.Pool, res *HotKeyResult, keyOrder bool, maxPerKey int, timeout time.Duration) (HotKeyRun, error) {
	run := HotKeyRun{Name: "one row of a key per call (SNS, EventBridge, Kinesis; before issue 25)", KeyOrderInCall: keyOrder, MaxPerKey: maxPerKey}
	if keyOrder {
		run.Name = "several rows of a key per call (KeyOrderInCall: Kafka)"
	}
	if _, err := pool.Exec(ctx, "TRUNCATE outbox_event RESTART IDENTITY"); err != nil {
		return run, err
	}
	if err := insertKeyRows(ctx, pool, "hot", "orders", res.HotRows, `jsonb_build_object('n', i)`); err != nil {
		return run, err
	}
	if _, err := pool.Exec(ctx, "VACUUM ANALYZE outbox_event"); err != nil {
		return run, err
	}
	book := newWaitBook()
	stub := newHotKeyStub(book, keyOrder, res.HotRows)
	problems := newProblemLog()
	ids, err := commitIdleWave(ctx, pool, book, res.IdleKeys, 0)
	if err != nil {
		return run, err
	}
	r, err := outbox.NewRelay(pool, outbox.RelayConfig{Publisher: stub, Topics: map[string]string{"orders": "kafka://orders"}, Logger: slog.New(problems),
		MaxPerKey: maxPerKey})
	if err != nil {
		return run, err
	}
	rctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	start := time.Now()
	go func() { defer wg.Done(); _ = r.Run(rctx) }()
	defer func() { stop(); wg.Wait() }()

	nextWave, wave := start.Add(res.WaveEvery), 1
	for stub.hotDrained().IsZero() {
		if time.Since(start) > timeout {
			return run, fmt.Errorf("the hot key did not drain within %s", timeout)
		}
		if wave <= res.Waves && time.Now().After(nextWave) {
			w, err := commitIdleWave(ctx, pool, book, res.IdleKeys, wave)
			if err != nil {
				return run, err
			}
			ids = append(ids, w...)
			wave++
			nextWave = nextWave.Add(res.WaveEvery)
		}
		if err := sleepCtx(ctx, 5*time.Millisecond); err != nil {
			return run, err
		}
	}
	for until := time.Now().Add(10 * time.Second); book.pending(ids) > 0 && time.Now().Before(until); {
		if err := sleepCtx(ctx, 10*time.Millisecond); err != nil {
			return run, err
		}
	}
	stop()
	wg.Wait()
	left, err := countRows(ctx, pool, "partition_key = 'hot' AND published_at IS NULL")
	if err != nil {
		return run, err
	}
	if left > 0 {
		return run, fmt.Errorf("%d rows of the hot key acknowledged but not marked published", left)
	}
	waits, missing := book.waits(ids)
	run.Idle, run.IdleRows, run.IdleMissing = summarize(waits), len(ids), missing
	stub.mu.Lock()
	run.Drain = stub.hotDone.Sub(start)
	run.MaxKeyRows, run.OutOfOrder, run.Duplicates = stub.maxKeyRows, stub.outOfOrder, stub.duplicates
	stub.mu.Unlock()
	run.Calls = int(stub.calls.Load())
	for _, n := range problems.counts() {
		run.Problems += n
	}
	return run, nil
}

// perKeyLabel names a run's MaxPerKey.
func (r HotKeyRun) perKeyLabel() string {
	if r.MaxPerKey == 0 {
		return "`MaxPerKey` 10 (default)"
	}
	return fmt.Sprintf("`MaxPerKey` %d", r.MaxPerKey)
}

// pairs returns the runs as (one row per call, several) pairs of the same MaxPerKey.
func (h *HotKeyResult) pairs() [][2]HotKeyRun {
	var out [][2]HotKeyRun
	for i, a := range h.Runs {
		for _, b := range h.Runs[i+1:] {
			if !a.KeyOrderInCall && b.KeyOrderInCall && a.MaxPerKey == b.MaxPerKey {
				out = append(out, [2]HotKeyRun{a, b})
			}
		}
	}
	return out
}

// hotKeyTargets is issue 25's item 1 in the targets table: each pair's ratio; the target is met
// if one pair reaches it (the setting is named), and the idle keys' waits in every run.
func (r *Report) hotKeyTargets() []target {
	h := r.HotKey
	if h == nil {
		return nil
	}
	var ts []target
	for _, p := range h.pairs() {
		before, after := p[0], p[1]
		ratio := after.rate(h.HotRows) / before.rate(h.HotRows)
		inOrder := before.OutOfOrder == 0 && after.OutOfOrder == 0
		ts = append(ts, target{25, fmt.Sprintf("A %s-row hot key at %s, Kafka, %s", num(float64(h.HotRows)), h.Delay, after.perKeyLabel()),
			fmt.Sprintf("drains ≥ %.0f× faster than with one row of a key per call (same settings), per-key order kept", hotKeyTarget),
			fmt.Sprintf("%.1f× (%s rows/s, drained in %s, against %s rows/s in %s); out-of-order rows: %d",
				ratio, num(after.rate(h.HotRows)), dur(after.Drain), num(before.rate(h.HotRows)), dur(before.Drain), before.OutOfOrder+after.OutOfOrder),
			verdict(ratio >= hotKeyTarget && inOrder)})
	}
	ok, worst, rows, missing := true, time.Duration(0), 0, 0
	for _, run := range h.Runs {
		ok = ok && run.IdleMissing == 0 && run.Idle.N > 0 && run.Idle.Max <= isolationTarget
		worst, rows, missing = max(worst, run.Idle.Max), rows+run.IdleRows, missing+run.IdleMissing
	}
	ts = append(ts, target{25, "Idle keys beside the hot key",
		fmt.Sprintf("%d idle keys' rows acknowledged ≤ %s after commit (as in section 6), every run", h.IdleKeys, isolationTarget),
		fmt.Sprintf("max %s over %d rows of %d runs; %d not acknowledged", dur(worst), rows, len(h.Runs), missing), verdict(ok)})
	return ts
}

// hotKeyMarkdown renders the suite's section.
func (r *Report) hotKeyMarkdown(w func(string, ...any)) {
	h := r.HotKey
	if h == nil || len(h.Runs) == 0 {
		return
	}
	w("## 15. Hot key (issue 25)\n\n")
	w("One relay (defaults but `MaxPerKey`, 2 pipelines) drains one key, `hot`, with %s pending rows, while %d idle keys commit a row each "+
		"before it starts and every %s while `hot` drains (up to %d waves). The stub broker takes %s per call and declares the Kafka publisher's limits "+
		"(500 records a call), once with `KeyOrderInCall` (what `KafkaPublisher` declares: a call carries several consecutive rows of a key, "+
		"at most the `MaxPerKey` rows a round takes of it) and once without (one row of a key per call, what SNS, EventBridge and Kinesis get; "+
		"docs/destinations.md says why). The stub checks each key's order of first acknowledgements.\n\n",
		num(float64(h.HotRows)), h.IdleKeys, h.WaveEvery, h.Waves, h.Delay)
	w("| destination | relay | `hot` drained in | `hot` rows/s | vs. one row per call | calls | most rows of a key in one call | rows out of order | duplicates | idle keys' wait p50 / max (rows) | problems logged |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
	base := map[int]float64{}
	for _, run := range h.Runs {
		if !run.KeyOrderInCall {
			base[run.MaxPerKey] = run.rate(h.HotRows)
		}
	}
	for _, run := range h.Runs {
		vs := "—"
		if b := base[run.MaxPerKey]; run.KeyOrderInCall && b > 0 {
			vs = fmt.Sprintf("%.1f×", run.rate(h.HotRows)/b)
		}
		idle := fmt.Sprintf("%s / %s (%d)", dur(run.Idle.P50), dur(run.Idle.Max), run.IdleRows)
		if run.IdleMissing > 0 {
			idle += fmt.Sprintf("; %d not acknowledged", run.IdleMissing)
		}
		w("| %s | %s | %s | %s | %s | %d | %d | %d | %d | %s | %d |\n", run.Name, run.perKeyLabel(), dur(run.Drain), num(run.rate(h.HotRows)), vs, run.Calls,
			run.MaxKeyRows, run.OutOfOrder, run.Duplicates, idle, run.Problems)
	}
	w("\n")
}
