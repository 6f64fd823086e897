package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/sluicehq/sluice/pkg/outbox"
)

// Issue 11's overhead ratio is what outbox.Write adds over what the minimal row adds.
func TestAddedCostRatio(t *testing.T) {
	t.Parallel()
	us := func(n int) time.Duration { return time.Duration(n) * time.Microsecond }
	if r, ok := addedCostRatio(us(668), us(632), us(498)); !ok || r < 1.268 || r > 1.269 {
		t.Fatalf("addedCostRatio(668, 632, 498) = %v, %v; want 170/134", r, ok)
	}
	if r, ok := addedCostRatio(us(600), us(600), us(500)); !ok || r != 1 {
		t.Fatalf("equal costs: %v, %v", r, ok)
	}
	if _, ok := addedCostRatio(us(600), us(500), us(500)); ok {
		t.Fatal("a minimal row that adds nothing gives no ratio")
	}
	if _, ok := addedCostRatio(us(600), us(490), us(500)); ok {
		t.Fatal("a minimal row faster than the order alone gives no ratio")
	}
}

func TestSlowdown(t *testing.T) {
	t.Parallel()
	if f, ok := slowdown(10, 15, true); !ok || f != 1.5 {
		t.Fatalf("latency 15 vs 10: %v", f)
	}
	if f, ok := slowdown(1000, 500, false); !ok || f != 2 {
		t.Fatalf("rate 500 vs 1000: %v", f)
	}
	if _, ok := slowdown(0, 5, true); ok {
		t.Fatal("no base, no factor")
	}
}

// A wait runs from the commit to the first acknowledgement, never below zero; events never
// acknowledged are counted, not averaged in.
func TestWaitBook(t *testing.T) {
	t.Parallel()
	b := newWaitBook()
	t0 := time.Unix(100, 0)
	a, c, d := uuid.New(), uuid.New(), uuid.New()
	b.commit(t0, a, c, d)
	b.ack(t0.Add(30*time.Millisecond), a)
	b.ack(t0.Add(90*time.Millisecond), a) // a duplicate publish: the first acknowledgement counts
	b.ack(t0.Add(-time.Microsecond), c)   // acknowledged just before Commit returned
	waits, missing := b.waits([]uuid.UUID{a, c, d})
	if missing != 1 || len(waits) != 2 || waits[0] != 30*time.Millisecond || waits[1] != 0 {
		t.Fatalf("waits = %v, missing = %d", waits, missing)
	}
	if b.pending([]uuid.UUID{a, c, d}) != 1 || b.ackedCount() != 2 || b.committedCount() != 3 {
		t.Fatal("counts")
	}
}

