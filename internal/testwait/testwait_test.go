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
