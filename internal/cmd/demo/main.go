// Command demo is `make demo`: the whole sluice pipeline on one machine, with the real Lambda
// binaries. It starts PostgreSQL (unless DATABASE_URL is set) and fauxqs on port 4566 (moto with
// SLUICE_AWS_EMULATOR=moto; neither when AWS_ENDPOINT_URL is set), creates the topic, queue, DLQ and raw subscription through the AWS
// APIs, runs the relay and consumer bootstraps under the Lambda runtime interface emulator with
// drivers playing EventBridge and the SQS event source mapping (with -transport kafka: an
// in-process Kafka cluster instead of SNS/SQS, the relay publishing to kafka://orders, and a
// driver playing the Amazon MSK event source mapping; see pipeline.go), has a sample orders service
// write N orders at a chosen rate, shows a live progress line, and ends with a verification:
// every committed event applied exactly once, and one order's trace drawn as a waterfall (write,
// commit, outbox wait, publish, SQS, apply) from the spans the orders service and both Lambdas
// exported (see trace.go). It exits non-zero on any discrepancy and stops everything it started
// when it ends or is interrupted.
//
//	go run ./internal/cmd/demo -n 500 -rate 200 [-fifo | -transport kafka]
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice/internal/demoapp"
	"github.com/sluicehq/sluice/internal/localaws"
	"github.com/sluicehq/sluice/internal/localrun"
	"github.com/sluicehq/sluice/internal/pgcluster"
	"github.com/sluicehq/sluice/migrations"
)

type options struct {
	n, customers, workers int
	rate                  float64
	fifo                  bool
	transport             string
	partitions            int
	timeout               time.Duration
}

func main() {
	var o options
	flag.IntVar(&o.n, "n", 500, "number of orders to write")
	flag.Float64Var(&o.rate, "rate", 200, "orders per second")
	flag.BoolVar(&o.fifo, "fifo", false, "use a FIFO topic and queue (per-customer order is then verified)")
	flag.IntVar(&o.customers, "customers", 50, "number of customers (partition keys / FIFO message groups)")
	flag.StringVar(&o.transport, "transport", "sns", "the broker: sns (SNS topic → SQS queue) or kafka (an in-process Kafka topic, read as Lambda's MSK event source mapping does)")
	flag.IntVar(&o.partitions, "partitions", 8, "partitions of the Kafka topic (-transport kafka)")
	flag.DurationVar(&o.timeout, "timeout", 2*time.Minute, "give up waiting for every order to be applied after this long")
	flag.Parse()
	if o.n < 1 || o.rate <= 0 || o.customers < 1 || o.timeout <= 0 || o.partitions < 1 {
		fmt.Fprintln(os.Stderr, "demo: -n, -rate, -customers, -partitions and -timeout must be positive")
		os.Exit(2)
	}
	if o.transport != "sns" && o.transport != "kafka" {
		fmt.Fprintf(os.Stderr, "demo: -transport must be sns or kafka, got %q\n", o.transport)
		os.Exit(2)
	}
	if o.transport == "kafka" && o.fifo {
		fmt.Fprintln(os.Stderr, "demo: -fifo is for SNS/SQS; on Kafka each customer stays on one partition in order anyway (and the demo verifies it)")
		os.Exit(2)
	}
	o.workers = min(4, o.customers)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, o)
	stop()
	os.Exit(code)
}

