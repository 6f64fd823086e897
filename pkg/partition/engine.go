package partition

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// keyKind is what a table's partitions are ranges of.
type keyKind int

const (
	// identityKey partitions are ranges of a bigint identity column (outbox_event.id), each sized
	// from the observed rate of new ids to fill in about one Interval.
	identityKey keyKind = iota + 1
	// timeKey partitions are ranges of a timestamptz column the table fills with now()
	// (inbox_event.received_at), one Interval each, aligned on multiples of Interval since the
	// Unix epoch (midnight UTC for a day).
	timeKey
)

// tableSpec describes one sluice table that can be partitioned.
type tableSpec struct {
	// Table is the table's name, resolved through the search path like every sluice statement.
	Table string
	// keyKind says what the partitions are ranges of.
	Kind keyKind
	// Column is the partition key: a bigint identity column (identityKey) or a timestamptz column
	// filled with now() (timeKey).
	Column string
	// TimeColumn is when a row was written (identityKey only): it measures the rate of new ids.
	TimeColumn string
	// Finished names what retention waits for, for reports: "published", "processed".
	Finished string
	// Unfinished is a query, with %[1]s the partition, that returns true while the partition
	// holds a row retention must keep whatever its age (unpublished, unprocessed). Each of its
	// scans must be answerable from a partial index, so that the answer costs an index descent.
	Unfinished string
	// Young is a query, with %[1]s the partition and $1 the cutoff, that returns true when a row
	// of the partition finished at or after the cutoff.
	Young string
	// FillFactor is the fillfactor of new partitions (0: PostgreSQL's default).
	FillFactor int
	// LocalUnique are the columns of a unique key PostgreSQL cannot enforce on the partitioned
	// table because it lacks the partition key: each new partition gets a unique index on them.
	LocalUnique []string
	// LocalOnly lists the unique indexes of the plain table that do not include the partition
	// key and that the conversion keeps on the former plain table only: name → what that means.
	// Any other such index makes the conversion refuse.
	LocalOnly map[string]string
	// ExtraIndexes are indexes the partitioned table has beyond the plain table's. The
	// conversion builds them CONCURRENTLY on the plain table first, so that attaching it as a
	// partition adopts them instead of building them under a lock.
	ExtraIndexes []extraIndex
	// PurgeRows deletes the rows of table (the default partition) that finished longer than
	// retention ago, batch rows per statement, and returns how many it deleted.
	PurgeRows func(ctx context.Context, q Querier, table string, retention time.Duration, batch int) (int64, error)
	// PurgeBatch is PurgeRows' batch during maintenance.
	PurgeBatch int
}

// extraIndex is an index definition: CREATE INDEX Name ON <table> Using.
type extraIndex struct {
	Name  string // e.g. "outbox_event_published_brin"
	Using string // e.g. "USING brin (published_at)"
}

// Bounds of a partition that reach MINVALUE or MAXVALUE.
const (
	minBound = math.MinInt64
	maxBound = math.MaxInt64
)

// tableInfo is how a table is stored.
type tableInfo struct {
	// Exists is false when the table is missing (the database is not migrated).
	Exists bool
	// Partitioned: the table is partitioned; Parts lists its partitions.
	Partitioned bool
	// Schema and Owner of the table.
	Schema, Owner string
	// Parts are the bounded partitions in key order, then the default partition.
	Parts []Partition
	// Bound is the upper bound a conversion put on the plain table's partition key and that
	// was not finished (0: none), and BoundValid whether it was validated.
	Bound      int64
	BoundValid bool
}

// Default returns the default partition, if any.
func (i tableInfo) Default() (Partition, bool) {
	for _, p := range i.Parts {
		if p.Default {
			return p, true
		}
	}
	return Partition{}, false
}

// bounded returns the partitions other than the default one, in key order.
func (i tableInfo) bounded() []Partition {
	var out []Partition
	for _, p := range i.Parts {
		if !p.Default {
			out = append(out, p)
		}
	}
	return out
}

