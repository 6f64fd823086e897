package outbox

import (
	"container/heap"
	"math/rand/v2"
	"slices"
	"sync"
	"time"
)

// keyBook is one relay's schedule of partition keys: which keys may have rows to publish and when
// each may be claimed next. It is a cache of the database and never decides what is published or
// in which order: a round locks a key and reads its rows from the key's first pending row (see
// readSQL), whatever the book says. A key the book forgot is found again by the relay's sweep,
// which walks every pending key; a key the book wrongly thinks has work costs one read. What the
// book buys is that a round's cost follows the keys that have work: a key in backoff or
// quarantine, a key whose destination fails, or a long backlog behind one, is not looked at
// again until it may move.
//
// Its memory is bounded: at most maxKeys keys that can move (due, taken, waiting for a backoff
// or for their destination), and at most maxKeys parked keys besides. Keys that cannot move
// never crowd out keys that can: when the book is full, a key with new rows takes the place of
// a key held by a failing destination, or else of the key whose backoff ends last; the evicted
// key is found again by a later sweep.
type keyBook struct {
	mu      sync.Mutex
	keys    map[string]*bookKey
	due     dueHeap
	maxKeys int
	// parked are keys whose head row is quarantined: only a sweep or an operator action (reset)
	// revives them. Kept apart from keys (and bounded by maxKeys too), so that they never take
	// the place of a key that can move; a parked key the set has no room for costs one read
	// per new row of it, then is parked again.
	parked map[string]struct{}
	// held are the keys whose head row goes to a destination that fails as a whole, by
	// destination: rounds do not take them (their rows would only be deferred again); the
	// relay's probe of the destination takes a few, and all become due once it answers.
	held map[string]map[string]*bookKey
	// overflowed records that a key was dropped or evicted for lack of room: the relay sweeps
	// again once there is room.
	overflowed bool
	// changed is signalled (without blocking) whenever a key may have become claimable sooner.
	changed chan struct{}
}

// bookKey is the book's entry for one partition key.
type bookKey struct {
	key string
	// dueAt is when the key may be claimed again (now, or the end of a backoff).
	dueAt time.Time
	// tie orders keys due at the same time: random, so that relays sharing the outbox try
	// different keys first instead of all racing for the same ones.
	tie uint64
	// taken: one of this relay's rounds holds the key; dirty: a new row of it was seen meanwhile.
	taken, dirty bool
	// heldBy is the failing destination the key waits for ("" when none).
	heldBy string
	index  int // position in the due heap, -1 when not in it
}

// probeKeys is the most keys of a failing destination one probe takes: one call's worth.
const probeKeys = maxBatchEntries

// roundKeys is what a round is given: its keys and, for a probe, the failing destination it
// probes (it then holds only keys waiting for that one).
type roundKeys struct {
	keys  []string
	probe string
}

// keyVerdict is what a round learned about a key it was given.
type keyVerdict int

const (
	// verdictRelease: the round recorded nothing for the key (it failed, or stopped before
	// publishing it); claim it again at once.
	verdictRelease keyVerdict = iota
	// verdictDrained: every row the round read was published and the round read all there was.
	verdictDrained
	// verdictMore: rows were published and more remain; claim again at once.
	verdictMore
	// verdictWait: the key may not move before until (backoff).
	verdictWait
	// verdictParked: the key's head row is quarantined.
	verdictParked
	// verdictHeld: the key's next row goes to dest, which fails as a whole.
	verdictHeld
	// verdictElsewhere: another relay holds the key; forget it (a sweep or a new row brings it
	// back) instead of trying its lock again and again while that relay works through it.
	verdictElsewhere
)

// keyResult is a round's verdict on one key.
type keyResult struct {
	key     string
	verdict keyVerdict
	until   time.Time
	dest    string
}

func newKeyBook(maxKeys int) *keyBook {
	return &keyBook{keys: map[string]*bookKey{}, parked: map[string]struct{}{}, held: map[string]map[string]*bookKey{},
		maxKeys: maxKeys, changed: make(chan struct{}, 1)}
}

func (b *keyBook) signal() {
	select {
	case b.changed <- struct{}{}:
	default:
	}
}

