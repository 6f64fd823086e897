package outbox

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func keysOf(cs []claimKey) []string {
	out := make([]string, len(cs))
	for i, c := range cs {
		out[i] = c.key
	}
	return out
}

func TestKeyBookHandsOutDueKeysOldestFirstAndNeverTwice(t *testing.T) {
	t.Parallel()
	now := time.Now()
	b := newKeyBook(100, 100)
	b.sawRow("b", 2, now.Add(-time.Second))
	b.sawRow("a", 1, now.Add(-2*time.Second))
	b.sawRow("a", 3, now) // a is already due: still one entry
	b.sawHead("c", 7, headBackingOff, now.Add(time.Minute), now)

	first := b.take(10, now)
	require.Equal(t, []string{"a", "b"}, keysOf(first), "due longest first; c backs off")
	require.Empty(t, b.take(10, now), "taken keys are not handed out again")
	require.Len(t, b.take(10, now.Add(2*time.Minute)), 1, "c is due once its backoff ends")
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
	require.Len(t, b.take(10, now), 6)
	b.sawRow("dirty", 20, now) // a new row while the round holds the key
	b.settle([]keyResult{
		{key: "drained", verdict: verdictDrained, lastPublished: 10},
		{key: "more", verdict: verdictMore, lastPublished: 10},
		{key: "wait", verdict: verdictWait, until: now.Add(time.Hour)},
		{key: "parked", verdict: verdictParked},
		{key: "release", verdict: verdictRelease},
		{key: "dirty", verdict: verdictDrained, lastPublished: 10},
	}, now)
	due := b.take(10, now)
	require.ElementsMatch(t, []string{"more", "release", "dirty"}, keysOf(due))
	for _, c := range due {
		if c.key == "more" || c.key == "dirty" {
			require.Equal(t, int64(10), c.floor, "%s is read after what was published", c.key)
		}
	}
	require.Equal(t, 5, b.size(), "drained left the book; parked and waiting stay")

	// A drained key's floor is remembered: its next row is read after it.
	b.sawRow("drained", 11, now)
	next := b.take(10, now)
	require.Equal(t, []claimKey{{key: "drained", floor: 10}}, next)
}

func TestKeyBookLateCommitLowersTheFloor(t *testing.T) {
	t.Parallel()
	now := time.Now()
	b := newKeyBook(100, 100)
	b.sawRow("k", 50, now)
	b.take(1, now)
	b.settle([]keyResult{{key: "k", verdict: verdictMore, lastPublished: 50}}, now)
	b.sawRow("k", 7, now) // committed after rows with higher ids went out
	require.Equal(t, []claimKey{{key: "k", floor: 6}}, b.take(1, now))
}

func TestKeyBookSweepAndResetReviveParkedKeys(t *testing.T) {
	t.Parallel()
	now := time.Now()
	b := newKeyBook(100, 100)
	b.sawHead("q", 5, headQuarantined, now, now)
	b.sawRow("q", 9, now) // new rows behind a quarantined head do not make it due
	require.Empty(t, b.take(10, now))
	b.sawHead("q", 5, headClaimable, now, now) // an operator released it
	require.Equal(t, []claimKey{{key: "q", floor: 4}}, b.take(10, now))
	b.settle([]keyResult{{key: "q", verdict: verdictParked}}, now)
	require.Empty(t, b.take(10, now))
	b.reset(now)
	require.Equal(t, []claimKey{{key: "q", floor: 0}}, b.take(10, now), "reset reads every key from its first pending row")
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
	taken := b.take(4, now)
	var results []keyResult
	for _, c := range taken {
		results = append(results, keyResult{key: c.key, verdict: verdictDrained})
	}
	b.settle(results, now)
	require.True(t, b.takeOverflow(), "room again: sweep to find the dropped keys")
	require.False(t, b.takeOverflow())
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
		firsts[b.take(1, now)[0].key] = true
	}
	require.Greater(t, len(firsts), 1, "twenty relays with the same due keys do not all start with the same one")
}
