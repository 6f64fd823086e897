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

// simStreamShare is the share of seeds whose relays follow the WAL: one in simStreamShare.
const simStreamShare = 4

// simStreamLonger is how much longer a stream seed's fault phase is than its schedule drew.
const simStreamLonger = 1500 * time.Millisecond

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

	// Counted while the seed runs (the seed's account).
	dropped, repeated, delayed, passed atomic.Int64
}

// drawStream draws seed's stream faults, or nil for a seed whose relays poll (most). It draws
// from an rng of its own, so that the schedule's draws stay what they were for every seed.
func drawStream(seed int64, sched *simSchedule, prof simProfile) *simStream {
	rng := rand.New(rand.NewPCG(uint64(seed), 0x57e4))
	if prof.calm || rng.IntN(simStreamShare) != 0 {
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
	// A longer fault phase than the schedule drew, with the producers and the destination's and
	// the stream's faults but no more of the timeline's actions: a relay restarted under load
	// follows a new slot only after the transactions open then ended (awaitStream), and the
	// stream's faults need a stream.
	sched.faultPhase += simStreamLonger
	for range rng.IntN(4) {
		s.slotDrops = append(s.slotDrops, time.Duration(rng.Int64N(int64(sched.faultPhase))))
	}
	slices.Sort(s.slotDrops)
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
		if !w.faulty.Load() {
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
	wait := time.Since(w.start)
	s := w.sched
	for i := range s.actions {
		s.actions[i].at += wait
	}
	for i := range w.stream.slotDrops {
		w.stream.slotDrops[i] += wait
	}
	s.retireAt += wait
	s.faultPhase += wait
	w.logf("stream: %d of %d relays follow the WAL; the timeline moves by %dms", following, len(w.relays), wait.Milliseconds())
}

// playStream drops the relays' slots at the drawn offsets of the fault phase, in a goroutine
// of its own; the returned function waits for it.
func (w *simWorld) playStream() (wait func()) {
	done := make(chan struct{})
	if w.stream == nil {
		close(done)
		return func() { <-done }
	}
	go func() {
		defer close(done)
		for _, at := range w.stream.slotDrops {
			time.Sleep(time.Until(w.start.Add(at)))
			var n int
			err := w.admin.QueryRow(context.Background(), `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
				WHERE backend_type = 'walsender' AND datname = current_database()`).Scan(&n)
			w.logf("drop the slots: %d walsenders terminated %s", n, errOrEmpty(err))
		}
	}()
	return func() { <-done }
}

// streamAccount logs what the stream faults did.
func (w *simWorld) streamAccount() {
	if s := w.stream; s != nil {
		w.logf("stream: %d changes passed, %d dropped, %d delayed, %d repeated", s.passed.Load(), s.dropped.Load(), s.delayed.Load(), s.repeated.Load())
	}
}
