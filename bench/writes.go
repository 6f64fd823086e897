package main

// The writes-per-event suite (issue 25, item 3): what publishing an event costs the producers'
// database, for sluice's relay and for the ceiling loop (claim + mark), per published event:
// statements, rows written, WAL bytes, records and full-page images, B-tree index entries, and
// the dead tuples left for VACUUM. The producer's writes (outbox.Write of the events) are
// measured separately, so that what writing an event costs is apart from what publishing it costs.
//
// Each run gets a fresh database: the producer commits the events (one outbox.Write per
// transaction, as services write them), the table is analysed (outside the measurement), and
// one drainer publishes them all. Statistics are reset before each measured phase
// (pg_stat_reset, pg_stat_reset_shared('wal'), pg_stat_statements_reset) and read after every
// connection of the phase has ended, so that every backend has flushed its counters. Each phase
// runs under a role of its own (SET ROLE through the connection's startup parameters), so
// pg_stat_statements tells its statements from the harness's (the poll for pending rows, the
// measurement queries). The WAL of the phase is also read back with pg_walinspect
// (pg_get_wal_stats over the phase's LSN range), which gives the records by type: the B-tree
// leaf insertions among them are the index entries written.
//
// The suite runs on a throwaway cluster of its own, started with pg_stat_statements preloaded
// (a server start setting), full_page_writes on (as on RDS; the harness's main cluster turns it
// off) and autovacuum off (so that no VACUUM runs inside a phase: its WAL would be counted, and
// the dead tuples it removed would not). fsync and synchronous_commit stay off: they decide when
// WAL is flushed, not how much is written. With DATABASE_URL set it uses that server, which must
// preload pg_stat_statements; there, pg_stat_wal counts every database's WAL.
//
// Two scenarios: the drainer runs right after the producer (as a relay a second behind its
// producers does: the pages it updates were already written since the last checkpoint, so they
// need no full-page image), and with a CHECKPOINT between the producer and the drain (the first
// update of each page after a checkpoint writes the whole page to WAL: the worst case, which a
// relay that lags its producers across checkpoints pays).

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluicehq/sluice/internal/pgcluster"
	"github.com/sluicehq/sluice/pkg/outbox"
)

// writesTarget: the relay's WAL bytes per event at most this many times the ceiling loop's.
const writesTarget = 1.5

// The suite's scenarios and drainers.
const (
	writesCloseBehind = "drain right after the producer"
	writesCheckpoint  = "CHECKPOINT between the producer and the drain"

	drainerRelay   = "sluice relay"
	drainerCeiling = "ceiling: claim+mark, 1 worker"
)

// The roles the phases run as (SET ROLE), so that pg_stat_statements tells their statements apart.
const (
	roleProducer = "sluice_bench_producer"
	roleDrainer  = "sluice_bench_drainer"
)

// writesProducers is how many connections the producer commits its events from.
const writesProducers = 8

// WritesResult is the writes-per-event suite's outcome.
type WritesResult struct {
	// Events are written and published per run, over Keys partition keys.
	Events, Keys int
	// Server describes the server and the settings that decide what is written.
	Server string
	Runs   []WritesRun
}

// WritesRun is one fresh database: a producer phase, then a drain.
type WritesRun struct {
	Scenario string
	// Drainer is drainerRelay or drainerCeiling; Delay the relay's publisher stub's per call.
	Drainer string
	Delay   time.Duration
	// Producer and Drain are the two phases' writes.
	Producer, Drain WriteCost
}

// Name labels the drainer with its delay.
func (w WritesRun) Name() string {
	if w.Drainer == drainerRelay {
		return fmt.Sprintf("%s, publisher %s", w.Drainer, w.Delay)
	}
	return w.Drainer
}

