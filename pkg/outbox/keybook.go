package outbox

import (
	"container/heap"
	"container/list"
	"math/rand/v2"
	"sync"
	"time"
)

// keyBook is one relay's schedule of partition keys: which keys have rows to publish, from which
// id on, and when each may be claimed next. It is a cache of the database, never the truth: a
// round locks a key and reads its rows again before publishing anything, and the relay's sweep
// walks every pending key of the table from time to time, so a key the book forgot or got wrong
// is found again. What the book buys is that a round's cost follows the keys that have work:
// a key in backoff or quarantine, or a long backlog behind one, is not looked at again until it
// may move.
type keyBook struct {
	mu      sync.Mutex
	keys    map[string]*bookKey
	due     dueHeap
	floors  *floorCache
	maxKeys int
	// overflowed records that a key was dropped because the book was full: the relay sweeps
	// again once there is room.
	overflowed bool
	// changed is signalled (without blocking) whenever a key may have become claimable sooner.
	changed chan struct{}
}

// bookKey is the book's entry for one partition key.
type bookKey struct {
	key string
	// floor: every row of the key with an id up to floor is published, as far as this relay
	// knows; a round reads the key's rows after it. 0 reads from the key's first pending row.
	floor int64
	// dueAt is when the key may be claimed again (now, or the end of a backoff).
	dueAt time.Time
	// tie orders keys due at the same time: random, so that relays sharing the outbox try
	// different keys first instead of all racing for the same ones.
	tie uint64
	// taken: one of this relay's rounds holds the key; dirty: new rows arrived meanwhile.
	taken, dirty bool
	// parked: the key's head row is quarantined; only a sweep or an operator action revives it.
	parked bool
	index  int // position in the due heap, -1 when not in it
}

// claimKey is a key handed to a round, with the id after which to read its rows.
type claimKey struct {
	key   string
	floor int64
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
	// verdictWait: the key may not move before until (backoff, destination down, held elsewhere).
	verdictWait
	// verdictParked: the key's head row is quarantined.
	verdictParked
)

// keyResult is a round's verdict on one key. lastPublished is the highest id of the key the
// round published and committed (0 when none).
type keyResult struct {
	key           string
	verdict       keyVerdict
	lastPublished int64
	until         time.Time
}

func newKeyBook(maxKeys, maxFloors int) *keyBook {
	return &keyBook{keys: map[string]*bookKey{}, floors: newFloorCache(maxFloors), maxKeys: maxKeys, changed: make(chan struct{}, 1)}
}

func (b *keyBook) signal() {
	select {
	case b.changed <- struct{}{}:
	default:
	}
}

// entry returns the key's entry, creating it (due now) when the book has room.
func (b *keyBook) entry(key string, now time.Time) *bookKey {
	if k := b.keys[key]; k != nil {
		return k
	}
	if len(b.keys) >= b.maxKeys {
		b.overflowed = true
		return nil
	}
	floor, _ := b.floors.take(key)
	k := &bookKey{key: key, floor: floor, dueAt: now, tie: rand.Uint64(), index: -1}
	b.keys[key] = k
	heap.Push(&b.due, k)
	return k
}

// sawRow records a committed row of key the relay has just noticed (a poll of new rows).
func (b *keyBook) sawRow(key string, id int64, now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	_, known := b.keys[key]
	k := b.entry(key, now)
	if k == nil {
		return
	}
	if id <= k.floor {
		// Committed after rows of its key with higher ids were published: read from it.
		k.floor = id - 1
	}
	switch {
	case k.taken:
		k.dirty = true
	case !known:
		b.signal()
	}
}

// headState is what a sweep saw at a key's first pending row.
type headState int

const (
	headClaimable headState = iota
	headBackingOff
	headQuarantined
)

// sawHead records a key's head row as a sweep found it: its id is the key's true first pending
// row, so the floor becomes exact.
func (b *keyBook) sawHead(key string, headID int64, state headState, availableAt, now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if k := b.keys[key]; k != nil && k.taken {
		return // the round that holds it knows better
	}
	k := b.entry(key, now)
	if k == nil {
		return
	}
	k.floor = headID - 1
	switch state {
	case headQuarantined:
		b.park(k)
	case headBackingOff:
		b.schedule(k, availableAt, now)
	default:
		b.schedule(k, now, now)
	}
}

// park takes k out of the schedule until a sweep or reset revives it.
func (b *keyBook) park(k *bookKey) {
	k.parked = true
	if k.index >= 0 {
		heap.Remove(&b.due, k.index)
	}
}

// schedule makes k due at t, taking it out of the parked state; it wakes waiting rounds when t
// is not after now.
func (b *keyBook) schedule(k *bookKey, t, now time.Time) {
	k.parked = false
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

// take hands up to n keys that are due at now to a round, oldest due first.
func (b *keyBook) take(n int, now time.Time) []claimKey {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []claimKey
	for len(out) < n && b.due.Len() > 0 && !b.due[0].dueAt.After(now) {
		k := heap.Pop(&b.due).(*bookKey)
		k.taken = true
		out = append(out, claimKey{key: k.key, floor: k.floor})
	}
	return out
}

// settle takes back the keys of a round with what the round learned.
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
		if r.lastPublished > k.floor {
			k.floor = r.lastPublished
		}
		switch {
		case r.verdict == verdictParked:
			b.park(k)
		case r.verdict == verdictWait:
			b.schedule(k, r.until, now)
		case r.verdict == verdictDrained && !dirty:
			delete(b.keys, k.key)
			b.floors.put(k.key, k.floor)
		default: // more, release, or drained with new rows seen meanwhile
			b.schedule(k, now, now)
		}
	}
}

// reset forgets every floor and parked mark: an operator made published or quarantined rows
// pending again, so each key must be read from its first pending row.
func (b *keyBook) reset(now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.floors = newFloorCache(b.floors.max)
	for _, k := range b.keys {
		k.floor = 0
		if k.parked {
			b.schedule(k, now, now)
		}
	}
	b.signal()
}

// nextDue returns when the earliest waiting key becomes due, if any key waits.
func (b *keyBook) nextDue() (time.Time, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.due.Len() == 0 {
		return time.Time{}, false
	}
	return b.due[0].dueAt, true
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

// size returns the number of keys in the book (due, waiting, taken or parked).
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

// floorCache remembers the floors of recently drained keys, so that a key's next rows are read
// after the rows the relay published instead of across their index entries, which VACUUM may
// not have removed yet. Least recently used entries go first.
type floorCache struct {
	max   int
	order *list.List // of floorEntry, most recent at the front
	byKey map[string]*list.Element
}

type floorEntry struct {
	key   string
	floor int64
}

func newFloorCache(max int) *floorCache {
	return &floorCache{max: max, order: list.New(), byKey: map[string]*list.Element{}}
}

func (c *floorCache) put(key string, floor int64) {
	if c.max <= 0 {
		return
	}
	if el := c.byKey[key]; el != nil {
		el.Value = floorEntry{key, floor}
		c.order.MoveToFront(el)
		return
	}
	c.byKey[key] = c.order.PushFront(floorEntry{key, floor})
	if c.order.Len() > c.max {
		last := c.order.Back()
		c.order.Remove(last)
		delete(c.byKey, last.Value.(floorEntry).key)
	}
}

// take removes and returns key's floor.
func (c *floorCache) take(key string) (int64, bool) {
	el := c.byKey[key]
	if el == nil {
		return 0, false
	}
	c.order.Remove(el)
	delete(c.byKey, key)
	return el.Value.(floorEntry).floor, true
}
