package outbox

// The fault simulator's inputs: what a seed draws (simSchedule) and the fakes that play it back
// to the relay (simDestination, simStore). See sim_test.go for how a seed runs and
// sim_check_test.go for what is checked afterwards.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
)

// Destinations of the simulated relays: a FIFO topic, and an optional second (standard) one.
const (
	simFIFOTopic  = "sim"
	simFIFOARN    = "arn:aws:sns:us-east-1:000000000000:sim.fifo"
	simOtherTopic = "sim2"
	simOtherARN   = "arn:aws:sns:us-east-1:000000000000:sim2"
	// simUnknownTopic is configured nowhere: its rows are quarantined.
	simUnknownTopic = "sim.unknown"
)

// simProfile shapes what a seed draws.
type simProfile struct {
	// calm draws no destination faults and no relay kills (the broken-relay self-test), and
	// few keys with several rows per transaction.
	calm bool
	// faultMax bounds the fault phase.
	faultMax time.Duration
}

// simActionKind is an action of the fault timeline.
type simActionKind int

const (
	actCancel            simActionKind = iota // cancel a relay's Run, restart it after a pause
	actKill                                   // terminate its backends mid-statement and cancel it, restart it
	actTerminate                              // terminate a relay's backends, the relay lives on
	actTerminateProducer                      // terminate the producers' backends (commits of unknown outcome)
	actReplay                                 // Replay a retired key
	actPurge                                  // Purge published rows
	actRetryAll                               // RetryAllQuarantined
	actHostile                                // insert a hostile row with plain SQL
	actOutage                                 // every call to the destination fails (throttled) for a while
	actLateCommit                             // a transaction takes an id, holds it while higher ids commit, then commits
	actRowLocks                               // an operator's transaction holds the pending rows' row locks for a while
)

var simActionNames = [...]string{"cancel", "kill", "terminate", "term-producers", "replay", "purge", "retry-all", "hostile", "outage", "late-commit", "row-locks"}

func (k simActionKind) String() string { return simActionNames[k] }

// simAction is one step of the fault timeline, at an offset from the start of the fault phase.
type simAction struct {
	at    time.Duration
	kind  simActionKind
	relay int           // cancel, kill, terminate
	down  time.Duration // cancel, kill: how long the relay stays down
	arg   int           // hostile: which kind; replay: which retired key to try first
	key   string        // hostile: the serialized key it is written on, among the producers' rows ("" for a key of its own)
}

func (a simAction) String() string {
	s := fmt.Sprintf("%dms:%s", a.at.Milliseconds(), a.kind)
	switch a.kind {
	case actCancel, actKill:
		s += fmt.Sprintf("(r%d,down=%dms)", a.relay, a.down.Milliseconds())
	case actOutage, actLateCommit, actRowLocks:
		s += fmt.Sprintf("(%dms)", a.down.Milliseconds())
	case actTerminate:
		s += fmt.Sprintf("(r%d)", a.relay)
	case actHostile:
		s += "(" + simHostileKinds[a.arg]
		if a.key != "" {
			s += " on " + a.key
		}
		s += ")"
	}
	return s
}

// simRates are the destination's and the store's fault probabilities, per call or per entry.
type simRates struct {
	delay, hang, callErr, throttle, lostCall float64 // per call
	entryErr, permanent, lostEntry           float64 // per entry of a call that is answered
	storeErr                                 float64 // per claim-check upload
	maxDelay                                 time.Duration
	// overtake: with keyOrder, per entry behind a failed entry of its key in the same call,
	// the chance that the destination breaks its promise and acknowledges it anyway.
	overtake float64
	// slow: per call, the chance that the destination answers late but within the relay's
	// PublishTimeout (between half and nine tenths of it): slow, not failing.
	slow float64
	// midRound: per call, the chance that every relay's sessions are terminated while the
	// call is in flight (the rounds lose their advisory locks); at most simMidRoundMax a seed.
	midRound float64
}

