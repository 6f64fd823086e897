package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluicehq/sluice/internal/demoapp"
	"github.com/sluicehq/sluice/internal/localaws"
	"github.com/sluicehq/sluice/internal/localrun"
)

// E2EResult is the end-to-end suite's outcome: measured, or why not.
type E2EResult struct {
	Measured bool
	// Reason it was not measured.
	Reason string
	// Runs are the measured rates.
	Runs []E2ERun
	// Setup describes the local stack.
	Setup string
	// Probes measure the SNS endpoint alone (before the runs, the stack idle).
	Probes []SNSProbe
	// Keyed are the side-by-side runs with few keys (e2eKeys): the standard topic and the FIFO
	// topic, each at e2eKeyedRates, on stacks of their own.
	Keyed []E2ERun
}

// E2ERun is commit-to-apply latency at one offered rate.
type E2ERun struct {
	// Topic is "standard" or "FIFO" (a FIFO topic and queue: a key's messages form one message
	// group); Keys is the number of partition keys the orders spread over (0: the 800 of the
	// standard runs, 100 customers per producer), and PerKeyRate the offered rate of one key.
	Topic      string
	Keys       int
	PerKeyRate float64
	// OrderViolations counts, in runs with Keys, ledger entries a customer's consumer applied
	// before an earlier order of that customer (only the FIFO topic promises none).
	OrderViolations   int
	Rate              int
	Duration          time.Duration
	Produced, Applied int
	// AchievedRate is the rate at which orders were actually committed.
	AchievedRate  float64
	P50, P95, P99 time.Duration
	Max           time.Duration
	// PubP50 and PubP99 split off the relay's share: created_at to published_at (the moment the
	// relay recorded SNS's acknowledgement).
	PubP50, PubP99 time.Duration
	// SNS is the relay's SNS calls while producing (timed by a proxy between the relay and the endpoint).
	SNS SNSCalls
	// CPU is what each of this run's processes used while producing, in cores; MachineBusy is the
	// machine's busy cores (of runtime.NumCPU) and Others the part used by processes not of this run.
	CPU                 []ProcCPU
	MachineBusy, Others float64
}

// e2eProducers commit orders concurrently (a single producer could not sustain 1,000/s here).
const e2eProducers = 8

// e2eKeys is the number of partition keys of the side-by-side runs of the standard and the FIFO
// topic, and e2eKeyedRates their offered rates: at 500 events/s each key (a FIFO message group)
// carries 10 events/s.
const e2eKeys = 50

var e2eKeyedRates = []int{100, 500}

// e2eConsumers is the consumer function's concurrency: the five batches at once with which
// the SQS event source mapping starts.
const e2eConsumers = 5

