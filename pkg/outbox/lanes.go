package outbox

import (
	"sync"
	"time"
)

// outcome is what happened to one claimed row in a round.
type outcome struct {
	event *Event
	row   *claimedRow
	// dest is the destination (see ParseDestination), or unpublishable says why the row cannot be sent
	// at all (unknown topic, too large, unreadable payload); size is the message's wire size.
	dest          string
	unpublishable error
	size          int
	// offload: the payload goes to the claim check's store and the message carries a pointer.
	offload bool
	// done: the broker acknowledged it. err: the attempt failed, for the reason kind says.
	// Neither: not attempted.
	done bool
	err  error
	kind failKind
	// deferredUntil: not attempted because its destination backs off until then.
	deferredUntil time.Time
	// afterFailure: not attempted because an earlier row of its key failed.
	afterFailure *outcome
	// overtook: acknowledged (done) in a call that failed, or did not answer, the earlier row
	// of its key it names, which a destination that keeps a key's order in a call
	// (Limits.KeyOrderInCall) promises never to do. The row is published all the same (the
	// broker has it): the relay counts it (Stats.OrderViolations) and logs it as an error.
	overtook *outcome
	// Set when the outcome is recorded: the failed row was quarantined, or may be tried again
	// at retryAt.
	quarantined bool
	retryAt     time.Time
}

// lane is the claimed rows of one partition key, published strictly in order: a call carries
// its next row (or, where the destination keeps a key's order in a call, its next rows) only
// after every earlier row was acknowledged.
type lane struct {
	plan *keyPlan
	rows []*outcome
	next int
	// ended: the lane will send nothing more (drained, failed, deferred, or the round stopped).
	ended bool
}

func (l *lane) current() *outcome { return l.rows[l.next] }

// failKind says whose failure a failed entry is, which decides whether it counts as an attempt
// of the row.
type failKind int

const (
	// failRow: the destination answered and refused this entry (or the row cannot be sent at
	// all): an attempt of the row, which backs off or is quarantined.
	failRow failKind = iota
	// failCall: the call failed as a whole (a throttle, a timeout, a 5xx) while the destination
	// works for other calls: not an attempt of its rows, which back off briefly.
	failCall
	// failOutage: the destination fails as a whole: not an attempt; the destination backs off
	// and its keys wait for its probe.
	failOutage
)

// fail records err for the lane's current row and ends the lane: the rows behind it wait. An
// outage (the destination's failure) is retried when the destination is, at retryAt.
func (l *lane) fail(err error, kind failKind, retryAt time.Time) {
	cur := l.current()
	cur.err, cur.kind = err, kind
	if kind == failOutage {
		cur.deferredUntil = retryAt
	}
	for _, later := range l.rows[l.next+1:] {
		later.afterFailure = cur
	}
	l.next = len(l.rows)
}

// laneSet schedules one round's publish calls. Each call carries the next row of as many lanes
// as its destination takes in a call (Limits: entries and bytes) that share that destination; a
// lane is never in two calls at once and its next rows go out only after the previous ones were
// acknowledged, so a key's rows reach the broker in id order and a failed row is never overtaken
// by a later row of its key. Where the destination keeps a key's order inside one call
// (Limits.KeyOrderInCall), a call carries several consecutive rows of a lane, and finish
// acknowledges them only up to the first that failed. Workers loop on next and finish.
type laneSet struct {
	mu       sync.Mutex
	cond     *sync.Cond
	lanes    []*lane
	ready    []*lane
	inFlight int
	// limits gives each destination's limits of one call.
	limits func(dest string) Limits
	// admit gates calls by destination (destinations.admit).
	admit func(dest string) (bool, time.Time)
	// onEnd is told of each lane as soon as it ends, with the set's lock held: the round
	// records the key's outcomes and releases it then, whatever other lanes still do.
	onEnd func(*lane)
	// onOvertake, when set, is told (with the set's lock held) of each row a destination
	// acknowledged after failing an earlier row of its key in the same call.
	onOvertake func(later, earlier *outcome)
}

// entry is one row of a call: lane's row o.
type entry struct {
	lane *lane
	o    *outcome
}

// newLaneSet makes a lane of each key plan with rows to send.
func newLaneSet(plans []*keyPlan, limits func(string) Limits, admit func(string) (bool, time.Time), onEnd func(*lane)) *laneSet {
	s := &laneSet{limits: limits, admit: admit, onEnd: onEnd}
	s.cond = sync.NewCond(&s.mu)
	for _, kp := range plans {
		if len(kp.lane) > 0 {
			l := &lane{plan: kp, rows: kp.lane}
			s.lanes = append(s.lanes, l)
			s.ready = append(s.ready, l)
		}
	}
	return s
}

