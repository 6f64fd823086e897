package inbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/sluicehq/sluice/internal/testwait"
	"github.com/sluicehq/sluice/internal/wire"
	"github.com/sluicehq/sluice/pkg/inbox"
	"github.com/sluicehq/sluice/pkg/metrics"
	"github.com/sluicehq/sluice/pkg/outbox"
)

const (
	kafkaTopic = "orders"
	kafkaDLT   = "orders.dlt"
)

// kafkaBundle is one test's in-process Kafka (kfake speaks the real protocol), a producer that
// writes records as the relay does (outbox.KafkaPublisher) to chosen partitions, and a database
// whose ledger table records the order in which a consumer applied them.
type kafkaBundle struct {
	*testBundle
	cluster  *kfake.Cluster
	producer *kgo.Client
	app      *ledgerApp
}

func kafkaSetup(t *testing.T, partitions int32) *kafkaBundle {
	t.Helper()
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, kafkaTopic, kafkaDLT))
	require.NoError(t, err)
	t.Cleanup(cluster.Close)
	producer, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	require.NoError(t, err)
	t.Cleanup(producer.Close)
	b := setup(t)
	_, err = b.pool.Exec(context.Background(), `CREATE TABLE ledger (seq bigserial PRIMARY KEY, key text NOT NULL, n int NOT NULL, message_id text NOT NULL)`)
	require.NoError(t, err)
	return &kafkaBundle{testBundle: b, cluster: cluster, producer: producer, app: &ledgerApp{attempts: map[string]int{}}}
}

// produce writes event n of key to partition, as the relay publishes it, and returns its message id.
func (k *kafkaBundle) produce(t *testing.T, partition int32, key string, n int) string {
	t.Helper()
	payload, _ := json.Marshal(map[string]any{"key": key, "n": n})
	e := &outbox.Event{EventID: uuid.New(), EventType: "Ledger", AggregateType: "test", AggregateID: key, PartitionKey: key,
		Payload: payload, CreatedAt: time.Now()}
	k.publish(t, partition, e)
	return e.EventID.String()
}

// produceAgain writes the record of message id again (a relay's duplicate).
func (k *kafkaBundle) produceAgain(t *testing.T, partition int32, key string, n int, id string) {
	t.Helper()
	payload, _ := json.Marshal(map[string]any{"key": key, "n": n})
	e := &outbox.Event{EventID: uuid.MustParse(id), EventType: "Ledger", PartitionKey: key, Payload: payload, CreatedAt: time.Now()}
	k.publish(t, partition, e)
}

// publish produces e with the relay's publisher, to partition.
func (k *kafkaBundle) publish(t *testing.T, partition int32, e *outbox.Event) {
	t.Helper()
	errs := outbox.NewKafkaPublisher(toPartition{k.producer, partition}, 0).PublishBatch(context.Background(), "kafka://"+kafkaTopic, []*outbox.Event{e})
	require.NoError(t, errors.Join(errs...))
}

// toPartition produces every record to one partition (the producer's partitioner is manual).
type toPartition struct {
	c         *kgo.Client
	partition int32
}

func (p toPartition) ProduceSync(ctx context.Context, rs ...*kgo.Record) kgo.ProduceResults {
	for _, r := range rs {
		r.Partition = p.partition
	}
	return p.c.ProduceSync(ctx, rs...)
}

// ledgerApp is the handler: it appends the message to the ledger, after failing when poison says so.
type ledgerApp struct {
	mu       sync.Mutex
	attempts map[string]int
	poison   func(id string, attempt int) bool
}

func (a *ledgerApp) setPoison(f func(id string, attempt int) bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.poison = f
}

func (a *ledgerApp) attemptsOf(id string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.attempts[id]
}

func (a *ledgerApp) handle(ctx context.Context, tx pgx.Tx, msg inbox.Message) error {
	a.mu.Lock()
	a.attempts[msg.ID]++
	fail := a.poison != nil && a.poison(msg.ID, a.attempts[msg.ID])
	a.mu.Unlock()
	if fail {
		return errors.New("poison record")
	}
	var p struct {
		Key string `json:"key"`
		N   int    `json:"n"`
	}
	if err := msg.Decode(&p); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, `INSERT INTO ledger (key, n, message_id) VALUES ($1, $2, $3)`, p.Key, p.N, msg.ID)
	return err
}

// duplicates counts the inbox's duplicate metric.
type duplicates struct{ n atomic.Int64 }

func (d *duplicates) Record(_ context.Context, _ metrics.Dimensions, ms ...metrics.Measurement) {
	for _, m := range ms {
		if m.Name == metrics.InboxDuplicates.Name {
			d.n.Add(int64(m.Value))
		}
	}
}

