package inbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sluicehq/sluice/internal/partition"
)

// A partitioned inbox_event is RANGE-partitioned on received_at, one partition per Interval:
// retention drops whole partitions instead of deleting rows. The plain table stays the default;
// ConvertToPartitioned converts it explicitly. See docs/schema.md, "Partitioned tables".
//
// The dedup key (consumer, message_id) no longer includes the partition key, so PostgreSQL
// cannot enforce it across partitions and ON CONFLICT would not see a duplicate stored in
// another partition. On a partitioned inbox the Consumer therefore takes a transaction-scoped
// advisory lock on each message's key (a batch's keys in sorted order) and then looks the key
// up in every partition before inserting, in the same transaction as the effects: a concurrent
// delivery of the same message waits for the lock and then finds the row. Each partition keeps
// a unique index on (consumer, message_id), which also serves that lookup.

// inboxPartitions describes inbox_event to the partition engine.
var inboxPartitions = partition.Spec{
	Table:    "inbox_event",
	Kind:     partition.Time,
	Column:   "received_at",
	Finished: "processed",
	// An unprocessed row is in one of the three partial indexes: FIFO rows in
	// inbox_event_unprocessed_group_idx, other unparked ones in inbox_event_ready_idx, parked
	// ones in inbox_event_parked_idx.
	Unfinished: `SELECT EXISTS (SELECT 1 FROM %[1]s WHERE processed_at IS NULL AND group_id IS NOT NULL)
		OR EXISTS (SELECT 1 FROM %[1]s WHERE processed_at IS NULL AND parked_at IS NULL AND group_id IS NULL)
		OR EXISTS (SELECT 1 FROM %[1]s WHERE parked_at IS NOT NULL AND processed_at IS NULL)`,
	// inbox_event_processed_idx.
	Young:       "SELECT EXISTS (SELECT 1 FROM %[1]s WHERE processed_at >= $1)",
	LocalUnique: []string{"consumer", "message_id"},
	LocalOnly: map[string]string{
		"inbox_event_pkey": "the dedup key (consumer, message_id) is enforced across partitions by the consumers " +
			"(an advisory lock per key, then a lookup in every partition); each partition keeps a unique index on it",
	},
}

// DB runs single statements and transactions: a *pgxpool.Pool or a *pgx.Conn.
type DB interface {
	Querier
	Begin(ctx context.Context) (pgx.Tx, error)
}

// PartitionOptions tune MaintainPartitions, PlanPartitioning and ConvertToPartitioned. A nil
// *PartitionOptions takes the defaults.
type PartitionOptions struct {
	// Interval is the time one partition covers: rows are placed by received_at, and partitions
	// start at multiples of Interval since the Unix epoch (midnight UTC for a day). A partition
	// is dropped whole once its last row expired, so rows are kept between Retention and
	// Retention + Interval; and every partition is looked up once per new message, so fewer,
	// longer partitions make the dedup check cheaper. Defaults to 24 hours; at least 1 second.
	Interval time.Duration
	// Ahead is how many empty partitions are kept ready after the current one. Defaults to 2.
	Ahead int
	// Retention, when positive, makes MaintainPartitions drop every partition whose rows were
	// all processed longer ago than it (and delete such rows from the default partition). A
	// dropped message is no longer recognised as a duplicate: keep it well above the queue's
	// retention plus any redrive or replay window (see Purge). Defaults to 0: nothing is dropped.
	Retention time.Duration
	// LockTimeout bounds how long one change waits for its lock before giving up until the next
	// run, so that writers never queue behind it for longer. Creating a partition locks only
	// the default partition; dropping one locks inbox_event (consumers wait). Defaults to 200
	// milliseconds.
	LockTimeout time.Duration
	// DryRun makes MaintainPartitions change nothing and report what it would drop: the
	// partitions that pass the check made before a drop's lock (the real run checks each again
	// under the lock, so it may keep one that changed meanwhile). It creates no partition and
	// does not purge the default partition. Defaults to false.
	DryRun bool
}

// DefaultPartitionInterval, DefaultPartitionsAhead and DefaultPartitionLockTimeout are
// PartitionOptions' defaults.
const (
	DefaultPartitionInterval    = partition.DefaultInterval
	DefaultPartitionsAhead      = partition.DefaultAhead
	DefaultPartitionLockTimeout = partition.DefaultLockTimeout
)

// Check reports every out-of-range option at once (as MaintainPartitions would), so that a
// process can refuse bad settings when it starts.
func (o *PartitionOptions) Check() error {
	_, err := o.engine()
	return err
}

