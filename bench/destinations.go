package main

// The destinations suite (issue 15): the relay's throughput to each destination kind with the
// same simulated broker latency. Each run drives sluice's own publisher for that kind (the SNS,
// EventBridge, Kinesis and Kafka publishers of pkg/outbox: their entry building, envelope or
// record encoding and per-entry result mapping) over a stub of the one SDK method it calls
// (PublishBatch, PutEvents, PutRecords, ProduceSync) that answers every call after the same
// fixed delay and acknowledges every entry. What differs is the relay's own work per kind: the
// message each kind needs, and how many entries one call takes (10 for SNS and EventBridge, up
// to 500 for Kinesis and Kafka), so the same latency is paid fewer times. One relay with
// defaults, the relay suite's seed (rows over keys, round robin); best of RelayRepeats runs,
// interleaved.

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
	ebtypes "github.com/aws/aws-sdk-go-v2/service/eventbridge/types"
	"github.com/aws/aws-sdk-go-v2/service/kinesis"
	ktypes "github.com/aws/aws-sdk-go-v2/service/kinesis/types"
	"github.com/aws/aws-sdk-go-v2/service/sns"
	snstypes "github.com/aws/aws-sdk-go-v2/service/sns/types"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/pkg/outbox"
)

// DestinationsResult is the destinations suite's runs.
type DestinationsResult struct {
	// Delay is every stub's answer time per call.
	Delay time.Duration
	// Rows and Keys are each run's seed; Repeats how often each destination ran.
	Rows, Keys, Repeats int
	Runs                []DestinationRun
}

// DestinationRun is the best run of one destination kind at one publish concurrency.
type DestinationRun struct {
	// Kind is the destination's kind (outbox.Kind) and Call the SDK call its stub answers.
	Kind, Call string
	// Concurrency is the relay's PublishConcurrency: the calls it has in flight at most.
	Concurrency int
	// MaxEntries is the most entries one call takes (the publisher's Limits).
	MaxEntries int
	Events     int
	Elapsed    time.Duration
	// Calls the stub answered in the best run, and Duplicates: entries it acknowledged beyond
	// the rows (a row published twice).
	Calls, Duplicates int64
	// Rates of every repeat (events/s).
	Rates []float64
}

// Rate is the throughput in events per second.
func (r DestinationRun) Rate() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Events) / r.Elapsed.Seconds()
}

// destinationsDelay is the simulated latency of every call: the relay suite's 10 ms.
const destinationsDelay = 10 * time.Millisecond

// destinationsConcurrency are the relay's PublishConcurrency values the suite runs at: the
// default, at which the database work bounds every kind, and 4, at which the calls do and the
// entries one call takes decide.
var destinationsConcurrency = []int{int(outbox.RelaySetting("PublishConcurrency").Default), 4}

// delayedCalls is what every stub shares: the delay, and counts of the calls answered, the
// entries they acknowledged and the calls cancelled before their answer.
type delayedCalls struct {
	delay                     time.Duration
	calls, entries, cancelled atomic.Int64
}

// wait sleeps the delay for one call of n entries and counts it; it returns ctx's error if
// the call was cancelled.
func (d *delayedCalls) wait(ctx context.Context, n int) error {
	if err := sleepCtx(ctx, d.delay); err != nil {
		d.cancelled.Add(1)
		return err
	}
	d.calls.Add(1)
	d.entries.Add(int64(n))
	return nil
}

// The stubs implement the one method each publisher depends on.
type (
	snsStub         struct{ *delayedCalls }
	eventBridgeStub struct{ *delayedCalls }
	kinesisStub     struct{ *delayedCalls }
	kafkaStub       struct{ *delayedCalls }
)

func (s snsStub) PublishBatch(ctx context.Context, in *sns.PublishBatchInput, _ ...func(*sns.Options)) (*sns.PublishBatchOutput, error) {
	if err := s.wait(ctx, len(in.PublishBatchRequestEntries)); err != nil {
		return nil, err
	}
	out := &sns.PublishBatchOutput{Successful: make([]snstypes.PublishBatchResultEntry, len(in.PublishBatchRequestEntries))}
	for i, e := range in.PublishBatchRequestEntries {
		out.Successful[i] = snstypes.PublishBatchResultEntry{Id: e.Id, MessageId: aws.String(strconv.Itoa(i))}
	}
	return out, nil
}

