package main

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// ProducersResult is the concurrent-producer suite's outcome (issue 11, sections 1 and 2): the
// business transaction of section 2's producer suite, alone and with each way of adding its
// outbox row, from 1, 4 and 16 concurrent clients on the durable server.
type ProducersResult struct {
	// Clients are the client counts, ascending.
	Clients []int
	// Rounds of Block-long runs of every variant at every client count.
	Rounds int
	Block  time.Duration
	// Runs holds one entry per variant and client count.
	Runs []ProducersRun
	// Durable says the server's commits wait for their WAL flush.
	Durable bool
	// Server is the settings that decide what a commit costs, as the suite's connections saw
	// them (fsync, synchronous_commit, ...).
	Server string `json:",omitempty"`
}

// ProducersRun is one variant at one client count, over all its blocks.
type ProducersRun struct {
	Variant string
	Clients int
	// Tx transactions committed in Elapsed, the sum of the blocks' durations.
	Tx      int
	Elapsed time.Duration
	// Latency of every transaction, BEGIN to COMMIT's return.
	Latency Latencies
	// BlockRates is each block's tx/s, in the order run.
	BlockRates []float64
	// CPU is where the blocks' CPU time went (seconds, summed over the blocks; zero in older
	// results): Harness is this process (the clients: outbox.Write's validation and pgx),
	// Backends the PostgreSQL backends of the suite's database, Postgres the server's other
	// processes (WAL writer, checkpointer, ...), Others what the machine spent on everything
	// else meanwhile (other users' work).
	CPU BlockCPU `json:",omitempty"`
}

// BlockCPU is CPU time by owner over some blocks, in seconds.
type BlockCPU struct {
	Harness, Backends, Postgres, Others float64
}

// perTx returns s seconds over n transactions, in microseconds.
func perTx(s float64, n int) float64 {
	if n == 0 {
		return 0
	}
	return s * 1e6 / float64(n)
}

// processCPU returns this process's CPU time so far (user and system), with getrusage's
// microsecond resolution.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// concurrentCPULabels group the concurrent-producer blocks' CPU time.
var concurrentCPULabels = cpuLabels{Self: "harness", Backends: "backends"}

// addCPU adds to c what a and b, snapshots taken around a block, say went to each owner.
func (c *BlockCPU) addCPU(a, b cpuSnapshot) {
	groups, _, others := cpuBetween(a, b)
	secs := b.at.Sub(a.at).Seconds()
	for _, g := range groups {
		switch g.Group {
		case concurrentCPULabels.Self:
			// Measured by the caller with getrusage, without the snapshots' own work.
		case concurrentCPULabels.Backends:
			c.Backends += g.Cores * secs
		default:
			if strings.HasPrefix(g.Group, "PostgreSQL") {
				c.Postgres += g.Cores * secs
			}
		}
	}
	c.Others += others * secs
}

// Rate is transactions per second over every block.
func (r ProducersRun) Rate() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Tx) / r.Elapsed.Seconds()
}

// The concurrent-producer variants, in the report's order.
const (
	varOrder   = "order only"
	varMinimal = "order + minimal row"
	varWrite   = "order + outbox.Write"
	varQueue   = "order + outbox.Queue"
	// varNotify is the minimal row with migration 0001's trigger back on outbox_event: one
	// pg_notify per inserting statement, so every producer's commit queues a notification.
	varNotify = "order + minimal row + NOTIFY trigger"
	// varNotifyIdle is the minimal row with a trigger that notifies only when no older row is
	// pending, the alternative issue 11 names. No relay runs here, so older rows are always
	// pending: it measures the check alone, never a notification (its best case; its worst
	// case, a relay that keeps the table empty, is varNotify plus the check).
	varNotifyIdle = "order + minimal row + NOTIFY only when none pending"
)

// producersVariant is one concurrent-producer variant: an orderTx variant, with setup run
// before each of its blocks and teardown after (the trigger variants create their trigger on
// outbox_event for the block and drop it after, so that no other variant's block has it).
type producersVariant struct {
	name            string
	tx              int
	setup, teardown string
}

