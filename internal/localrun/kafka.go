package localrun

import (
	"context"
	"encoding/base64"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/internal/wire"
)

// KafkaCluster is an in-process Kafka for the local pipeline: kfake, which speaks the real
// protocol on loopback ports, so the relay's franz-go client (in its own process, under the
// emulator) and the event source below talk to it as to a broker.
type KafkaCluster struct {
	// Brokers are the listen addresses (host:port).
	Brokers []string
	c       *kfake.Cluster
}

// StartKafka starts a one-broker cluster with topics of partitions partitions each.
func StartKafka(partitions int32, topics ...string) (*KafkaCluster, error) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, topics...))
	if err != nil {
		return nil, fmt.Errorf("start the in-process Kafka: %w", err)
	}
	return &KafkaCluster{Brokers: c.ListenAddrs(), c: c}, nil
}

// Close stops the cluster.
func (k *KafkaCluster) Close() { k.c.Close() }

// DefaultKafkaClusterARN is the eventSourceArn of the events KafkaEventSource sends.
const DefaultKafkaClusterARN = "arn:aws:kafka:us-east-1:000000000000:cluster/sluice-local/00000000-0000-0000-0000-000000000000-1"

// KafkaEventSource plays Lambda's Amazon MSK event source mapping with ReportBatchItemFailures:
// a member of consumer group Group polls Topic, invokes the function with an events.KafkaEvent
// (records keyed TOPIC-PARTITION, keys and values base64, headers as byte arrays), and commits a
// partition's offset only after the function answered: up to its lowest reported failure, which
// the partition is sought back to and retried from, or past its last record. A failed
// invocation (or a response naming a record that was not in the batch) commits nothing and
// retries the whole batch. One poll's partitions are spread over concurrent invocations, at most
// one per function instance, each partition wholly in one, so a partition's records are applied
// in order, one batch at a time.
type KafkaEventSource struct {
	// Brokers, Topic and Group say what to consume. Required.
	Brokers      []string
	Topic, Group string
	// Function is invoked. Required.
	Function *Function
	// BatchSize is the most records per poll (shared by its invocations). Defaults to 100,
	// Lambda's default for Kafka.
	BatchSize int
	// ClusterARN is the events' eventSourceArn. Defaults to DefaultKafkaClusterARN.
	ClusterARN string
	// RetryDelay is the pause after a round with failures. Defaults to 500ms.
	RetryDelay time.Duration
	// MaxRetryAttempts, as the mapping's MaximumRetryAttempts with an on-failure destination:
	// a record reported failed on its first delivery and this many retries is passed over (its
	// partition's offset committed past it) and counted in Stats().Discarded, where Lambda would
	// send its failure record (topic, partition, offset; not the data). Defaults to 0: retried
	// until it succeeds, as a mapping without a limit does.
	MaxRetryAttempts int
	// Logger receives errors. Defaults to slog.Default().
	Logger *slog.Logger

	invocations, failedInvocations, committed, reportedFailures, discarded atomic.Int64
	// failures counts the failed deliveries of the record each partition retries from
	// (MaxRetryAttempts), by TOPIC-PARTITION.
	failures sync.Map // string -> failedRecord
}

// failedRecord is the record a partition retries from and its failed deliveries so far.
type failedRecord struct {
	offset   int64
	failures int
}

// Stats returns the counts so far: Deleted is the records committed.
func (k *KafkaEventSource) Stats() EventSourceStats {
	return EventSourceStats{Invocations: k.invocations.Load(), FailedInvocations: k.failedInvocations.Load(),
		Deleted: k.committed.Load(), ReportedFailures: k.reportedFailures.Load(), Discarded: k.discarded.Load()}
}