func (s eventBridgeStub) PutEvents(ctx context.Context, in *eventbridge.PutEventsInput, _ ...func(*eventbridge.Options)) (*eventbridge.PutEventsOutput, error) {
	if err := s.wait(ctx, len(in.Entries)); err != nil {
		return nil, err
	}
	out := &eventbridge.PutEventsOutput{Entries: make([]ebtypes.PutEventsResultEntry, len(in.Entries))}
	for i := range in.Entries {
		out.Entries[i] = ebtypes.PutEventsResultEntry{EventId: aws.String(strconv.Itoa(i))}
	}
	return out, nil
}

func (s kinesisStub) PutRecords(ctx context.Context, in *kinesis.PutRecordsInput, _ ...func(*kinesis.Options)) (*kinesis.PutRecordsOutput, error) {
	if err := s.wait(ctx, len(in.Records)); err != nil {
		return nil, err
	}
	out := &kinesis.PutRecordsOutput{Records: make([]ktypes.PutRecordsResultEntry, len(in.Records)), FailedRecordCount: aws.Int32(0)}
	for i := range in.Records {
		out.Records[i] = ktypes.PutRecordsResultEntry{SequenceNumber: aws.String(strconv.Itoa(i)), ShardId: aws.String("shardId-000000000000")}
	}
	return out, nil
}

func (s kafkaStub) ProduceSync(ctx context.Context, rs ...*kgo.Record) kgo.ProduceResults {
	err := s.wait(ctx, len(rs))
	out := make(kgo.ProduceResults, len(rs))
	for i, r := range rs {
		out[i] = kgo.ProduceResult{Record: r, Err: err}
	}
	return out
}

// destinationKinds are the contenders: a kind, its call, its publisher over a stub, and the
// destination the suite's topic is routed to.
func destinationKinds(calls *delayedCalls) []struct {
	kind, call, dest string
	pub              outbox.Publisher
} {
	return []struct {
		kind, call, dest string
		pub              outbox.Publisher
	}{
		{string(outbox.SNS), "PublishBatch", "arn:aws:sns:us-east-1:000000000000:orders", outbox.NewSNSPublisher(snsStub{calls})},
		{string(outbox.EventBridge), "PutEvents", "arn:aws:events:us-east-1:000000000000:event-bus/orders", outbox.NewEventBridgePublisher(eventBridgeStub{calls}, "")},
		{string(outbox.Kinesis), "PutRecords", "arn:aws:kinesis:us-east-1:000000000000:stream/orders", outbox.NewKinesisPublisher(kinesisStub{calls})},
		{string(outbox.Kafka), "ProduceSync", "kafka://orders", outbox.NewKafkaPublisher(kafkaStub{calls}, 0)},
	}
}

