package outbox

// The fault simulator's promise oracles: bounded liveness (each row published within
// livenessBound of when it could be, unless its destination was unhealthy meanwhile) and
// duplicates (a row published again only after a crash, a timeout or a lost answer). The
// checks of outcomes are in sim_check_test.go.

import (
	"cmp"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/google/uuid"
)

// simSchedulingSlack is the simulator's allowance, in livenessBound, for the bound's terms
// that are no setting, S (a sweep's own duration) and R (a round's claim and settle, one
// round trip each), for P's spacing (the sweep period stretches to ten times a slow walk's
// duration), and for its own noise: eight seeds run at once on a machine shared with other
// work, each with two or three relays, producers and a PostgreSQL, so a goroutine or a
// statement may wait this long for a core. On a quiet machine S and R are milliseconds; the
// slack is the busy machine's, not part of the relay's promise.
const simSchedulingSlack = 2 * time.Second

// livenessBound is docs/outbox.md's bound ("Liveness"), B = P + S + SlowCall + R + C: a
// committed row whose destination answers each call within SlowCall (PublishTimeout if that is
// shorter), and whose key's earlier rows are published, is published within B of the later of
// its commit and its key's previous row's publication, whatever other keys, other
// destinations, the key book, a pass or another relay do. P is RescanInterval (a sweep, which
// walks every pending key against the database, is due that often whatever the pass, the key
// book or the frontier did); SlowCall the most a pipeline waits for another call before it
// moves on; C the row's own call, at most SlowCall under the bound's condition. S and R are
// no setting: simSchedulingSlack stands for them.
func livenessBound(cfg RelayConfig) time.Duration {
	return cfg.RescanInterval + 2*simSlowCall(cfg) + simSchedulingSlack
}

// simSlowCall is the bound's SlowCall: RelayConfig.SlowCall, or PublishTimeout if shorter. A
// call that takes longer makes its destination unhealthy (the bound's condition fails for its
// rows): simDestination records a window for it.
func simSlowCall(cfg RelayConfig) time.Duration {
	cfg = cfg.WithDefaults()
	return min(cfg.SlowCall, cfg.PublishTimeout)
}

// simRecovery is how long after a destination's last failure (or a relay's crash) its rows
// may still wait before livenessBound applies again: the next probe within BackoffMax, and
// the probe's call within PublishTimeout.
func simRecovery(cfg RelayConfig) time.Duration {
	return cfg.BackoffMax + cfg.PublishTimeout
}

// simWindow is a span of the run (offsets from the fault phase's start) during which dest
// was unhealthy: a call to it failed, hung, timed out or lost its answer, or, with dest "",
// every destination's rows may wait: a relay stopped, was killed or lost its sessions, a
// round failed, the claim-check store failed.
type simWindow struct {
	dest     string
	from, to time.Duration
	// relay: for a crash, the relay (generation) that crashed; "" for every relay.
	relay string
}

// deadline returns when a row of dest that could be published from `from` on must have been:
// livenessBound after `from`, pushed past every unhealthy window of dest (or of all
// destinations) that overlaps the wait, plus recovery.
func (c *simChecker) deadline(dest string, from time.Duration) time.Duration {
	bound, recovery := livenessBound(c.cfg), simRecovery(c.cfg)
	deadline := from + bound
	for _, w := range c.windows { // sorted by from
		if w.from > deadline {
			break
		}
		if (w.dest == "" || w.dest == dest) && w.to+recovery >= from {
			deadline = max(deadline, w.to+recovery+bound)
		}
	}
	return deadline
}

