package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sluicehq/sluice/pkg/outbox"
)

// The stub declares Kafka's limits, with KeyOrderInCall as asked, and counts a key's row
// acknowledged after a later one as out of order.
func TestHotKeyStubChecksOrder(t *testing.T) {
	t.Parallel()
	for _, keyOrder := range []bool{false, true} {
		s := newHotKeyStub(newWaitBook(), keyOrder, 3)
		s.Delay = 0
		if lim := s.Limits("kafka://orders"); lim.KeyOrderInCall != keyOrder || lim.MaxEntries != 500 {
			t.Fatalf("limits %+v, want Kafka's with KeyOrderInCall %t", lim, keyOrder)
		}
		ev := func(id int64) *outbox.Event { return &outbox.Event{ID: id, EventID: uuid.New(), PartitionKey: "hot"} }
		e1, e2, e3 := ev(1), ev(2), ev(3)
		s.PublishBatch(context.Background(), "kafka://orders", []*outbox.Event{e1, e3})
		s.PublishBatch(context.Background(), "kafka://orders", []*outbox.Event{e2, e1})
		if s.outOfOrder != 1 || s.duplicates != 1 || s.maxKeyRows != 2 || s.hotDrained().IsZero() {
			t.Fatalf("out of order %d, duplicates %d, most rows of a key %d, drained %v", s.outOfOrder, s.duplicates, s.maxKeyRows, s.hotDrained())
		}
	}
}

func TestRenderHotKey(t *testing.T) {
	t.Parallel()
	idle := Latencies{N: 10, P50: 40 * time.Millisecond, Max: 90 * time.Millisecond}
	rep := &Report{HotKey: &HotKeyResult{Delay: 10 * time.Millisecond, HotRows: 10_000, IdleKeys: 100, Waves: 10, WaveEvery: 500 * time.Millisecond,
		Runs: []HotKeyRun{
			{Name: "one", Drain: 100 * time.Second, Idle: idle, IdleRows: 10},
			{Name: "several", KeyOrderInCall: true, Drain: 12 * time.Second, Idle: idle, IdleRows: 10},
			{Name: "one", MaxPerKey: 100, Drain: 100 * time.Second, Idle: idle, IdleRows: 10},
			{Name: "several", KeyOrderInCall: true, MaxPerKey: 100, Drain: 2 * time.Second, Idle: idle, IdleRows: 10},
		}}}
	md := rep.Markdown()
	for _, want := range []string{"## 15. Hot key (issue 25)", "| 8.3× |", "| 50.0× |",
		"`MaxPerKey` 10 (default) | 25 | drains ≥ 10× faster", "8.3× (833 rows/s", "**not met**", "50.0× (5,000 rows/s"} {
		if !strings.Contains(md, want) {
			t.Errorf("the report lacks %q", want)
		}
	}
	ts := rep.hotKeyTargets()
	if len(ts) != 3 || ts[0].Status == "met" || ts[1].Status != "met" || ts[2].Status != "met" {
		t.Fatalf("targets %+v", ts)
	}
}