// The relay's statements are recognised by their text; a round's lock and read on one
// connection make one claim, counted only when the read returned rows.
func TestRelayTracer(t *testing.T) {
	t.Parallel()
	for sql, want := range map[string]string{
		`SELECT k FROM unnest($1::text[]) AS k WHERE pg_try_advisory_xact_lock(hashtextextended(k, 5433))`: stmtLock,
		"\nWITH chain AS (\n    SELECT r.*, k.ord FROM unnest($1::text[], $2::bigint[])":                   stmtRead,
		"\nWITH RECURSIVE walk(partition_key, id, quarantined, available_at, n) AS (":                      stmtSweep,
		"\n(SELECT id, partition_key FROM outbox_event WHERE id > $1 ORDER BY id LIMIT $2)\nUNION ALL":     stmtPoll,
		`UPDATE outbox_event SET published_at = now(), available_at = NULL WHERE id = ANY($1)`:             stmtSettle,
		"BEGIN READ ONLY; SET LOCAL statement_timeout = 30000":                                             stmtOther,
	} {
		if got := relayStmtKind(sql); got != want {
			t.Errorf("relayStmtKind(%.40q) = %s, want %s", sql, got, want)
		}
	}

	tr := newRelayTracer()
	ctx := context.Background()
	conn := new(pgx.Conn)
	run := func(sql string, rows string, pause time.Duration) {
		c := tr.TraceQueryStart(ctx, conn, pgx.TraceQueryStartData{SQL: sql, Args: []any{[]string{"k"}}})
		time.Sleep(pause)
		tr.TraceQueryEnd(c, conn, pgx.TraceQueryEndData{CommandTag: pgconn.NewCommandTag(rows)})
	}
	run("SELECT k FROM unnest($1::text[]) AS k WHERE pg_try_advisory_xact_lock(k)", "SELECT 1", 2*time.Millisecond)
	run("WITH chain AS (SELECT 1)", "SELECT 3", 3*time.Millisecond)
	run("SELECT k FROM unnest($1::text[]) AS k WHERE pg_try_advisory_xact_lock(k)", "SELECT 1", 0)
	run("WITH chain AS (SELECT 1)", "SELECT 0", 0) // read nothing: not a claim
	claims := tr.take("claim")
	if len(claims) != 1 || claims[0].Took < 5*time.Millisecond || claims[0].Rows != 3 {
		t.Fatalf("claims = %+v", claims)
	}
	if n := len(tr.take(stmtLock)); n != 2 {
		t.Fatalf("%d locks", n)
	}
	if sql, _, rows := tr.biggest(); !strings.HasPrefix(sql, "WITH chain AS") || rows != 3 {
		t.Fatalf("biggest read = %q, %d rows", sql, rows)
	}
	bc := tr.TraceBatchStart(ctx, conn, pgx.TraceBatchStartData{})
	tr.TraceBatchQuery(bc, conn, pgx.TraceBatchQueryData{SQL: "UPDATE outbox_event SET published_at = now() WHERE id = ANY($1)", Args: []any{[]int64{1}}})
	tr.TraceBatchEnd(bc, conn, pgx.TraceBatchEndData{})
	if st, ok := tr.lastOf(stmtSettle); !ok || len(tr.take(stmtSettle)) != 1 || len(st.Args) != 1 {
		t.Fatal("the settle batch was not recorded")
	}
	// A round's claim: its keys' locks and rows in one batch.
	bc = tr.TraceBatchStart(ctx, conn, pgx.TraceBatchStartData{})
	tr.TraceBatchQuery(bc, conn, pgx.TraceBatchQueryData{SQL: "BEGIN ISOLATION LEVEL READ COMMITTED"})
	tr.TraceBatchQuery(bc, conn, pgx.TraceBatchQueryData{SQL: "SELECT k FROM unnest($1::text[]) AS k WHERE pg_try_advisory_lock(k)"})
	tr.TraceBatchQuery(bc, conn, pgx.TraceBatchQueryData{SQL: "WITH chain AS (SELECT 1)", CommandTag: pgconn.NewCommandTag("SELECT 7")})
	tr.TraceBatchEnd(bc, conn, pgx.TraceBatchEndData{})
	if claims := tr.take("claim"); len(claims) != 1 || claims[0].Rows != 7 || len(tr.take(stmtLock)) != 1 {
		t.Fatalf("the claim batch: claims %+v", claims)
	}
	if sql, _, rows := tr.biggest(); !strings.HasPrefix(sql, "WITH chain AS") || rows != 7 {
		t.Fatalf("biggest read after the claim batch = %q, %d rows", sql, rows)
	}
}

func TestIndexesInPlan(t *testing.T) {
	t.Parallel()
	plan := []string{
		"Update on outbox_event  (cost=0.28..82.44 rows=0 width=0)",
		"  ->  Index Scan using outbox_event_pending_key_idx on outbox_event  (cost=0.28..82.44 rows=1 width=62)",
		"        Index Cond: (id = ANY ($1))",
		"  ->  Index Only Scan using outbox_event_pkey on outbox_event o",
		"  ->  Index Scan using outbox_event_pending_key_idx on outbox_event e",
	}
	if got := indexesInPlan(plan); got != "outbox_event_pending_key_idx, outbox_event_pkey" {
		t.Fatalf("indexesInPlan = %q", got)
	}
	partitioned := []string{
		"  ->  Index Scan using outbox_event_p0_pkey on outbox_event_p0 o_1",
		"  ->  Index Scan using outbox_event_p0000000000000010000_pkey on outbox_event_p0000000000000010000 o_2",
		"  ->  Index Scan using outbox_event_default_pkey on outbox_event_default o_3",
	}
	if got := indexesInPlan(partitioned); got != "outbox_event_*_pkey" {
		t.Fatalf("indexesInPlan = %q", got)
	}
	if got := indexesInPlan([]string{"Seq Scan on outbox_event"}); got != "no index" {
		t.Fatalf("indexesInPlan = %q", got)
	}
}

