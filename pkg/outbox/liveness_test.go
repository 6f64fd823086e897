package outbox_test

// Issue 40, "liveness by construction": each test is one way a healthy key's row used to wait
// far longer than docs/outbox.md's liveness bound, written from the scenario, on real
// PostgreSQL. None asserts a duration: each asserts that the healthy row went out while the
// thing that used to hold it (a pass that does not end, a destination whose call has not
// returned, a failing destination's probe backing off) still held, with that thing made to
// last far longer than the bound.

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/testwait"
	"github.com/sluicehq/sluice/pkg/outbox"
)

// lateRow writes one row of key on topic in a transaction it leaves open, so that its id is
// taken now and it commits when the returned function is called: a late commit.
func (b *bundle) lateRow(t *testing.T, key, topic string) (outbox.Message, func()) {
	t.Helper()
	ctx := context.Background()
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	written, err := outbox.Write(ctx, tx, outbox.Message{Topic: topic, AggregateType: "order", AggregateID: key,
		EventType: "OrderCreated", PartitionKey: key, Payload: json.RawMessage(`{"late":true}`)})
	require.NoError(t, err)
	var once sync.Once
	commit := func() { once.Do(func() { require.NoError(t, tx.Commit(ctx)) }) }
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	return written[0], commit
}

// published reports whether the broker acknowledged the row with id.
func (r *recorder) published(id uuid.UUID) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.received {
		if e.EventID == id {
			return true
		}
	}
	return false
}

// waitFor waits until cond holds or until limit passed, and reports whether it held. limit is
// far beyond the liveness bound: it only ends the test where the relay is wrong.
func waitFor(limit time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		if cond() {
			return true
		}
		time.Sleep(20 * time.Millisecond)
	}
	return cond()
}

// Scenario 1: a pass used to sweep only when no key was due, so a long pass (a hot key's
// backlog, steady writes) never swept again, and a row that committed late below its start
// frontier waited for the pass to end.
func TestAPassSweepsOnItsDeadlineWhileItRuns(t *testing.T) {
	t.Parallel()
	b := setup(t)
	late, commit := b.lateRow(t, "late", testTopic)
	b.writeKey(t, "busy", testTopic, 3000) // one row a round: thousands of rounds in one pass
	r := b.relay(t, func(c *outbox.RelayConfig) {
		c.RescanInterval = 100 * time.Millisecond
		c.MaxPerKey = 1
	})

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var (
		passEnded atomic.Bool
		wg        sync.WaitGroup
	)
	wg.Add(2)
	go func() { // steady writes besides
		defer wg.Done()
		for ctx.Err() == nil {
			b.writeKey(t, "busy", testTopic, 1)
			time.Sleep(5 * time.Millisecond)
		}
	}()
	go func() {
		defer wg.Done()
		_, err := r.RunPass(ctx)
		require.NoError(t, err)
		passEnded.Store(true)
	}()
	testwait.Until(t, "the pass has started", func() bool { return r.Frontier() > 0 && b.rec.count() > 0 })
	commit()
	var ended, published bool
	testwait.Until(t, "the late row is published or the pass ends", func() bool {
		ended = passEnded.Load() // read first: a pass that had not ended then had not when the row was seen
		published = b.rec.published(late.EventID)
		return published || ended
	})
	cancel()
	wg.Wait()
	require.True(t, published && !ended, "a row that committed late below the pass's start frontier was published only after the pass ended (no sweep since its start)")
	b.rec.requireKeyOrder(t)
}

