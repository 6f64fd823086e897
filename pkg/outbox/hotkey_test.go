package outbox_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/sluicehq/sluice/internal/testwait"
	"github.com/sluicehq/sluice/pkg/outbox"
)

// keyOrderDest is a recorder that declares it keeps a key's order inside one call
// (Limits.KeyOrderInCall), as Kafka does: failEntry chooses entries to fail, and with gapless a
// failed entry fails every later entry of its key in the call. Without gapless it breaks that
// promise: it acknowledges later entries of a key after failing an earlier one.
type keyOrderDest struct {
	*recorder
	failEntry func(e *outbox.Event, attempt int) error
	gapless   bool
	// refuseBatches refuses every call of several entries as a whole, permanently (as SNS
	// answers BatchRequestTooLong): the relay then asks entry by entry.
	refuseBatches bool

	mu       sync.Mutex
	attempts map[uuid.UUID]int
	verdict  map[uuid.UUID]error
	// maxKeyRows is the most rows of one key a call carried; overtaking counts the entries
	// acknowledged after an earlier entry of their key in the same call failed.
	maxKeyRows, overtaking int
}

func newKeyOrderDest(gapless bool, failEntry func(e *outbox.Event, attempt int) error) *keyOrderDest {
	d := &keyOrderDest{recorder: newRecorder(), failEntry: failEntry, gapless: gapless,
		attempts: map[uuid.UUID]int{}, verdict: map[uuid.UUID]error{}}
	d.recorder.fail = func(e *outbox.Event) error {
		d.mu.Lock()
		defer d.mu.Unlock()
		return d.verdict[e.EventID]
	}
	return d
}

var _ outbox.LimitedPublisher = (*keyOrderDest)(nil)

var errBatchTooLong = outbox.Permanent(errors.New("BatchRequestTooLong"))

func (d *keyOrderDest) Limits(string) outbox.Limits {
	return outbox.Limits{MaxEntries: 500, MaxMessageBytes: 256 << 10, MaxCallBytes: 5 << 20, KeyOrderInCall: true}
}

func (d *keyOrderDest) MessageSize(_ string, _ *outbox.Event, payloadLen int) int {
	return payloadLen + 200
}

func (d *keyOrderDest) PublishBatch(ctx context.Context, dest string, events []*outbox.Event) []error {
	d.mu.Lock()
	rows := map[string]int{}
	failed := map[string]error{}
	for _, e := range events {
		rows[e.PartitionKey]++
		d.maxKeyRows = max(d.maxKeyRows, rows[e.PartitionKey])
		err := d.failEntry(e, d.attempts[e.EventID])
		if d.refuseBatches && len(events) > 1 {
			err = errBatchTooLong
		}
		d.attempts[e.EventID]++
		prev := failed[e.PartitionKey]
		switch {
		case prev != nil && d.gapless:
			err = prev
		case prev != nil && err == nil:
			d.overtaking++
		case err != nil:
			failed[e.PartitionKey] = err
		}
		d.verdict[e.EventID] = err
	}
	d.mu.Unlock()
	return d.recorder.PublishBatch(ctx, dest, events)
}

// drainStats runs RunOnce until no row is pending and returns what the rounds counted.
func drainStats(t *testing.T, b *bundle, r *outbox.Relay) outbox.Stats {
	t.Helper()
	var total outbox.Stats
	testwait.Until(t, "every row published", func() bool {
		st, err := r.RunOnce(context.Background())
		require.NoError(t, err)
		total.Published += st.Published
		total.OrderViolations += st.OrderViolations
		return b.countWhere(t, "published_at IS NULL") == 0
	})
	return total
}

