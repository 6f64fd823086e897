package outbox

// The fault simulator's checker: what producers wrote (simHistory), what the destination saw
// (simDestination's deliveries) and what the table says at the end, held against the
// guarantees (Jepsen style: the history is recorded during the run and judged afterwards).

import (
	"bytes"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/google/uuid"
)

// simRowStatus is what its producer knows of a row's transaction.
type simRowStatus int

const (
	rowOpen       simRowStatus = iota // not finished (counts as maybe committed)
	rowCommitted                      // COMMIT returned success
	rowMaybe                          // COMMIT failed: the outcome is unknown
	rowRolledBack                     // rolled back, or failed before COMMIT: never committed
)

// simRow is one row a producer or an operator action inserted.
type simRow struct {
	event      uuid.UUID
	id         int64
	key        string
	dest       string // the destination its topic routes to (its ARN)
	serialized bool   // the key's rows commit in id order: its order is checked
	body       []byte // the payload as written, what the message must carry
	hostile    string // a hostile row's kind: it may be quarantined, its bytes are not compared
	status     simRowStatus
	// committedAt is when COMMIT returned success (an offset from the fault phase's start):
	// the row was visible no later than that. Set only for rowCommitted.
	committedAt time.Duration
}

// simHistory records every row written, under one mutex; the checker's ground truth (it does
// not depend on rows still existing, so Purge cannot disturb it).
type simHistory struct {
	start time.Time // the fault phase's start: committedAt is an offset from it
	mu    sync.Mutex
	rows  map[uuid.UUID]*simRow
	open  map[string]int // producer transactions in progress, per key
}

func newSimHistory() *simHistory {
	return &simHistory{rows: map[uuid.UUID]*simRow{}, open: map[string]int{}}
}

// begin and end bracket a producer transaction on key.
func (h *simHistory) begin(key string) {
	h.mu.Lock()
	h.open[key]++
	h.mu.Unlock()
}

func (h *simHistory) end(key string) {
	h.mu.Lock()
	h.open[key]--
	h.mu.Unlock()
}

// busy reports whether a producer transaction on key is in progress.
func (h *simHistory) busy(key string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.open[key] > 0
}

// add records rows, written but not yet committed.
func (h *simHistory) add(rows ...*simRow) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, r := range rows {
		h.rows[r.event] = r
	}
}

// settle records the outcome of the transaction that wrote rows.
func (h *simHistory) settle(rows []*simRow, s simRowStatus) {
	at := time.Since(h.start)
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, r := range rows {
		r.status = s
		r.committedAt = at
	}
}

// simDBRow is a row's final state in the table.
type simDBRow struct {
	published, quarantined bool
	lastError              string
}

// simChecker judges one seed's run. Findings are grouped by kind, a few of each kept.
type simChecker struct {
	hist  *simHistory
	dest  *simDestination
	store *simStore
	// bound is the most payload bytes calls may carry at once (check 5).
	bound int
	// cfg is the relays' configuration (livenessBound); windows the unhealthy spans of the
	// destinations and the store, sorted by start (checkBound).
	cfg      RelayConfig
	windows  []simWindow
	findings map[string][]string
	counts   map[string]int
}

// Finding kinds, the first word of each finding.
const (
	findOrder       = "order"       // a serialized key's row went out after a later one
	findLiveness    = "liveness"    // a committed row was not published (nor rightly quarantined)
	findQuarantine  = "quarantine"  // a row quarantined without a permanent cause
	findUncommitted = "uncommitted" // a row never committed was published
	findBytes       = "bytes"       // a message body differs from what was written
	findMemory      = "memory"      // calls held more payload bytes than the round budget allows
	findRelay       = "relay"       // a relay did not stop when asked
	findOvertake    = "overtake"    // the relays' count of overtaking rows differs from the destination's
	findLate        = "late"        // a row of a healthy destination was published later than livenessBound allows
	findDuplicate   = "duplicate"   // a row was published again with no crash, timeout or lost answer between
)

func newSimChecker(hist *simHistory, dest *simDestination, store *simStore, bound int) *simChecker {
	return &simChecker{hist: hist, dest: dest, store: store, bound: bound, findings: map[string][]string{}, counts: map[string]int{}}
}

// simFindingsKept is how many findings of one kind are reported in full.
const simFindingsKept = 5

func (c *simChecker) report(kind, format string, args ...any) {
	c.counts[kind]++
	if len(c.findings[kind]) < simFindingsKept {
		c.findings[kind] = append(c.findings[kind], kind+": "+fmt.Sprintf(format, args...))
	}
}