// Scenario 3: a key held for a failing destination used to stay held after its head became a
// healthy destination's row (a late commit with a lower id): only the failing destination's
// probe took held keys, ten per probe, backing off between probes.
func TestAHeldKeyFollowsItsHeadToAHealthyDestination(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const downTopic, downARN = "down", "arn:aws:sns:us-east-1:000000000000:down"
	b.rec.failCall = func(events []*outbox.Event) error {
		if events[0].Topic == downTopic {
			return fmt.Errorf("destination down")
		}
		return nil
	}
	late, commit := b.lateRow(t, "k-late", testTopic) // the key's head, once committed
	for i := range 400 {                              // many keys held: a probe takes ten
		b.writeKey(t, fmt.Sprintf("k-%03d", i), downTopic, 1)
	}
	b.writeKey(t, "k-late", downTopic, 1) // held behind the failing destination until then
	r := b.relay(t, func(c *outbox.RelayConfig) {
		c.Topics = map[string]string{testTopic: testARN, downTopic: downARN}
		c.RescanInterval = 100 * time.Millisecond
		c.BackoffBase, c.BackoffMax = 5*time.Second, 5*time.Second // probes seconds apart
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = r.Run(ctx) }()
	defer func() { cancel(); <-done }()
	testwait.Until(t, "the destination is backed off", func() bool { return len(r.DestinationsDown()) == 1 })
	commit()
	require.True(t, waitFor(20*time.Second, func() bool { return b.rec.published(late.EventID) }),
		"a held key whose head became a healthy destination's row stayed held for the failing one")
	require.Equal(t, 1, b.rec.publishedKeys()["k-late"], "only the healthy row went out; the failing destination's waits")
}

// gatedPublisher makes calls to one destination wait (a slow or hanging destination) until
// open is called or the call's context ends, and passes everything else to rec at once.
type gatedPublisher struct {
	rec  *recorder
	dest string
	gate chan struct{}
	once sync.Once
	// waiting counts calls to dest in flight.
	waiting atomic.Int64
}

func (g *gatedPublisher) PublishBatch(ctx context.Context, dest string, events []*outbox.Event) []error {
	if dest == g.dest {
		g.waiting.Add(1)
		defer g.waiting.Add(-1)
		select {
		case <-g.gate:
		case <-ctx.Done():
			return outbox.CallFailed(len(events), ctx.Err())
		}
	}
	return g.rec.PublishBatch(ctx, dest, events)
}

func (g *gatedPublisher) open() { g.once.Do(func() { close(g.gate) }) }

// Scenarios 4 and 5: a slow but working destination, and a hanging one, under traffic to it
// and to a healthy destination, used to hold every pipeline: a round waited for its call to
// the slow destination, and two rounds called it before the first call ended. Healthy rows
// must go out while the slow destination's calls are still in flight; the slow one's rows go
// out, in order, once it answers (slow), or never while it hangs.
func TestASlowOrHangingDestinationDelaysNoHealthyKey(t *testing.T) {
	for _, hangs := range []bool{false, true} {
		name := map[bool]string{false: "slow", true: "hanging"}[hangs]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			const slowTopic, slowARN = "slow", "arn:aws:sns:us-east-1:000000000000:slow"
			gp := &gatedPublisher{rec: b.rec, dest: slowARN, gate: make(chan struct{})}
			r := b.relay(t, func(c *outbox.RelayConfig) {
				c.Publisher = gp
				c.Topics = map[string]string{testTopic: testARN, slowTopic: slowARN}
				c.PublishTimeout, c.Lease = time.Minute, 3*time.Minute // the gate, not a timeout, ends its calls
			})
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { defer close(done); _ = r.Run(ctx) }()
			defer func() { gp.open(); cancel(); <-done }()

			var healthy, slow []uuid.UUID
			for i := range 40 { // traffic to both, interleaved, as the slow one's calls hang
				slow = append(slow, b.writeKey(t, fmt.Sprintf("s-%02d", i%8), slowTopic, 1)[0].EventID)
				healthy = append(healthy, b.writeKey(t, fmt.Sprintf("h-%02d", i%8), testTopic, 1)[0].EventID)
				time.Sleep(20 * time.Millisecond)
			}
			allOut := func() bool {
				for _, id := range healthy {
					if !b.rec.published(id) {
						return false
					}
				}
				return true
			}
			ok := waitFor(40*time.Second, allOut)
			require.True(t, ok, "healthy rows waited for a %s destination's calls", name)
			require.Positive(t, gp.waiting.Load(), "the %s destination's calls were still in flight", name)
			for _, id := range slow {
				require.False(t, b.rec.published(id), "nothing of the %s destination was acknowledged yet", name)
			}
			if !hangs {
				gp.open() // it answers: every row goes out, each key's in order
				testwait.Until(t, "the slow destination's rows go out", func() bool {
					for _, id := range slow {
						if !b.rec.published(id) {
							return false
						}
					}
					return true
				})
			}
			b.rec.requireKeyOrder(t)
		})
	}
}

