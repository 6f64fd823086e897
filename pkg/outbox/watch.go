package outbox

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
)

// watcher fills a relay's key book. It polls for rows committed since it last looked (one
// primary-key range scan, whatever the backlog), and sweeps: walks every pending partition key
// and reads its head row, to find what polling cannot see (keys of a relay that died, backoffs
// that ended, rows made pending again, rows that committed long after their id was taken).
// Wakes relays without any trigger in the producers' commits.
type watcher struct {
	r *Relay

	mu       sync.Mutex // one poll at a time; guards the fields below
	started  bool
	frontier int64               // every row with an id up to it has been seen or is a gap
	gaps     map[int64]time.Time // ids below the frontier not seen yet, and since when
	// epoch is outbox_control.admin_epoch as last polled: when an operator action moves it, the
	// relay walks every key again (rows became pending again, parked keys may move).
	epoch    int64
	lastPoll time.Time
	// pg14: the server has idle_session_timeout and client_connection_check_interval
	// (PostgreSQL 14+).
	pg14 bool

	sweepMu   sync.Mutex // one sweep at a time
	sweepWant chan struct{}
	// sweptAt is when the last sweep started (unix nanoseconds), sweepTook how long the last
	// finished one took (nanoseconds): the sweep's deadline (sweepPeriod).
	sweptAt, sweepTook atomic.Int64
	// sweepWork counts the heads the sweep under way read that could move (not quarantined),
	// with sweepMu held; sweptWork is that count for the last sweep, -1 when it failed: whether
	// the WAL stream may stand in for the next (walFollower.quiet).
	sweepWork int64
	sweptWork atomic.Int64
	// sweptWAL is the server's WAL flush position read just before the last sweep's walk
	// while the relay followed the WAL (0 otherwise): the stream stands in for the next sweep
	// only once it delivered the WAL past it.
	sweptWAL atomic.Uint64

	// pageRows is the most rows one poll reads: pollRows (the fault simulator sets a few, so
	// that its small outboxes page and its passes jump their frontier).
	pageRows int
}

// Limits of one poll and one sweep step.
const (
	// pollRows is the most new rows one poll query returns (more are read by the next query).
	pollRows = 10000
	// maxGaps bounds the ids a relay watches for late commits; beyond it, sweeps find them.
	maxGaps = 4096
	// gapTimeout is how long an id missing below the frontier is watched: a transaction open
	// longer than that is found by a sweep.
	gapTimeout = 30 * time.Second
	// sweepKeys is the most keys one sweep statement walks.
	sweepKeys = 2000
)

func newWatcher(r *Relay) *watcher {
	return &watcher{r: r, gaps: map[int64]time.Time{}, sweepWant: make(chan struct{}, 1), pageRows: pollRows}
}

// readOnly runs b's statements in one read-only transaction opened with readSettings, in one
// round trip: BEGIN, the settings, b's statements and COMMIT go to the server as one batch. A
// batch that fails leaves its connection in a failed transaction, which the pool closes
// instead of reusing.
func (w *watcher) readOnly(ctx context.Context, b *pgx.Batch) error {
	conn, err := w.r.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	all := &pgx.Batch{}
	for _, q := range readSettings(w.r.cfg.Lease, dedicated(conn.Conn(), w.r.cfg.Lease)) {
		all.Queue(q)
	}
	all.QueuedQueries = append(all.QueuedQueries, b.QueuedQueries...)
	all.Queue("COMMIT")
	return conn.SendBatch(ctx, all).Close()
}

// start sets the frontier at the newest row (older ones are the sweep's) and reads what the
// server supports. It does nothing once it succeeded.
func (w *watcher) start(ctx context.Context) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.started {
		return nil
	}
	var version int
	b := &pgx.Batch{}
	b.Queue(`SELECT current_setting('server_version_num')::int`).QueryRow(func(row pgx.Row) error { return row.Scan(&version) })
	b.Queue(maxIDSQL).QueryRow(func(row pgx.Row) error { return row.Scan(&w.frontier) })
	b.Queue(epochSQL).QueryRow(func(row pgx.Row) error { return row.Scan(&w.epoch) })
	err := w.readOnly(ctx, b)
	if err != nil {
		return fmt.Errorf("start relay: read the outbox's state (are the migrations applied?): %w", err)
	}
	w.pg14 = version >= 140000
	w.started = true
	if mutant == mutantJumpSkipsLate {
		mutantJumped(ctx, w, 0, w.frontier)
	}
	return nil
}

// poll reads every row committed since the last poll into the book. When an operator action
// changed the outbox (the epoch moved), it unparks the book's keys and asks for a sweep.
func (w *watcher) poll(ctx context.Context) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.pollOn(ctx, w.pageRows)
}

