package fleet

import (
	"context"
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

// waiting reports whether a request waits.
func (b *budget) waiting() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.queue) > 0
}

// oldestWait is how long the oldest waiting request has waited (0 when none waits).
func (b *budget) oldestWait() time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.queue) == 0 {
		return 0
	}
	return time.Since(b.queue[0].since)
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

// grantWaiting grants waiting requests in order while the oldest fits. Called with mu held.
func (b *budget) grantWaiting() {
	for len(b.queue) > 0 && b.used+b.queue[0].n <= b.size {
		g := b.queue[0]
		b.queue = b.queue[1:]
		b.take(g.n)
		close(g.ready)
	}
}
