package main

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/sluicehq/sluice/pkg/outbox"
)

// waitBook pairs events' commit times (when the producer's Commit returned) with the times the
// stub broker acknowledged them, for commit-to-acknowledgement latencies. Only the first
// acknowledgement of an event counts (the relay may publish an event twice). An acknowledgement
// is only appended to a log in the broker's call; the readers file the log into the map first
// (file), so that the book's cost lands when results are read, not in the relay's rounds.
type waitBook struct {
	mu        sync.Mutex
	committed map[uuid.UUID]time.Time
	acked     map[uuid.UUID]time.Time
	unfiled   []bookedAck // acknowledgements not yet in acked, in the order they were recorded
}

// bookedAck is one acknowledgement the book has not filed yet.
type bookedAck struct {
	id uuid.UUID
	at time.Time
}

func newWaitBook() *waitBook {
	return &waitBook{committed: map[uuid.UUID]time.Time{}, acked: map[uuid.UUID]time.Time{}}
}

// commit records that the events ids were committed at at.
func (b *waitBook) commit(at time.Time, ids ...uuid.UUID) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, id := range ids {
		b.committed[id] = at
	}
}

// ack records that the events ids were acknowledged at at (an event's first acknowledgement
// is the one that counts).
func (b *waitBook) ack(at time.Time, ids ...uuid.UUID) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, id := range ids {
		b.unfiled = append(b.unfiled, bookedAck{id, at})
	}
}

// file moves the unfiled acknowledgements into acked, each event's first kept. b.mu is held.
func (b *waitBook) file() {
	for _, a := range b.unfiled {
		if _, ok := b.acked[a.id]; !ok {
			b.acked[a.id] = a.at
		}
	}
	b.unfiled = b.unfiled[:0]
}

// committedCount returns how many events were committed.
func (b *waitBook) committedCount() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.committed)
}

// ackedCount returns how many distinct events were acknowledged.
func (b *waitBook) ackedCount() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.file()
	return len(b.acked)
}

// pending returns how many of ids are not acknowledged yet.
func (b *waitBook) pending(ids []uuid.UUID) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.file()
	n := 0
	for _, id := range ids {
		if _, ok := b.acked[id]; !ok {
			n++
		}
	}
	return n
}

// committedSince returns the ids, in their order, whose commit was recorded at or after t.
func (b *waitBook) committedSince(ids []uuid.UUID, t time.Time) []uuid.UUID {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []uuid.UUID
	for _, id := range ids {
		if c, ok := b.committed[id]; ok && !c.Before(t) {
			out = append(out, id)
		}
	}
	return out
}

// committedBetween returns the ids, in their order, whose commit was recorded in [from, to).
func (b *waitBook) committedBetween(ids []uuid.UUID, from, to time.Time) []uuid.UUID {
	var out []uuid.UUID
	for _, id := range b.committedSince(ids, from) {
		b.mu.Lock()
		c := b.committed[id]
		b.mu.Unlock()
		if c.Before(to) {
			out = append(out, id)
		}
	}
	return out
}

// waits returns the commit-to-acknowledgement time of each of ids that was acknowledged, in
// the order of ids, and how many were not. A wait is never negative: the broker can
// acknowledge an event a few microseconds before its producer's Commit call returns.
func (b *waitBook) waits(ids []uuid.UUID) (waits []time.Duration, missing int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.file()
	for _, id := range ids {
		c, okc := b.committed[id]
		a, oka := b.acked[id]
		if !okc || !oka {
			missing++
			continue
		}
		waits = append(waits, max(0, a.Sub(c)))
	}
	return waits, missing
}

// ackPublisher is the stub broker of the latency suites: each PublishBatch call waits Delay
// (one request's latency), then acknowledges every entry that the failure hooks do not
// refuse, and records in book when.
type ackPublisher struct {
	Delay time.Duration
	book  *waitBook
	// failCall, when set and returning an error, fails every entry of a call to dest.
	failCall func(dest string) error
	// failEvent, when set and returning an error, fails that entry.
	failEvent func(e *outbox.Event) error
	// delayOf, when set and returning true, gives a call to dest its own latency instead of
	// Delay (a slow destination; one longer than the relay's PublishTimeout never answers).
	delayOf func(dest string) (time.Duration, bool)

	calls, events, failures atomic.Int64
}

var _ outbox.Publisher = (*ackPublisher)(nil)

// PublishBatch implements outbox.Publisher.
func (p *ackPublisher) PublishBatch(ctx context.Context, dest string, events []*outbox.Event) []error {
	p.calls.Add(1)
	errs := make([]error, len(events))
	delay := p.Delay
	if p.delayOf != nil {
		if d, ok := p.delayOf(dest); ok {
			delay = d
		}
	}
	if err := sleepCtx(ctx, delay); err != nil {
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	if p.failCall != nil {
		if err := p.failCall(dest); err != nil {
			for i := range errs {
				errs[i] = err
			}
			p.failures.Add(int64(len(events)))
			return errs
		}
	}
	now := time.Now()
	acked := make([]uuid.UUID, 0, len(events))
	for i, e := range events {
		if p.failEvent != nil {
			if errs[i] = p.failEvent(e); errs[i] != nil {
				p.failures.Add(1)
				continue
			}
		}
		acked = append(acked, e.EventID)
	}
	p.events.Add(int64(len(acked)))
	if p.book != nil {
		p.book.ack(now, acked...)
	}
	return errs
}

// problemLog is a slog.Handler that counts the records at Warn level and above (a relay's
// failed rounds, polls and sweeps, and quarantined rows) and keeps the first few messages.
type problemLog struct {
	mu    sync.Mutex
	count map[string]int
	first []string
}

var _ slog.Handler = (*problemLog)(nil)

func newProblemLog() *problemLog { return &problemLog{count: map[string]int{}} }

func (h *problemLog) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }

func (h *problemLog) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.count[r.Message]++
	if len(h.first) < 3 {
		msg := r.Message
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "error" {
				msg += ": " + a.Value.String()
				return false
			}
			return true
		})
		h.first = append(h.first, msg)
	}
	return nil
}

func (h *problemLog) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *problemLog) WithGroup(string) slog.Handler      { return h }

// samples returns the first few records logged, each with its error's text.
func (h *problemLog) samples() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.first)
}

// counts returns how often each message was logged.
func (h *problemLog) counts() map[string]int {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make(map[string]int, len(h.count))
	for k, v := range h.count {
		out[k] = v
	}
	return out
}