// WriteCost is what one phase wrote for Events events.
type WriteCost struct {
	Events  int
	Elapsed time.Duration
	// Statements the phase's role ran (pg_stat_statements calls), without TxControl: its BEGIN,
	// COMMIT and ROLLBACK statements.
	Statements, TxControl int64
	// Commits are the commit records in the phase's WAL (transactions that wrote something).
	Commits int64
	// RowsWritten: the rows reported by the phase's INSERT, UPDATE and DELETE statements
	// (pg_stat_statements rows).
	RowsWritten int64
	// outbox_event's pg_stat_user_tables counters over the phase; Dead is n_dead_tup at its end.
	TupIns, TupUpd, TupHotUpd, TupDel, Dead int64
	// WAL over the phase (pg_stat_wal): bytes, records and full-page images.
	WALBytes, WALRecords, WALFPI int64
	// StatementWALBytes is the WAL pg_stat_statements attributes to the phase's statements.
	StatementWALBytes int64
	// IndexEntries are the B-tree leaf tuples the phase's WAL inserted (pg_walinspect's
	// Btree/INSERT_LEAF, INSERT_POST, SPLIT_L and SPLIT_R records: one new leaf tuple each).
	IndexEntries int64
	// TopStatements are the phase's statements by WAL bytes, largest first.
	TopStatements []StatementWAL
	// TopRecords are the phase's eight largest WAL record types by bytes (pg_walinspect), largest first.
	TopRecords []RecordWAL
}

// StatementWAL is one normalised statement's share of a phase.
type StatementWAL struct {
	Query                             string
	Calls, Rows, WALBytes, WALRecords int64
	WALFPI                            int64
}

// RecordWAL is one WAL record type's share of a phase: Bytes are the records' own, FPIBytes the
// full-page images they carried.
type RecordWAL struct {
	Type                   string
	Count, Bytes, FPIBytes int64
}

// Per returns v per event of the phase.
func (c WriteCost) Per(v int64) float64 {
	if c.Events == 0 {
		return 0
	}
	return float64(v) / float64(c.Events)
}

func writesSizes(sz Sizes) (events, keys int) {
	if sz.Name == "quick" {
		return 2_000, 100
	}
	return 20_000, 1_000
}

// writesClusterSettings are the settings of the suite's own cluster (see the file comment).
var writesClusterSettings = map[string]string{
	"shared_preload_libraries": "pg_stat_statements",
	"full_page_writes":         "on",
	"autovacuum":               "off",
	"checkpoint_timeout":       "1h",
	"track_counts":             "on",
}

func runWritesSuite(ctx context.Context, log *slog.Logger, env *Env, sz Sizes, rep *Report) error {
	wenv := env
	if env.cluster != nil {
		log.Info("starting a throwaway PostgreSQL cluster for the writes-per-event suite (pg_stat_statements preloaded, full_page_writes on, autovacuum off)")
		var err error
		if wenv, err = startWritesEnv(ctx, log); err != nil {
			return err
		}
		defer wenv.Close()
	}
	events, keys := writesSizes(sz)
	res, err := measureWrites(ctx, log, wenv, events, keys)
	if err != nil {
		return err
	}
	rep.Writes = res
	return nil
}

// startWritesEnv starts the suite's own throwaway cluster (writesClusterSettings).
func startWritesEnv(ctx context.Context, log *slog.Logger) (*Env, error) {
	c, err := pgcluster.Start(ctx, pgcluster.Options{Settings: writesClusterSettings})
	if err != nil {
		return nil, fmt.Errorf("start the writes-per-event cluster: %w", err)
	}
	return &Env{AdminURL: c.URL, Source: "a throwaway cluster of its own (internal/pgcluster with pg_stat_statements preloaded)", cluster: c, log: log}, nil
}

// measureWrites runs every scenario and drainer with events events over keys keys, on env's
// server (which must preload pg_stat_statements).
func measureWrites(ctx context.Context, log *slog.Logger, env *Env, events, keys int) (*WritesResult, error) {
	res := &WritesResult{Events: events, Keys: keys}
	for _, scenario := range []string{writesCloseBehind, writesCheckpoint} {
		for _, d := range []struct {
			drainer string
			delay   time.Duration
		}{{drainerRelay, 0}, {drainerRelay, 10 * time.Millisecond}, {drainerCeiling, 0}} {
			run, server, err := writesRun(ctx, env, scenario, d.drainer, d.delay, events, keys)
			if err != nil {
				return nil, fmt.Errorf("%s, %s: %w", scenario, d.drainer, err)
			}
			res.Server = server
			res.Runs = append(res.Runs, run)
			log.Info("writes run", "scenario", scenario, "drainer", run.Name(),
				"producer WAL B/event", int(run.Producer.Per(run.Producer.WALBytes)), "drain WAL B/event", int(run.Drain.Per(run.Drain.WALBytes)),
				"drain statements/event", fmt.Sprintf("%.3f", run.Drain.Per(run.Drain.Statements)), "dead", run.Drain.Dead)
		}
	}
	return res, nil
}