func run(ctx context.Context, o options) int {
	root, err := localaws.RepoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		return 1
	}
	logDir := filepath.Join(root, ".cache", "demo")
	_ = os.MkdirAll(logDir, 0o755)
	logPath := filepath.Join(logDir, "demo.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		return 1
	}
	defer logFile.Close()
	log := slog.New(slog.NewJSONHandler(logFile, nil))
	// Every span of the run passes through spans on its way to the log.
	spans := &spanLog{w: logFile}
	tp, err := newTracerProvider(spans)
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		return 1
	}
	defer func() { _ = tp.Shutdown(context.WithoutCancel(ctx)) }()
	tracer := tp.Tracer("orders-service")
	step := func(format string, args ...any) { fmt.Printf("==> "+format+"\n", args...) }
	fail := func(what string, err error) int {
		fmt.Fprintf(os.Stderr, "\ndemo: %s: %v (logs: %s)\n", what, err, logPath)
		return 1
	}

	dbURL := os.Getenv("DATABASE_URL")
	if dbURL == "" {
		c, err := pgcluster.Start(ctx, pgcluster.Options{})
		if err != nil {
			return fail("start PostgreSQL (or set DATABASE_URL)", err)
		}
		defer c.Stop()
		dbURL = c.URL
		step("PostgreSQL started (throwaway cluster) at %s", dbURL)
	} else {
		step("PostgreSQL: using DATABASE_URL")
	}
	poolCfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return fail("parse the database URL", err)
	}
	poolCfg.ConnConfig.Tracer = statementSpans{tracer: tracer}
	pool, err := pgxpool.NewWithConfig(ctx, poolCfg)
	if err != nil {
		return fail("connect to PostgreSQL", err)
	}
	defer pool.Close()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return fail("connect to PostgreSQL", err)
	}
	err = migrations.Up(ctx, conn.Conn())
	conn.Release()
	if err != nil {
		return fail("apply sluice's migrations", err)
	}
	if err := demoapp.ApplySchema(ctx, pool); err != nil {
		return fail("apply the demo schema", err)
	}

	rie, err := localrun.EnsureRIE(ctx, root)
	if err != nil {
		return fail("install the Lambda runtime interface emulator", err)
	}
	binDir, err := localrun.BuildLambdas(ctx, root, filepath.Join(root, ".cache", "local-bin"), localrun.RelayFunction, localrun.ConsumerFunction)
	if err != nil {
		return fail("build the Lambdas", err)
	}
	step("built lambdas/relay and examples/ledger (the demo's consumer) for this machine into %s", relToRepo(root, binDir))

	runID := fmt.Sprintf("%x", rand.Uint32())
	startPipeline := startSNS
	if o.transport == "kafka" {
		startPipeline = startKafka
	}
	pl, err := startPipeline(ctx, o, pipelineEnv{rie: rie, binDir: binDir, dbURL: dbURL, runID: runID, log: log, logFile: logFile, spans: spans, step: step})
	if err != nil {
		return fail("start the local pipeline", err)
	}
	defer pl.stop()
	step("orders service: writing %d orders for %d customers at %.0f/s (run %s)", o.n, o.customers, o.rate, runID)

	prefix := "demo-" + runID + "-"
	start := time.Now()
	var produced atomic.Int64
	prodErr := make(chan error, 1)
	go func() { prodErr <- produce(ctx, pool, tracer, o, prefix, &produced) }()

	deadline := time.Now().Add(o.timeout)
	tty := isTerminal(os.Stdout)
	lastLine := time.Time{}
	var p demoapp.Progress
	producing := true
	for {
		select {
		case <-ctx.Done():
			fmt.Println()
			return fail("interrupted", ctx.Err())
		case err := <-prodErr:
			producing = false
			if err != nil {
				return fail("orders service", err)
			}
		case <-time.After(200 * time.Millisecond):
		}
		if p, err = demoapp.ProgressOf(ctx, pool, prefix); err != nil {
			return fail("read progress", err)
		}
		line := fmt.Sprintf("produced %5d/%d | published %5d | applied %5d | outbox lag %4.1fs | %5.1fs",
			p.Produced, o.n, p.Published, p.Applied, p.OldestPending.Seconds(), time.Since(start).Seconds())
		if tty {
			fmt.Printf("\r%s", line)
		} else if time.Since(lastLine) >= time.Second {
			fmt.Println(line)
			lastLine = time.Now()
		}
		if !producing && p.Applied >= p.Produced {
			break
		}
		if time.Now().After(deadline) {
			fmt.Println()
			fmt.Printf("gave up after %s: %d of %d applied\n", o.timeout, p.Applied, p.Produced)
			break
		}
	}
	if tty {
		fmt.Println()
	} else {
		fmt.Printf("produced %5d/%d | published %5d | applied %5d | outbox lag %4.1fs | %5.1fs\n",
			p.Produced, o.n, p.Published, p.Applied, p.OldestPending.Seconds(), time.Since(start).Seconds())
	}
	// Let late duplicates, if there were any, land before checking.
	time.Sleep(time.Second)
	v, err := demoapp.Verify(ctx, pool, prefix)
	if err != nil {
		return fail("verify", err)
	}
	ss := pl.source.Stats()
	relayRuns, relayFails := pl.schedule.Invocations()
	fmt.Printf("\n%s pipeline, %d orders in %.1fs (relay invocations %d, failed %d; consumer invocations %d, records %s %d, reported failed %d)\n",
		pl.kind, o.n, time.Since(start).Seconds(), relayRuns, relayFails, ss.Invocations, pl.settled, ss.Deleted, ss.ReportedFailures)
	fmt.Printf("  produced (committed)        %d\n", v.Produced)
	fmt.Printf("  applied exactly once        %d\n", v.ExactlyOnce)
	fmt.Printf("  lost                        %d\n", v.Lost)
	fmt.Printf("  applied twice               %d\n", v.AppliedTwice)
	if pl.ordered {
		fmt.Printf("  out of per-customer order   %d\n", v.OrderViolations)
	}
	fmt.Printf("  commit-to-apply latency     p50 %s, p99 %s\n", v.P50.Round(time.Millisecond), v.P99.Round(time.Millisecond))
	fmt.Printf("    of which commit-to-publish (the relay's share) p50 %s, p99 %s\n", v.PublishP50.Round(time.Millisecond), v.PublishP99.Round(time.Millisecond))
	if v.Produced != o.n {
		fmt.Printf("FAIL: %d orders committed, %d requested\n", v.Produced, o.n)
		return 1
	}
	if !v.OK(pl.ordered) {
		fmt.Printf("FAIL: %s (logs: %s)\n", strings.Join(v.Problems(pl.ordered), "; "), logPath)
		return 1
	}
	if pl.ordered {
		fmt.Printf("OK: every committed event was applied exactly once, each customer's in order (function logs: %s)\n", relToRepo(root, logPath))
	} else {
		fmt.Printf("OK: every committed event was applied exactly once (function logs: %s)\n", relToRepo(root, logPath))
	}
	printWaterfall(os.Stdout, spans.all(), v.Produced, pl.hop)
	return 0
}