// Errors that callers may branch on, matched with errors.Is.
var (
	// ErrNotMigrated: the table does not exist (run `sluice migrate`).
	ErrNotMigrated = errors.New("table does not exist (is the database migrated? run `sluice migrate`)")

	// ErrPartitioned: PlanConversion or Convert on a table that is already partitioned.
	ErrPartitioned = errors.New("table is already partitioned")
)

// qualified returns the table's schema-qualified, quoted name.
func (i tableInfo) qualified(name string) string { return pgx.Identifier{i.Schema, name}.Sanitize() }

// boundConstraint is the name of the CHECK a conversion puts on the plain table.
func (s tableSpec) boundConstraint() string { return s.Table + "_partition_bound" }

// lockKey serializes every partition change of one table (an advisory lock's key text).
func (s tableSpec) lockKey() string { return "sluice partitions " + s.Table }

// boundValue renders a bound in SQL: an integer or a timestamptz literal (UTC, ISO 8601).
func (s tableSpec) boundValue(v int64) string {
	switch {
	case v == minBound:
		return "MINVALUE"
	case v == maxBound:
		return "MAXVALUE"
	case s.Kind == timeKey:
		return "'" + time.UnixMicro(v).UTC().Format("2006-01-02T15:04:05.999999Z") + "'"
	}
	return fmt.Sprint(v)
}

// boundText renders a bound for people.
func (s tableSpec) boundText(v int64) string {
	switch {
	case v == minBound:
		return "MINVALUE"
	case v == maxBound:
		return "MAXVALUE"
	case s.Kind == timeKey:
		return time.UnixMicro(v).UTC().Format(time.RFC3339)
	}
	return fmt.Sprint(v)
}

// partName names the partition starting at from: <table>_p<from> with the id zero-padded to
// 19 digits (identityKey), or <table>_p<yyyymmdd>[_hhmm[ss]] (timeKey), so names sort in key order.
// The former plain table is <table>_p0.
func (s tableSpec) partName(from int64) string {
	if from == minBound {
		return s.Table + "_p0"
	}
	if s.Kind == timeKey {
		t := time.UnixMicro(from).UTC()
		switch {
		case t.Second() != 0 || t.Nanosecond() != 0:
			return s.Table + "_p" + t.Format("20060102_150405")
		case t.Hour() != 0 || t.Minute() != 0:
			return s.Table + "_p" + t.Format("20060102_1504")
		}
		return s.Table + "_p" + t.Format("20060102")
	}
	return fmt.Sprintf("%s_p%019d", s.Table, from)
}

// defaultName names the default partition.
func (s tableSpec) defaultName() string { return s.Table + "_default" }