// writesRun measures one fresh database: the producer's phase, then the drainer's.
func writesRun(ctx context.Context, env *Env, scenario, drainer string, delay time.Duration, events, keys int) (WritesRun, string, error) {
	run := WritesRun{Scenario: scenario, Drainer: drainer, Delay: delay}
	pool, dbURL, err := env.NewDatabase(ctx, "writes", 4, nil)
	if err != nil {
		return run, "", err
	}
	defer pool.Close()
	m, err := newWriteMeter(ctx, pool)
	if err != nil {
		return run, "", err
	}
	server := m.server

	// The producer's phase.
	if _, err := pool.Exec(ctx, "CHECKPOINT"); err != nil {
		return run, "", err
	}
	prod, err := openRolePool(ctx, dbURL, roleProducer, writesProducers)
	if err != nil {
		return run, "", err
	}
	run.Producer, err = m.measure(ctx, roleProducer, events, func() error {
		defer prod.Close()
		return produceEvents(ctx, prod, events, keys)
	})
	if err != nil {
		return run, "", fmt.Errorf("producer: %w", err)
	}

	// Between the phases, not measured: statistics for the planner, and in the second scenario
	// a checkpoint.
	if _, err := pool.Exec(ctx, "ANALYZE outbox_event"); err != nil {
		return run, "", err
	}
	if scenario == writesCheckpoint {
		if _, err := pool.Exec(ctx, "CHECKPOINT"); err != nil {
			return run, "", err
		}
	}

	drain, err := openRolePool(ctx, dbURL, roleDrainer, 16)
	if err != nil {
		return run, "", err
	}
	run.Drain, err = m.measure(ctx, roleDrainer, events, func() error {
		defer drain.Close()
		if drainer == drainerCeiling {
			_, err := runCeiling(ctx, drain, events, 1, 4*time.Minute)
			return err
		}
		// The relay suite's relay: defaults, the stub publisher.
		pub := &stubPublisher{Delay: delay}
		r, err := outbox.NewRelay(drain, outbox.RelayConfig{Publisher: pub, Topics: map[string]string{"orders": "arn:aws:sns:us-east-1:000000000000:orders"}})
		if err != nil {
			return err
		}
		// The poll for pending rows runs on the harness's pool, as the harness's role.
		_, err = drainWith(ctx, pool, []*outbox.Relay{r}, events, pub.events.Load, 4*time.Minute)
		return err
	})
	if err != nil {
		return run, "", fmt.Errorf("drain: %w", err)
	}
	if left, err := pendingCount(ctx, pool); err != nil || left != 0 {
		return run, "", fmt.Errorf("%d rows left pending after the drain (%v)", left, err)
	}
	return run, server, nil
}

// openRolePool opens a pool on dbURL whose sessions run as role (SET ROLE at connection start)
// with the role's name as their application_name.
func openRolePool(ctx context.Context, dbURL, role string, maxConns int32) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = maxConns
	cfg.ConnConfig.RuntimeParams["role"] = role
	cfg.ConnConfig.RuntimeParams["application_name"] = role
	return pgxpool.NewWithConfig(ctx, cfg)
}

// produceEvents commits n events, one outbox.Write per transaction, from writesProducers
// connections; event i belongs to key i mod keys, with the relay suite's payload.
func produceEvents(ctx context.Context, pool *pgxpool.Pool, n, keys int) error {
	var (
		next  atomic.Int64
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	for range writesProducers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1)
				if i > int64(n) {
					return
				}
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					_, err := outbox.Write(ctx, tx, outbox.Message{
						Topic: "orders", AggregateType: "order", AggregateID: fmt.Sprintf("o-%d", i%int64(keys)),
						EventType: "OrderCreated", PartitionKey: fmt.Sprintf("k-%d", i%int64(keys)),
						Payload: json.RawMessage(fmt.Sprintf(`{"orderId": %d, "customerId": "c-%d", "totalCents": 1299, "currency": "EUR", "schemaVersion": 1}`, i, i%977)),
					})
					return err
				})
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
	return first
}