// simMidRoundMax bounds a seed's mid-round terminations.
const simMidRoundMax = 3

// simSchedule is everything a seed decides before it starts.
type simSchedule struct {
	seed       int64
	relays     int
	pipelines  int
	keys       int // partition keys k0..: the first `serialized` are serialized (s<i>), the others not (u<i>)
	serialized int
	retiring   int           // s0..s<retiring-1> are written only before retireAt, then may be replayed
	retireAt   time.Duration // offset in the fault phase
	producers  int
	maxRows    int // rows per producer transaction
	faultPhase time.Duration
	claimCheck bool
	secondDest bool
	// keyOrder: the destination declares Limits.KeyOrderInCall (as Kafka does), so calls carry
	// several rows of a key, and a failed entry fails every later entry of its key in the call
	// (but see rates.overtake).
	keyOrder bool
	// dedicated relay slots (0..dedicated-1) run on pools made with DedicatePool: their
	// sessions keep the round settings; the others set and reset them every round.
	dedicated int
	// passes: the last relay slots (relays-passes..relays-1) run RunOnce in a loop, as a relay
	// started on a schedule does, instead of Run, and poll pageRows rows at a time, so that
	// their polls page and their passes move the frontier past rows they have not read
	// (watcher.pollAndSweep).
	passes, pageRows int
	// shortGrace: the relays give calls in flight simShortGrace to return when they stop
	// (RelayConfig.stopGrace), less than a slow or hanging call takes, so that stops cancel
	// calls mid-flight.
	shortGrace bool
	// bookCap is the relays' key book capacity (RelayConfig.bookCapacity); 0: the default.
	bookCap int
	// passPause is how long a passes slot waits between two RunOnce calls: PollInterval, or
	// longer, as a relay a schedule starts, so that its first look of a drain finds a backlog
	// and jumps its frontier over ids not committed yet (late commits below the jump).
	passPause time.Duration
	// passRun, when set, cuts each of a passes slot's RunOnce calls in the fault phase after
	// passRun, as an invocation's deadline (a Lambda's timeout) does: its next drain begins
	// with a look that jumps over what it did not read.
	passRun time.Duration
	rates   simRates
	actions []simAction
}

// simShortGrace is the stop grace of a shortGrace seed.
const simShortGrace = 20 * time.Millisecond