// readInfo returns how the table is stored. It reads only the catalog.
func readInfo(ctx context.Context, q Querier, spec tableSpec) (tableInfo, error) {
	var (
		info tableInfo
		kind string
	)
	err := q.QueryRow(ctx, `
		SELECT n.nspname, c.relkind::text, pg_get_userbyid(c.relowner)
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE c.oid = to_regclass($1)`, spec.Table).Scan(&info.Schema, &kind, &info.Owner)
	if errors.Is(err, pgx.ErrNoRows) {
		return info, nil
	}
	if err != nil {
		return info, fmt.Errorf("read the catalog entry of %s: %w", spec.Table, err)
	}
	info.Exists = true
	switch kind {
	case "p":
		info.Partitioned = true
	case "r":
		// The bound is read back through the server, which parses its own output whatever its
		// DateStyle and TimeZone: CHECK ((id < 1000)), CHECK ((t < '...'::timestamp with time zone)),
		// followed by NOT VALID until it is validated.
		lit := `trim(both '''' FROM split_part(substring(pg_get_constraintdef(oid) FROM '< (.*?)\)\)(?: NOT VALID)?$'), '::', 1))`
		err := q.QueryRow(ctx, `SELECT `+spec.keyOf(lit)+`, convalidated FROM pg_constraint
			WHERE conrelid = to_regclass($1) AND conname = $2`, spec.Table, spec.boundConstraint()).Scan(&info.Bound, &info.BoundValid)
		if errors.Is(err, pgx.ErrNoRows) {
			return info, nil
		}
		if err != nil {
			return info, fmt.Errorf("read the partition bound of %s: %w", spec.Table, err)
		}
		return info, nil
	default:
		return info, fmt.Errorf("%s is not a table (relkind %q)", spec.Table, kind)
	}
	// Bounds come back as the server prints them; the server parses them again, so the session's
	// DateStyle and TimeZone do not matter.
	rows, err := q.Query(ctx, `
		SELECT c.relname, b.def = 'DEFAULT', c.reltuples::bigint,
		       CASE WHEN m[1] = 'MINVALUE' THEN NULL ELSE `+spec.keyOf("trim(both '''' FROM m[1])")+` END,
		       CASE WHEN m[2] = 'MAXVALUE' THEN NULL ELSE `+spec.keyOf("trim(both '''' FROM m[2])")+` END
		FROM pg_inherits i
		JOIN pg_class c ON c.oid = i.inhrelid
		CROSS JOIN LATERAL (SELECT pg_get_expr(c.relpartbound, c.oid) AS def) b
		LEFT JOIN LATERAL (SELECT regexp_match(b.def, '^FOR VALUES FROM \((.*)\) TO \((.*)\)$') AS m) r ON true
		WHERE i.inhparent = to_regclass($1)`, spec.Table)
	if err != nil {
		return info, fmt.Errorf("list the partitions of %s: %w", spec.Table, err)
	}
	parts, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Partition, error) {
		var (
			p        Partition
			from, to *int64
		)
		err := row.Scan(&p.Name, &p.Default, &p.Rows, &from, &to)
		p.From, p.To = minBound, maxBound
		if from != nil {
			p.From = *from
		}
		if to != nil {
			p.To = *to
		}
		return p, err
	})
	if err != nil {
		return info, fmt.Errorf("list the partitions of %s: %w", spec.Table, err)
	}
	slices.SortFunc(parts, func(a, b Partition) int {
		switch {
		case a.Default != b.Default:
			if a.Default {
				return 1
			}
			return -1
		case a.From < b.From:
			return -1
		case a.From > b.From:
			return 1
		}
		return 0
	})
	info.Parts = parts
	return info, nil
}

// keyOf converts a SQL text expression holding a bound as the server prints it to the key as
// an int64: the id, or Unix microseconds.
func (s tableSpec) keyOf(text string) string {
	if s.Kind == timeKey {
		return "(extract(epoch FROM (" + text + ")::timestamptz) * 1000000)::bigint"
	}
	return "(" + text + ")::bigint"
}

// Defaults of Options.
const (
	DefaultInterval = 24 * time.Hour
	DefaultAhead    = 2
	DefaultMinSize  = 10_000
	// DefaultLockTimeout is short because writers queue behind a waiting ACCESS EXCLUSIVE
	// request: a drop that cannot get its lock at once (a long transaction holds the table)
	// gives up after stalling writers for at most this long, and the next run tries again.
	DefaultLockTimeout = 200 * time.Millisecond
)

// withDefaults fills zero fields.
func (o Options) withDefaults() Options {
	if o.Interval == 0 {
		o.Interval = DefaultInterval
	}
	if o.Ahead == 0 {
		o.Ahead = DefaultAhead
	}
	if o.MinSize == 0 {
		o.MinSize = DefaultMinSize
	}
	if o.LockTimeout == 0 {
		o.LockTimeout = DefaultLockTimeout
	}
	return o
}