// Each sample gets the medians of the statements that ended in its window.
func TestFillWindowMedians(t *testing.T) {
	t.Parallel()
	s := []SizeSample{{At: 2 * time.Second}, {At: 4 * time.Second}}
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	claims := []stmtSample{{At: ms(500), Took: ms(1)}, {At: ms(1500), Took: ms(3)}, {At: ms(2500), Took: ms(7)}}
	fillWindowMedians(s, claims, nil, []stmtSample{{At: ms(3000), Took: ms(9)}})
	if s[0].ClaimP50 != ms(3) || s[1].ClaimP50 != ms(7) || s[0].SweepP50 != 0 || s[1].SettleP50 != ms(9) {
		t.Fatalf("windows = %+v", s)
	}
}

func TestShortenLines(t *testing.T) {
	t.Parallel()
	if got := shortenLines("short\n"+strings.Repeat("é", 10), 5); got != "short\néé…" {
		t.Fatalf("shortenLines = %q", got)
	}
}

func TestSustainedChartPath(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{"../docs/bench.png": "../docs/bench-sustained.png", "docs/bench.png": "docs/bench-sustained.png", "x": "x-sustained"} {
		if got := sustainedChartPath(in); got != want {
			t.Errorf("sustainedChartPath(%q) = %q, want %q", in, got, want)
		}
	}
}

