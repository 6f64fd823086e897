package outbox

// Planted bugs for the fault simulator's mutation check (make test-mutants). Built with the
// tag sluice_mutants, mutant is a variable that TestMutants (sim_mutants_test.go) sets to each
// bug in turn, and the relay plants the bug it names; without the tag, mutant is the constant
// "" (mutant_off.go) and every hook is dead code the compiler removes. Each hook is one
// `if mutant == mutantX` branch in the relay, so that the mutants follow the relay's code as
// it changes. The simulator must catch each in at least a tenth of make test's seeds.

import (
	"context"
	"sync"

	"github.com/jackc/pgx/v5"
)

// The planted bugs, the values of SLUICE_MUTANT.
const (
	// mutantUnlockBeforeCommit: the settler unlocks a round's keys before their outcomes
	// commit (roundSettler.flush), so another relay may lock a key and send its rows again.
	mutantUnlockBeforeCommit = "unlockbeforecommit"
	// mutantCachedPosition: a round reads a key's rows after the highest id it read of the key
	// before (a cached position), not from the key's first pending row (Relay.claimKeys).
	mutantCachedPosition = "cachedposition"
	// mutantQuarantineSkipped: a quarantined row is skipped, not a stop for its key's later
	// rows (Relay.planRound).
	mutantQuarantineSkipped = "quarantineskipped"
	// mutantSweepAboveFrontier: sweeps ignore heads at or below the frontier, leaving them to
	// polls (watcher.applySweep).
	mutantSweepAboveFrontier = "sweepabovefrontier"
	// mutantJumpSkipsLate: sweeps ignore heads with the ids a frontier jump (a relay's start,
	// or a pass's first look at a backlog) passed over that had not committed yet, so a row
	// that commits late below the jump is never found by that relay (watcher.start,
	// watcher.pollAndSweep, applySweep).
	mutantJumpSkipsLate = "jumpskipslate"
	// mutantCancelledPublished: an entry whose call was cancelled (the relay stopping) is
	// recorded as published (Relay.call).
	mutantCancelledPublished = "cancelledpublished"
	// mutantTimedOutAcked: a call that timed out (PublishTimeout) is taken as acknowledged
	// (Relay.send).
	mutantTimedOutAcked = "timedoutacked"
	// mutantLastFailedAcked: in a partially failed call, the last failed entry is taken as
	// acknowledged (Relay.call).
	mutantLastFailedAcked = "lastfailedacked"
	// mutantKeyRowsShareCall: a key's following rows share a call on a destination that does
	// not keep a key's order in a call (laneSet.takeBatch).
	mutantKeyRowsShareCall = "keyrowssharecall"
	// mutantStreamTrusted: a change the WAL stream reported is taken as the truth of where its
	// key's pending rows begin: a round reads a key the stream woke from the first row of the
	// key's last change, not from the key's first pending row (walFollower.wake,
	// Relay.claimKeys), so a row of the key still pending below it (failed, backing off, its
	// own wake lost) is passed over.
	mutantStreamTrusted = "streamtrusted"
	// mutantStreamComplete: while Run follows the WAL, the stream is taken as the complete
	// account of what is pending, so that it stands in for every due sweep, whatever the last
	// one found and however recently the stream reported a change (walFollower.quiet): a row
	// whose wake was lost is found only by a later row of its key, a fall-back or a restart.
	mutantStreamComplete = "streamcomplete"
)

// mutantState is what the mutants that remember something remember, per relay or watcher.
var mutantState struct {
	mu sync.Mutex
	// positions: mutantCachedPosition's highest id read per relay and key.
	positions map[*Relay]map[string]int64
	// skipped: mutantJumpSkipsLate's ids passed over uncommitted, per watcher.
	skipped map[*watcher]map[int64]bool
	// streamFrom: mutantStreamTrusted's first row of each key's last change, per relay.
	streamFrom map[*Relay]map[string]int64
}