// produce is the sample orders service: it places o.n orders at o.rate per second, spread over
// o.customers customers; each customer's orders are numbered in commit order. Each order is
// placed inside a span, whose context outbox.Write carries to the consumer.
func produce(ctx context.Context, pool *pgxpool.Pool, tracer trace.Tracer, o options, prefix string, produced *atomic.Int64) error {
	var wg sync.WaitGroup
	var firstErr error
	var once sync.Once
	lanes := make([]chan int, o.workers)
	for w := range o.workers {
		lanes[w] = make(chan int, 64)
		wg.Add(1)
		go func() {
			defer wg.Done()
			seq := map[int]int{}
			for i := range lanes[w] {
				c := i % o.customers
				seq[c]++
				order := demoapp.OrderCreated{OrderID: fmt.Sprintf("%s%06d", prefix, i), Customer: fmt.Sprintf("customer-%03d", c),
					Seq: seq[c], AmountCents: int64(100 + i%9000), Currency: []string{"EUR", "USD", "GBP"}[i%3]}
				octx, span := tracer.Start(ctx, placeOrderSpan, placeOrderAttrs(order.OrderID))
				_, err := demoapp.PlaceOrder(octx, pool, order)
				span.End()
				if err != nil {
					once.Do(func() { firstErr = err })
					continue
				}
				produced.Add(1)
			}
		}()
	}
	go func() {
		defer func() {
			for _, l := range lanes {
				close(l)
			}
		}()
		interval := time.Duration(float64(time.Second) / o.rate)
		next := time.Now()
		for i := range o.n {
			if d := time.Until(next); d > 0 {
				select {
				case <-ctx.Done():
					return
				case <-time.After(d):
				}
			}
			next = next.Add(interval)
			// A customer always goes to the same worker, so its orders commit in sequence.
			lanes[(i%o.customers)%o.workers] <- i
		}
	}()
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	return ctx.Err()
}

func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// relToRepo names path relative to the repository's root when it lies inside it, so the demo's
// output reads the same on every machine.
func relToRepo(root, path string) string {
	if rel, err := filepath.Rel(root, path); err == nil && !strings.HasPrefix(rel, "..") {
		return rel
	}
	return path
}