// runE2ESuite measures commit-to-apply latency through the local AWS: the fauxqs emulator (or
// the endpoint in AWS_ENDPOINT_URL), the real relay and consumer bootstraps under the Lambda
// runtime interface emulator with their EventBridge and SQS drivers (internal/localrun, the
// stack `make demo` runs), and demoapp's orders service producing at a fixed rate.
func runE2ESuite(ctx context.Context, log *slog.Logger, env *Env, sz Sizes, rep *Report) error {
	blocked := func(err error) error {
		rep.E2E = E2EResult{Reason: "blocked: " + err.Error()}
		log.Warn("end-to-end suite not measured", "reason", rep.E2E.Reason)
		return nil
	}
	root, err := localaws.RepoRoot()
	if err != nil {
		return blocked(fmt.Errorf("find the repository root: %w", err))
	}
	pool, dbURL, err := env.NewDatabase(ctx, "e2e", 16, nil)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := demoapp.ApplySchema(ctx, pool); err != nil {
		return err
	}
	endpoint := os.Getenv(localaws.EnvEndpoint)
	if endpoint == "" {
		e, err := localaws.Start(ctx, localaws.Options{})
		if err != nil {
			return blocked(fmt.Errorf("start the SNS/SQS emulator (run make deps): %w", err))
		}
		defer e.Stop()
		endpoint = e.URL
	}
	log.Info("building the Lambdas for this machine")
	rie, err := localrun.EnsureRIE(ctx, root)
	if err != nil {
		return blocked(err)
	}
	binDir, err := localrun.BuildLambdas(ctx, root, filepath.Join(os.TempDir(), fmt.Sprintf("sluice-bench-bin-%d", os.Getpid())), localrun.RelayFunction, localrun.ConsumerFunction)
	if err != nil {
		return blocked(err)
	}
	defer os.RemoveAll(binDir)
	proxy, err := startTimingProxy(endpoint)
	if err != nil {
		return err
	}
	defer proxy.Close()
	opts := localrun.StackOptions{RIE: rie, BinDir: binDir, DatabaseURL: dbURL, Endpoint: endpoint, RelaySNSEndpoint: proxy.URL,
		Name: fmt.Sprintf("sluice-bench-%d", os.Getpid()), Log: e2eLog(), Logger: log,
		ConsumerInstances: e2eConsumers}
	st, err := localrun.StartStack(ctx, opts)
	if err != nil {
		return blocked(fmt.Errorf("start the local stack: %w", err))
	}
	defer func() { st.Stop() }()
	res := E2EResult{Measured: true, Setup: fmt.Sprintf("endpoint %s; relay: 2 instances, scheduled every 4 s with a 10 s timeout "+
		"(localrun's compressed EventBridge schedule; each invocation keeps polling until shortly before its timeout); consumer: %d instances (the SQS event source mapping starts with 5 concurrent batches), "+
		"SQS batches of up to 10, standard topic and queue with raw delivery; the relay reaches the endpoint through a timing proxy in the harness", endpoint, e2eConsumers)}
	for i, callers := range []int{4, 16} {
		pr := probeSNS(ctx, endpoint, fmt.Sprintf("sluice-bench-probe-%d-%d", os.Getpid(), i), callers, e2eProbeDuration(sz))
		log.Info("SNS probe", "callers", callers, "calls", pr.Calls.Calls, "calls/s", int(pr.Calls.PerSec), "p50", pr.Calls.Latency.P50, "p99", pr.Calls.Latency.P99, "error", pr.Err)
		res.Probes = append(res.Probes, pr)
	}
	dbName := filepath.Base(dbURLPath(dbURL))
	runs := 0
	measure := func(topic string, rate, keys int) (E2ERun, error) {
		runs++
		proxy.take(time.Second) // drop the calls made before this run
		var diag e2eDiag
		before := takeCPUSnapshot(dbName, e2eCPULabels)
		run, err := e2eRun(ctx, pool, fmt.Sprintf("b%d-%d-", os.Getpid(), runs), rate, keys, sz.E2EDuration, func(producing time.Duration) {
			after := takeCPUSnapshot(dbName, e2eCPULabels)
			run := proxy.take(producing)
			cpu, busy, others := cpuBetween(before, after)
			diag = e2eDiag{run, cpu, busy, others}
		})
		if err != nil {
			return E2ERun{}, fmt.Errorf("%s topic at %d events/s: %w", topic, rate, err)
		}
		run.Topic = topic
		run.SNS, run.CPU, run.MachineBusy, run.Others = diag.sns, diag.cpu, diag.busy, diag.others
		log.Info("end-to-end", "topic", topic, "keys", keys, "rate", rate, "produced", run.Produced, "applied", run.Applied, "p50", run.P50, "p95", run.P95, "p99", run.P99,
			"publish_p50", run.PubP50, "publish_p99", run.PubP99,
			"relay_sns_calls/s", int(run.SNS.PerSec), "sns_p50", run.SNS.Latency.P50, "sns_p99", run.SNS.Latency.P99, "machine_busy_cores", fmt.Sprintf("%.2f", run.MachineBusy))
		for _, c := range run.CPU {
			log.Info("end-to-end cpu", "rate", rate, "group", c.Group, "cores", fmt.Sprintf("%.2f", c.Cores), "procs", c.Procs)
		}
		return run, nil
	}
	for _, rate := range []int{100, 1000} {
		run, err := measure("standard", rate, 0)
		if err != nil {
			return err
		}
		res.Runs = append(res.Runs, run)
	}
	for _, rate := range e2eKeyedRates {
		run, err := measure("standard", rate, e2eKeys)
		if err != nil {
			return err
		}
		res.Keyed = append(res.Keyed, run)
	}
	// The FIFO topic, queue and functions replace the standard ones: one stack runs at a time.
	st.Stop()
	opts.Name, opts.FIFO = fmt.Sprintf("sluice-bench-fifo-%d", os.Getpid()), true
	if st, err = localrun.StartStack(ctx, opts); err != nil {
		return fmt.Errorf("start the local FIFO stack: %w", err)
	}
	for _, rate := range e2eKeyedRates {
		run, err := measure("FIFO", rate, e2eKeys)
		if err != nil {
			return err
		}
		res.Keyed = append(res.Keyed, run)
	}
	rep.E2E = res
	return nil
}

