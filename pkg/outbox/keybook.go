package outbox

import (
	"container/heap"
	"container/list"
	"math/rand/v2"
	"slices"
	"sync"
	"time"
)

// keyBook is one relay's schedule of partition keys: which keys have rows to publish, from which
// id on, and when each may be claimed next. It is a cache of the database, never the truth: a
// round locks a key and reads its rows again before publishing anything, and the relay's sweep
// walks every pending key of the table from time to time, so a key the book forgot or got wrong
// is found again. What the book buys is that a round's cost follows the keys that have work:
// a key in backoff or quarantine, a key whose destination fails, or a long backlog behind one,
// is not looked at again until it may move.
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
	floors  *floorCache
	maxKeys int
	// parked are keys whose head row is quarantined: only a sweep or an operator action (reset)
	// revives them. Kept apart from keys (and bounded by maxKeys too), so that they never take
	// the place of a key that can move; a parked key the set has no room for costs one read
	// per new row of it, then is parked again.
	parked map[string]struct{}
	// held are the keys whose head row goes to a destination that fails as a whole, by
	// destination: they are not handed out (their rows would only be deferred again) except a
	// few at a time as the destination's probe, and all become due once it answers.
	held map[string]*heldDest
	// epoch is outbox_control.admin_epoch as of the book's floors: a round reads with the
	// epoch its keys were taken at, so floors set before an operator action are never trusted
	// after it (see readSQL).
	epoch int64
	// rowSeq counts rows the book was told of; a sweep applied from a snapshot older than a
	// key's last row never raises that key's floor above it.
	rowSeq uint64
	// overflowed records that a key was dropped or evicted for lack of room: the relay sweeps
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
	// taken: one of this relay's rounds holds the key; dirty: new rows arrived meanwhile, the
	// lowest of them after lateFloor (a row may commit after rows with higher ids went out).
	taken, dirty bool
	lateFloor    int64
	// heldBy is the failing destination the key waits for ("" when none).
	heldBy string
	// lastRowSeq is rowSeq when the book last heard of a row of the key.
	lastRowSeq uint64
	index      int // position in the due heap, -1 when not in it
}

// heldDest is the keys waiting for one failing destination and when to probe it.
type heldDest struct {
	keys    map[string]*bookKey
	probeAt time.Time
	// probing: a probe round holds some of its keys.
	probing bool
}

// probeKeys is the most keys of a failing destination one probe round takes: one call's worth.
const probeKeys = maxBatchEntries

// claimKey is a key handed to a round, with the id after which to read its rows.
type claimKey struct {
	key   string
	floor int64
}

// roundKeys is what a round is given: its keys, the admin epoch their floors belong to, and,
// for a probe round, the failing destination it probes (it then holds only that one's keys).
type roundKeys struct {
	keys  []claimKey
	epoch int64
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
	// verdictWait: the key may not move before until (backoff, held elsewhere).
	verdictWait
	// verdictParked: the key's head row is quarantined.
	verdictParked
	// verdictHeld: the key's next row goes to dest, which fails as a whole; probe it at until.
	verdictHeld
	// verdictElsewhere: another relay holds the key; forget it (a sweep or a new row brings it
	// back) instead of trying its lock again and again while that relay works through it.
	verdictElsewhere
)

// keyResult is a round's verdict on one key. lastPublished is the highest id of the key the
// round published and committed (0 when none).
type keyResult struct {
	key           string
	verdict       keyVerdict
	lastPublished int64
	until         time.Time
	dest          string
}

func newKeyBook(maxKeys, maxFloors int) *keyBook {
	return &keyBook{keys: map[string]*bookKey{}, parked: map[string]struct{}{}, held: map[string]*heldDest{},
		floors: newFloorCache(maxFloors), maxKeys: maxKeys, changed: make(chan struct{}, 1)}
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
	floor, _ := b.floors.take(key)
	k := &bookKey{key: key, floor: floor, dueAt: now, tie: rand.Uint64(), index: -1}
	b.keys[key] = k
	heap.Push(&b.due, k)
	return k
}

