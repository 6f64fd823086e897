package outbox_test

// Issue 10, "a blast radius of one": each test is one scenario in which a bad row, key, topic or
// payload used to stop every other key, written from the scenario, on real PostgreSQL.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/testwait"
	"github.com/sluicehq/sluice/pkg/outbox"
)

// writeKey commits n events of one partition key on topic.
func (b *bundle) writeKey(t *testing.T, key, topic string, n int) []outbox.Message {
	t.Helper()
	msgs := make([]outbox.Message, n)
	for i := range msgs {
		msgs[i] = outbox.Message{Topic: topic, AggregateType: "order", AggregateID: key, EventType: "OrderCreated",
			PartitionKey: key, Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i))}
	}
	ctx := context.Background()
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	written, err := outbox.Write(ctx, tx, msgs...)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	return written
}

func (b *bundle) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	_, err := b.pool.Exec(context.Background(), sql, args...)
	require.NoError(t, err)
}

// publishedKeys returns how many rows of each key the broker acknowledged.
func (r *recorder) publishedKeys() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]int{}
	for k, ids := range r.byKey {
		out[k] = len(ids)
	}
	return out
}

func idleKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("idle-%02d", i)
	}
	return keys
}

// Scenario 1: one key in backoff used to stall everyone (the claim's window was full of its rows).
func TestKeyInBackoffWithABacklogDelaysNoOtherKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	hot := b.writeKey(t, "hot", testTopic, 3000)
	for _, k := range idleKeys(20) {
		b.writeKey(t, k, testTopic, 1)
	}
	// The destination refuses hot's head (a retryable error) until the relay has counted an
	// attempt of it, and works for every other key. Refused alone in a call before any call to
	// the destination succeeded, the row's failure is rightly judged the destination's (an
	// outage: no attempt, and the row goes again once the destination answers), hence "until
	// an attempt"; and such a call is answered only once another key's call was acknowledged,
	// or the whole destination would back off for the hour. That ack comes: other keys move
	// while hot's head is in flight (the promise under test).
	var failed, heldInVain atomic.Bool
	b.rec.setFail(func(e *outbox.Event) error {
		if e.EventID != hot[0].EventID {
			return nil
		}
		var attempts int
		if err := b.pool.QueryRow(context.Background(), "SELECT attempts FROM outbox_event WHERE id = $1", e.ID).Scan(&attempts); err != nil || attempts == 0 {
			failed.Store(true)
			return errors.New("Throttled")
		}
		return nil
	})
	acked := make(chan struct{})
	var ackOnce sync.Once
	b.rec.after = func() { ackOnce.Do(func() { close(acked) }) }
	b.rec.hold = func(events []*outbox.Event) {
		if len(events) != 1 || events[0].EventID != hot[0].EventID {
			return
		}
		select {
		case <-acked:
		case <-time.After(time.Minute):
			heldInVain.Store(true)
		}
	}
	r := b.relay(t, func(c *outbox.RelayConfig) { c.BackoffBase, c.BackoffMax = time.Hour, time.Hour })
	st, err := r.RunOnce(context.Background())
	require.NoError(t, err)
	require.True(t, failed.Load())
	require.False(t, heldInVain.Load(), "no other key was acknowledged while hot's head was in flight")
	got := b.rec.publishedKeys()
	for _, k := range idleKeys(20) {
		require.Equal(t, 1, got[k], "key %s published while hot backs off", k)
	}
	require.Zero(t, got["hot"], "hot waits behind its failed head")
	require.Equal(t, 1, st.Retrying)
	require.Equal(t, 1, b.countWhere(t, "partition_key = 'hot' AND attempts = 1 AND available_at > now() + interval '10 minutes'"))
	require.Equal(t, 3000, b.countWhere(t, "partition_key = 'hot' AND published_at IS NULL"))
}

