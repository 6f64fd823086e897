package outbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// WAL wake-up (docs/outbox.md, "WAL wake-up"): the database tells Run which rows committed.
// The stream is a wake-up, never the truth: what a round claims is read from the outbox under
// its locks as always, so a change the stream misses or repeats costs latency, never order or
// a row. Its invariants: while the stream is not followed, the relay polls every PollInterval
// (watcher.pollEvery), and every switch between the two is followed by a sweep; while it is
// followed, a sweep is skipped only when the stream stands in for it (walFollower.quiet): the
// last sweep found nothing that could move, and nothing changed since long enough before it.

// WALWake turns on the WAL wake-up: Run follows a logical replication slot on outbox_event's
// inserts and makes each committed row's key due at once, in commit order, instead of waiting
// for the next poll. While it follows, it does not poll (before PostgreSQL 14, which cannot
// carry operator actions on the stream, it polls every RescanInterval), and once a walk of the
// pending keys found nothing to move, the stream stands in for the next walks until it reports
// a change: an idle outbox costs no statements. When the stream
// cannot be followed (wal_level is not logical, the role lacks REPLICATION or rds_replication,
// a proxy that carries no replication connections, a failover, the walsender ended), Run polls
// every PollInterval at once, says so in a log line and the WALWakeActive metric, and tries the
// stream again after RetryAfter.
type WALWake struct {
	// Publication is the publication of outbox_event's inserts the slot follows. Defaults to
	// "sluice_outbox". Created when missing if the relay's role owns outbox_event; otherwise
	// its owner creates it once (docs/outbox.md gives the statement).
	Publication string
	// RetryAfter is how long after the stream failed the relay tries it again. Defaults to 10s.
	RetryAfter time.Duration
	// StatusInterval is how often the relay confirms the slot's position to the server (it
	// needs no history, so it confirms everything it received). Defaults to 1s.
	StatusInterval time.Duration
}

func (w WALWake) withDefaults() WALWake {
	if w.Publication == "" {
		w.Publication = "sluice_outbox"
	}
	if w.RetryAfter <= 0 {
		w.RetryAfter = 10 * time.Second
	}
	if w.StatusInterval <= 0 {
		w.StatusInterval = time.Second
	}
	return w
}

// walFollower follows the slot for one relay. It owns the stream's state: whether it is
// followed now (active), read by the watcher's poll loop.
type walFollower struct {
	r   *Relay
	cfg WALWake

	mu     sync.Mutex
	active bool
	// since is when the stream followed now began to be followed; epochs whether it carries
	// operator actions' epoch moves (PostgreSQL 14+: pgoutput's messages).
	since  time.Time
	epochs bool
	// changed is when the stream last reported a change (a committed transaction's rows or an
	// epoch move), whether or not the change then woke anything; maxID the highest row id it
	// reported.
	changed time.Time
	maxID   int64
	// decoded is how far the stream has delivered the WAL: every transaction that committed
	// before it was reported.
	decoded pglogrepl.LSN
	// warned: the failure of the stream was logged since it was last followed.
	warned bool
	// switched is signalled (without blocking) when the stream stops being followed, so that
	// the poll loop polls at once instead of at the end of its long interval.
	switched chan struct{}
	// woken counts the rows the stream made due (for tests and the status).
	woken int64
	// recheck are, per stage of walRewakes, the keys to wake again at that stage's next timer
	// (see wake), each with its destination and the highest id the stream reported of it: a
	// round that read that row since drops the key from every stage (sawRows).
	recheck      [len(walRewakes)]map[string]walRecheck
	recheckArmed [len(walRewakes)]bool

	// tap, when set, is handed each committed transaction's rows in place of waking their keys,
	// with the function that wakes them: the fault simulator's seam (sim_stream_test.go), which
	// drops, repeats and delays changes through it. Set before Run; nil outside the simulator.
	tap func(rows []walInsert, wake func([]walInsert))
}

// walVisibilityGrace is how long after the stream woke a key it is woken once more. PostgreSQL
// sends a transaction's commit to the stream once its commit record is flushed, a moment
// before the committing session makes it visible to other snapshots: a round the first wake
// started may read the key before its row shows and drop the key as drained.
const walVisibilityGrace = 20 * time.Millisecond

