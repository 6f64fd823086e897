package testwait

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// nearDeadline is a test whose binary's deadline is at, and which records its failure.
type nearDeadline struct {
	testing.TB
	at     time.Time
	failed string
}

func (n *nearDeadline) Helper()                     {}
func (n *nearDeadline) Deadline() (time.Time, bool) { return n.at, true }
func (n *nearDeadline) Fatalf(format string, args ...any) {
	n.failed = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// run runs f on its own goroutine, as the testing package runs a test, and waits for it.
func run(f func()) {
	done := make(chan struct{})
	go func() { defer close(done); f() }()
	<-done
}

func TestWaitsEndWhenTheirConditionHolds(t *testing.T) {
	var n atomic.Int64
	Until(t, "the counter reaches 3", func() bool { return n.Add(1) >= 3 })
	require.Equal(t, int64(3), n.Load())

	left := 5
	Progress(t, "the rows drain", func() (int, bool) { left--; return left, left == 0 })
	require.Zero(t, left)

	ch := make(chan int, 1)
	ch <- 7
	require.Equal(t, 7, Receive(t, "a value", ch))
}

func TestWaitsFailNamingWhatTheyAwaitedBeforeTheDeadline(t *testing.T) {
	fake := &nearDeadline{TB: t, at: time.Now().Add(200 * time.Millisecond)}
	run(func() { Until(fake, "the impossible", func() bool { return false }) })
	require.Equal(t, "still waiting, close to the test deadline: the impossible", fake.failed)
	require.True(t, time.Now().Before(fake.at.Add(time.Second)))

	fake = &nearDeadline{TB: t, at: time.Now().Add(200 * time.Millisecond)}
	run(func() { Receive(fake, "a value never sent", make(chan int)) })
	require.Equal(t, "still waiting, close to the test deadline: a value never sent", fake.failed)

	fake = &nearDeadline{TB: t, at: time.Now().Add(200 * time.Millisecond)}
	run(func() { Progress(fake, "rows that never drain", func() (int, bool) { return 4, false }) })
	require.Equal(t, "still waiting, close to the test deadline: rows that never drain (last seen 4)", fake.failed)
}

// stalled is a test without a deadline that records its failure.
type stalled struct {
	testing.TB
	failed string
}

func (s *stalled) Helper()                     {}
func (s *stalled) Deadline() (time.Time, bool) { return time.Time{}, false }
func (s *stalled) Fatalf(format string, args ...any) {
	s.failed = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// A watched loop fails when what it watches stands still for its window, never on the pass
// that first sees a change, and a zero window is refused rather than firing at once.
func TestWatcherFailsOnAStallNotOnAZeroWindow(t *testing.T) {
	fake := &stalled{TB: t}
	run(func() { WatchFor[int](fake, "nothing", 0) })
	require.Contains(t, fake.failed, "must be positive")

	fake = &stalled{TB: t}
	run(func() {
		w := WatchFor[int](fake, "rows that stop at 2", 50*time.Millisecond)
		for i := 0; ; i++ {
			w.Check(min(i, 2))
			time.Sleep(5 * time.Millisecond)
		}
	})
	require.Regexp(t, `^no progress for \S+: rows that stop at 2 \(stuck at 2\)$`, fake.failed)
}

// A slow loop's window grows with its pace: a pause four times shorter than the longest one
// it recovered from does not fail it, though it is longer than the base window.
func TestWatcherWindowGrowsWithTheLoopsPace(t *testing.T) {
	fake := &stalled{TB: t}
	done := false
	run(func() {
		w := WatchFor[int](fake, "a slow loop", 20*time.Millisecond)
		w.Check(0)
		time.Sleep(10 * time.Millisecond)
		w.Check(1)
		time.Sleep(15 * time.Millisecond) // a pause within the base window
		w.Check(2)
		require.GreaterOrEqual(t, w.Window(), 4*15*time.Millisecond)
		for end := time.Now().Add(40 * time.Millisecond); time.Now().Before(end); time.Sleep(time.Millisecond) {
			w.Check(2) // longer than the base window, shorter than the grown one
		}
		done = true
	})
	require.Empty(t, fake.failed)
	require.True(t, done)
}