// Scenario 2: one failing topic used to stall the other topics until its rows were quarantined.
func TestFailingTopicBacksOffAloneAndKeepsItsRowsAttempts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for i := range 100 {
		b.writeKey(t, fmt.Sprintf("audit-%03d", i), "audit", 30)
	}
	orders := idleKeys(20)
	for _, k := range orders {
		b.writeKey(t, k, testTopic, 1)
	}
	const auditARN = "arn:aws:sns:us-east-1:000000000000:audit"
	b.rec.failCall = func(events []*outbox.Event) error {
		if events[0].Topic == "audit" {
			return errors.New("AuthorizationError: not authorized to publish to " + auditARN)
		}
		return nil
	}
	r := b.relay(t, func(c *outbox.RelayConfig) {
		c.Topics = map[string]string{testTopic: testARN, "audit": auditARN}
		c.BackoffBase, c.BackoffMax = time.Hour, time.Hour
	})
	st, err := r.RunOnce(context.Background())
	require.NoError(t, err)
	got := b.rec.publishedKeys()
	for _, k := range orders {
		require.Equal(t, 1, got[k], "orders key %s published while audit fails", k)
	}
	require.Positive(t, st.Outage)
	require.Zero(t, b.countWhere(t, "topic = 'audit' AND (attempts > 0 OR quarantined_at IS NOT NULL)"),
		"an outage burns no attempts and quarantines nothing")
	require.Positive(t, b.countWhere(t, "topic = 'audit' AND last_error LIKE 'AuthorizationError%' AND failing_since IS NOT NULL"),
		"the failure is visible on the rows")
	down := r.DestinationsDown()
	require.Len(t, down, 1)
	require.Equal(t, auditARN, down[0].Destination)
	require.Contains(t, down[0].LastError, "AuthorizationError")
}

// Scenario 2 at scale: while a destination fails, its keys are not read round after round
// (each costing a lock and a read only to be deferred again): the relay probes it with a few
// keys at a time, then every key moves once it answers.
func TestFailingDestinationIsProbedWithAFewKeysNotReadRoundAfterRound(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const keys, rows = 300, 3
	for i := range keys {
		b.writeKey(t, fmt.Sprintf("audit-%03d", i), "audit", rows)
	}
	const auditARN = "arn:aws:sns:us-east-1:000000000000:audit"
	var down atomic.Bool
	down.Store(true)
	b.rec.failCall = func(events []*outbox.Event) error {
		if down.Load() {
			return errors.New("AuthorizationError: not authorized")
		}
		return nil
	}
	const backoff = 200 * time.Millisecond
	r := b.relay(t, func(c *outbox.RelayConfig) {
		c.Topics = map[string]string{"audit": auditARN}
		c.BackoffBase, c.BackoffMax = backoff, backoff
	})
	ctx := context.Background()
	first, err := r.RunOnce(ctx)
	require.NoError(t, err)
	require.Positive(t, first.Outage)

	for range 3 {
		time.Sleep(backoff + 100*time.Millisecond) // the next probe is due
		st, err := r.RunOnce(ctx)
		require.NoError(t, err)
		require.Positive(t, st.Claimed, "the destination is probed")
		require.LessOrEqual(t, st.Claimed, 10*rows, "only a probe's keys are read while it fails")
		require.Zero(t, st.Published)
	}
	require.Zero(t, b.countWhere(t, "attempts > 0 OR quarantined_at IS NOT NULL"))

	down.Store(false)
	time.Sleep(backoff + 100*time.Millisecond)
	drainUntil(t, r, func() bool { return b.countWhere(t, "published_at IS NULL") == 0 })
	require.Equal(t, keys*rows, b.rec.count())
	b.rec.requireKeyOrder(t)
}

