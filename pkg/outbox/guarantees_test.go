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
// its hang, however often it is probed.
func TestHangingDestinationNeverDelaysHealthyKeys(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	const timeout = 4 * time.Second
	hang := func(ctx context.Context, events []*outbox.Event) []error {
		<-ctx.Done()
		return outbox.CallFailed(len(events), ctx.Err())
	}
	pub := &routedPublisher{acked: map[int64]time.Time{}, routes: map[string]func(context.Context, []*outbox.Event) []error{
		"arn:aws:sns:us-east-1:000000000000:hangs":  hang,
		"arn:aws:sns:us-east-1:000000000000:hangs2": hang,
		testARN: okAll,
	}}
	r := b.relay(t, func(c *outbox.RelayConfig) {
		c.Publisher = pub
		c.Topics = map[string]string{testTopic: testARN, "hangs": "arn:aws:sns:us-east-1:000000000000:hangs",
			"hangs2": "arn:aws:sns:us-east-1:000000000000:hangs2"}
		c.PublishTimeout, c.BackoffBase, c.BackoffMax = timeout, 200*time.Millisecond, 200*time.Millisecond
	})
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = r.Run(rctx) }()
	defer func() { cancel(); <-done }()

	// Two hanging destinations with keys of their own. Discovering that a destination hangs
	// costs the rounds that first call it one timeout; from then on, while both back off and are
	// probed, healthy rows are written all along.
	for i := range 5 {
		b.writeKey(t, fmt.Sprintf("h%d", i), "hangs", 2)
		b.writeKey(t, fmt.Sprintf("g%d", i), "hangs2", 2)
	}
	testwait.Until(t, "both hanging destinations known to fail", func() bool { return len(r.DestinationsDown()) == 2 })
	type healthy struct {
		id      int64
		written time.Time
	}
	var rows []healthy
	for i := range 40 {
		w := b.ids(t, b.writeKey(t, fmt.Sprintf("ok%d", i%7), testTopic, 1))
		rows = append(rows, healthy{w[0], time.Now()})
		time.Sleep(150 * time.Millisecond)
	}
	var worst time.Duration
	for _, h := range rows {
		testwait.Until(t, "every healthy row acknowledged", func() bool { _, ok := pub.ackedAt(h.id); return ok })
		at, _ := pub.ackedAt(h.id)
		worst = max(worst, at.Sub(h.written))
	}
	require.Less(t, worst, timeout, "a healthy row waited out a hanging destination's timeout (worst %s)", worst)
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
