package e2e

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/demoapp"
	"github.com/sluicehq/sluice/internal/localaws"
	"github.com/sluicehq/sluice/internal/localrun"
	"github.com/sluicehq/sluice/internal/testdb"
	"github.com/sluicehq/sluice/internal/testwait"
)

func TestMain(m *testing.M) { testdb.Main(m) }

var (
	binOnce        sync.Once
	rieBin, binDir string
	binErr         error
)

// binaries builds the relay and consumer for this machine once per test binary.
func binaries(t *testing.T) (string, string) {
	t.Helper()
	binOnce.Do(func() {
		ctx := context.Background()
		root, err := localaws.RepoRoot()
		if err != nil {
			binErr = err
			return
		}
		if rieBin, binErr = localrun.EnsureRIE(ctx, root); binErr != nil {
			return
		}
		// One directory per test process under .cache (gitignored); those of finished runs are removed.
		base := filepath.Join(root, ".cache", "e2e-bin")
		if old, _ := filepath.Glob(filepath.Join(base, "*")); len(old) > 0 {
			for _, d := range old {
				if pid, err := strconv.Atoi(filepath.Base(d)); err == nil && syscall.Kill(pid, 0) != nil {
					_ = os.RemoveAll(d)
				}
			}
		}
		binDir, binErr = localrun.BuildLambdas(ctx, root, filepath.Join(base, strconv.Itoa(os.Getpid())))
	})
	require.NoError(t, binErr)
	return rieBin, binDir
}

// bundle is one test's pipeline: its own database, resources and function instances.
type bundle struct {
	ctx    context.Context
	dbURL  string
	pool   *pgxpool.Pool
	stack  *localrun.Stack
	prefix string
	fifo   bool
	// written counts orders committed by place.
	written int
}

// setup starts a pipeline on a fresh database; mod adjusts the stack options.
func setup(t *testing.T, mod func(*localrun.StackOptions)) *bundle {
	t.Helper()
	rie, bins := binaries(t)
	ctx := context.Background()
	dbURL := testdb.URL(t)
	pool, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	require.NoError(t, demoapp.ApplySchema(ctx, pool))

	name := fmt.Sprintf("e2e-%s-%x", strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-")), rand.Uint32())
	if len(name) > 60 {
		name = name[len(name)-60:]
	}
	logPath := filepath.Join(t.TempDir(), "functions.log")
	logFile, err := os.Create(logPath)
	require.NoError(t, err)
	o := localrun.StackOptions{RIE: rie, BinDir: bins, DatabaseURL: dbURL, Endpoint: localaws.TestEndpoint(t), Name: name,
		VisibilityTimeout: 3 * time.Second, MaxReceiveCount: 5, RelayEvery: 3 * time.Second, RelayTimeout: 8 * time.Second, Log: logFile,
		Logger: slog.New(slog.NewTextHandler(logFile, nil))}
	if mod != nil {
		mod(&o)
	}
	st, err := localrun.StartStack(ctx, o)
	require.NoError(t, err)
	t.Cleanup(func() {
		st.Stop()
		st.Pipeline.Delete(context.Background(), st.SNS, st.SQS)
		logFile.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			if len(b) > 20000 {
				b = b[len(b)-20000:]
			}
			t.Logf("function logs (tail):\n%s", b)
		}
	})
	return &bundle{ctx: ctx, dbURL: dbURL, pool: pool, stack: st, prefix: name + "-", fifo: o.FIFO}
}

// place commits n orders over customers, one every interval; adjust may add test hooks.
func (b *bundle) place(t *testing.T, n, customers int, every time.Duration, adjust func(i int, o *demoapp.OrderCreated)) {
	t.Helper()
	seq := map[int]int{}
	for i := range n {
		c := i % customers
		seq[c]++
		o := demoapp.OrderCreated{OrderID: fmt.Sprintf("%s%05d", b.prefix, b.written), Customer: fmt.Sprintf("c%02d", c), Seq: seq[c],
			AmountCents: int64(100 + i), Currency: "EUR"}
		if adjust != nil {
			adjust(i, &o)
		}
		_, err := demoapp.PlaceOrder(b.ctx, b.pool, o)
		require.NoError(t, err)
		b.written++
		if every > 0 {
			time.Sleep(every)
		}
	}
}