// Scenario 3: a hot key used to delay idle keys by seconds with no failure at all.
func TestHotKeyBacklogDoesNotDelayIdleKeys(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.writeKey(t, "hot", testTopic, 3000)
	for _, k := range idleKeys(20) {
		b.writeKey(t, k, testTopic, 1)
	}
	b.rec.delay = 5 * time.Millisecond
	var (
		mu       sync.Mutex
		hotSeen  int
		idleLate []string
	)
	b.rec.hold = func(events []*outbox.Event) {
		mu.Lock()
		defer mu.Unlock()
		for _, e := range events {
			switch {
			case e.PartitionKey == "hot":
				hotSeen++
			case hotSeen > int(outbox.RelaySetting("MaxPerKey").Default):
				idleLate = append(idleLate, e.PartitionKey)
			}
		}
	}
	r := b.relay(t)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		for b.countWhere(t, "partition_key LIKE 'idle-%' AND published_at IS NULL") > 0 {
			time.Sleep(10 * time.Millisecond)
		}
		cancel()
	}()
	_, err := r.RunOnce(ctx)
	require.NoError(t, err)
	require.Empty(t, idleLate, "every idle key went out in the first round, before the hot key's second round")
	require.Zero(t, b.countWhere(t, "partition_key LIKE 'idle-%' AND published_at IS NULL"))
}

// Scenario 6: a row committed late with a lower id used to let a second relay take the key
// while the first was publishing it.
func TestLateCommitNeverPutsTwoRelaysOnOneKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	late, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = late.Rollback(ctx) }()
	lateMsg, err := outbox.Write(ctx, late, outbox.Message{Topic: testTopic, EventType: "OrderCreated", PartitionKey: "k", Payload: json.RawMessage(`{"late":true}`)})
	require.NoError(t, err)
	b.writeKey(t, "k", testTopic, 5) // higher ids, committed first

	started, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	b.rec.hold = func(events []*outbox.Event) {
		once.Do(func() {
			close(started)
			<-release
		})
	}
	a := b.relay(t, func(c *outbox.RelayConfig) { c.Pipelines = 1; c.PublishConcurrency = 1 })
	aDone := make(chan error, 1)
	go func() { _, err := a.RunOnce(ctx); aDone <- err }()
	<-started // relay A holds key k and is publishing its first row

	require.NoError(t, late.Commit(ctx)) // the lower id becomes visible: k's new head
	bRelay := b.relay(t)
	st, err := bRelay.RunOnce(ctx)
	require.NoError(t, err)
	require.Zero(t, st.Published, "relay B must not publish key k while relay A holds it")

	close(release)
	require.NoError(t, <-aDone)
	drainUntil(t, bRelay, func() bool { return b.countWhere(t, "published_at IS NULL") == 0 })
	b.rec.mu.Lock()
	defer b.rec.mu.Unlock()
	require.Zero(t, b.rec.overlaps, "key k was never in two calls at once")
	seen := map[string]int{}
	for _, e := range b.rec.received {
		seen[e.EventID.String()]++
	}
	require.Len(t, seen, 6)
	require.Equal(t, 1, seen[lateMsg[0].EventID.String()])
}

// Scenario 7: a request-level refusal (InvalidParameter, BatchRequestTooLong for the whole
// PublishBatch) used to quarantine all ten entries.
func TestRequestLevelRefusalIsRetriedEntryByEntry(t *testing.T) {
	t.Parallel()
	b := setup(t)
	written := b.write(t, 30, 30)
	poison := written[7].EventID
	b.rec.failCall = func(events []*outbox.Event) error {
		for _, e := range events {
			if len(events) > 1 && e.EventID == poison {
				return outbox.Permanent(errors.New("InvalidParameter: the request has an invalid entry"))
			}
		}
		return nil
	}
	b.rec.setFail(func(e *outbox.Event) error {
		if e.EventID == poison {
			return outbox.Permanent(errors.New("InvalidParameter: bad message attribute"))
		}
		return nil
	})
	st, err := b.relay(t).RunOnce(context.Background())
	require.NoError(t, err)
	require.Equal(t, 29, st.Published)
	require.Equal(t, 1, st.Quarantined)
	require.Equal(t, 1, b.countWhere(t, "quarantined_at IS NOT NULL AND event_id = '"+poison.String()+"'"), "only the bad entry is quarantined")
}

