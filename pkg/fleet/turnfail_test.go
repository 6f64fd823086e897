package fleet_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/testwait"
	"github.com/sluicehq/sluice/pkg/fleet"
	"github.com/sluicehq/sluice/pkg/outbox"
)

// ackCounter wraps a Publisher and counts, per event id, the acknowledgements its calls got.
type ackCounter struct {
	outbox.Publisher
	before func() // called before each call, when set
	mu     sync.Mutex
	acks   map[uuid.UUID]int
}

func (p *ackCounter) PublishBatch(ctx context.Context, dest string, events []*outbox.Event) []error {
	if p.before != nil {
		p.before()
	}
	errs := p.Publisher.PublishBatch(ctx, dest, events)
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, e := range events {
		if errs[i] == nil {
			p.acks[e.EventID]++
		}
	}
	return errs
}

// twice returns how many events were acknowledged more than once.
func (p *ackCounter) twice() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, c := range p.acks {
		if c > 1 {
			n++
		}
	}
	return n
}

// syncBuffer is a log sink safe for concurrent writers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestATurnWhoseRoundLostItsConnectionKeepsWhatItPublished: the backlogged tenant's round
// loses its session while its call to the broker is in flight (the server ends it, as a
// failover, an idle timeout or an operator would): the turn fails, its log names the
// statement that failed, and the rows the broker acknowledged are marked published all the
// same: the tenant's next turn publishes the rest, and no event is acknowledged twice.
func TestATurnWhoseRoundLostItsConnectionKeepsWhatItPublished(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	hot := newTenantDB(t, "hot")
	const rows = 200
	hot.write(t, rows, 20, 0)

	var once sync.Once
	pub := &ackCounter{Publisher: b.relay.Publisher, acks: map[uuid.UUID]int{}, before: func() {
		once.Do(func() { // the first call: end the relay's sessions while it is in flight
			_, err := hot.pool.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
				WHERE datname = current_database() AND application_name = 'sluice-fleet-relay'`)
			if err != nil { // the relay's goroutine: no FailNow here
				t.Errorf("end the relay's sessions: %v", err)
			}
		})
	}}
	relay := b.relay
	relay.Publisher = pub
	logs := &syncBuffer{}
	relay.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	runFleet(t, fleet.Config{Registry: fleet.Static{hot.tenant()}, Relay: relay, BurstPipelines: 1,
		SweepInterval: time.Hour, RegistryRefresh: time.Hour})

	testwait.Until(t, "a turn failed", func() bool { return strings.Contains(logs.String(), "tenant turn failed") })
	requireInOrder(t, b.receive(t, rows), map[string]int{"hot": rows})
	testwait.Until(t, "every row marked published", func() bool { return hot.pending(t) == 0 })
	require.Contains(t, logs.String(), "record publish outcomes", "the failed turn's log names the statement that failed")
	require.Zero(t, pub.twice(), "no event acknowledged twice: the failed round's acknowledged rows were recorded")
}
