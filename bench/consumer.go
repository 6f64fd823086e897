package main

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/sluicehq/sluice/pkg/inbox"
)

// ConsumerResult is one consumer run.
type ConsumerResult struct {
	Mode       string
	BatchSize  int
	Workers    int
	Deliveries int
	Duplicates int
	Elapsed    time.Duration
	// Redelivered counts records that failed and were processed again (as SQS would redeliver
	// them); FirstFailure is the first such failure.
	Redelivered  int
	FirstFailure string
	// Durable says the run was on the durable server (commits wait for their WAL flush).
	Durable bool
}

// maxRedeliveries bounds how often a failed record is processed again before the run fails.
const maxRedeliveries = 5

// Rate is deliveries handled per second.
func (r ConsumerResult) Rate() float64 { return float64(r.Deliveries) / r.Elapsed.Seconds() }

// consumerWorkers is the number of batches processed at once, as concurrent Lambda invocations
// would (the SQS event source starts with five pollers).
const consumerWorkers = 4

// consumerDupEvery: every tenth delivery is a redelivery of an earlier message (10% duplicates).
const consumerDupEvery = 10

// runConsumerSuite measures inbox.Consumer.Process on SQS batches with 10% duplicate
// deliveries, in the per-record and batched commit modes, side by side, for batch sizes 10 (the
// SQS event source's default) and 100. The handler inserts one row (the effect) in the inbox's
// transaction. It runs on the fast-commit server, then on the durable one (commits wait for
// their WAL flush, as in production), which is where batching commits can pay off.
func runConsumerSuite(ctx context.Context, log *slog.Logger, env *Env, sz Sizes, rep *Report) error {
	if err := measureConsumer(ctx, log, env, sz, rep); err != nil {
		return err
	}
	denv, err := env.DurableEnv(ctx)
	if err != nil {
		return err
	}
	if err := measureConsumer(ctx, log, denv, sz, rep); err != nil {
		return fmt.Errorf("durable: %w", err)
	}
	return nil
}

