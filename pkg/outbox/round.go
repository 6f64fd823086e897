package outbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A round takes keys from the book and, on one connection of the pool:
//
//  1. locks them: one session-level advisory lock per key (lockKeysSQL), skipping keys another
//     round holds;
//  2. reads each locked key's first pending rows (readSQL: the statement that enforces per-key
//     order, against the database, never against a cache);
//  3. publishes each key's rows as a lane (laneSet): one row after another, each only after the
//     previous was acknowledged;
//  4. as soon as a key's lane ends, records its outcomes in a short transaction and, after that
//     transaction committed, releases the key's lock (roundSettler). A hot key's long lane
//     never holds the other keys of its round.
//
// The keys' locks are the only thing that makes a key one round's at a time. They end with the
// settler's unlock, with the round's end (roundConn.close: roundEndSQL, or unlockAllSQL on a
// dedicated connection that still holds any), or with the session: a relay that dies (SIGKILL, lost
// connection) releases them when PostgreSQL sees its connection close, within a second even
// mid-statement (client_connection_check_interval), and one that hangs or is frozen is cut off
// by idle_session_timeout after the lease. Any failed statement destroys the connection, so a
// round never leaves a lock behind on a connection that goes back to the pool.

// roundConn is a round's connection: its statements, and whether it can still go back to the
// pool. One goroutine uses it at a time (the round, then its settler).
type roundConn struct {
	conn *pgxpool.Conn
	pg14 bool
	// dedicated: the session holds the round settings since it connected (DedicatePool); the
	// round neither sets nor resets them.
	dedicated bool
	// held counts the advisory locks the session holds, from the server's answers: the keys
	// lockKeysSQL returned less those unlockKeysSQL reported released. Used by the round, then
	// by its settler, then by close, one after another.
	held int64
	// broken: a statement failed; the connection is closed instead of returned to the pool,
	// which releases whatever locks it held.
	broken bool
	// released: close ran (the round closes a broken connection before its late record).
	released bool
}

// fail marks the connection broken and returns err.
func (c *roundConn) fail(err error) error {
	c.broken = true
	return err
}

// close ends the round on the connection: it releases every lock left and undoes the round's
// settings, or, when that fails or the connection broke, closes it. A dedicated connection
// whose settler released every lock the round took needs no statement.
func (c *roundConn) close(ctx context.Context, lease time.Duration) {
	if c.released {
		return
	}
	c.released = true
	if !c.broken && !(c.dedicated && c.held == 0) {
		ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), lease/2)
		end := unlockAllSQL
		if !c.dedicated {
			// RESET puts the server's defaults back, not what DedicatePool set: a connection
			// of a dedicated pool that a relay of another lease used is an ordinary one now.
			undedicate(c.conn.Conn())
			end = roundEndSQL(c.pg14)
		}
		_, err := c.conn.Exec(ectx, end, pgx.QueryExecModeSimpleProtocol)
		cancel()
		c.broken = err != nil
	}
	if c.broken {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		_ = c.conn.Conn().Close(cctx)
		cancel()
	}
	c.conn.Release()
}

