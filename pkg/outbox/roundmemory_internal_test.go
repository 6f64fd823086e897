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
	go func() { n, err := m.take(ctx, 30, 50); require.NoError(t, err); first <- n }()
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
