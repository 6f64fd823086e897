package inbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// ConsumeKafka for services that read Kafka themselves (a container, an EC2 worker) rather than
// through a Lambda event source mapping. The loop is one goroutine:
//
//	poll (rebalances blocked) ─► apply the records through the Consumer (Consumer.run, as every source)
//	     ─► per partition: commit the offset after its last record that committed, in order
//	     ─► a failed record: seek its partition back to it and pause it until its retry time
//	     ─► allow rebalances
//
// An offset is committed only after the inbox transaction of every record before it
// committed, so a crash at any point redelivers records that the inbox then finds: duplicates,
// never loss. A failing record blocks its partition (only its partition) until it succeeds or,
// with a dead-letter topic, until it is safely there.

// Defaults of KafkaOptions.
const (
	defaultKafkaMaxPollRecords  = 500
	defaultKafkaRetryBackoff    = time.Second
	defaultKafkaRetryBackoffMax = time.Minute
	defaultKafkaMaxAttempts     = 10
)

// The headers a dead-lettered record carries beside its own: where it came from and why.
const (
	HeaderDeadLetterSource   = "sluice-dead-letter-source"   // TOPIC/PARTITION/OFFSET of the original record
	HeaderDeadLetterConsumer = "sluice-dead-letter-consumer" // the inbox consumer name
	HeaderDeadLetterAttempts = "sluice-dead-letter-attempts" // failed attempts before it was moved
	HeaderDeadLetterError    = "sluice-dead-letter-error"    // the last attempt's error (at most 1,000 bytes)
)

// KafkaOptions configure ConsumeKafka. A nil *KafkaOptions takes every default.
type KafkaOptions struct {
	// MaxPollRecords bounds the records applied per poll (one Consumer batch). Defaults to 500.
	MaxPollRecords int
	// RetryBackoff is the wait before a failed record is tried again; it doubles with each
	// failed attempt up to RetryBackoffMax. Default to 1 second and 1 minute.
	RetryBackoff, RetryBackoffMax time.Duration
	// DeadLetterTopic receives a record that failed MaxAttempts times: its key, value and headers
	// as they were (so replaying it dedups on its messageId), plus the HeaderDeadLetter*
	// headers. Only once the topic acknowledged it is its offset committed and its partition goes
	// on. Defaults to "": no dead-lettering, a failing record is retried until it succeeds and
	// its partition waits for it, logged at every attempt. Nothing is ever skipped silently.
	DeadLetterTopic string
	// MaxAttempts is how many times a record is tried before it goes to DeadLetterTopic.
	// Defaults to 10; unused without DeadLetterTopic.
	MaxAttempts int
	// Logger receives the loop's logs. Defaults to the Consumer's logger.
	Logger *slog.Logger
}

// WithDefaults returns a copy of o with every zero field set to its documented default.
func (o KafkaOptions) WithDefaults() KafkaOptions {
	if o.MaxPollRecords == 0 {
		o.MaxPollRecords = defaultKafkaMaxPollRecords
	}
	if o.RetryBackoff == 0 {
		o.RetryBackoff = defaultKafkaRetryBackoff
	}
	if o.RetryBackoffMax == 0 {
		o.RetryBackoffMax = defaultKafkaRetryBackoffMax
	}
	if o.MaxAttempts == 0 {
		o.MaxAttempts = defaultKafkaMaxAttempts
	}
	return o
}

func (o KafkaOptions) validate() error {
	var errs []error
	if o.MaxPollRecords < 0 {
		errs = append(errs, fmt.Errorf("%w: MaxPollRecords must not be negative", ErrInvalidConfig))
	}
	if o.RetryBackoff < 0 || o.RetryBackoffMax < o.RetryBackoff {
		errs = append(errs, fmt.Errorf("%w: RetryBackoff must be positive and at most RetryBackoffMax", ErrInvalidConfig))
	}
	if o.MaxAttempts < 1 {
		errs = append(errs, fmt.Errorf("%w: MaxAttempts must be at least 1", ErrInvalidConfig))
	}
	return errors.Join(errs...)
}

