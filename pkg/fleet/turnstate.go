package fleet

import (
	"context"
	"errors"
	"fmt"
	"net"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/sluicehq/sluice/pkg/outbox"
)

// TurnStateTable is the control table where a Fleet records its own view of each tenant
// (Config.TurnState): the last recorded turn, the backlog it read, failures and backoff, and
// how the activity poll sees the tenant's database. [CreateTurnStateTable] creates it,
// [ReadTurnStates] reads it: `sluice fleet status` and the console show it.
const TurnStateTable = "sluice_fleet_tenant_state"

// turnStateSchema is TurnStateTable's definition: a row per tenant, written only by the
// fleet's tenant goroutine that serves it (recordTurn).
const turnStateSchema = `CREATE TABLE IF NOT EXISTS ` + TurnStateTable + ` (
	tenant                 text PRIMARY KEY,
	shard                  text NOT NULL,
	state                  text NOT NULL,
	turn_started_at        timestamptz NOT NULL,
	turn_ended_at          timestamptz NOT NULL,
	published              bigint NOT NULL,
	worked_at              timestamptz,
	pending                bigint,
	oldest_pending_seconds double precision,
	quarantined            bigint,
	lag_at                 timestamptz,
	failures               int NOT NULL,
	error_class            text NOT NULL,
	last_error             text NOT NULL,
	backoff_until          timestamptz,
	detection              text NOT NULL,
	updated_at             timestamptz NOT NULL DEFAULT now()
)`

// CreateTurnStateTable creates TurnStateTable in the control database when it does not exist
// (`sluice fleet init` runs it beside CreateRegistryTable).
func CreateTurnStateTable(ctx context.Context, db Execer) error {
	if _, err := db.Exec(ctx, turnStateSchema); err != nil {
		return fmt.Errorf("create %s: %w", TurnStateTable, err)
	}
	return nil
}

// TurnState is a tenant's row of TurnStateTable: the fleet's view of it at its last recorded
// turn. A turn is recorded at once when it failed or changed the tenant's state, error class or
// detection, and on a tenant's first turn in a Fleet's process; a turn that published or moved
// the backlog is recorded when the last record is turnStateEvery (10 s) old, else its rows are
// counted into the next one; an idle tenant's sweeps that find nothing new write nothing.
type TurnState struct {
	Tenant string
	// Shard is the deployment that served the tenant, "I/N" (Config.Shard, Config.Shards).
	Shard string
	State TenantState
	// TurnStarted and TurnEnded bound the last recorded turn; Published counts the rows
	// published since the record before it (by that turn, and any turns not recorded between).
	TurnStarted time.Time
	TurnEnded   time.Time
	Published   int64
	// WorkedAt is when a recorded turn last published; zero when none did.
	WorkedAt time.Time
	// Lag is the tenant's backlog as the fleet last read it, at LagAt (zero: not read yet).
	Lag   outbox.Lag
	LagAt time.Time
	// Failures counts the failed turns in a row (0 after a turn that succeeded); ErrorClass and
	// LastError describe the last failure (LastError without passwords, at most 500 bytes);
	// BackoffUntil is when the failing tenant's next turn comes (zero when it is not failing).
	Failures     int
	ErrorClass   string
	LastError    string
	BackoffUntil time.Time
	// Detection is how the activity poll saw the tenant's database ("" when not known yet at
	// the turn): DetectSweepOnly means its writes wait for its sweep.
	Detection Detection
	// UpdatedAt is when the row was written (the control database's clock).
	UpdatedAt time.Time
}

// Took is how long the last recorded turn ran.
func (s TurnState) Took() time.Duration { return s.TurnEnded.Sub(s.TurnStarted) }

// SweepOnly reports whether the activity poll cannot see the tenant's database: its writes
// are published only when its sweep comes (SweepInterval/2 to SweepInterval).
func (s TurnState) SweepOnly() bool { return s.Detection == DetectSweepOnly }

// Error classes of TurnState.ErrorClass: what kind of failure a failed turn's was.
const (
	ErrorUnreachable = "unreachable" // no connection to the tenant's server (refused, DNS, TLS)
	ErrorAuth        = "auth"        // the server refused the credentials or the database
	ErrorSchema      = "schema"      // sluice's tables are missing or differ: not migrated
	ErrorTimeout     = "timeout"     // a statement or connection timed out
	ErrorDatabase    = "database"    // another PostgreSQL error
	ErrorRelay       = "relay"       // anything else (settings, the relay itself)
)

