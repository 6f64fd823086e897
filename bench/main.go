// Command sluicebench measures sluice against its peers and against the machine's limit, and
// writes BENCHMARKS.md and a chart of the results.
//
// It is its own Go module (github.com/sluicehq/sluice/bench) so that the peers it measures
// (watermill-sql's forwarder) and the plotting library stay out of sluice's module graph.
// Run it with `make bench` from the repository root, or directly:
//
//	cd bench && go run . -out ../BENCHMARKS.md -chart ../docs/bench.png
//
// Some suites can be re-run at full size and merged into the committed results (the report then
// says which sections come from which run):
//
//	go run . -only producer,consumer -results /tmp/part.json -out /tmp/x.md -chart /tmp/x.png
//	go run . -render /tmp/part.json -base results.json -results results.json -out ../BENCHMARKS.md -chart /tmp/x.png -chart-ref docs/bench.png
//
// It uses the PostgreSQL named by DATABASE_URL (or TEST_DATABASE_URL), in a database of its own
// that it creates and drops; without either it starts a throwaway cluster from the machine's
// PostgreSQL binaries. Every comparison is measured side by side in the same run and reported
// as a ratio as well, because absolute numbers on a shared machine drift.
//
// The suites:
//
//  1. relay throughput: sluice's relay (1 and 4 instances with Run, 1 with RunOnce in a loop at
//     0 ms), the textbook relay, watermill-sql's forwarder and the claim+mark ceiling, with a
//     publisher stub of 0 ms and 10 ms per call;
//  2. producer overhead: a business transaction with and without outbox.Write, and bulk writes;
//  3. consumer throughput with 10% duplicates: inbox per-record vs batched commits;
//     both run on the fast-commit server and again on a durable one (fsync and synchronous
//     commit on, see Env.DurableEnv), on which their targets are judged;
//  4. end-to-end commit-to-apply latency through the local AWS (fauxqs, the Lambdas under the
//     runtime interface emulator), with diagnostics of where the time goes (e2ediag.go);
//  5. scale: claim latency with published rows retained, purge throughput, sizes after a purge;
//  6. isolation (issue 10): how long idle keys wait behind a hot key, a key in backoff, a failing
//     topic, a quarantined key's backlog and a hostile plain-SQL payload, and (issue 40) beside a
//     destination that answers after 3 s and one that never answers, under steady traffic;
//  7. concurrent producers (issue 11) on the durable server: 1, 4 and 16 clients, the order alone
//     and with a minimal hand-written outbox row, outbox.Write or outbox.Queue;
//  8. wake-up (issue 11): commit-to-publish latency of a running relay at 100 events/s, with no
//     trigger in the producers' commits;
//  9. sustained (issue 11): 1,000 events/s for minutes with retention running, table and index
//     sizes over time, without and with a transaction holding VACUUM back; the held-back runs
//     measure while the transaction is 10 minutes old;
//  10. tracing (issue 14, tracing.go): relay and consumer throughput without a tracer provider,
//     with the no-op one and with a recording one sampling every span;
//  11. destinations (issue 15, destinations.go): relay throughput to SNS, EventBridge, Kinesis
//     and Kafka through each kind's publisher over a stub of its SDK call with the same 10 ms;
//  12. claim check (issue 13, claimcheck.go): relay throughput with 10% of rows at 1 MB stored by
//     the claim check (stub store with a fixed latency) against the same run with small rows;
//  13. writes per event (issue 25, writes.go): statements, rows, WAL and index entries written
//     and dead tuples left per event, by the producer, sluice's relay and the ceiling loop, on a
//     cluster of its own with pg_stat_statements preloaded;
//  14. idle cost (issue 25, idle.go): how long a relay in the idle mode (IdleStop) runs on an
//     empty outbox, and what a month of one such invocation a minute costs;
//  15. hot key (issue 25, hotkey.go): how fast one 10,000-row key drains at 10 ms a call when the
//     destination keeps a key's order in a call (Kafka) against one row of a key per call, with
//     idle keys' waits beside it;
//  16. scale-out (issue 25, scaleout.go): 1, 2 and 4 relays at 0 and 10 ms against one another
//  17. fleet (issue 24, fleet.go): 200 tenant databases on one server, one backlogged
//     and the ceiling loop, with where each run's time went (statements, rounds, wait events, CPU).
//
// The full run takes about 45 minutes, 32 of them the sustained suite (two 4-minute runs and
// two 12-minute ones); -only runs chosen suites, -quick all of them at reduced sizes in a few
// minutes (to prove the harness; its numbers are not the reported ones).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