// KafkaGroupOpts are the franz-go options ConsumeKafka needs, for a client of consumer group
// group reading topics: manual commits (DisableAutoCommit), rebalances held while a poll's
// records are applied and committed (BlockRebalanceOnPoll), and a new group starting at the
// earliest offset, so records published before its first start are not passed over. Add the
// brokers, TLS and SASL (lambdaenv.KafkaClient takes them as extra options).
func KafkaGroupOpts(group string, topics ...string) []kgo.Opt {
	return []kgo.Opt{kgo.ConsumerGroup(group), kgo.ConsumeTopics(topics...), kgo.DisableAutoCommit(),
		kgo.BlockRebalanceOnPoll(), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())}
}

// ConsumeKafka applies the records client polls through c until ctx ends or the client is
// closed, then returns nil; the client stays the caller's (close it to leave the group, so its
// partitions move to the other members at once). The client must be a group consumer with DisableAutoCommit and
// BlockRebalanceOnPoll (KafkaGroupOpts); otherwise ConsumeKafka returns an error wrapping
// ErrInvalidConfig at once, as it does for bad opts.
//
// Each poll's records are applied as one Consumer batch; then each partition's offset is
// committed after its last record whose transaction committed, in order, so a crash at any
// point redelivers records the inbox then finds (duplicates, never loss). A failing record
// blocks its partition, and only its partition: it is retried with backoff and, only when
// DeadLetterTopic is set, moved there after MaxAttempts.
func ConsumeKafka(ctx context.Context, client *kgo.Client, c *Consumer, opts *KafkaOptions) error {
	if client == nil || c == nil {
		return fmt.Errorf("%w: ConsumeKafka needs a client and a Consumer", ErrInvalidConfig)
	}
	var o KafkaOptions
	if opts != nil {
		o = *opts
	}
	o = o.WithDefaults()
	var errs []error
	if err := o.validate(); err != nil {
		errs = append(errs, err)
	}
	if g, _ := client.OptValue(kgo.ConsumerGroup).(string); g == "" {
		errs = append(errs, fmt.Errorf("%w: the Kafka client must consume in a group (kgo.ConsumerGroup; see KafkaGroupOpts)", ErrInvalidConfig))
	}
	if v, _ := client.OptValue(kgo.DisableAutoCommit).(bool); !v {
		errs = append(errs, fmt.Errorf("%w: the Kafka client must not autocommit (kgo.DisableAutoCommit): it would commit records the inbox has not applied", ErrInvalidConfig))
	}
	if v, _ := client.OptValue(kgo.BlockRebalanceOnPoll).(bool); !v {
		errs = append(errs, fmt.Errorf("%w: the Kafka client must block rebalances while records are applied (kgo.BlockRebalanceOnPoll)", ErrInvalidConfig))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if o.Logger == nil {
		o.Logger = c.log
	}
	l := &kafkaLoop{client: client, c: c, o: o, log: o.Logger, stuck: map[topicPartition]*stuckPartition{}, now: time.Now}
	return l.run(ctx)
}

type topicPartition struct {
	topic     string
	partition int32
}

func (tp topicPartition) String() string { return tp.topic + "-" + strconv.Itoa(int(tp.partition)) }

// stuckPartition is a partition waiting to try its failed record again.
type stuckPartition struct {
	offset   int64     // the failed record's offset: the partition resumes there
	attempts int       // failed attempts of that record
	retryAt  time.Time // when it is fetched again
	paused   bool      // fetching is paused until retryAt
	// generation is the group generation the failure happened in. After a rebalance the
	// partition may have been revoked and served by another member, which may have applied or
	// dead-lettered the record and committed past it: the state is then forgotten, or this
	// member would seek back and commit lower offsets when the partition returns.
	generation int32
}

// kafkaLoop is ConsumeKafka's state; only its goroutine touches it.
type kafkaLoop struct {
	client *kgo.Client
	c      *Consumer
	o      KafkaOptions
	log    *slog.Logger
	stuck  map[topicPartition]*stuckPartition
	now    func() time.Time
}

func (l *kafkaLoop) run(ctx context.Context) error {
	for {
		l.resumeDue()
		pctx, cancel := l.pollContext(ctx)
		fetches := l.client.PollRecords(pctx, l.o.MaxPollRecords)
		cancel()
		if ctx.Err() != nil || fetches.IsClientClosed() {
			l.client.AllowRebalance()
			return nil
		}
		fetches.EachError(func(topic string, partition int32, err error) {
			if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
				l.log.WarnContext(ctx, "inbox: kafka fetch error", "topic", topic, "partition", partition, "error", err.Error())
			}
		})
		l.forgetAfterRebalance()
		l.apply(ctx, fetches)
		l.client.AllowRebalance()
	}
}

