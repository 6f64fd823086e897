package outbox

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func keysOf(rk roundKeys) []string {
	out := make([]string, len(rk.keys))
	for i, c := range rk.keys {
		out[i] = c.key
	}
	return out
}

// settleAll gives back every key of rk with the same verdict.
func settleAll(b *keyBook, rk roundKeys, v keyResult, now time.Time) {
	results := make([]keyResult, len(rk.keys))
	for i, c := range rk.keys {
		results[i] = v
		results[i].key = c.key
	}
	b.settle(rk, results, now)
}

func TestKeyBookHandsOutDueKeysOldestFirstAndNeverTwice(t *testing.T) {
	t.Parallel()
	now := time.Now()
	b := newKeyBook(100, 100)
	b.sawRow("b", 2, now.Add(-time.Second))
	b.sawRow("a", 1, now.Add(-2*time.Second))
	b.sawRow("a", 3, now) // a is already due: still one entry
	b.sawHead("c", 7, headBackingOff, now.Add(time.Minute), b.sweepSeq(), now)

	first := b.take(10, now)
	require.Equal(t, []string{"a", "b"}, keysOf(first), "due longest first; c backs off")
	require.Empty(t, b.take(10, now).keys, "taken keys are not handed out again")
	require.Len(t, b.take(10, now.Add(2*time.Minute)).keys, 1, "c is due once its backoff ends")
	at, ok := b.nextDue()
	require.False(t, ok, "every key is taken: %v", at)
}

func TestKeyBookVerdicts(t *testing.T) {
	t.Parallel()
	now := time.Now()
	b := newKeyBook(100, 100)
	for _, k := range []string{"drained", "more", "wait", "parked", "release", "dirty"} {
		b.sawRow(k, 10, now)
	}
	taken := b.take(10, now)
	require.Len(t, taken.keys, 6)
	b.sawRow("dirty", 20, now) // a new row while the round holds the key
	b.settle(taken, []keyResult{
		{key: "drained", verdict: verdictDrained, lastPublished: 10},
		{key: "more", verdict: verdictMore, lastPublished: 10},
		{key: "wait", verdict: verdictWait, until: now.Add(time.Hour)},
		{key: "parked", verdict: verdictParked},
		{key: "release", verdict: verdictRelease},
		{key: "dirty", verdict: verdictDrained, lastPublished: 10},
	}, now)
	due := b.take(10, now)
	require.ElementsMatch(t, []string{"more", "release", "dirty"}, keysOf(due))
	for _, c := range due.keys {
		if c.key == "more" || c.key == "dirty" {
			require.Equal(t, int64(10), c.floor, "%s is read after what was published", c.key)
		}
	}
	require.Equal(t, 4, b.size(), "drained left the book, parked is kept apart; waiting stays")

	// A drained key's floor is remembered: its next row is read after it.
	b.sawRow("drained", 11, now)
	next := b.take(10, now)
	require.Equal(t, []claimKey{{key: "drained", floor: 10}}, next.keys)
}

func TestKeyBookLateCommitLowersTheFloor(t *testing.T) {
	t.Parallel()
	now := time.Now()
	b := newKeyBook(100, 100)
	b.sawRow("k", 50, now)
	settleAll(b, b.take(1, now), keyResult{verdict: verdictMore, lastPublished: 50}, now)
	b.sawRow("k", 7, now) // committed after rows with higher ids went out
	require.Equal(t, []claimKey{{key: "k", floor: 6}}, b.take(1, now).keys)
}

func TestKeyBookLateCommitSeenWhileARoundHoldsTheKeySurvivesItsSettle(t *testing.T) {
	t.Parallel()
	now := time.Now()
	b := newKeyBook(100, 100)
	b.sawRow("k", 10, now)
	taken := b.take(1, now)
	b.sawRow("k", 15, now) // committed after the round's snapshot, below what it publishes
	settleAll(b, taken, keyResult{verdict: verdictMore, lastPublished: 30}, now)
	require.Equal(t, []claimKey{{key: "k", floor: 14}}, b.take(1, now).keys, "row 15 is read, not skipped")
}