// pollOn polls again while the last poll came back full (n rows after the frontier), with
// w.mu held.
func (w *watcher) pollOn(ctx context.Context, n int) error {
	for n >= w.pageRows {
		var err error
		if n, err = w.pollOnce(ctx); err != nil {
			return fmt.Errorf("poll outbox for new rows: %w", err)
		}
	}
	return nil
}

// pollIfDue polls unless another poll runs or the last one is younger than PollInterval.
func (w *watcher) pollIfDue(ctx context.Context) error {
	if !w.mu.TryLock() {
		return nil
	}
	due := time.Since(w.lastPoll) >= w.r.cfg.PollInterval
	w.mu.Unlock()
	if !due {
		return nil
	}
	return w.poll(ctx)
}

type polledRow struct {
	id        int64
	key       string
	topic     string
	published bool
}

func (w *watcher) pollOnce(ctx context.Context) (int, error) {
	b := &pgx.Batch{}
	p := w.queuePoll(b)
	if err := w.readOnly(ctx, b); err != nil {
		return 0, err
	}
	return w.applyPoll(p), nil
}

// pollRead is what one poll read: the rows after the frontier and the missing ids, and the
// epoch. Filled when its batch is closed.
type pollRead struct {
	at    time.Time
	rows  *[]polledRow
	epoch *int64
}

// queuePoll queues one poll's statements on b (with w.mu held).
func (w *watcher) queuePoll(b *pgx.Batch) pollRead {
	now := time.Now()
	for id, since := range w.gaps {
		if now.Sub(since) > gapTimeout {
			delete(w.gaps, id)
		}
	}
	gapIDs := make([]int64, 0, len(w.gaps))
	for id := range w.gaps {
		gapIDs = append(gapIDs, id)
	}
	p := pollRead{at: now, rows: new([]polledRow), epoch: new(int64)}
	b.Queue(pollSQL, w.frontier, w.pageRows, gapIDs).Query(func(rs pgx.Rows) error {
		var r polledRow
		_, err := pgx.ForEachRow(rs, []any{&r.id, &r.key, &r.topic, &r.published}, func() error {
			*p.rows = append(*p.rows, r)
			return nil
		})
		return err
	})
	b.Queue(epochSQL).QueryRow(func(row pgx.Row) error { return row.Scan(p.epoch) })
	return p
}

// applyPoll records what a poll read in the book and the frontier, and returns how many rows
// after the frontier it saw (with w.mu held).
func (w *watcher) applyPoll(p pollRead) int {
	now, rows, epoch := p.at, *p.rows, *p.epoch
	w.lastPoll = now
	if epoch != w.epoch {
		w.epoch = epoch
		w.r.book.reset(now)
		w.wantSweep()
	}
	slices.SortFunc(rows, func(a, b polledRow) int { return cmp.Compare(a.id, b.id) })
	fresh := 0
	for _, p := range rows {
		if p.id <= w.frontier {
			delete(w.gaps, p.id) // a late commit
		} else {
			fresh++
			for missing := w.frontier + 1; missing < p.id && len(w.gaps) < maxGaps; missing++ {
				w.gaps[missing] = now
			}
			w.frontier = p.id
		}
		if !p.published {
			w.r.book.sawRow(p.key, w.r.destinationOf(p.topic), now)
		}
	}
	if w.r.book.takeOverflow() {
		w.wantSweep()
	}
	return fresh
}

// pollEvery is how long Run's watcher waits between polls: PollInterval; RescanInterval while
// the WAL stream tells the relay of new rows but not of operator actions (walFollower, before
// PostgreSQL 14), for the epoch; and never while it tells of both (ok false), until it ends.
// The one place that decides how often Run polls: whenever the stream is not followed, it is
// PollInterval.
func (w *watcher) pollEvery() (every time.Duration, ok bool) {
	switch {
	case w.r.wal.carriesEpochs():
		return 0, false
	case w.r.wal.following():
		return max(w.r.cfg.PollInterval, w.r.cfg.RescanInterval), true
	}
	return w.r.cfg.PollInterval, true
}

// skipTo moves the frontier up to id, the highest row the WAL stream reported, when the relay
// stops following it: the polls that follow start there, not where the last poll before the
// stream left it, and the sweep that comes with the switch finds what the stream missed below.
func (w *watcher) skipTo(id int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.frontier = max(w.frontier, id)
}

