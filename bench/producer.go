package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluicehq/sluice/pkg/outbox"
)

// ProducerResult is the producer-side suite's outcome.
type ProducerResult struct {
	// Plain and WithOutbox are the latencies of the business transaction without and with
	// the outbox write, measured alternately (one of each per iteration) on one connection.
	Plain, WithOutbox Latencies
	// PlainInsert is the order plus a hand-written single-row INSERT INTO outbox_event ... VALUES
	// of the same row: what any outbox on this table pays, to compare outbox.Write with. (Results
	// of runs before migration 0003 also had NoNotify and NoNotifyBase, the pair with the NOTIFY
	// trigger disabled; the trigger is gone, and so are they.)
	PlainInsert Latencies
	// QueuedBase is the order alone sent as a one-statement pgx.Batch (the order id made by the
	// client), and Queued the same batch with outbox.Queue's insert in it: the outbox row travels in
	// the business statement's round trip.
	QueuedBase, Queued Latencies
	// Bulk holds the events/s of each bulk transaction (BulkEvents events via outbox.Write).
	Bulk       []float64
	BulkEvents int
	// Durable says the run was on the durable server (commits wait for their WAL flush).
	Durable bool
	// Concurrent is, on the durable server only, the order alone, with the hand-written minimal
	// row, with outbox.Write and with outbox.Queue from 1 and 16 concurrent clients, side by
	// side in one run (issue 45's figure: Write's tx/s over the minimal row's at 16 clients, and
	// what each adds to the order's p50 at 1 client). nil in older results.
	Concurrent *ProducersResult `json:",omitempty"`
}

// Latencies summarises a sample of durations.
type Latencies struct {
	N                             int
	Mean, P50, P90, P95, P99, Max time.Duration
}

func summarize(d []time.Duration) Latencies {
	if len(d) == 0 {
		return Latencies{}
	}
	s := slices.Clone(d)
	slices.Sort(s)
	var sum time.Duration
	for _, v := range s {
		sum += v
	}
	q := func(p float64) time.Duration { return s[min(len(s)-1, int(p*float64(len(s))))] }
	return Latencies{N: len(s), Mean: sum / time.Duration(len(s)), P50: q(0.50), P90: q(0.90), P95: q(0.95), P99: q(0.99), Max: s[len(s)-1]}
}

const createOrders = `CREATE TABLE IF NOT EXISTS bench_order (
	id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	customer_id text        NOT NULL,
	total_cents bigint      NOT NULL,
	currency    text        NOT NULL,
	created_at  timestamptz NOT NULL DEFAULT now()
)`

// runProducerSuite measures what the outbox adds to a producer: the business transaction
// "insert an order" (BEGIN; INSERT ... RETURNING id; COMMIT) with and without outbox.Write of
// one OrderCreated event, and bulk writes of BulkEvents events in one transaction; first on the
// fast-commit server, then on the durable one (commits wait for their WAL flush, as in production).
func runProducerSuite(ctx context.Context, log *slog.Logger, env *Env, sz Sizes, rep *Report) error {
	res, err := measureProducer(ctx, log, env, sz)
	if err != nil {
		return err
	}
	rep.Producer = res
	denv, err := env.DurableEnv(ctx)
	if err != nil {
		return err
	}
	if rep.ProducerDurable, err = measureProducer(ctx, log, denv, sz); err != nil {
		return fmt.Errorf("durable: %w", err)
	}
	c, err := measureConcurrent(ctx, log, denv, "producer_concurrent", producerClients, producerVariants, sz.ProducerRounds, sz.ProducerBlock)
	if err != nil {
		return fmt.Errorf("durable, concurrent: %w", err)
	}
	// The figure is judged on commits that wait for their WAL flush: a server that does not
	// (DATABASE_URL naming one with fsync off) would make the commit free and the outbox's
	// share of the transaction look larger than it is anywhere in production.
	if !strings.Contains(c.Server, "fsync=on") || !strings.Contains(c.Server, "synchronous_commit=on") {
		return fmt.Errorf("durable, concurrent: the server's commits do not wait for a WAL flush (%s): the producer figure needs fsync=on and synchronous_commit=on", c.Server)
	}
	rep.ProducerDurable.Concurrent = c
	return nil
}

// producerClients and producerVariants are the producer suite's concurrent runs: outbox.Write
// at its defaults (the package-level Write, as a service calls it) beside the hand-written
// minimal row into the same table, from one client and from sixteen.
var (
	producerClients  = []int{1, 16}
	producerVariants = []producersVariant{{name: varOrder, tx: 0}, {name: varMinimal, tx: 3}, {name: varWrite, tx: 1}, {name: varQueue, tx: 5}}
)