func TestKeyBookSweepFromAnOlderSnapshotNeverRaisesAFloorOverANewerRow(t *testing.T) {
	t.Parallel()
	now := time.Now()
	b := newKeyBook(100, 100)
	b.sawRow("k", 50, now)
	settleAll(b, b.take(1, now), keyResult{verdict: verdictMore, lastPublished: 50}, now)
	seq := b.sweepSeq()                              // the sweep takes its snapshot
	b.sawRow("k", 7, now)                            // a late commit the snapshot does not hold
	b.sawHead("k", 60, headClaimable, now, seq, now) // the sweep saw head 60
	require.Equal(t, []claimKey{{key: "k", floor: 6}}, b.take(1, now).keys)

	b2 := newKeyBook(100, 100)
	b2.sawRow("k", 7, now)
	b2.sawHead("k", 40, headClaimable, now, b2.sweepSeq(), now) // a newer snapshot: exact
	require.Equal(t, []claimKey{{key: "k", floor: 39}}, b2.take(1, now).keys)
}

func TestKeyBookSweepAndResetReviveParkedKeys(t *testing.T) {
	t.Parallel()
	now := time.Now()
	b := newKeyBook(100, 100)
	b.sawHead("q", 5, headQuarantined, now, b.sweepSeq(), now)
	b.sawRow("q", 9, now) // new rows behind a quarantined head do not make it due
	require.Empty(t, b.take(10, now).keys)
	b.sawHead("q", 5, headClaimable, now, b.sweepSeq(), now) // an operator released it
	taken := b.take(10, now)
	require.Equal(t, []claimKey{{key: "q", floor: 4}}, taken.keys)
	settleAll(b, taken, keyResult{verdict: verdictParked}, now)
	require.Empty(t, b.take(10, now).keys)
	b.reset(1, now)
	taken = b.take(10, now)
	require.Equal(t, []claimKey{{key: "q", floor: 0}}, taken.keys, "reset reads every key from its first pending row")
	require.Equal(t, int64(1), taken.epoch)
}

func TestKeyBookOverflowAsksForASweep(t *testing.T) {
	t.Parallel()
	now := time.Now()
	b := newKeyBook(4, 10)
	for i := range 6 {
		b.sawRow(string(rune('a'+i)), int64(i+1), now)
	}
	require.Equal(t, 4, b.size())
	require.False(t, b.takeOverflow(), "no room yet")
	settleAll(b, b.take(4, now), keyResult{verdict: verdictDrained}, now)
	require.True(t, b.takeOverflow(), "room again: sweep to find the dropped keys")
	require.False(t, b.takeOverflow())
}

// A book full of keys that cannot move (quarantined, in backoff, waiting for a failing
// destination) still takes every new key that can.
func TestKeyBookFullOfStuckKeysStillTakesNewKeys(t *testing.T) {
	t.Parallel()
	now := time.Now()
	const capacity = 300
	b := newKeyBook(capacity, 10)
	for i := range capacity {
		b.sawRow(fmt.Sprintf("k%03d", i), int64(i+1), now)
	}
	taken := b.take(capacity, now)
	require.Len(t, taken.keys, capacity)
	var results []keyResult
	for i, c := range taken.keys {
		switch i % 3 {
		case 0:
			results = append(results, keyResult{key: c.key, verdict: verdictParked})
		case 1:
			results = append(results, keyResult{key: c.key, verdict: verdictWait, until: now.Add(time.Duration(i) * time.Minute)})
		default:
			results = append(results, keyResult{key: c.key, verdict: verdictHeld, dest: "arn:down", until: now.Add(time.Hour)})
		}
	}
	b.settle(taken, results, now)
	require.Equal(t, 2*capacity/3, b.size(), "parked keys are kept apart")

	for i := range capacity {
		b.sawRow(fmt.Sprintf("new%03d", i), int64(1000+i), now)
	}
	got := map[string]bool{}
	for {
		rk := b.take(50, now)
		if len(rk.keys) == 0 {
			break
		}
		for _, k := range keysOf(rk) {
			got[k] = true
		}
	}
	for i := range capacity {
		require.True(t, got[fmt.Sprintf("new%03d", i)], "new key %d is handed out", i)
	}
	require.LessOrEqual(t, b.size(), capacity)
	require.True(t, b.overflowed, "evicted keys are looked for again by a sweep")
}