func (o *PartitionOptions) engine() (partition.Options, error) {
	var p partition.Options
	if o != nil {
		p = partition.Options{Interval: o.Interval, Ahead: o.Ahead, Retention: o.Retention, LockTimeout: o.LockTimeout, DryRun: o.DryRun}
	}
	p = p.WithDefaults()
	if err := p.Validate(); err != nil {
		return p, fmt.Errorf("%w: partition options: %w", ErrInvalidArgument, err)
	}
	return p, nil
}

// Partition is one partition of inbox_event.
type Partition struct {
	Name string
	// From and To bound the received_at of its rows: From <= received_at < To. From is zero
	// for the first partition (MINVALUE, the former plain table); both are zero for the default
	// partition.
	From, To time.Time
	// Default marks the default partition, which catches rows beyond every other partition
	// (only when partitions were not created ahead in time).
	Default bool
	// Rows is PostgreSQL's estimate (pg_class.reltuples); -1 before the first VACUUM or ANALYZE.
	Rows int64
}

func partitionOf(p partition.Part) Partition {
	out := Partition{Name: p.Name, Default: p.Default, Rows: p.Rows}
	if !p.Default {
		if p.From != partition.MinBound {
			out.From = time.UnixMicro(p.From).UTC()
		}
		if p.To != partition.MaxBound {
			out.To = time.UnixMicro(p.To).UTC()
		}
	}
	return out
}

func partitionsOf(ps []partition.Part) []Partition {
	out := make([]Partition, 0, len(ps))
	for _, p := range ps {
		out = append(out, partitionOf(p))
	}
	return out
}

// KeptPartition is a partition MaintainPartitions could have dropped by its time range but kept.
type KeptPartition struct {
	Partition
	// Reason says why: rows not processed, rows processed after the cutoff, or its lock was busy.
	Reason string
}

// PartitionReport is what MaintainPartitions did.
type PartitionReport struct {
	// Partitioned is false when inbox_event is a plain table: nothing was done.
	Partitioned bool
	Created     []Partition
	Dropped     []Partition
	Kept        []KeptPartition
	// Purged counts the rows deleted from the default partition.
	Purged int64
	// Warnings need an operator: a conversion left half done, rows in the default partition.
	Warnings []string
}

// PartitionLayout is how inbox_event is stored.
type PartitionLayout struct {
	// Partitioned is true once ConvertToPartitioned ran.
	Partitioned bool
	// Partitions in time order, the default partition last.
	Partitions []Partition
	// ConversionBound is non-zero when a conversion started and did not finish: the plain
	// table refuses rows received from then on, until the conversion is run again.
	ConversionBound time.Time
}

// Partitions returns how inbox_event is stored, from the catalog alone.
func Partitions(ctx context.Context, db Querier) (PartitionLayout, error) {
	info, err := partition.Read(ctx, db, inboxPartitions)
	if err != nil {
		return PartitionLayout{}, fmt.Errorf("inbox partitions: %w", err)
	}
	if !info.Exists {
		return PartitionLayout{}, fmt.Errorf("inbox partitions: inbox_event: %w", partition.ErrNotMigrated)
	}
	l := PartitionLayout{Partitioned: info.Partitioned, Partitions: partitionsOf(info.Parts)}
	if info.Bound != 0 {
		l.ConversionBound = time.UnixMicro(info.Bound).UTC()
	}
	return l, nil
}

// MaintainPartitions keeps a partitioned inbox_event ready and within its retention: it
// creates partitions until Ahead empty ones follow the current one (and the default partition,
// if missing), and, when Retention is positive, drops every partition whose rows were all
// processed longer ago than Retention and deletes such rows from the default partition. It
// never drops the default partition, one whose time range reaches past the cutoff, or one
// holding an unprocessed or parked row: each partition is checked again, and dropped, under a
// lock that makes concurrent writers wait. On a plain inbox_event it does nothing and reports
// Partitioned false.
//
// `sluice purge` and `sluice partition maintain` call it; schedule one of them at least every
// Interval: when no partition is ready, new rows go to the default partition, which is purged
// row by row.
func MaintainPartitions(ctx context.Context, db DB, opts *PartitionOptions) (PartitionReport, error) {
	o, err := opts.engine()
	if err != nil {
		return PartitionReport{}, err
	}
	return maintainPartitions(ctx, db, o, true, 1000)
}

