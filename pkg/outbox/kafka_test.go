package outbox_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/sluicehq/sluice/internal/testwait"
	"github.com/sluicehq/sluice/internal/wire"
	"github.com/sluicehq/sluice/pkg/outbox"
)

// kafkaCluster starts an in-process Kafka (kfake speaks the real protocol) with topic of
// partitions partitions, and returns it with a producing client.
func kafkaCluster(t *testing.T, topic string, partitions int32) (*kfake.Cluster, *kgo.Client) {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(3), kfake.SeedTopics(partitions, topic))
	require.NoError(t, err)
	t.Cleanup(c.Close)
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.RecordRetries(2), kgo.RetryTimeout(5*time.Second))
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	return c, cl
}

// kafkaDelivery is one record read back from the cluster.
type kafkaDelivery struct {
	key       string
	partition int32
	messageID string
	headers   map[string]string
	value     string
}

// readAll consumes topic from the start until it has seen n distinct message ids (duplicates
// included in what it returns) or the deadline passes.
func readAll(t *testing.T, c *kfake.Cluster, topic string, n int) []kafkaDelivery {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	require.NoError(t, err)
	defer cl.Close()
	var out []kafkaDelivery
	distinct := map[string]bool{}
	w := testwait.Watch[int](t, "every distinct record read back")
	for len(distinct) < n {
		w.Check(len(distinct))
		poll, cancel := context.WithTimeout(context.Background(), time.Second) // one poll's wait, not a bound
		fs := cl.PollFetches(poll)
		cancel()
		fs.EachRecord(func(r *kgo.Record) {
			d := kafkaDelivery{key: string(r.Key), partition: r.Partition, value: string(r.Value), headers: map[string]string{}}
			for _, h := range r.Headers {
				d.headers[h.Key] = string(h.Value)
			}
			d.messageID = d.headers[wire.MessageID]
			distinct[d.messageID] = true
			out = append(out, d)
		})
	}
	require.GreaterOrEqual(t, len(distinct), n, "distinct records read back")
	return out
}

// Issue 15: racing relays producing to Kafka keep every key on one partition and in id order,
// with the contract's attributes as headers; nothing is lost.
func TestKafkaRacingRelaysKeepEveryKeyInOrderOnOnePartition(t *testing.T) {
	t.Parallel()
	const topic = "orders"
	cluster, client := kafkaCluster(t, topic, 8)
	b := setup(t)
	written := b.write(t, 2000, 40)
	idOf := map[string]int64{}
	var ids []int64
	require.NoError(t, func() error {
		rows, err := b.pool.Query(context.Background(), `SELECT event_id, id FROM outbox_event`)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var ev uuid.UUID
			var id int64
			if err := rows.Scan(&ev, &id); err != nil {
				return err
			}
			idOf[ev.String()] = id
			ids = append(ids, id)
		}
		return rows.Err()
	}())
	require.Len(t, idOf, len(written))

	pub := outbox.NewKafkaPublisher(client, 0)
	var wg sync.WaitGroup
	for range 4 {
		r := b.relay(t, func(c *outbox.RelayConfig) {
			c.Publisher = pub
			c.Topics = map[string]string{testTopic: "kafka://" + topic}
		})
		wg.Add(1)
		go func() {
			defer wg.Done()
			for b.countWhere(t, "published_at IS NULL") > 0 {
				_, err := r.RunOnce(context.Background())
				require.NoError(t, err)
			}
		}()
	}
	wg.Wait()

	got := readAll(t, cluster, topic, len(written))
	partitionOf := map[string]int32{}
	last := map[string]int64{}
	seen := map[string]bool{}
	for _, d := range got {
		if p, ok := partitionOf[d.key]; ok {
			require.Equal(t, p, d.partition, "key %s stays on one partition", d.key)
		}
		partitionOf[d.key] = d.partition
		require.Equal(t, "OrderCreated", d.headers[wire.EventType])
		require.NotEmpty(t, d.headers[wire.CreatedAt])
		if seen[d.messageID] {
			continue // a duplicate is allowed; order is judged on first deliveries
		}
		seen[d.messageID] = true
		id := idOf[d.messageID]
		require.Greater(t, id, last[d.key], "key %s: row %d after row %d", d.key, id, last[d.key])
		last[d.key] = id
	}
	require.Len(t, seen, len(written), "every row reached Kafka")
}