// Scenario 8: Purge racing Replay used to delete the replayed (now unpublished) rows.
func TestPurgeRacingReplayNeverDeletesReplayedRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	b.write(t, 50, 5)
	_, err := b.relay(t).RunOnce(ctx)
	require.NoError(t, err)
	b.exec(t, "UPDATE outbox_event SET published_at = now() - interval '2 days', created_at = now() - interval '3 days'")

	replay, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = replay.Rollback(ctx) }()
	n, err := outbox.Replay(ctx, replay, outbox.ReplayFilter{Since: time.Now().Add(-4 * 24 * time.Hour)})
	require.NoError(t, err)
	require.Equal(t, int64(50), n)

	purged := make(chan error, 1)
	var deleted int64
	go func() {
		var err error
		deleted, err = outbox.Purge(ctx, b.pool, 24*time.Hour, nil)
		purged <- err
	}()
	testwait.Until(t, "Purge waits on the rows Replay changed", func() bool { // Purge waits on the rows Replay changed
		var waiting int
		_ = b.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
			AND wait_event_type = 'Lock' AND query LIKE '%DELETE FROM outbox_event%'`).Scan(&waiting)
		return waiting > 0
	})
	require.NoError(t, replay.Commit(ctx))
	require.NoError(t, <-purged)
	require.Zero(t, deleted, "replayed rows are unpublished: never purged")
	require.Equal(t, 50, b.countWhere(t, "published_at IS NULL"))
}

// Scenario 9: a destination failing for everyone used to quarantine every row it touched.
func TestOutageNeedsNoManualWork(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.write(t, 200, 40)
	var down atomic.Bool
	down.Store(true)
	b.rec.failCall = func([]*outbox.Event) error {
		if down.Load() {
			return errors.New("InternalError: service unavailable")
		}
		return nil
	}
	r := b.relay(t, func(c *outbox.RelayConfig) { c.MaxAttempts = 2 })
	for range 20 { // many rounds of failure: far more than MaxAttempts
		_, err := r.RunOnce(context.Background())
		require.NoError(t, err)
		time.Sleep(20 * time.Millisecond)
	}
	require.Positive(t, b.rec.calls, "the destination was probed")
	require.Zero(t, b.countWhere(t, "attempts > 0 OR quarantined_at IS NOT NULL"), "an outage burns no attempts")
	down.Store(false)
	drainUntil(t, r, func() bool { return b.countWhere(t, "published_at IS NULL") == 0 })
	require.Zero(t, b.countWhere(t, "quarantined_at IS NOT NULL"))
	require.Empty(t, r.DestinationsDown())
	b.rec.requireKeyOrder(t)
}

// Scenario 11: an error text cut inside a UTF-8 character used to make recording the outcome
// fail, so the relay lost the round's outcomes.
func TestErrorTextIsStoredWhateverItsBytes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	written := b.write(t, 2, 2)
	nasty := strings.Repeat("a", 1999) + "éé" + "\x00 and more \xff"
	b.rec.setFail(func(e *outbox.Event) error {
		if e.EventID == written[0].EventID {
			return errors.New(nasty)
		}
		return nil
	})
	st, err := b.relay(t, func(c *outbox.RelayConfig) { c.BackoffBase, c.BackoffMax = time.Hour, time.Hour }).RunOnce(context.Background())
	require.NoError(t, err, "recording the outcome succeeds")
	require.Equal(t, 1, st.Published)
	require.Equal(t, 1, b.countWhere(t, "attempts = 1 AND octet_length(last_error) <= 2000 AND last_error LIKE 'aaa%'"))
}

// Scenario 5: 1,000 pending rows of 250 KB used to be read into memory at once (639 MB RSS in a
// 256 MB Lambda). A round holds at most MaxRoundBytes of payloads.
func TestRoundMemoryIsBoundedByTheByteBudget(t *testing.T) { // not parallel: it measures the heap
	b := setup(t)
	b.exec(t, `INSERT INTO outbox_event (event_id, topic, aggregate_type, aggregate_id, event_type, partition_key, payload)
		SELECT gen_random_uuid(), 'orders', 'order', 'o', 'Big', 'k' || (i % 100), jsonb_build_object('blob', repeat(md5(i::text), 7800))
		FROM generate_series(1, 1000) i`)
	b.rec.dropPayloads = true
	runtime.GC()
	var peak atomic.Uint64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		var ms runtime.MemStats
		for {
			runtime.ReadMemStats(&ms)
			if ms.HeapAlloc > peak.Load() {
				peak.Store(ms.HeapAlloc)
			}
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	// A long lease: measuring 1,000 payloads of 250 KB outlasted half the default lease (the
	// statement timeout) on a machine whose cores were busy, and this test is about memory.
	st, err := b.relay(t, func(c *outbox.RelayConfig) { c.MaxRoundBytes = 16 << 20; c.Lease = 2 * time.Minute }).RunOnce(context.Background())
	close(stop)
	<-sampled
	require.NoError(t, err)
	require.Equal(t, 1000, st.Published)
	// 250 MB pending; two pipelines hold at most 2 × 16 MiB of payloads (plus the copies the
	// driver and the publisher make while a call is in flight).
	require.Less(t, peak.Load(), uint64(160<<20), "peak heap %d MiB", peak.Load()>>20)
}

// Scenario 0b: a killed relay's statement used to keep running, holding its keys, until it
// ended by itself. The round's statements are bounded and a dead client is noticed.
func TestKilledRelaysKeysAreFreeWithinTheLease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	written := b.writeKey(t, "k", testTopic, 3)

	// Hold the first row, so the child relay's recording of its outcome waits on it.
	blocker, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = blocker.Rollback(ctx) }()
	_, err = blocker.Exec(ctx, "SELECT 1 FROM outbox_event WHERE event_id = $1 FOR UPDATE", written[0].EventID)
	require.NoError(t, err)

	child := startChildRelay(t, b.pool.Config().ConnString(), killLease)
	b.waitForChildStatement(t, "UPDATE outbox_event") // the child published and now waits to record it
	b.requireKilledKeyFreeSoon(t, child, "k")
	require.NoError(t, blocker.Rollback(ctx))
	drainUntil(t, b.relay(t), func() bool { return b.countWhere(t, "published_at IS NULL") == 0 })
}

// Scenario 0b, in the middle of the claim: a relay SIGKILLed while its read of the keys it
// locked runs (here: waits for a lock) loses those keys within a second or so, not when the
// statement would end.
func TestRelayKilledMidClaimFreesItsKeysWithinTheLease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	b.writeKey(t, "k", testTopic, 3)

	goOn := filepath.Join(t.TempDir(), "go-on")
	child := startChildRelay(t, b.pool.Config().ConnString(), killLease, childPauseEnv+"="+goOn)
	testwait.Until(t, "the child's round about to claim its key", func() bool {
		_, err := os.Stat(goOn + childPausedSuffix)
		return err == nil
	})
	blocker, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = blocker.Rollback(ctx) }()
	_, err = blocker.Exec(ctx, "LOCK TABLE outbox_event IN ACCESS EXCLUSIVE MODE") // the read needs it
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(goOn, nil, 0o600))
	b.waitForChildStatement(t, "WITH chain") // the key locked (the lock statement needs no table), the read waits
	var held int
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)
		WHERE l.locktype = 'advisory' AND l.granted AND a.application_name = 'sluice-child-relay'`).Scan(&held))
	require.Equal(t, 1, held, "the child holds its key while its read waits")
	b.requireKilledKeyFreeSoon(t, child, "k")
	require.NoError(t, blocker.Rollback(ctx))
	drainUntil(t, b.relay(t), func() bool { return b.countWhere(t, "published_at IS NULL") == 0 })
}