// drawSchedule draws seed's schedule from rng.
func drawSchedule(seed int64, rng *rand.Rand, p simProfile) *simSchedule {
	s := &simSchedule{seed: seed}
	s.relays = 2 + rng.IntN(2)
	s.pipelines = 1 + rng.IntN(2)
	s.producers = 2 + rng.IntN(3)
	s.faultPhase = p.faultMax/4 + time.Duration(rng.Int64N(int64(p.faultMax*3/4)+1))
	if p.calm {
		s.keys = 4 + rng.IntN(12)
		s.serialized = s.keys
		s.maxRows = 4
		s.dedicated = rng.IntN(s.relays + 1) // drawn last, as below
		s.passes, s.pageRows = rng.IntN(s.relays+1), 1+rng.IntN(8)
		return s
	}
	s.keys = 30 + rng.IntN(271)
	s.serialized = s.keys * (3 + rng.IntN(6)) / 10
	s.retiring = min(s.serialized, 1+rng.IntN(4))
	s.retireAt = s.faultPhase * time.Duration(3+rng.IntN(4)) / 10
	s.maxRows = 1 + rng.IntN(4)
	s.claimCheck = rng.IntN(3) == 0
	s.secondDest = rng.IntN(2) == 0
	pick := func(max float64) float64 {
		if rng.IntN(3) == 0 {
			return 0
		}
		return rng.Float64() * max
	}
	s.rates = simRates{
		delay: pick(0.5), hang: pick(0.05), callErr: pick(0.15), throttle: pick(0.15), lostCall: pick(0.1),
		entryErr: pick(0.2), permanent: pick(0.01), lostEntry: pick(0.1),
		maxDelay: time.Duration(1+rng.IntN(100)) * time.Millisecond,
	}
	if s.claimCheck {
		s.rates.storeErr = pick(0.3)
	}
	at := func() time.Duration { return time.Duration(rng.Int64N(int64(s.faultPhase))) }
	down := func() time.Duration { return time.Duration(rng.IntN(300)) * time.Millisecond }
	for range rng.IntN(3) {
		s.actions = append(s.actions, simAction{at: at(), kind: actCancel, relay: rng.IntN(s.relays), down: down()})
	}
	for range rng.IntN(6) {
		s.actions = append(s.actions, simAction{at: at(), kind: actKill, relay: rng.IntN(s.relays), down: down()})
	}
	for range rng.IntN(2) {
		s.actions = append(s.actions, simAction{at: at(), kind: actOutage, down: time.Duration(50+rng.IntN(500)) * time.Millisecond})
	}
	for range rng.IntN(3) {
		s.actions = append(s.actions, simAction{at: at(), kind: actTerminate, relay: rng.IntN(s.relays)})
	}
	for range rng.IntN(2) {
		s.actions = append(s.actions, simAction{at: at(), kind: actTerminateProducer})
	}
	for range rng.IntN(4) {
		// Replays come after the retirement, when a retired key may be fully published.
		t := s.retireAt + time.Duration(rng.Int64N(int64(s.faultPhase-s.retireAt)+1))
		s.actions = append(s.actions, simAction{at: t, kind: actReplay, arg: rng.IntN(s.retiring)})
	}
	for _, k := range []simActionKind{actPurge, actRetryAll} {
		for range rng.IntN(2) {
			s.actions = append(s.actions, simAction{at: at(), kind: k})
		}
	}
	for range rng.IntN(4) {
		s.actions = append(s.actions, simAction{at: at(), kind: actHostile, arg: rng.IntN(len(simHostileKinds))})
	}
	slices.SortStableFunc(s.actions, func(a, b simAction) int { return int(a.at - b.at) })
	// Drawn last, so that the draws above stay what they were for every seed.
	s.keyOrder = rng.IntN(2) == 0
	if s.keyOrder {
		s.rates.overtake = pick(0.05)
	}
	s.dedicated = rng.IntN(s.relays + 1)
	s.passes, s.pageRows = rng.IntN(s.relays+1), 1+rng.IntN(8)
	drawLivenessFaults(s, rng, pick, at)
	return s
}

