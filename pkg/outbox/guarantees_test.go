package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/testwait"
	"github.com/sluicehq/sluice/pkg/outbox"
)

// The tests below are issue 20's items, each written from its text. Item 1 (per-key order under
// relay kills and late commits) is the fault simulator's (sim_test.go), which also checks the
// others under random schedules.

// Item 2: with the claim check on, a call whose every sent row fails with a retryable error while
// the first row's upload failed (so it was not sent) used to hand a nil error to the outage
// bookkeeping and panic in a publish goroutine, at every restart. Now nothing panics, and
// everything goes out once the store and the destination answer.
func TestClaimCheckUploadFailureBesideARetryableCallFailureNeverPanics(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	written := b.write(t, 6, 6) // six keys: one call
	store := &memoryStore{}
	failing := true
	var mu sync.Mutex
	store.fail = func(key string) error {
		mu.Lock()
		defer mu.Unlock()
		if failing && key == "events/"+written[0].EventID.String() {
			return errors.New("SlowDown")
		}
		return nil
	}
	b.rec.failCall = func([]*outbox.Event) error {
		mu.Lock()
		defer mu.Unlock()
		if failing {
			return errors.New("ServiceUnavailable")
		}
		return nil
	}
	r := b.relay(t, func(c *outbox.RelayConfig) {
		// The first row's payload is offloaded, the others are not.
		c.ClaimCheck = &outbox.ClaimCheck{Store: store, Bucket: "b", KeyPrefix: "events/", Threshold: 1024}
	})
	_, err := b.pool.Exec(ctx, `UPDATE outbox_event SET payload = $1 WHERE event_id = $2`,
		fmt.Sprintf(`{"pad":%q}`, strings.Repeat("x", 2000)), written[0].EventID)
	require.NoError(t, err)
	for range 3 {
		_, err := r.RunOnce(ctx)
		require.NoError(t, err)
		time.Sleep(60 * time.Millisecond)
	}
	mu.Lock()
	failing = false
	mu.Unlock()
	drainUntil(t, r, func() bool { return b.countWhere(t, "published_at IS NULL") == 0 })
	require.Zero(t, b.countWhere(t, "quarantined_at IS NOT NULL"))
}

// Item 4: a Replay of rows 1..10 of a key whose rows 11..20 were published goes out in id
// order, and RunOnce returns only when none of them is pending.
func TestReplayedRowsGoOutInOrderAndRunOnceDrainsThem(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	first := b.ids(t, b.writeKey(t, "k", testTopic, 10))
	time.Sleep(20 * time.Millisecond)
	cut := time.Now()
	b.writeKey(t, "k", testTopic, 10)
	r := b.relay(t)
	drainUntil(t, r, func() bool { return b.countWhere(t, "published_at IS NULL") == 0 })
	require.Equal(t, 20, b.rec.count())

	n, err := outbox.Replay(ctx, b.pool, outbox.ReplayFilter{Since: cut.Add(-time.Hour), Until: cut})
	require.NoError(t, err)
	require.Equal(t, int64(10), n)
	_, err = r.RunOnce(ctx)
	require.NoError(t, err)
	require.Zero(t, b.countWhere(t, "published_at IS NULL"), "RunOnce returned with replayed rows pending")

	b.rec.mu.Lock()
	defer b.rec.mu.Unlock()
	again := b.rec.byKey["k"][20:]
	require.Len(t, again, 10)
	for i, id := range again {
		require.Equal(t, first[i], id, "the replayed rows go out again in id order")
	}
}