// round claims taken's keys, publishes their rows and records each key's outcomes as its lane
// ends (see the comment above). Whatever happens, every key goes back to the book with what
// the round learned about it. calls tracks the round's calls for its pipeline (nil in a probe
// round; see runRound).
func (r *Relay) round(ctx context.Context, taken roundKeys, calls *roundCalls) (Stats, error) {
	start := time.Now()
	back := newKeyReturns(r.book, taken.keys)
	defer back.rest()

	// The round's part of the process's round memory (RoundMemory), taken before its
	// connection: a round that waits for memory holds no connection of its relay's.
	share, readBudget, err := r.takeRoundShare(ctx)
	if err != nil {
		return Stats{}, r.quiet(ctx, err)
	}
	defer share.release()

	conn, err := r.pool.Acquire(ctx)
	if err != nil {
		return Stats{}, r.quiet(ctx, fmt.Errorf("relay round: acquire a connection: %w", err))
	}
	rc := &roundConn{conn: conn, pg14: r.watch.pg14, dedicated: dedicated(conn.Conn(), r.cfg.Lease)}
	defer rc.close(ctx, r.cfg.Lease)
	acquired := time.Now()

	perKey := max(1, min(r.cfg.MaxPerKey, r.cfg.BatchSize/len(taken.keys)))
	if taken.probe != "" {
		perKey = 1 // a probe is one call's worth of rows
	}
	locked, read, err := r.claimKeys(ctx, rc, taken.keys, perKey, readBudget)
	if err != nil {
		return Stats{}, r.quiet(ctx, rc.fail(err))
	}
	share.loaded(read)
	var mine, elsewhere []string
	for _, k := range taken.keys {
		if locked[k] {
			mine = append(mine, k)
		} else {
			elsewhere = append(elsewhere, k)
		}
	}
	// Another relay's round holds these: the keys are that relay's work now. A later sweep
	// finds them again if that relay stops with rows left.
	back.give(elsewhere, func(k string) keyResult { return keyResult{key: k, verdict: verdictElsewhere} })
	if len(mine) == 0 {
		return Stats{}, nil
	}
	lockedAt := time.Now()
	rows := read[:0] // the locked keys' rows: what was read of the others is dropped unseen
	for _, c := range read {
		if locked[c.PartitionKey] {
			rows = append(rows, c)
		}
	}
	r.wal.sawRows(rows)
	plan := r.planRound(mine, rows, perKey)
	claimed := time.Now()

	pctx, stopPublishing := context.WithDeadline(ctx, start.Add(r.cfg.Lease*3/4))
	defer stopPublishing()
	// When the relay stops (ctx ends), no call starts any more, but the calls in flight get
	// stopGrace to return: what a destination acknowledged is then recorded, not published a
	// second time by the next relay. The lease bounds them as it bounds the round.
	callCtx, stopCalls := context.WithDeadline(context.WithoutCancel(ctx), start.Add(r.cfg.Lease*3/4))
	defer stopCalls()
	defer context.AfterFunc(pctx, func() { time.AfterFunc(cmp.Or(r.cfg.stopGrace, stopGrace), stopCalls) })()
	// A flush that fails stops the round's publishing: its keys' locks went with its
	// connection. The calls in flight still get stopGrace to answer (the AfterFunc above), so
	// that what the destination acknowledged is recorded (recordAcknowledged), not published a
	// second time.
	settler := newRoundSettler(r, rc, back, stopPublishing)
	settler.start(ctx)
	for _, kp := range plan.keys {
		if len(kp.lane) == 0 {
			settler.ended(kp) // nothing to send: record nothing, release at once
		}
	}
	r.publish(pctx, callCtx, start, plan.keys, taken.probe, calls, settler.ended)
	published := time.Now()
	st, err := settler.finish()
	if len(settler.unrecorded) > 0 {
		rc.close(ctx, r.cfg.Lease) // broken: its pool slot is free for the late record
		late, lerr := r.recordAcknowledged(ctx, settler.unrecorded)
		st.add(late)
		err = errors.Join(err, lerr)
	}
	st.Rounds = 1
	if r.log.Enabled(ctx, slog.LevelDebug) {
		r.log.Debug("relay round", "keys", len(taken.keys), "locked", len(mine), "claimed", st.Claimed, "published", st.Published,
			"retrying", st.Retrying, "outage", st.Outage, "quarantined", st.Quarantined, "probe", taken.probe,
			"claim_ms", claimed.Sub(start).Milliseconds(), "acquire_ms", acquired.Sub(start).Milliseconds(),
			"lock_ms", lockedAt.Sub(acquired).Milliseconds(), "publish_ms", published.Sub(claimed).Milliseconds(),
			"settle_ms", time.Since(published).Milliseconds())
	}
	return st, r.quiet(ctx, err)
}

