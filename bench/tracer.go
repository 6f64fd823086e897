package main

import (
	"context"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// The relay's statements, recognised by their text (pkg/outbox/claim.go, watch.go, settle.go).
// A round is BEGIN, lock, read, publish (no statement), settle, COMMIT; the watcher polls and
// sweeps in read-only transactions of its own.
const (
	stmtLock   = "lock"   // lockKeysSQL: one pg_try_advisory_lock per key (the xact form before)
	stmtRead   = "read"   // readSQL: each locked key's rows after its floor
	stmtSweep  = "sweep"  // sweepSQL: one index descent per pending key
	stmtPoll   = "poll"   // the poll batch: rows above the frontier, and the admin epoch
	stmtSettle = "settle" // the settle batch: mark published, record failures
	stmtOther  = "other"
)

// relayStmtKind names a statement of the relay by its text: scaleoutClass's classes, coarser
// (the one table of the relay's statements).
func relayStmtKind(sql string) string {
	switch scaleoutClass(sql) {
	case classLock:
		return stmtLock
	case classRead:
		return stmtRead
	case classSweep:
		return stmtSweep
	case classPoll:
		return stmtPoll
	case classMark, classFail:
		return stmtSettle
	}
	return stmtOther
}

// stmtSample is one timed statement: when it ended (since the tracer's start) and how long it took.
type stmtSample struct {
	At, Took time.Duration
	// Rows is the number of rows it returned or changed.
	Rows int64
}

// relayTracer times the relay's statements on every connection of its pool, by kind, and
// pairs each round's lock and read into the round's claim (the database work before anything
// is published: lock the keys, read their rows). It keeps the read's last SQL and arguments
// for EXPLAIN, and counts every statement (batches count once) for the query rate.
type relayTracer struct {
	start time.Time

	mu      sync.Mutex
	samples map[string][]stmtSample
	// claims are lock + read of rounds whose read returned rows.
	claims []stmtSample
	// lockOf is the duration of the lock statement a connection ran last, until its read.
	lockOf map[*pgx.Conn]time.Duration
	// biggestRead is the read statement that returned the most rows since the last reset, for EXPLAIN.
	biggestRead struct {
		sql  string
		args []any
		rows int64
	}
	// last is the SQL and arguments of the last statement of each kind, for EXPLAIN.
	last  map[string]sentStmt
	count int64
}

// sentStmt is a statement as the relay sent it.
type sentStmt struct {
	SQL  string
	Args []any
}

func newRelayTracer() *relayTracer {
	return &relayTracer{start: time.Now(), samples: map[string][]stmtSample{}, lockOf: map[*pgx.Conn]time.Duration{}, last: map[string]sentStmt{}}
}

var (
	_ pgx.QueryTracer = (*relayTracer)(nil)
	_ pgx.BatchTracer = (*relayTracer)(nil)
)

type (
	queryStartKey struct{}
	batchStateKey struct{}
)

type queryStart struct {
	at   time.Time
	kind string
	sql  string
	args []any
}

type batchState struct {
	at   time.Time
	kind string
	// read: the batch held a read (a round's claim: its keys' locks and rows in one round
	// trip), which returned rows rows.
	read bool
	rows int64
}

// TraceQueryStart implements pgx.QueryTracer.
func (t *relayTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	kind := relayStmtKind(data.SQL)
	t.mu.Lock()
	t.count++
	if kind != stmtOther {
		t.last[kind] = sentStmt{data.SQL, data.Args}
	}
	t.mu.Unlock()
	qs := queryStart{at: time.Now(), kind: kind}
	if kind == stmtRead {
		qs.sql, qs.args = data.SQL, data.Args
	}
	return context.WithValue(ctx, queryStartKey{}, qs)
}

// TraceQueryEnd implements pgx.QueryTracer.
func (t *relayTracer) TraceQueryEnd(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryEndData) {
	qs, ok := ctx.Value(queryStartKey{}).(queryStart)
	if !ok || data.Err != nil || qs.kind == stmtOther {
		return
	}
	now := time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	s := stmtSample{At: now.Sub(t.start), Took: now.Sub(qs.at), Rows: data.CommandTag.RowsAffected()}
	t.samples[qs.kind] = append(t.samples[qs.kind], s)
	switch qs.kind {
	case stmtLock:
		t.lockOf[conn] = s.Took
	case stmtRead:
		lock, ok := t.lockOf[conn]
		delete(t.lockOf, conn)
		if ok && s.Rows > 0 {
			t.claims = append(t.claims, stmtSample{At: s.At, Took: lock + s.Took, Rows: s.Rows})
		}
		if s.Rows > t.biggestRead.rows {
			t.biggestRead.sql, t.biggestRead.args, t.biggestRead.rows = qs.sql, qs.args, s.Rows
		}
	}
}

// TraceBatchStart implements pgx.BatchTracer.
func (t *relayTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	t.mu.Lock()
	t.count++
	t.mu.Unlock()
	return context.WithValue(ctx, batchStateKey{}, &batchState{at: time.Now()})
}

// TraceBatchQuery implements pgx.BatchTracer: a batch is named by its first statement the
// tracer recognises; one that holds a read is also a claim, whose read is kept as a query's.
func (t *relayTracer) TraceBatchQuery(ctx context.Context, _ *pgx.Conn, data pgx.TraceBatchQueryData) {
	bs, ok := ctx.Value(batchStateKey{}).(*batchState)
	if !ok {
		return
	}
	k := relayStmtKind(data.SQL)
	if k == stmtOther {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if bs.kind == "" {
		bs.kind = k
		t.last[k] = sentStmt{data.SQL, data.Args}
	}
	if k == stmtRead && data.Err == nil {
		bs.read, bs.rows = true, data.CommandTag.RowsAffected()
		t.last[k] = sentStmt{data.SQL, data.Args}
		if bs.rows > t.biggestRead.rows {
			t.biggestRead.sql, t.biggestRead.args, t.biggestRead.rows = data.SQL, data.Args, bs.rows
		}
	}
}

// TraceBatchEnd implements pgx.BatchTracer.
func (t *relayTracer) TraceBatchEnd(ctx context.Context, _ *pgx.Conn, data pgx.TraceBatchEndData) {
	bs, ok := ctx.Value(batchStateKey{}).(*batchState)
	if !ok || data.Err != nil || bs.kind == "" {
		return
	}
	now := time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	sample := stmtSample{At: now.Sub(t.start), Took: now.Sub(bs.at)}
	t.samples[bs.kind] = append(t.samples[bs.kind], sample)
	if bs.read && bs.rows > 0 {
		sample.Rows = bs.rows
		t.claims = append(t.claims, sample)
	}
}

// take returns and forgets the samples of kind (stmtLock, ...), or of the claims with "claim".
func (t *relayTracer) take(kind string) []stmtSample {
	t.mu.Lock()
	defer t.mu.Unlock()
	if kind == "claim" {
		c := t.claims
		t.claims = nil
		return c
	}
	s := t.samples[kind]
	delete(t.samples, kind)
	return s
}

// reset forgets every sample and the statement count, and restarts the clock.
func (t *relayTracer) reset() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.start = time.Now()
	t.samples = map[string][]stmtSample{}
	t.claims = nil
	t.lockOf = map[*pgx.Conn]time.Duration{}
	t.biggestRead.sql, t.biggestRead.args, t.biggestRead.rows = "", nil, 0
	t.count = 0
}

// rate returns the statements and batches traced per second since the last reset.
func (t *relayTracer) rate() float64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return float64(t.count) / time.Since(t.start).Seconds()
}

// biggest returns the read statement that returned the most rows since the last reset, as the
// relay sent it, and how many rows it returned.
func (t *relayTracer) biggest() (string, []any, int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.biggestRead.sql, t.biggestRead.args, t.biggestRead.rows
}

// lastOf returns the last statement of kind the relay sent, if any.
func (t *relayTracer) lastOf(kind string) (sentStmt, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	st, ok := t.last[kind]
	return st, ok
}

// durations returns the samples' durations.
func durations(s []stmtSample) []time.Duration {
	d := make([]time.Duration, len(s))
	for i, x := range s {
		d[i] = x.Took
	}
	return d
}

// before returns the samples that ended before at.
func before(s []stmtSample, at time.Duration) []stmtSample {
	var out []stmtSample
	for _, x := range s {
		if x.At < at {
			out = append(out, x)
		}
	}
	return out
}

// after returns the samples that ended at or after at.
func after(s []stmtSample, at time.Duration) []stmtSample {
	var out []stmtSample
	for _, x := range s {
		if x.At >= at {
			out = append(out, x)
		}
	}
	return out
}
