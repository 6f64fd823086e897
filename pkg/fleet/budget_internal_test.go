package fleet

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/pkg/outbox"
)

// TestBudgetGrantsInArrivalOrderAndNeverAboveItsSize: a request that does not fit waits, later
// requests do not pass it even when they would fit, and a request given up leaves the queue.
func TestBudgetGrantsInArrivalOrderAndNeverAboveItsSize(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newBudget(4)
	require.NoError(t, b.acquire(ctx, 3))

	big := make(chan struct{})
	go func() {
		require.NoError(t, b.acquire(ctx, 3)) // waits: 3 + 3 > 4
		close(big)
	}()
	require.Eventually(t, b.waiting, 10*time.Second, time.Millisecond)

	small := make(chan struct{})
	go func() {
		require.NoError(t, b.acquire(ctx, 1)) // would fit, but must not pass the waiting request
		close(small)
	}()
	time.Sleep(20 * time.Millisecond)
	select {
	case <-small:
		t.Fatal("a later request passed a waiting one")
	default:
	}

	cctx, cancel := context.WithCancel(ctx)
	gaveUp := make(chan error)
	go func() { gaveUp <- b.acquire(cctx, 2) }()
	cancel()
	require.ErrorIs(t, <-gaveUp, context.Canceled)

	b.release(3)
	<-big
	<-small
	used, peak := b.usage()
	require.Equal(t, 4, used)
	require.Equal(t, 4, peak, "never above the size")
	require.False(t, b.waiting(), "the request given up left the queue")
}

// TestBusyTurnsGiveWayOnlyBeyondTheirShare: turns past their share keep their connections
// while they hold at most BusyShare of the budget; beyond it, once a request has waited, the
// one that began first gives way, and only it.
func TestBusyTurnsGiveWayOnlyBeyondTheirShare(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newBudget(10)
	require.NoError(t, b.acquire(ctx, 10))
	now := time.Now()
	first, second, third := &busyTurn{n: 2, start: now.Add(-3 * time.Second)}, &busyTurn{n: 2, start: now.Add(-2 * time.Second)}, &busyTurn{n: 2, start: now.Add(-time.Second)}
	b.pastShare(second)
	b.pastShare(first)
	require.False(t, b.giveWay(first, 0, 0.5), "nobody waits")

	waited := make(chan error, 1)
	go func() { waited <- b.acquire(ctx, 2) }()
	require.Eventually(t, b.waiting, 10*time.Second, time.Millisecond)
	require.False(t, b.giveWay(first, 0, 0.5), "4 of 10 past their share: within half")
	b.pastShare(third)
	require.False(t, b.giveWay(first, time.Hour, 0.5), "the waiter has not waited long enough")
	require.False(t, b.giveWay(second, 0, 0.5), "not the longest-running")
	require.True(t, b.giveWay(first, 0, 0.5), "6 of 10 past their share: the first gives way")
	require.False(t, b.giveWay(second, 0, 0.5), "4 of 10 left past their share")
	b.turnEnded(first)
	b.release(2)
	require.NoError(t, <-waited)
	b.turnEnded(second)
	b.turnEnded(third)
	require.Empty(t, b.overtime)
}

func TestTenantsAreCheckedTogether(t *testing.T) {
	t.Parallel()
	got, err := checkTenants([]Tenant{
		{Name: "b", DatabaseURL: "postgres://u@db1:5433/b"},
		{Name: "a", DatabaseURL: "postgres://u@db1/a", Weight: 3},
		{Name: "Bad", DatabaseURL: "postgres://x/y"},
		{Name: "c"},
		{Name: "d", SecretARN: "arn:aws:secretsmanager:eu-west-1:1:secret:d"},
		{Name: "e", DatabaseURL: "postgres://x/e", Weight: MaxWeight + 1},
		{Name: "a", DatabaseURL: "postgres://u@db1/a2"},
	})
	require.ErrorContains(t, err, `tenant name "Bad"`)
	require.ErrorContains(t, err, "tenant c: set exactly one of DatabaseURL and SecretARN")
	require.ErrorContains(t, err, "tenant d: a tenant given by SecretARN needs Server")
	require.ErrorContains(t, err, "tenant e: weight 101 is outside 1 to 100")
	require.ErrorContains(t, err, "tenant a is listed twice")
	require.Equal(t, []Tenant{
		{Name: "a", DatabaseURL: "postgres://u@db1/a", Server: "db1:5432", Weight: 3},
		{Name: "b", DatabaseURL: "postgres://u@db1:5433/b", Server: "db1:5433", Weight: 1},
	}, got)
}