// kinds returns the kinds found, sorted.
func (c *simChecker) kinds() []string {
	var ks []string
	for k := range c.counts {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// String lists the findings, kind by kind.
func (c *simChecker) String() string {
	var b bytes.Buffer
	for _, k := range c.kinds() {
		for _, f := range c.findings[k] {
			b.WriteString("  " + f + "\n")
		}
		if n := c.counts[k] - len(c.findings[k]); n > 0 {
			fmt.Fprintf(&b, "  %s: ... and %d more\n", k, n)
		}
	}
	return b.String()
}

// explained reports whether a quarantine of row has a cause in the schedule: a hostile row,
// or a Permanent error the destination or the store gave its event. Called with c.dest.mu held
// (check and checkQuarantined take it): it once took the lock itself, and a run whose row ended
// quarantined for a destination's refusal hung its checker.
func (c *simChecker) explained(row *simRow, ev uuid.UUID) bool {
	return (row != nil && row.hostile != "") || c.dest.refused[ev] || c.store.wasRefused(ev.String())
}

// checkQuarantined checks rows quarantined at the end of the fault phase: every one must have
// a permanent cause, never a retryable error or a throttle (check 2).
func (c *simChecker) checkQuarantined(rows []QuarantinedRow) {
	c.hist.mu.Lock()
	defer c.hist.mu.Unlock()
	c.dest.mu.Lock()
	defer c.dest.mu.Unlock()
	for _, q := range rows {
		if !c.explained(c.hist.rows[q.EventID], q.EventID) {
			c.report(findQuarantine, "row %d (key %s) quarantined after %d attempts with no permanent error injected: %s",
				q.ID, q.PartitionKey, q.Attempts, q.LastError)
		}
	}
}

// check runs the checks on the finished run; table is every row's final state.
func (c *simChecker) check(table map[uuid.UUID]simDBRow) {
	c.hist.mu.Lock()
	defer c.hist.mu.Unlock()
	c.dest.mu.Lock()
	defer c.dest.mu.Unlock()
	c.checkOrder()
	c.checkBehindQuarantine(table)
	c.checkLiveness(table)
	c.checkCommitted()
	c.checkBytes()
	c.checkMemory()
	c.checkOvertakes()
	c.checkBound(table)
	c.checkDuplicates()
}

// checkOvertakes checks that every entry the destination acknowledged behind a failed entry of
// its key in the same call (a destination breaking Limits.KeyOrderInCall's promise) was seen
// by a relay and logged as an error, and nothing else was (check 7).
func (c *simChecker) checkOvertakes() {
	if got, want := c.dest.reported.Load(), int64(c.dest.overtaken); got != want {
		c.report(findOvertake, "the destination acknowledged %d entries behind a failed entry of their key in the same call; the relays reported %d", want, got)
	}
}

// checkOrder walks the deliveries in acceptance order (check 1): a delivery of row x of a
// serialized key is an inversion if a later row y of the key was accepted already and x never
// was (a re-send of an accepted x is a duplicate that FIFO deduplication drops). A replay
// restarts the key's history: the replayed rows must go out in id order again (a call begun
// before the replay belongs to the old history: a round that lost its locks sending on).
func (c *simChecker) checkOrder() {
	type keyState struct {
		seen  map[int64]bool
		top   int64 // highest row accepted
		topAt time.Duration
	}
	keys := map[string]*keyState{}
	resetAt := map[string]time.Duration{} // each key's last reset
	for i, d := range c.dest.deliveries {
		for _, k := range c.dest.resets[i] {
			delete(keys, k)
			resetAt[k] = c.dest.resetAt[i]
		}
		row := c.hist.rows[d.event]
		if !d.accepted || row == nil || !row.serialized || c.dest.tainted[d.key] {
			continue // a tainted key's order was broken by the destination (checkOvertakes)
		}
		if at, ok := resetAt[d.key]; ok && d.from < at {
			continue // a call begun before the replay: a re-send of the key's old history
		}
		ks := keys[d.key]
		if ks == nil {
			ks = &keyState{seen: map[int64]bool{}}
			keys[d.key] = ks
		}
		if !ks.seen[d.id] && ks.top > d.id {
			c.report(findOrder, "key %s: row %d accepted at %dms (%s, call from %dms) after row %d (accepted at %dms)",
				d.key, d.id, d.at.Milliseconds(), d.relay, d.from.Milliseconds(), ks.top, ks.topAt.Milliseconds())
		}
		ks.seen[d.id] = true
		if d.id > ks.top {
			ks.top, ks.topAt = d.id, d.at
		}
	}
}

// checkBehindQuarantine is the other half of per-key order (check 1): a quarantined row holds
// its key, so no later row of a serialized key may be accepted while an earlier row of it ends
// quarantined, never accepted. checkOrder cannot see this: it compares accepted rows only, and
// the quarantined one never is.
func (c *simChecker) checkBehindQuarantine(table map[uuid.UUID]simDBRow) {
	accepted := c.acceptedCounts()
	held := map[string]int64{} // per serialized key, its lowest row that ended quarantined, never accepted
	for ev, row := range c.hist.rows {
		if db, ok := table[ev]; ok && row.serialized && db.quarantined && accepted[ev] == 0 && !c.dest.tainted[row.key] {
			if low, seen := held[row.key]; !seen || row.id < low {
				held[row.key] = row.id
			}
		}
	}
	for _, d := range c.dest.deliveries {
		if low, ok := held[d.key]; ok && d.accepted && d.id > low && c.hist.rows[d.event] != nil && c.hist.rows[d.event].serialized {
			c.report(findOrder, "key %s: row %d accepted at %dms while its earlier row %d stayed quarantined", d.key, d.id, d.at.Milliseconds(), low)
			delete(held, d.key) // once per key
		}
	}
}

// acceptedCounts counts each event's accepted deliveries.
func (c *simChecker) acceptedCounts() map[uuid.UUID]int {
	n := map[uuid.UUID]int{}
	for _, d := range c.dest.deliveries {
		if d.accepted {
			n[d.event]++
		}
	}
	return n
}

// checkLiveness checks that every committed row ended published (in the table and at the
// destination) or quarantined for a cause the schedule explains, or pending behind a
// quarantined hostile row of its key, which holds it for good (check 2). A row missing from
// the table was purged, which only published rows are.
func (c *simChecker) checkLiveness(table map[uuid.UUID]simDBRow) {
	accepted := c.acceptedCounts()
	heldBy := map[string]int64{} // per key, its lowest hostile row that ended quarantined
	for ev, row := range c.hist.rows {
		if db, ok := table[ev]; ok && row.hostile != "" && db.quarantined {
			if low, seen := heldBy[row.key]; !seen || row.id < low {
				heldBy[row.key] = row.id
			}
		}
	}
	for ev, row := range c.hist.rows {
		if row.status == rowRolledBack {
			continue
		}
		maybe := row.status != rowCommitted
		db, exists := table[ev]
		switch {
		case !exists && maybe:
			// Never committed, or committed, published and purged: either is fine.
		case !exists && accepted[ev] == 0:
			c.report(findLiveness, "row %d (key %s) is gone from the table but the destination never accepted it", row.id, row.key)
		case !exists:
		case db.published && accepted[ev] == 0:
			c.report(findLiveness, "row %d (key %s) is marked published but the destination never accepted it", row.id, row.key)
		case db.published:
		case db.quarantined && !c.explained(row, ev):
			c.report(findQuarantine, "row %d (key %s) ended quarantined with no permanent error injected: %s", row.id, row.key, db.lastError)
		case db.quarantined:
		case heldBy[row.key] != 0 && heldBy[row.key] < row.id:
		default:
			c.report(findLiveness, "row %d (key %s, %s) still pending after the heal phase (last error: %q)", row.id, row.key, statusName(row.status), db.lastError)
		}
	}
}

func statusName(s simRowStatus) string {
	return [...]string{"open", "committed", "maybe committed", "rolled back"}[s]
}

// checkCommitted checks that only written rows were published, and never a rolled-back one (check 3).
func (c *simChecker) checkCommitted() {
	for _, d := range c.dest.deliveries {
		row := c.hist.rows[d.event]
		switch {
		case !d.accepted:
		case row == nil:
			c.report(findUncommitted, "event %s (row %d, key %s) was published but nobody wrote it", d.event, d.id, d.key)
		case row.status == rowRolledBack:
			c.report(findUncommitted, "row %d (key %s) was published at %dms but its transaction rolled back", d.id, d.key, d.at.Milliseconds())
		}
	}
}

// checkBytes checks that each accepted message carries the bytes written (check 4), the
// claim-checked ones through the store.
func (c *simChecker) checkBytes() {
	for _, d := range c.dest.deliveries {
		row := c.hist.rows[d.event]
		if !d.accepted || row == nil || row.hostile != "" || bytes.Equal(d.body, row.body) {
			continue
		}
		via := "body"
		if d.pointer {
			via = "claim-checked payload"
		}
		c.report(findBytes, "row %d (key %s): %s %s differs from the %d bytes written %s", d.id, d.key, via, excerpt(d.body), len(row.body), excerpt(row.body))
	}
}

func excerpt(b []byte) string {
	if len(b) > 60 {
		return fmt.Sprintf("%q...(%d bytes)", b[:60], len(b))
	}
	return fmt.Sprintf("%q", b)
}

// checkMemory checks the peak of payload bytes in calls at once against the bound (check 5).
func (c *simChecker) checkMemory() {
	if c.dest.peak > c.bound+c.dest.largest {
		c.report(findMemory, "calls in flight held %d payload bytes at once; the bound is %d (pipelines × relays × MaxRoundBytes) + %d (largest message)",
			c.dest.peak, c.bound, c.dest.largest)
	}
}