// slowPublisher answers every call, after delay.
type slowPublisher struct {
	rec   *recorder
	delay time.Duration
}

func (p slowPublisher) PublishBatch(ctx context.Context, dest string, events []*outbox.Event) []error {
	select {
	case <-time.After(p.delay):
	case <-ctx.Done():
		return outbox.CallFailed(len(events), ctx.Err())
	}
	return p.rec.PublishBatch(ctx, dest, events)
}

// A relay with one destination has nothing to isolate it from: a call slower than SlowCall
// (a loaded machine, a slow region) is waited for, never cut short and backed off as a
// failing destination's, even on a pool with no connection to spare for a detached round (the
// fleet's). Cutting used to turn every slow call into an outage whose backoff doubled with each
// call in flight: a tenant with a backlog then claimed nothing for seconds at a time.
func TestASlowOnlyDestinationIsNeverBackedOff(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pcfg, err := pgxpool.ParseConfig(b.pool.Config().ConnString())
	require.NoError(t, err)
	pcfg.MaxConns = 2 // the pipelines' own: no round can be detached
	pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	r, err := outbox.NewRelay(pool, outbox.RelayConfig{Publisher: slowPublisher{rec: b.rec, delay: 200 * time.Millisecond},
		Topics: map[string]string{testTopic: testARN}, Pipelines: 2, SlowCall: 50 * time.Millisecond,
		PollInterval: 20 * time.Millisecond, Lease: 30 * time.Second, PublishTimeout: 10 * time.Second, Logger: testLogger()})
	require.NoError(t, err)
	written := b.write(t, 40, 8)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = r.Run(ctx) }()
	defer func() { cancel(); <-done }()
	var down atomic.Bool
	allOut := func() bool {
		if len(r.DestinationsDown()) > 0 {
			down.Store(true)
		}
		for _, m := range written {
			if !b.rec.published(m.EventID) {
				return false
			}
		}
		return true
	}
	testwait.Until(t, "every row published", allOut)
	require.False(t, down.Load(), "the only destination, slow but answering, was backed off as failing")
	b.rec.requireKeyOrder(t)
}

// A pass polls for new rows every poll interval whatever its pipelines do: its pipelines used to
// poll only after a round of theirs ended, so while they waited for a round detached by a slow
// call, a row committed meanwhile was found only by the pass's next sweep (here an hour away)
// or the next pass. Its key's row must go out while the slow call is still in flight.
func TestAPassPollsWhileItWaitsForASlowCall(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const slowTopic, slowARN = "slow", "arn:aws:sns:us-east-1:000000000000:slow"
	gp := &gatedPublisher{rec: b.rec, dest: slowARN, gate: make(chan struct{})}
	r := b.relay(t, func(c *outbox.RelayConfig) {
		c.Publisher = gp
		c.Topics = map[string]string{testTopic: testARN, slowTopic: slowARN}
		c.PublishTimeout, c.Lease = time.Minute, 3*time.Minute // the gate, not a timeout, ends its call
		c.RescanInterval = time.Hour                           // no sweep during the pass: only a poll finds the new row
	})
	b.writeKey(t, "s", slowTopic, 1)
	var (
		passEnded atomic.Bool
		passErr   error
		done      = make(chan struct{})
	)
	go func() {
		defer close(done)
		_, passErr = r.RunPass(context.Background())
		passEnded.Store(true)
	}()
	defer func() { gp.open(); <-done }()
	testwait.Until(t, "the slow destination's call is in flight", func() bool { return gp.waiting.Load() > 0 })

	fresh := b.writeKey(t, "h", testTopic, 1)[0].EventID
	ok := waitFor(40*time.Second, func() bool { return b.rec.published(fresh) })
	require.True(t, ok, "a row committed during a pass waited for the pass's slow call (no poll while its pipelines waited)")
	require.Positive(t, gp.waiting.Load(), "the slow call was still in flight")
	require.False(t, passEnded.Load(), "the pass was still running")

	gp.open()
	<-done
	require.NoError(t, passErr)
	b.rec.requireKeyOrder(t)
}
