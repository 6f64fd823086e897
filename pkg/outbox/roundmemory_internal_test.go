package outbox

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// A round takes what is free when it holds at least one payload, waits otherwise, behind the
// rounds already waiting; what a round did not read goes back at once; a waiter whose context
// ends leaves the queue and the next one is served.
func TestRoundMemorySharesInOrderAndGivesBackWhatWasNotRead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	m := NewRoundMemory(100)
	got, err := m.take(ctx, 30, 80)
	require.NoError(t, err)
	require.Equal(t, 80, got)
	got2, err := m.take(ctx, 10, 80)
	require.NoError(t, err)
	require.Equal(t, 20, got2, "what is free, since it holds one payload")

	first := make(chan int, 1)
	go func() {
		n, err := m.take(ctx, 30, 50)
		if err != nil {
			n = -1
		}
		first <- n
	}()
	cctx, cancel := context.WithCancel(ctx)
	waitQueued(t, m, 1)
	second := make(chan error, 1)
	go func() { _, err := m.take(cctx, 10, 10); second <- err }()
	waitQueued(t, m, 2)
	cancel()
	require.ErrorIs(t, <-second, context.Canceled)

	m.read(80, 25) // the first round read 25 of its 80: 55 back at once
	require.Equal(t, 50, <-first)
	st := m.Stats()
	require.Equal(t, 25+20+50, st.Reserved)
	require.Equal(t, 25, st.Loaded)
	require.Equal(t, int64(2), st.Waits)
	m.done(25, true)
	m.done(20, false)
	m.done(50, false)
	st = m.Stats()
	require.Zero(t, st.Reserved)
	require.Zero(t, st.Loaded)
	require.Equal(t, 100, st.PeakReserved)
}

func waitQueued(t *testing.T, m *RoundMemory, n int) {
	t.Helper()
	require.Eventually(t, func() bool {
		m.mu.Lock()
		defer m.mu.Unlock()
		return len(m.queue) == n
	}, 10e9, 1e6)
}

// A relay's round asks the shared budget for twice what its last round read (at least 1 MiB,
// at most MaxRoundBytes), plus one largest message: quiet relays' rounds take little, and a
// backlog's rounds double their budget round by round.
func TestRoundShareFollowsWhatTheLastRoundRead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const least = 256 << 10
	r := &Relay{cfg: RelayConfig{MaxRoundBytes: 16 << 20, RoundMemory: NewRoundMemory(64 << 20)}, readBytes: least}
	for _, c := range []struct{ lastRead, budget int }{
		{0, 1 << 20}, {100 << 10, 1 << 20}, {900 << 10, 1800 << 10}, {10 << 20, 16 << 20},
	} {
		r.lastRead.Store(int64(c.lastRead))
		share, budget, err := r.takeRoundShare(ctx)
		require.NoError(t, err)
		require.Equal(t, c.budget, budget, "after a round that read %d bytes", c.lastRead)
		require.Equal(t, c.budget+least-1, share.took)
		share.loaded([]*claimedRow{{Event: Event{Payload: make([]byte, 5000)}, loaded: true}})
		require.EqualValues(t, 5000, r.lastRead.Load())
		share.release()
	}
	require.Zero(t, r.cfg.RoundMemory.Stats().Reserved)
}