// Keys waiting for a failing destination are handed out only a probe's worth at a time, alone
// in their round, and all come back once the destination answers.
func TestKeyBookHoldsAFailingDestinationsKeysAndProbesWithAFew(t *testing.T) {
	t.Parallel()
	now := time.Now()
	b := newKeyBook(1000, 10)
	for i := range 100 {
		b.sawRow(fmt.Sprintf("down%02d", i), int64(i+1), now)
	}
	first := b.take(1000, now)
	settleAll(b, first, keyResult{verdict: verdictHeld, dest: "arn:down", until: now.Add(time.Minute)}, now)
	b.sawRow("healthy", 500, now)
	require.Equal(t, []string{"healthy"}, keysOf(b.take(1000, now)), "held keys are not due before the probe")
	at, ok := b.nextDue()
	require.True(t, ok)
	require.Equal(t, now.Add(time.Minute), at, "the relay wakes up for the probe")

	probe := b.take(1000, now.Add(time.Minute))
	require.Equal(t, "arn:down", probe.probe)
	require.Len(t, probe.keys, probeKeys, "one call's worth of keys probes the destination")
	require.Empty(t, b.take(1000, now.Add(time.Minute)).keys, "one probe at a time")

	// The probe fails: its keys are held again, until the next probe.
	settleAll(b, probe, keyResult{verdict: verdictHeld, dest: "arn:down", until: now.Add(3 * time.Minute)}, now.Add(time.Minute))
	require.Empty(t, b.take(1000, now.Add(2*time.Minute)).keys)
	probe = b.take(1000, now.Add(3*time.Minute))
	require.Len(t, probe.keys, probeKeys)
	settleAll(b, probe, keyResult{verdict: verdictMore, lastPublished: 1000}, now.Add(3*time.Minute))
	b.releaseAnswered(func(string) bool { return true }, now.Add(3*time.Minute))
	require.Len(t, b.take(1000, now.Add(3*time.Minute)).keys, 100, "every key of the destination is due again")
}

func TestKeyBookSettleAfterAnEpochChangeKeepsFloorsLow(t *testing.T) {
	t.Parallel()
	now := time.Now()
	b := newKeyBook(100, 100)
	b.sawRow("k", 10, now)
	taken := b.take(1, now)
	require.Equal(t, int64(0), taken.epoch)
	b.reset(1, now) // a replay committed while the round held the key
	settleAll(b, taken, keyResult{verdict: verdictMore, lastPublished: 30}, now)
	next := b.take(1, now)
	require.Equal(t, []claimKey{{key: "k", floor: 0}}, next.keys, "the replayed rows below 30 are read")
	require.Equal(t, int64(1), next.epoch)
}

func TestFloorCacheEvictsTheLeastRecentlyUsed(t *testing.T) {
	t.Parallel()
	c := newFloorCache(2)
	c.put("a", 1)
	c.put("b", 2)
	c.put("a", 3)
	c.put("c", 4) // evicts b
	_, ok := c.take("b")
	require.False(t, ok)
	f, ok := c.take("a")
	require.True(t, ok)
	require.Equal(t, int64(3), f)
}

func TestKeyBookBreaksTiesAtRandomSoRelaysTryDifferentKeys(t *testing.T) {
	t.Parallel()
	now := time.Now()
	firsts := map[string]bool{}
	for range 20 {
		b := newKeyBook(100, 100)
		for _, k := range []string{"a", "b", "c", "d", "e", "f", "g", "h"} {
			b.sawRow(k, 1, now)
		}
		firsts[b.take(1, now).keys[0].key] = true
	}
	require.Greater(t, len(firsts), 1, "twenty relays with the same due keys do not all start with the same one")
}