// evict removes keys that cannot move now to make room: one key held by a failing destination
// if there is one, else the waiting keys whose backoff ends last (a hundredth of the book at a
// time, so that a book full of waiting keys is not scanned for every new key). It reports
// whether it made room.
func (b *keyBook) evict(now time.Time) bool {
	for _, h := range b.held {
		for _, k := range h.keys {
			if k.taken {
				continue
			}
			b.unhold(k)
			b.drop(k)
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
		b.drop(k)
	}
	b.overflowed = true
	return true
}

// drop forgets k (not taken, in no heap), remembering its floor.
func (b *keyBook) drop(k *bookKey) {
	delete(b.keys, k.key)
	b.floors.put(k.key, k.floor)
}

// sawRow records a committed row of key the relay has just noticed (a poll of new rows).
func (b *keyBook) sawRow(key string, id int64, now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.rowSeq++
	if _, parked := b.parked[key]; parked {
		return // behind a quarantined head: nothing can move until a sweep or reset
	}
	_, known := b.keys[key]
	k := b.entry(key, now, true)
	if k == nil {
		return
	}
	k.lastRowSeq = b.rowSeq
	if id <= k.floor {
		// Committed after rows of its key with higher ids were published: read from it.
		k.floor = id - 1
	}
	switch {
	case k.taken:
		if !k.dirty || id-1 < k.lateFloor {
			k.lateFloor = id - 1
		}
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

// sweepSeq returns the row count a sweep records before it reads, for sawHead.
func (b *keyBook) sweepSeq() uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.rowSeq
}

// sawHead records a key's head row as a sweep found it (in a snapshot taken after the book had
// heard of seq rows): its id is the key's first pending row, so the floor becomes exact, unless
// the book heard of a row of the key since, which may have committed after the snapshot below
// the head. A sweep only fills free room: it never evicts (the keys it would evict for would be
// found again by the next sweep, and so on).
func (b *keyBook) sawHead(key string, headID int64, state headState, availableAt time.Time, seq uint64, now time.Time) {
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
	k := b.entry(key, now, false)
	if k == nil {
		return
	}
	if k.lastRowSeq > seq {
		k.floor = min(k.floor, headID-1)
	} else {
		k.floor = headID - 1
	}
	switch {
	case k.heldBy != "":
		// Its destination fails: the probe, not the sweep, decides when it may move.
	case state == headBackingOff:
		b.schedule(k, availableAt, now)
	default:
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

// hold makes k wait for dest, which fails as a whole, to be probed at probeAt.
func (b *keyBook) hold(k *bookKey, dest string, probeAt time.Time) {
	if k.index >= 0 {
		heap.Remove(&b.due, k.index)
	}
	h := b.held[dest]
	if h == nil {
		h = &heldDest{keys: map[string]*bookKey{}}
		b.held[dest] = h
	}
	h.keys[k.key] = k
	k.heldBy = dest
	if probeAt.After(h.probeAt) {
		h.probeAt = probeAt
	}
}

// unhold takes k out of the keys waiting for a destination (k stays out of the due heap).
func (b *keyBook) unhold(k *bookKey) {
	if k.heldBy == "" {
		return
	}
	if h := b.held[k.heldBy]; h != nil {
		delete(h.keys, k.key)
		if len(h.keys) == 0 && !h.probing {
			delete(b.held, k.heldBy)
		}
	}
	k.heldBy = ""
}

// release makes every key waiting for dest due now: it answered. Keys it had no room for are
// found by the next sweep (overflowed).
func (b *keyBook) release(dest string, now time.Time) {
	h := b.held[dest]
	if h == nil {
		return
	}
	delete(b.held, dest)
	for _, k := range h.keys {
		k.heldBy = ""
		if !k.taken {
			b.schedule(k, now, now)
		}
	}
}

// take hands a round its keys: a probe of a failing destination whose time has come (a few of
// its keys, alone in the round, so that a destination that hangs holds no other key), or else
// up to n due keys, oldest due first.
func (b *keyBook) take(n int, now time.Time) roundKeys {
	b.mu.Lock()
	defer b.mu.Unlock()
	for dest, h := range b.held {
		if h.probing || h.probeAt.After(now) || len(h.keys) == 0 {
			continue
		}
		h.probing = true
		out := roundKeys{epoch: b.epoch, probe: dest}
		for _, k := range h.keys {
			if k.taken {
				continue
			}
			k.taken = true
			out.keys = append(out.keys, claimKey{key: k.key, floor: k.floor})
			if len(out.keys) == probeKeys {
				break
			}
		}
		return out
	}
	out := roundKeys{epoch: b.epoch}
	for len(out.keys) < n && b.due.Len() > 0 && !b.due[0].dueAt.After(now) {
		k := heap.Pop(&b.due).(*bookKey)
		k.taken = true
		out.keys = append(out.keys, claimKey{key: k.key, floor: k.floor})
	}
	return out
}

// settle takes back the keys of a round with what the round learned. Floors are raised only
// when no operator action moved the epoch since the keys were taken.
func (b *keyBook) settle(taken roundKeys, results []keyResult, now time.Time) {
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
		if r.lastPublished > k.floor && taken.epoch == b.epoch {
			k.floor = r.lastPublished
		}
		if dirty && k.lateFloor < k.floor {
			k.floor = k.lateFloor // a row committed late below what was published
		}
		if r.verdict != verdictHeld {
			b.unhold(k)
		}
		switch {
		case r.verdict == verdictHeld:
			if k.heldBy != "" && k.heldBy != r.dest {
				b.unhold(k)
			}
			b.hold(k, r.dest, r.until)
		case r.verdict == verdictParked:
			delete(b.keys, k.key)
			b.park(k.key)
		case r.verdict == verdictWait:
			b.schedule(k, r.until, now)
		case r.verdict == verdictDrained && !dirty, r.verdict == verdictElsewhere && !dirty:
			b.drop(k)
		default: // more, release, or drained with new rows seen meanwhile
			b.schedule(k, now, now)
		}
	}
	if taken.probe != "" {
		if h := b.held[taken.probe]; h != nil {
			h.probing = false
			if len(h.keys) == 0 {
				delete(b.held, taken.probe)
			}
		}
	}
}

// releaseAnswered makes the keys of every held destination that healthy reports as answering
// again due now (a probe, from any round, succeeded).
func (b *keyBook) releaseAnswered(healthy func(dest string) bool, now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for dest := range b.held {
		if healthy(dest) {
			b.release(dest, now)
		}
	}
}

// reset forgets every floor and parked mark: an operator made published or quarantined rows
// pending again (the admin epoch moved to epoch), so each key must be read from its first
// pending row.
func (b *keyBook) reset(epoch int64, now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.epoch = epoch
	b.floors = newFloorCache(b.floors.max)
	for _, k := range b.keys {
		k.floor = 0
	}
	for key := range b.parked {
		if k := b.entry(key, now, false); k != nil {
			b.schedule(k, now, now)
		}
	}
	b.parked = map[string]struct{}{}
	b.signal()
}

// nextDue returns when the earliest waiting key, or the next probe of a failing destination,
// becomes due, if any.
func (b *keyBook) nextDue() (time.Time, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var at time.Time
	ok := false
	if b.due.Len() > 0 {
		at, ok = b.due[0].dueAt, true
	}
	for _, h := range b.held {
		if !h.probing && len(h.keys) > 0 && (!ok || h.probeAt.Before(at)) {
			at, ok = h.probeAt, true
		}
	}
	return at, ok
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