// drawLivenessFaults draws the faults that test liveness against livenessBound rather than
// outcomes, and that make the planted bugs of mutants.go show (drawn after the others, so that
// those stay what they were for every seed): slow destinations, stops that cancel calls
// mid-flight, late commits below the frontier, sessions terminated mid-round, a small key
// book, relays that all run long passes under steady writes, a few hot keys, refusals (rows
// quarantined ahead of their key's later rows), calls that time out, passes a schedule starts
// (a pause between drains, so that a drain's first look jumps over late commits) and settles
// that wait for an operator's row locks (the span between a round's outcomes and their
// commit grows).
func drawLivenessFaults(s *simSchedule, rng *rand.Rand, pick func(float64) float64, at func() time.Duration) {
	s.rates.slow = pick(0.3)
	s.shortGrace = rng.IntN(3) == 0
	s.rates.midRound = pick(0.02)
	if rng.IntN(4) == 0 {
		s.bookCap = 2 + rng.IntN(8)
	}
	if rng.IntN(3) == 0 {
		s.passes = s.relays
	}
	single := rng.IntN(2) == 0 // with passes, a single relay a schedule starts (the relay Lambda)
	if rng.IntN(3) == 0 {      // a few hot keys: rounds and relays contend for them
		s.keys = min(s.keys, 6+rng.IntN(10))
		s.serialized = min(s.serialized, s.keys)
		s.retiring = min(s.retiring, s.serialized)
	}
	if rng.IntN(2) == 0 { // refusals: quarantined rows with rows of their key behind them
		s.rates.permanent = max(s.rates.permanent, 0.03+0.05*rng.Float64())
	}
	if rng.IntN(3) == 0 { // calls that time out
		s.rates.hang = max(s.rates.hang, 0.02+0.04*rng.Float64())
	}
	for range 2 + rng.IntN(5) {
		s.actions = append(s.actions, simAction{at: at(), kind: actLateCommit, down: time.Duration(200+rng.IntN(1000)) * time.Millisecond})
	}
	if s.shortGrace { // stops while slow calls are in flight
		s.rates.slow = max(s.rates.slow, 0.2+0.3*rng.Float64())
		for range 1 + rng.IntN(3) {
			s.actions = append(s.actions, simAction{at: at(), kind: actCancel, relay: rng.IntN(s.relays), down: time.Duration(rng.IntN(300)) * time.Millisecond})
		}
	}
	if single && s.passes == s.relays {
		s.relays, s.passes, s.dedicated = 1, 1, min(s.dedicated, 1)
		s.actions = slices.DeleteFunc(s.actions, func(a simAction) bool { // the other slots' stops
			return (a.kind == actCancel || a.kind == actKill || a.kind == actTerminate) && a.relay != 0
		})
	}
	if pause := rng.IntN(2) == 0; pause || s.relays == 1 { // relays a schedule starts: a pause between drains
		s.passPause = time.Duration(50+rng.IntN(250)) * time.Millisecond
		if cut := rng.IntN(2) == 0; cut || s.relays == 1 { // and each drain cut by its deadline
			s.passRun = time.Duration(50+rng.IntN(250)) * time.Millisecond
		}
	}
	if rng.IntN(3) != 0 { // settles that wait for an operator's row locks
		for range 2 + rng.IntN(5) {
			s.actions = append(s.actions, simAction{at: at(), kind: actRowLocks, down: time.Duration(200+rng.IntN(500)) * time.Millisecond})
		}
	}
	if s.serialized > 0 && rng.IntN(2) == 0 {
		// A producer's bad row in the middle of a live key (a topic no relay knows): quarantined,
		// it holds the key's later rows for good, and every relay that meets the key, or
		// meets it again after a restart, must keep holding them.
		for range 1 + rng.IntN(2) {
			s.actions = append(s.actions, simAction{at: at(), kind: actHostile, arg: simHostileUnknownTopic,
				key: fmt.Sprintf("s%d", rng.IntN(s.serialized))})
		}
	}
	slices.SortStableFunc(s.actions, func(a, b simAction) int { return int(a.at - b.at) })
}

// String is the schedule in one compact paragraph, for a failing seed's report.
func (s *simSchedule) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "relays=%d (dedicated pools %d, passes %d of %d rows a poll) pipelines=%d producers=%d keys=%d serialized=%d retiring=%d@%dms rows/tx<=%d fault=%dms claimcheck=%t dest2=%t keyorder=%t shortgrace=%t book=%d passpause=%dms passrun=%dms\n",
		s.relays, s.dedicated, s.passes, s.pageRows, s.pipelines, s.producers, s.keys, s.serialized, s.retiring, s.retireAt.Milliseconds(), s.maxRows,
		s.faultPhase.Milliseconds(), s.claimCheck, s.secondDest, s.keyOrder, s.shortGrace, s.bookCap, s.passPause.Milliseconds(), s.passRun.Milliseconds())
	r := s.rates
	fmt.Fprintf(&b, "rates: delay=%.2f(<=%dms) hang=%.3f callErr=%.2f throttle=%.2f lostCall=%.2f entryErr=%.2f permanent=%.3f lostEntry=%.2f storeErr=%.2f overtake=%.3f slow=%.2f midRound=%.3f\n",
		r.delay, r.maxDelay.Milliseconds(), r.hang, r.callErr, r.throttle, r.lostCall, r.entryErr, r.permanent, r.lostEntry, r.storeErr, r.overtake, r.slow, r.midRound)
	b.WriteString("timeline:")
	for _, a := range s.actions {
		b.WriteString(" " + a.String())
	}
	return b.String()
}

