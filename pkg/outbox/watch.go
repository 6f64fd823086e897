package outbox

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

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
	return &watcher{r: r, gaps: map[int64]time.Time{}, sweepWant: make(chan struct{}, 1)}
}

// readOnly runs fn in a read-only transaction opened with readSettings.
func (w *watcher) readOnly(ctx context.Context, fn func(pgx.Tx) error) error {
	tx, err := w.r.pool.BeginTx(ctx, pgx.TxOptions{BeginQuery: readSettings(w.r.cfg.Lease)})
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if err := fn(tx); err != nil {
		return err
	}
	return tx.Commit(ctx)
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
	err := w.readOnly(ctx, func(tx pgx.Tx) error {
		b := &pgx.Batch{}
		b.Queue(`SELECT current_setting('server_version_num')::int`).QueryRow(func(row pgx.Row) error { return row.Scan(&version) })
		b.Queue(maxIDSQL).QueryRow(func(row pgx.Row) error { return row.Scan(&w.frontier) })
		b.Queue(epochSQL).QueryRow(func(row pgx.Row) error { return row.Scan(&w.epoch) })
		return tx.SendBatch(ctx, b).Close()
	})
	if err != nil {
		return fmt.Errorf("start relay: read the outbox's state (are the migrations applied?): %w", err)
	}
	w.pg14 = version >= 140000
	w.started = true
	return nil
}

// poll reads every row committed since the last poll into the book. When an operator action
// changed the outbox (the epoch moved), it unparks the book's keys and asks for a sweep.
func (w *watcher) poll(ctx context.Context) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	for {
		n, err := w.pollOnce(ctx)
		if err != nil {
			return fmt.Errorf("poll outbox for new rows: %w", err)
		}
		if n < pollRows {
			return nil
		}
	}
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
	published bool
}

func (w *watcher) pollOnce(ctx context.Context) (int, error) {
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
	var (
		rows  []polledRow
		epoch int64
	)
	err := w.readOnly(ctx, func(tx pgx.Tx) error {
		b := &pgx.Batch{}
		b.Queue(pollSQL, w.frontier, pollRows, gapIDs).Query(func(rs pgx.Rows) error {
			var p polledRow
			_, err := pgx.ForEachRow(rs, []any{&p.id, &p.key, &p.published}, func() error {
				rows = append(rows, p)
				return nil
			})
			return err
		})
		b.Queue(epochSQL).QueryRow(func(row pgx.Row) error { return row.Scan(&epoch) })
		return tx.SendBatch(ctx, b).Close()
	})
	if err != nil {
		return 0, err
	}
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
			w.r.book.sawRow(p.key, now)
		}
	}
	if w.r.book.takeOverflow() {
		w.wantSweep()
	}
	return fresh, nil
}

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
	after, inclusive := "", true
	for {
		n, last, err := w.sweepStep(ctx, after, inclusive)
		if err != nil {
			return fmt.Errorf("walk pending partition keys: %w", err)
		}
		if n < sweepKeys {
			return nil
		}
		after, inclusive = last, false
	}
}

// sweepStep walks up to sweepKeys keys from after and returns how many it saw and the last one.
func (w *watcher) sweepStep(ctx context.Context, after string, inclusive bool) (int, string, error) {
	type head struct {
		key         string
		id          int64
		quarantined bool
		availableAt *time.Time
		dbNow       time.Time
	}
	var heads []head
	err := w.readOnly(ctx, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, sweepSQL, after, inclusive, sweepKeys)
		if err != nil {
			return err
		}
		var h head
		_, err = pgx.ForEachRow(rows, []any{&h.key, &h.id, &h.quarantined, &h.availableAt, &h.dbNow}, func() error {
			heads = append(heads, h)
			return nil
		})
		return err
	})
	if err != nil {
		return 0, "", err
	}
	now := time.Now()
	for _, h := range heads {
		state, at := headClaimable, now
		switch {
		case h.quarantined:
			state = headQuarantined
		case h.availableAt != nil && h.availableAt.After(h.dbNow):
			// The database's clock decides; translate its wait into ours.
			state, at = headBackingOff, now.Add(h.availableAt.Sub(h.dbNow))
		}
		w.r.book.sawHead(h.key, state, at, now)
	}
	if len(heads) == 0 {
		return 0, "", nil
	}
	return len(heads), heads[len(heads)-1].key, nil
}

// run polls every PollInterval and sweeps every RescanInterval (spaced out to at least ten
// times the last sweep's duration, so a walk slowed by dead index entries that VACUUM cannot
// remove yet never takes more than a tenth of the time), until ctx ends.
func (w *watcher) run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		t := time.NewTicker(w.r.cfg.PollInterval)
		defer t.Stop()
		for {
			if err := w.poll(ctx); err != nil && ctx.Err() == nil {
				w.r.log.Warn("relay poll failed; retrying", "error", err)
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			start := time.Now()
			if err := w.sweep(ctx); err != nil && ctx.Err() == nil {
				w.r.log.Warn("relay sweep failed; retrying", "error", err)
			}
			wait := max(w.r.cfg.RescanInterval, 10*time.Since(start))
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
			case <-w.sweepWant:
			case <-t.C:
			}
			t.Stop()
		}
	}()
	wg.Wait()
}
