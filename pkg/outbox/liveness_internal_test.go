package outbox

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/testdb"
)

// ackingDestination is a destination that acknowledges everything and remembers the row ids.
type ackingDestination struct {
	mu  sync.Mutex
	ids map[uuid.UUID]bool
}

func (a *ackingDestination) PublishBatch(_ context.Context, _ string, events []*Event) []error {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, e := range events {
		a.ids[e.EventID] = true
	}
	return make([]error, len(events))
}

func (a *ackingDestination) published(id uuid.UUID) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.ids[id]
}

// Scenario 2 of issue 40: a key book full of keys in backoff used to never admit a key that
// only a sweep can find (a row that committed late below the relay's start frontier): a swept
// head never evicted, and a sweep was asked for only below half capacity. The book's capacity
// is scaled down to 4; the keys in backoff wait an hour, far beyond the liveness bound.
func TestAFullBookOfWaitingKeysTakesASweptKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	writeKey := func(key string) {
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		_, err = Write(ctx, tx, Message{Topic: "t", AggregateType: "a", AggregateID: key, EventType: "e", PartitionKey: key,
			Payload: json.RawMessage(`{}`)})
		require.NoError(t, err)
		require.NoError(t, tx.Commit(ctx))
	}
	// The late row takes its id first and commits after the relay started.
	lateTx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = lateTx.Rollback(ctx) }()
	late, err := Write(ctx, lateTx, Message{Topic: "t", AggregateType: "a", AggregateID: "late", EventType: "e",
		PartitionKey: "late", Payload: json.RawMessage(`{}`)})
	require.NoError(t, err)
	for i := range 4 {
		writeKey(fmt.Sprintf("wait-%d", i))
	}
	_, err = pool.Exec(ctx, `UPDATE outbox_event SET available_at = now() + interval '1 hour' WHERE partition_key LIKE 'wait-%'`)
	require.NoError(t, err)

	pub := &ackingDestination{ids: map[uuid.UUID]bool{}}
	r, err := NewRelay(pool, RelayConfig{Publisher: pub, DefaultTopic: "arn:aws:sns:us-east-1:000000000000:t",
		PollInterval: 20 * time.Millisecond, RescanInterval: 100 * time.Millisecond, bookCapacity: 4})
	require.NoError(t, err)
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = r.Run(runCtx) }()
	defer func() { cancel(); <-done }()
	require.Eventually(t, func() bool { return r.book.size() == 4 }, time.Minute, 10*time.Millisecond,
		"the waiting keys fill the book")
	require.NoError(t, lateTx.Commit(ctx))

	deadline := time.Now().Add(20 * time.Second)
	for !pub.published(late[0].EventID) && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	require.True(t, pub.published(late[0].EventID), "a key only a sweep can find never got into a book full of keys in backoff")
}
