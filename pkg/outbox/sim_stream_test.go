package outbox

// The fault simulator's stream faults (issue 44): a share of the seeds run their relays with
// the WAL wake-up (RelayConfig.WAL) on a server with wal_level=logical, and the seed draws
// faults of the stream: changes dropped, repeated or delayed on their way from the decoder to
// the key book (walFollower.tap), and slots dropped while the relays run (every walsender of
// the seed's database terminated: the temporary slots go with them, as at a failover). The
// stream is a wake-up and the claim the truth, so none of them may cost anything but latency:
// the checker's oracles (order, nothing lost, no duplicates without a cause, bounded liveness)
// judge these seeds exactly as the others, with no allowance for the stream.

import (
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/sluicehq/sluice/internal/testdb"
)

// simStreamShare is the share of seeds whose relays follow the WAL: one in -sim.stream-share
// (1: every seed; 0: none).
var simStreamShare = flag.Int("sim.stream-share", 4, "one in this many seeds runs its relays with the WAL wake-up and draws stream faults (1: every seed, 0: none)")

// simStreamBusy and simStreamQuiet are the two parts of a stream seed's calm tail, after the
// relays follow the stream again: the producers write on, then they write nothing.
const (
	simStreamBusy  = 1500 * time.Millisecond
	simStreamQuiet = 3500 * time.Millisecond
)

// simNoWAL keeps stream seeds' schedules but has their relays poll: is a finding the stream's?
var simNoWAL = flag.Bool("sim.nowal", false, "run stream seeds' schedules with relays that poll (no WAL wake-up), to tell a finding's cause")

// simStream is what a stream seed draws: the faults of its relays' WAL wake-up.
type simStream struct {
	// drop, dup, delay: per committed transaction's rows, the chance that the change never
	// wakes its keys, wakes them twice, or wakes them up to maxDelay late (hashed from the
	// seed and the transaction's first row, so each relay's stream decides alike).
	drop, dup, delay float64
	maxDelay         time.Duration
	// retry is the relays' WALWake.RetryAfter: how long a relay polls after its stream ended
	// before it follows a new slot.
	retry time.Duration
	// slotDrops are the offsets in the fault phase at which every walsender of the seed's
	// database is terminated.
	slotDrops []time.Duration
	// calmAt is the offset at which the drawn fault phase ends and the stream seed's calm tail
	// begins: the producers and the stream's faults, no destination faults.
	calmAt time.Duration
	// faulty: the stream's faults are on (from the fault phase's start to the heal).
	faulty atomic.Bool
	// pauseAt is when (unix nanoseconds) the producers stop writing, in the calm tail's end;
	// 0 until the tail is set.
	pauseAt atomic.Int64

	// Counted while the seed runs (the seed's account).
	dropped, repeated, delayed, passed atomic.Int64
}

// drawStream draws seed's stream faults, or nil for a seed whose relays poll (most). It draws
// from an rng of its own, so that the schedule's draws stay what they were for every seed.
func drawStream(seed int64, sched *simSchedule, prof simProfile) *simStream {
	rng := rand.New(rand.NewPCG(uint64(seed), 0x57e4))
	if prof.calm || *simStreamShare <= 0 || rng.IntN(*simStreamShare) != 0 {
		return nil
	}
	pick := func(max float64) float64 {
		if rng.IntN(3) == 0 {
			return 0
		}
		return rng.Float64() * max
	}
	s := &simStream{drop: pick(0.5), dup: pick(0.3), delay: pick(0.5),
		maxDelay: time.Duration(1+rng.IntN(500)) * time.Millisecond,
		retry:    time.Duration(20+rng.IntN(300)) * time.Millisecond}
	for range rng.IntN(4) {
		s.slotDrops = append(s.slotDrops, time.Duration(rng.Int64N(int64(sched.faultPhase))))
	}
	slices.Sort(s.slotDrops)
	// The drawn fault phase is followed by a calm tail (playStream): the producers and the
	// stream's faults go on, the destination's faults and the timeline's actions do not; once
	// every relay follows the stream again (a relay restarted under load follows a new slot
	// only after the transactions open then ended: awaitFollowing), the producers write for
	// simStreamBusy and then nothing for simStreamQuiet, longer than the liveness bound (the
	// outbox idle while the relays follow the stream). A row whose wake was lost while every
	// destination is healthy must be found within the bound by the relay alone: destination
	// faults move every row's deadline (checkBound), and the heal phase begins with
	// RetryAllQuarantined, whose epoch move sweeps every relay.
	s.calmAt = sched.faultPhase
	// Every relay runs Run, which follows the stream (RunOnce and RunPass poll).
	sched.passes = 0
	return s
}

func (s *simStream) String() string {
	if s == nil {
		return ""
	}
	drops := make([]string, len(s.slotDrops))
	for i, d := range s.slotDrops {
		drops[i] = fmt.Sprintf("%dms", d.Milliseconds())
	}
	return fmt.Sprintf("\nstream: drop=%.2f dup=%.2f delay=%.2f(<=%dms) retry=%dms slot drops at [%s]",
		s.drop, s.dup, s.delay, s.maxDelay.Milliseconds(), s.retry.Milliseconds(), strings.Join(drops, " "))
}

// producersPaused reports whether the producers write nothing now: in a stream seed's quiet end
// of its calm tail.
func (w *simWorld) producersPaused() bool {
	if w.stream == nil {
		return false
	}
	at := w.stream.pauseAt.Load()
	return at != 0 && time.Now().UnixNano() >= at
}