// simFate turns (seed, what, id, attempt) into a number in [0, 1): every decision of the fakes
// is one, so that it depends on which event is sent for the how-many-th time, never on the
// order in which goroutines got there.
func simFate(seed int64, what string, id uuid.UUID, attempt int) float64 {
	h := fnv.New64a()
	var buf [16]byte
	binary.LittleEndian.PutUint64(buf[:8], uint64(seed))
	binary.LittleEndian.PutUint64(buf[8:], uint64(attempt))
	h.Write(buf[:])
	h.Write(id[:])
	h.Write([]byte(what))
	return float64(h.Sum64()>>11) / (1 << 53)
}

// Errors the fakes inject.
var (
	errSimCall     = errors.New("sim: InternalError (whole call)")
	errSimThrottle = errors.New("sim: Throttling: Rate exceeded")
	errSimEntry    = errors.New("sim: InternalFailure (entry)")
	errSimLost     = errors.New("sim: response lost (the destination accepted the message)")
	errSimStore    = errors.New("sim: S3 SlowDown")
	errSimRefused  = Permanent(errors.New("sim: InvalidParameter (permanent)"))
	errSimBehind   = errors.New("sim: failed behind an earlier entry of its key in the call")
)

// simDelivery is one entry of one PublishBatch call, as the destination saw it.
type simDelivery struct {
	event    uuid.UUID
	key      string
	id       int64
	dest     string
	body     []byte        // the payload as published; a claim-checked one resolved through the store
	pointer  bool          // body came from the claim check's store
	accepted bool          // the destination kept the message (whatever it answered)
	acked    bool          // the destination answered success for it: the relay knows it is published
	relay    string        // the relay (generation) that made the call
	from, at time.Duration // when the call started; when it was answered
}

// simDestination is the fake broker. It answers each call as the seed decides, and records
// every entry of every call, in the order it accepted them, under one mutex.
type simDestination struct {
	seed   int64
	rates  simRates
	faulty *atomic.Bool // faults are drawn only while set (the fault phase)
	outage atomic.Bool  // every call fails (actOutage)
	store  *simStore    // resolves claim-check pointers; nil without a claim check
	start  time.Time
	// timeout is the relays' PublishTimeout (rates.slow stays below it); slowCall the bound's
	// SlowCall (simSlowCall): a call that takes longer leaves its destination unhealthy, as a
	// failed one does; terminate ends every relay's sessions (rates.midRound), midRounds counts
	// its uses.
	timeout   time.Duration
	slowCall  time.Duration
	terminate func()
	midRounds atomic.Int64

	mu         sync.Mutex
	attempts   map[uuid.UUID]int
	deliveries []simDelivery
	refused    map[uuid.UUID]bool // events given a Permanent error
	// inFlight is the payload bytes of calls in progress; peak its maximum, largest the
	// largest single payload seen.
	inFlight, peak, largest int
	// resets are the delivery indexes at which a key's order history restarts (a replay).
	resets map[int][]string
	// resetAt is when the resets at a delivery index were made: a call begun before a key's
	// reset carries its rows as they were before the replay (a round that lost its locks and
	// published on), so it belongs to the key's old history.
	resetAt map[int]time.Duration
	// keyOrder: see simSchedule.keyOrder. overtaken counts the entries the destination
	// acknowledged behind a failed entry of their key in the same call (breaking its promise),
	// tainted the keys whose order it broke so, and reported the overtaking rows the relays
	// logged as errors.
	keyOrder  bool
	overtaken int
	// sharedCalls counts the calls that carried several rows of one key.
	sharedCalls int
	tainted     map[string]bool
	reported    atomic.Int64
	// windows are the spans during which a destination (or, with dest "", every one) was
	// unhealthy; crashes the spans during which a relay stopped, was killed, lost its
	// sessions or failed a round (see simWindow).
	windows, crashes []simWindow
}