// producersVariants are the variants in the report's order.
var producersVariants = []producersVariant{{name: varOrder, tx: 0}, {name: varMinimal, tx: 3}, {name: varWrite, tx: 1}, {name: varQueue, tx: 5},
	{name: varNotify, tx: 3,
		setup:    "CREATE TRIGGER bench_outbox_notify AFTER INSERT ON outbox_event FOR EACH STATEMENT EXECUTE FUNCTION bench_outbox_notify()",
		teardown: "DROP TRIGGER bench_outbox_notify ON outbox_event"},
	{name: varNotifyIdle, tx: 3,
		setup: "CREATE TRIGGER bench_outbox_notify_if_idle AFTER INSERT ON outbox_event REFERENCING NEW TABLE AS new_rows " +
			"FOR EACH STATEMENT EXECUTE FUNCTION bench_outbox_notify_if_idle()",
		teardown: "DROP TRIGGER bench_outbox_notify_if_idle ON outbox_event"},
}

// createNotifyFunctions creates the trigger functions of the NOTIFY variants: migration 0001's
// outbox_event_notify() (dropped by migration 0003), and one that notifies only when no row
// older than the statement's is pending.
const createNotifyFunctions = `
CREATE OR REPLACE FUNCTION bench_outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('sluice_outbox', '');
    RETURN NULL;
END;
$$;
CREATE OR REPLACE FUNCTION bench_outbox_notify_if_idle() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM outbox_event o
                   WHERE o.published_at IS NULL AND o.id < (SELECT min(n.id) FROM new_rows n)) THEN
        PERFORM pg_notify('sluice_outbox', '');
    END IF;
    RETURN NULL;
END;
$$;`

func (p *ProducersResult) run(variant string, clients int) (ProducersRun, bool) {
	for _, r := range p.Runs {
		if r.Variant == variant && r.Clients == clients {
			return r, true
		}
	}
	return ProducersRun{}, false
}

// addedCostRatio is issue 11's overhead ratio: what x adds to the business transaction over
// what the minimal hand-written row adds, (x − base) / (minimal − base). ok is false when the
// minimal row added nothing measurable (the ratio would be meaningless).
func addedCostRatio(x, minimal, base time.Duration) (ratio float64, ok bool) {
	if minimal <= base {
		return 0, false
	}
	return float64(x-base) / float64(minimal-base), true
}

// runProducersSuite measures concurrent producers on the durable server: for each round, each
// client count and each variant (rotated by round, so that none always runs first or last), a
// block of Block during which that many clients run that variant's transaction back to back.
func runProducersSuite(ctx context.Context, log *slog.Logger, env *Env, sz Sizes, rep *Report) error {
	denv, err := env.DurableEnv(ctx)
	if err != nil {
		return err
	}
	res, err := measureConcurrent(ctx, log, denv, "producers", sz.ProducersClients, producersVariants, sz.ProducersRounds, sz.ProducersBlock)
	if err != nil {
		return err
	}
	rep.Producers = res
	return nil
}