// Run polls until ctx ends.
func (k *KafkaEventSource) Run(ctx context.Context) error {
	log := k.Logger
	if log == nil {
		log = slog.Default()
	}
	batch := k.BatchSize
	if batch == 0 {
		batch = 100
	}
	retryDelay := k.RetryDelay
	if retryDelay == 0 {
		retryDelay = 500 * time.Millisecond
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.Brokers...), kgo.ConsumerGroup(k.Group), kgo.ConsumeTopics(k.Topic),
		kgo.DisableAutoCommit(), kgo.BlockRebalanceOnPoll(), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(250*time.Millisecond))
	if err != nil {
		return fmt.Errorf("kafka event source: %w", err)
	}
	defer cl.Close()
	for ctx.Err() == nil {
		fetches := cl.PollRecords(ctx, batch)
		if ctx.Err() != nil || fetches.IsClientClosed() {
			cl.AllowRebalance() // else Close, leaving the group, waits for it
			break
		}
		fetches.EachError(func(topic string, p int32, err error) {
			log.Warn("kafka event source: fetch error", "topic", topic, "partition", p, "error", err)
		})
		var recs []*kgo.Record
		fetches.EachRecord(func(r *kgo.Record) { recs = append(recs, r) })
		failed := k.deliver(ctx, cl, recs, log)
		cl.AllowRebalance()
		if failed {
			sleep(ctx, retryDelay)
		}
	}
	return nil
}

// deliver invokes the function with recs, spread over the instances by partition, and settles
// every partition; it reports whether any record or invocation failed.
func (k *KafkaEventSource) deliver(ctx context.Context, cl *kgo.Client, recs []*kgo.Record, log *slog.Logger) bool {
	if len(recs) == 0 {
		return false
	}
	byPartition := map[string][]*kgo.Record{}
	for _, r := range recs {
		tp := r.Topic + "-" + strconv.Itoa(int(r.Partition))
		byPartition[tp] = append(byPartition[tp], r)
	}
	n := min(len(byPartition), max(1, len(k.Function.instances)))
	shares := make([]map[string][]*kgo.Record, n)
	for i, tp := range slices.Sorted(maps.Keys(byPartition)) {
		if shares[i%n] == nil {
			shares[i%n] = map[string][]*kgo.Record{}
		}
		shares[i%n][tp] = byPartition[tp]
	}
	var (
		mu     sync.Mutex
		commit []*kgo.Record
		seek   = map[string]map[int32]kgo.EpochOffset{}
		failed atomic.Bool
		wg     sync.WaitGroup
	)
	for _, share := range shares {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, s, ok := k.invoke(ctx, share, log)
			if !ok {
				failed.Store(true)
			}
			mu.Lock()
			defer mu.Unlock()
			commit = append(commit, c...)
			for topic, ps := range s {
				if seek[topic] == nil {
					seek[topic] = map[int32]kgo.EpochOffset{}
				}
				maps.Copy(seek[topic], ps)
			}
		}()
	}
	wg.Wait()
	cl.SetOffsets(seek)
	if len(commit) > 0 {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if err := cl.CommitRecords(cctx, commit...); err != nil {
			log.Warn("kafka event source: commit failed; the records will be delivered again", "error", err)
		}
	}
	return failed.Load()
}