func (k *kafkaBundle) consumer(t *testing.T, mode inbox.Mode, dups *duplicates) *inbox.Consumer {
	t.Helper()
	r := inbox.NewRouter(inbox.FailUnknown)
	r.Handle("Ledger", k.app.handle)
	cfg := inbox.ConsumerConfig{Consumer: "ledger", Router: r, Mode: mode, Logger: quiet}
	if dups != nil {
		cfg.MetricsRecorder = dups
	}
	c, err := inbox.NewConsumer(k.pool, cfg)
	require.NoError(t, err)
	return c
}

func (k *kafkaBundle) groupClient(t *testing.T, extra ...kgo.Opt) *kgo.Client {
	t.Helper()
	opts := append(inbox.KafkaGroupOpts("ledger-group", kafkaTopic), kgo.SeedBrokers(k.cluster.ListenAddrs()...), kgo.FetchMaxWait(200*time.Millisecond))
	cl, err := kgo.NewClient(append(opts, extra...)...)
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	return cl
}

// running is a ConsumeKafka loop in the background, with its client.
type running struct {
	client *kgo.Client
	cancel context.CancelFunc
	done   chan error
}

func consume(t *testing.T, cl *kgo.Client, c *inbox.Consumer, opts *inbox.KafkaOptions) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{client: cl, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- inbox.ConsumeKafka(ctx, cl, c, opts) }()
	t.Cleanup(func() { r.stop(t) })
	return r
}

// stop cancels the loop, waits for it and closes its client (which leaves the group), once.
func (r *running) stop(t *testing.T) {
	t.Helper()
	if r.cancel == nil {
		return
	}
	r.cancel()
	r.cancel = nil
	require.NoError(t, testwait.Receive(t, "ConsumeKafka returns after its context ended", r.done))
	r.client.Close()
}

func (k *kafkaBundle) applied(t *testing.T) int {
	return count(t, k.pool, `SELECT count(*) FROM ledger`)
}

func (k *kafkaBundle) appliedKey(t *testing.T, key string) []int {
	t.Helper()
	rows, err := k.pool.Query(context.Background(), `SELECT n FROM ledger WHERE key = $1 ORDER BY seq`, key)
	require.NoError(t, err)
	ns, err := pgx.CollectRows(rows, pgx.RowTo[int])
	require.NoError(t, err)
	return ns
}

// requireKeyOrder checks that every key's events were applied once each, in order 1..n.
func (k *kafkaBundle) requireKeyOrder(t *testing.T, keys map[string]int) {
	t.Helper()
	for key, n := range keys {
		want := make([]int, n)
		for i := range want {
			want[i] = i + 1
		}
		require.Equal(t, want, k.appliedKey(t, key), "key %s: each event once, in order", key)
	}
}

// waitFor waits until cond holds, however long a busy machine takes (testwait.Until).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testwait.Until(t, what, cond)
}

// Every record is applied once, in its key's order (its partition's order), duplicates
// published by the relay are found in the inbox, and offsets are committed: a consumer started
// again in the group gets nothing it already applied.
func TestConsumeKafkaAppliesOnceInOrderAndCommits(t *testing.T) {
	t.Parallel()
	forModes(t, func(t *testing.T, mode inbox.Mode) {
		k := kafkaSetup(t, 4)
		keys := map[string]int{}
		dupsPublished := 0
		for i := range 120 {
			key := fmt.Sprintf("key-%02d", i%12)
			keys[key]++
			p := int32(i % 12 % 4) // a key stays on one partition
			id := k.produce(t, p, key, keys[key])
			if i%10 == 0 {
				k.produceAgain(t, p, key, keys[key], id)
				dupsPublished++
			}
		}
		var dups duplicates
		r := consume(t, k.groupClient(t), k.consumer(t, mode, &dups), nil)
		waitFor(t, "every record applied and every duplicate found", func() bool {
			return k.applied(t) == 120 && dups.n.Load() == int64(dupsPublished)
		})
		k.requireKeyOrder(t, keys)
		r.stop(t)

		var again duplicates
		consume(t, k.groupClient(t), k.consumer(t, mode, &again), nil)
		k.produce(t, 0, "key-00", keys["key-00"]+1)
		waitFor(t, "the new record applied", func() bool { return k.applied(t) == 121 })
		require.Zero(t, again.n.Load(), "offsets were committed: nothing applied comes back")
	})
}