// crash records relay's crash (a stop, a kill, sessions terminated, a failed round; relay ""
// for every relay) from from to now: every row may wait, and the rows that relay sent may be
// published again.
func (d *simDestination) crash(relay string, from time.Duration) {
	d.mu.Lock()
	defer d.mu.Unlock()
	w := simWindow{from: from, to: time.Since(d.start)}
	d.windows = append(d.windows, w)
	w.relay = relay
	d.crashes = append(d.crashes, w)
}

// simPublisher is one relay's view of the fake broker: the calls it makes are recorded as
// that relay's.
type simPublisher struct {
	d     *simDestination
	relay string
}

var _ Publisher = simPublisher{}

// PublishBatch implements Publisher.
func (p simPublisher) PublishBatch(ctx context.Context, dest string, events []*Event) []error {
	return p.d.publish(ctx, p.relay, dest, events)
}

// simKeyOrderDestination is the fake broker of a keyOrder seed: it declares that it keeps a
// key's order inside one call.
type simKeyOrderDestination struct{ simPublisher }

var _ LimitedPublisher = simKeyOrderDestination{}

func (simKeyOrderDestination) Limits(string) Limits {
	lim := snsLimits
	lim.KeyOrderInCall = true
	return lim
}

func (simKeyOrderDestination) MessageSize(_ string, e *Event, payloadLen int) int {
	return messageSize(SNS, e, payloadLen, "")
}

// simOvertakeLog counts into dest the relays' error logs of overtaking rows; it discards
// everything else.
type simOvertakeLog struct {
	slog.Handler
	dest  *simDestination
	relay string // whose log it is: its failed rounds are its crashes
}

func (h simOvertakeLog) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= slog.LevelWarn || h.Handler.Enabled(ctx, l)
}

func (h simOvertakeLog) Handle(ctx context.Context, r slog.Record) error {
	if r.Level >= slog.LevelError && strings.HasPrefix(r.Message, "outbox destination acknowledged a row after failing") {
		h.dest.reported.Add(1)
	}
	if r.Level >= slog.LevelError && strings.HasPrefix(r.Message, "relay round failed") ||
		r.Level >= slog.LevelWarn && strings.HasPrefix(r.Message, "relay round could not record its outcomes") {
		// A round that could not record its outcomes says so before it releases its keys: from
		// then on what it sent may go again (its "round failed" comes only when it returns).
		h.dest.crash(h.relay, time.Since(h.dest.start))
	}
	if h.Handler.Enabled(ctx, r.Level) {
		return h.Handler.Handle(ctx, r)
	}
	return nil
}

func (h simOvertakeLog) WithAttrs(as []slog.Attr) slog.Handler {
	return simOvertakeLog{h.Handler.WithAttrs(as), h.dest, h.relay}
}

func (h simOvertakeLog) WithGroup(g string) slog.Handler {
	return simOvertakeLog{h.Handler.WithGroup(g), h.dest, h.relay}
}

func newSimDestination(seed int64, rates simRates, faulty *atomic.Bool, store *simStore, start time.Time) *simDestination {
	return &simDestination{seed: seed, rates: rates, faulty: faulty, store: store, start: start,
		attempts: map[uuid.UUID]int{}, refused: map[uuid.UUID]bool{}, resets: map[int][]string{}, resetAt: map[int]time.Duration{}, tainted: map[string]bool{}}
}