// e2eRun commits orders at rate per second for d, waits until all are applied (or a minute
// more), and reads each event's commit-to-apply latency from the database: from the producing
// transaction's created_at (outbox_event, now() of that transaction) to the ledger entry's
// applied_at (clock_timestamp() inside the consumer's applying transaction). Both clocks are
// the same PostgreSQL server's. With keys > 0 the orders go to that many customers (partition
// keys) in turn, each customer's always from the same producer, so that a key's orders commit
// in sequence as a FIFO pipeline's order needs; with keys 0, to the 800 customers of the
// standard runs (100 per producer, from whichever producer is free).
func e2eRun(ctx context.Context, pool *pgxpool.Pool, prefix string, rate, keys int, d time.Duration, onProduced func(producing time.Duration)) (E2ERun, error) {
	n := int(float64(rate) * d.Seconds())
	var (
		produced atomic.Int64
		wg       sync.WaitGroup
		errMu    sync.Mutex
		firstErr error
	)
	const customers = 100
	shared := make(chan int, 256)
	lanes := make([]chan int, e2eProducers)
	for w := range e2eProducers {
		lanes[w] = shared
		if keys > 0 {
			lanes[w] = make(chan int, 256)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			seq := map[string]int{}
			for i := range lanes[w] {
				customer := fmt.Sprintf("bench-%d-%03d", w, i%customers)
				if keys > 0 {
					customer = fmt.Sprintf("bench-k%03d", i%keys)
				}
				seq[customer]++
				o := demoapp.OrderCreated{OrderID: fmt.Sprintf("%s%07d", prefix, i), Customer: customer,
					Seq: seq[customer], AmountCents: int64(100 + i%9000), Currency: "EUR"}
				if _, err := demoapp.PlaceOrder(ctx, pool, o); err != nil {
					errMu.Lock()
					firstErr = err
					errMu.Unlock()
					continue
				}
				produced.Add(1)
			}
		}()
	}
	lane := func(i int) chan int {
		if keys > 0 {
			return lanes[(i%keys)%e2eProducers]
		}
		return shared
	}
	start := time.Now()
	interval := time.Second / time.Duration(rate)
	for i := range n {
		if wait := time.Until(start.Add(time.Duration(i) * interval)); wait > 0 {
			time.Sleep(wait)
		}
		lane(i) <- i
	}
	if keys > 0 {
		for _, l := range lanes {
			close(l)
		}
	} else {
		close(shared)
	}
	wg.Wait()
	elapsed := time.Since(start)
	onProduced(elapsed) // the diagnostics' window: the producing phase
	if firstErr != nil {
		return E2ERun{}, fmt.Errorf("produce: %w", firstErr)
	}
	run := E2ERun{Keys: keys, Rate: rate, Duration: d, Produced: int(produced.Load()), AchievedRate: float64(produced.Load()) / elapsed.Seconds()}
	if keys > 0 {
		run.PerKeyRate = float64(rate) / float64(keys)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		if err := pool.QueryRow(ctx, "SELECT count(DISTINCT message_id) FROM demo_ledger WHERE order_id LIKE $1 || '%'", prefix).Scan(&run.Applied); err != nil {
			return E2ERun{}, err
		}
		if run.Applied >= run.Produced || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if run.Applied < run.Produced {
		return E2ERun{}, fmt.Errorf("only %d of %d events applied a minute after the last commit", run.Applied, run.Produced)
	}
	var p50, p95, p99, pmax, pub50, pub99 float64
	err := pool.QueryRow(ctx, `
		SELECT percentile_cont(0.50) WITHIN GROUP (ORDER BY ms), percentile_cont(0.95) WITHIN GROUP (ORDER BY ms),
		       percentile_cont(0.99) WITHIN GROUP (ORDER BY ms), max(ms),
		       percentile_cont(0.50) WITHIN GROUP (ORDER BY pub_ms), percentile_cont(0.99) WITHIN GROUP (ORDER BY pub_ms)
		FROM (SELECT extract(epoch FROM (min(l.applied_at) - o.created_at)) * 1000 AS ms,
		             extract(epoch FROM (o.published_at - o.created_at)) * 1000 AS pub_ms
		      FROM demo_ledger l JOIN outbox_event o ON o.event_id::text = l.message_id
		      WHERE l.order_id LIKE $1 || '%'
		      GROUP BY o.event_id, o.created_at, o.published_at) t`, prefix).Scan(&p50, &p95, &p99, &pmax, &pub50, &pub99)
	if err != nil {
		return E2ERun{}, fmt.Errorf("read latencies: %w", err)
	}
	ms := func(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }
	run.P50, run.P95, run.P99, run.Max = ms(p50), ms(p95), ms(p99), ms(pmax)
	run.PubP50, run.PubP99 = ms(pub50), ms(pub99)
	if keys > 0 {
		v, err := demoapp.Verify(ctx, pool, prefix)
		if err != nil {
			return E2ERun{}, err
		}
		run.OrderViolations = v.OrderViolations
	}
	return run, nil
}

// e2eDiag is what the diagnostics saw while one rate was produced.
type e2eDiag struct {
	sns          SNSCalls
	cpu          []ProcCPU
	busy, others float64
}

// e2eProbeDuration is how long each SNS probe publishes.
func e2eProbeDuration(sz Sizes) time.Duration {
	if sz.Name == "full" {
		return 5 * time.Second
	}
	return 2 * time.Second
}

func dbURLPath(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return ""
	}
	return p.Path
}

// e2eLog is where the local stack's output goes: the file named by SLUICE_BENCH_E2E_LOG, for
// diagnosing a run, else nowhere.
func e2eLog() io.Writer {
	if p := os.Getenv("SLUICE_BENCH_E2E_LOG"); p != "" {
		if f, err := os.Create(p); err == nil {
			return f
		}
	}
	return io.Discard
}