// A consumer that dies after its inbox transactions committed but before its offsets were
// committed: the records come back to the next member of the group and are duplicates, with
// no second effect.
func TestConsumeKafkaCrashBeforeOffsetCommitRedeliversDuplicates(t *testing.T) {
	t.Parallel()
	k := kafkaSetup(t, 2)
	var refuseCommits atomic.Bool
	refuseCommits.Store(true)
	k.cluster.ControlKey(kmsg.OffsetCommit.Int16(), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		k.cluster.KeepControl()
		if !refuseCommits.Load() {
			return nil, nil, false
		}
		req := kreq.(*kmsg.OffsetCommitRequest)
		resp := req.ResponseKind().(*kmsg.OffsetCommitResponse)
		for _, rt := range req.Topics {
			st := kmsg.NewOffsetCommitResponseTopic()
			st.Topic = rt.Topic
			for _, rp := range rt.Partitions {
				sp := kmsg.NewOffsetCommitResponseTopicPartition()
				sp.Partition = rp.Partition
				sp.ErrorCode = kerr.OffsetMetadataTooLarge.Code
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})
	keys := map[string]int{}
	for i := range 20 {
		key := fmt.Sprintf("key-%d", i%2)
		keys[key]++
		k.produce(t, int32(i%2), key, keys[key])
	}
	r := consume(t, k.groupClient(t), k.consumer(t, inbox.PerRecord, nil), nil)
	waitFor(t, "the first consumer applied every record", func() bool { return k.applied(t) == 20 })
	r.stop(t) // the crash: the transactions committed, the offsets never did

	refuseCommits.Store(false)
	var dups duplicates
	consume(t, k.groupClient(t), k.consumer(t, inbox.PerRecord, &dups), nil)
	waitFor(t, "every record delivered again", func() bool { return dups.n.Load() == 20 })
	require.Equal(t, 20, k.applied(t), "no second effect")
	k.requireKeyOrder(t, keys)
}

// A record that fails blocks its partition, only its partition, until it succeeds: the records
// after it wait and are then applied in order.
func TestConsumeKafkaFailingRecordBlocksOnlyItsPartition(t *testing.T) {
	t.Parallel()
	k := kafkaSetup(t, 2)
	ids := map[string]string{}
	for n := 1; n <= 5; n++ {
		ids[fmt.Sprintf("a%d", n)] = k.produce(t, 0, "a", n)
		ids[fmt.Sprintf("b%d", n)] = k.produce(t, 1, "b", n)
	}
	k.app.setPoison(func(id string, attempt int) bool { return id == ids["a2"] && attempt <= 3 })
	consume(t, k.groupClient(t), k.consumer(t, inbox.PerRecord, nil), &inbox.KafkaOptions{RetryBackoff: 10 * time.Millisecond, RetryBackoffMax: 50 * time.Millisecond})
	waitFor(t, "every record applied", func() bool { return k.applied(t) == 10 })
	k.requireKeyOrder(t, map[string]int{"a": 5, "b": 5})
	require.Equal(t, 4, k.app.attemptsOf(ids["a2"]), "three failures, then its success")
	for _, n := range []string{"a3", "a4", "a5"} {
		require.Equal(t, 1, k.app.attemptsOf(ids[n]), "%s waited for a2 and ran once", n)
	}
}

// Without a dead-letter topic a record that always fails is retried and its partition waits:
// nothing after it is applied, nothing is committed past it, so a consumer started after the
// fix applies it and the rest in order. Other partitions go on meanwhile.
func TestConsumeKafkaNeverSkipsAPoisonRecord(t *testing.T) {
	t.Parallel()
	k := kafkaSetup(t, 2)
	ids := map[string]string{}
	for n := 1; n <= 4; n++ {
		ids[fmt.Sprintf("a%d", n)] = k.produce(t, 0, "a", n)
		ids[fmt.Sprintf("b%d", n)] = k.produce(t, 1, "b", n)
	}
	k.app.setPoison(func(id string, _ int) bool { return id == ids["a2"] })
	opts := &inbox.KafkaOptions{RetryBackoff: 10 * time.Millisecond, RetryBackoffMax: 20 * time.Millisecond}
	r := consume(t, k.groupClient(t), k.consumer(t, inbox.PerRecord, nil), opts)
	waitFor(t, "the other partition applied and the poison record retried", func() bool {
		return len(k.appliedKey(t, "b")) == 4 && k.app.attemptsOf(ids["a2"]) >= 3
	})
	require.Equal(t, []int{1}, k.appliedKey(t, "a"), "nothing after the poison record")
	require.Zero(t, k.app.attemptsOf(ids["a3"]), "the records after it were never attempted")
	r.stop(t)

	k.app.setPoison(nil) // the fix
	consume(t, k.groupClient(t), k.consumer(t, inbox.PerRecord, nil), opts)
	waitFor(t, "the partition applied after the fix", func() bool { return k.applied(t) == 8 })
	k.requireKeyOrder(t, map[string]int{"a": 4, "b": 4})
}

// With a dead-letter topic, a record that failed MaxAttempts times is produced there (as it was,
// plus where it came from and why) and only then committed past; its partition goes on.
func TestConsumeKafkaDeadLettersAPoisonRecord(t *testing.T) {
	t.Parallel()
	k := kafkaSetup(t, 2)
	ids := map[string]string{}
	for n := 1; n <= 4; n++ {
		ids[fmt.Sprintf("a%d", n)] = k.produce(t, 0, "a", n)
		ids[fmt.Sprintf("b%d", n)] = k.produce(t, 1, "b", n)
	}
	k.app.setPoison(func(id string, _ int) bool { return id == ids["a2"] })
	opts := &inbox.KafkaOptions{RetryBackoff: 10 * time.Millisecond, RetryBackoffMax: 20 * time.Millisecond, DeadLetterTopic: kafkaDLT, MaxAttempts: 3}
	r := consume(t, k.groupClient(t), k.consumer(t, inbox.PerRecord, nil), opts)
	waitFor(t, "everything but the poison record applied", func() bool { return k.applied(t) == 7 })
	require.Equal(t, []int{1, 3, 4}, k.appliedKey(t, "a"))
	require.Equal(t, 3, k.app.attemptsOf(ids["a2"]))

	dl := readTopic(t, k.cluster, kafkaDLT, 1)[0]
	h := map[string]string{}
	for _, x := range dl.Headers {
		h[x.Key] = string(x.Value)
	}
	require.Equal(t, ids["a2"], h[wire.MessageID], "the record as it was: replaying it dedups")
	require.Equal(t, "Ledger", h[wire.EventType])
	require.Equal(t, "a", string(dl.Key))
	require.JSONEq(t, `{"key":"a","n":2}`, string(dl.Value))
	require.Equal(t, "orders/0/1", h[inbox.HeaderDeadLetterSource])
	require.Equal(t, "ledger", h[inbox.HeaderDeadLetterConsumer])
	require.Equal(t, "3", h[inbox.HeaderDeadLetterAttempts])
	require.Contains(t, h[inbox.HeaderDeadLetterError], "poison record")
	r.stop(t)

	// Its dead letter in the database: dead at the give-up, with where it came from and why.
	letters, err := inbox.ListDeadLetters(context.Background(), k.pool, inbox.DeadLetterFilter{Consumer: "ledger"})
	require.NoError(t, err)
	require.Len(t, letters, 1)
	require.Equal(t, ids["a2"], letters[0].MessageID)
	require.Equal(t, inbox.DeadDead, letters[0].State)
	require.Equal(t, 3, letters[0].Attempts)
	require.Equal(t, "kafka", letters[0].Source)
	require.Equal(t, kafkaTopic, letters[0].SourceName)
	require.Equal(t, "0@1", letters[0].SourcePosition)
	require.Contains(t, letters[0].Error, "poison record")
	require.JSONEq(t, `{"key":"a","n":2}`, letters[0].Payload)

	// Committed past it: a new member of the group does not try it again.
	consume(t, k.groupClient(t), k.consumer(t, inbox.PerRecord, nil), opts)
	k.produce(t, 0, "a", 5)
	waitFor(t, "the next record applied", func() bool { return k.applied(t) == 8 })
	require.Equal(t, 3, k.app.attemptsOf(ids["a2"]))
}

// readTopic reads n records of topic from its start.
func readTopic(t *testing.T, c *kfake.Cluster, topic string, n int) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	require.NoError(t, err)
	defer cl.Close()
	var out []*kgo.Record
	w := testwait.Watch[int](t, "every record read back")
	for len(out) < n {
		w.Check(len(out))
		poll, cancel := context.WithTimeout(context.Background(), time.Second) // one poll's wait, not a bound
		cl.PollFetches(poll).EachRecord(func(r *kgo.Record) { out = append(out, r) })
		cancel()
	}
	require.Len(t, out, n)
	return out
}

// A client that could commit what the inbox has not applied is refused before anything runs.
func TestConsumeKafkaRefusesAnUnsafeClient(t *testing.T) {
	t.Parallel()
	k := kafkaSetup(t, 1)
	c := k.consumer(t, inbox.PerRecord, nil)
	autocommit, err := kgo.NewClient(kgo.SeedBrokers(k.cluster.ListenAddrs()...), kgo.ConsumerGroup("g"), kgo.ConsumeTopics(kafkaTopic))
	require.NoError(t, err)
	defer autocommit.Close()
	err = inbox.ConsumeKafka(context.Background(), autocommit, c, nil)
	require.ErrorIs(t, err, inbox.ErrInvalidConfig)
	require.ErrorContains(t, err, "DisableAutoCommit")
	require.ErrorContains(t, err, "BlockRebalanceOnPoll")

	err = inbox.ConsumeKafka(context.Background(), k.groupClient(t), c, &inbox.KafkaOptions{MaxAttempts: -1})
	require.ErrorIs(t, err, inbox.ErrInvalidConfig)
	require.ErrorContains(t, err, "MaxAttempts")
}
