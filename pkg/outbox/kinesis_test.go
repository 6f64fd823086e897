package outbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/big"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/kinesis"
	ktypes "github.com/aws/aws-sdk-go-v2/service/kinesis/types"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/localaws"
	"github.com/sluicehq/sluice/internal/testwait"
	"github.com/sluicehq/sluice/internal/wire"
	"github.com/sluicehq/sluice/pkg/outbox"
)

// kinesisStream creates a data stream of shards shards through the standard AWS APIs only, on
// moto_server or LocalStack (localaws.TestEndpointServing: fauxqs has no Kinesis), and waits
// until it is active.
func kinesisStream(t *testing.T, shards int32) (streamARN string, kc *kinesis.Client) {
	t.Helper()
	ctx := context.Background()
	kc = kinesis.NewFromConfig(localaws.TestConfigServing(t, localaws.ServiceKinesis))
	name := "outbox-test-" + uuid.NewString()[:8]
	_, err := kc.CreateStream(ctx, &kinesis.CreateStreamInput{StreamName: aws.String(name), ShardCount: aws.Int32(shards)})
	require.NoError(t, err)
	require.NoError(t, kinesis.NewStreamExistsWaiter(kc, func(o *kinesis.StreamExistsWaiterOptions) { o.MinDelay = 100 * time.Millisecond }).
		Wait(ctx, &kinesis.DescribeStreamInput{StreamName: aws.String(name)}, time.Minute))
	d, err := kc.DescribeStreamSummary(ctx, &kinesis.DescribeStreamSummaryInput{StreamName: aws.String(name)})
	require.NoError(t, err)
	return aws.ToString(d.StreamDescriptionSummary.StreamARN), kc
}

// kinesisDelivery is one record read back from a shard.
type kinesisDelivery struct {
	shard, partitionKey string
	sequence            *big.Int
	envelope            wire.Envelope
}

// readShards reads every shard of the stream from its start until it has seen n records in
// all, in each shard's order.
func readShards(t *testing.T, kc *kinesis.Client, streamARN string, n int) []kinesisDelivery {
	t.Helper()
	ctx := context.Background()
	shards, err := kc.ListShards(ctx, &kinesis.ListShardsInput{StreamARN: aws.String(streamARN)})
	require.NoError(t, err)
	iterators := map[string]*string{}
	for _, s := range shards.Shards {
		it, err := kc.GetShardIterator(ctx, &kinesis.GetShardIteratorInput{StreamARN: aws.String(streamARN),
			ShardId: s.ShardId, ShardIteratorType: ktypes.ShardIteratorTypeTrimHorizon})
		require.NoError(t, err)
		iterators[aws.ToString(s.ShardId)] = it.ShardIterator
	}
	var out []kinesisDelivery
	testwait.Progress(t, "every record read back from the stream", func() (int, bool) {
		if len(out) >= n {
			return len(out), true
		}
		for shard, it := range iterators {
			res, err := kc.GetRecords(ctx, &kinesis.GetRecordsInput{StreamARN: aws.String(streamARN), ShardIterator: it})
			require.NoError(t, err)
			iterators[shard] = res.NextShardIterator
			for _, r := range res.Records {
				seq, ok := new(big.Int).SetString(aws.ToString(r.SequenceNumber), 10)
				require.True(t, ok, "sequence number %q", aws.ToString(r.SequenceNumber))
				d := kinesisDelivery{shard: shard, partitionKey: aws.ToString(r.PartitionKey), sequence: seq}
				require.NoError(t, json.Unmarshal(r.Data, &d.envelope), "record data is the envelope: %s", r.Data)
				out = append(out, d)
			}
		}
		return len(out), len(out) >= n
	})
	require.Len(t, out, n, "records read back from every shard")
	return out
}