// pollAndSweep is RunOnce's look at the outbox, a poll and then a sweep: the first poll and
// the first sweep step share one read-only transaction (one round trip, where each in its own
// took two), and the sweep goes on while a step came back full (sweepOn). A first poll that
// came back full (a backlog) is not paged through as polling does: the sweep walks every
// pending key, the backlog's among them, so the frontier moves to the outbox's newest row as a
// relay's start sets it, one round trip where paging took one per pollRows rows before the
// pass's first claim. The newest row is read in the same batch, before the sweep's statement:
// a row at or below it that had committed by then is in the sweep's walk, and one that
// commits later (a late commit below the jump) is found by the next sweep, which a pass makes
// on the sweep's deadline (sweepDue) however long it runs.
func (w *watcher) pollAndSweep(ctx context.Context) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.sweepMu.Lock()
	defer w.sweepMu.Unlock()
	started := time.Now()
	b := &pgx.Batch{}
	p := w.queuePoll(b)
	var newest int64
	b.Queue(maxIDSQL).QueryRow(func(row pgx.Row) error { return row.Scan(&newest) })
	s := queueSweep(b, "", true)
	if err := w.readOnly(ctx, b); err != nil {
		return fmt.Errorf("poll outbox for new rows and walk pending partition keys: %w", err)
	}
	if w.applyPoll(p) >= w.pageRows {
		if mutant == mutantJumpSkipsLate {
			// Once this sweep walked: later sweeps skip the ids the jump passed over uncommitted.
			defer mutantJumped(ctx, w, w.frontier, newest)
		}
		w.frontier = max(w.frontier, newest)
	}
	w.sweepWork = 0
	n, last := w.applySweep(s)
	err := w.sweepOn(ctx, n, last)
	w.sweepEnded(started, err)
	return err
}

// sweepPeriod is how long after a sweep began the next one is due: RescanInterval, spaced out
// to at least ten times the last sweep's duration, so that a walk slowed by dead index entries
// that VACUUM cannot remove yet never takes more than a tenth of the time.
func (w *watcher) sweepPeriod() time.Duration {
	return max(w.r.cfg.RescanInterval, 10*time.Duration(w.sweepTook.Load()))
}

// untilSweep is how long until the next sweep is due (0 or less: due).
func (w *watcher) untilSweep() time.Duration {
	return w.sweepPeriod() - time.Since(time.Unix(0, w.sweptAt.Load()))
}

// sweepDue reports whether a sweep is due: the sweep's deadline, which Run's watcher and
// RunPass's pipelines both keep, whatever else the relay does.
func (w *watcher) sweepDue() bool { return w.untilSweep() <= 0 }

// sweepEnded records a sweep that began at started and just ended with err (with w.sweepMu
// held).
func (w *watcher) sweepEnded(started time.Time, err error) {
	w.sweptAt.Store(started.UnixNano())
	w.sweepTook.Store(int64(time.Since(started)))
	if err != nil {
		w.sweepWork = -1
	}
	w.sweptWork.Store(w.sweepWork)
}

// streamStandsIn reports whether the WAL stream stands in for the sweep that is due
// (walFollower.quiet).
func (w *watcher) streamStandsIn() bool {
	return w.r.wal.quiet(time.Unix(0, w.sweptAt.Load()), pglogrepl.LSN(w.sweptWAL.Load()), w.sweptWork.Load())
}

// walFlushSQL reads the server's WAL flush position, as a number.
const walFlushSQL = `SELECT (pg_current_wal_flush_lsn() - '0/0')::bigint`

func (w *watcher) wantSweep() {
	select {
	case w.sweepWant <- struct{}{}:
	default:
	}
}

// sweepWanted takes a pending request for a sweep, if any (RunOnce sweeps itself).
func (w *watcher) sweepWanted() bool {
	select {
	case <-w.sweepWant:
		return true
	default:
		return false
	}
}

// sweep walks every pending key once and records its head in the book.
func (w *watcher) sweep(ctx context.Context) error {
	w.sweepMu.Lock()
	defer w.sweepMu.Unlock()
	return w.sweepLocked(ctx)
}

// sweepIfFree sweeps unless another sweep is under way (which then is the due one).
func (w *watcher) sweepIfFree(ctx context.Context) error {
	if !w.sweepMu.TryLock() {
		return nil
	}
	defer w.sweepMu.Unlock()
	return w.sweepLocked(ctx)
}

// sweepLocked sweeps with w.sweepMu held.
func (w *watcher) sweepLocked(ctx context.Context) error {
	started := time.Now()
	w.sweepWork = 0
	// Following the WAL, the walk's first step reads where the WAL ends first (walFollower.quiet).
	var walAt int64
	b := &pgx.Batch{}
	if w.r.wal.following() {
		b.Queue(walFlushSQL).QueryRow(func(row pgx.Row) error { return row.Scan(&walAt) })
	}
	s := queueSweep(b, "", true)
	err := w.readOnly(ctx, b)
	if err == nil {
		n, last := w.applySweep(s)
		err = w.sweepOn(ctx, n, last)
	}
	w.sweptWAL.Store(uint64(walAt))
	w.sweepEnded(started, err)
	if err != nil {
		return fmt.Errorf("walk pending partition keys: %w", err)
	}
	return nil
}