// quiet drops err when ctx ended: a stopping relay's cancelled statement is not a failure.
func (r *Relay) quiet(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// claimKeys takes, with the round's settings (already on a dedicated connection), the advisory
// locks of the keys no other round holds, and reads the keys' first pending rows (readSQL, up
// to perKey a key), in one round trip: both statements in one READ COMMITTED transaction, so
// the read's snapshot is taken when it starts, after the lock statement returned. A key's rows
// are thus read only once its lock is held, whatever the database's default isolation; the
// rows of keys it did not lock are the caller's to drop.
func (r *Relay) claimKeys(ctx context.Context, rc *roundConn, keys []string, perKey, budget int) (map[string]bool, []*claimedRow, error) {
	b := &pgx.Batch{}
	b.Queue("BEGIN ISOLATION LEVEL READ COMMITTED")
	if !rc.dedicated {
		for _, s := range roundSettings(r.cfg.Lease, rc.pg14) {
			b.Queue(s)
		}
	}
	locked := make(map[string]bool, len(keys))
	b.Queue(lockKeysSQL, keys).Query(func(rows pgx.Rows) error {
		var k string
		_, err := pgx.ForEachRow(rows, []any{&k}, func() error {
			locked[k] = true
			rc.held++
			return nil
		})
		return err
	})
	var read []*claimedRow
	b.Queue(readSQL, keys, perKey, budget, r.readBytes).Query(func(rows pgx.Rows) error {
		var err error
		read, err = r.scanClaimed(rows)
		return err
	})
	b.Queue("COMMIT")
	if err := rc.conn.SendBatch(ctx, b).Close(); err != nil {
		return nil, nil, fmt.Errorf("lock partition keys and read their rows: %w", err)
	}
	if mutant == mutantCachedPosition {
		read = mutantReadFromCache(r, read)
	}
	if mutant == mutantStreamTrusted {
		read = mutantReadFromStream(r, read)
	}
	return locked, read, nil
}

// keyReturns hands a round's keys back to the book, each once: as its verdict comes, or, for
// what is left when the round ends, verdictRelease (claim again at once).
type keyReturns struct {
	book *keyBook
	mu   sync.Mutex
	left map[string]bool
}

func newKeyReturns(book *keyBook, keys []string) *keyReturns {
	left := make(map[string]bool, len(keys))
	for _, k := range keys {
		left[k] = true
	}
	return &keyReturns{book: book, left: left}
}

// give returns keys with the verdict verdict gives each.
func (b *keyReturns) give(keys []string, verdict func(string) keyResult) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var results []keyResult
	for _, k := range keys {
		if b.left[k] {
			delete(b.left, k)
			results = append(results, verdict(k))
		}
	}
	b.book.settle(results, time.Now())
}

// rest returns every key not returned yet, to be claimed again at once.
func (b *keyReturns) rest() {
	b.mu.Lock()
	keys := make([]string, 0, len(b.left))
	for k := range b.left {
		keys = append(keys, k)
	}
	b.mu.Unlock()
	b.give(keys, func(k string) keyResult { return keyResult{key: k, verdict: verdictRelease} })
}

// roundSettler records the outcomes of a round's keys as their lanes end and releases them:
// each flush takes every key that ended since the last one, commits their outcomes in one
// transaction, and only then unlocks them and hands them back to the book. So a key is
// released when its own lane ends, never later than one flush after, and never before its
// outcomes are committed (the next round to lock it reads them).
type roundSettler struct {
	r    *Relay
	rc   *roundConn
	back *keyReturns
	// abort stops the round's publishing when a flush fails: the keys' locks are gone.
	abort func()

	mu      sync.Mutex
	cond    *sync.Cond
	pending []*keyPlan
	closed  bool
	done    chan struct{}
	st      Stats
	err     error
	// unrecorded are the keys whose outcomes no flush recorded: the batch of the flush that
	// failed and every key that ended after it (read once done is closed).
	unrecorded []*keyPlan
}

func newRoundSettler(r *Relay, rc *roundConn, back *keyReturns, abort func()) *roundSettler {
	s := &roundSettler{r: r, rc: rc, back: back, abort: abort, done: make(chan struct{})}
	s.cond = sync.NewCond(&s.mu)
	return s
}

