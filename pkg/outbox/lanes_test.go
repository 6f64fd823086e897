package outbox

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func laneOutcome(id int64, key, dest string, size int) *outcome {
	return &outcome{event: &Event{ID: id, PartitionKey: key}, row: &claimedRow{}, dest: dest, size: size}
}

func admitAll(string) (bool, time.Time) { return true, time.Time{} }

// testLaneSet makes a lane set of outs (grouped into key plans, in order) that records the keys
// of the lanes that ended, in order.
func testLaneSet(outs []*outcome, limits func(string) Limits, admit func(string) (bool, time.Time)) (*laneSet, *[]string) {
	var plans []*keyPlan
	byKey := map[string]*keyPlan{}
	for _, o := range outs {
		kp := byKey[o.event.PartitionKey]
		if kp == nil {
			kp = &keyPlan{key: o.event.PartitionKey}
			byKey[kp.key] = kp
			plans = append(plans, kp)
		}
		kp.lane = append(kp.lane, o)
	}
	var ended []string
	return newLaneSet(plans, limits, admit, func(l *lane) { ended = append(ended, l.plan.key) }), &ended
}

func never() bool { return false }

func TestLaneSetBatchesOneRowPerKeyPerDestinationAndSize(t *testing.T) {
	t.Parallel()
	var outs []*outcome
	for k := range 12 {
		outs = append(outs, laneOutcome(int64(k), fmt.Sprintf("k%d", k), "A", 100))
	}
	outs = append(outs, laneOutcome(20, "k0", "A", 100), laneOutcome(21, "x", "B", 100), laneOutcome(22, "big", "A", 950))
	s, _ := testLaneSet(outs, fixedLimits(10, 1000), admitAll)

	dest, batch, ok := s.next(never)
	require.True(t, ok)
	require.Equal(t, "A", dest)
	require.Len(t, batch, 10, "at most ten entries, each of a different key")
	seen := map[string]bool{}
	for _, l := range batch {
		require.False(t, seen[l.o.event.PartitionKey])
		seen[l.o.event.PartitionKey] = true
	}
	dest2, batch2, ok := s.next(never)
	require.True(t, ok)
	total := 0
	for _, l := range batch2 {
		require.Equal(t, dest2, l.o.dest, "one destination per call")
		total += l.o.size
	}
	require.LessOrEqual(t, total, 1000, "a call fits the request limit")
}

func TestLaneSetKeepsAKeysRowsInOrderAndStopsAtAFailure(t *testing.T) {
	t.Parallel()
	outs := []*outcome{laneOutcome(1, "k", "A", 1), laneOutcome(2, "k", "A", 1), laneOutcome(3, "k", "A", 1)}
	s, ended := testLaneSet(outs, fixedLimits(10, 1000), admitAll)
	_, b1, _ := s.next(never)
	require.Equal(t, int64(1), b1[0].o.event.ID)
	done := make(chan struct{})
	go func() { // the second row is not handed out while the first is in flight
		defer close(done)
		_, b2, ok := s.next(never)
		require.True(t, ok)
		require.Equal(t, int64(2), b2[0].o.event.ID)
		s.finish(b2, []callResult{{err: errors.New("Throttled")}})
	}()
	time.Sleep(20 * time.Millisecond)
	select {
	case <-done:
		t.Fatal("row 2 went out before row 1 was acknowledged")
	default:
	}
	s.finish(b1, []callResult{{}})
	<-done
	require.Equal(t, []string{"k"}, *ended, "the lane ended at its failure")
	_, _, ok := s.next(never)
	require.False(t, ok, "the failure ends the lane")
	require.True(t, outs[0].done)
	require.Error(t, outs[1].err)
	require.Same(t, outs[1], outs[2].afterFailure, "row 3 waits behind row 2")
}

func TestLaneSetDefersADestinationThatBacksOffAndFailsUnpublishableRows(t *testing.T) {
	t.Parallel()
	retry := time.Now().Add(time.Minute)
	bad := laneOutcome(1, "bad", "", 1)
	bad.unpublishable = Permanent(errors.New("unknown topic"))
	outs := []*outcome{bad, laneOutcome(2, "down", "D", 1), laneOutcome(3, "up", "U", 1)}
	s, ended := testLaneSet(outs, fixedLimits(10, 1000), func(dest string) (bool, time.Time) {
		if dest == "D" {
			return false, retry
		}
		return true, time.Time{}
	})
	dest, batch, ok := s.next(never)
	require.True(t, ok)
	require.Equal(t, "U", dest)
	require.Len(t, batch, 1)
	s.finish(batch, []callResult{{}})
	_, _, ok = s.next(never)
	require.False(t, ok)
	require.Error(t, bad.err, "an unpublishable row fails its lane without a call")
	require.Equal(t, retry, outs[1].deferredUntil)
	require.Nil(t, outs[1].err, "a deferred row is not an attempt")
	require.Equal(t, []string{"bad", "down", "up"}, *ended, "each lane is reported as it ends")
}