// sweepOn walks on after last while the last step came back full (n keys), with w.sweepMu held.
func (w *watcher) sweepOn(ctx context.Context, n int, last string) error {
	for n >= sweepKeys {
		var err error
		if n, last, err = w.sweepStep(ctx, last, false); err != nil {
			return fmt.Errorf("walk pending partition keys: %w", err)
		}
	}
	return nil
}

// sweepStep walks up to sweepKeys keys from after and returns how many it saw and the last one.
func (w *watcher) sweepStep(ctx context.Context, after string, inclusive bool) (int, string, error) {
	b := &pgx.Batch{}
	s := queueSweep(b, after, inclusive)
	if err := w.readOnly(ctx, b); err != nil {
		return 0, "", err
	}
	n, last := w.applySweep(s)
	return n, last, nil
}

// sweptHead is a pending key's head row as a sweep step read it.
type sweptHead struct {
	key         string
	id          int64
	topic       string
	quarantined bool
	availableAt *time.Time
	dbNow       time.Time
}

// sweepRead is what one sweep step read, filled when its batch is closed.
type sweepRead struct{ heads *[]sweptHead }

// queueSweep queues one sweep step, up to sweepKeys keys from after, on b.
func queueSweep(b *pgx.Batch, after string, inclusive bool) sweepRead {
	s := sweepRead{heads: new([]sweptHead)}
	b.Queue(sweepSQL, after, inclusive, sweepKeys).Query(func(rows pgx.Rows) error {
		var h sweptHead
		_, err := pgx.ForEachRow(rows, []any{&h.key, &h.id, &h.topic, &h.quarantined, &h.availableAt, &h.dbNow}, func() error {
			*s.heads = append(*s.heads, h)
			return nil
		})
		return err
	})
	return s
}

// applySweep records the heads a sweep step read in the book and returns how many it saw and
// the last key (with w.sweepMu held).
func (w *watcher) applySweep(s sweepRead) (int, string) {
	heads := *s.heads
	now := time.Now()
	for _, h := range heads {
		if (mutant == mutantSweepAboveFrontier && h.id <= w.frontier) || (mutant == mutantJumpSkipsLate && mutantSkipHead(w, h.id)) {
			continue
		}
		state, at, dest := headClaimable, now, w.r.destinationOf(h.topic)
		switch {
		case h.quarantined:
			state = headQuarantined
		case h.availableAt != nil && h.availableAt.After(h.dbNow):
			// The database's clock decides; translate its wait into ours.
			state, at = headBackingOff, now.Add(h.availableAt.Sub(h.dbNow))
		case dest != "" && !w.r.dests.healthy(dest):
			state = headHeld // its destination fails or is slow: its probe or answer moves it
		}
		if state != headQuarantined {
			w.sweepWork++
		}
		w.r.book.sawHead(h.key, state, at, dest, now)
	}
	if len(heads) == 0 {
		return 0, ""
	}
	return len(heads), heads[len(heads)-1].key
}

// run polls every PollInterval and sweeps on the sweep's deadline (sweepPeriod), until ctx
// ends.
func (w *watcher) run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		var switched chan struct{}
		if w.r.wal != nil {
			switched = w.r.wal.switched
		}
		for {
			if err := w.poll(ctx); err != nil && ctx.Err() == nil {
				w.r.log.Warn("relay poll failed; retrying", "error", err)
			}
			var tick <-chan time.Time
			every, ok := w.pollEvery()
			t := time.NewTimer(every)
			if ok {
				tick = t.C
			}
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-tick:
			case <-switched: // the WAL stream stopped: poll at once
			}
			t.Stop()
		}
	}()
	go func() {
		defer wg.Done()
		wanted := true
		for ctx.Err() == nil {
			// A sweep asked for (a start, a switch, an operator action, an overflow) is made;
			// one merely due is not while the WAL stream stands in for it.
			quiet := !wanted && w.streamStandsIn()
			if !quiet {
				if err := w.sweep(ctx); err != nil && ctx.Err() == nil {
					w.r.log.Warn("relay sweep failed; retrying", "error", err)
				}
			}
			wait := max(w.untilSweep(), time.Millisecond)
			if quiet {
				wait = w.sweepPeriod() // look again then whether the stream still stands in
			}
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
			case <-w.sweepWant:
				wanted = true
			case <-t.C:
				wanted = false
			}
			t.Stop()
		}
	}()
	wg.Wait()
}