// ended queues kp's key: its lane will send nothing more. It never blocks.
func (s *roundSettler) ended(kp *keyPlan) {
	s.mu.Lock()
	s.pending = append(s.pending, kp)
	s.mu.Unlock()
	s.cond.Signal()
}

func (s *roundSettler) start(ctx context.Context) {
	go func() {
		defer close(s.done)
		for {
			s.mu.Lock()
			for len(s.pending) == 0 && !s.closed {
				s.cond.Wait()
			}
			batch := s.pending
			s.pending = nil
			closed := s.closed
			s.mu.Unlock()
			switch {
			case len(batch) == 0:
			case s.err != nil:
				s.unrecorded = append(s.unrecorded, batch...)
			default:
				st, err := s.flush(ctx, batch)
				s.st.add(st)
				if err != nil {
					s.err = err
					s.unrecorded = append(s.unrecorded, batch...)
					s.abort()
				}
			}
			if closed && len(batch) == 0 {
				return
			}
		}
	}()
}

// finish waits for the last flush; every key has ended by then (publish returned).
func (s *roundSettler) finish() (Stats, error) {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.cond.Signal()
	<-s.done
	return s.st, s.err
}

// flush commits the outcomes of keys whose lanes ended, then releases them. If it fails, the
// connection is closed (its locks go with it), the round records what its destinations
// acknowledged on another connection (recordAcknowledged), and the keys are handed back to be
// claimed again. Rows acknowledged but recorded by neither are published a second time:
// duplicates are possible, loss is not.
func (s *roundSettler) flush(ctx context.Context, plans []*keyPlan) (Stats, error) {
	var outcomes []*outcome
	keys := make([]string, len(plans))
	for i, kp := range plans {
		outcomes = append(outcomes, kp.lane...)
		keys[i] = kp.key
	}
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	st := s.r.recordOutcomes(b, outcomes)
	b.Queue("COMMIT")
	// After the COMMIT above, in the same round trip: the next round to lock a key reads what
	// this one recorded.
	b.Queue(unlockKeysSQL, keys).QueryRow(func(row pgx.Row) error {
		var released int64
		err := row.Scan(&released)
		s.rc.held -= released
		return err
	})
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.r.cfg.Lease/2)
	defer cancel()
	if mutant == mutantUnlockBeforeCommit {
		mutantUnlockFirst(fctx, s.rc, keys)
	}
	if err := s.rc.conn.SendBatch(fctx, b).Close(); err != nil {
		err = s.rc.fail(fmt.Errorf("record publish outcomes of %d rows: %w", len(outcomes), err))
		// Said before the round closes the connection and so releases the keys (the one
		// exception: a flush cut by its deadline, whose connection pgx closed a moment before
		// this line): from here another relay may publish the acknowledged rows again, unless
		// recordAcknowledged records them first.
		acknowledged := 0
		for _, o := range outcomes {
			if o.done {
				acknowledged++
			}
		}
		s.r.log.Warn("relay round could not record its outcomes: its keys are released and the rows their destinations acknowledged are recorded on another connection, or published again",
			"rows", len(outcomes), "acknowledged", acknowledged, "error", err)
		return Stats{}, err
	}
	byKey := make(map[string]*keyPlan, len(plans))
	for _, kp := range plans {
		byKey[kp.key] = kp
	}
	s.back.give(keys, func(k string) keyResult { return byKey[k].result() })
	return st, nil
}

