package outbox

import (
	"context"
	"fmt"
	"sync"
)

// RoundMemory is a budget of payload bytes shared by the rounds of every relay given it
// (RelayConfig.RoundMemory): one process that runs many relays, such as a fleet's (pkg/fleet)
// with a relay per busy tenant, bounds the payloads all their rounds hold at once, where
// MaxRoundBytes bounds one round's.
//
// Before it reads, a round takes its share: a byte budget of twice what its relay's last round
// read (at least 1 MiB, at most MaxRoundBytes) plus room for the one payload a round may read
// past its budget (the largest message the relay reads), or what is free when that is less but
// still holds one such payload; otherwise it waits, after the rounds already waiting (first
// come, first served). It reads payloads within what it took, gives back at once what
// it took and did not read, and the rest when it ends. So the payload bytes the rounds hold
// never exceed the budget, and a round never waits for a round that waits. A budget smaller
// than the largest message a relay reads is taken whole by each of its rounds, which then read
// one row: a single message larger than the budget still goes out alone.
type RoundMemory struct {
	limit int

	mu       sync.Mutex
	reserved int // bytes taken by rounds in flight
	loaded   int // payload bytes the rounds in flight read (at most reserved)
	peakRes  int
	peakLoad int
	waits    int64
	queue    []*memoryWaiter
}

type memoryWaiter struct {
	least, want int
	got         int
	ready       chan struct{}
}

// NewRoundMemory returns a budget of bytes payload bytes, to share between relays by giving it
// to each one's RelayConfig.RoundMemory; it should hold at least one message of the largest
// size the relays read (see RoundMemory). A bytes below 1 is taken as 1.
func NewRoundMemory(bytes int) *RoundMemory {
	return &RoundMemory{limit: max(bytes, 1)}
}

// RoundMemoryStats are a RoundMemory's figures.
type RoundMemoryStats struct {
	// Limit is the budget in bytes.
	Limit int
	// Reserved is what the rounds in flight took now; PeakReserved the most they took at once.
	Reserved, PeakReserved int
	// Loaded is the payload bytes the rounds in flight read now; PeakLoaded the most at once.
	Loaded, PeakLoaded int
	// Waits counts the rounds that waited for memory.
	Waits int64
}

// Stats returns the budget's figures now.
func (m *RoundMemory) Stats() RoundMemoryStats {
	m.mu.Lock()
	defer m.mu.Unlock()
	return RoundMemoryStats{Limit: m.limit, Reserved: m.reserved, PeakReserved: m.peakRes, Loaded: m.loaded, PeakLoaded: m.peakLoad, Waits: m.waits}
}

// take waits until at least least bytes are free and no earlier round waits, then takes
// min(want, free) and returns it.
func (m *RoundMemory) take(ctx context.Context, least, want int) (int, error) {
	m.mu.Lock()
	if len(m.queue) == 0 && m.limit-m.reserved >= least {
		got := m.grantLocked(least, want)
		m.mu.Unlock()
		return got, nil
	}
	w := &memoryWaiter{least: least, want: want, ready: make(chan struct{})}
	m.queue = append(m.queue, w)
	m.waits++
	m.mu.Unlock()
	select {
	case <-w.ready:
		return w.got, nil
	case <-ctx.Done():
		m.mu.Lock()
		defer m.mu.Unlock()
		select {
		case <-w.ready: // granted meanwhile: give it back
			m.reserved -= w.got
			m.wakeLocked()
		default:
			for i, q := range m.queue {
				if q == w {
					m.queue = append(m.queue[:i], m.queue[i+1:]...)
					break
				}
			}
			m.wakeLocked() // the next one may fit now
		}
		return 0, ctx.Err()
	}
}

func (m *RoundMemory) grantLocked(least, want int) int {
	got := max(least, min(want, m.limit-m.reserved))
	m.reserved += got
	m.peakRes = max(m.peakRes, m.reserved)
	return got
}

// wakeLocked grants the waiting rounds in order while the first one fits.
func (m *RoundMemory) wakeLocked() {
	for len(m.queue) > 0 && m.limit-m.reserved >= m.queue[0].least {
		w := m.queue[0]
		m.queue = m.queue[1:]
		w.got = m.grantLocked(w.least, w.want)
		close(w.ready)
	}
}

// read records that a round which took took bytes read loaded payload bytes (loaded ≤ took):
// it gives back the difference at once and keeps loaded until done.
func (m *RoundMemory) read(took, loaded int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.reserved -= took - loaded
	m.loaded += loaded
	m.peakRes = max(m.peakRes, m.reserved)
	m.peakLoad = max(m.peakLoad, m.loaded)
	m.wakeLocked()
}

// done gives back what a round kept (read's loaded), or what it took when it never read.
func (m *RoundMemory) done(kept int, read bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.reserved -= kept
	if read {
		m.loaded -= kept
	}
	m.wakeLocked()
}

// roundShare is one round's part of a RoundMemory (nil: no shared budget).
type roundShare struct {
	m          *RoundMemory
	r          *Relay
	took, kept int
	read       bool
}

// roundShareFloor is the least byte budget a round with a shared RoundMemory asks for (or
// MaxRoundBytes, when smaller), whatever its relay's last round read.
const roundShareFloor = 1 << 20

// takeRoundShare takes a round's share of m before it reads: a byte budget of twice what the
// relay's last round read (at least roundShareFloor, at most MaxRoundBytes), plus readBytes − 1
// for the one payload a read may take past its budget; or what is free, when that still holds
// readBytes (the whole budget, when smaller); else it waits. Asking for what the relay needs,
// not its most, lets many quiet relays' rounds claim at once, while a backlog's rounds double
// their budget round by round up to MaxRoundBytes. It returns the byte budget the round's read
// is given (readSQL's $3): payloads are read while those before stay under it, so the bytes
// read stay within the share.
func (r *Relay) takeRoundShare(ctx context.Context) (*roundShare, int, error) {
	m := r.cfg.RoundMemory
	if m == nil {
		return nil, r.cfg.MaxRoundBytes, nil
	}
	least := min(max(r.readBytes, 1), m.limit)
	budget := min(r.cfg.MaxRoundBytes, max(2*int(r.lastRead.Load()), roundShareFloor))
	got, err := m.take(ctx, least, budget+least-1)
	if err != nil {
		return nil, 0, fmt.Errorf("relay round: wait for round memory: %w", err)
	}
	return &roundShare{m: m, r: r, took: got, kept: got}, got - least + 1, nil
}

// loaded records the payload bytes the round read of rows.
func (s *roundShare) loaded(rows []*claimedRow) {
	if s == nil {
		return
	}
	n := 0
	for _, c := range rows {
		if c.loaded {
			n += len(c.Payload)
		}
	}
	s.m.read(s.took, n) // n ≤ took by readSQL's budget; counted as read either way
	s.kept, s.read = n, true
	s.r.lastRead.Store(int64(n))
}

// release gives the share back (the round ended).
func (s *roundShare) release() {
	if s == nil {
		return
	}
	s.m.done(s.kept, s.read)
}
