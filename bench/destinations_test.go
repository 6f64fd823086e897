package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sluicehq/sluice/pkg/outbox"
)

// Every kind's publisher, over its stub, gets every event acknowledged (the relay, not the
// publisher, cuts calls to the kind's limit).
func TestDestinationStubsAcknowledgeEverything(t *testing.T) {
	events := make([]*outbox.Event, 25)
	for i := range events {
		events[i] = &outbox.Event{ID: int64(i + 1), EventID: uuid.New(), EventType: "OrderCreated", PartitionKey: fmt.Sprintf("k%d", i),
			Payload: json.RawMessage(`{"n":1}`), CreatedAt: time.Now()}
	}
	calls := &delayedCalls{delay: time.Millisecond}
	for _, k := range destinationKinds(calls) {
		calls.calls.Store(0)
		calls.entries.Store(0)
		for i, err := range k.pub.PublishBatch(context.Background(), k.dest, events) {
			if err != nil {
				t.Fatalf("%s: event %d: %v", k.kind, i, err)
			}
		}
		if calls.entries.Load() != int64(len(events)) {
			t.Errorf("%s: %d entries acknowledged, want %d", k.kind, calls.entries.Load(), len(events))
		}
	}
}

func TestRenderDestinations(t *testing.T) {
	r := &Report{Destinations: &DestinationsResult{Delay: 10 * time.Millisecond, Rows: 100, Keys: 10, Repeats: 1, Runs: []DestinationRun{
		{Kind: "sns", Call: "PublishBatch", Concurrency: 4, MaxEntries: 10, Events: 100, Elapsed: time.Second, Calls: 10, Rates: []float64{100}},
		{Kind: "kinesis", Call: "PutRecords", Concurrency: 4, MaxEntries: 500, Events: 100, Elapsed: time.Second / 2, Calls: 2, Rates: []float64{200}},
	}}}
	var b strings.Builder
	r.destinationsMarkdown(func(f string, a ...any) { fmt.Fprintf(&b, f, a...) })
	for _, want := range []string{"## 11. Relay throughput per destination", "| sns | PublishBatch | 4 | 10 | 100 | 10 | 10.0 | — | 0 | 100 |",
		"| kinesis | PutRecords | 4 | 500 | 200 | 2 | 50.0 | 2.00× | 0 | 200 |"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("missing %q in:\n%s", want, b.String())
		}
	}
}