// recordAcknowledged marks published, on a connection of the pool, the rows of plans that
// their destination acknowledged, after the round's connection broke before it recorded them
// (a server that ended the session, a failover, a statement that failed). The keys' locks went
// with that connection; a row its destination acknowledged is published whoever holds its key
// now, so it is recorded without them (settlePublishedSQL skips a row already marked). What
// failed or was never sent is left as it was, for the next round. Without it a round that lost
// its connection published all its rows a second time, and a fleet tenant's failed turn with
// them (docs/fleet.md).
func (r *Relay) recordAcknowledged(ctx context.Context, plans []*keyPlan) (Stats, error) {
	var (
		st  Stats
		ids []int64
	)
	for _, kp := range plans {
		for _, o := range kp.lane {
			st.Claimed++
			if o.done {
				ids = append(ids, o.event.ID)
			}
		}
	}
	if len(ids) == 0 {
		return st, nil
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.Lease/2)
	defer cancel()
	conn, err := r.pool.Acquire(rctx)
	if err != nil {
		return st, fmt.Errorf("record %d acknowledged rows after the round's connection broke: acquire a connection: %w", len(ids), err)
	}
	defer conn.Release()
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	for _, g := range planGuards {
		b.Queue("SET LOCAL " + g)
	}
	b.Queue(settlePlanSQL)
	b.Queue(settlePublishedSQL, ids)
	b.Queue("COMMIT")
	if err := conn.SendBatch(rctx, b).Close(); err != nil {
		return st, fmt.Errorf("record %d acknowledged rows after the round's connection broke (UPDATE outbox_event SET published_at): %w", len(ids), err)
	}
	st.Published = len(ids)
	return st, nil
}

// publish sends the lanes of plans (see laneSet) with up to PublishConcurrency calls in flight
// across the relay's rounds, and tells ended of each key whose lane ended. probe is the failing
// destination a probe round may call ("" in an ordinary round). No call starts once ctx has
// ended; the calls themselves run under callCtx, tracked by calls.
func (r *Relay) publish(ctx, callCtx context.Context, roundStart time.Time, plans []*keyPlan, probe string, calls *roundCalls, ended func(*keyPlan)) {
	set := newLaneSet(plans, r.limit, func(dest string) (bool, time.Time) {
		return r.dests.admit(dest, probe)
	}, func(l *lane) { ended(l.plan) })
	set.onOvertake = func(later, earlier *outcome) {
		r.log.Error("outbox destination acknowledged a row after failing an earlier row of its key in the same call; the row is published ahead of it",
			"destination", later.dest, "partition_key", later.event.PartitionKey, "id", later.event.ID, "event_id", later.event.EventID,
			"earlier_id", earlier.event.ID, "earlier_event_id", earlier.event.EventID)
	}
	stopping := func() bool { return ctx.Err() != nil }
	var wg sync.WaitGroup
	for range min(r.cfg.PublishConcurrency, len(set.ready)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				dest, batch, ok := set.next(stopping)
				if !ok {
					return
				}
				set.finish(batch, r.call(callCtx, roundStart, dest, batch, calls))
			}
		}()
	}
	wg.Wait()
	set.endRest()
}

// stopGrace is how long the calls in flight when the relay stops may take to return: long
// enough for a destination's answer to arrive (tens of milliseconds), short enough to fit in
// the relay Lambda's SLUICE_RELAY_STOP_BEFORE (5 s by default) with the settle after it.
const stopGrace = 2 * time.Second

// maxBatchEntries is the most entries of one PublishBatch call (SNS's limit).
const maxBatchEntries = 10

// limit returns dest's limits (see limitOf).
func (r *Relay) limit(dest string) Limits {
	if l, ok := r.limits[dest]; ok {
		return l
	}
	return r.limitOf(dest)
}