func TestLaneSetStopsHandingOutCallsWhenStopping(t *testing.T) {
	t.Parallel()
	outs := []*outcome{laneOutcome(1, "a", "A", 1), laneOutcome(2, "b", "B", 1)}
	s, _ := testLaneSet(outs, fixedLimits(10, 1000), admitAll)
	var mu sync.Mutex
	stop := false
	stopping := func() bool { mu.Lock(); defer mu.Unlock(); return stop }
	_, batch, ok := s.next(stopping)
	require.True(t, ok)
	mu.Lock()
	stop = true
	mu.Unlock()
	s.finish(batch, []callResult{{cancelled: true}})
	_, _, ok = s.next(stopping)
	require.False(t, ok)
	require.False(t, outs[0].done)
	require.Nil(t, outs[0].err, "cancelled: not an attempt")
}

func TestDestinationsBackOffAsAWholeAndProbeOnce(t *testing.T) {
	t.Parallel()
	d := newDestinations(time.Second, 8*time.Second, time.Hour, func(time.Duration) time.Duration { return 0 })
	now := time.Now()
	ok, _ := d.admit("A", "")
	require.True(t, ok)
	require.False(t, d.startProbe("A", now), "a healthy destination is not probed")

	// Succeeded since the rows began failing: the rows are to blame, not the destination.
	d.succeeded("A", now)
	_, outage := d.failedWhole("A", now.Add(-time.Second), now, now, errors.New("x"))
	require.False(t, outage)

	// Nothing succeeded since: an outage. Ordinary rounds never call it; one probe goes out once
	// the backoff ended, and only the probe round may call.
	later := now.Add(time.Second)
	retryAt, outage := d.failedWhole("A", later, later, later, errors.New("AuthorizationError"))
	require.True(t, outage)
	require.Equal(t, later.Add(500*time.Millisecond), retryAt, "half the base, no jitter")
	ok, at := d.admit("A", "")
	require.False(t, ok)
	require.Equal(t, retryAt, at)
	require.False(t, d.startProbe("A", later), "not before the backoff ends")
	require.True(t, d.startProbe("A", retryAt), "the probe")
	require.False(t, d.startProbe("A", retryAt), "one probe at a time")
	ok, _ = d.admit("A", "")
	require.False(t, ok, "an ordinary round still does not call it")
	ok, _ = d.admit("A", "A")
	require.True(t, ok, "the probe round calls it")
	require.Len(t, d.down(), 1)
	require.Equal(t, "AuthorizationError", d.down()[0].LastError)

	// The probe fails: the backoff doubles. Then it answers: healthy again.
	// A call that was in flight when the outage began fails too: the backoff stays.
	again, _ := d.failedWhole("A", now, now, retryAt, errors.New("AuthorizationError"))
	require.Equal(t, retryAt, again, "a call begun before the outage does not double the backoff")
	retryAt2, _ := d.failedWhole("A", retryAt, retryAt, retryAt, errors.New("AuthorizationError"))
	require.Equal(t, retryAt.Add(time.Second), retryAt2)
	require.True(t, d.startProbe("A", retryAt2))
	d.succeeded("A", retryAt2)
	require.Empty(t, d.down())
	ok, _ = d.admit("A", "")
	require.True(t, ok)

	// A nil error (no entry was sent) never panics.
	_, outage = d.failedWhole("B", now, now, now, nil)
	require.True(t, outage)
}

func TestTruncateTextIsValidUTF8WithoutNUL(t *testing.T) {
	t.Parallel()
	s := truncateText("ab\x00cé\xffd", 5)
	require.Equal(t, "abcé", s, "NUL removed, cut before the character that would not fit")
	require.Equal(t, "abc\uFFFDd", truncateText("abc\xffd", 100))
}

// fixedLimits gives every destination calls of entries events and bytes bytes.
func fixedLimits(entries, bytes int) func(string) Limits {
	return func(string) Limits { return Limits{MaxEntries: entries, MaxMessageBytes: bytes, MaxCallBytes: bytes} }
}

func TestLaneSetTakesEachDestinationsOwnLimits(t *testing.T) {
	t.Parallel()
	var outs []*outcome
	for i := range 30 {
		dest := "sns"
		if i%2 == 1 {
			dest = "kinesis"
		}
		outs = append(outs, &outcome{event: &Event{ID: int64(i + 1), PartitionKey: string(rune('a' + i))}, dest: dest, size: 10})
	}
	s, _ := testLaneSet(outs, func(dest string) Limits {
		if dest == "kinesis" {
			return Limits{MaxEntries: 500, MaxMessageBytes: 1 << 20, MaxCallBytes: 5 << 20}
		}
		return snsLimits
	}, admitAll)
	sizes := map[string][]int{}
	for {
		dest, batch, ok := s.next(func() bool { return false })
		if !ok {
			break
		}
		sizes[dest] = append(sizes[dest], len(batch))
		results := make([]callResult, len(batch))
		s.finish(batch, results)
	}
	require.Equal(t, []int{15}, sizes["kinesis"], "one call takes every Kinesis lane")
	require.Equal(t, []int{10, 5}, sizes["sns"], "SNS calls take 10 entries")
}