// simStreamURL is the database a seed runs on: on the logical server for a stream seed.
func simStreamURL(w *simWorld) string {
	if w.stream != nil {
		return testdb.LogicalURL(w.t)
	}
	return testdb.URL(w.t)
}

// streamConfig turns on the WAL wake-up in cfg for a stream seed.
func (w *simWorld) streamConfig(cfg *RelayConfig) {
	if w.stream != nil && !*simNoWAL {
		cfg.WAL = &WALWake{RetryAfter: w.stream.retry, StatusInterval: 100 * time.Millisecond}
	}
}

// tapStream puts the seed's stream faults between relay's decoder and its key book.
func (w *simWorld) tapStream(relay *Relay) {
	s := w.stream
	if s == nil || relay.wal == nil {
		return
	}
	relay.wal.tap = func(rows []walInsert, wake func([]walInsert)) {
		if !s.faulty.Load() {
			s.passed.Add(1)
			wake(rows)
			return
		}
		id := simStreamID(rows[0].id)
		switch {
		case simFate(w.seed, "wal-drop", id, 0) < s.drop:
			s.dropped.Add(1)
		case simFate(w.seed, "wal-delay", id, 0) < s.delay:
			s.delayed.Add(1)
			d := time.Duration(simFate(w.seed, "wal-delay-by", id, 0) * float64(s.maxDelay))
			time.AfterFunc(d, func() { wake(rows) })
		default:
			s.passed.Add(1)
			wake(rows)
		}
		if simFate(w.seed, "wal-dup", id, 0) < s.dup {
			s.repeated.Add(1)
			d := time.Duration(simFate(w.seed, "wal-dup-by", id, 0) * float64(s.maxDelay))
			time.AfterFunc(d, func() { wake(rows) })
		}
	}
}

// simStreamID turns a row id into the uuid simFate hashes.
func simStreamID(id int64) uuid.UUID {
	var u uuid.UUID
	binary.LittleEndian.PutUint64(u[:8], uint64(id))
	return u
}

// awaitStream waits, in a stream seed, until every relay follows its stream (or 10 seconds),
// before the producers start, and moves the fault phase's timeline (the actions, the
// retirement, the slot drops and the phase's end) by the wait: creating a slot waits for the
// transactions open on the whole server when it began (PostgreSQL's snapshot builder), those of
// the other seeds running beside this one included. The relays a seed restarts, or whose slot
// it drops, wait so under the producers' load, and poll meanwhile.
func (w *simWorld) awaitStream() {
	if w.stream == nil {
		return
	}
	following := w.awaitFollowing()
	wait := time.Since(w.start)
	s := w.sched
	for i := range s.actions {
		s.actions[i].at += wait
	}
	for i := range w.stream.slotDrops {
		w.stream.slotDrops[i] += wait
	}
	w.stream.calmAt += wait
	s.retireAt += wait
	s.faultPhase += wait
	w.logf("stream: %d of %d relays follow the WAL; the timeline moves by %dms", following, len(w.relays), wait.Milliseconds())
}

// awaitFollowing waits until every relay follows its stream, or 10 seconds, and returns how
// many do (on the test's goroutine, which starts the relays).
func (w *simWorld) awaitFollowing() int {
	deadline := time.Now().Add(10 * time.Second)
	following := 0
	for _, r := range w.relays {
		for !*simNoWAL && !r.relay.FollowingWAL() && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		if r.relay.FollowingWAL() {
			following++
		}
	}
	return following
}

// playStream turns the stream's faults on, drops the relays' slots at the drawn offsets of the
// fault phase and ends the destination's faults at the calm tail, in a goroutine of its own.
// The returned function, called once the timeline played, waits for it, then for every relay
// to follow its stream, and sets the calm tail's parts: it moves the fault phase's end.
func (w *simWorld) playStream() (played func()) {
	if w.stream == nil {
		return func() {}
	}
	done := make(chan struct{})
	w.stream.faulty.Store(w.faulty.Load())
	go func() {
		defer close(done)
		defer func() {
			time.Sleep(time.Until(w.start.Add(w.stream.calmAt)))
			w.faulty.Store(false)
			w.logf("calm tail: the destination's faults end, the producers and the stream's faults go on")
		}()
		for _, at := range w.stream.slotDrops {
			time.Sleep(time.Until(w.start.Add(at)))
			var n int
			err := w.admin.QueryRow(context.Background(), `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
				WHERE backend_type = 'walsender' AND datname = current_database()`).Scan(&n)
			w.logf("drop the slots: %d walsenders terminated %s", n, errOrEmpty(err))
		}
	}()
	return func() {
		<-done
		following := w.awaitFollowing()
		// Rows a refusal of the drawn phase quarantined would block their keys through the
		// tail: released, as the heal phase does, so that the tail judges the stream alone.
		w.releaseRefused(context.Background())
		now := time.Since(w.start)
		w.stream.pauseAt.Store(w.start.Add(now + simStreamBusy).UnixNano())
		w.sched.faultPhase = now + simStreamBusy + simStreamQuiet
		w.logf("calm tail: %d of %d relays follow the WAL; the producers write until +%dms, the fault phase ends at +%dms",
			following, len(w.relays), (now + simStreamBusy).Milliseconds(), w.sched.faultPhase.Milliseconds())
	}
}

// streamAccount ends the stream's faults and logs what they did.
func (w *simWorld) streamAccount() {
	if s := w.stream; s != nil {
		s.faulty.Store(false)
		w.logf("stream: %d changes passed, %d dropped, %d delayed, %d repeated", s.passed.Load(), s.dropped.Load(), s.delayed.Load(), s.repeated.Load())
	}
}
