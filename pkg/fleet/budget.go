package fleet

import (
	"context"
	"slices"
	"sync"
	"time"
)

// budget is one server's connection budget: the fleet's only owner of how many connections
// it may hold on that server. Grants are first come, first served: a request that does not
// fit waits, and no later request passes it (so a heavy tenant cannot be starved by light
// ones, nor the reverse).
type budget struct {
	mu    sync.Mutex
	size  int
	used  int
	queue []*grant // waiting requests, oldest first
	peak  int      // the most connections granted at once
	// overtime are the turns past their share of time (Weight × Turn) that still hold their
	// connections, in the order they began.
	overtime []*busyTurn
	// parked are the connections tenants keep open between turns, oldest first: counted in
	// used until their tenant closes them, and asked back (evict) when a request does not fit.
	parked []*parked
}

// parked is one tenant's connections kept open after a turn that published: its next turn
// runs on them without new sessions, unless the budget wanted them back meanwhile.
type parked struct {
	n        int
	evict    chan struct{} // closed when the budget wants the connections back
	evicting bool
}

// busyTurn is a turn that holds n connections, begun at start.
type busyTurn struct {
	n     int
	start time.Time
}

// grant is one waiting request.
type grant struct {
	n     int
	ready chan struct{}
	since time.Time // when it began to wait
}

func newBudget(size int) *budget { return &budget{size: size} }

// acquire takes n connections (at most the budget's size), waiting its turn; it returns
// ctx's error when ctx ends first.
func (b *budget) acquire(ctx context.Context, n int) error {
	b.mu.Lock()
	if len(b.queue) == 0 && b.used+n <= b.size {
		b.take(n)
		b.mu.Unlock()
		return nil
	}
	g := &grant{n: n, ready: make(chan struct{}), since: time.Now()}
	b.queue = append(b.queue, g)
	b.grantWaiting() // asks parked connections back when the oldest request does not fit
	b.mu.Unlock()
	select {
	case <-g.ready:
		return nil
	case <-ctx.Done():
		b.mu.Lock()
		defer b.mu.Unlock()
		select {
		case <-g.ready: // granted meanwhile: give it back
			b.used -= n
			b.grantWaiting()
		default:
			for i, q := range b.queue {
				if q == g {
					b.queue = append(b.queue[:i], b.queue[i+1:]...)
					break
				}
			}
			b.grantWaiting() // the head may have changed
		}
		return ctx.Err()
	}
}

// release gives back n connections.
func (b *budget) release(n int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.used -= n
	b.grantWaiting()
}

// park keeps n connections of a turn that ended counted as used, until the tenant releases
// them (releaseParked) or its next turn resumes them; p.evict is closed when a request needs
// them.
func (b *budget) park(n int) *parked {
	b.mu.Lock()
	defer b.mu.Unlock()
	p := &parked{n: n, evict: make(chan struct{})}
	b.parked = append(b.parked, p)
	b.grantWaiting() // a request may already wait for them
	return p
}

// resume gives p's connections to its tenant's next turn; it reports false when the budget
// asked for them back (the tenant then releases them and waits its turn like any other).
func (b *budget) resume(p *parked) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if p.evicting {
		return false
	}
	b.parked = slices.DeleteFunc(b.parked, func(o *parked) bool { return o == p })
	return true
}

// releaseParked gives back p's connections, closed by its tenant.
func (b *budget) releaseParked(p *parked) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.parked = slices.DeleteFunc(b.parked, func(o *parked) bool { return o == p })
	b.used -= p.n
	b.grantWaiting()
}

// waiting reports whether a request waits.
func (b *budget) waiting() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.queue) > 0
}

// pastShare records that t has used its share of time and still holds its connections.
func (b *budget) pastShare(t *busyTurn) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !slices.Contains(b.overtime, t) {
		b.overtime = append(b.overtime, t)
		slices.SortStableFunc(b.overtime, func(x, y *busyTurn) int { return x.start.Compare(y.start) })
	}
}

// giveWay reports whether the turn t, past its share, must give its connections back now:
// a request has waited at least wait, the turns past their share hold more than busyShare of
// the budget, and t began before every other of them. Once it reports true, t is no longer
// counted past its share.
func (b *budget) giveWay(t *busyTurn, wait time.Duration, busyShare float64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.queue) == 0 || time.Since(b.queue[0].since) < wait || len(b.overtime) == 0 || b.overtime[0] != t {
		return false
	}
	held := 0
	for _, o := range b.overtime {
		held += o.n
	}
	if float64(held) <= busyShare*float64(b.size) {
		return false
	}
	b.overtime = b.overtime[1:]
	return true
}

// grow takes n more connections for the turn t when they are free and no request waits: the
// budget lends what nobody asked for. It reports whether it did.
func (b *budget) grow(t *busyTurn, n int) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.queue) > 0 || b.used+n > b.size {
		return false
	}
	b.take(n)
	t.n += n
	return true
}

// room reports whether n more connections are free with no request waiting (what grow would
// take now).
func (b *budget) room(n int) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.queue) == 0 && b.used+n <= b.size
}

// shrink gives back n of the turn t's connections, closed by its tenant.
func (b *budget) shrink(t *busyTurn, n int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	t.n -= n
	b.used -= n
	b.grantWaiting()
}

// turnEnded forgets t (its connections are about to be released).
func (b *budget) turnEnded(t *busyTurn) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.overtime = slices.DeleteFunc(b.overtime, func(o *busyTurn) bool { return o == t })
}

// usage returns the connections granted now and the most granted at once.
func (b *budget) usage() (used, peak int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used, b.peak
}

func (b *budget) take(n int) {
	b.used += n
	b.peak = max(b.peak, b.used)
}

// grantWaiting grants waiting requests in order while the oldest fits; when it does not, it
// asks parked connections back, the longest parked first, until enough are on their way.
// Called with mu held.
func (b *budget) grantWaiting() {
	for len(b.queue) > 0 && b.used+b.queue[0].n <= b.size {
		g := b.queue[0]
		b.queue = b.queue[1:]
		b.take(g.n)
		close(g.ready)
	}
	if len(b.queue) == 0 {
		return
	}
	short := b.used + b.queue[0].n - b.size
	for _, p := range b.parked {
		if p.evicting {
			short -= p.n
		}
	}
	for _, p := range b.parked {
		if short <= 0 {
			return
		}
		if !p.evicting {
			p.evicting = true
			close(p.evict)
			short -= p.n
		}
	}
}
