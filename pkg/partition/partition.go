// Package partition converts sluice's tables (outbox_event, inbox_event) to natively
// range-partitioned tables and maintains their partitions, so that retention drops whole
// partitions instead of deleting rows: at high volume a catalog change a day replaces a long
// DELETE and the index bloat that follows. Both tables stay plain by default; nothing here
// runs unless asked.
//
// One API serves both tables: pass Outbox or Inbox (or range over Tables()).
//
//	for _, t := range partition.Tables() {
//		rep, err := partition.Maintain(ctx, pool, t, &partition.Options{Retention: 30 * 24 * time.Hour})
//		...
//	}
//
// outbox_event is partitioned by RANGE (id), each partition sized from the observed rate of new
// ids to fill in about one Interval; event_id is then unique by construction (UUIDv7,
// gen_random_uuid()) rather than by an index. inbox_event is partitioned by RANGE (received_at),
// one partition per Interval; consumers then deduplicate across partitions under an advisory
// lock per message. Partitions must be created ahead of the rows (Maintain, at least every
// Interval): rows beyond them go to a default partition, which is purged row by row.
//
// Every change is its own short transaction under a per-table advisory lock, with a lock
// timeout, so concurrent maintainers (overlapping relay Lambdas, the migrate Lambda's schedule,
// the CLI) take turns and writers never queue behind a change for longer than LockTimeout. See
// docs/schema.md, "Partitioned tables".
package partition

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Querier runs single statements: a *pgxpool.Pool, a *pgx.Conn or a pgx.Tx.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// DB runs single statements and transactions: a *pgxpool.Pool or a *pgx.Conn. Maintenance and
// conversion run several short transactions of their own, so they never take a pgx.Tx.
type DB interface {
	Querier
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Table is a sluice table that can be partitioned: Outbox or Inbox.
type Table struct {
	spec tableSpec
}

var (
	// Outbox is outbox_event, partitioned by RANGE (id). Retention waits until every row of a
	// partition was published; a quarantined row keeps its partition.
	Outbox = &Table{spec: outboxSpec}
	// Inbox is inbox_event, partitioned by RANGE (received_at). Retention waits until every
	// row of a partition was processed; a parked row keeps its partition.
	Inbox = &Table{spec: inboxSpec}
)

// Tables returns every table that can be partitioned, the outbox first.
func Tables() []*Table { return []*Table{Outbox, Inbox} }

// Name returns the table's name: "outbox_event" or "inbox_event".
func (t *Table) Name() string { return t.spec.Table }

// String returns the table's name.
func (t *Table) String() string { return t.spec.Table }

// Options tune Maintain, PlanConversion and Convert. A nil *Options takes the defaults.
type Options struct {
	// Interval is how much time one new partition covers. Inbox: the span of received_at of
	// its rows, partitions starting at multiples of Interval since the Unix epoch (midnight UTC
	// for a day); every partition is looked up once per new message, so fewer, longer
	// partitions make the dedup check cheaper. Outbox: how long a partition takes to fill at the
	// rate of new ids observed over about the last Interval. A partition is dropped whole once
	// its last row expired, so rows are kept between Retention and Retention + Interval.
	// Defaults to DefaultInterval; at least 1 second, in whole seconds.
	Interval time.Duration
	// Ahead is how many empty partitions are kept ready above where new rows go. Defaults to
	// DefaultAhead; at most 100.
	Ahead int
	// MinSize is the fewest ids a new outbox partition spans, whatever the observed rate (an
	// empty table has none). Outbox only. Defaults to DefaultMinSize.
	MinSize int64
	// Size, when positive, makes every new outbox partition span exactly Size ids instead of a
	// size measured from the rate. Outbox only. Defaults to 0: measured.
	Size int64
	// Retention, when positive, makes Maintain drop every partition whose rows all finished
	// (were published, were processed) longer ago than it, and delete such rows from the
	// default partition. A dropped inbox message is no longer recognised as a duplicate: keep
	// the inbox's well above the queues' retention plus any redrive or replay window. Defaults
	// to 0: nothing is dropped.
	Retention time.Duration
	// LockTimeout bounds how long one change waits for its lock before giving up until the next
	// run, so that writers never queue behind it for longer. Creating a partition locks only
	// the default partition; dropping one locks the table (producers or consumers wait).
	// Defaults to DefaultLockTimeout.
	LockTimeout time.Duration
	// DryRun makes Maintain change nothing and report what it would drop: the partitions that
	// pass the check made before a drop's lock (the real run checks each again under the lock,
	// so it may keep one that changed meanwhile). It creates no partition and does not purge
	// the default partition. Defaults to false.
	DryRun bool
}

// Check reports every out-of-range option at once (as Maintain would), so that a process can
// refuse bad settings when it starts.
func (o *Options) Check() error {
	_, err := o.resolved()
	return err
}

// resolved returns the options with their defaults, checked.
func (o *Options) resolved() (Options, error) {
	var p Options
	if o != nil {
		p = *o
	}
	p = p.withDefaults()
	if err := p.validate(); err != nil {
		return p, fmt.Errorf("partition options: %w", err)
	}
	return p, nil
}

// Partition is one partition of a table.
type Partition struct {
	Name string
	// From and To bound the partition's key, From <= key < To: ids for the outbox, Unix
	// microseconds of received_at for the inbox (Table.Time converts them). From is
	// math.MinInt64 for the first partition (MINVALUE, the former plain table); both are 0 for
	// the default partition.
	From, To int64
	// Default marks the default partition, which catches rows beyond every other partition
	// (only when partitions were not created ahead in time).
	Default bool
	// Rows is PostgreSQL's estimate (pg_class.reltuples); -1 before the first VACUUM or ANALYZE.
	Rows int64

	table *Table
}

// String renders the partition for people: its name and range (ids, or times in RFC 3339).
func (p Partition) String() string {
	if p.table == nil {
		return p.Name
	}
	return p.table.spec.describe(p)
}

// Time returns the time a key of an inbox partition's range stands for, and false for the
// outbox's ids and for math.MinInt64 (MINVALUE).
func (t *Table) Time(key int64) (time.Time, bool) {
	if t.spec.Kind != timeKey || key == minBound || key == maxBound {
		return time.Time{}, false
	}
	return time.UnixMicro(key).UTC(), true
}

// stamp makes the engine's partitions of t the API's: each knows its table (String), and the
// default partition has no bounds.
func (t *Table) stamp(ps []Partition) []Partition {
	for i := range ps {
		t.stampOne(&ps[i])
	}
	return ps
}

func (t *Table) stampOne(p *Partition) {
	p.table = t
	if p.Default {
		p.From, p.To = 0, 0
	}
}

// Layout is how a table is stored.
type Layout struct {
	// Table is the table's name.
	Table string
	// Partitioned is true once Convert ran.
	Partitioned bool
	// Partitions in key order, the default partition last.
	Partitions []Partition
	// ConversionBound is non-zero when a conversion started and did not finish: the plain
	// table refuses keys from it on, until the conversion is run again.
	ConversionBound int64
}

// Read returns how table t is stored, from the catalog alone.
func Read(ctx context.Context, q Querier, t *Table) (Layout, error) {
	info, err := readInfo(ctx, q, t.spec)
	if err != nil {
		return Layout{}, fmt.Errorf("%s partitions: %w", t, err)
	}
	if !info.Exists {
		return Layout{}, fmt.Errorf("%s partitions: %w", t, ErrNotMigrated)
	}
	return Layout{Table: t.Name(), Partitioned: info.Partitioned, Partitions: t.stamp(info.Parts), ConversionBound: info.Bound}, nil
}

// Kept is a partition Maintain could have dropped by its range but kept.
type Kept struct {
	Partition
	// Reason says why: rows not finished (unpublished, quarantined, unprocessed, parked), rows
	// that finished after the cutoff, or its lock was busy.
	Reason string
}

// Report is what Maintain did (or, with DryRun, would drop).
type Report struct {
	// Table is the table's name.
	Table string
	// Partitioned is false when the table is plain: nothing was done.
	Partitioned bool
	Created     []Partition
	Dropped     []Partition
	Kept        []Kept
	// Purged counts the rows deleted from the default partition.
	Purged int64
	// Warnings need an operator: a conversion left half done, rows in the default partition.
	Warnings []string
}

// Maintain keeps a partitioned table ready and within its retention: it creates partitions
// until Ahead empty ones lie above where new rows go (and the default partition, if missing),
// and, when Retention is positive, drops every partition whose rows all finished (were
// published, were processed) longer ago than Retention and deletes such rows from the default
// partition. It never drops the default partition, a partition new rows may still go to, or
// one holding an unfinished row (unpublished, quarantined, unprocessed, parked): each
// partition is checked again, and dropped, under a lock that makes concurrent writers (a
// Replay making its rows unpublished) wait. On a plain table it does nothing and reports
// Partitioned false.
//
// The relay Lambda runs it for the outbox at each invocation, the migrate Lambda for both
// tables on a schedule; `sluice partition maintain` and `sluice purge` run it too. Run it at
// least every Interval.
func Maintain(ctx context.Context, db DB, t *Table, opts *Options) (Report, error) {
	o, err := opts.resolved()
	if err != nil {
		return Report{Table: t.Name()}, err
	}
	return maintain(ctx, db, t, o, true, 0)
}

func maintain(ctx context.Context, db DB, t *Table, o Options, create bool, batch int) (Report, error) {
	rep, err := maintainSpec(ctx, db, t.spec, o, create, batch)
	rep.Table = t.Name()
	t.stamp(rep.Created)
	t.stamp(rep.Dropped)
	for i := range rep.Kept {
		t.stampOne(&rep.Kept[i].Partition)
	}
	if err != nil {
		return rep, fmt.Errorf("maintain %s partitions: %w", t, err)
	}
	return rep, nil
}

// PlanConversion checks that table t can be converted to a partitioned table and returns what
// Convert would do, changing nothing. A table it cannot convert safely (triggers, views or
// foreign keys on it, another unique index without the partition key, ...) is refused with
// every problem named.
func PlanConversion(ctx context.Context, db DB, t *Table, opts *Options) (Plan, error) {
	o, err := opts.resolved()
	if err != nil {
		return Plan{Table: t.Name()}, err
	}
	p, _, err := planConversion(ctx, db, t.spec, o)
	p.Table = t.Name()
	if err != nil {
		return Plan{Table: t.Name()}, err
	}
	return p, nil
}

// Convert converts plain table t into a partitioned one without copying, moving or deleting a
// row: the plain table becomes the first partition (keys below Plan.Bound) of a new
// partitioned table of the same name, with the same columns, constraints, identity, grants,
// row-level security policies and owner, and Ahead partitions and a default partition are
// created above it. Unpublished rows stay for the relay, unprocessed ones for the Processor,
// and every stored inbox message stays a duplicate for later deliveries. It reports each
// completed step to progress (nil for none).
//
// Writers keep running: the bound is validated (and the outbox's BRIN index on published_at
// built) while they continue, and the switch holds an ACCESS EXCLUSIVE lock for the
// milliseconds its catalog changes take, waiting at most LockTimeout for it. An interrupted
// conversion is finished by running it again. Upgrade every inbox consumer first: consumers
// of this version notice the conversion (one insert fails, that record comes back) and
// deduplicate across partitions from then on.
func Convert(ctx context.Context, db DB, t *Table, opts *Options, progress func(step string)) (Plan, error) {
	o, err := opts.resolved()
	if err != nil {
		return Plan{Table: t.Name()}, err
	}
	p, err := convert(ctx, db, t.spec, o, progress)
	p.Table = t.Name()
	return p, err
}