// Issue 25: where the destination keeps a key's order in a call, a hot key's rows share calls
// and still reach the broker in id order, each once.
func TestSeveralRowsOfAKeyShareACallInOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	d := newKeyOrderDest(true, func(*outbox.Event, int) error { return nil })
	b.write(t, 60, 1) // k0: the hot key
	b.write(t, 8, 8)  // one row each of k0..k7
	r := b.relay(t, func(c *outbox.RelayConfig) { c.Publisher = d })
	st := drainStats(t, b, r)
	require.Equal(t, 68, st.Published)
	require.Zero(t, st.OrderViolations)
	require.Equal(t, 68, d.count(), "each row acknowledged once")
	d.requireKeyOrder(t)
	require.Greater(t, d.maxKeyRows, 1, "a call carried several rows of the hot key")
}

// A failed entry of a key fails the later entries of its key in the call (as Kafka does): the
// rows before it are published, the rows behind it are not attempts; after the retry
// everything goes out in order, each row once.
func TestAFailedEntryLeavesTheLaterRowsOfItsKeyForTheRetry(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.write(t, 30, 1)
	b.write(t, 6, 6)
	fourth := b.rowID(t, "k0", 3)
	d := newKeyOrderDest(true, func(e *outbox.Event, attempt int) error {
		if e.ID == fourth && attempt < 2 {
			return errors.New("InternalFailure")
		}
		return nil
	})
	r := b.relay(t, func(c *outbox.RelayConfig) { c.Publisher = d })
	st := drainStats(t, b, r)
	require.Equal(t, 36, st.Published)
	require.Zero(t, st.OrderViolations)
	require.Equal(t, 36, d.count(), "a row behind the failure was not acknowledged, so it is published once")
	d.requireKeyOrder(t)
	require.Equal(t, 35, b.countWhere(t, fmt.Sprintf("attempts = 0 AND id <> %d", fourth)),
		"the rows behind the failed one waited without an attempt")
}

// A destination that declares KeyOrderInCall and then acknowledges a later entry of a key after
// failing an earlier one broke its promise: the row is published (the broker has it), but the
// relay counts it and logs an error.
func TestALaterRowAcknowledgedAfterAFailedOneIsAViolation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.write(t, 10, 1)
	fourth := b.rowID(t, "k0", 3)
	d := newKeyOrderDest(false, func(e *outbox.Event, attempt int) error {
		if e.ID == fourth && attempt == 0 {
			return errors.New("InternalFailure")
		}
		return nil
	})
	var logs bytes.Buffer
	r := b.relay(t, func(c *outbox.RelayConfig) {
		c.Publisher = d
		c.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelError}))
	})
	st := drainStats(t, b, r)
	require.Equal(t, 10, st.Published)
	require.Positive(t, d.overtaking, "the destination broke its promise")
	require.Equal(t, d.overtaking, st.OrderViolations, "every overtaking row is counted")
	require.Equal(t, d.overtaking, bytes.Count(logs.Bytes(), []byte("level=ERROR msg=\"outbox destination acknowledged a row after failing")))
	require.Zero(t, b.countWhere(t, "published_at IS NULL"), "the overtaking rows are recorded as published")
}

// Kafka, for real (kfake): a hot key's rows go out several to a call; a produce request whose
// partition the broker refuses fails every record of that partition in it, so the key's later
// rows wait and go out after the retry, in order, once.
func TestKafkaHotKeyInOrderThroughAPartitionFailure(t *testing.T) {
	t.Parallel()
	const topic = "orders"
	cluster, client := kafkaCluster(t, topic, 2)
	var once sync.Once
	var refused atomic.Bool
	cluster.ControlKey(kmsg.Produce.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		handled := false
		once.Do(func() { handled = true })
		if !handled {
			return nil, nil, false
		}
		refused.Store(true)
		return refuseProduce(req), nil, true
	})
	b := setup(t)
	b.write(t, 200, 2) // two hot keys
	r := b.relay(t, func(c *outbox.RelayConfig) {
		c.Publisher = outbox.NewKafkaPublisher(client, 0)
		c.Topics = map[string]string{testTopic: "kafka://" + topic}
	})
	st := drainStats(t, b, r)
	require.True(t, refused.Load())
	require.Zero(t, st.OrderViolations)
	require.Zero(t, b.countWhere(t, "quarantined_at IS NOT NULL"))

	idOf := eventIDs(t, b)
	got := readAll(t, cluster, topic, 200)
	last := map[string]int64{}
	seen := map[string]bool{}
	for _, dl := range got {
		if seen[dl.messageID] {
			continue
		}
		seen[dl.messageID] = true
		id := idOf[dl.messageID]
		require.Greater(t, id, last[dl.key], "key %s: row %d after row %d", dl.key, id, last[dl.key])
		last[dl.key] = id
	}
	require.Len(t, seen, 200)
}