// measureConcurrent runs variants from each of clients (ascending) concurrent clients on a
// fresh database of env named db: for each round, each client count and each variant (rotated
// by round, so that none always runs first or last), a block of block during which that many
// clients run that variant's transaction back to back, after a warm-up of every variant on
// every connection.
func measureConcurrent(ctx context.Context, log *slog.Logger, env *Env, db string, clients []int, variants []producersVariant,
	rounds int, blockLen time.Duration) (*ProducersResult, error) {
	maxClients := clients[len(clients)-1]
	pool, _, err := env.NewDatabase(ctx, db, int32(maxClients), nil)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, createOrders); err != nil {
		return nil, err
	}
	if _, err := pool.Exec(ctx, createNotifyFunctions); err != nil {
		return nil, err
	}
	res := &ProducersResult{Clients: clients, Rounds: rounds, Block: blockLen, Durable: env.Durable}
	if res.Server, err = commitSettings(ctx, pool); err != nil {
		return nil, err
	}

	type runKey struct {
		variant string
		clients int
	}
	samples := map[runKey][]time.Duration{}
	runs := map[runKey]*ProducersRun{}
	seq := 0
	// block runs n clients of variant v for d and returns their latencies and the block's length.
	block := func(v producersVariant, n int, d time.Duration) (lat []time.Duration, took time.Duration, err error) {
		if v.setup != "" {
			if _, err := pool.Exec(ctx, v.setup); err != nil {
				return nil, 0, fmt.Errorf("set up %s: %w", v.name, err)
			}
			defer func() {
				if _, terr := pool.Exec(context.WithoutCancel(ctx), v.teardown); terr != nil && err == nil {
					err = fmt.Errorf("tear down %s: %w", v.name, terr)
				}
			}()
		}
		lat, took, err = runBlock(ctx, pool, v.tx, n, d, seq)
		seq += 100_000_000
		return lat, took, err
	}
	// Warm-up: every variant on every connection (prepared statements, caches).
	for _, v := range variants {
		if _, _, err := block(v, maxClients, blockLen/2); err != nil {
			return nil, err
		}
	}
	for round := range rounds {
		for _, n := range clients {
			for k := range variants {
				v := variants[(round+k)%len(variants)]
				before := takeCPUSnapshot(db, concurrentCPULabels)
				selfBefore := processCPU()
				lat, took, err := block(v, n, blockLen)
				selfAfter := processCPU()
				after := takeCPUSnapshot(db, concurrentCPULabels)
				if err != nil {
					return nil, fmt.Errorf("%s, %d clients: %w", v.name, n, err)
				}
				key := runKey{v.name, n}
				r := runs[key]
				if r == nil {
					r = &ProducersRun{Variant: v.name, Clients: n}
					runs[key] = r
				}
				r.Tx += len(lat)
				r.Elapsed += took
				r.BlockRates = append(r.BlockRates, float64(len(lat))/took.Seconds())
				r.CPU.addCPU(before, after)
				r.CPU.Harness += (selfAfter - selfBefore).Seconds()
				samples[key] = append(samples[key], lat...)
			}
		}
	}
	for _, n := range clients {
		for _, v := range variants {
			key := runKey{v.name, n}
			r := runs[key]
			r.Latency = summarize(samples[key])
			res.Runs = append(res.Runs, *r)
			log.Info(db, "variant", v.name, "clients", n, "tx/s", int(r.Rate()), "p50", r.Latency.P50, "p99", r.Latency.P99,
				"harness_us/tx", int(perTx(r.CPU.Harness, r.Tx)), "backends_us/tx", int(perTx(r.CPU.Backends, r.Tx)), "others_cores", r.CPU.Others/r.Elapsed.Seconds())
		}
	}
	return res, nil
}

// commitSettings reads, on one of pool's connections, the settings that decide what a commit
// costs, as "name=value, ...".
func commitSettings(ctx context.Context, pool *pgxpool.Pool) (string, error) {
	var parts []string
	for _, s := range []string{"fsync", "synchronous_commit", "full_page_writes", "wal_sync_method", "shared_buffers", "max_wal_size"} {
		var v string
		if err := pool.QueryRow(ctx, "SELECT current_setting($1)", s).Scan(&v); err != nil {
			return "", fmt.Errorf("read %s: %w", s, err)
		}
		parts = append(parts, s+"="+v)
	}
	return strings.Join(parts, ", "), nil
}

// runBlock runs n clients of orderTx variant v back to back for d, each transaction numbered
// from seq, and returns every transaction's latency and the block's length.
func runBlock(ctx context.Context, pool *pgxpool.Pool, v, n int, d time.Duration, seq int) ([]time.Duration, time.Duration, error) {
	var (
		mu    sync.Mutex
		lat   []time.Duration
		first error
		wg    sync.WaitGroup
	)
	start := time.Now()
	end := start.Add(d)
	for c := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []time.Duration
			for i := 0; time.Now().Before(end); i++ {
				took, err := orderTx(ctx, pool, v, seq+c*1_000_000+i)
				if err != nil {
					mu.Lock()
					first = err
					mu.Unlock()
					return
				}
				mine = append(mine, took)
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return lat, time.Since(start), first
}