// newSuitesReport is a report with made-up results of the issue 10 and 11 suites.
func newSuitesReport() *Report {
	ms := func(n float64) time.Duration { return time.Duration(n * float64(time.Millisecond)) }
	lat := func(p50, max float64) Latencies {
		return Latencies{N: 20, P50: ms(p50), P90: ms(max), P95: ms(max), P99: ms(max), Max: ms(max), Mean: ms(p50)}
	}
	rep := &Report{Sizes: quickSizes(), Started: time.Unix(0, 0), Finished: time.Unix(60, 0), ChartRef: "docs/bench.png",
		Relay: []RelayResult{
			{Name: nameSluice1, Delay: 10 * time.Millisecond, Events: 100_000, Elapsed: 3 * time.Second},
			{Name: nameSluice4, Delay: 10 * time.Millisecond, Events: 100_000, Elapsed: 4 * time.Second},
		}}
	rep.Isolation = &IsolationResult{Delay: ms(10), IdleKeys: 20, Waves: 4, WaveEvery: ms(300), Settle: 10 * time.Second, Runs: []IsolationRun{
		{Name: "(0) baseline", Idle: 100, All: lat(40, 90), Start: lat(40, 90), Running: lat(40, 80), StateOK: true},
		{Name: "(a) hot key", Blocker: "hot", Idle: 100, All: lat(50, 900), Start: lat(50, 900), Running: lat(50, 80), StateOK: true, State: "hot pending"},
		{Name: "(b) key in backoff", Idle: 100, All: lat(50, 1200), StateOK: true},
		{Name: "(c) failing topic", Idle: 100, All: lat(50, 90), StateOK: false, State: "audit was not down"},
		{Name: "(f) slow destination", Idle: 620, All: lat(40, 1100), Over: 1, StateOK: true},
		{Name: "(g) hanging destination", Idle: 620, All: lat(40, 70), StateOK: true},
	}}
	pr := func(v string, c int, tx int, p50 float64) ProducersRun {
		return ProducersRun{Variant: v, Clients: c, Tx: tx, Elapsed: time.Second, Latency: Latencies{N: tx, P50: ms(p50), P99: ms(3 * p50), Mean: ms(p50)}, BlockRates: []float64{float64(tx)}}
	}
	rep.Producers = &ProducersResult{Clients: []int{1, 16}, Rounds: 4, Block: time.Second, Durable: true, Runs: []ProducersRun{
		pr(varOrder, 1, 2000, 0.5), pr(varMinimal, 1, 1600, 0.6), pr(varWrite, 1, 1550, 0.605), pr(varQueue, 1, 1700, 0.58),
		pr(varOrder, 16, 6000, 2), pr(varMinimal, 16, 5000, 3), pr(varWrite, 16, 4400, 3.2), pr(varQueue, 16, 5100, 2.9),
		pr(varNotify, 16, 2500, 6), pr(varNotifyIdle, 16, 4900, 3.1),
	}}
	rep.Wakeup = &WakeupResult{Rate: 100, Keys: 10, Duration: 5 * time.Second, PollInterval: ms(50), Produced: 500, Achieved: 100, Latency: lat(36, 70)}
	sized := func(heap int64) []SizeSample {
		return []SizeSample{{At: time.Second, Heap: heap, Indexes: heap / 4, Index: map[string]int64{"outbox_event_pending_key_idx": heap / 10},
			ClaimP50: ms(3), SweepP50: ms(5), SettleP50: ms(4), SettlePlan: "outbox_event_pkey / outbox_event_pkey"},
			{At: 2 * time.Second, Heap: 2 * heap, Indexes: heap / 2, Index: map[string]int64{"outbox_event_pending_key_idx": heap / 5},
				ClaimP50: ms(4), SweepP50: ms(50), SettleP50: ms(400), SettlePlan: "outbox_event_pending_key_idx / outbox_event_pkey"}}
	}
	rep.Sustained = &SustainedResult{Rate: 1000, Keys: 1000, Warmup: 2 * time.Minute, HeldWarmup: 10 * time.Minute, Measure: 2 * time.Minute,
		PurgeEvery: 10 * time.Second, Retention: 10 * time.Second,
		SampleEvery: time.Second, BurstRows: 10_000, Partitioned: "none yet", Runs: []SustainedRun{
			{Name: "plain table", Warmup: 2 * time.Minute, Measure: 2 * time.Minute, Produced: 30_000, Achieved: 1000, Throughput: 998,
				Latency: lat(50, 300), Claim: lat(3, 10), ClaimWarmup: lat(3, 10),
				Stmts: map[string]Latencies{stmtSweep: lat(5, 9)}, StmtsWarmup: map[string]Latencies{}, Sizes: sized(10 << 20),
				Burst: BurstResult{Rows: 10_000, Elapsed: time.Second}, Purges: []PurgeSample{{At: time.Second, Took: ms(200), Deleted: 9000}},
				Explains: []StmtExplain{{Kind: stmtSettle, Plan: "Update on outbox_event", ExecTime: "0.2 ms"}}},
			{Name: "plain table, VACUUM held back", HeldBack: true, Warmup: 10 * time.Minute, Measure: 2 * time.Minute, HorizonAtMeasure: 10*time.Minute + 2*time.Second,
				Produced: 30_000, Achieved: 1000, Throughput: 600, Latency: lat(300, 10_000), Missing: 12,
				Claim: lat(40, 100), ClaimWarmup: lat(4, 40), Stmts: map[string]Latencies{stmtSweep: lat(80, 150)}, StmtsWarmup: map[string]Latencies{},
				Sizes: sized(12 << 20), Burst: BurstResult{Rows: 4_000, Elapsed: 2 * time.Minute, TimedOut: true}, HorizonAge: 45 * time.Second,
				HorizonHeldBy: "session 42 (postgres, idle in transaction)", Problems: []string{"relay round failed; retrying (3×)"}},
			{Name: sustainedRunName(layoutPartitioned, false), Layout: layoutPartitioned, Warmup: 2 * time.Minute, Measure: 2 * time.Minute,
				Produced: 30_000, Achieved: 1000, Throughput: 999, Claim: lat(3, 10), ClaimWarmup: lat(3, 10), Sizes: sized(8 << 20), Burst: BurstResult{Rows: 10_000, Elapsed: time.Second},
				Purges: []PurgeSample{{At: time.Second, Took: ms(20), Deleted: 10_000, Created: 1, Dropped: 1}}},
			{Name: sustainedRunName(layoutPartitioned, true), Layout: layoutPartitioned, HeldBack: true, Warmup: 10 * time.Minute, Measure: 2 * time.Minute,
				HorizonAtMeasure: 10*time.Minute + time.Second, Produced: 30_000, Achieved: 1000, Throughput: 990,
				Claim: lat(4, 12), ClaimWarmup: lat(3.5, 12), Sizes: sized(9 << 20), Burst: BurstResult{Rows: 10_000, Elapsed: 1200 * time.Millisecond},
				Purges: []PurgeSample{{At: time.Second, Took: ms(2000), Created: 1, Kept: 1, KeptReason: "busy: the lock to drop it was not granted within 2s"}}},
		}}
	rep.SuiteTimes = []suiteTime{{"relay", time.Second}, {"isolation", time.Second}, {"producers", time.Second}, {"wakeup", time.Second}, {"sustained", time.Second}}
	return rep
}