// rowID returns the id of key's n-th row (from 0) in id order.
func (b *bundle) rowID(t *testing.T, key string, n int) int64 {
	t.Helper()
	var id int64
	require.NoError(t, b.pool.QueryRow(context.Background(),
		`SELECT id FROM outbox_event WHERE partition_key = $1 ORDER BY id OFFSET $2 LIMIT 1`, key, n).Scan(&id))
	return id
}

// In a call carrying several rows of a key, a row whose payload the claim check could not store
// is not sent, and neither are the rows of its key behind it: they wait, without an attempt, and
// go out after it, in order, each once.
func TestAClaimCheckFailureHoldsBackTheLaterRowsOfItsKeyInTheCall(t *testing.T) {
	t.Parallel()
	b := setup(t)
	insertSized(t, b, "k1", 400)
	big := insertSized(t, b, "k1", 4000)
	insertSized(t, b, "k1", 400)
	insertSized(t, b, "k1", 400)
	store := &memoryStore{}
	failed := false
	store.fail = func(key string) error {
		if key == big.String() && !failed {
			failed = true
			return errors.New("s3 is down")
		}
		return nil
	}
	d := newKeyOrderDest(true, func(*outbox.Event, int) error { return nil })
	r := b.relay(t, func(c *outbox.RelayConfig) {
		c.Publisher = d
		c.ClaimCheck = &outbox.ClaimCheck{Store: store, Bucket: "b", Threshold: 1024}
	})
	st := drainStats(t, b, r)
	require.True(t, failed)
	require.Equal(t, 4, st.Published)
	require.Zero(t, st.OrderViolations)
	require.Equal(t, 4, d.count(), "no row behind the failed upload was sent before it")
	d.requireKeyOrder(t)
	require.Equal(t, 2, b.countWhere(t, "attempts = 0 AND id > (SELECT id FROM outbox_event WHERE event_id = '"+big.String()+"')"),
		"the rows behind it waited without an attempt")
}

// A call refused as a whole is asked again entry by entry; a row of a key behind one refused on
// its own is not asked (it would overtake it): it waits behind the quarantined row.
func TestAskedEntryByEntryARowBehindARefusedOneIsNotSent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.write(t, 3, 1)
	second := b.rowID(t, "k0", 1)
	d := newKeyOrderDest(true, func(e *outbox.Event, _ int) error {
		if e.ID == second {
			return outbox.Permanent(errors.New("InvalidParameter"))
		}
		return nil
	})
	d.refuseBatches = true
	r := b.relay(t, func(c *outbox.RelayConfig) { c.Publisher = d })
	testwait.Until(t, "the refused row quarantined", func() bool {
		_, err := r.RunOnce(context.Background())
		require.NoError(t, err)
		return b.countWhere(t, "quarantined_at IS NOT NULL") == 1
	})
	require.Equal(t, 1, b.countWhere(t, "published_at IS NOT NULL"), "the row before it")
	require.Equal(t, 1, b.countWhere(t, fmt.Sprintf("id > %d AND published_at IS NULL AND quarantined_at IS NULL AND attempts = 0", second)),
		"the row behind it waits, never sent alone")
	require.Equal(t, 1, d.count())
	d.requireKeyOrder(t)
}