func runDestinationsSuite(ctx context.Context, log *slog.Logger, env *Env, sz Sizes, rep *Report) error {
	pool, _, err := env.NewDatabase(ctx, "destinations", 16, nil)
	if err != nil {
		return err
	}
	defer pool.Close()
	n, keys := sz.RelayRows, sz.RelayKeys
	res := &DestinationsResult{Delay: destinationsDelay, Rows: n, Keys: keys, Repeats: sz.RelayRepeats}
	best := map[string]*DestinationRun{}
	var order []string
	for repeat := range sz.RelayRepeats {
		calls := &delayedCalls{delay: destinationsDelay}
		for _, conc := range destinationsConcurrency {
			for _, k := range destinationKinds(calls) {
				if err := seedOutbox(ctx, pool, n, keys, 0); err != nil {
					return err
				}
				calls.calls.Store(0)
				calls.entries.Store(0)
				calls.cancelled.Store(0)
				elapsed, err := runDestination(ctx, pool, n, conc, k.pub, k.dest, calls, sz.RelayTimeout)
				if err != nil {
					return fmt.Errorf("%s, publish concurrency %d: %w", k.kind, conc, err)
				}
				run := DestinationRun{Kind: k.kind, Call: k.call, Concurrency: conc, MaxEntries: k.pub.(outbox.LimitedPublisher).Limits(k.dest).MaxEntries,
					Events: n, Elapsed: elapsed, Calls: calls.calls.Load(), Duplicates: calls.entries.Load() - int64(n)}
				log.Info("destination run", "kind", run.Kind, "concurrency", conc, "repeat", repeat+1, "events", n, "elapsed", elapsed.Round(time.Millisecond),
					"events/s", int(run.Rate()), "calls", run.Calls, "duplicates", run.Duplicates, "cancelled calls", calls.cancelled.Load())
				key := fmt.Sprintf("%s/%d", k.kind, conc)
				b := best[key]
				if b == nil {
					b = &DestinationRun{}
					best[key] = b
					order = append(order, key)
				}
				rates := append(b.Rates, run.Rate())
				if b.Elapsed == 0 || run.Elapsed < b.Elapsed {
					*b = run
				}
				b.Rates = rates
			}
		}
	}
	for _, k := range order {
		res.Runs = append(res.Runs, *best[k])
	}
	rep.Destinations = res
	return nil
}

// runDestination runs one relay (defaults but PublishConcurrency) publishing the seeded rows to dest through pub and
// returns the time until the stub acknowledged every row and the database marked them all
// published.
func runDestination(ctx context.Context, pool *pgxpool.Pool, n, concurrency int, pub outbox.Publisher, dest string, calls *delayedCalls, timeout time.Duration) (time.Duration, error) {
	r, err := outbox.NewRelay(pool, outbox.RelayConfig{Publisher: pub, PublishConcurrency: concurrency, Topics: map[string]string{"orders": dest}})
	if err != nil {
		return 0, err
	}
	return drainWith(ctx, pool, []*outbox.Relay{r}, n, calls.entries.Load, timeout)
}

// destinationsMarkdown renders the suite's section.
func (r *Report) destinationsMarkdown(w func(string, ...any)) {
	d := r.Destinations
	if d == nil {
		return
	}
	w("## 11. Relay throughput per destination (issue 15)\n\n")
	w("One sluice relay drains %d rows over %d keys to each destination kind through sluice's own publisher for it, "+
		"over a stub of the one SDK call that publisher makes, answering every call after %s and acknowledging every entry: "+
		"the same simulated latency for all, so the rows compare the relay's own work per kind (building each kind's messages, "+
		"and how many entries one call takes), at the default publish concurrency and at 4 calls in flight. Best of %d "+
		"interleaved runs each. Not a measurement of the brokers: their own limits (SNS and EventBridge request rates, a "+
		"Kinesis shard's 1,000 records/s, a Kafka partition's bandwidth) come on top, see "+
		"[docs/destinations.md](docs/destinations.md).\n\n", d.Rows, d.Keys, d.Delay, d.Repeats)
	w("| destination | call | publish concurrency | entries per call (max) | events/s | calls | entries per call (mean) | vs. SNS | duplicates | every run (events/s) |\n|---|---|---|---|---|---|---|---|---|---|\n")
	sns := map[int]float64{}
	for _, run := range d.Runs {
		if run.Kind == string(outbox.SNS) {
			sns[run.Concurrency] = run.Rate()
		}
	}
	for _, run := range d.Runs {
		mean := 0.0
		if run.Calls > 0 {
			mean = float64(run.Events) / float64(run.Calls)
		}
		vs := "—"
		if b := sns[run.Concurrency]; b > 0 && run.Kind != string(outbox.SNS) {
			vs = fmt.Sprintf("%.2f×", run.Rate()/b)
		}
		rates := ""
		for i, x := range run.Rates {
			if i > 0 {
				rates += ", "
			}
			rates += fmt.Sprintf("%.0f", x)
		}
		w("| %s | %s | %d | %d | %.0f | %d | %.1f | %s | %d | %s |\n", run.Kind, run.Call, run.Concurrency, run.MaxEntries, run.Rate(), run.Calls, mean, vs, run.Duplicates, rates)
	}
	w("\n")
}