// validate reports every out-of-range option at once.
func (o Options) validate() error {
	var errs []error
	if o.Interval < time.Second {
		errs = append(errs, fmt.Errorf("Interval must be at least 1s, got %s", o.Interval))
	}
	if o.Interval%time.Second != 0 {
		errs = append(errs, fmt.Errorf("Interval must be a whole number of seconds, got %s", o.Interval))
	}
	if o.Ahead < 1 || o.Ahead > 100 {
		errs = append(errs, fmt.Errorf("Ahead must be between 1 and 100, got %d", o.Ahead))
	}
	if o.MinSize < 1 {
		errs = append(errs, fmt.Errorf("MinSize must be positive, got %d", o.MinSize))
	}
	if o.Size < 0 {
		errs = append(errs, fmt.Errorf("Size must not be negative, got %d", o.Size))
	}
	if o.Retention < 0 {
		errs = append(errs, fmt.Errorf("Retention must not be negative, got %s", o.Retention))
	}
	if o.LockTimeout < time.Millisecond {
		errs = append(errs, fmt.Errorf("LockTimeout must be at least 1ms, got %s", o.LockTimeout))
	}
	return errors.Join(errs...)
}

// maintainSpec creates partitions ahead (when create is true) and, when opts.Retention is
// positive, drops expired ones and deletes the expired rows of the default partition, batch
// rows per statement (0: spec.PurgeBatch). On a plain table it does nothing and says so.
func maintainSpec(ctx context.Context, db DB, spec tableSpec, opts Options, create bool, batch int) (Report, error) {
	var rep Report
	info, err := readInfo(ctx, db, spec)
	if err != nil {
		return rep, err
	}
	if !info.Exists {
		return rep, fmt.Errorf("%s: %w", spec.Table, ErrNotMigrated)
	}
	if !info.Partitioned {
		if info.Bound != 0 {
			rep.Warnings = append(rep.Warnings, fmt.Sprintf("a conversion of %s to a partitioned table started and did not finish: "+
				"its CHECK %s refuses rows with %s at or above %s; run the conversion again to finish it, or drop the constraint",
				spec.Table, spec.boundConstraint(), spec.Column, spec.boundText(info.Bound)))
		}
		return rep, nil
	}
	rep.Partitioned = true
	if create && !opts.DryRun {
		for range 200 {
			p, made, err := createNext(ctx, db, spec, opts)
			if isLockTimeout(err) {
				rep.Warnings = append(rep.Warnings, fmt.Sprintf("creating a partition of %s waited %s for its lock without getting it "+
					"(long transactions hold the table's default partition); the next run tries again", spec.Table, opts.LockTimeout))
				break
			}
			if err != nil {
				return rep, err
			}
			if !made {
				break
			}
			rep.Created = append(rep.Created, p)
		}
	}
	if opts.Retention > 0 {
		if err := dropExpired(ctx, db, spec, opts, &rep); err != nil {
			return rep, err
		}
	}
	if info, err = readInfo(ctx, db, spec); err != nil {
		return rep, err
	}
	if d, ok := info.Default(); ok && opts.Retention > 0 && !opts.DryRun {
		if batch <= 0 {
			batch = spec.PurgeBatch
		}
		rep.Purged, err = spec.PurgeRows(ctx, db, info.qualified(d.Name), opts.Retention, batch)
		if err != nil {
			return rep, fmt.Errorf("purge the default partition %s: %w", d.Name, err)
		}
		if info, err = readInfo(ctx, db, spec); err != nil {
			return rep, err
		}
	}
	if d, ok := info.Default(); ok && d.Rows > 0 {
		rep.Warnings = append(rep.Warnings, fmt.Sprintf("the default partition %s holds about %d rows: partitions were not created "+
			"ahead in time (is maintenance running?); they are purged row by row", d.Name, d.Rows))
	}
	return rep, nil
}