// walRewakes are the stages of the wakes that follow the stream's, each after the one before:
// most rows show within a couple of milliseconds of their change (a round the second wake
// starts then finds them), the rest by walVisibilityGrace. A key is woken again only while no
// round of the relay has read its reported row (sawRows): only a key whose row was not yet
// visible to the round the wake started costs a read more.
var walRewakes = [...]time.Duration{2 * time.Millisecond, walVisibilityGrace - 2*time.Millisecond}

// walRecheck is a key waiting for a re-wake: its destination, and the highest id the stream
// reported of it.
type walRecheck struct {
	dest string
	id   int64
}

func newWALFollower(r *Relay, cfg WALWake) *walFollower {
	return &walFollower{r: r, cfg: cfg.withDefaults(), switched: make(chan struct{}, 1)}
}

// following reports whether the stream is followed now.
func (f *walFollower) following() bool {
	if f == nil {
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.active
}

// carriesEpochs reports whether the stream is followed now and carries operator actions'
// epoch moves: then it tells the relay everything a poll would, and Run does not poll.
func (f *walFollower) carriesEpochs() bool {
	if f == nil {
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.active && f.epochs
}

// walQuietAfter is the least time between the stream's last change and the start of a sweep
// that lets the stream stand in for the next ones (quiet): a transaction's commit reaches the
// stream a moment before other sessions see its rows (walVisibilityGrace), and a sweep that
// began that moment too early would not see them.
const walQuietAfter = time.Second

// quiet reports whether the stream stands in for the sweep that is due, given the last sweep
// (begun at sweptAt, at the server's WAL position walAt, having read work heads that could
// move; -1 when it failed). It does when the stream, carrying epoch moves, has been followed
// since before that sweep began and has delivered the WAL past walAt (a stream that lags
// stands in for nothing), the sweep found no pending key but those behind a quarantined row,
// and the stream's last change came at least max(RescanInterval, walQuietAfter) before the
// sweep began. Then nothing is pending that the relay does not know of, and only a change can
// make something pending (a commit; an operator action, which moves the epoch; a row made
// pending again by hand-written SQL is the exception, found at the next change's sweeps): the
// first change ends the quiet, and the sweeps return on their deadline until a later sweep
// finds the outbox quiet again.
func (f *walFollower) quiet(sweptAt time.Time, walAt pglogrepl.LSN, work int64) bool {
	if f == nil {
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if mutant == mutantStreamComplete {
		return f.active
	}
	if work != 0 {
		return false
	}
	margin := max(f.r.cfg.RescanInterval, walQuietAfter)
	return f.active && f.epochs && walAt != 0 && f.decoded >= walAt && !sweptAt.Before(f.since) && sweptAt.Sub(f.changed) >= margin
}

// setActive records a switch between the stream and polling: each is logged once, followed by
// a sweep (what committed while neither looked is found), and a switch to polling moves the
// watcher's frontier past what the stream reported (watcher.skipTo: the sweep finds what it
// did not) and wakes the poll loop. A stream that cannot be followed is logged at its first
// failure since it was last followed, the relay's start included.
func (f *walFollower) setActive(active bool, epochs bool, why error) {
	f.mu.Lock()
	was, warned, maxID := f.active, f.warned, f.maxID
	f.active = active
	f.warned = !active
	if active {
		f.since, f.epochs, f.decoded = time.Now(), epochs, 0
	}
	f.mu.Unlock()
	if !active && !warned {
		f.r.log.Warn("relay: WAL wake-up unavailable; polling every PollInterval", "error", why, "retry_after", f.cfg.RetryAfter)
	}
	if was == active {
		return
	}
	if active {
		f.r.log.Info("relay: following the WAL for new rows", "publication", f.cfg.Publication, "operator_actions", epochs)
	} else {
		f.r.watch.skipTo(maxID)
		select {
		case f.switched <- struct{}{}:
		default:
		}
	}
	f.r.watch.wantSweep()
}

// run follows the stream until ctx ends, falling back to polling while it cannot.
func (f *walFollower) run(ctx context.Context) {
	for ctx.Err() == nil {
		err := f.follow(ctx)
		if ctx.Err() != nil {
			break
		}
		f.setActive(false, false, err)
		sleep(ctx, f.cfg.RetryAfter)
	}
	f.mu.Lock()
	f.active = false
	f.mu.Unlock()
}

// errWALEnded is follow's error when the server ended the stream without an error.
var errWALEnded = errors.New("the replication stream ended")

// follow connects for replication, makes sure the publication exists, creates a temporary slot
// (dropped by the server when the session ends: a relay that dies never leaves a slot holding
// WAL) and follows it until an error or ctx's end.
func (f *walFollower) follow(ctx context.Context) error {
	ccfg := f.r.pool.Config().ConnConfig.Config.Copy()
	if ccfg.RuntimeParams == nil {
		ccfg.RuntimeParams = map[string]string{}
	}
	ccfg.RuntimeParams["replication"] = "database"
	ccfg.RuntimeParams["application_name"] = "sluice-relay-wal"
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	conn, err := pgconn.ConnectConfig(cctx, ccfg)
	cancel()
	if err != nil {
		return fmt.Errorf("connect for replication: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))

	if err := f.prepare(ctx, conn); err != nil {
		return err
	}
	slot := "sluice_relay_" + randomHex(8)
	created, err := pglogrepl.CreateReplicationSlot(ctx, conn, slot, "pgoutput",
		pglogrepl.CreateReplicationSlotOptions{Temporary: true, SnapshotAction: "NOEXPORT_SNAPSHOT"})
	if err != nil {
		return fmt.Errorf("create a temporary replication slot: %w", err)
	}
	start, err := pglogrepl.ParseLSN(created.ConsistentPoint)
	if err != nil {
		return fmt.Errorf("replication slot's consistent point: %w", err)
	}
	args := []string{"proto_version '1'", "publication_names " + quoteLiteral(f.cfg.Publication)}
	// pgoutput sends logical decoding messages, the operator actions' epoch moves, from
	// PostgreSQL 14 on.
	epochs := serverMajor(conn) >= 14
	if epochs {
		args = append(args, "messages 'true'")
	}
	err = pglogrepl.StartReplication(ctx, conn, slot, start, pglogrepl.StartReplicationOptions{PluginArgs: args})
	if err != nil {
		return fmt.Errorf("start replication: %w", err)
	}
	f.setActive(true, epochs, nil)
	// Every transaction that committed before the slot's consistent point is visible (creating
	// the slot waited for them): the stream has nothing to deliver before it.
	f.delivered(start)
	return f.stream(ctx, conn, start)
}

// prepare checks the server can decode (wal_level=logical) and that the publication exists,
// creating it when missing (which takes ownership of outbox_event).
func (f *walFollower) prepare(ctx context.Context, conn *pgconn.PgConn) error {
	rows, err := conn.Exec(ctx, "SHOW wal_level").ReadAll()
	if err != nil {
		return fmt.Errorf("read wal_level: %w", err)
	}
	if len(rows) == 0 || len(rows[0].Rows) == 0 || string(rows[0].Rows[0][0]) != "logical" {
		return errors.New("wal_level is not logical (on RDS, set rds.logical_replication=1 in the parameter group)")
	}
	pub := quoteLiteral(f.cfg.Publication)
	rows, err = conn.Exec(ctx, "SELECT count(*) FROM pg_publication WHERE pubname = "+pub).ReadAll()
	if err != nil {
		return fmt.Errorf("look up publication %s: %w", f.cfg.Publication, err)
	}
	if len(rows) > 0 && len(rows[0].Rows) > 0 && string(rows[0].Rows[0][0]) != "0" {
		return nil
	}
	if _, err := conn.Exec(ctx, PublicationSQL(f.cfg.Publication)).ReadAll(); err != nil {
		return fmt.Errorf("create publication %s (its owner can run: %s): %w", f.cfg.Publication, PublicationSQL(f.cfg.Publication), err)
	}
	return nil
}

// PublicationSQL is the statement that creates the publication the WAL wake-up follows: only
// inserts, only the columns the wake-up reads (never the payload), through a partitioned
// outbox's root. outbox_event's owner runs it once when the relay's role may not.
func PublicationSQL(name string) string {
	return "CREATE PUBLICATION " + pgx.Identifier{name}.Sanitize() +
		" FOR TABLE outbox_event (id, topic, partition_key) WITH (publish = 'insert', publish_via_partition_root = true)"
}

// walEpochPrefix is the prefix of the logical decoding message an operator action's statement
// emits with its epoch move (bumpEpoch): the stream's word that rows became pending again.
const walEpochPrefix = "sluice.epoch"

// walInsert is a row the stream saw inserted, not yet committed.
type walInsert struct {
	id         int64
	key, topic string
}

// stream reads the slot's changes: a committed transaction's outbox rows make their keys due
// (keyBook.sawRow, as a poll would), in commit order. It confirms what it received every
// StatusInterval, and at once when the server asks.
func (f *walFollower) stream(ctx context.Context, conn *pgconn.PgConn, pos pglogrepl.LSN) error {
	relations := map[uint32]walColumns{}
	var pending []walInsert
	epochMoved := false
	nextStatus := time.Now().Add(f.cfg.StatusInterval)
	for {
		if !time.Now().Before(nextStatus) {
			err := pglogrepl.SendStandbyStatusUpdate(ctx, conn, pglogrepl.StandbyStatusUpdate{WALWritePosition: pos})
			if err != nil {
				return fmt.Errorf("confirm the slot's position: %w", err)
			}
			nextStatus = time.Now().Add(f.cfg.StatusInterval)
		}
		rctx, cancel := context.WithDeadline(ctx, nextStatus)
		msg, err := conn.ReceiveMessage(rctx)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if pgconn.Timeout(err) {
				continue
			}
			return fmt.Errorf("receive from the replication stream: %w", err)
		}
		var data []byte
		switch m := msg.(type) {
		case *pgproto3.CopyData:
			data = m.Data
		case *pgproto3.ErrorResponse:
			return fmt.Errorf("replication stream: %w", pgconn.ErrorResponseToPgError(m))
		case *pgproto3.CopyDone:
			return errWALEnded
		default:
			continue
		}
		if len(data) == 0 {
			continue
		}
		switch data[0] {
		case pglogrepl.PrimaryKeepaliveMessageByteID:
			ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(data[1:])
			if err != nil {
				return fmt.Errorf("parse keepalive: %w", err)
			}
			if len(pending) == 0 && ka.ServerWALEnd > pos {
				pos = ka.ServerWALEnd
			}
			if len(pending) == 0 {
				f.delivered(pos)
			}
			if ka.ReplyRequested {
				nextStatus = time.Time{}
			}
		case pglogrepl.XLogDataByteID:
			x, err := pglogrepl.ParseXLogData(data[1:])
			if err != nil {
				return fmt.Errorf("parse WAL data: %w", err)
			}
			lm, err := pglogrepl.Parse(x.WALData)
			if err != nil {
				return fmt.Errorf("parse pgoutput message: %w", err)
			}
			switch m := lm.(type) {
			case *pglogrepl.RelationMessage:
				relations[m.RelationID] = columnsOf(m)
			case *pglogrepl.InsertMessage:
				if c, ok := relations[m.RelationID]; ok && m.Tuple != nil {
					if ins, ok := c.read(m.Tuple); ok {
						pending = append(pending, ins)
					}
				}
			case *pglogrepl.LogicalDecodingMessage:
				if m.Prefix == walEpochPrefix {
					epochMoved = true
				}
			case *pglogrepl.CommitMessage:
				f.committed(pending, epochMoved)
				pending, epochMoved = pending[:0], false
				if m.TransactionEndLSN > pos {
					pos = m.TransactionEndLSN
					f.delivered(pos)
				}
			}
		}
	}
}

// delivered records that the stream delivered every transaction that committed before pos
// (a keepalive between transactions gives the walsender's position: what it has decoded).
func (f *walFollower) delivered(pos pglogrepl.LSN) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.decoded = max(f.decoded, pos)
}

// committed records a committed transaction's change and makes its rows' keys due (through
// the simulator's tap when set); when it moved the epoch, the book's parked keys may move and
// a sweep walks every key, as when a poll reads a new epoch.
func (f *walFollower) committed(rows []walInsert, epochMoved bool) {
	if len(rows) == 0 && !epochMoved {
		return
	}
	f.mu.Lock()
	f.changed = time.Now()
	for _, ins := range rows {
		f.maxID = max(f.maxID, ins.id)
	}
	f.mu.Unlock()
	if epochMoved {
		f.r.book.reset(time.Now())
		f.r.watch.wantSweep()
	}
	if len(rows) == 0 {
		return
	}
	if f.tap != nil {
		f.tap(slices.Clone(rows), f.wake)
		return
	}
	f.wake(rows)
}

// wake makes rows' keys due at once, and again at each stage of walRewakes.
func (f *walFollower) wake(rows []walInsert) {
	if len(rows) == 0 {
		return
	}
	if mutant == mutantStreamTrusted {
		mutantStreamChange(f.r, rows)
	}
	now := time.Now()
	for _, ins := range rows {
		f.r.book.sawRow(ins.key, f.r.destinationOf(ins.topic), now)
	}
	if f.r.book.takeOverflow() {
		f.r.watch.wantSweep()
	}
	keys := make(map[string]walRecheck, len(rows))
	for _, ins := range rows {
		keys[ins.key] = walRecheck{dest: f.r.destinationOf(ins.topic), id: max(keys[ins.key].id, ins.id)}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.woken += int64(len(rows))
	f.recheckAt(0, keys)
}

// recheckAt adds keys to stage's next wake, arming its timer (with f.mu held).
func (f *walFollower) recheckAt(stage int, keys map[string]walRecheck) {
	if len(keys) == 0 {
		return
	}
	if f.recheck[stage] == nil {
		f.recheck[stage] = map[string]walRecheck{}
	}
	for key, rc := range keys {
		rc.id = max(rc.id, f.recheck[stage][key].id)
		f.recheck[stage][key] = rc
	}
	if !f.recheckArmed[stage] {
		f.recheckArmed[stage] = true
		time.AfterFunc(walRewakes[stage], func() { f.wakeAgain(stage) })
	}
}

// wakeAgain wakes stage's keys once more, and passes them to the next stage: a key a round
// dropped as drained before its row became visible is due again, one a round holds is looked
// at again after it (keyBook.sawRow), one still due costs nothing.
func (f *walFollower) wakeAgain(stage int) {
	f.mu.Lock()
	keys := f.recheck[stage]
	f.recheck[stage], f.recheckArmed[stage] = nil, false
	if stage+1 < len(walRewakes) {
		f.recheckAt(stage+1, keys)
	}
	f.mu.Unlock()
	now := time.Now()
	for key, rc := range keys {
		f.r.book.sawRow(key, rc.dest, now)
	}
}

// sawRows drops from the re-wakes the keys whose reported row a round has read (rows: what a
// round read of the keys it locked): the row was visible, and its round's verdict decides
// what comes next for the key. Only a cost: a key woken again anyway costs one read.
func (f *walFollower) sawRows(rows []*claimedRow) {
	if f == nil || len(rows) == 0 {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for stage := range f.recheck {
		if len(f.recheck[stage]) == 0 {
			continue
		}
		for _, c := range rows {
			if rc, ok := f.recheck[stage][c.PartitionKey]; ok && c.ID >= rc.id {
				delete(f.recheck[stage], c.PartitionKey)
			}
		}
	}
}

// walColumns is where a relation's id, partition_key and topic are in its tuples (-1: absent).
type walColumns struct{ id, key, topic int }

func columnsOf(m *pglogrepl.RelationMessage) walColumns {
	c := walColumns{id: -1, key: -1, topic: -1}
	for i, col := range m.Columns {
		switch col.Name {
		case "id":
			c.id = i
		case "partition_key":
			c.key = i
		case "topic":
			c.topic = i
		}
	}
	return c
}

// read returns the row's key and topic, when the tuple carries both as text, and its id when
// it carries that (0 otherwise: only the fault simulator reads it).
func (c walColumns) read(t *pglogrepl.TupleData) (walInsert, bool) {
	text := func(i int) (string, bool) {
		if i < 0 || i >= len(t.Columns) || t.Columns[i].DataType != pglogrepl.TupleDataTypeText {
			return "", false
		}
		return string(t.Columns[i].Data), true
	}
	key, ok1 := text(c.key)
	topic, ok2 := text(c.topic)
	ins := walInsert{key: key, topic: topic}
	if id, ok := text(c.id); ok {
		ins.id, _ = strconv.ParseInt(id, 10, 64)
	}
	return ins, ok1 && ok2
}

// quoteLiteral quotes s as an SQL string literal.
func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