// entry returns the key's entry, creating it (due now) when the book has room. With evict, a
// full book makes room by evicting a key that cannot move now (see keyBook).
func (b *keyBook) entry(key string, now time.Time, evict bool) *bookKey {
	if k := b.keys[key]; k != nil {
		return k
	}
	if len(b.keys) >= b.maxKeys && !(evict && b.evict(now)) {
		b.overflowed = true
		return nil
	}
	k := &bookKey{key: key, dueAt: now, tie: rand.Uint64(), index: -1}
	b.keys[key] = k
	heap.Push(&b.due, k)
	return k
}

// evict removes keys that cannot move now to make room: one key held by a failing destination
// if there is one, else the waiting keys whose backoff ends last (a hundredth of the book at a
// time, so that a book full of waiting keys is not scanned for every new key). It reports
// whether it made room.
func (b *keyBook) evict(now time.Time) bool {
	for _, keys := range b.held {
		for _, k := range keys {
			if k.taken {
				continue
			}
			b.unhold(k)
			delete(b.keys, k.key)
			b.overflowed = true
			return true
		}
	}
	var waiting []*bookKey
	for _, k := range b.due {
		if k.dueAt.After(now) {
			waiting = append(waiting, k)
		}
	}
	if len(waiting) == 0 {
		return false
	}
	slices.SortFunc(waiting, func(x, y *bookKey) int { return y.dueAt.Compare(x.dueAt) })
	for _, k := range waiting[:min(len(waiting), max(1, b.maxKeys/100))] {
		heap.Remove(&b.due, k.index)
		delete(b.keys, k.key)
	}
	b.overflowed = true
	return true
}

// sawRow records that key has a committed row for dest the relay has just noticed (a poll of
// new rows). A key held for another destination is made due: the row may be its new head (a
// late commit with a lower id), and a held key waits for a failing destination only while its
// head row is that destination's. If the head is still the failing destination's, the round
// that reads it holds the key again.
func (b *keyBook) sawRow(key, dest string, now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, parked := b.parked[key]; parked {
		return // behind a quarantined head: nothing can move until a sweep or reset
	}
	_, known := b.keys[key]
	k := b.entry(key, now, true)
	switch {
	case k == nil:
	case k.taken:
		k.dirty = true
	case !known:
		b.signal()
	case k.heldBy != "" && k.heldBy != dest:
		b.unhold(k)
		b.schedule(k, now, now)
	}
}

// headState is what a sweep saw at a key's first pending row.
type headState int

const (
	headClaimable headState = iota
	headBackingOff
	headQuarantined
	// headHeld: the head row's destination fails or is slow.
	headHeld
)

// sawHead records a key's head row for dest as a sweep found it. The head decides: a key
// waits for a failing destination only while its head row is that destination's (held keys
// follow their head), and a claimable head always finds room, evicting a key that cannot move
// now if the book is full (the evicted key's row says in the database when it may move, and a
// later sweep finds it then). Other heads only fill free room.
func (b *keyBook) sawHead(key string, state headState, availableAt time.Time, dest string, now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if k := b.keys[key]; k != nil && k.taken {
		return // the round that holds it knows better
	}
	if state == headQuarantined {
		if k := b.keys[key]; k != nil {
			b.unhold(k)
			if k.index >= 0 {
				heap.Remove(&b.due, k.index)
			}
			delete(b.keys, key)
		}
		b.park(key)
		return
	}
	delete(b.parked, key)
	k := b.entry(key, now, state == headClaimable)
	switch {
	case k == nil:
	case state == headHeld:
		if k.heldBy != dest {
			b.unhold(k)
			b.hold(k, dest) // the probe, or the slow call's end, decides when it may move
		}
	case state == headBackingOff:
		b.unhold(k)
		b.schedule(k, availableAt, now)
	default:
		b.unhold(k)
		b.schedule(k, now, now)
	}
}

// park records key as parked when there is room (see keyBook.parked).
func (b *keyBook) park(key string) {
	if len(b.parked) < b.maxKeys {
		b.parked[key] = struct{}{}
	}
}

// schedule makes k due at t; it wakes waiting rounds when t is not after now.
func (b *keyBook) schedule(k *bookKey, t, now time.Time) {
	if k.index >= 0 {
		k.dueAt = t
		heap.Fix(&b.due, k.index)
	} else {
		k.dueAt, k.tie = t, rand.Uint64()
		heap.Push(&b.due, k)
	}
	if !t.After(now) {
		b.signal()
	}
}

// hold makes k wait for dest, which fails as a whole.
func (b *keyBook) hold(k *bookKey, dest string) {
	if k.index >= 0 {
		heap.Remove(&b.due, k.index)
	}
	keys := b.held[dest]
	if keys == nil {
		keys = map[string]*bookKey{}
		b.held[dest] = keys
	}
	keys[k.key] = k
	k.heldBy = dest
}