// The new sections render, and every target of issues 10 and 11 gets the verdict its numbers
// call for.
func TestRenderNewSuites(t *testing.T) {
	t.Parallel()
	rep := newSuitesReport()
	md := rep.Markdown()
	for _, s := range []string{"## 6. Isolation", "## 7. Concurrent producers", "## 8. Relay wake-up", "## 9. Sustained",
		"| (a) hot key | hot | 100 |", "(order + outbox.Write − order only) ÷", "docs/bench-sustained.png", "only 4,000 of 10,000 rows",
		"`outbox_event_pending_key_idx / outbox_event_pkey` in 1 of 2 samples", "relay round failed; retrying (3×)", "12 events of the window not acknowledged",
		"partitions created 1, dropped 0, kept 1 (first kept: busy", "| partitioned table, VACUUM held back |",
		"**Why migration 0003 dropped the NOTIFY trigger.**", "| 16 | 5,000 tx/s | **2,500 tx/s (50%)** | 4,900 tx/s (98%) | 6.00 ms / 3.00 ms |",
		"with that trigger back, the minimal row reaches 2,500 tx/s, 50% of its rate without"} {
		if !strings.Contains(md, s) {
			t.Errorf("report lacks %q", s)
		}
	}
	if strings.Contains(md, "## 4. End-to-end") {
		t.Error("a run without the e2e suite renders no e2e section")
	}
	want := map[string]string{
		"Relay throughput after the redesign, 10 ms":             "met",         // 33,333 ≥ 31,054
		"4 relays together vs 1, 10 ms":                          "**not met**", // 25,000 < 33,333
		"Isolation (a) hot key":                                  "met",
		"Isolation (b) key in backoff":                           "**not met**",
		"Isolation (c) failing topic":                            "**not measured**",
		"Isolation (f) slow destination":                         "**not met**", // max 1.1 s
		"Isolation (g) hanging destination":                      "met",
		"Concurrent producers, 16 clients, durable commits":      "**not met**", // 4,400 ÷ 5,000 = 88%
		"Producer overhead vs the minimal row, durable commits":  "**not met**", // 1 client 1.05, 16 clients 1.2
		"Relay wake-up at 100 events/s":                          "met",
		"Claim latency with VACUUM held back, plain table":       "**not met**", // 13×
		"Relay throughput with VACUUM held back, plain table":    "**not met**",
		"Claim latency with VACUUM held back, partitioned table": "met",
	}
	got := map[string]target{}
	for _, tg := range rep.targets() {
		got[tg.Name] = tg
	}
	for name, status := range want {
		tg, ok := got[name]
		if !ok {
			t.Errorf("no target %q", name)
			continue
		}
		if tg.Status != status {
			t.Errorf("target %q: %s, want %s (%s)", name, tg.Status, status, tg.Measured)
		}
	}
	if tg := got["Isolation (f) slow destination"]; tg.Issue != 40 || !strings.Contains(tg.Measured, "1 over 1s") {
		t.Errorf("the slow destination's target: issue %d, %s", tg.Issue, tg.Measured)
	}
	if !strings.Contains(md, "| (f) slow destination |  | 620 | 40.00 ms | 1.10 s | **1.10 s** | 1 |") {
		t.Error("the isolation table lacks (f)'s p90, max and count over 1 s")
	}
	if m := got["Producer overhead vs the minimal row, durable commits"].Measured; !strings.Contains(m, "1 client: 1.05") || !strings.Contains(m, "16 clients: 1.20") {
		t.Errorf("overhead ratios: %s", m)
	}

	// A held-back run measured behind a younger snapshot (a -quick run) is not judged.
	rep.Sustained.Runs[3].HorizonAtMeasure = 20 * time.Second
	for _, tg := range rep.targets() {
		if strings.HasSuffix(tg.Name, "VACUUM held back, partitioned table") &&
			(tg.Status != "**not measured**" || !strings.Contains(tg.Measured, "not judged: issue 11 asks for 10m0s")) {
			t.Errorf("target %q behind a 20 s snapshot: %s (%s)", tg.Name, tg.Status, tg.Measured)
		}
	}
	dir := t.TempDir()
	if err := writeSustainedChart(filepath.Join(dir, "bench-sustained.png"), rep); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(filepath.Join(dir, "bench-sustained.png")); err != nil || st.Size() == 0 {
		t.Fatalf("no chart: %v", err)
	}
}

// Results survive the JSON round trip (-results, then -render), and a run of the new suites
// merges onto a full run.
func TestNewSuitesMerge(t *testing.T) {
	t.Parallel()
	part := newSuitesReport()
	part.Sizes = fullSizes()
	b, err := json.Marshal(part)
	if err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if back.Markdown() != part.Markdown() {
		t.Fatal("the report changes through the JSON round trip")
	}
	if _, err := os.Stat("results.json"); err != nil {
		t.Skip("no results.json")
	}
	part.SuiteTimes = part.SuiteTimes[1:] // isolation, producers, wakeup, sustained
	rep, err := mergeOnto("results.json", part)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Isolation == nil || rep.Producers == nil || rep.Wakeup == nil || rep.Sustained == nil || len(rep.Relay) == len(part.Relay) {
		t.Fatal("merge kept the wrong suites")
	}
}