// end marks l ended and tells onEnd, once.
func (s *laneSet) end(l *lane) {
	if !l.ended {
		l.ended = true
		s.onEnd(l)
	}
}

// endRest ends every lane not ended yet: the round stopped publishing.
func (s *laneSet) endRest() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, l := range s.lanes {
		s.end(l)
	}
}

// next returns the next call to make: its destination and entries (each lane's rows in the
// call, in order). It blocks while no lane is ready but calls are in flight, and returns false
// when nothing is left to send, or as soon as stopping reports true: what was not sent stays
// unattempted.
func (s *laneSet) next(stopping func() bool) (string, []entry, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		if stopping() {
			s.cond.Broadcast()
			return "", nil, false
		}
		if dest, batch := s.takeBatch(); len(batch) > 0 {
			s.inFlight++
			return dest, batch, true
		}
		if s.inFlight == 0 {
			s.cond.Broadcast()
			return "", nil, false
		}
		s.cond.Wait()
	}
}

// takeBatch removes ready lanes whose current rows share one admitted destination, as many as
// that destination's call takes (entries and bytes). Where the destination keeps a key's order
// in a call, each lane taken brings its following rows of that destination too, while they fit
// (a lane holds at most the round's rows per key, MaxPerKey). A lane's entries are consecutive
// and in id order. On the way, lanes whose row cannot be published fail and lanes whose
// destination backs off are set aside until it may be tried again.
func (s *laneSet) takeBatch() (string, []entry) {
	var (
		dest  string
		lim   = Limits{MaxEntries: 1}
		batch []entry
		size  int
		rest  []*lane
		i     int
	)
	for ; i < len(s.ready) && len(batch) < lim.MaxEntries; i++ {
		l := s.ready[i]
		o := l.current()
		switch {
		case o.unpublishable != nil:
			l.fail(o.unpublishable, failRow, time.Time{})
			s.end(l)
			continue
		case dest != "" && (o.dest != dest || size+o.size > lim.MaxCallBytes):
			rest = append(rest, l)
			continue
		case dest == "":
			if ok, retryAt := s.admit(o.dest); !ok {
				o.deferredUntil = retryAt
				l.next = len(l.rows)
				s.end(l)
				continue
			}
			dest, lim = o.dest, s.limits(o.dest)
		}
		size += o.size
		batch = append(batch, entry{l, o})
		if !lim.KeyOrderInCall && mutant != mutantKeyRowsShareCall {
			continue
		}
		for _, more := range l.rows[l.next+1:] {
			if len(batch) >= lim.MaxEntries || more.unpublishable != nil || more.dest != dest || size+more.size > lim.MaxCallBytes {
				break
			}
			size += more.size
			batch = append(batch, entry{l, more})
		}
	}
	s.ready = append(rest, s.ready[i:]...)
	return dest, batch
}

// callResult is the fate of one entry of a call.
type callResult struct {
	err error
	// kind: whose failure err is; retryAt, for an outage, is when the destination is probed again.
	kind    failKind
	retryAt time.Time
	// cancelled: the round stopped before the broker answered; not an attempt.
	cancelled bool
}

// finish records the results of the call that carried batch (one per entry, in order) and
// makes the lanes with more rows ready again. A lane's entries are acknowledged in order up to
// the first that was not: a failure ends the lane there as a single row's would (the rows behind
// it wait, not attempted), and so does a cancelled entry. A later entry of the lane that the
// destination acknowledged all the same is published (the broker has it) but overtook its
// key's earlier row, which a destination that keeps a key's order in a call promises never to
// do: it is marked (outcome.overtook) and reported to onOvertake.
func (s *laneSet) finish(batch []entry, results []callResult) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.inFlight--
	var (
		lanes []*lane
		// stopped: the lane's first entry in this call that was not acknowledged.
		stopped = map[*lane]*outcome{}
	)
	for i, e := range batch {
		l, r := e.lane, results[i]
		if len(lanes) == 0 || lanes[len(lanes)-1] != l {
			lanes = append(lanes, l)
		}
		if first := stopped[l]; first != nil {
			if r.err == nil && !r.cancelled {
				e.o.done, e.o.afterFailure, e.o.overtook = true, nil, first
				if s.onOvertake != nil {
					s.onOvertake(e.o, first)
				}
			}
			continue
		}
		switch {
		case r.cancelled:
			stopped[l] = e.o
			l.next = len(l.rows)
		case r.err != nil:
			stopped[l] = e.o
			l.fail(r.err, r.kind, r.retryAt)
		default:
			e.o.done = true
			l.next++
		}
	}
	for _, l := range lanes {
		if l.next < len(l.rows) {
			s.ready = append(s.ready, l)
		} else {
			s.end(l)
		}
	}
	s.cond.Broadcast()
}