// A broker that refuses produce requests for a while: the topic backs off as a whole, no row
// burns an attempt or is quarantined, and everything goes out in order once it accepts again.
func TestKafkaBrokerFailingProduceRequestsLosesNothing(t *testing.T) {
	t.Parallel()
	const topic = "orders"
	cluster, client := kafkaCluster(t, topic, 4)
	var refused atomic.Int32
	var failing atomic.Bool
	failing.Store(true)
	cluster.ControlKey(kmsg.Produce.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		if !failing.Load() {
			return nil, nil, false
		}
		refused.Add(1)
		return refuseProduce(req), nil, true
	})
	b := setup(t)
	written := b.write(t, 200, 20)
	r := b.relay(t, func(c *outbox.RelayConfig) {
		c.Publisher = outbox.NewKafkaPublisher(client, 0)
		c.Topics = map[string]string{testTopic: "kafka://" + topic}
	})
	st, err := r.RunOnce(context.Background())
	require.NoError(t, err)
	require.Positive(t, refused.Load(), "the broker refused")
	require.Zero(t, st.Published)
	require.Positive(t, st.Outage, "a destination refusing everything is an outage")
	require.Zero(t, b.countWhere(t, "attempts > 0 OR quarantined_at IS NOT NULL"))

	failing.Store(false)
	drainUntil(t, r, func() bool { return b.countWhere(t, "published_at IS NULL") == 0 })
	got := readAll(t, cluster, topic, len(written))
	distinct := map[string]bool{}
	for _, d := range got {
		distinct[d.messageID] = true
	}
	// Records franz-go still held when a call's deadline passed are delivered too: duplicates,
	// which consumers drop by messageId.
	require.Len(t, distinct, len(written), "every row reached Kafka once the broker accepts")
}

// A record the brokers refuse for itself (too large) is quarantined alone; its neighbours go out.
func TestKafkaRecordTooLargeIsQuarantinedAlone(t *testing.T) {
	t.Parallel()
	const topic = "orders"
	cluster, client := kafkaCluster(t, topic, 2)
	b := setup(t)
	b.write(t, 10, 10)
	b.exec(t, `INSERT INTO outbox_event (event_id, topic, aggregate_type, aggregate_id, event_type, partition_key, payload)
		VALUES (gen_random_uuid(), 'orders', 'order', 'big', 'OrderCreated', 'big', jsonb_build_object('blob', repeat('x', 5000)))`)
	r := b.relay(t, func(c *outbox.RelayConfig) {
		c.Publisher = outbox.NewKafkaPublisher(client, 4096)
		c.Topics = map[string]string{testTopic: "kafka://" + topic}
	})
	drainUntil(t, r, func() bool { return b.countWhere(t, "published_at IS NULL AND quarantined_at IS NULL") == 0 })
	require.Equal(t, 1, b.countWhere(t, "quarantined_at IS NOT NULL AND partition_key = 'big'"))
	require.Len(t, readAll(t, cluster, topic, 10), 10)
}

// refuseProduce answers a produce request as a broker that refuses every partition of it
// (TOPIC_AUTHORIZATION_FAILED).
func refuseProduce(req kmsg.Request) kmsg.Response {
	pr := req.(*kmsg.ProduceRequest)
	resp := pr.ResponseKind().(*kmsg.ProduceResponse)
	for _, rt := range pr.Topics {
		st := kmsg.NewProduceResponseTopic()
		st.Topic = rt.Topic
		for _, rp := range rt.Partitions {
			sp := kmsg.NewProduceResponseTopicPartition()
			sp.Partition = rp.Partition
			sp.ErrorCode = kerr.TopicAuthorizationFailed.Code
			st.Partitions = append(st.Partitions, sp)
		}
		resp.Topics = append(resp.Topics, st)
	}
	return resp
}