// checkBound checks each published row's first acceptance against its deadline (check 8),
// and each row still pending at the end against the end: its wait starts when it committed or
// when the last lower-id row of its key was first accepted, whichever is later. Rows behind a row never published, rows quarantined or
// refused, rows of a key whose order the destination broke and rows whose commit had an
// unknown outcome are not judged.
func (c *simChecker) checkBound(table map[uuid.UUID]simDBRow) {
	end := time.Since(c.hist.start)
	c.windows = slices.Clone(c.dest.windows)
	if c.store != nil {
		c.windows = append(c.windows, c.store.windows()...)
	}
	sort.Slice(c.windows, func(i, j int) bool { return c.windows[i].from < c.windows[j].from })
	first := map[uuid.UUID]simDelivery{}
	for _, d := range c.dest.deliveries {
		if _, seen := first[d.event]; d.accepted && !seen {
			first[d.event] = d
		}
	}
	byKey := map[string][]*simRow{}
	for _, r := range c.hist.rows {
		if r.status != rowRolledBack && r.id > 0 {
			byKey[r.key] = append(byKey[r.key], r)
		}
	}
	for key, rows := range byKey {
		sort.Slice(rows, func(i, j int) bool { return rows[i].id < rows[j].id })
		var ready time.Duration
		blocked := false
		for _, r := range rows {
			d, published := first[r.event]
			if !blocked && published && r.status == rowCommitted && r.hostile == "" && !c.dest.refused[r.event] && !c.dest.tainted[key] {
				from := max(r.committedAt, ready)
				if deadline := c.deadline(d.dest, from); d.at > deadline {
					c.report(findLate, "row %d (key %s) ready at %dms (committed %dms) was first accepted at %dms, after its deadline %dms (bound %s)",
						r.id, key, from.Milliseconds(), r.committedAt.Milliseconds(), d.at.Milliseconds(), deadline.Milliseconds(), livenessBound(c.cfg))
				}
			}
			db, exists := table[r.event]
			if !blocked && !published && r.status == rowCommitted && r.hostile == "" && exists && !db.published && !db.quarantined {
				// Still pending at the end: late too, once its deadline passed.
				from := max(r.committedAt, ready)
				if deadline := c.deadline(r.dest, from); end > deadline {
					c.report(findLate, "row %d (key %s) ready at %dms (committed %dms) was still pending at the end (%dms), after its deadline %dms (bound %s)",
						r.id, key, from.Milliseconds(), r.committedAt.Milliseconds(), end.Milliseconds(), deadline.Milliseconds(), livenessBound(c.cfg))
				}
			}
			switch {
			case published:
				ready = max(ready, d.at)
			case r.status == rowCommitted || exists:
				blocked = true // the later rows wait for a row that never went out
			}
		}
	}
}

// checkDuplicates checks that an event accepted twice had, between the two, a cause the relay
// may re-send for (check 9): the first answer was lost (the relay saw an error), a relay
// stopped, was killed or lost its sessions, or a round failed, between the start of the round
// that made the first call (at most a Lease before it: the round's calls end by then) and the
// second acceptance, or the key was replayed. Only the crashes of the two relays that made
// the calls count (the second may be a round that lost its locks and published on): another
// relay's crash is no cause. Sessions terminated before the call still count:
// the round lost its advisory locks, and another relay may take its keys. A key whose order the destination broke
// is not judged.
func (c *simChecker) checkDuplicates() {
	last := map[uuid.UUID]int{}
	lastReset := map[string]int{}
	for i, d := range c.dest.deliveries {
		for _, k := range c.dest.resets[i] {
			lastReset[k] = i
		}
		if !d.accepted {
			continue
		}
		j, again := last[d.event]
		last[d.event] = i
		if !again {
			continue
		}
		p := c.dest.deliveries[j]
		if r, ok := lastReset[d.key]; !p.acked || c.dest.tainted[d.key] || (ok && r > j) || c.crashed(p.relay, p.from-c.cfg.Lease, d.at) || c.crashed(d.relay, p.from-c.cfg.Lease, d.at) {
			continue
		}
		c.report(findDuplicate, "row %d (key %s) acknowledged to %s at %dms (call from %dms) was published again by %s at %dms (call from %dms) with no crash, timeout or lost answer between (their crashes: %s)",
			d.id, d.key, p.relay, p.at.Milliseconds(), p.from.Milliseconds(), d.relay, d.at.Milliseconds(), d.from.Milliseconds(),
			c.crashesOf(p.relay, d.relay))
	}
}

// crashesOf lists the crash windows of the relays named (and of every relay), for a report.
func (c *simChecker) crashesOf(relays ...string) string {
	var b strings.Builder
	for _, w := range c.dest.crashes {
		if w.relay == "" || slices.Contains(relays, w.relay) {
			fmt.Fprintf(&b, " %s@%d-%dms", cmp.Or(w.relay, "all"), w.from.Milliseconds(), w.to.Milliseconds())
		}
	}
	return cmp.Or(strings.TrimSpace(b.String()), "none")
}

// crashed reports whether relay stopped, crashed or lost its sessions, or a round of it
// failed, between from and to.
func (c *simChecker) crashed(relay string, from, to time.Duration) bool {
	for _, w := range c.dest.crashes {
		if (w.relay == "" || w.relay == relay) && w.from <= to && w.to >= from {
			return true
		}
	}
	return false
}