// inTx runs f in a READ COMMITTED transaction that holds the table's maintenance lock, with a
// lock timeout (a change that cannot get its lock gives up instead of queueing the table's
// users behind it) and sequential scans disabled (every check has an index plan).
func inTx(ctx context.Context, db DB, spec tableSpec, opts Options, f func(pgx.Tx) error) error {
	tx, err := db.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, fmt.Sprintf("SET TRANSACTION ISOLATION LEVEL READ COMMITTED; SET LOCAL lock_timeout = %d; SET LOCAL enable_seqscan = off",
		opts.LockTimeout.Milliseconds())); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", spec.lockKey()); err != nil {
		return err
	}
	if err := f(tx); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// isLockTimeout reports whether err is PostgreSQL's lock_timeout (55P03).
func isLockTimeout(err error) bool {
	var pg *pgconn.PgError
	return errors.As(err, &pg) && pg.Code == "55P03"
}

// position returns where new rows are: the highest id taken (identityKey: the identity
// sequence's last value when readable, else the highest id stored), or now (timeKey), as a key.
func position(ctx context.Context, q Querier, info tableInfo, spec tableSpec) (int64, error) {
	var pos int64
	if spec.Kind == timeKey {
		if err := q.QueryRow(ctx, "SELECT (extract(epoch FROM now()) * 1000000)::bigint").Scan(&pos); err != nil {
			return 0, fmt.Errorf("read the clock: %w", err)
		}
		return pos, nil
	}
	col := pgx.Identifier{spec.Column}.Sanitize()
	if err := q.QueryRow(ctx, "SELECT coalesce(max("+col+"), 0) FROM "+info.qualified(spec.Table)).Scan(&pos); err != nil {
		return 0, fmt.Errorf("read the highest %s of %s: %w", spec.Column, spec.Table, err)
	}
	var last *int64
	err := q.QueryRow(ctx, `SELECT CASE WHEN has_sequence_privilege(s, 'SELECT') THEN pg_sequence_last_value(s::regclass) END
		FROM pg_get_serial_sequence($1, $2) AS s WHERE s IS NOT NULL`, info.qualified(spec.Table), spec.Column).Scan(&last)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return 0, fmt.Errorf("read the identity sequence of %s.%s: %w", spec.Table, spec.Column, err)
	}
	if last != nil && *last > pos {
		pos = *last
	}
	return pos, nil
}

// size returns how many keys a new partition spans: Interval in microseconds (timeKey), or
// (identityKey) the ids the table takes in one Interval at the rate observed over about the
// last Interval, at least MinSize, or Size when set. It also returns that rate (ids per second, 0 unknown).
//
// The rate is measured on the primary key, without reading the table: from the newest id,
// it looks 10^3, 10^4, ... 10^9 ids back (one index descent each) and takes the farthest of
// those rows written less than an Interval ago (or the nearest when even that one is older).
func size(ctx context.Context, q Querier, info tableInfo, spec tableSpec, opts Options, pos int64) (int64, float64, error) {
	if spec.Kind == timeKey {
		return opts.Interval.Microseconds(), 0, nil
	}
	col, tcol := pgx.Identifier{spec.Column}.Sanitize(), pgx.Identifier{spec.TimeColumn}.Sanitize()
	backs := []int64{1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9}
	rows, err := q.Query(ctx, `
		SELECT s.id, extract(epoch FROM now() - s.t)::float8
		FROM unnest($2::bigint[]) WITH ORDINALITY AS k(back, n)
		CROSS JOIN LATERAL (SELECT `+col+` AS id, `+tcol+` AS t FROM `+info.qualified(spec.Table)+`
		                    WHERE `+col+` <= $1 - k.back ORDER BY `+col+` DESC LIMIT 1) s
		ORDER BY k.n`, pos, backs)
	if err != nil {
		return 0, 0, fmt.Errorf("measure the rate of new %s in %s: %w", spec.Column, spec.Table, err)
	}
	var (
		rate  float64
		found bool
		id    int64
		age   float64
	)
	_, err = pgx.ForEachRow(rows, []any{&id, &age}, func() error {
		if age <= 0 || pos <= id {
			return nil
		}
		// The nearest sample, replaced by farther ones while they were written within an Interval.
		if !found || age <= opts.Interval.Seconds() {
			rate, found = float64(pos-id)/age, true
		}
		return nil
	})
	if err != nil {
		return 0, 0, fmt.Errorf("measure the rate of new %s in %s: %w", spec.Column, spec.Table, err)
	}
	n := int64(math.Ceil(rate * opts.Interval.Seconds()))
	if n < opts.MinSize || rate == 0 {
		n = opts.MinSize
	}
	if opts.Size > 0 {
		n = opts.Size
	}
	return min(n, 1<<60), rate, nil
}