// writeMeter reads a database's write statistics on its own connection (the harness's role).
type writeMeter struct {
	pool   *pgxpool.Pool
	server string
}

// newWriteMeter installs pg_stat_statements and pg_walinspect in the pool's database, creates
// the phases' roles, and checks that pg_stat_statements is loaded.
func newWriteMeter(ctx context.Context, pool *pgxpool.Pool) (*writeMeter, error) {
	for _, q := range []string{
		"CREATE EXTENSION IF NOT EXISTS pg_stat_statements",
		"CREATE EXTENSION IF NOT EXISTS pg_walinspect",
		// Superuser roles: the phases do what the harness's superuser may; SET ROLE needs no login.
		`DO $$ BEGIN
			IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '` + roleProducer + `') THEN CREATE ROLE ` + roleProducer + ` SUPERUSER NOLOGIN; END IF;
			IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '` + roleDrainer + `') THEN CREATE ROLE ` + roleDrainer + ` SUPERUSER NOLOGIN; END IF;
		END $$`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			return nil, fmt.Errorf("%s: %w", strings.Fields(q)[0]+" "+strings.Fields(q)[1], err)
		}
	}
	if _, err := pool.Exec(ctx, "SELECT 1 FROM pg_stat_statements LIMIT 1"); err != nil {
		return nil, fmt.Errorf("pg_stat_statements is not loaded (the server needs shared_preload_libraries=pg_stat_statements): %w", err)
	}
	var parts []string
	for _, s := range []string{"full_page_writes", "wal_level", "autovacuum", "fsync", "synchronous_commit", "shared_preload_libraries"} {
		var v string
		if err := pool.QueryRow(ctx, "SELECT current_setting($1)", s).Scan(&v); err != nil {
			return nil, err
		}
		parts = append(parts, s+"="+v)
	}
	var version string
	if err := pool.QueryRow(ctx, "SELECT current_setting('server_version')").Scan(&version); err != nil {
		return nil, err
	}
	return &writeMeter{pool: pool, server: "PostgreSQL " + version + ", " + strings.Join(parts, ", ")}, nil
}

