package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluicehq/sluice/pkg/outbox"
)

// WakeupResult is the wake-up suite's outcome (issue 11, section 1): with no trigger in the
// producers' commits, how soon a running relay publishes what was just committed.
type WakeupResult struct {
	// Rate is the offered events/s, each event its own transaction, over Keys keys, for Duration.
	Rate     int
	Keys     int
	Duration time.Duration
	// PollInterval is the relay's (its default).
	PollInterval time.Duration
	// Produced events; Achieved is the rate the producer reached.
	Produced int
	Achieved float64
	// Latency is each event's producer Commit return to the stub's acknowledgement.
	Latency Latencies
	// Missing counts events not acknowledged within 10 s of the end.
	Missing int
	// RelayStatements is the statements and batches per second the relay sent while idle
	// (before the producer started) and while relaying.
	IdleStatements, BusyStatements float64
}

// wakeupTarget is issue 11's bound on the median commit-to-publish latency at 100 events/s.
const wakeupTarget = 100 * time.Millisecond

// runWakeupSuite runs one relay (defaults, Run) with a 0 ms stub broker while a producer commits
// Rate events/s, each in its own transaction, round-robin over a few keys.
func runWakeupSuite(ctx context.Context, log *slog.Logger, env *Env, sz Sizes, rep *Report) error {
	tracer := newRelayTracer()
	relayPool, dbURL, err := env.NewDatabase(ctx, "wakeup", 8, tracer)
	if err != nil {
		return err
	}
	defer relayPool.Close()
	pool, err := openPool(ctx, dbURL, 8)
	if err != nil {
		return err
	}
	defer pool.Close()

	res := &WakeupResult{Rate: 100, Keys: 10, Duration: sz.WakeupDuration, PollInterval: outbox.RelayConfig{}.WithDefaults().PollInterval}
	book := newWaitBook()
	r, err := outbox.NewRelay(relayPool, outbox.RelayConfig{Publisher: &ackPublisher{book: book}, Topics: map[string]string{"orders": ordersARN}})
	if err != nil {
		return err
	}
	rctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = r.Run(rctx) }()
	defer func() { stop(); wg.Wait() }()

	// The idle relay's statement rate, over 3 s once it has started.
	if err := sleepCtx(ctx, time.Second); err != nil {
		return err
	}
	tracer.reset()
	if err := sleepCtx(ctx, 3*time.Second); err != nil {
		return err
	}
	res.IdleStatements = tracer.rate()
	tracer.reset()

	ids, achieved, err := produceAtRate(ctx, pool, book, res.Rate, res.Keys, res.Duration, "w")
	if err != nil {
		return err
	}
	res.BusyStatements = tracer.rate()
	res.Produced, res.Achieved = len(ids), achieved
	for until := time.Now().Add(10 * time.Second); book.pending(ids) > 0 && time.Now().Before(until); {
		if err := sleepCtx(ctx, 10*time.Millisecond); err != nil {
			return err
		}
	}
	waits, missing := book.waits(ids)
	res.Latency, res.Missing = summarize(waits), missing
	log.Info("wakeup", "produced", res.Produced, "rate", int(res.Achieved), "p50", res.Latency.P50, "p99", res.Latency.P99, "missing", missing,
		"idle_statements/s", int(res.IdleStatements), "busy_statements/s", int(res.BusyStatements))
	rep.Wakeup = res
	return nil
}

// produceAtRate commits rate events/s for d, each in its own transaction with outbox.Write, on
// keys keys round-robin (prefix-0, prefix-1, ...), on an open-loop schedule (event i is due at
// start + i/rate; a late commit does not push the later ones back), from enough goroutines to keep
// up. It records each commit's return in book and returns the events' ids and the rate reached.
func produceAtRate(ctx context.Context, pool *pgxpool.Pool, book *waitBook, rate, keys int, d time.Duration, prefix string) ([]uuid.UUID, float64, error) {
	total := int(float64(rate) * d.Seconds())
	workers := max(1, min(8, rate/100))
	var (
		mu    sync.Mutex
		ids   = make([]uuid.UUID, 0, total)
		first error
		wg    sync.WaitGroup
	)
	start := time.Now()
	interval := time.Second / time.Duration(rate)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < total; i += workers {
				if err := sleepCtx(ctx, time.Until(start.Add(time.Duration(i)*interval))); err != nil {
					return
				}
				key := fmt.Sprintf("%s-%d", prefix, i%keys)
				tx, err := pool.Begin(ctx)
				if err == nil {
					var written []outbox.Message
					written, err = outbox.Write(ctx, tx, outbox.Message{Topic: "orders", AggregateType: "order", AggregateID: key, EventType: "OrderCreated",
						Payload: json.RawMessage(fmt.Sprintf(`{"orderId":%d,"customerId":"c-42","totalCents":1299,"currency":"EUR","schemaVersion":1}`, i))})
					if err == nil {
						err = tx.Commit(ctx)
					}
					if err == nil {
						book.commit(time.Now(), written[0].EventID)
						mu.Lock()
						ids = append(ids, written[0].EventID)
						mu.Unlock()
					}
					_ = tx.Rollback(context.WithoutCancel(ctx))
				}
				if err != nil {
					mu.Lock()
					first = err
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	if first != nil {
		return nil, 0, fmt.Errorf("produce: %w", first)
	}
	if err := ctx.Err(); err != nil {
		return nil, 0, err
	}
	return ids, float64(len(ids)) / elapsed.Seconds(), nil
}