// killLease is the child relays' lease in the kill tests: so long that only PostgreSQL noticing
// the dead client (client_connection_check_interval, a second) can free the keys before the
// statement timeout (half the lease) would have ended the statement, however busy the machine.
const killLease = 10 * time.Minute

// waitForChildStatement waits until the child relay's session waits for a lock in a statement
// starting with prefix.
func (b *bundle) waitForChildStatement(t *testing.T, prefix string) {
	t.Helper()
	testwait.Until(t, "the child relay waits for a lock in its statement", func() bool {
		var n int
		_ = b.pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE application_name = 'sluice-child-relay' AND wait_event_type = 'Lock' AND ltrim(query, E' \n\t') LIKE $1 || '%'`,
			prefix).Scan(&n)
		return n > 0
	})
}

// requireKilledKeyFreeSoon SIGKILLs child and requires key's advisory lock to be freed by
// PostgreSQL noticing the dead client: before the child's statement timeout (half of
// killLease) could have ended its statement.
func (b *bundle) requireKilledKeyFreeSoon(t *testing.T, child *exec.Cmd, key string) {
	t.Helper()
	ctx := context.Background()
	killed := time.Now()
	require.NoError(t, child.Process.Kill())
	_ = child.Wait()
	testwait.Until(t, "the dead relay's key is free", func() bool {
		var free bool
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT pg_try_advisory_lock(hashtextextended($1, 5433))`, key).Scan(&free))
		return free
	})
	elapsed := time.Since(killed)
	_, err := b.pool.Exec(ctx, `SELECT pg_advisory_unlock_all()`)
	require.NoError(t, err)
	require.Less(t, elapsed, killLease/2, "the dead relay's key was freed before its statement timeout, not by it (took %s)", elapsed)
}