// ids returns the row ids of written messages, in order.
func (b *bundle) ids(t *testing.T, written []outbox.Message) []int64 {
	t.Helper()
	out := make([]int64, len(written))
	for i, w := range written {
		require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT id FROM outbox_event WHERE event_id = $1`, w.EventID).Scan(&out[i]))
	}
	return out
}

// routedPublisher answers each destination with its own function, recording when each event
// was acknowledged.
type routedPublisher struct {
	mu     sync.Mutex
	acked  map[int64]time.Time
	routes map[string]func(ctx context.Context, events []*outbox.Event) []error
}

func (p *routedPublisher) PublishBatch(ctx context.Context, dest string, events []*outbox.Event) []error {
	errs := p.routes[dest](ctx, events)
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, e := range events {
		if errs[i] == nil {
			p.acked[e.ID] = time.Now()
		}
	}
	return errs
}

func (p *routedPublisher) ackedAt(id int64) (time.Time, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	at, ok := p.acked[id]
	return at, ok
}

func okAll(_ context.Context, events []*outbox.Event) []error { return make([]error, len(events)) }

// Item 5: a destination that answers only at PublishTimeout used to hold ordinary rounds (the
// probe went to whichever call asked first) and whole pipelines (each probe round took one).
// Now ordinary rounds never call a failing destination and its probe runs beside the
// pipelines: once a destination is known to fail, no row of a healthy destination waits out
// its hang, however often it is probed. Asserted without a clock: the destinations hang until
// the test releases them, and every healthy row is acknowledged while a probe of each hangs.
func TestHangingDestinationNeverDelaysHealthyKeys(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	hangsARN, hangs2ARN := "arn:aws:sns:us-east-1:000000000000:hangs", "arn:aws:sns:us-east-1:000000000000:hangs2"
	var (
		mu       sync.Mutex
		hanging  bool                  // false: the destinations fail at once (known to fail)
		release  = make(chan struct{}) // closed: the calls hanging now fail
		inFlight = map[string]int{}    // calls hanging on release, per destination
	)
	hangOf := func(dest string) func(context.Context, []*outbox.Event) []error {
		return func(ctx context.Context, events []*outbox.Event) []error {
			mu.Lock()
			if !hanging {
				mu.Unlock()
				return outbox.CallFailed(len(events), errors.New("ServiceUnavailable"))
			}
			inFlight[dest]++
			rel := release
			mu.Unlock()
			select {
			case <-rel:
			case <-ctx.Done():
			}
			mu.Lock()
			if rel == release { // not released: it ended by its context
				inFlight[dest]--
			}
			mu.Unlock()
			return outbox.CallFailed(len(events), errors.New("RequestTimeout"))
		}
	}
	probesHang := func() bool {
		mu.Lock()
		defer mu.Unlock()
		return inFlight[hangsARN] > 0 && inFlight[hangs2ARN] > 0
	}
	pub := &routedPublisher{acked: map[int64]time.Time{}, routes: map[string]func(context.Context, []*outbox.Event) []error{
		hangsARN: hangOf(hangsARN), hangs2ARN: hangOf(hangs2ARN), testARN: okAll,
	}}
	r := b.relay(t, func(c *outbox.RelayConfig) {
		c.Publisher = pub
		c.Topics = map[string]string{testTopic: testARN, "hangs": hangsARN, "hangs2": hangs2ARN}
		// A hang ends when the test releases it, never by a timeout during the test.
		c.PublishTimeout, c.Lease = 5*time.Minute, 10*time.Minute
		c.BackoffBase, c.BackoffMax = 200*time.Millisecond, 200*time.Millisecond
	})
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = r.Run(rctx) }()
	defer func() {
		mu.Lock()
		close(release)
		mu.Unlock()
		cancel()
		<-done
	}()

	// Two destinations with keys of their own become known to fail; from then on each call to
	// them hangs.
	for i := range 5 {
		b.writeKey(t, fmt.Sprintf("h%d", i), "hangs", 2)
		b.writeKey(t, fmt.Sprintf("g%d", i), "hangs2", 2)
	}
	testwait.Until(t, "both destinations known to fail", func() bool { return len(r.DestinationsDown()) == 2 })
	mu.Lock()
	hanging = true
	mu.Unlock()

	// Rounds of: a probe of each hangs; healthy rows are written and all acknowledged while
	// both still hang; the hangs are released (the probes fail), and the next probes hang.
	for round := range 4 {
		testwait.Until(t, fmt.Sprintf("round %d: a probe of each failing destination hangs", round), probesHang)
		var ids []int64
		for i := range 10 {
			ids = append(ids, b.ids(t, b.writeKey(t, fmt.Sprintf("ok%d", i%7), testTopic, 1))...)
		}
		testwait.Progress(t, fmt.Sprintf("round %d: every healthy row acknowledged", round), func() (int, bool) {
			acked := 0
			for _, id := range ids {
				if _, ok := pub.ackedAt(id); ok {
					acked++
				}
			}
			return acked, acked == len(ids)
		})
		require.True(t, probesHang(), "round %d: the healthy rows went out while both probes hung", round)
		mu.Lock()
		close(release)
		release, inFlight = make(chan struct{}), map[string]int{}
		mu.Unlock()
	}
	require.Len(t, r.DestinationsDown(), 2)
}

// Item 6: keys are released when their own lane ends, not when the round's slowest lane (a hot
// key's, MaxPerKey calls in a row) ends: an idle key's next row goes out while the hot key's
// lane is still publishing.
func TestHotKeysLaneDoesNotHoldTheOtherKeysOfItsRound(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	hot := b.ids(t, b.writeKey(t, "hot", testTopic, 10))
	b.writeKey(t, "idle", testTopic, 1)
	idleAcked := make(chan struct{})
	var once sync.Once
	b.rec.hold = func(events []*outbox.Event) {
		for _, e := range events {
			switch e.PartitionKey {
			case "hot":
				time.Sleep(300 * time.Millisecond)
			case "idle":
				once.Do(func() { close(idleAcked) })
			}
		}
	}
	r := b.relay(t)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = r.Run(rctx) }()
	defer func() { cancel(); <-done }()

	<-idleAcked // the round holding both keys published idle's row
	second := b.ids(t, b.writeKey(t, "idle", testTopic, 1))
	testwait.Until(t, "every row published", func() bool { return b.countWhere(t, "published_at IS NULL") == 0 })

	b.rec.mu.Lock()
	defer b.rec.mu.Unlock()
	pos := map[int64]int{}
	for i, e := range b.rec.received {
		if _, seen := pos[e.ID]; !seen {
			pos[e.ID] = i
		}
	}
	require.Less(t, pos[second[0]], pos[hot[len(hot)-1]],
		"the idle key's second row waited for the hot key's whole lane")
	require.Zero(t, b.rec.overlaps)
}

// Item 7: a call throttled as a whole used to count an attempt for each of its rows whenever
// another call succeeded: 80% of calls throttled quarantined rows. A whole-call failure is now
// never an attempt.
func TestThrottledCallsQuarantineNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.write(t, 300, 60)
	var mu sync.Mutex
	calls := 0
	b.rec.failCall = func([]*outbox.Event) error {
		mu.Lock()
		defer mu.Unlock()
		calls++
		if calls%5 != 0 {
			return errors.New("Throttling: Rate exceeded")
		}
		return nil
	}
	r := b.relay(t, func(c *outbox.RelayConfig) { c.MaxAttempts = 2 })
	drainUntil(t, r, func() bool { return b.countWhere(t, "published_at IS NULL") == 0 })
	require.Zero(t, b.countWhere(t, "quarantined_at IS NOT NULL"), "throttled rows were quarantined")
	require.Zero(t, b.countWhere(t, "attempts > 0"), "a throttle is no attempt of the rows")
	b.rec.requireKeyOrder(t)
}