// invoke runs one invocation with the partitions of share and returns the records to commit
// (the last settled one of each partition) and where to seek the partitions to retry.
func (k *KafkaEventSource) invoke(ctx context.Context, share map[string][]*kgo.Record, log *slog.Logger) (commit []*kgo.Record, seek map[string]map[int32]kgo.EpochOffset, ok bool) {
	arn := k.ClusterARN
	if arn == "" {
		arn = DefaultKafkaClusterARN
	}
	seek = map[string]map[int32]kgo.EpochOffset{}
	retryFrom := func(r *kgo.Record) {
		if seek[r.Topic] == nil {
			seek[r.Topic] = map[int32]kgo.EpochOffset{}
		}
		seek[r.Topic][r.Partition] = kgo.EpochOffset{Epoch: -1, Offset: r.Offset}
	}
	retryAll := func() {
		for _, rs := range share {
			retryFrom(rs[0])
		}
	}
	var resp wire.KafkaEventResponse
	k.invocations.Add(1)
	// The invocation runs to its end even when we are stopping, as Lambda's would.
	if err := k.Function.Invoke(context.WithoutCancel(ctx), KafkaEvent(share, arn, strings.Join(k.Brokers, ",")), &resp); err != nil {
		k.failedInvocations.Add(1)
		log.Warn("kafka event source: invocation failed; the batch will be delivered again", "error", err)
		retryAll()
		return nil, seek, false
	}
	lowest := map[string]int64{} // per partition, the lowest offset reported failed
	for _, f := range resp.BatchItemFailures {
		id := f.ItemIdentifier
		if !slices.ContainsFunc(share[id.Partition], func(r *kgo.Record) bool { return r.Offset == id.Offset }) {
			// As Lambda: an identifier not in the batch fails the whole batch.
			k.reportedFailures.Add(int64(countRecords(share)))
			log.Warn("kafka event source: the response names a record not in the batch; the batch will be delivered again", "partition", id.Partition, "offset", id.Offset)
			retryAll()
			return nil, seek, false
		}
		k.reportedFailures.Add(1)
		if low, seen := lowest[id.Partition]; !seen || id.Offset < low {
			lowest[id.Partition] = id.Offset
		}
	}
	for tp, rs := range share {
		var last *kgo.Record
		for _, r := range rs {
			if low, failed := lowest[tp]; failed && r.Offset >= low {
				if k.giveUp(tp, r) {
					log.Warn("kafka event source: record failed its last retry; passed over (Lambda sends its failure record to the on-failure destination)",
						"topic", r.Topic, "partition", r.Partition, "offset", r.Offset)
					k.discarded.Add(1)
					last = r
					if next := slices.IndexFunc(rs, func(x *kgo.Record) bool { return x.Offset > r.Offset }); next >= 0 {
						retryFrom(rs[next])
					} else {
						retryFrom(&kgo.Record{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset + 1})
					}
					break
				}
				retryFrom(r)
				break
			}
			last = r
		}
		if last != nil {
			commit = append(commit, last)
			k.committed.Add(int64(slices.Index(rs, last) + 1))
		}
	}
	return commit, seek, len(lowest) == 0
}

// giveUp counts a failed delivery of r, the record partition tp retries from, and reports
// whether it was the last one MaxRetryAttempts allows.
func (k *KafkaEventSource) giveUp(tp string, r *kgo.Record) bool {
	if k.MaxRetryAttempts <= 0 {
		return false
	}
	f := failedRecord{offset: r.Offset}
	if v, ok := k.failures.Load(tp); ok && v.(failedRecord).offset == r.Offset {
		f = v.(failedRecord)
	}
	f.failures++
	if f.failures > k.MaxRetryAttempts {
		k.failures.Delete(tp)
		return true
	}
	k.failures.Store(tp, f)
	return false
}

func countRecords(share map[string][]*kgo.Record) int {
	n := 0
	for _, rs := range share {
		n += len(rs)
	}
	return n
}

// KafkaEvent is the Lambda event the Amazon MSK event source mapping sends for records, keyed
// by TOPIC-PARTITION, each partition's records in offset order.
func KafkaEvent(records map[string][]*kgo.Record, clusterARN, bootstrapServers string) events.KafkaEvent {
	ev := events.KafkaEvent{EventSource: "aws:kafka", EventSourceARN: clusterARN, BootstrapServers: bootstrapServers,
		Records: make(map[string][]events.KafkaRecord, len(records))}
	for tp, rs := range records {
		out := make([]events.KafkaRecord, 0, len(rs))
		for _, r := range rs {
			kr := events.KafkaRecord{Topic: r.Topic, Partition: int64(r.Partition), Offset: r.Offset,
				Timestamp: events.MilliSecondsEpochTime{Time: r.Timestamp}, TimestampType: "CREATE_TIME",
				Value: base64.StdEncoding.EncodeToString(r.Value), Headers: []map[string]events.JSONNumberBytes{}}
			if r.Key != nil {
				kr.Key = base64.StdEncoding.EncodeToString(r.Key)
			}
			for _, h := range r.Headers {
				kr.Headers = append(kr.Headers, map[string]events.JSONNumberBytes{h.Key: h.Value})
			}
			out = append(out, kr)
		}
		ev.Records[tp] = out
	}
	return ev
}