// keyOrderLimits gives every destination calls of entries events and bytes bytes that keep a
// key's order (Limits.KeyOrderInCall).
func keyOrderLimits(entries, bytes int) func(string) Limits {
	return func(string) Limits {
		return Limits{MaxEntries: entries, MaxMessageBytes: bytes, MaxCallBytes: bytes, KeyOrderInCall: true}
	}
}

// entryIDs returns the row ids of a call's entries, in order.
func entryIDs(batch []entry) []int64 {
	ids := make([]int64, len(batch))
	for i, e := range batch {
		ids[i] = e.o.event.ID
	}
	return ids
}

func TestLaneSetCarriesSeveralRowsOfAKeyOnlyWhereTheDestinationKeepsTheirOrder(t *testing.T) {
	t.Parallel()
	rows := func() []*outcome {
		var outs []*outcome
		for i := range 5 {
			outs = append(outs, laneOutcome(int64(1+i), "hot", "A", 100))
		}
		return append(outs, laneOutcome(10, "a", "A", 100), laneOutcome(11, "b", "A", 100), laneOutcome(12, "hot", "B", 100))
	}
	// hot's rows 1..5 and 12 (another destination) are one lane.
	s, _ := testLaneSet(rows(), keyOrderLimits(6, 10_000), admitAll)
	_, batch, ok := s.next(never)
	require.True(t, ok)
	require.Equal(t, []int64{1, 2, 3, 4, 5, 10}, entryIDs(batch), "the hot lane's rows of the call's destination, in order, then other lanes up to MaxEntries")
	_, batch2, ok := s.next(never)
	require.True(t, ok)
	require.Equal(t, []int64{11}, entryIDs(batch2), "the hot lane is in a call: not taken again")

	s, _ = testLaneSet(rows(), keyOrderLimits(10, 350), admitAll)
	_, batch, _ = s.next(never)
	require.Equal(t, []int64{1, 2, 3}, entryIDs(batch), "MaxCallBytes bounds the lane's rows too")

	s, _ = testLaneSet(rows(), fixedLimits(10, 10_000), admitAll)
	_, batch, _ = s.next(never)
	require.Equal(t, []int64{1, 10, 11}, entryIDs(batch), "without KeyOrderInCall, one row per key")
}

func TestLaneSetAcknowledgesAKeysRowsInACallUpToItsFirstFailure(t *testing.T) {
	t.Parallel()
	failed := errors.New("InternalFailure")
	cases := []struct {
		name    string
		results []callResult
		done    []bool
		overtok []int // index of the row each overtook, -1 for none
	}{
		{"all acknowledged", []callResult{{}, {}, {}, {}}, []bool{true, true, true, true}, []int{-1, -1, -1, -1}},
		{"the failure and what follows wait", []callResult{{}, {err: failed}, {err: failed}, {err: failed}},
			[]bool{true, false, false, false}, []int{-1, -1, -1, -1}},
		{"cancelled: not attempted", []callResult{{}, {cancelled: true}, {cancelled: true}, {cancelled: true}},
			[]bool{true, false, false, false}, []int{-1, -1, -1, -1}},
		{"a later row acknowledged after a failure overtook it", []callResult{{}, {err: failed}, {}, {err: failed}},
			[]bool{true, false, true, false}, []int{-1, -1, 1, -1}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var outs []*outcome
			for i := range 4 {
				outs = append(outs, laneOutcome(int64(1+i), "hot", "A", 1))
			}
			s, ended := testLaneSet(outs, keyOrderLimits(10, 1000), admitAll)
			var overtaken [][2]*outcome
			s.onOvertake = func(later, earlier *outcome) { overtaken = append(overtaken, [2]*outcome{later, earlier}) }
			_, batch, ok := s.next(never)
			require.True(t, ok)
			require.Len(t, batch, 4)
			s.finish(batch, tc.results)
			_, _, ok = s.next(never)
			require.False(t, ok, "the lane is over: every row acknowledged, or it stopped")
			require.Equal(t, []string{"hot"}, *ended)
			var want [][2]*outcome
			for i, o := range outs {
				require.Equal(t, tc.done[i], o.done, "row %d acknowledged", i+1)
				if tc.overtok[i] >= 0 {
					require.Same(t, outs[tc.overtok[i]], o.overtook)
					want = append(want, [2]*outcome{o, outs[tc.overtok[i]]})
				} else {
					require.Nil(t, o.overtook)
				}
			}
			require.Equal(t, want, overtaken, "each overtaking row is reported")
			if tc.results[1].err != nil {
				require.Equal(t, failed, outs[1].err, "the first failure is the row's attempt")
				require.Nil(t, outs[3].err, "a row behind the failure is not an attempt")
				require.Same(t, outs[1], outs[3].afterFailure)
				require.Equal(t, verdictWait, (&keyPlan{key: "hot", lane: outs}).result().verdict, "the key waits behind its failed row")
			}
			for _, o := range outs[1:] {
				if tc.results[1].cancelled {
					require.Nil(t, o.err, "cancelled: not an attempt")
				}
			}
		})
	}
}