// alignUp returns the first multiple of step (microseconds since the epoch) strictly above t.
func alignUp(t, step int64) int64 { return (t/step + 1) * step }

// createNext creates the next partition the table needs, if any: the default partition when
// it is missing, else a partition after the last one while fewer than Ahead partitions lie
// entirely above where new rows are. A partition is created as a table of its own and then
// attached, which takes only a SHARE UPDATE EXCLUSIVE lock on the partitioned table (writers
// keep writing) and an ACCESS EXCLUSIVE lock on the default partition, which it checks holds
// no row of the new range.
func createNext(ctx context.Context, db DB, spec tableSpec, opts Options) (Partition, bool, error) {
	var (
		made Partition
		done bool
	)
	err := inTx(ctx, db, spec, opts, func(tx pgx.Tx) error {
		info, err := readInfo(ctx, tx, spec)
		if err != nil {
			return err
		}
		if !info.Partitioned {
			return nil
		}
		parent := info.qualified(spec.Table)
		if _, ok := info.Default(); !ok {
			name := spec.defaultName()
			if err := createTable(ctx, tx, spec, info, name); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, "ALTER TABLE "+parent+" ATTACH PARTITION "+info.qualified(name)+" DEFAULT"); err != nil {
				return fmt.Errorf("attach %s as the default partition of %s: %w", name, spec.Table, err)
			}
			made, done = Partition{Name: name, From: minBound, To: maxBound, Default: true}, true
			return nil
		}
		pos, err := position(ctx, tx, info, spec)
		if err != nil {
			return err
		}
		bounded := info.bounded()
		ahead := 0
		for _, p := range bounded {
			if p.From > pos {
				ahead++
			}
		}
		if ahead >= opts.Ahead {
			return nil
		}
		n, _, err := size(ctx, tx, info, spec, opts, pos)
		if err != nil {
			return err
		}
		from := int64(1)
		if len(bounded) > 0 {
			from = bounded[len(bounded)-1].To
		}
		if from <= pos || from == maxBound {
			// Behind: new rows already go to the default partition. Start above them (and
			// above what is written while this runs), so attaching finds none of the new
			// range in the default partition.
			if spec.Kind == timeKey {
				from = alignUp(pos, n)
			} else {
				from = pos + max(n/1440, 1000)
			}
		}
		to := from + n
		if spec.Kind == timeKey {
			to = alignUp(from, n)
		}
		name := spec.partName(from)
		if err := createTable(ctx, tx, spec, info, name); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "ALTER TABLE "+parent+" ATTACH PARTITION "+info.qualified(name)+
			" FOR VALUES FROM ("+spec.boundValue(from)+") TO ("+spec.boundValue(to)+")"); err != nil {
			return fmt.Errorf("attach %s to %s: %w", name, spec.Table, err)
		}
		made, done = Partition{Name: name, From: from, To: to}, true
		return nil
	})
	if err != nil {
		return Partition{}, false, fmt.Errorf("create a partition of %s: %w", spec.Table, err)
	}
	return made, done, nil
}