func main() {
	var (
		out       = flag.String("out", "BENCHMARKS.md", "where to write the report")
		chart     = flag.String("chart", "bench.png", "where to write the relay chart (PNG); the sustained suite's goes next to it, with -sustained before the extension")
		chartRef  = flag.String("chart-ref", "", "how the report links the chart (defaults to -chart)")
		quick     = flag.Bool("quick", false, "reduced sizes, for developing the harness (numbers are not the reported ones)")
		only      = flag.String("only", "", "comma-separated suites to run (relay,producer,consumer,e2e,scale,isolation,producers,wakeup,sustained,tracing,destinations,claimcheck,writes-per-event,idlecost,hotkey,scaleout,fleet,walwake); default all")
		command   = flag.String("command", "", "the command line to print in the report (defaults to this process's)")
		verbosity = flag.Bool("v", false, "log progress of every run")
		hotWeight = flag.Int("fleet-hot-weight", 1, "the fleet suite's hot tenant's Weight (the report's runs use 1)")
		budget    = flag.Int("fleet-budget", defaultFleetBudget, "the fleet suite's connection budget for its server")
		results   = flag.String("results", "", "where to save the raw results as JSON, for -render (make bench: bench/results.json); with -render and -base, the merged results")
		renderIn  = flag.String("render", "", "only render the report and chart from a results JSON file of an earlier run")
		base      = flag.String("base", "", "with -render of a run of some suites (-only): take the other suites' results from this results file")
	)
	flag.Parse()

	level := slog.LevelInfo
	if *verbosity {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	// The libraries under test log through slog.Default: keep their chatter (e.g. relay warnings)
	// out of the progress output unless something is wrong.
	slog.SetDefault(slog.New(slog.NewTextHandler(io.Discard, nil)))

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	sizes := fullSizes()
	if *quick {
		sizes = quickSizes()
	}
	sizes.FleetHotWeight = *hotWeight
	sizes.FleetBudget = *budget
	cmdline := *command
	if cmdline == "" {
		cmdline = strings.Join(os.Args, " ")
	}
	ref := *chartRef
	if ref == "" {
		ref = *chart
	}
	opts := runOptions{Out: *out, Chart: *chart, ChartRef: ref, Results: *results, Sizes: sizes, Only: *only, Command: cmdline}
	if *renderIn != "" {
		b, err := os.ReadFile(*renderIn)
		if err != nil {
			fmt.Fprintln(os.Stderr, "sluicebench:", err)
			os.Exit(1)
		}
		var rep Report
		if err := json.Unmarshal(b, &rep); err != nil {
			fmt.Fprintln(os.Stderr, "sluicebench: read results:", err)
			os.Exit(1)
		}
		rep.ChartRef = ref
		if *base != "" {
			merged, err := mergeOnto(*base, &rep)
			if err != nil {
				fmt.Fprintln(os.Stderr, "sluicebench:", err)
				os.Exit(1)
			}
			rep = *merged
		}
		if *base != "" && *results != "" {
			b, err := json.MarshalIndent(rep, "", "  ")
			if err == nil {
				err = os.WriteFile(*results, b, 0o644)
			}
			if err != nil {
				fmt.Fprintln(os.Stderr, "sluicebench: write merged results:", err)
				os.Exit(1)
			}
		}
		if err := render(&rep, opts); err != nil {
			fmt.Fprintln(os.Stderr, "sluicebench:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(ctx, log, opts); err != nil {
		fmt.Fprintln(os.Stderr, "sluicebench:", err)
		os.Exit(1)
	}
}

type runOptions struct {
	Out, Chart, ChartRef string
	// Results is where the raw results are saved as JSON (for -render); empty for nowhere.
	Results string
	Sizes   Sizes
	Only    string
	Command string
}

// Sizes are the workload sizes of one run.
type Sizes struct {
	// Name is "full" or "quick".
	Name string
	// FleetHotWeight is the fleet suite's hot tenant's fleet.Tenant.Weight.
	FleetHotWeight int
	// FleetBudget is the fleet suite's connection budget for its server (0: defaultFleetBudget).
	FleetBudget int
	// RelayRows and RelayKeys: the pending rows and partition keys of each relay run.
	RelayRows, RelayKeys int
	// PeerTimeBox bounds the runs of the peers (textbook relay, watermill) that cannot drain
	// RelayRows in reasonable time: their throughput is measured over this window.
	PeerTimeBox time.Duration
	// RelayRepeats is how often each relay contender runs (the best run is kept).
	RelayRepeats int
	// RelayTimeout bounds any single relay run.
	RelayTimeout time.Duration
	// ProducerTx is the number of business transactions of each kind (with and without the outbox).
	ProducerTx int
	// BulkEvents per transaction and BulkRepeats transactions.
	BulkEvents, BulkRepeats int
	// ConsumerDeliveries per run (10% of them duplicates).
	ConsumerDeliveries int
	// E2EDuration is how long the end-to-end suite produces at each rate.
	E2EDuration time.Duration
	// ScaleRetained: the published rows retained for the claim-latency runs, ascending.
	ScaleRetained []int
	// ScalePending: the pending rows claimed at each scale.
	ScalePending int
	// IsolationWaves of idle rows are committed IsolationWaveEvery apart in each isolation
	// scenario (after one wave committed before the relay starts).
	IsolationWaves     int
	IsolationWaveEvery time.Duration
	// ProducerRounds rounds of ProducerBlock-long blocks per variant and client count make the
	// producer suite's concurrent runs (1 and 16 clients): many short blocks, so that each
	// variant meets the machine's other load about as often as the others.
	ProducerRounds int
	ProducerBlock  time.Duration
	// ProducersClients are the concurrent-producer suite's client counts (ascending); it runs
	// ProducersRounds rounds of a ProducersBlock-long block per variant and client count.
	ProducersClients []int
	ProducersRounds  int
	ProducersBlock   time.Duration
	// WakeupDuration is how long the wake-up suite's producer commits 100 events/s (and the WAL
	// wake-up suite's, each rate).
	WakeupDuration time.Duration
	// WALWakeStopped is how long the WAL wake-up suite's relay is stopped while the producer
	// goes on (the WAL its slot would retain).
	WALWakeStopped time.Duration
	// Each sustained run produces 1,000 events/s for a warm-up (SustainedWarmup, or
	// SustainedHeldWarmup with VACUUM held back: the held snapshot's age when measuring starts)
	// and then a measurement window of SustainedMeasure; Purge runs every SustainedPurgeEvery
	// with a retention of SustainedRetention; sizes are sampled every SustainedSampleEvery;
	// SustainedBurst rows are drained at the end of each run.
	SustainedWarmup, SustainedHeldWarmup, SustainedMeasure        time.Duration
	SustainedPurgeEvery, SustainedRetention, SustainedSampleEvery time.Duration
	SustainedBurst                                                int
}

func fullSizes() Sizes {
	return Sizes{
		Name: "full", RelayRows: 100_000, RelayKeys: 1_000, PeerTimeBox: 15 * time.Second, RelayRepeats: 2, RelayTimeout: 4 * time.Minute,
		ProducerTx: 5_000, BulkEvents: 10_000, BulkRepeats: 10, ProducerRounds: 10, ProducerBlock: time.Second,
		ConsumerDeliveries: 20_000, E2EDuration: 20 * time.Second,
		ScaleRetained: []int{0, 1_000_000, 5_000_000}, ScalePending: 20_000,
		IsolationWaves: 10, IsolationWaveEvery: 500 * time.Millisecond,
		ProducersClients: []int{1, 4, 16}, ProducersRounds: 3, ProducersBlock: 3 * time.Second,
		WakeupDuration: 30 * time.Second, WALWakeStopped: time.Minute,
		SustainedWarmup: 2 * time.Minute, SustainedHeldWarmup: 10 * time.Minute, SustainedMeasure: 2 * time.Minute,
		SustainedPurgeEvery: 30 * time.Second, SustainedRetention: time.Minute,
		SustainedSampleEvery: 5 * time.Second, SustainedBurst: 20_000,
	}
}

func quickSizes() Sizes {
	return Sizes{
		Name: "quick", RelayRows: 10_000, RelayKeys: 1_000, PeerTimeBox: 3 * time.Second, RelayRepeats: 2, RelayTimeout: time.Minute,
		ProducerTx: 300, BulkEvents: 10_000, BulkRepeats: 2, ProducerRounds: 2, ProducerBlock: 300 * time.Millisecond,
		ConsumerDeliveries: 2_000, E2EDuration: 5 * time.Second,
		ScaleRetained: []int{0, 100_000, 300_000}, ScalePending: 5_000,
		IsolationWaves: 4, IsolationWaveEvery: 300 * time.Millisecond,
		ProducersClients: []int{1, 4, 16}, ProducersRounds: 2, ProducersBlock: 400 * time.Millisecond,
		WakeupDuration: 5 * time.Second, WALWakeStopped: 5 * time.Second,
		SustainedWarmup: 10 * time.Second, SustainedHeldWarmup: 20 * time.Second, SustainedMeasure: 10 * time.Second,
		SustainedPurgeEvery: 10 * time.Second, SustainedRetention: 10 * time.Second,
		SustainedSampleEvery: 2 * time.Second, SustainedBurst: 10_000,
	}
}

func run(ctx context.Context, log *slog.Logger, o runOptions) error {
	started := time.Now()
	env, err := openEnv(ctx, log)
	if err != nil {
		return err
	}
	defer env.Close()

	rep := &Report{Sizes: o.Sizes, Command: o.Command, Started: started, ChartRef: o.ChartRef}
	want := func(name string) bool {
		if o.Only == "" {
			return true
		}
		for _, s := range strings.Split(o.Only, ",") {
			if strings.TrimSpace(s) == name {
				return true
			}
		}
		return false
	}
	if want("producer") || want("consumer") || want("producers") {
		if _, err := env.DurableEnv(ctx); err != nil {
			return err
		}
	}
	rep.Machine = describeMachine(ctx, env)
	suites := []struct {
		name string
		fn   func(context.Context, *slog.Logger, *Env, Sizes, *Report) error
	}{
		{"relay", runRelaySuite},
		{"producer", runProducerSuite},
		{"consumer", runConsumerSuite},
		{"e2e", runE2ESuite},
		{"scale", runScaleSuite},
		{"isolation", runIsolationSuite},
		{"producers", runProducersSuite},
		{"wakeup", runWakeupSuite},
		{"sustained", runSustainedSuite},
		{"tracing", runTracingSuite},           // issue 14, bench/tracing.go
		{"destinations", runDestinationsSuite}, // issue 15, bench/destinations.go
		{"claimcheck", runClaimCheckSuite},     // issue 13, bench/claimcheck.go
		{"writes-per-event", runWritesSuite},   // issue 25, bench/writes.go
		{"idlecost", runIdleCostSuite},         // issue 25, bench/idle.go
		{"hotkey", runHotKeySuite},             // issue 25, bench/hotkey.go
		{"scaleout", runScaleoutSuite},         // issue 25, bench/scaleout.go
		{"fleet", runFleetSuite},               // issue 24, bench/fleet.go
		{"walwake", runWALWakeSuite},           // issue 44, bench/walwake.go
	}
	for _, s := range suites {
		if !want(s.name) {
			continue
		}
		t0 := time.Now()
		log.Info("suite start", "suite", s.name)
		if err := s.fn(ctx, log, env, o.Sizes, rep); err != nil {
			return fmt.Errorf("suite %s: %w", s.name, err)
		}
		log.Info("suite done", "suite", s.name, "took", time.Since(t0).Round(time.Millisecond))
		rep.SuiteTimes = append(rep.SuiteTimes, suiteTime{s.name, time.Since(t0)})
	}
	rep.Finished = time.Now()
	rep.LoadEnd = loadAverage()
	if o.Results != "" {
		b, err := json.MarshalIndent(rep, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(o.Results, b, 0o644); err != nil {
			return fmt.Errorf("write results: %w", err)
		}
	}
	return render(rep, o)
}

// render writes the chart and the report of rep.
func render(rep *Report, o runOptions) error {
	if err := writeChart(o.Chart, rep); err != nil {
		return fmt.Errorf("write chart: %w", err)
	}
	if err := writeSustainedChart(sustainedChartPath(o.Chart), rep); err != nil {
		return fmt.Errorf("write the sustained suite's chart: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(o.Out), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(o.Out, []byte(rep.Markdown()), 0o644); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	return nil
}

// mergeOnto loads the results file base and replaces the suites that part ran (see -only) with
// part's results, noting in the report which run each section comes from.
func mergeOnto(base string, part *Report) (*Report, error) {
	b, err := os.ReadFile(base)
	if err != nil {
		return nil, err
	}
	var rep Report
	if err := json.Unmarshal(b, &rep); err != nil {
		return nil, fmt.Errorf("read %s: %w", base, err)
	}
	if part.Sizes.Name != rep.Sizes.Name {
		return nil, fmt.Errorf("cannot merge a %s run onto a %s run", part.Sizes.Name, rep.Sizes.Name)
	}
	var names []string
	for _, st := range part.SuiteTimes {
		names = append(names, st.Name)
		switch st.Name {
		case "relay":
			rep.Relay, rep.RelayDefaults = part.Relay, part.RelayDefaults
		case "producer":
			rep.Producer, rep.ProducerDurable = part.Producer, part.ProducerDurable
		case "consumer":
			rep.Consumer = part.Consumer
		case "e2e":
			rep.E2E = part.E2E
		case "scale":
			rep.Scale = part.Scale
		case "isolation":
			rep.Isolation = part.Isolation
		case "producers":
			rep.Producers = part.Producers
		case "wakeup":
			rep.Wakeup = part.Wakeup
		case "sustained":
			rep.Sustained = part.Sustained
		case "tracing": // issue 14, bench/tracing.go
			rep.Tracing = part.Tracing
		case "destinations": // issue 15, bench/destinations.go
			rep.Destinations = part.Destinations
		case "claimcheck": // issue 13, bench/claimcheck.go
			rep.ClaimCheck = part.ClaimCheck
		case "writes-per-event": // issue 25, bench/writes.go
			rep.Writes = part.Writes
		case "idlecost": // issue 25, bench/idle.go
			rep.IdleCost = part.IdleCost
		case "hotkey": // issue 25, bench/hotkey.go
			rep.HotKey = part.HotKey
		case "scaleout": // issue 25, bench/scaleout.go
			rep.Scaleout = part.Scaleout
		case "walwake": // issue 44, bench/walwake.go
			rep.WALWake = part.WALWake
		case "fleet": // issue 24, bench/fleet.go
			rep.Fleet = part.Fleet
		}
		replaced := false
		for i := range rep.SuiteTimes {
			if rep.SuiteTimes[i].Name == st.Name {
				rep.SuiteTimes[i], replaced = st, true
			}
		}
		if !replaced {
			rep.SuiteTimes = append(rep.SuiteTimes, st)
		}
	}
	if part.Machine.PGSettingsDurable != "" {
		rep.Machine.PGSettingsDurable, rep.Machine.PGSourceDurable = part.Machine.PGSettingsDurable, part.Machine.PGSourceDurable
	}
	list := strings.Join(names, ", ")
	if len(names) > 1 {
		list = strings.Join(names[:len(names)-1], ", ") + " and " + names[len(names)-1]
	}
	// An earlier re-run of only suites this one re-ran again no longer shows anywhere.
	rep.Merged = slices.DeleteFunc(rep.Merged, func(m string) bool {
		suites, _, ok := strings.Cut(strings.TrimPrefix(m, "the "), " suites were re-run on ")
		if !ok {
			return false
		}
		for _, n := range strings.FieldsFunc(strings.ReplaceAll(suites, " and ", ", "), func(r rune) bool { return r == ',' || r == ' ' }) {
			if !slices.Contains(names, n) {
				return false
			}
		}
		return true
	})
	rep.Merged = append(rep.Merged, fmt.Sprintf("the %s suites were re-run on %s UTC (%s; load average %s at the start, %s at the end; %s; `%s`)",
		list, part.Started.UTC().Format("2006-01-02 15:04"), part.Finished.Sub(part.Started).Round(time.Second),
		part.Machine.LoadStart, part.LoadEnd, part.Machine.Code, part.Command))
	return &rep, nil
}