func measureProducer(ctx context.Context, log *slog.Logger, env *Env, sz Sizes) (*ProducerResult, error) {
	pool, _, err := env.NewDatabase(ctx, "producer", 4, nil)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, createOrders); err != nil {
		return nil, err
	}
	res := &ProducerResult{BulkEvents: sz.BulkEvents, Durable: env.Durable}

	// Warm up both paths (connections, prepared statements, caches).
	for i := range 200 {
		if _, err := orderTx(ctx, pool, i%6, i); err != nil {
			return nil, err
		}
	}
	// Five variants, rotated so that none benefits systematically from its position:
	// 0 = order only, 1 = order + outbox.Write, 3 = order + a plain single-row INSERT of the outbox row,
	// 4 = order only in a pgx.Batch, 5 = the same batch with outbox.Queue.
	variants := []int{0, 1, 3, 4, 5}
	samples := map[int][]time.Duration{}
	for i := range sz.ProducerTx {
		for k := range variants {
			v := variants[(i+k)%len(variants)]
			d, err := orderTx(ctx, pool, v, i)
			if err != nil {
				return nil, err
			}
			samples[v] = append(samples[v], d)
		}
	}
	res.Plain, res.WithOutbox, res.PlainInsert = summarize(samples[0]), summarize(samples[1]), summarize(samples[3])
	res.QueuedBase, res.Queued = summarize(samples[4]), summarize(samples[5])

	log.Info("producer", "durable", env.Durable, "plain_p50", res.Plain.P50, "outbox_p50", res.WithOutbox.P50, "plain_mean", res.Plain.Mean, "outbox_mean", res.WithOutbox.Mean)

	for r := range sz.BulkRepeats {
		msgs := make([]outbox.Message, sz.BulkEvents)
		for i := range msgs {
			id := strconv.Itoa(r*sz.BulkEvents + i)
			msgs[i] = outbox.Message{Topic: "orders", AggregateType: "order", AggregateID: "o-" + id, EventType: "OrderCreated",
				Payload: json.RawMessage(`{"orderId":"o-` + id + `","customerId":"c-42","totalCents":1299,"currency":"EUR","schemaVersion":1}`)}
		}
		start := time.Now()
		tx, err := pool.Begin(ctx)
		if err != nil {
			return nil, err
		}
		if _, err := outbox.Write(ctx, tx, msgs...); err != nil {
			_ = tx.Rollback(ctx)
			return nil, fmt.Errorf("bulk write: %w", err)
		}
		if err := tx.Commit(ctx); err != nil {
			return nil, err
		}
		res.Bulk = append(res.Bulk, float64(sz.BulkEvents)/time.Since(start).Seconds())
	}
	log.Info("producer bulk", "durable", env.Durable, "events/s", res.Bulk)
	return res, nil
}

// orderTx runs one business transaction and returns its duration. variant 0 is the order alone,
// 1 adds outbox.Write, 3 adds a hand-written single-row INSERT of the same outbox row.
func orderTx(ctx context.Context, pool *pgxpool.Pool, variant int, i int) (time.Duration, error) {
	start := time.Now()
	tx, err := pool.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	var id int64
	cust := "c-" + strconv.Itoa(i%977)
	if variant >= 4 {
		// The order's id is made by the client, so the outbox row needs no answer from the
		// order's insert and both statements go in one round trip.
		oid := uuid.Must(uuid.NewV7()).String()
		b := &pgx.Batch{}
		b.Queue("INSERT INTO bench_order (customer_id, total_cents, currency) VALUES ($1, $2, 'EUR')", cust, 1299+i%100)
		if variant == 5 {
			if _, err := outbox.Queue(b, outbox.Message{Topic: "orders", AggregateType: "order", AggregateID: oid, EventType: "OrderCreated",
				Payload: json.RawMessage(`{"orderId":"` + oid + `","customerId":"` + cust + `","totalCents":1299,"currency":"EUR","schemaVersion":1}`)}); err != nil {
				return 0, err
			}
		}
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return 0, err
		}
		if err := tx.Commit(ctx); err != nil {
			return 0, err
		}
		return time.Since(start), nil
	}
	if err := tx.QueryRow(ctx, "INSERT INTO bench_order (customer_id, total_cents, currency) VALUES ($1, $2, 'EUR') RETURNING id",
		cust, 1299+i%100).Scan(&id); err != nil {
		return 0, err
	}
	oid := "o-" + strconv.FormatInt(id, 10)
	switch variant {
	case 3:
		if _, err := tx.Exec(ctx, `INSERT INTO outbox_event (event_id, topic, aggregate_type, aggregate_id, event_type, partition_key, payload)
			VALUES ($1, 'orders', 'order', $2, 'OrderCreated', $2, $3)`, uuid.Must(uuid.NewV7()), oid,
			`{"orderId":"`+oid+`","customerId":"`+cust+`","totalCents":1299,"currency":"EUR","schemaVersion":1}`); err != nil {
			return 0, err
		}
	case 1:
		_, err := outbox.Write(ctx, tx, outbox.Message{Topic: "orders", AggregateType: "order", AggregateID: oid, EventType: "OrderCreated",
			Payload: json.RawMessage(`{"orderId":"` + oid + `","customerId":"` + cust + `","totalCents":1299,"currency":"EUR","schemaVersion":1}`)})
		if err != nil {
			return 0, err
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}