// unhold takes k out of the keys waiting for a destination (k stays out of the due heap).
func (b *keyBook) unhold(k *bookKey) {
	if k.heldBy == "" {
		return
	}
	if keys := b.held[k.heldBy]; keys != nil {
		delete(keys, k.key)
		if len(keys) == 0 {
			delete(b.held, k.heldBy)
		}
	}
	k.heldBy = ""
}

// release makes every key waiting for dest due now: it answered.
func (b *keyBook) release(dest string, now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	keys := b.held[dest]
	delete(b.held, dest)
	for _, k := range keys {
		k.heldBy = ""
		if !k.taken {
			b.schedule(k, now, now)
		}
	}
}

// heldDestinations returns the destinations some keys wait for.
func (b *keyBook) heldDestinations() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]string, 0, len(b.held))
	for dest := range b.held {
		out = append(out, dest)
	}
	return out
}

// takeHeld hands a probe of dest up to probeKeys of the keys waiting for it.
func (b *keyBook) takeHeld(dest string) roundKeys {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := roundKeys{probe: dest}
	for _, k := range b.held[dest] {
		if k.taken {
			continue
		}
		k.taken = true
		out.keys = append(out.keys, k.key)
		if len(out.keys) == probeKeys {
			break
		}
	}
	return out
}

// take hands a round up to n due keys, oldest due first. Keys waiting for a failing destination
// are never among them: only that destination's probe takes them (takeHeld).
func (b *keyBook) take(n int, now time.Time) roundKeys {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out roundKeys
	for len(out.keys) < n && b.due.Len() > 0 && !b.due[0].dueAt.After(now) {
		k := heap.Pop(&b.due).(*bookKey)
		k.taken = true
		out.keys = append(out.keys, k.key)
	}
	return out
}

// settle takes back keys of a round with what the round learned about each.
func (b *keyBook) settle(results []keyResult, now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, r := range results {
		k := b.keys[r.key]
		if k == nil || !k.taken {
			continue
		}
		k.taken = false
		dirty := k.dirty
		k.dirty = false
		if r.verdict != verdictHeld || k.heldBy != r.dest {
			b.unhold(k)
		}
		switch {
		case r.verdict == verdictHeld:
			b.hold(k, r.dest)
		case r.verdict == verdictParked:
			delete(b.keys, k.key)
			b.park(k.key)
		case r.verdict == verdictWait:
			b.schedule(k, r.until, now)
		case r.verdict == verdictDrained && !dirty, r.verdict == verdictElsewhere && !dirty:
			delete(b.keys, k.key)
		default: // more, release, or drained with new rows seen meanwhile
			b.schedule(k, now, now)
		}
	}
}

// reset forgets every parked mark: an operator made quarantined (or published) rows pending
// again, so parked keys may move.
func (b *keyBook) reset(now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for key := range b.parked {
		if k := b.entry(key, now, false); k != nil {
			b.schedule(k, now, now)
		}
	}
	b.parked = map[string]struct{}{}
	b.signal()
}

// nextDue returns when the earliest waiting key becomes due, if any.
func (b *keyBook) nextDue() (time.Time, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.due.Len() > 0 {
		return b.due[0].dueAt, true
	}
	return time.Time{}, false
}

// takeOverflow reports whether a key was dropped for lack of room since the last call, and
// whether there is room again (so a sweep would find the dropped keys).
func (b *keyBook) takeOverflow() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.overflowed && len(b.keys) < b.maxKeys/2 {
		b.overflowed = false
		return true
	}
	return false
}

// size returns the number of keys in the book that can move (due, waiting, held or taken).
func (b *keyBook) size() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.keys)
}

// dueHeap orders waiting keys by due time, then at random.
type dueHeap []*bookKey

func (h dueHeap) Len() int { return len(h) }
func (h dueHeap) Less(i, j int) bool {
	if !h[i].dueAt.Equal(h[j].dueAt) {
		return h[i].dueAt.Before(h[j].dueAt)
	}
	return h[i].tie < h[j].tie
}
func (h dueHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}
func (h *dueHeap) Push(x any) {
	k := x.(*bookKey)
	k.index = len(*h)
	*h = append(*h, k)
}
func (h *dueHeap) Pop() any {
	old := *h
	k := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	k.index = -1
	return k
}