// call publishes the current rows of batch's lanes to dest and judges the answer:
//   - a call whose every entry was refused as permanent is asked again entry by entry (the
//     refusal may be the request's, not each row's);
//   - an entry the destination answered and refused is the row's failure (an attempt);
//   - a call that failed as a whole (every entry with the same error: the request's, such as a
//     throttle or a timeout) is not an attempt of its rows: if nothing sent to dest succeeded
//     since those rows began failing (or since the round began), it is the destination's
//     failure (an outage: dest backs off and its keys wait for its probe); otherwise the rows
//     back off without counting an attempt.
//
// A call may carry several consecutive rows of a lane (Limits.KeyOrderInCall): a row after one
// of its lane that could not be stored, or that was refused when asked alone, is not sent, and
// laneSet.finish acknowledges a lane's rows only up to its first failure.
//
// A call cut short for being slow (errSlowCall) is the destination's failure, whatever else
// succeeded: it backs off as a whole and is probed.
func (r *Relay) call(ctx context.Context, roundStart time.Time, dest string, batch []entry, calls *roundCalls) []callResult {
	events := make([]*Event, len(batch))
	since := roundStart
	for i, e := range batch {
		events[i] = e.o.event
		if fs := e.o.row.failingSince; fs != nil && fs.Before(since) {
			since = *fs
		}
	}
	// Payloads for the claim check go to its store first; a row whose payload could not be
	// stored is not sent, and its failure is the row's, not the destination's. Nor are the
	// rows of its lane after it in the call: they wait behind it.
	stored := r.offload(ctx, batch, events)
	var sent []int
	failed := map[*lane]bool{}
	for i, e := range batch {
		switch {
		case failed[e.lane]:
			stored[i] = errBehindFailure
		case stored[i] != nil:
			failed[e.lane] = true
		default:
			sent = append(sent, i)
		}
	}
	errs := make([]error, len(events))
	var sendErrs []error
	started := time.Now()
	if len(sent) > 0 {
		toSend := make([]*Event, len(sent))
		for j, i := range sent {
			toSend[j] = events[i]
		}
		sendErrs = r.send(ctx, dest, toSend, calls)
		if len(toSend) > 1 && allPermanent(sendErrs) && ctx.Err() == nil {
			// Asked alone, a row after one of its lane that was refused is not sent: it keeps
			// the call's answer and waits behind that row.
			refused := map[*lane]bool{}
			for j, i := range sent {
				if l := batch[i].lane; !refused[l] {
					sendErrs[j] = r.send(ctx, dest, toSend[j:j+1], calls)[0]
					refused[l] = sendErrs[j] != nil
				}
			}
		}
		for j, i := range sent {
			errs[i] = sendErrs[j]
		}
	}
	results := make([]callResult, len(batch))
	stopping := ctx.Err() != nil
	// Judged on each lane's first entry sent: the later entries of a key that a destination
	// keeping the key's order fails behind it share its error without the call failing whole.
	var leads []error
	seen := map[*lane]bool{}
	for j, i := range sent {
		if l := batch[i].lane; !seen[l] {
			seen[l] = true
			leads = append(leads, sendErrs[j])
		}
	}
	wholeCall := wholeCallFailure(leads)
	answered, allRetryable := false, len(sent) > 0
	for i, err := range errs {
		if stored[i] != nil {
			if stopping {
				results[i].cancelled = true
			} else {
				results[i].err = stored[i]
			}
			continue
		}
		switch {
		case err == nil:
			answered = true
		case stopping:
			results[i].cancelled = mutant != mutantCancelledPublished
			allRetryable = false
		case IsPermanent(err):
			answered = true // the destination refused the row: it works
			results[i].err = err
		default:
			results[i].err = err
		}
	}
	if mutant == mutantLastFailedAcked {
		mutantAckLastFailed(results)
	}
	now := time.Now()
	switch {
	case answered:
		r.dests.succeeded(dest, now)
		r.book.release(dest, now)
	case !allRetryable:
		r.dests.abandoned(dest)
	default:
		// Every sent entry failed with a retryable error: the destination's failure if nothing
		// sent to it succeeded since these rows began failing; otherwise a call that failed as a
		// whole (a throttle) is still not the rows' fault, and only entries the destination
		// refused one by one count as attempts.
		if errors.Is(sendErrs[0], errSlowCall) {
			since = now // slow: the destination's failure, even if other calls to it succeeded
		}
		retryAt, outage := r.dests.failedWhole(dest, since, started, now, sendErrs[0])
		for i := range results {
			switch {
			case results[i].err == nil || stored[i] != nil:
			case outage:
				results[i].kind, results[i].retryAt = failOutage, retryAt
			case wholeCall:
				results[i].kind = failCall
			}
		}
	}
	return results
}

