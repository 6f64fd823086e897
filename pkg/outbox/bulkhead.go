package outbox

import (
	"context"
	"errors"
	"sync"
	"time"
)

// Bulkheads: what keeps a slow or hanging destination from costing other destinations' rows
// time (docs/outbox.md, "Liveness"). A round waits for every call it made, so a round that
// called a slow destination would hold its pipeline, and with it every other key, for as long
// as that call takes. Three things stop that, all driven by RelayConfig.SlowCall:
//
//   - destinations.admit refuses a destination with a call in flight for SlowCall: ordinary
//     rounds send it nothing more, and its keys wait, held, until the call ends;
//   - a call in flight for SlowCall gives its PublishConcurrency slot back (send);
//   - the pipeline that runs a round with a slow call detaches the round and starts another
//     one (Relay.runRound): the slow round goes on, on its own connection, beside the
//     pipelines. Detached rounds are bounded by the connections the pool has beyond the
//     pipelines' (maxDetached); when none is left, the slow calls are cut short (errSlowCall)
//     and their destination is backed off and probed as a failing one.

// errSlowCall is the cause of a call cut short because it was slow and no pipeline could be
// spared for its round: its destination counts as failing (an outage), so one probe at a time
// calls it until it answers again.
var errSlowCall = errors.New("call cut short: its destination was slow (SlowCall) and every pipeline was needed for other destinations")

// slowAfter is how long a call may be in flight before its destination counts as slow; 0 when
// the relay routes to a single destination: its slowness then costs no other destination's
// rows time, and treating it as failing would only cost its own (a loaded machine's calls
// that take longer than SlowCall would be cut, backed off and probed for nothing).
func (c RelayConfig) slowAfter() time.Duration {
	if !c.manyDestinations() {
		return 0
	}
	return min(c.SlowCall, c.PublishTimeout)
}

// manyDestinations reports whether c routes rows to more than one destination.
func (c RelayConfig) manyDestinations() bool {
	one := c.DefaultTopic
	for _, d := range c.Topics {
		if one == "" {
			one = d
		}
		if d != one {
			return true
		}
	}
	return false
}

// PoolSize returns the connections a relay with c uses at most, for sizing its pool: one per
// pipeline's round, as many again for rounds detached from their pipeline by a slow call, and
// one for polling and sweeping. Probes of failing destinations take one each while they run.
// A smaller pool works, with fewer detached rounds: a slow call is then cut short sooner.
func (c RelayConfig) PoolSize() int {
	c = c.WithDefaults()
	return 2*c.Pipelines + 1
}

// maxDetached is how many rounds may run detached from their pipelines at once: the pool's
// connections beyond the pipelines' and one for polling and sweeping, at most one per pipeline.
func (r *Relay) maxDetached() int64 {
	return int64(max(0, min(int(r.pool.Config().MaxConns)-r.cfg.Pipelines-1, r.cfg.Pipelines)))
}

// tryDetach takes one of the detached rounds' places, if one is free.
func (r *Relay) tryDetach() bool {
	for {
		n := r.detached.Load()
		if n >= r.maxDetached() {
			return false
		}
		if r.detached.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// roundCalls tracks one round's publish calls in flight, so that the pipeline running the
// round learns when one has been in flight for slowAfter, and can cut the slow ones short.
// A probe round has none (nil): it runs beside the pipelines already.
type roundCalls struct {
	slowAfter time.Duration
	// slow is signalled (without blocking) each time a call becomes slow.
	slow chan struct{}

	mu    sync.Mutex
	calls map[*roundCall]struct{}
}

// roundCall is one call in flight of a round.
type roundCall struct {
	cancel context.CancelCauseFunc
	timer  *time.Timer
	slow   bool
}

func newRoundCalls(slowAfter time.Duration) *roundCalls {
	return &roundCalls{slowAfter: slowAfter, slow: make(chan struct{}, 1), calls: map[*roundCall]struct{}{}}
}

// begin registers a call about to go out under ctx and returns the context to make it with and
// the function to call when it returned. After slowAfter in flight, the call counts as slow:
// becameSlow runs (once) and the round's pipeline is signalled.
func (c *roundCalls) begin(ctx context.Context, becameSlow func()) (context.Context, func()) {
	if c == nil {
		return ctx, func() {}
	}
	cctx, cancel := context.WithCancelCause(ctx)
	call := &roundCall{cancel: cancel}
	c.mu.Lock()
	c.calls[call] = struct{}{}
	call.timer = time.AfterFunc(c.slowAfter, func() {
		c.mu.Lock()
		_, inFlight := c.calls[call]
		call.slow = inFlight
		c.mu.Unlock()
		if !inFlight {
			return
		}
		becameSlow()
		select {
		case c.slow <- struct{}{}:
		default:
		}
	})
	c.mu.Unlock()
	return cctx, func() {
		call.timer.Stop()
		c.mu.Lock()
		delete(c.calls, call)
		c.mu.Unlock()
		cancel(nil)
	}
}

// cutSlow cuts short every slow call of the round (their cause errSlowCall) and reports
// whether there was one.
func (c *roundCalls) cutSlow() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	cut := false
	for call := range c.calls {
		if call.slow {
			call.cancel(errSlowCall)
			cut = true
		}
	}
	return cut
}

// roundRun is a finished round's result.
type roundRun struct {
	st  Stats
	err error
}

// runRound runs a round on taken's keys for a pipeline and returns when the pipeline is free
// again: when the round ended (its result, ok), or when one of its calls became slow and the
// round could be detached (ok false: it goes on beside the pipelines and reports to detachedRan
// when it ends). A slow round that cannot be detached has its slow calls cut short, and is
// waited for.
func (r *Relay) runRound(ctx context.Context, taken roundKeys, wg *sync.WaitGroup, detachedRan func(Stats, error)) (Stats, error, bool) {
	slowAfter := r.dests.slowAfter // the configuration's, computed once (RelayConfig.slowAfter)
	if slowAfter == 0 {
		st, err := r.round(ctx, taken, nil)
		return st, err, true
	}
	calls := newRoundCalls(slowAfter)
	done := make(chan roundRun, 1)
	go func() {
		st, err := r.round(ctx, taken, calls)
		done <- roundRun{st, err}
	}()
	for {
		select {
		case res := <-done:
			return res.st, res.err, true
		case <-calls.slow:
			if r.tryDetach() {
				wg.Add(1)
				go func() {
					defer wg.Done()
					res := <-done
					r.detached.Add(-1)
					detachedRan(res.st, res.err)
				}()
				return Stats{}, nil, false
			}
			calls.cutSlow()
		}
	}
}