// notes.md is a template: it renders with every suite's results and without them (n/a), and
// quotes the run's numbers.
func TestNotesRender(t *testing.T) {
	t.Parallel()
	for name, rep := range map[string]*Report{"new suites": newSuitesReport(), "no suites": {}} {
		out := rep.renderNotes(notes)
		if strings.Contains(out, "{{") || strings.Contains(out, "does not parse") || strings.Contains(out, "does not render") {
			t.Fatalf("%s: notes.md did not render:\n%s", name, out[max(0, len(out)-400):])
		}
	}
	out := newSuitesReport().renderNotes(notes)
	for _, want := range []string{"reached 2,500 tx/s from 16 clients against 5,000 tx/s without it (50%", "the longest wait of an idle key's row was 1.20 s, (b) key in backoff",
		"claim **not met**"} {
		if !strings.Contains(out, strings.ReplaceAll(want, "**", "")) {
			t.Errorf("notes lack %q", want)
		}
	}
	if bad := (&Report{}).renderNotes("{{.no_such_value}}"); !strings.Contains(bad, "does not render") {
		t.Errorf("a misspelt value must show, got %q", bad)
	}
}

// The fleet's stub files its calls when read: per-tenant counts, first and last
// acknowledgements, repeated publishes and the calls in a window, as if counted in the call.
func TestFleetPublisherFilesOnRead(t *testing.T) {
	t.Parallel()
	book := newWaitBook()
	p := newFleetPublisher(book)
	p.ack.Delay = 0
	ctx := context.Background()
	ev := func(tenant string) *outbox.Event {
		return &outbox.Event{EventID: uuid.New(), Headers: map[string]string{outbox.TenantHeader: tenant}}
	}
	a, b, c := ev("hot"), ev("hot"), ev("q001")
	from := time.Now()
	p.PublishBatch(ctx, "orders", []*outbox.Event{a, c})
	p.forgetFirst("hot")                                 // what was acknowledged before it is filed first
	p.PublishBatch(ctx, "orders", []*outbox.Event{b, a}) // a again: a repeated publish
	to := time.Now()
	if p.count("hot") != 2 || p.count("q001") != 1 {
		t.Fatalf("counts: hot %d, q001 %d", p.count("hot"), p.count("q001"))
	}
	if first, last := p.firstAck("hot"), p.lastAck("hot"); first.IsZero() || !first.Equal(last) {
		t.Fatalf("hot: first %v (want the second call's), last %v", first, last)
	}
	if n, by := p.duplicates(); n != 1 || by["hot"] != 1 {
		t.Fatalf("duplicates %d %v", n, by)
	}
	if n := p.publishedBetween(from, to); n != 4 {
		t.Fatalf("published between: %d, want 4 acknowledgements", n)
	}
	if book.ackedCount() != 3 || book.pending([]uuid.UUID{a.EventID, b.EventID, c.EventID}) != 0 {
		t.Fatalf("book: %d acknowledged", book.ackedCount())
	}
}

// RunOnce in a loop is judged against the better of the two ceilings, with Run's ratio beside it.
func TestRunOnceCeilingTarget(t *testing.T) {
	t.Parallel()
	at := func(name string, rate float64) RelayResult {
		return RelayResult{Name: name, Events: int(rate), Elapsed: time.Second}
	}
	for _, tc := range []struct {
		once   float64
		status string
	}{{60_000, "met"}, {59_999, "**not met**"}} {
		rep := &Report{Relay: []RelayResult{at(nameCeiling1, 40_000), at(nameCeiling4, 60_000), at(nameSluice1, 30_000), at(nameSluiceRunOnce, tc.once)}}
		var found bool
		for _, tg := range rep.targets() {
			if tg.Name != "RunOnce in a loop vs ceiling, 0 ms" {
				continue
			}
			found = true
			if tg.Status != tc.status || tg.Issue != 40 || !strings.Contains(tg.Measured, "Run, same run: 50% (30,000 events/s)") {
				t.Errorf("RunOnce at %.0f events/s: %s, issue %d (%s)", tc.once, tg.Status, tg.Issue, tg.Measured)
			}
		}
		if !found {
			t.Error("no RunOnce target")
		}
	}
}
