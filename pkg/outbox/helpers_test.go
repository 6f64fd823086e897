package outbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/testdb"
	"github.com/sluicehq/sluice/internal/testwait"
	"github.com/sluicehq/sluice/pkg/outbox"
)

func TestMain(m *testing.M) {
	if url := os.Getenv(childRelayEnv); url != "" {
		os.Exit(runChildRelay(url))
	}
	testdb.Main(m)
}

const testTopic = "orders"
const testARN = "arn:aws:sns:us-east-1:000000000000:orders"

// recorder is an in-process broker: it records what it acknowledged, can fail chosen events,
// and checks that no partition key is ever in two calls at once.
type recorder struct {
	mu       sync.Mutex
	received []*outbox.Event             // in acknowledgement order
	byKey    map[string][]int64          // row ids per partition key, in acknowledgement order
	inFlight map[string]bool             // keys in a call right now
	overlaps int                         // times a key was in two calls at once
	fail     func(e *outbox.Event) error // nil, or the error for this event
	// failCall, when it returns an error, fails the whole call (every entry) with it.
	failCall func(events []*outbox.Event) error
	// hold is called once the call's keys are marked in flight, before answering.
	hold  func(events []*outbox.Event)
	after func() // called after a call's acknowledgements are recorded
	delay time.Duration
	calls int
	// dropPayloads keeps acknowledged events without their payloads (memory tests).
	dropPayloads bool
}

func newRecorder() *recorder {
	return &recorder{byKey: map[string][]int64{}, inFlight: map[string]bool{}}
}

func (r *recorder) PublishBatch(ctx context.Context, dest string, events []*outbox.Event) []error {
	r.mu.Lock()
	r.calls++
	keys := map[string]bool{} // a call may carry several rows of a key (Limits.KeyOrderInCall)
	for _, e := range events {
		keys[e.PartitionKey] = true
	}
	for k := range keys {
		if r.inFlight[k] {
			r.overlaps++
		}
		r.inFlight[k] = true
	}
	fail, failCall, hold, delay := r.fail, r.failCall, r.hold, r.delay
	r.mu.Unlock()
	if hold != nil {
		hold(events)
	}
	if delay > 0 {
		time.Sleep(delay)
	}
	var callErrs []error
	if failCall != nil {
		if err := failCall(events); err != nil {
			callErrs = outbox.CallFailed(len(events), err)
		}
	}
	errs := make([]error, len(events))
	r.mu.Lock()
	for i, e := range events {
		delete(r.inFlight, e.PartitionKey)
		if ctx.Err() != nil {
			errs[i] = ctx.Err()
			continue
		}
		if callErrs != nil {
			errs[i] = callErrs[i]
			continue
		}
		if fail != nil {
			if err := fail(e); err != nil {
				errs[i] = err
				continue
			}
		}
		if r.dropPayloads {
			c := *e
			c.Payload = nil
			e = &c
		}
		r.received = append(r.received, e)
		r.byKey[e.PartitionKey] = append(r.byKey[e.PartitionKey], e.ID)
	}
	after := r.after
	r.mu.Unlock()
	if after != nil {
		after()
	}
	return errs
}

func (r *recorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.received)
}

func (r *recorder) setFail(f func(*outbox.Event) error) {
	r.mu.Lock()
	r.fail = f
	r.mu.Unlock()
}

// requireKeyOrder asserts each key's first deliveries are in id order (duplicates allowed).
func (r *recorder) requireKeyOrder(t *testing.T) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	require.Zero(t, r.overlaps, "a partition key was in two publish calls at once")
	for key, ids := range r.byKey {
		seen := map[int64]bool{}
		var last int64
		for _, id := range ids {
			if seen[id] {
				continue
			}
			seen[id] = true
			require.Greater(t, id, last, "key %s: row %d published after row %d", key, id, last)
			last = id
		}
	}
}

type bundle struct {
	pool *pgxpool.Pool
	rec  *recorder
}

func setup(t *testing.T) *bundle {
	t.Helper()
	return &bundle{pool: testdb.Pool(t), rec: newRecorder()}
}

// relay returns a relay over the bundle's recorder with fast test timings.
func (b *bundle) relay(t *testing.T, mutate ...func(*outbox.RelayConfig)) *outbox.Relay {
	t.Helper()
	cfg := outbox.RelayConfig{
		Publisher:    b.rec,
		Topics:       map[string]string{testTopic: testARN},
		BackoffBase:  10 * time.Millisecond,
		BackoffMax:   50 * time.Millisecond,
		PollInterval: 50 * time.Millisecond,
		// A long lease: every statement may take half of it, which a machine busy with other
		// work needs; tests of the lease itself set their own.
		Lease:          30 * time.Second,
		PublishTimeout: 2 * time.Second,
		Logger:         testLogger(),
	}
	for _, m := range mutate {
		m(&cfg)
	}
	r, err := outbox.NewRelay(b.pool, cfg)
	require.NoError(t, err)
	return r
}

// write commits n events spread over keys partition keys ("k0".."k<keys-1>"), round robin.
func (b *bundle) write(t *testing.T, n, keys int) []outbox.Message {
	t.Helper()
	ctx := context.Background()
	msgs := make([]outbox.Message, n)
	for i := range msgs {
		msgs[i] = outbox.Message{
			Topic: testTopic, AggregateType: "order", AggregateID: fmt.Sprintf("o-%d", i), EventType: "OrderCreated",
			PartitionKey: fmt.Sprintf("k%d", i%keys), Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i)),
		}
	}
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	written, err := outbox.Write(ctx, tx, msgs...)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	return written
}

func (b *bundle) countWhere(t *testing.T, where string) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(context.Background(), "SELECT count(*) FROM outbox_event WHERE "+where).Scan(&n))
	return n
}

// drainUntil runs RunOnce until cond holds (rows in backoff need time), however long a busy
// machine takes: only the test binary's deadline ends the wait.
func drainUntil(t *testing.T, r *outbox.Relay, cond func() bool) {
	t.Helper()
	testwait.Until(t, "the relay's rounds reach the awaited state", func() bool {
		if cond() {
			return true
		}
		_, err := r.RunOnce(context.Background())
		require.NoError(t, err)
		return false
	})
}

// testLogger discards relay logs unless RELAY_DEBUG is set.
func testLogger() *slog.Logger {
	if os.Getenv("RELAY_DEBUG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}
