package outbox

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// settleAll gives back every key of rk with the same verdict.
func settleAll(b *keyBook, rk roundKeys, v keyResult, now time.Time) {
	results := make([]keyResult, len(rk.keys))
	for i, k := range rk.keys {
		results[i] = v
		results[i].key = k
	}
	b.settle(results, now)
}

func TestKeyBookHandsOutDueKeysOldestFirstAndNeverTwice(t *testing.T) {
	t.Parallel()
	now := time.Now()
	b := newKeyBook(100)
	b.sawRow("b", "", now.Add(-time.Second))
	b.sawRow("a", "", now.Add(-2*time.Second))
	b.sawRow("a", "", now) // a is already due: still one entry
	b.sawHead("c", headBackingOff, now.Add(time.Minute), "", now)

	first := b.take(10, now)
	require.Equal(t, []string{"a", "b"}, first.keys, "due longest first; c backs off")
	require.Empty(t, b.take(10, now).keys, "taken keys are not handed out again")
	require.Len(t, b.take(10, now.Add(2*time.Minute)).keys, 1, "c is due once its backoff ends")
	at, ok := b.nextDue()
	require.False(t, ok, "every key is taken: %v", at)
}

func TestKeyBookVerdicts(t *testing.T) {
	t.Parallel()
	now := time.Now()
	b := newKeyBook(100)
	for _, k := range []string{"drained", "more", "wait", "parked", "release", "dirty", "elsewhere"} {
		b.sawRow(k, "", now)
	}
	taken := b.take(10, now)
	require.Len(t, taken.keys, 7)
	b.sawRow("dirty", "", now) // a new row while the round holds the key
	b.settle([]keyResult{
		{key: "drained", verdict: verdictDrained},
		{key: "more", verdict: verdictMore},
		{key: "wait", verdict: verdictWait, until: now.Add(time.Hour)},
		{key: "parked", verdict: verdictParked},
		{key: "release", verdict: verdictRelease},
		{key: "dirty", verdict: verdictDrained},
		{key: "elsewhere", verdict: verdictElsewhere},
	}, now)
	require.ElementsMatch(t, []string{"more", "release", "dirty"}, b.take(10, now).keys)
	require.Equal(t, 4, b.size(), "drained and elsewhere left the book, parked is kept apart; waiting stays")
	b.sawRow("parked", "", now)
	require.Empty(t, b.take(10, now).keys, "a new row behind a quarantined head does not make the key due")
}

func TestKeyBookSweepAndResetReviveParkedKeys(t *testing.T) {
	t.Parallel()
	now := time.Now()
	b := newKeyBook(100)
	b.sawHead("q", headQuarantined, now, "", now)
	b.sawRow("q", "", now) // new rows behind a quarantined head do not make it due
	require.Empty(t, b.take(10, now).keys)
	b.sawHead("q", headClaimable, now, "", now) // an operator released it
	taken := b.take(10, now)
	require.Equal(t, []string{"q"}, taken.keys)
	settleAll(b, taken, keyResult{verdict: verdictParked}, now)
	require.Empty(t, b.take(10, now).keys)
	b.reset(now)
	require.Equal(t, []string{"q"}, b.take(10, now).keys, "an operator action unparks every key")
}

func TestKeyBookOverflowAsksForASweep(t *testing.T) {
	t.Parallel()
	now := time.Now()
	b := newKeyBook(4)
	for i := range 6 {
		b.sawRow(string(rune('a'+i)), "", now)
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
	b := newKeyBook(capacity)
	for i := range capacity {
		b.sawRow(fmt.Sprintf("k%03d", i), "", now)
	}
	taken := b.take(capacity, now)
	require.Len(t, taken.keys, capacity)
	var results []keyResult
	for i, k := range taken.keys {
		switch i % 3 {
		case 0:
			results = append(results, keyResult{key: k, verdict: verdictParked})
		case 1:
			results = append(results, keyResult{key: k, verdict: verdictWait, until: now.Add(time.Duration(i) * time.Minute)})
		default:
			results = append(results, keyResult{key: k, verdict: verdictHeld, dest: "arn:down"})
		}
	}
	b.settle(results, now)
	require.Equal(t, 2*capacity/3, b.size(), "parked keys are kept apart")

	for i := range capacity {
		b.sawRow(fmt.Sprintf("new%03d", i), "", now)
	}
	got := map[string]bool{}
	for {
		rk := b.take(50, now)
		if len(rk.keys) == 0 {
			break
		}
		for _, k := range rk.keys {
			got[k] = true
		}
	}
	for i := range capacity {
		require.True(t, got[fmt.Sprintf("new%03d", i)], "new key %d is handed out", i)
	}
	require.LessOrEqual(t, b.size(), capacity)
	require.True(t, b.overflowed, "evicted keys are looked for again by a sweep")
}

// Keys waiting for a failing destination are never handed to a round; a probe takes a call's
// worth of them, and all come back once the destination answers.
func TestKeyBookHoldsAFailingDestinationsKeysForItsProbe(t *testing.T) {
	t.Parallel()
	now := time.Now()
	b := newKeyBook(1000)
	for i := range 100 {
		b.sawRow(fmt.Sprintf("down%02d", i), "", now)
	}
	settleAll(b, b.take(1000, now), keyResult{verdict: verdictHeld, dest: "arn:down"}, now)
	b.sawRow("healthy", "", now)
	require.Equal(t, []string{"healthy"}, b.take(1000, now.Add(time.Hour)).keys, "held keys are never due for a round")
	require.Equal(t, []string{"arn:down"}, b.heldDestinations())

	probe := b.takeHeld("arn:down")
	require.Equal(t, "arn:down", probe.probe)
	require.Len(t, probe.keys, probeKeys, "one call's worth of keys probes the destination")

	// The probe fails: its keys are held again.
	settleAll(b, probe, keyResult{verdict: verdictHeld, dest: "arn:down"}, now)
	require.Empty(t, b.take(1000, now.Add(time.Hour)).keys)
	probe = b.takeHeld("arn:down")
	require.Len(t, probe.keys, probeKeys)
	settleAll(b, probe, keyResult{verdict: verdictMore}, now)
	b.release("arn:down", now)
	require.Len(t, b.take(1000, now).keys, 100, "every key of the destination is due again")
	require.Empty(t, b.heldDestinations())
}

func TestKeyBookBreaksTiesAtRandomSoRelaysTryDifferentKeys(t *testing.T) {
	t.Parallel()
	now := time.Now()
	firsts := map[string]bool{}
	for range 20 {
		b := newKeyBook(100)
		for _, k := range []string{"a", "b", "c", "d", "e", "f", "g", "h"} {
			b.sawRow(k, "", now)
		}
		firsts[b.take(1, now).keys[0]] = true
	}
	require.Greater(t, len(firsts), 1, "twenty relays with the same due keys do not all start with the same one")
}