const (
	errorTextMost    = 500              // LastError's bound, in bytes
	turnStateTimeout = 2 * time.Second  // bounds a turn's write of its row
	turnStateRetry   = time.Minute      // how long a tenant writes nothing after a failed write
	turnStateEvery   = 10 * time.Second // the least time between two rows of a tenant's routine turns (turned)
)

// errorClassOf classifies a failed turn's error.
func errorClassOf(err error) string {
	var pg *pgconn.PgError
	var ne net.Error
	switch {
	case errors.As(err, &pg):
		switch {
		case pg.Code == "28P01" || pg.Code == "28000" || pg.Code == "3D000" || pg.Code == "42501":
			return ErrorAuth
		case strings.HasPrefix(pg.Code, "42"):
			return ErrorSchema
		case pg.Code == "57014":
			return ErrorTimeout
		}
		return ErrorDatabase
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return ErrorTimeout
	case pgconn.Timeout(err):
		return ErrorTimeout
	}
	var ce *pgconn.ConnectError
	var oe *net.OpError
	if errors.As(err, &ce) || errors.As(err, &oe) {
		return ErrorUnreachable
	}
	return ErrorRelay
}

var (
	urlPassword     = regexp.MustCompile(`(://[^:/@\s]*:)[^@\s]*@`)
	keywordPassword = regexp.MustCompile(`(?i)(password\s*=\s*)('[^']*'|\S+)`)
)

// redactError returns text without passwords (of URLs and key=value settings), at most
// errorTextMost bytes: a turn's error is read by operators from the control database.
func redactError(text string) string {
	text = urlPassword.ReplaceAllString(text, "${1}xxxxx@")
	text = keywordPassword.ReplaceAllString(text, "${1}xxxxx")
	if len(text) > errorTextMost {
		text = strings.ToValidUTF8(text[:errorTextMost], "") + "…"
	}
	return text
}

// turnRecord is what a tenant's goroutine remembers of its row of TurnStateTable (the tenant
// goroutine's own): the counts at its last turn, and what it last wrote.
type turnRecord struct {
	published int        // TenantStatus.Published when the row was last written
	written   *TurnState // the row as last written; nil before the first write of this process
	writtenAt time.Time  // when
	failed    bool       // the last write failed (logged once until one succeeds)
	// retryAt: after a failed write (a control database without the table, say), the tenant
	// writes nothing before it, so that a missing table costs a statement per tenant every
	// turnStateRetry, not one per turn.
	retryAt time.Time
}

// changed reports whether row says something the last written row does not: a turn that
// published or failed, another state, error class or detection (a detection becoming known
// as the normal DetectPoll does not count), another backlog.
func (r *turnRecord) changed(row TurnState) bool {
	w := r.written
	return r.turned(row) || row.Published > 0 || row.Lag.Pending != w.Lag.Pending || row.Lag.Quarantined != w.Lag.Quarantined
}

// turned reports whether row says something an operator must see at once: a first row, a
// failure, another state, error class or detection. Rows published and a backlog that moved
// are written at most every turnStateEvery (what a busy tenant's turns change).
func (r *turnRecord) turned(row TurnState) bool {
	w := r.written
	return w == nil || row.Failures > 0 || row.State != w.State || row.ErrorClass != w.ErrorClass ||
		(row.Detection != w.Detection && !(w.Detection == "" && row.Detection == DetectPoll))
}

// upsertTurnStateSQL writes a tenant's row; worked_at keeps its value when the turn published
// nothing.
const upsertTurnStateSQL = `INSERT INTO ` + TurnStateTable + ` AS s (tenant, shard, state, turn_started_at, turn_ended_at,
	published, worked_at, pending, oldest_pending_seconds, quarantined, lag_at, failures, error_class, last_error,
	backoff_until, detection, updated_at)
VALUES ($1, $2, $3, $4, $5::timestamptz, $6::bigint, CASE WHEN $6::bigint > 0 THEN $5::timestamptz END, $7, $8, $9, $10, $11, $12, $13, $14, $15, now())
ON CONFLICT (tenant) DO UPDATE SET shard = excluded.shard, state = excluded.state,
	turn_started_at = excluded.turn_started_at, turn_ended_at = excluded.turn_ended_at, published = excluded.published,
	worked_at = coalesce(excluded.worked_at, s.worked_at), pending = excluded.pending,
	oldest_pending_seconds = excluded.oldest_pending_seconds, quarantined = excluded.quarantined, lag_at = excluded.lag_at,
	failures = excluded.failures, error_class = excluded.error_class, last_error = excluded.last_error,
	backoff_until = excluded.backoff_until, detection = excluded.detection, updated_at = now()`