// forgetAfterRebalance drops the retry state of the partitions that failed in an earlier
// group generation (see stuckPartition.generation): a partition still assigned fetches from its
// position, the failed record (nothing was committed past it), and retries it at once; one
// that came back fetches from the group's committed offset, wherever its last owner left it.
func (l *kafkaLoop) forgetAfterRebalance() {
	_, gen := l.client.GroupMetadata()
	resume := map[string][]int32{}
	for tp, st := range l.stuck {
		if st.generation != gen {
			if st.paused {
				resume[tp.topic] = append(resume[tp.topic], tp.partition)
			}
			delete(l.stuck, tp)
		}
	}
	if len(resume) > 0 {
		l.client.ResumeFetchPartitions(resume)
	}
}

// pollContext bounds the poll by the next retry time, so a paused partition is resumed on time
// even when no other partition has records.
func (l *kafkaLoop) pollContext(ctx context.Context) (context.Context, context.CancelFunc) {
	var next time.Time
	for _, st := range l.stuck {
		if st.paused && (next.IsZero() || st.retryAt.Before(next)) {
			next = st.retryAt
		}
	}
	if next.IsZero() {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, max(next.Sub(l.now()), 10*time.Millisecond))
}

// resumeDue resumes fetching the stuck partitions whose retry time came.
func (l *kafkaLoop) resumeDue() {
	due := map[string][]int32{}
	for tp, st := range l.stuck {
		if st.paused && !l.now().Before(st.retryAt) {
			st.paused = false
			due[tp.topic] = append(due[tp.topic], tp.partition)
		}
	}
	if len(due) > 0 {
		l.client.ResumeFetchPartitions(due)
	}
}

// apply runs one poll's records through the Consumer and settles each partition: commit up to
// its last record before the first failure, and seek back to and pause at that failure.
func (l *kafkaLoop) apply(ctx context.Context, fetches kgo.Fetches) {
	var (
		recs []*kgo.Record
		ds   []delivery
	)
	fetches.EachPartition(func(p kgo.FetchTopicPartition) {
		if len(p.Records) == 0 {
			return
		}
		tp := topicPartition{p.Topic, p.Partition}
		if st := l.stuck[tp]; st != nil && (l.now().Before(st.retryAt) || p.Records[0].Offset < st.offset) {
			// Fetched before its pause took effect (or stale): not its turn. It resumes at st.offset.
			l.seek(tp, st.offset)
			return
		}
		for _, r := range p.Records {
			recs = append(recs, r)
			ds = append(ds, kgoDelivery(r))
		}
	})
	if len(ds) == 0 {
		return
	}
	rep := l.c.run(ctx, ds)

	// Each partition's outcome: its last record before the first failure, and that failure.
	type settled struct {
		last   *kgo.Record
		failed int // index in recs of the first failure; -1 for none
	}
	parts := map[topicPartition]*settled{}
	var order []topicPartition
	for i, r := range recs {
		tp := topicPartition{r.Topic, r.Partition}
		s := parts[tp]
		if s == nil {
			s = &settled{failed: -1}
			parts[tp], order = s, append(order, tp)
		}
		switch {
		case s.failed >= 0: // after the failure: blocked, not attempted
		case rep.Results[i].Outcome == Failed:
			s.failed = i
		default:
			s.last = r
		}
	}
	var commit []*kgo.Record
	for _, tp := range order {
		s := parts[tp]
		if s.last != nil {
			commit = append(commit, s.last)
		}
		if s.failed < 0 {
			delete(l.stuck, tp) // its failed record, if it had one, succeeded
			continue
		}
		if !l.retryLater(ctx, tp, recs[s.failed], &ds[s.failed], rep.Results[s.failed].Err) {
			commit = append(commit, recs[s.failed]) // dead-lettered: committed past it
		}
	}
	l.commit(ctx, commit)
}