// requireKinesisOrder checks what a Kinesis consumer relies on: every written row arrived
// once, on the shard of its partition key only, and a key's rows are in id (write) order by
// sequence number within that shard. ids maps event ids to row ids.
func requireKinesisOrder(t *testing.T, got []kinesisDelivery, ids map[string]int64) {
	t.Helper()
	seen := map[string]bool{}
	shardOf := map[string]string{}
	type last struct {
		id  int64
		seq *big.Int
	}
	prev := map[string]last{}
	for _, d := range got {
		md := d.envelope.Metadata
		id, ok := ids[md.MessageID]
		require.True(t, ok, "metadata.messageId %q is a written event id", md.MessageID)
		require.False(t, seen[md.MessageID], "event %s on the stream twice", md.MessageID)
		seen[md.MessageID] = true
		if s, ok := shardOf[md.PartitionKey]; ok {
			require.Equal(t, s, d.shard, "key %s stays on one shard", md.PartitionKey)
		}
		shardOf[md.PartitionKey] = d.shard
		if p, ok := prev[md.PartitionKey]; ok {
			require.Equal(t, 1, d.sequence.Cmp(p.seq), "key %s: sequence numbers grow within the shard", md.PartitionKey)
			require.Greater(t, id, p.id, "key %s: row %d after row %d", md.PartitionKey, id, p.id)
		}
		prev[md.PartitionKey] = last{id: id, seq: d.sequence}
	}
	require.Len(t, seen, len(ids))
}

// eventIDs returns the outbox's event ids with their row ids.
func eventIDs(t *testing.T, b *bundle) map[string]int64 {
	t.Helper()
	rows, err := b.pool.Query(context.Background(), `SELECT event_id::text, id FROM outbox_event`)
	require.NoError(t, err)
	defer rows.Close()
	out := map[string]int64{}
	for rows.Next() {
		var ev string
		var id int64
		require.NoError(t, rows.Scan(&ev, &id))
		out[ev] = id
	}
	require.NoError(t, rows.Err())
	return out
}

// Every row reaches the stream once, as the documented envelope, with the row's partition key
// as the record's (a key longer than Kinesis's 256 characters as its stable hash): a key stays
// on one shard, and its rows are in id order by sequence number there.
func TestKinesisPublisherKeepsEveryKeyInOrderOnOneShard(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	streamARN, kc := kinesisStream(t, 4)

	long := strings.Repeat("é", 300)
	keys := []string{long}
	for i := range 24 {
		keys = append(keys, fmt.Sprintf("customer-%d", i))
	}
	const n = 600
	msgs := make([]outbox.Message, n)
	for i := range msgs {
		msgs[i] = outbox.Message{
			Topic: testTopic, AggregateType: "order", AggregateID: fmt.Sprintf("o-%d", i), EventType: "OrderCreated",
			PartitionKey: keys[i%len(keys)], Payload: json.RawMessage(fmt.Sprintf(`{"seq": %d}`, i)),
			Headers: map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
		}
	}
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	written, err := outbox.Write(ctx, tx, msgs...)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))

	r := b.relay(t, func(c *outbox.RelayConfig) {
		c.Publisher = outbox.NewKinesisPublisher(kc)
		c.Topics = map[string]string{testTopic: streamARN}
	})
	drainUntil(t, r, func() bool { return b.countWhere(t, "published_at IS NULL") == 0 })

	got := readShards(t, kc, streamARN, n)
	requireKinesisOrder(t, got, eventIDs(t, b))
	byID := map[string]outbox.Message{}
	for _, w := range written {
		byID[w.EventID.String()] = w
	}
	shards := map[string]bool{}
	for _, d := range got {
		md, w := d.envelope.Metadata, byID[d.envelope.Metadata.MessageID]
		shards[d.shard] = true
		require.Equal(t, w.PartitionKey, md.PartitionKey, "metadata.partitionKey is the row's key")
		if w.PartitionKey == long {
			require.True(t, strings.HasPrefix(d.partitionKey, "sha256-"), "a key above 256 characters is hashed: %q", d.partitionKey)
		} else {
			require.Equal(t, w.PartitionKey, d.partitionKey, "the record's partition key is the row's")
		}
		require.Equal(t, "OrderCreated", md.EventType)
		require.Equal(t, "order", md.AggregateType)
		require.Equal(t, w.AggregateID, md.AggregateID)
		_, err := time.Parse(time.RFC3339Nano, md.CreatedAt)
		require.NoError(t, err, "createdAt is RFC 3339")
		require.Equal(t, w.Headers, md.Headers)
		require.JSONEq(t, string(w.Payload), string(d.envelope.Data), "data is the payload")
	}
	require.Greater(t, len(shards), 1, "25 keys spread over several of the 4 shards")
}

// throttlingStream forwards PutRecords to a real endpoint, but first answers a whole call with
// every record throttled, then throttles chosen records once each in otherwise accepted calls.
// A stub for this case only: neither moto nor LocalStack simulates Kinesis throughput limits.
type throttlingStream struct {
	next interface {
		PutRecords(ctx context.Context, in *kinesis.PutRecordsInput, opts ...func(*kinesis.Options)) (*kinesis.PutRecordsOutput, error)
	}
	mu         sync.Mutex
	wholeCalls int             // calls still to throttle entirely
	once       map[string]bool // message ids to throttle on their next attempt
}