// recordTurn writes the tenant's row of TurnStateTable after a turn that ended with err, its
// next turn due at due, when Config.TurnState is set and the row would change (turnRecord.changed),
// a busy tenant's routine turns at most every turnStateEvery (turnRecord.turned): at most one
// statement per turn, none for an idle tenant's turn that found nothing new. A
// write that fails is logged (once until one succeeds) and changes nothing else: the record
// is only for operators, nothing the fleet does reads it.
func (t *tenant) recordTurn(ctx context.Context, err error, due time.Time) {
	db := t.f.cfg.TurnState
	if db == nil {
		return
	}
	s := t.snapshot()
	rec := &t.turnRecord
	row := TurnState{Tenant: t.t.Name, Shard: fmt.Sprintf("%d/%d", t.f.cfg.Shard, t.f.cfg.Shards), State: s.State,
		TurnStarted: time.Unix(0, t.turnStarted.Load()), TurnEnded: s.LastTurn, Published: int64(s.Published - rec.published),
		Lag: s.Lag, LagAt: s.LagAt, Failures: s.Failures, Detection: s.Detection}
	if row.TurnEnded.Before(row.TurnStarted) {
		row.TurnEnded = time.Now()
	}
	if err != nil {
		row.ErrorClass, row.LastError, row.BackoffUntil = errorClassOf(err), redactError(s.LastError), due
	}
	now := time.Now()
	if !rec.changed(row) || now.Before(rec.retryAt) || !rec.turned(row) && now.Sub(rec.writtenAt) < turnStateEvery {
		return
	}
	var pending, quarantined *int64
	var oldest *float64
	var lagAt *time.Time
	if !row.LagAt.IsZero() {
		pending, quarantined, lagAt = &row.Lag.Pending, &row.Lag.Quarantined, &row.LagAt
		o := row.Lag.OldestPendingAge.Seconds()
		oldest = &o
	}
	var backoff *time.Time
	if !row.BackoffUntil.IsZero() {
		backoff = &row.BackoffUntil
	}
	wctx, cancel := context.WithTimeout(ctx, turnStateTimeout)
	defer cancel()
	_, werr := db.Exec(wctx, upsertTurnStateSQL, row.Tenant, row.Shard, string(row.State), row.TurnStarted, row.TurnEnded,
		row.Published, pending, oldest, quarantined, lagAt, row.Failures, row.ErrorClass, row.LastError, backoff, string(row.Detection))
	if werr != nil {
		if !rec.failed && ctx.Err() == nil {
			t.f.log.Warn("fleet: record a tenant's turn in "+TurnStateTable+" (create it with `sluice fleet init`)", "tenant", t.t.Name, "error", werr)
		}
		rec.failed, rec.retryAt = true, time.Now().Add(turnStateRetry)
		return
	}
	rec.failed, rec.written, rec.writtenAt, rec.retryAt, rec.published = false, &row, now, time.Time{}, s.Published
}

// readTurnStatesSQL reads every row of TurnStateTable.
const readTurnStatesSQL = `SELECT tenant, shard, state, turn_started_at, turn_ended_at, published, worked_at, pending,
	oldest_pending_seconds, quarantined, lag_at, failures, error_class, last_error, backoff_until, detection, updated_at
FROM ` + TurnStateTable + ` ORDER BY tenant`

// ReadTurnStates reads every tenant's row of TurnStateTable in the control database db, by
// tenant name: the one reader of the fleet's own view, for `sluice fleet status` and the
// console.
func ReadTurnStates(ctx context.Context, db Querier) ([]TurnState, error) {
	rows, err := db.Query(ctx, readTurnStatesSQL)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", TurnStateTable, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (TurnState, error) {
		var (
			s                      TurnState
			state, detection       string
			worked, lagAt, backoff *time.Time
			pending, quarantined   *int64
			oldest                 *float64
		)
		err := r.Scan(&s.Tenant, &s.Shard, &state, &s.TurnStarted, &s.TurnEnded, &s.Published, &worked, &pending, &oldest,
			&quarantined, &lagAt, &s.Failures, &s.ErrorClass, &s.LastError, &backoff, &detection, &s.UpdatedAt)
		s.State, s.Detection = TenantState(state), Detection(detection)
		if worked != nil {
			s.WorkedAt = *worked
		}
		if backoff != nil {
			s.BackoffUntil = *backoff
		}
		if lagAt != nil && pending != nil && quarantined != nil && oldest != nil {
			s.LagAt = *lagAt
			s.Lag = outbox.Lag{Pending: *pending, Quarantined: *quarantined, OldestPendingAge: time.Duration(*oldest * float64(time.Second))}
		}
		return s, err
	})
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", TurnStateTable, err)
	}
	return out, nil
}