// mutantStreamChange records the first row of each key in a change the stream woke r's keys
// with (mutantStreamTrusted).
func mutantStreamChange(r *Relay, rows []walInsert) {
	mutantState.mu.Lock()
	defer mutantState.mu.Unlock()
	if mutantState.streamFrom == nil {
		mutantState.streamFrom = map[*Relay]map[string]int64{}
	}
	from := mutantState.streamFrom[r]
	if from == nil {
		from = map[string]int64{}
		mutantState.streamFrom[r] = from
	}
	first := map[string]int64{}
	for _, ins := range rows {
		if f, ok := first[ins.key]; !ok || ins.id < f {
			first[ins.key] = ins.id
		}
	}
	for key, id := range first {
		from[key] = id
	}
}

// mutantReadFromStream drops the rows of read below the first row of their key's last change
// (mutantStreamTrusted).
func mutantReadFromStream(r *Relay, read []*claimedRow) []*claimedRow {
	mutantState.mu.Lock()
	defer mutantState.mu.Unlock()
	from := mutantState.streamFrom[r]
	out := read[:0]
	for _, c := range read {
		if c.ID >= from[c.PartitionKey] {
			out = append(out, c)
		}
	}
	return out
}

// mutantReadFromCache drops the rows of read at or below the highest id r read of their key
// before, and moves that position (mutantCachedPosition).
func mutantReadFromCache(r *Relay, read []*claimedRow) []*claimedRow {
	mutantState.mu.Lock()
	defer mutantState.mu.Unlock()
	if mutantState.positions == nil {
		mutantState.positions = map[*Relay]map[string]int64{}
	}
	pos := mutantState.positions[r]
	if pos == nil {
		pos = map[string]int64{}
		mutantState.positions[r] = pos
	}
	out := read[:0]
	for _, c := range read {
		if c.ID > pos[c.PartitionKey] {
			out = append(out, c)
		}
	}
	for _, c := range out {
		pos[c.PartitionKey] = max(pos[c.PartitionKey], c.ID)
	}
	return out
}

// mutantJumped records the ids in (from, to] that w's frontier jumped over before they
// committed (mutantJumpSkipsLate): its sweeps skip them from now on.
func mutantJumped(ctx context.Context, w *watcher, from, to int64) {
	var missing []int64
	b := &pgx.Batch{}
	b.Queue(`SELECT coalesce(array_agg(g), '{}') FROM generate_series($1::bigint + 1, $2::bigint) g
		WHERE NOT EXISTS (SELECT 1 FROM outbox_event WHERE id = g)`, from, to).QueryRow(func(row pgx.Row) error { return row.Scan(&missing) })
	if w.readOnly(ctx, b) != nil {
		return
	}
	mutantState.mu.Lock()
	defer mutantState.mu.Unlock()
	if mutantState.skipped == nil {
		mutantState.skipped = map[*watcher]map[int64]bool{}
	}
	if mutantState.skipped[w] == nil {
		mutantState.skipped[w] = map[int64]bool{}
	}
	for _, id := range missing {
		mutantState.skipped[w][id] = true
	}
}

// mutantSkipHead reports whether w's sweep ignores a head with id (mutantJumpSkipsLate).
func mutantSkipHead(w *watcher, id int64) bool {
	mutantState.mu.Lock()
	defer mutantState.mu.Unlock()
	return mutantState.skipped[w][id]
}

// mutantUnlockFirst unlocks keys on rc before their outcomes are recorded
// (mutantUnlockBeforeCommit).
func mutantUnlockFirst(ctx context.Context, rc *roundConn, keys []string) {
	_, _ = rc.conn.Exec(ctx, unlockKeysSQL, keys)
}

// mutantAckLastFailed takes the last failed entry of a partially failed call as acknowledged
// (mutantLastFailedAcked).
func mutantAckLastFailed(results []callResult) {
	ok, last := false, -1
	for i, r := range results {
		switch {
		case r.err == nil && !r.cancelled:
			ok = true
		case r.err != nil:
			last = i
		}
	}
	if ok && last >= 0 {
		results[last] = callResult{}
	}
}