// measure resets the statistics, runs phase (which must close its connections before it
// returns), waits until role's sessions have ended (and so flushed their statistics), and reads
// what the phase wrote.
func (m *writeMeter) measure(ctx context.Context, role string, events int, phase func() error) (WriteCost, error) {
	c := WriteCost{Events: events}
	for _, q := range []string{"SELECT pg_stat_reset()", "SELECT pg_stat_reset_shared('wal')", "SELECT pg_stat_statements_reset()"} {
		if _, err := m.pool.Exec(ctx, q); err != nil {
			return c, fmt.Errorf("%s: %w", q, err)
		}
	}
	var startLSN string
	if err := m.pool.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&startLSN); err != nil {
		return c, err
	}
	t0 := time.Now()
	if err := phase(); err != nil {
		return c, err
	}
	c.Elapsed = time.Since(t0)
	// Every backend reports its statistics when it ends; wait for the phase's to end.
	for deadline := time.Now().Add(30 * time.Second); ; {
		var n int
		if err := m.pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", role).Scan(&n); err != nil {
			return c, err
		}
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			return c, fmt.Errorf("%d sessions of %s still open", n, role)
		}
		if err := sleepCtx(ctx, 20*time.Millisecond); err != nil {
			return c, err
		}
	}
	// The harness's own sessions (the pending poll) report theirs at their next transaction
	// end after a second at the most; a forced flush covers the measuring session.
	if _, err := m.pool.Exec(ctx, "SELECT pg_stat_force_next_flush()"); err != nil {
		return c, err
	}
	var endLSN string
	if err := m.pool.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&endLSN); err != nil {
		return c, err
	}

	if err := m.pool.QueryRow(ctx, "SELECT wal_records, wal_fpi, wal_bytes::bigint FROM pg_stat_wal").Scan(&c.WALRecords, &c.WALFPI, &c.WALBytes); err != nil {
		return c, fmt.Errorf("pg_stat_wal: %w", err)
	}
	if err := m.pool.QueryRow(ctx, `SELECT n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del, n_dead_tup
		FROM pg_stat_user_tables WHERE relname = 'outbox_event'`).Scan(&c.TupIns, &c.TupUpd, &c.TupHotUpd, &c.TupDel, &c.Dead); err != nil {
		return c, fmt.Errorf("pg_stat_user_tables: %w", err)
	}

	rows, err := m.pool.Query(ctx, `SELECT s.query, s.calls, s.rows, s.wal_records, s.wal_fpi, s.wal_bytes::bigint
		FROM pg_stat_statements s JOIN pg_roles r ON r.oid = s.userid
		WHERE r.rolname = $1 AND s.dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
		ORDER BY s.wal_bytes DESC, s.calls DESC`, role)
	if err != nil {
		return c, fmt.Errorf("pg_stat_statements: %w", err)
	}
	var stmts []StatementWAL
	for rows.Next() {
		var s StatementWAL
		if err := rows.Scan(&s.Query, &s.Calls, &s.Rows, &s.WALRecords, &s.WALFPI, &s.WALBytes); err != nil {
			return c, err
		}
		stmts = append(stmts, s)
	}
	if err := rows.Err(); err != nil {
		return c, err
	}
	for _, s := range stmts {
		c.StatementWALBytes += s.WALBytes
		switch statementClass(s.Query) {
		case "tx":
			c.TxControl += s.Calls
			continue
		case "write":
			c.RowsWritten += s.Rows
		}
		c.Statements += s.Calls
		if len(c.TopStatements) < 4 {
			s.Query = shortQuery(s.Query)
			c.TopStatements = append(c.TopStatements, s)
		}
	}

	// pg_walinspect reads only flushed WAL: a transaction with a synchronous commit flushes
	// everything before its commit record (which comes after endLSN).
	if err := pgx.BeginFunc(ctx, m.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET LOCAL synchronous_commit = on"); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "SELECT txid_current()")
		return err
	}); err != nil {
		return c, fmt.Errorf("flush the WAL: %w", err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; {
		var flushed bool
		if err := m.pool.QueryRow(ctx, "SELECT pg_current_wal_flush_lsn() >= $1::pg_lsn", endLSN).Scan(&flushed); err != nil {
			return c, err
		}
		if flushed {
			break
		}
		if time.Now().After(deadline) {
			return c, fmt.Errorf("WAL up to %s not flushed", endLSN)
		}
		if err := sleepCtx(ctx, 50*time.Millisecond); err != nil {
			return c, err
		}
	}
	rows, err = m.pool.Query(ctx, `SELECT "resource_manager/record_type", count, record_size, fpi_size
		FROM pg_get_wal_stats($1::pg_lsn, $2::pg_lsn, true) WHERE count > 0 ORDER BY combined_size DESC`, startLSN, endLSN)
	if err != nil {
		return c, fmt.Errorf("pg_get_wal_stats: %w", err)
	}
	var recs []RecordWAL
	for rows.Next() {
		var r RecordWAL
		if err := rows.Scan(&r.Type, &r.Count, &r.Bytes, &r.FPIBytes); err != nil {
			return c, err
		}
		recs = append(recs, r)
	}
	if err := rows.Err(); err != nil {
		return c, err
	}
	for _, r := range recs {
		switch r.Type {
		case "Btree/INSERT_LEAF", "Btree/INSERT_POST", "Btree/SPLIT_L", "Btree/SPLIT_R":
			c.IndexEntries += r.Count
		case "Transaction/COMMIT":
			c.Commits += r.Count
		}
	}
	c.TopRecords = recs[:min(len(recs), 8)]
	return c, nil
}

// statementClass sorts a pg_stat_statements query text: "tx" for transaction control, "write"
// for INSERT, UPDATE, DELETE and MERGE (also behind a WITH), "read" for the rest.
func statementClass(q string) string {
	f := strings.Fields(strings.ToUpper(q))
	if len(f) == 0 {
		return "read"
	}
	switch f[0] {
	case "BEGIN", "START", "COMMIT", "END", "ROLLBACK", "SAVEPOINT", "RELEASE":
		return "tx"
	case "INSERT", "UPDATE", "DELETE", "MERGE":
		return "write"
	case "WITH":
		if writingCTE.MatchString(strings.ToUpper(q)) {
			return "write"
		}
	}
	return "read"
}

var writingCTE = regexp.MustCompile(`\)\s*(INSERT|UPDATE|DELETE|MERGE)\b`)

var spaces = regexp.MustCompile(`\s+`)

// shortQuery is a statement's text on one line, cut to 90 characters.
func shortQuery(q string) string {
	q = strings.TrimSpace(spaces.ReplaceAllString(q, " "))
	if len(q) > 90 {
		q = q[:87] + "..."
	}
	return q
}

// run returns the run of scenario and drain name (WritesRun.Name).
func (w *WritesResult) run(scenario, name string) (WritesRun, bool) {
	for _, r := range w.Runs {
		if r.Scenario == scenario && r.Name() == name {
			return r, true
		}
	}
	return WritesRun{}, false
}

// issue25WritesTargets judges the relay's WAL bytes per event against the ceiling loop's, in
// each scenario, for the worse of the relay's runs.
func (r *Report) issue25WritesTargets() []target {
	w := r.Writes
	if w == nil {
		return nil
	}
	var ts []target
	for _, scenario := range []string{writesCloseBehind, writesCheckpoint} {
		ceil, ok := w.run(scenario, drainerCeiling)
		if !ok || ceil.Drain.WALBytes == 0 {
			continue
		}
		var parts []string
		met, measured := true, false
		for _, run := range w.Runs {
			if run.Scenario != scenario || run.Drainer != drainerRelay {
				continue
			}
			ratio := float64(run.Drain.WALBytes) / float64(ceil.Drain.WALBytes)
			met, measured = met && ratio <= writesTarget, true
			parts = append(parts, fmt.Sprintf("publisher %s: %.2f× (%.0f vs %.0f B/event)", run.Delay, ratio,
				run.Drain.Per(run.Drain.WALBytes), ceil.Drain.Per(ceil.Drain.WALBytes)))
		}
		if measured {
			ts = append(ts, target{25, "WAL bytes per published event, " + scenario, fmt.Sprintf("relay ≤ %.1f× the ceiling loop's", writesTarget),
				strings.Join(parts, "; "), verdict(met)})
		}
	}
	return ts
}

// writesMarkdown renders the suite's section.
func (r *Report) writesMarkdown(w func(string, ...any)) {
	res := r.Writes
	if res == nil || len(res.Runs) == 0 {
		return
	}
	w("## 13. Database writes per event (issue 25)\n\n")
	w("%s events in %s keys, written by `outbox.Write` (one event per transaction, %d connections) and then published by one drainer, on a fresh "+
		"database per run: sluice's relay (the relay suite's configuration: defaults, the stub publisher at 0 and 10 ms a call) or the ceiling loop "+
		"(claim 1,000 rows `FOR UPDATE SKIP LOCKED`, mark them with one `UPDATE ... = ANY`, commit). Server: %s. "+
		"Statistics were reset before each phase and read after its sessions ended; each phase ran under a role of its own, so the "+
		"statements are the phase's alone (the harness's poll and measurement queries are not counted). Per event:\n\n",
		num(float64(res.Events)), num(float64(res.Keys)), writesProducers, res.Server)
	w("- *statements*: pg_stat_statements calls, without BEGIN/COMMIT/ROLLBACK (shown apart as tx control); *commits*: commit records in the phase's WAL;\n")
	w("- *rows written*: rows of the phase's INSERT/UPDATE/DELETE statements (pg_stat_statements); ins/upd (HOT)/del: `outbox_event`'s `pg_stat_user_tables` counters " +
		"(a row locked by `SELECT ... FOR UPDATE` is not counted as written, though the lock is written to the row and to WAL: `Heap/LOCK` below);\n")
	w("- *WAL*: `pg_stat_wal` bytes, records and full-page images (FPI) over the phase, which is server-wide (nothing else ran on the suite's cluster);\n")
	w("- *index entries*: B-tree leaf tuples inserted, counted from the phase's WAL with pg_walinspect (`Btree/INSERT_LEAF`, `INSERT_POST` and the `SPLIT` records, each of which inserts one);\n")
	w("- *dead tuples*: `outbox_event`'s `n_dead_tup` at the end of the phase, left for VACUUM (autovacuum was off).\n\n")
	w("| scenario | phase | statements | tx control | commits | rows written | ins / upd (HOT) / del | WAL bytes | WAL records | FPI | index entries | dead tuples | WAL vs ceiling |\n")
	w("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, scenario := range []string{writesCloseBehind, writesCheckpoint} {
		ceil, okc := res.run(scenario, drainerCeiling)
		first := true
		for _, run := range res.Runs {
			if run.Scenario != scenario {
				continue
			}
			if first {
				w("%s\n", writesRow(scenario, "producer: `outbox.Write`, 1 event per transaction", run.Producer, "—"))
				first = false
			}
			vs := "—"
			if okc && ceil.Drain.WALBytes > 0 {
				vs = fmt.Sprintf("%.2f×", float64(run.Drain.WALBytes)/float64(ceil.Drain.WALBytes))
			}
			if run.Drainer == drainerCeiling {
				vs = "1.00×"
			}
			w("%s\n", writesRow(scenario, run.Name(), run.Drain, vs))
		}
	}
	w("\nThe producer's row is that of each scenario's first run (the producer phases of the other runs wrote within %s of it). "+
		"The drains' largest WAL contributors, by statement (pg_stat_statements `wal_bytes`) and by WAL record type (pg_walinspect; "+
		"bytes of the records, plus the full-page images they carried):\n\n", producerSpread(res))
	w("| scenario | phase | statement | calls/event | WAL B/event | share |\n|---|---|---|---|---|---|\n")
	for _, run := range res.Runs {
		for _, s := range run.Drain.TopStatements {
			if s.WALBytes == 0 {
				continue
			}
			w("| %s | %s | `%s` | %.3f | %.1f | %.0f%% |\n", run.Scenario, run.Name(), strings.ReplaceAll(s.Query, "|", `\|`),
				run.Drain.Per(s.Calls), run.Drain.Per(s.WALBytes), 100*float64(s.WALBytes)/float64(max(1, run.Drain.StatementWALBytes)))
		}
	}
	w("\n| scenario | phase | WAL record types, largest first (count/event, record B/event + FPI B/event) |\n|---|---|---|\n")
	records := func(c WriteCost) string {
		var parts []string
		for _, rec := range c.TopRecords {
			p := fmt.Sprintf("%s %.2f, %.1f B", rec.Type, c.Per(rec.Count), c.Per(rec.Bytes))
			if rec.FPIBytes > 0 {
				p += fmt.Sprintf(" + %.1f B", c.Per(rec.FPIBytes))
			}
			parts = append(parts, p)
		}
		return strings.Join(parts, "; ")
	}
	seen := map[string]bool{}
	for _, run := range res.Runs {
		if !seen[run.Scenario] {
			seen[run.Scenario] = true
			w("| %s | producer | %s |\n", run.Scenario, records(run.Producer))
		}
		w("| %s | %s | %s |\n", run.Scenario, run.Name(), records(run.Drain))
	}
	w("\n")
}

func writesRow(scenario, phase string, c WriteCost, vs string) string {
	return fmt.Sprintf("| %s | %s | %.3f | %.3f | %.3f | %.3f | %.2f / %.2f (%.2f) / %.2f | %.1f | %.2f | %.3f | %.2f | %.2f | %s |",
		scenario, phase, c.Per(c.Statements), c.Per(c.TxControl), c.Per(c.Commits), c.Per(c.RowsWritten),
		c.Per(c.TupIns), c.Per(c.TupUpd), c.Per(c.TupHotUpd), c.Per(c.TupDel), c.Per(c.WALBytes), c.Per(c.WALRecords), c.Per(c.WALFPI),
		c.Per(c.IndexEntries), c.Per(c.Dead), vs)
}

// producerSpread is the largest difference between the producer phases' WAL bytes per event, in
// percent of the smallest.
func producerSpread(res *WritesResult) string {
	var v []float64
	for _, r := range res.Runs {
		v = append(v, r.Producer.Per(r.Producer.WALBytes))
	}
	if len(v) == 0 || slices.Min(v) == 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.1f%%", 100*(slices.Max(v)-slices.Min(v))/slices.Min(v))
}