// createTable creates a table shaped like the partitioned table (columns, defaults, CHECK
// constraints, storage), with the table's fillfactor, its local unique index and the table's
// owner, ready to be attached.
func createTable(ctx context.Context, tx pgx.Tx, spec tableSpec, info tableInfo, name string) error {
	q := info.qualified(name)
	stmts := []string{"CREATE TABLE " + q + " (LIKE " + info.qualified(spec.Table) +
		" INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING STORAGE INCLUDING COMMENTS INCLUDING COMPRESSION)" + spec.with()}
	if len(spec.LocalUnique) > 0 {
		stmts = append(stmts, "CREATE UNIQUE INDEX "+pgx.Identifier{trunc(name + "_key")}.Sanitize()+" ON "+q+" ("+idents(spec.LocalUnique)+")")
	}
	stmts = append(stmts, "ALTER TABLE "+q+" OWNER TO "+pgx.Identifier{info.Owner}.Sanitize())
	for _, s := range stmts {
		if _, err := tx.Exec(ctx, s); err != nil {
			return fmt.Errorf("create %s: %s: %w", name, s, err)
		}
	}
	return nil
}

// with returns the storage clause of new partitions.
func (s tableSpec) with() string {
	if s.FillFactor == 0 {
		return ""
	}
	return fmt.Sprintf(" WITH (fillfactor = %d)", s.FillFactor)
}

func idents(cols []string) string {
	out := make([]string, len(cols))
	for i, c := range cols {
		out[i] = pgx.Identifier{c}.Sanitize()
	}
	return strings.Join(out, ", ")
}

// trunc cuts a name to PostgreSQL's 63 bytes.
func trunc(name string) string {
	if len(name) > 63 {
		return name[:63]
	}
	return name
}

// dropExpired drops every partition whose rows all finished before now - Retention: never the
// default partition, never one new rows may still go to, never one holding an unfinished row or
// a row that finished after the cutoff. Each candidate is first checked without locks (cheap
// index descents); a partition that passes is checked again, and dropped, in one transaction
// that holds an ACCESS EXCLUSIVE lock on the partitioned table (so no writer, such as a
// concurrent Replay, can change it between the check and the drop) for as long as the check
// takes, a few index descents.
func dropExpired(ctx context.Context, db DB, spec tableSpec, opts Options, rep *Report) error {
	info, err := readInfo(ctx, db, spec)
	if err != nil {
		return err
	}
	var (
		cutoff    time.Time
		cutoffKey int64
	)
	if err := db.QueryRow(ctx, "SELECT now() - $1 * interval '1 millisecond', (extract(epoch FROM now() - $1 * interval '1 millisecond') * 1000000)::bigint",
		opts.Retention.Milliseconds()).Scan(&cutoff, &cutoffKey); err != nil {
		return fmt.Errorf("read the clock: %w", err)
	}
	pos, err := position(ctx, db, info, spec)
	if err != nil {
		return err
	}
	for _, p := range info.bounded() {
		if spec.Kind == timeKey && p.To > cutoffKey {
			continue // rows received since the cutoff may be in it: they cannot have finished before it
		}
		if spec.Kind == identityKey && p.To-1 > pos {
			continue // new ids still go to it (or it lies ahead)
		}
		reason, err := keep(ctx, db, spec, info, p, cutoff, false)
		if err != nil {
			return err
		}
		if reason != "" {
			rep.Kept = append(rep.Kept, Kept{Partition: p, Reason: reason})
			continue
		}
		if opts.DryRun {
			rep.Dropped = append(rep.Dropped, p)
			continue
		}
		dropped := false
		err = inTx(ctx, db, spec, opts, func(tx pgx.Tx) error {
			parent, part := info.qualified(spec.Table), info.qualified(p.Name)
			if _, err := tx.Exec(ctx, "LOCK TABLE "+parent+", "+part+" IN ACCESS EXCLUSIVE MODE"); err != nil {
				return err
			}
			now, err := readInfo(ctx, tx, spec)
			if err != nil {
				return err
			}
			if !sameBounds(now.Parts, p) {
				return nil // changed meanwhile; the next run looks again
			}
			if reason, err = keep(ctx, tx, spec, info, p, cutoff, true); err != nil || reason != "" {
				return err
			}
			if _, err := tx.Exec(ctx, "DROP TABLE "+part); err != nil {
				return err
			}
			dropped = true
			return nil
		})
		switch {
		case isLockTimeout(err):
			rep.Kept = append(rep.Kept, Kept{Partition: p, Reason: fmt.Sprintf("busy: the lock to drop it was not granted within %s; the next run tries again", opts.LockTimeout)})
		case err != nil:
			return fmt.Errorf("drop partition %s of %s: %w", p.Name, spec.Table, err)
		case dropped:
			rep.Dropped = append(rep.Dropped, p)
		case reason != "":
			rep.Kept = append(rep.Kept, Kept{Partition: p, Reason: reason})
		}
	}
	return nil
}