func maintainPartitions(ctx context.Context, db DB, o partition.Options, create bool, batch int) (PartitionReport, error) {
	r, err := partition.Maintain(ctx, db, inboxPartitions, o, create, true)
	rep := PartitionReport{Partitioned: r.Partitioned, Created: partitionsOf(r.Created), Dropped: partitionsOf(r.Dropped), Warnings: r.Warnings}
	for _, k := range r.Kept {
		rep.Kept = append(rep.Kept, KeptPartition{Partition: partitionOf(k.Part), Reason: k.Reason})
	}
	if err != nil {
		return rep, fmt.Errorf("inbox: maintain partitions: %w", err)
	}
	if !r.Partitioned || o.Retention <= 0 || o.DryRun {
		return rep, nil
	}
	info, err := partition.Read(ctx, db, inboxPartitions)
	if err != nil {
		return rep, fmt.Errorf("inbox: maintain partitions: %w", err)
	}
	if d, ok := info.Default(); ok {
		rep.Purged, err = purgeRows(ctx, db, pgx.Identifier{info.Schema, d.Name}.Sanitize(), o.Retention, "", batch, nil)
		if err != nil {
			return rep, fmt.Errorf("inbox: purge the default partition %s: %w", d.Name, err)
		}
	}
	return rep, nil
}

// purgePartitioned is Purge of every consumer on a partitioned inbox_event: it drops the
// expired partitions and deletes expired rows from the default partition, and returns the rows
// removed (a dropped partition's counted from PostgreSQL's estimate).
func purgePartitioned(ctx context.Context, db Querier, olderThan time.Duration, batch int) (int64, error) {
	d, ok := db.(DB)
	if !ok {
		return 0, errors.New("purge inbox: inbox_event is partitioned: pass a *pgxpool.Pool or *pgx.Conn, which can drop partitions")
	}
	o := partition.Options{Retention: olderThan}.WithDefaults()
	rep, err := maintainPartitions(ctx, d, o, false, batch)
	n := rep.Purged
	for _, p := range rep.Dropped {
		n += max(p.Rows, 0)
	}
	return n, err
}

// PartitionPlan is what ConvertToPartitioned does, for an operator to read first.
type PartitionPlan struct {
	// Rows is PostgreSQL's estimate of inbox_event's rows: none is copied or moved.
	Rows int64
	// Bound: the plain table becomes the partition of rows received before it.
	Bound time.Time
	// Resume: an earlier run started the conversion; this one finishes it.
	Resume bool
	// Steps say what the conversion does, in order; Notes what changes for users.
	Steps, Notes []string
}

func planOf(p partition.Plan) PartitionPlan {
	out := PartitionPlan{Rows: p.Rows, Resume: p.Resume, Steps: p.Steps, Notes: p.Notes}
	if p.Bound != 0 {
		out.Bound = time.UnixMicro(p.Bound).UTC()
	}
	return out
}

// PlanPartitioning checks that inbox_event can be converted to a partitioned table and returns
// what ConvertToPartitioned would do, changing nothing. A table it cannot convert safely
// (triggers, views or foreign keys on it, another unique index without received_at, ...) is
// refused with every problem named.
func PlanPartitioning(ctx context.Context, db DB, opts *PartitionOptions) (PartitionPlan, error) {
	o, err := opts.engine()
	if err != nil {
		return PartitionPlan{}, err
	}
	p, err := partition.PlanConversion(ctx, db, inboxPartitions, o)
	if err != nil {
		return PartitionPlan{}, fmt.Errorf("inbox: %w", err)
	}
	return planOf(p), nil
}

// ConvertToPartitioned converts a plain inbox_event into a partitioned one without copying,
// moving or deleting a row: the plain table becomes the first partition (rows received before
// PartitionPlan.Bound, at least one Interval from now) of a new partitioned inbox_event with the
// same columns, constraints, identity, grants, row-level security policies and owner, and
// Ahead partitions and a default partition are created after it. Every stored message stays a
// duplicate for later deliveries, and unprocessed rows stay for the Processor. It reports each
// completed step to progress (nil for none).
//
// Upgrade every consumer first: a Consumer of this version notices the conversion (its plain
// insert fails once, and that record comes back) and deduplicates across partitions from then
// on; consumers of earlier versions fail every record until upgraded (their messages reach the
// DLQ after maxReceiveCount, none is applied twice). The switch holds an ACCESS EXCLUSIVE lock
// for the milliseconds its catalog changes take, waiting at most LockTimeout for it; an
// interrupted conversion is finished by running it again.
func ConvertToPartitioned(ctx context.Context, db DB, opts *PartitionOptions, progress func(step string)) (PartitionPlan, error) {
	o, err := opts.engine()
	if err != nil {
		return PartitionPlan{}, err
	}
	p, err := partition.Convert(ctx, db, inboxPartitions, o, progress)
	if err != nil {
		return planOf(p), fmt.Errorf("inbox: %w", err)
	}
	return planOf(p), nil
}

// DescribePartition renders a partition for people: its name and time range.
func DescribePartition(p Partition) string {
	q := partition.Part{Name: p.Name, From: partition.MinBound, To: partition.MaxBound, Default: p.Default}
	if !p.From.IsZero() {
		q.From = p.From.UnixMicro()
	}
	if !p.To.IsZero() {
		q.To = p.To.UnixMicro()
	}
	return inboxPartitions.Describe(q)
}