// wholeCallFailure reports whether errs is a publisher's answer to a call that failed as a
// whole with a retryable error: every entry carries the same error value, one that CallFailed
// made or, from any publisher, one shared by the entries of a call of several.
func wholeCallFailure(errs []error) bool {
	if len(errs) == 0 || errs[0] == nil || IsPermanent(errs[0]) {
		return false
	}
	for _, err := range errs {
		if err != errs[0] {
			return false
		}
	}
	var ce *callError
	return len(errs) > 1 || errors.As(errs[0], &ce)
}

// offload stores the payloads of batch's rows that the claim check offloads, several at once,
// and puts into events the pointer messages that replace them. It returns, per row, why its
// payload could not be stored (nil for the others).
func (r *Relay) offload(ctx context.Context, batch []entry, events []*Event) []error {
	errs := make([]error, len(batch))
	cc := r.cfg.ClaimCheck
	if cc == nil {
		return errs
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, offloadConcurrency)
	for i, e := range batch {
		if !e.o.offload {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			defer func() {
				if p := recover(); p != nil {
					errs[i] = fmt.Errorf("claim check: payload store panicked: %v", p)
				}
			}()
			e := events[i]
			sctx, cancel := context.WithTimeout(ctx, r.cfg.PublishTimeout)
			defer cancel()
			if err := cc.Store.PutPayload(sctx, cc.Bucket, cc.key(e), e.Payload); err != nil {
				errs[i] = fmt.Errorf("claim check: %w", err)
				return
			}
			events[i] = cc.offloaded(e)
		}()
	}
	wg.Wait()
	return errs
}

// errBehindFailure is the result of a row not sent because an earlier row of its key in the
// same call failed before the call; laneSet.finish leaves such a row unattempted.
var errBehindFailure = errors.New("not sent: an earlier row of its key in the call failed")

// offloadConcurrency bounds the claim check's uploads in flight for one call.
const offloadConcurrency = 8

func allPermanent(errs []error) bool {
	for _, err := range errs {
		if err == nil || !IsPermanent(err) {
			return false
		}
	}
	return true
}

// send makes one PublishBatch call, bounded by PublishTimeout, waiting for a free slot among
// PublishConcurrency; a call that becomes slow gives its slot back (see bulkhead.go), and one
// cut short for it fails whole with errSlowCall. A publisher that panics fails the call
// instead of the relay.
func (r *Relay) send(ctx context.Context, dest string, events []*Event, calls *roundCalls) (errs []error) {
	select {
	case r.inFlight <- struct{}{}:
	case <-ctx.Done():
		return CallFailed(len(events), ctx.Err())
	}
	var freeSlot sync.Once
	release := func() { freeSlot.Do(func() { <-r.inFlight }) }
	defer release()
	track := r.dests.callStarted(dest, time.Now())
	defer r.dests.callEnded(dest, track)
	cctx, ended := calls.begin(ctx, release)
	defer ended()
	pctx, cancel := context.WithTimeout(cctx, r.cfg.PublishTimeout)
	defer cancel()
	defer func() {
		if p := recover(); p != nil {
			errs = CallFailed(len(events), fmt.Errorf("publisher panicked: %v", p))
		}
	}()
	errs = r.cfg.Publisher.PublishBatch(pctx, dest, events)
	if mutant == mutantTimedOutAcked && errors.Is(pctx.Err(), context.DeadlineExceeded) && ctx.Err() == nil {
		errs = make([]error, len(events))
	}
	if len(errs) != len(events) {
		return CallFailed(len(events), fmt.Errorf("publisher returned %d results for %d events", len(errs), len(events)))
	}
	if errors.Is(context.Cause(cctx), errSlowCall) && ctx.Err() == nil {
		// Cut short: what the publisher still acknowledged stands; the rest failed with it.
		cut := CallFailed(1, errSlowCall)[0]
		for i, err := range errs {
			if err != nil {
				errs[i] = cut
			}
		}
	}
	return errs
}