// publish answers one call of relay's (simPublisher).
func (d *simDestination) publish(ctx context.Context, relay, dest string, events []*Event) []error {
	from := time.Since(d.start)
	bytes := 0
	d.mu.Lock()
	firstAttempt := d.attempts[events[0].EventID]
	attempts := make([]int, len(events))
	for i, e := range events {
		attempts[i] = d.attempts[e.EventID]
		d.attempts[e.EventID]++
		bytes += len(e.Payload)
		d.largest = max(d.largest, len(e.Payload))
	}
	d.inFlight += bytes
	d.peak = max(d.peak, d.inFlight)
	d.mu.Unlock()
	defer func() {
		d.mu.Lock()
		d.inFlight -= bytes
		d.mu.Unlock()
	}()

	faulty := d.faulty.Load()
	fate := func(what string, id uuid.UUID, attempt int) float64 {
		if !faulty {
			return 1
		}
		return simFate(d.seed, what, id, attempt)
	}
	first := events[0].EventID
	var wait time.Duration
	if fate("delay", first, firstAttempt) < d.rates.delay {
		wait = time.Duration(fate("delay-ms", first, firstAttempt) * float64(d.rates.maxDelay))
	}
	if fate("slow", first, firstAttempt) < d.rates.slow {
		wait = d.timeout/2 + time.Duration(fate("slow-ms", first, firstAttempt)*float64(d.timeout*2/5))
	}
	if fate("hang", first, firstAttempt) < d.rates.hang {
		wait = time.Hour // until the relay's PublishTimeout
	}
	if fate("mid-round", first, firstAttempt) < d.rates.midRound && d.terminate != nil && d.midRounds.Add(1) <= simMidRoundMax {
		d.terminate()
	}
	if wait > 0 {
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
	var callErr error
	lostCall := false
	switch {
	case ctx.Err() != nil:
		callErr = ctx.Err()
	case faulty && d.outage.Load():
		callErr = errSimThrottle
	case fate("call-error", first, firstAttempt) < d.rates.callErr:
		callErr = errSimCall
	case fate("throttle", first, firstAttempt) < d.rates.throttle:
		callErr = errSimThrottle
	case fate("lost-call", first, firstAttempt) < d.rates.lostCall:
		lostCall = true
	}

	errs := make([]error, len(events))
	d.mu.Lock()
	defer d.mu.Unlock()
	at := time.Since(d.start)
	// failedKeys: with keyOrder, the keys with an entry failed in this call.
	failedKeys := map[string]bool{}
	inCall := map[string]bool{}
	for _, e := range events {
		if inCall[e.PartitionKey] {
			d.sharedCalls++
			break
		}
		inCall[e.PartitionKey] = true
	}
	for i, e := range events {
		accepted := callErr == nil
		switch {
		case callErr != nil:
			errs[i] = callErr
		case lostCall:
			errs[i] = errSimLost
		case d.keyOrder && failedKeys[e.PartitionKey] && fate("overtake", e.EventID, attempts[i]) < d.rates.overtake:
			d.overtaken++
			d.tainted[e.PartitionKey] = true
		case d.keyOrder && failedKeys[e.PartitionKey]:
			errs[i], accepted = errSimBehind, false
		case fate("permanent", e.EventID, attempts[i]) < d.rates.permanent:
			errs[i], accepted = errSimRefused, false
			d.refused[e.EventID] = true
		case fate("entry-error", e.EventID, attempts[i]) < d.rates.entryErr:
			errs[i], accepted = errSimEntry, false
		case fate("lost-entry", e.EventID, attempts[i]) < d.rates.lostEntry:
			errs[i] = errSimLost
		}
		if errs[i] != nil {
			failedKeys[e.PartitionKey] = true
		}
		dl := simDelivery{event: e.EventID, key: e.PartitionKey, id: e.ID, dest: dest, body: e.Payload,
			accepted: accepted, acked: errs[i] == nil, from: from, at: at, relay: relay}
		if e.ExtendedPayloadSize > 0 && d.store != nil {
			dl.body, dl.pointer = d.store.body(e.EventID.String()), true
		}
		d.deliveries = append(d.deliveries, dl)
	}
	if callErr != nil || lostCall || len(failedKeys) > 0 || at-from > d.slowCall {
		d.windows = append(d.windows, simWindow{dest: dest, from: from, to: at})
	}
	return errs
}

// resetKey restarts key's order history at the next delivery: a replay sends its rows again.
func (d *simDestination) resetKey(key string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.resets[len(d.deliveries)] = append(d.resets[len(d.deliveries)], key)
	d.resetAt[len(d.deliveries)] = time.Since(d.start)
}

// simStore is the fake claim-check store (the PayloadStore the relay calls).
type simStore struct {
	start  time.Time // the fault phase's start
	seed   int64
	rate   float64
	faulty *atomic.Bool

	mu       sync.Mutex
	attempts map[string]int
	bodies   map[string][]byte
	refused  map[string]bool
	failedAt []time.Duration // when uploads failed
}

func newSimStore(seed int64, rate float64, faulty *atomic.Bool, start time.Time) *simStore {
	return &simStore{seed: seed, rate: rate, faulty: faulty, start: start,
		attempts: map[string]int{}, bodies: map[string][]byte{}, refused: map[string]bool{}}
}

var _ PayloadStore = (*simStore)(nil)

// PutPayload implements PayloadStore: it fails as the seed decides, otherwise keeps body.
func (s *simStore) PutPayload(ctx context.Context, _, key string, body []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	attempt := s.attempts[key]
	s.attempts[key]++
	if s.faulty.Load() {
		id, _ := uuid.Parse(key)
		if f := simFate(s.seed, "store", id, attempt); f < s.rate {
			s.failedAt = append(s.failedAt, time.Since(s.start))
			if f < s.rate/20 {
				s.refused[key] = true
				return Permanent(fmt.Errorf("%w (permanent)", errSimStore))
			}
			return errSimStore
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	s.bodies[key] = slices.Clone(body)
	return nil
}

// windows returns the store's failures as unhealthy spans of every destination: a row whose
// payload could not be stored waits in backoff, as for a failing destination.
func (s *simStore) windows() []simWindow {
	s.mu.Lock()
	defer s.mu.Unlock()
	ws := make([]simWindow, len(s.failedAt))
	for i, at := range s.failedAt {
		ws[i] = simWindow{from: at, to: at}
	}
	return ws
}

func (s *simStore) body(key string) []byte {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.bodies[key]
}

func (s *simStore) wasRefused(key string) bool {
	if s == nil {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.refused[key]
}

// simHostileKinds are the hostile plain-SQL rows an actHostile inserts (see hostilePayload).
var simHostileKinds = [...]string{"huge", "deep", "1e400", "zeros", "unknown-topic"}

// simHostileUnknownTopic is the kind of simHostileKinds no relay can ever publish.
const simHostileUnknownTopic = 4

// hostilePayload returns the payload and topic of a hostile row of kind.
func hostilePayload(kind int) (payload, topic string) {
	switch simHostileKinds[kind] {
	case "huge": // above every destination's message limit: quarantined, or claim-checked
		return `{"big": "` + strings.Repeat("x", 300<<10) + `"}`, simFIFOTopic
	case "deep":
		return strings.Repeat("[", 2000) + "1" + strings.Repeat("]", 2000), simFIFOTopic
	case "1e400":
		return `{"n": 1e400, "m": -1e-400}`, simFIFOTopic
	case "zeros": // prints as ~16 KB per element in jsonb's text
		return "[" + strings.Repeat("0e-16383, ", 30000) + "0]", simFIFOTopic
	default:
		return `{"topic": "nowhere"}`, simUnknownTopic
	}
}