// retryLater records a failed attempt of r, the first failure of partition tp in this poll, and
// either makes the partition wait to retry it (true) or, after MaxAttempts with a dead-letter
// topic, moves it there, marks its dead letter (d's) dead, and lets the partition go on after
// it (false).
func (l *kafkaLoop) retryLater(ctx context.Context, tp topicPartition, r *kgo.Record, d *delivery, cause error) bool {
	st := l.stuck[tp]
	if st == nil || st.offset != r.Offset {
		_, gen := l.client.GroupMetadata()
		st = &stuckPartition{offset: r.Offset, generation: gen}
		l.stuck[tp] = st
	}
	st.attempts++
	log := l.log.With("topic", tp.topic, "partition", tp.partition, "offset", r.Offset, "attempts", st.attempts)
	if l.o.DeadLetterTopic != "" && st.attempts >= l.o.MaxAttempts {
		err := l.deadLetter(ctx, r, st.attempts, cause)
		if err == nil {
			log.ErrorContext(ctx, "inbox: kafka record moved to the dead-letter topic; its partition goes on",
				"dead_letter_topic", l.o.DeadLetterTopic, "error", errText(cause))
			l.c.markDead(ctx, d) // its dead letter, recorded when it failed, is dead now
			delete(l.stuck, tp)
			if st.paused {
				l.client.ResumeFetchPartitions(map[string][]int32{tp.topic: {tp.partition}})
			}
			l.seek(tp, r.Offset+1)
			return false
		}
		log.ErrorContext(ctx, "inbox: kafka dead-letter produce failed; the record stays and is retried", "error", err.Error())
	}
	backoff := l.o.RetryBackoff << min(st.attempts-1, 30)
	if backoff <= 0 || backoff > l.o.RetryBackoffMax {
		backoff = l.o.RetryBackoffMax
	}
	st.retryAt = l.now().Add(backoff)
	l.seek(tp, r.Offset)
	if !st.paused {
		l.client.PauseFetchPartitions(map[string][]int32{tp.topic: {tp.partition}})
		st.paused = true
	}
	log.WarnContext(ctx, "inbox: kafka record failed; its partition waits for it", "retry_in", backoff.String(), "error", errText(cause))
	return true
}

// deadLetter produces r to the dead-letter topic and waits for the acknowledgement.
func (l *kafkaLoop) deadLetter(ctx context.Context, r *kgo.Record, attempts int, cause error) error {
	headers := append(make([]kgo.RecordHeader, 0, len(r.Headers)+4), r.Headers...)
	headers = append(headers,
		kgo.RecordHeader{Key: HeaderDeadLetterSource, Value: fmt.Appendf(nil, "%s/%d/%d", r.Topic, r.Partition, r.Offset)},
		kgo.RecordHeader{Key: HeaderDeadLetterConsumer, Value: []byte(l.c.cfg.Consumer)},
		kgo.RecordHeader{Key: HeaderDeadLetterAttempts, Value: []byte(strconv.Itoa(attempts))},
		kgo.RecordHeader{Key: HeaderDeadLetterError, Value: []byte(truncate(errText(cause), 1000))})
	dl := &kgo.Record{Topic: l.o.DeadLetterTopic, Key: r.Key, Value: r.Value, Headers: headers, Timestamp: r.Timestamp}
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	return l.client.ProduceSync(pctx, dl).FirstErr()
}

// seek makes partition tp resume at offset (buffered records after it are dropped).
func (l *kafkaLoop) seek(tp topicPartition, offset int64) {
	l.client.SetOffsets(map[string]map[int32]kgo.EpochOffset{tp.topic: {tp.partition: {Epoch: -1, Offset: offset}}})
}

// commit commits, per partition, the offset after each of recs. It runs even when ctx ended
// (the transactions committed: saying so saves redeliveries), and a failure only costs
// redeliveries, which the inbox finds.
func (l *kafkaLoop) commit(ctx context.Context, recs []*kgo.Record) {
	if len(recs) == 0 {
		return
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := l.client.CommitRecords(cctx, recs...); err != nil {
		l.log.WarnContext(ctx, "inbox: kafka offset commit failed; the records will be delivered again and found in the inbox", "error", err.Error())
	}
}

func kgoDelivery(r *kgo.Record) delivery {
	kr := kafkaRecord{topic: r.Topic, partition: int64(r.Partition), offset: r.Offset, key: r.Key, value: r.Value}
	for _, h := range r.Headers {
		kr.headers = append(kr.headers, kafkaHeader{key: h.Key, value: h.Value})
	}
	d := kr.delivery()
	d.selfManaged = true
	return d
}

func errText(err error) string {
	if err == nil {
		return "unknown"
	}
	return err.Error()
}