// waitApplied waits until every placed order is in the ledger, failing when none was applied
// for limit (a liveness bound on progress, stretched by testwait.WatchFor to the pipeline's own
// pace, not a performance assertion: a busy machine applies them slowly, a stalled pipeline not
// at all), then checks that every committed event was applied exactly once.
func (b *bundle) waitApplied(t *testing.T, limit time.Duration) demoapp.Verification {
	t.Helper()
	var p demoapp.Progress
	b.waitUntil(t, limit, "every order applied", func() (bool, string) {
		var err error
		p, err = demoapp.ProgressOf(b.ctx, b.pool, b.prefix)
		require.NoError(t, err)
		return p.Applied >= b.written, fmt.Sprintf("%d of %d applied", p.Applied, b.written)
	})
	// Anything still in flight (a duplicate publish, a redelivery) gets a moment to land.
	time.Sleep(time.Second)
	v, err := demoapp.Verify(b.ctx, b.pool, b.prefix)
	require.NoError(t, err)
	t.Logf("produced %d, exactly once %d, lost %d, twice %d, out of order %d, p50 %s, p99 %s; event source %+v",
		v.Produced, v.ExactlyOnce, v.Lost, v.AppliedTwice, v.OrderViolations, v.P50, v.P99, b.stack.Source.Stats())
	if b.fifo && v.OrderViolations > 0 {
		b.logOrderViolations(t)
	}
	if v.Lost > 0 {
		b.logLost(t)
	}
	require.Equal(t, b.written, v.Produced, "orders committed")
	require.Equal(t, b.written, v.Events, "one outbox event per order")
	require.Empty(t, v.Problems(b.fifo), "every committed event applied exactly once (progress %+v)", p)
	require.True(t, v.OK(b.fifo))
	return v
}

// waitUntil polls cond until it holds, failing the test with cond's last report when that
// report (its counts) has not changed for limit, or for testwait.StallFactor times the longest
// pause the report already recovered from (a busy machine's pace), or shortly before the test
// binary's deadline. limit bounds a stall the guarantee rules out (a backoff of minutes, a key
// stuck for good), not how fast a busy machine gets there; it must be positive.
func (b *bundle) waitUntil(t *testing.T, limit time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	w := testwait.WatchFor[string](t, what, limit)
	for {
		ok, report := cond()
		if ok {
			return
		}
		w.Check(report)
		time.Sleep(200 * time.Millisecond)
	}
}

// sleep waits d or until ctx ends.
// repeatFault runs fault every interval, in a goroutine, until stop is called, and adds up what
// each run reports (processes killed, sessions terminated); stop waits for the goroutine.
func repeatFault(every time.Duration, fault func(ctx context.Context) int64) (count func() int64, stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var n atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for sleep(ctx, every); ctx.Err() == nil; sleep(ctx, every) {
			n.Add(fault(ctx))
		}
	}()
	return n.Load, func() { cancel(); wg.Wait() }
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// logOrderViolations logs, for each customer whose ledger is out of order, the orders in the
// order they were applied, with when each was published and applied: whether the relay
// published out of order or the queue delivered out of order shows in the timestamps.
func (b *bundle) logOrderViolations(t *testing.T) {
	t.Helper()
	rows, err := b.pool.Query(b.ctx, `
		WITH l AS (
			SELECT l.*, lag(l.seq) OVER (PARTITION BY l.customer ORDER BY l.entry_id) AS prev FROM demo_ledger l WHERE l.order_id LIKE $1
		), bad AS (SELECT DISTINCT customer FROM l WHERE prev IS NOT NULL AND seq <= prev)
		SELECT l.customer, l.seq, e.id, e.published_at, l.applied_at
		FROM l JOIN bad USING (customer) JOIN outbox_event e ON e.event_id::text = l.message_id
		ORDER BY l.customer, l.entry_id`, b.prefix+"%")
	require.NoError(t, err)
	defer rows.Close()
	for rows.Next() {
		var customer string
		var seq int
		var id int64
		var published, applied time.Time
		require.NoError(t, rows.Scan(&customer, &seq, &id, &published, &applied))
		t.Logf("out of order: customer %s seq %d (outbox id %d) published %s applied %s", customer, seq, id,
			published.Format("15:04:05.000000"), applied.Format("15:04:05.000000"))
	}
	require.NoError(t, rows.Err())
}

// logLost logs the committed events that never reached the ledger, with their outbox state.
func (b *bundle) logLost(t *testing.T) {
	t.Helper()
	rows, err := b.pool.Query(b.ctx, `
		SELECT e.id, e.topic, e.partition_key, e.attempts, e.published_at, e.quarantined_at IS NOT NULL, coalesce(e.last_error, '')
		FROM outbox_event e
		WHERE e.aggregate_id LIKE $1 AND NOT EXISTS (SELECT 1 FROM demo_ledger l WHERE l.message_id = e.event_id::text)
		ORDER BY e.id LIMIT 20`, b.prefix+"%")
	require.NoError(t, err)
	defer rows.Close()
	for rows.Next() {
		var id int64
		var topic, key, lastErr string
		var attempts int
		var published *time.Time
		var quarantined bool
		require.NoError(t, rows.Scan(&id, &topic, &key, &attempts, &published, &quarantined, &lastErr))
		t.Logf("not applied: outbox id %d topic %s key %s attempts %d published %v quarantined %v last error %q",
			id, topic, key, attempts, published, quarantined, lastErr)
	}
	require.NoError(t, rows.Err())
}
