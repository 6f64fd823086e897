package outbox

import (
	"errors"
	"sync"
	"time"
)

// destinations tracks, per destination, whether it is failing as a whole (an outage, a wrong
// topic policy, a missing topic) or slow: a destination that fails a call while nothing sent to
// it succeeds is backed off as a whole, so its rows neither burn attempts nor hold the relay's
// rounds, and one call at a time probes it until it answers again. A destination with a call in
// flight for longer than slowAfter is slow: ordinary rounds send it nothing more until that
// call ends (its keys wait, held), so that its slowness costs only its own rows. Rows of other
// destinations are not affected.
type destinations struct {
	mu         sync.Mutex
	state      map[string]*destState
	base, max  time.Duration
	slowAfter  time.Duration
	jitterFrac func(time.Duration) time.Duration
}

type destState struct {
	// failures counts consecutive failed probes; 0 means healthy.
	failures int
	// retryAt is when the next probe may go out; probing: one is out (startProbe).
	retryAt time.Time
	probing bool
	// lastSuccess is when a call to the destination last had an acknowledged entry.
	lastSuccess time.Time
	// downSince is when the current outage began (zero when healthy); failedAt when its last
	// counted failure was recorded.
	downSince, failedAt time.Time
	lastErr             string
	// calls are the calls in flight to the destination, each with when it started.
	calls map[*callTrack]time.Time
}

// callTrack identifies one call in flight (callStarted, callEnded).
type callTrack struct{}

func newDestinations(base, max, slowAfter time.Duration, jitter func(time.Duration) time.Duration) *destinations {
	return &destinations{state: map[string]*destState{}, base: base, max: max, slowAfter: slowAfter, jitterFrac: jitter}
}

// callStarted records a call to dest going out and returns its handle for callEnded.
func (d *destinations) callStarted(dest string, now time.Time) *callTrack {
	d.mu.Lock()
	defer d.mu.Unlock()
	s := d.get(dest)
	if s.calls == nil {
		s.calls = map[*callTrack]time.Time{}
	}
	c := &callTrack{}
	s.calls[c] = now
	return c
}

// callEnded records that the call c to dest returned.
func (d *destinations) callEnded(dest string, c *callTrack) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if s := d.state[dest]; s != nil {
		delete(s.calls, c)
	}
}

// slowLocked reports whether s has a call in flight for longer than slowAfter (with d.mu held).
func (d *destinations) slowLocked(s *destState, now time.Time) bool {
	if d.slowAfter == 0 {
		return false // one destination: nothing to isolate it from (RelayConfig.slowAfter)
	}
	for _, started := range s.calls {
		if now.Sub(started) >= d.slowAfter {
			return true
		}
	}
	return false
}

func (d *destinations) get(dest string) *destState {
	s := d.state[dest]
	if s == nil {
		s = &destState{}
		d.state[dest] = s
	}
	return s
}

// admit decides whether a call to dest may go out now: a healthy destination admits every call;
// a failing one admits only its probe's calls (probe is the destination a probe round probes,
// "" in an ordinary round), so that an ordinary round never waits for a destination that may
// hang; a slow one admits none until its slow call ends. Otherwise it returns when the
// destination may be tried again (its next probe, or now for a slow one: its keys wait, held,
// until the slow call ends).
func (d *destinations) admit(dest, probe string) (bool, time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	s := d.get(dest)
	now := time.Now()
	switch {
	case dest == probe:
		return true, time.Time{}
	case s.failures > 0:
		return false, s.retryAt
	case d.slowLocked(s, now):
		return false, now
	}
	return true, time.Time{}
}

// startProbe reports whether dest fails as a whole and its probe is due and not out: the
// caller then owns the probe until succeeded, failedWhole or abandoned ends it. One probe per
// destination is out at a time, whichever of the relay's goroutines asks.
func (d *destinations) startProbe(dest string, now time.Time) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	s := d.get(dest)
	if s.failures == 0 || s.probing || now.Before(s.retryAt) {
		return false
	}
	s.probing = true
	return true
}

// succeeded records that dest answered a call: at least one entry was acknowledged, or the
// entries were refused one by one (the destination works; those rows are at fault).
func (d *destinations) succeeded(dest string, now time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	s := d.get(dest)
	*s = destState{lastSuccess: now, calls: s.calls}
}

// failedWhole records a call to dest, begun at started, whose every entry failed with a
// retryable error. It reports an outage, and when to probe again, when the failure is the
// destination's: nothing sent to it succeeded since since. Then the destination backs off as a
// whole. When other calls to it succeed, the rows are to blame and it reports false. A call
// begun before the outage's last failure was recorded (one of several in flight when it began)
// does not double the backoff again: only calls made since, the probes, count.
func (d *destinations) failedWhole(dest string, since, started, now time.Time, err error) (time.Time, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	s := d.get(dest)
	if err == nil {
		err = errors.New("every entry failed")
	}
	if s.failures == 0 && s.lastSuccess.After(since) {
		return time.Time{}, false
	}
	if s.failures == 0 {
		s.downSince = now
	} else if started.Before(s.failedAt) {
		return s.retryAt, true
	}
	s.failures++
	s.failedAt = now
	s.probing = false
	delay := d.base
	for i := 1; i < s.failures && delay < d.max; i++ {
		delay *= 2
	}
	delay = min(delay, d.max)
	s.retryAt = now.Add(delay/2 + d.jitterFrac(delay/2))
	s.lastErr = truncateText(err.Error(), 500)
	return s.retryAt, true
}

// healthy reports whether dest is neither backed off as a whole nor slow: ordinary rounds may
// call it.
func (d *destinations) healthy(dest string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	s := d.state[dest]
	return s == nil || s.failures == 0 && !d.slowLocked(s, time.Now())
}

// abandoned ends a probe that made no call (its round stopped first, or its keys had no row
// for dest any more): the next one may go out at once.
func (d *destinations) abandoned(dest string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if s := d.state[dest]; s != nil {
		s.probing = false
	}
}

// down returns the failing destinations with when each outage began and its last error.
func (d *destinations) down() []DestinationOutage {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []DestinationOutage
	for dest, s := range d.state {
		if s.failures > 0 {
			out = append(out, DestinationOutage{Destination: dest, Since: s.downSince, RetryAt: s.retryAt, LastError: s.lastErr})
		}
	}
	return out
}

// DestinationOutage describes a destination the relay currently backs off as a whole.
type DestinationOutage struct {
	// Destination is the topic ARN (or other destination) that fails.
	Destination string
	// Since is when its calls started failing; RetryAt when the next probe goes out.
	Since, RetryAt time.Time
	// LastError is the last failure, as the broker reported it.
	LastError string
}