// sameBounds reports whether parts still hold a partition named like p with p's bounds (the
// row estimate may have moved).
func sameBounds(parts []Partition, p Partition) bool {
	for _, q := range parts {
		if q.Name == p.Name && q.From == p.From && q.To == p.To && q.Default == p.Default {
			return true
		}
	}
	return false
}

// keep returns why partition p must be kept ("" when it may be dropped): an unfinished row, a
// row that finished at or after the cutoff, or (identityKey) a newest row written after it.
// Outside the drop's transaction (locked false), once no unfinished row keeps the partition, it
// summarizes the partition's BRIN indexes, so that the check under the lock reads only their
// summaries.
func keep(ctx context.Context, q Querier, spec tableSpec, info tableInfo, p Partition, cutoff time.Time, locked bool) (string, error) {
	part := info.qualified(p.Name)
	if spec.Kind == identityKey && !locked {
		var newest *time.Time
		err := q.QueryRow(ctx, "SELECT "+pgx.Identifier{spec.TimeColumn}.Sanitize()+" FROM "+part+
			" ORDER BY "+pgx.Identifier{spec.Column}.Sanitize()+" DESC LIMIT 1").Scan(&newest)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return "", fmt.Errorf("read the newest row of %s: %w", p.Name, err)
		}
		if newest != nil && !newest.Before(cutoff) {
			return fmt.Sprintf("its newest row was written at %s, after the cutoff %s", newest.UTC().Format(time.RFC3339), cutoff.UTC().Format(time.RFC3339)), nil
		}
	}
	var unfinished, young bool
	if err := q.QueryRow(ctx, fmt.Sprintf(spec.Unfinished, part)).Scan(&unfinished); err != nil {
		return "", fmt.Errorf("look for rows not %s in %s: %w", spec.Finished, p.Name, err)
	}
	if unfinished {
		return fmt.Sprintf("it holds rows not %s yet", spec.Finished), nil
	}
	if !locked {
		if _, err := q.Exec(ctx, `SELECT brin_summarize_new_values(i.indexrelid)
			FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_am a ON a.oid = c.relam
			WHERE i.indrelid = to_regclass($1) AND a.amname = 'brin'`, part); err != nil {
			return "", fmt.Errorf("summarize the BRIN indexes of %s: %w", p.Name, err)
		}
	}
	if err := q.QueryRow(ctx, fmt.Sprintf(spec.Young, part), cutoff).Scan(&young); err != nil {
		return "", fmt.Errorf("look for rows %s after the cutoff in %s: %w", spec.Finished, p.Name, err)
	}
	if young {
		return fmt.Sprintf("it holds rows %s after the cutoff %s", spec.Finished, cutoff.UTC().Format(time.RFC3339)), nil
	}
	return "", nil
}

// describe renders a partition for people: name and range.
func (s tableSpec) describe(p Partition) string {
	if p.Default {
		return p.Name + " (default)"
	}
	return fmt.Sprintf("%s [%s, %s)", p.Name, s.boundText(p.From), s.boundText(p.To))
}