const throughputExceeded = "ProvisionedThroughputExceededException"

func (s *throttlingStream) PutRecords(ctx context.Context, in *kinesis.PutRecordsInput, opts ...func(*kinesis.Options)) (*kinesis.PutRecordsOutput, error) {
	throttled := func() ktypes.PutRecordsResultEntry {
		return ktypes.PutRecordsResultEntry{ErrorCode: aws.String(throughputExceeded), ErrorMessage: aws.String("Rate exceeded for shard (injected by the test)")}
	}
	out := &kinesis.PutRecordsOutput{Records: make([]ktypes.PutRecordsResultEntry, len(in.Records))}
	s.mu.Lock()
	whole := s.wholeCalls > 0
	if whole {
		s.wholeCalls--
	}
	var forward []ktypes.PutRecordsRequestEntry
	var index []int
	for i, r := range in.Records {
		var env wire.Envelope
		if err := json.Unmarshal(r.Data, &env); err != nil {
			s.mu.Unlock()
			return nil, err
		}
		if whole || s.once[env.Metadata.MessageID] {
			delete(s.once, env.Metadata.MessageID)
			out.Records[i] = throttled()
			out.FailedRecordCount = aws.Int32(aws.ToInt32(out.FailedRecordCount) + 1)
			continue
		}
		forward, index = append(forward, r), append(index, i)
	}
	s.mu.Unlock()
	if len(forward) > 0 {
		res, err := s.next.PutRecords(ctx, &kinesis.PutRecordsInput{StreamARN: in.StreamARN, StreamName: in.StreamName, Records: forward}, opts...)
		if err != nil {
			return nil, err
		}
		for j, r := range res.Records {
			out.Records[index[j]] = r
		}
		out.FailedRecordCount = aws.Int32(aws.ToInt32(out.FailedRecordCount) + aws.ToInt32(res.FailedRecordCount))
	}
	return out, nil
}

// Throttling loses nothing and breaks no order: a call whose every record is throttled backs
// the stream off as a whole (an outage, not an attempt of its rows), and a record throttled in
// an otherwise accepted call is retried after its backoff, while the rows behind it on its key
// wait; in the end every row is on the stream once, each key in order on one shard.
func TestKinesisPublisherRetriesThrottledRecordsInKeyOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	streamARN, kc := kinesisStream(t, 3)
	written := b.write(t, 120, 12)
	once := map[string]bool{} // the third row of ten keys: never in the first call
	for _, w := range written[20:30] {
		once[w.EventID.String()] = true
	}
	pub := &throttlingStream{next: kc, wholeCalls: 1, once: once}

	r := b.relay(t, func(c *outbox.RelayConfig) {
		c.Publisher = outbox.NewKinesisPublisher(pub)
		c.Topics = map[string]string{testTopic: streamARN}
	})
	drainUntil(t, r, func() bool { return b.countWhere(t, "published_at IS NULL") == 0 })

	require.Zero(t, b.countWhere(t, "quarantined_at IS NOT NULL"), "throttling is never permanent")
	ids := make([]string, 0, len(once))
	for _, w := range written[20:30] {
		ids = append(ids, "'"+w.EventID.String()+"'")
	}
	require.Equal(t, len(ids), b.countWhere(t, "attempts >= 1 AND event_id IN ("+strings.Join(ids, ",")+")"),
		"each record throttled in an accepted call counted one failed attempt, then was published")
	requireKinesisOrder(t, readShards(t, kc, streamARN, len(written)), eventIDs(t, b))
}

// A stream that does not exist is permanent: its rows are quarantined with the reason.
func TestKinesisPublisherQuarantinesAMissingStream(t *testing.T) {
	t.Parallel()
	b := setup(t)
	streamARN, kc := kinesisStream(t, 1)
	b.write(t, 3, 3)
	r := b.relay(t, func(c *outbox.RelayConfig) {
		c.Publisher = outbox.NewKinesisPublisher(kc)
		c.Topics = map[string]string{testTopic: streamARN + "-does-not-exist"}
	})
	drainUntil(t, r, func() bool { return b.countWhere(t, "quarantined_at IS NOT NULL") == 3 })
	require.Equal(t, 3, b.countWhere(t, "published_at IS NULL AND last_error LIKE '%ResourceNotFound%'"))
}