// statsEmpty is scenario 0's setup: 20,000 published rows retained, statistics taken with an
// empty backlog (what autovacuum does on an outbox that keeps up).
func statsOnEmptyBacklog(t *testing.T, b *bundle) {
	t.Helper()
	b.exec(t, `INSERT INTO outbox_event (event_id, topic, aggregate_type, aggregate_id, event_type, partition_key, payload, published_at)
		SELECT gen_random_uuid(), 'orders', 'order', 'o', 'E', 'k' || (i % 1000), '{}', now() FROM generate_series(1, 20000) i`)
	b.exec(t, `VACUUM ANALYZE outbox_event`)
}

// Scenario 0: with statistics taken on an empty backlog, the claim used to turn quadratic
// (47 s for 1,000 rows, nothing in 120 s for 2,000). Bursts now drain, in key order. That each
// round statement's cost is bounded is asserted by the buffers it reads, not by a clock:
// TestRoundStatementsAreBoundedWithStatisticsFromAnEmptyBacklog.
func TestBurstsDrainAfterStatisticsTakenOnAnEmptyBacklog(t *testing.T) {
	t.Parallel()
	b := setup(t)
	statsOnEmptyBacklog(t, b)
	r := b.relay(t)
	for _, burst := range []struct{ rows, keys int }{{1000, 1000}, {2000, 20}, {10000, 500}} {
		b.exec(t, `INSERT INTO outbox_event (event_id, topic, aggregate_type, aggregate_id, event_type, partition_key, payload)
			SELECT gen_random_uuid(), 'orders', 'order', 'o', 'E', 'b' || (i % $2), '{}' FROM generate_series(1, $1) i`, burst.rows, burst.keys)
		drainUntil(t, r, func() bool { return b.countWhere(t, "published_at IS NULL") == 0 })
	}
	require.Equal(t, 13000, b.rec.count())
	b.rec.requireKeyOrder(t)
}