func TestShardsSplitTheFleet(t *testing.T) {
	t.Parallel()
	counts := make([]int, 4)
	for i := range 1000 {
		s := ShardOf("tenant-"+string(rune('a'+i%26))+time.Duration(i).String(), 4)
		require.Equal(t, s, ShardOf("tenant-"+string(rune('a'+i%26))+time.Duration(i).String(), 4), "stable")
		counts[s]++
	}
	for _, n := range counts {
		require.Greater(t, n, 150, "each shard gets a share: %v", counts)
	}
	require.Zero(t, ShardOf("anything", 1))
}

// TestParkedConnectionsAreAskedBackOldestFirst: parked connections stay counted; a request
// that does not fit asks back the longest parked, only as many as it lacks; a parked hold
// asked back cannot be resumed, one not asked back can; the request is granted once the
// connections asked back are released, never above the size.
func TestParkedConnectionsAreAskedBackOldestFirst(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newBudget(4)
	require.NoError(t, b.acquire(ctx, 1))
	first := b.park(1)
	require.NoError(t, b.acquire(ctx, 1))
	second := b.park(1)
	require.NoError(t, b.acquire(ctx, 2)) // fits beside the parked: 4 of 4
	used, _ := b.usage()
	require.Equal(t, 4, used, "parked connections stay counted")

	granted := make(chan struct{})
	go func() {
		require.NoError(t, b.acquire(ctx, 1)) // lacks 1: the oldest parked is asked back
		close(granted)
	}()
	select {
	case <-first.evict:
	case <-time.After(10 * time.Second):
		t.Fatal("the oldest parked connections were not asked back")
	}
	select {
	case <-second.evict:
		t.Fatal("more parked connections asked back than the request lacks")
	default:
	}
	require.False(t, b.resume(first), "connections asked back go back to the budget")
	select {
	case <-granted:
		t.Fatal("granted before the connections asked back were released")
	case <-time.After(20 * time.Millisecond):
	}
	b.releaseParked(first)
	<-granted
	used, peak := b.usage()
	require.Equal(t, 4, used)
	require.Equal(t, 4, peak, "never above the size")

	require.True(t, b.resume(second), "parked connections not asked back are the tenant's next turn's")
	b.release(1) // that turn ended without parking
	used, _ = b.usage()
	require.Equal(t, 3, used)
}

// BurstPipelines defaults to the relay's default Pipelines (or Relay.Pipelines when larger),
// bounds a turn's growth with the tenant's weight, and below Relay.Pipelines is refused.
func TestBurstPipelinesDefaultAndBound(t *testing.T) {
	t.Parallel()
	reg := Static{{Name: "a", DatabaseURL: "postgres://u@h/a"}}
	c, err := Config{Registry: reg}.withDefaults()
	require.NoError(t, err)
	require.Equal(t, 1, c.Relay.Pipelines)
	require.Equal(t, 2, c.BurstPipelines)
	require.Equal(t, 1, c.pipelinesOf(Tenant{Weight: 1}, 20))
	require.Equal(t, 2, c.burstOf(Tenant{Weight: 1}, 20))
	require.Equal(t, 6, c.burstOf(Tenant{Weight: 3}, 20))
	require.Equal(t, 2, c.burstOf(Tenant{Weight: 3}, 3), "at most the budget beside the activity poll")
	require.Equal(t, 16, c.burstOf(Tenant{Weight: 100}, 100), "at most the relay's 16")

	c, err = Config{Registry: reg, Relay: outbox.RelayConfig{Pipelines: 4}}.withDefaults()
	require.NoError(t, err)
	require.Equal(t, 4, c.BurstPipelines, "never below Relay.Pipelines")

	_, err = Config{Registry: reg, Relay: outbox.RelayConfig{Pipelines: 3}, BurstPipelines: 2}.withDefaults()
	require.ErrorContains(t, err, "BurstPipelines 2 is below Relay.Pipelines 3")
}

// A turn grows only on connections that are free while nobody waits, and what it gives back
// goes to the waiting request.
func TestBudgetLendsOnlyWhatNobodyWaitsFor(t *testing.T) {
	t.Parallel()
	b := newBudget(4)
	ctx := context.Background()
	require.NoError(t, b.acquire(ctx, 1))
	turn := &busyTurn{n: 1, start: time.Now()}
	require.False(t, b.grow(turn, 4), "more than is free")
	require.True(t, b.grow(turn, 2))
	require.Equal(t, 3, turn.n)
	used, _ := b.usage()
	require.Equal(t, 3, used)

	granted := make(chan error, 1)
	go func() { granted <- b.acquire(ctx, 2) }()
	require.Eventually(t, b.waiting, time.Second, time.Millisecond)
	require.False(t, b.grow(turn, 1), "a request waits: nothing is lent, though one is free")
	b.shrink(turn, 2)
	require.NoError(t, <-granted)
	require.Equal(t, 1, turn.n)
	used, peak := b.usage()
	require.Equal(t, 3, used)
	require.LessOrEqual(t, peak, 4)
}