func measureConsumer(ctx context.Context, log *slog.Logger, env *Env, sz Sizes, rep *Report) error {
	pool, _, err := env.NewDatabase(ctx, "consumer", consumerWorkers+2, nil)
	if err != nil {
		return err
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE bench_applied (
		message_id text PRIMARY KEY, order_id text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return err
	}
	router := inbox.NewRouter(inbox.FailUnknown)
	router.Handle("OrderCreated", func(ctx context.Context, tx pgx.Tx, msg inbox.Message) error {
		_, err := tx.Exec(ctx, "INSERT INTO bench_applied (message_id, order_id) VALUES ($1, $2)", msg.ID, msg.AggregateID)
		return err
	})
	for _, batchSize := range []int{10, 100} {
		for _, mode := range []inbox.Mode{inbox.PerRecord, inbox.Batched} {
			if _, err := pool.Exec(ctx, "TRUNCATE inbox_event, bench_applied"); err != nil {
				return err
			}
			if _, err := pool.Exec(ctx, "VACUUM ANALYZE inbox_event"); err != nil {
				return err
			}
			c, err := inbox.NewConsumer(pool, inbox.ConsumerConfig{Consumer: "bench", Router: router, Mode: mode})
			if err != nil {
				return err
			}
			batches, unique := consumerBatches(sz.ConsumerDeliveries, batchSize)
			res, err := runConsumer(ctx, c, batches)
			if err != nil {
				return fmt.Errorf("%s, batch %d: %w", mode, batchSize, err)
			}
			var applied int
			if err := pool.QueryRow(ctx, "SELECT count(*) FROM bench_applied").Scan(&applied); err != nil {
				return err
			}
			if applied != unique {
				return fmt.Errorf("%s, batch %d: %d effects applied for %d unique messages", mode, batchSize, applied, unique)
			}
			res.Mode, res.BatchSize, res.Durable = mode.String(), batchSize, env.Durable
			log.Info("consumer run", "durable", env.Durable, "mode", res.Mode, "batch", batchSize, "deliveries", res.Deliveries, "dups", res.Duplicates,
				"elapsed", res.Elapsed.Round(time.Millisecond), "msg/s", int(res.Rate()))
			rep.Consumer = append(rep.Consumer, res)
		}
	}
	return nil
}

// consumerBatches builds SQS batches of raw-delivery records (the contract's attributes) in
// which every tenth delivery repeats a message delivered at least 2×consumerWorkers batches
// earlier (a redelivery, usually of a message whose first delivery has completed).
// It returns the batches and the number of unique messages.
func consumerBatches(deliveries, batchSize int) ([]events.SQSEvent, int) {
	rng := rand.New(rand.NewPCG(1, 2))
	var (
		ids     []string
		batches []events.SQSEvent
		cur     events.SQSEvent
	)
	for i := range deliveries {
		var id string
		oldEnough := len(ids) - 2*consumerWorkers*batchSize
		if i%consumerDupEvery == consumerDupEvery-1 && oldEnough > 0 {
			id = ids[rng.IntN(oldEnough)]
		} else {
			id = uuid.Must(uuid.NewV7()).String()
			ids = append(ids, id)
		}
		order := "o-" + strconv.Itoa(len(ids))
		str := func(v string) events.SQSMessageAttribute {
			return events.SQSMessageAttribute{DataType: "String", StringValue: &v}
		}
		cur.Records = append(cur.Records, events.SQSMessage{
			MessageId:  uuid.NewString(),
			Body:       `{"orderId":"` + order + `","customerId":"c-42","totalCents":1299,"currency":"EUR","schemaVersion":1}`,
			Attributes: map[string]string{"ApproximateReceiveCount": "1"},
			MessageAttributes: map[string]events.SQSMessageAttribute{
				"messageId": str(id), "eventType": str("OrderCreated"), "aggregateType": str("order"),
				"aggregateId": str(order), "createdAt": str(time.Now().UTC().Format(time.RFC3339Nano)),
			},
			EventSource: "aws:sqs", EventSourceARN: "arn:aws:sqs:us-east-1:000000000000:bench", AWSRegion: "us-east-1",
		})
		if len(cur.Records) == batchSize {
			batches = append(batches, cur)
			cur = events.SQSEvent{}
		}
	}
	if len(cur.Records) > 0 {
		batches = append(batches, cur)
	}
	return batches, len(ids)
}

// runConsumer feeds the batches, in order, to consumerWorkers concurrent Process calls and
// fails if any record failed.
func runConsumer(ctx context.Context, c *inbox.Consumer, batches []events.SQSEvent) (ConsumerResult, error) {
	work := make(chan events.SQSEvent)
	var (
		wg               sync.WaitGroup
		mu               sync.Mutex
		deliveries, dups int
		failed, retried  int
		firstErr         error
		firstFailure     error
	)
	start := time.Now()
	for range consumerWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for b := range work {
				deliveredHere := len(b.Records)
				// Failed records come back, as SQS would redeliver them, up to maxRedeliveries times.
				for attempt := 0; len(b.Records) > 0; attempt++ {
					r := c.Process(ctx, b)
					var again events.SQSEvent
					for i, res := range r.Results {
						if res.Outcome == inbox.Failed {
							again.Records = append(again.Records, b.Records[i])
						}
					}
					mu.Lock()
					dups += r.Count(inbox.Duplicate)
					if attempt > 0 {
						retried += len(b.Records)
					}
					if len(again.Records) > 0 && attempt == maxRedeliveries {
						failed += len(again.Records)
						for _, res := range r.Results {
							if res.Err != nil && firstErr == nil {
								firstErr = res.Err
							}
						}
						again.Records = nil
					}
					if len(again.Records) > 0 && firstFailure == nil {
						for _, res := range r.Results {
							if res.Err != nil {
								firstFailure = res.Err
								break
							}
						}
					}
					mu.Unlock()
					b = again
				}
				mu.Lock()
				deliveries += deliveredHere
				mu.Unlock()
			}
		}()
	}
	for _, b := range batches {
		work <- b
	}
	close(work)
	wg.Wait()
	elapsed := time.Since(start)
	if failed > 0 {
		return ConsumerResult{}, fmt.Errorf("%d records failed, first: %w", failed, firstErr)
	}
	res := ConsumerResult{Workers: consumerWorkers, Deliveries: deliveries, Duplicates: dups, Elapsed: elapsed, Redelivered: retried}
	if firstFailure != nil {
		res.FirstFailure = firstFailure.Error()
	}
	return res, nil
}
