// Package testwait waits in tests for what a test awaits, never for a guess of how fast the
// machine is: a wait ends when its condition holds, and fails only shortly before the test
// binary's own deadline (go test -timeout) or, for [Progress], when what it watches stops
// changing for a long time. A test that passes alone passes on a machine whose cores are busy.
package testwait

import (
	"testing"
	"time"
)

// Poll is how often a condition is evaluated.
const Poll = 20 * time.Millisecond

// Grace is how long before the test binary's deadline a wait gives up, so the failure names
// what was awaited instead of go test's panic dump of every goroutine.
const Grace = 15 * time.Second

// Stall is how long [Progress] waits for what it watches to change before it fails: far
// beyond any pause a busy machine causes, and short of the test binary's deadline.
const Stall = 2 * time.Minute

// Until evaluates cond (on the test's goroutine, so cond may use require) until it returns
// true. It fails the test with what shortly before the test binary's deadline; with no
// deadline (go test -timeout 0) it waits as long as it takes.
func Until(t testing.TB, what string, cond func() bool) {
	t.Helper()
	stop, bounded := stopAt(t)
	for !cond() {
		if bounded && time.Now().After(stop) {
			t.Fatalf("still waiting, close to the test deadline: %s", what)
		}
		time.Sleep(Poll)
	}
}

// Progress evaluates step (on the test's goroutine) until it reports done. step also returns
// what it observed (a count of rows left, messages received): the test fails when that has
// not changed for [Stall], the work having stopped, or shortly before the test binary's
// deadline.
func Progress[T comparable](t testing.TB, what string, step func() (seen T, done bool)) {
	t.Helper()
	w := Watch[T](t, what)
	for {
		seen, done := step()
		if done {
			return
		}
		w.Check(seen)
		time.Sleep(Poll)
	}
}

// StallFactor scales a watched loop's stall window with its own pace: a loop fails only when
// what it watches has stood still for StallFactor times the longest pause it has already
// recovered from (and at least its base window). A machine that runs everything ten times
// slower stretches its waits ten times; a loop that stopped fails.
const StallFactor = 4

// Watcher bounds a loop the test drives itself (receive, process, delete) by its progress.
type Watcher[T comparable] struct {
	t       testing.TB
	what    string
	stop    time.Time
	bounded bool
	base    time.Duration // the stall window before any pause was seen
	started bool
	last    T
	changed time.Time
	longest time.Duration // the longest pause between two changes so far
}

// Watch returns a Watcher of what a loop awaits, with a stall window of [Stall]; call Check
// once per pass.
func Watch[T comparable](t testing.TB, what string) *Watcher[T] {
	return WatchFor[T](t, what, Stall)
}

// WatchFor returns a Watcher whose stall window starts at base (a liveness bound the
// guarantee under test rules out, such as a backoff of minutes) and grows with the loop's
// own pace: see [StallFactor]. A base that is not positive fails the test: a window of zero
// would fail a loop on its first pass.
func WatchFor[T comparable](t testing.TB, what string, base time.Duration) *Watcher[T] {
	t.Helper()
	if base <= 0 {
		t.Fatalf("testwait: the stall window of %q must be positive, not %s", what, base)
	}
	stop, bounded := stopAt(t)
	return &Watcher[T]{t: t, what: what, stop: stop, bounded: bounded, base: base}
}

// Window is the stall window in force: the base, or StallFactor times the longest pause seen
// so far, whichever is longer.
func (w *Watcher[T]) Window() time.Duration {
	return max(w.base, StallFactor*w.longest)
}

// Check takes what the loop observed this pass (a count of rows left, of messages applied):
// it fails the test when that has not changed for [Watcher.Window], or shortly before the test
// binary's deadline.
func (w *Watcher[T]) Check(seen T) {
	w.t.Helper()
	now := time.Now()
	switch {
	case !w.started:
		w.started, w.last, w.changed = true, seen, now
	case seen != w.last:
		w.longest = max(w.longest, now.Sub(w.changed))
		w.last, w.changed = seen, now
	}
	switch {
	case w.bounded && now.After(w.stop):
		w.t.Fatalf("still waiting, close to the test deadline: %s (last seen %v)", w.what, seen)
	case now.Sub(w.changed) > w.Window():
		w.t.Fatalf("no progress for %s: %s (stuck at %v)", now.Sub(w.changed).Round(time.Second), w.what, seen)
	}
}

// Receive returns the next value from ch, failing the test with what shortly before the test
// binary's deadline.
func Receive[T any](t testing.TB, what string, ch <-chan T) T {
	t.Helper()
	stop, bounded := stopAt(t)
	if !bounded {
		return <-ch
	}
	select {
	case v := <-ch:
		return v
	case <-time.After(time.Until(stop)):
		t.Fatalf("still waiting, close to the test deadline: %s", what)
		panic("unreachable")
	}
}

// stopAt returns when a wait gives up: Grace before the test binary's deadline (or half the
// time left, when that is shorter), and false when there is no deadline.
func stopAt(t testing.TB) (time.Time, bool) {
	d, ok := t.(interface{ Deadline() (time.Time, bool) })
	if !ok {
		return time.Time{}, false
	}
	deadline, ok := d.Deadline()
	if !ok {
		return time.Time{}, false
	}
	return deadline.Add(-min(Grace, time.Until(deadline)/2)), true
}
