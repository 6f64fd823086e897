package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sluicehq/sluice/internal/partition"
)

// A partitioned outbox_event is RANGE-partitioned on id: retention drops whole partitions
// instead of deleting rows, so it costs a catalog change a day instead of a DELETE of every
// row and the index bloat that follows. The plain table stays the default; ConvertToPartitioned
// converts it explicitly. See docs/schema.md, "Partitioned tables".
//
// Why ranges of id: the primary key stays (id), as the contract fixes it, and the relay, which
// addresses rows by id and partition_key only, runs unchanged. Each partition is sized from the
// observed rate of new ids to fill in about one Interval. PostgreSQL cannot enforce a unique
// index across partitions unless it holds the partition key, so event_id is not unique in the
// database any more: its uniqueness comes from how it is made (a UUIDv7 from Write,
// gen_random_uuid() in plain SQL), and consumers deduplicate on it as before.

// outboxPartitions describes outbox_event to the partition engine.
var outboxPartitions = partition.Spec{
	Table:      "outbox_event",
	Kind:       partition.Identity,
	Column:     "id",
	TimeColumn: "created_at",
	Finished:   "published",
	// outbox_event_pending_key_idx holds exactly the unpublished rows.
	Unfinished: "SELECT EXISTS (SELECT 1 FROM %[1]s WHERE published_at IS NULL)",
	// outbox_event_published_brin: block ranges whose rows were all published before the cutoff
	// are skipped from the index's summaries.
	Young:      "SELECT EXISTS (SELECT 1 FROM %[1]s WHERE published_at >= $1)",
	FillFactor: 80,
	LocalOnly: map[string]string{
		"outbox_event_event_id_key": "PostgreSQL cannot enforce event_id's uniqueness across partitions; it stays unique among the rows " +
			"written before the conversion, and later rows rely on how event_id is made (UUIDv7, gen_random_uuid())",
	},
	ExtraIndexes: []partition.Index{{Name: "outbox_event_published_brin", Using: "USING brin (published_at)"}},
}

// DB runs single statements and transactions: a *pgxpool.Pool or a *pgx.Conn.
type DB interface {
	Querier
	Begin(ctx context.Context) (pgx.Tx, error)
}

// PartitionOptions tune MaintainPartitions, PlanPartitioning and ConvertToPartitioned. A nil
// *PartitionOptions takes the defaults.
type PartitionOptions struct {
	// Interval is how long a new partition should take to fill at the rate of new ids observed
	// over about the last Interval. A partition is dropped whole once its last row expired, so
	// rows are kept between Retention and Retention + Interval. Defaults to 24 hours; at least
	// 1 minute.
	Interval time.Duration
	// Ahead is how many empty partitions are kept ready above the newest id. Defaults to 2.
	Ahead int
	// MinSize is the fewest ids a new partition spans, whatever the observed rate (an empty
	// table has none). Defaults to 10,000.
	MinSize int64
	// Size, when positive, makes every new partition span exactly Size ids instead of a size
	// measured from the rate. Defaults to 0: measured.
	Size int64
	// Retention, when positive, makes MaintainPartitions drop every partition whose rows were
	// all published longer ago than it (and delete such rows from the default partition).
	// Defaults to 0: nothing is dropped.
	Retention time.Duration
	// LockTimeout bounds how long one change waits for its lock before giving up until the next
	// run, so that writers never queue behind it for longer. Creating a partition locks only
	// the default partition (the relay's reads wait); dropping one locks outbox_event (producers
	// wait). Defaults to 200 milliseconds.
	LockTimeout time.Duration
	// DryRun makes MaintainPartitions change nothing and report what it would drop: the
	// partitions that pass the check made before a drop's lock (the real run checks each again
	// under the lock, so it may keep one that changed meanwhile). It creates no partition and
	// does not purge the default partition. Defaults to false.
	DryRun bool
}

// DefaultPartitionInterval, DefaultPartitionsAhead, DefaultPartitionMinSize and
// DefaultPartitionLockTimeout are PartitionOptions' defaults.
const (
	DefaultPartitionInterval    = partition.DefaultInterval
	DefaultPartitionsAhead      = partition.DefaultAhead
	DefaultPartitionMinSize     = partition.DefaultMinSize
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
		p = partition.Options{Interval: o.Interval, Ahead: o.Ahead, MinSize: o.MinSize, Size: o.Size, Retention: o.Retention, LockTimeout: o.LockTimeout, DryRun: o.DryRun}
	}
	p = p.WithDefaults()
	if err := p.Validate(); err != nil {
		return p, fmt.Errorf("outbox: partition options: %w", err)
	}
	return p, nil
}

// Partition is one partition of outbox_event.
type Partition struct {
	Name string
	// From and To bound the partition's ids: From <= id < To. From is math.MinInt64 for the
	// first partition (MINVALUE, the former plain table); both are 0 for the default partition.
	From, To int64
	// Default marks the default partition, which catches ids beyond every other partition
	// (only when partitions were not created ahead in time).
	Default bool
	// Rows is PostgreSQL's estimate (pg_class.reltuples); -1 before the first VACUUM or ANALYZE.
	Rows int64
}

func partitionOf(p partition.Part) Partition {
	out := Partition{Name: p.Name, From: p.From, To: p.To, Default: p.Default, Rows: p.Rows}
	if p.Default {
		out.From, out.To = 0, 0
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

// KeptPartition is a partition MaintainPartitions could have dropped by its ids but kept.
type KeptPartition struct {
	Partition
	// Reason says why: rows not published, rows published after the cutoff, or its lock was busy.
	Reason string
}

// PartitionReport is what MaintainPartitions did.
type PartitionReport struct {
	// Partitioned is false when outbox_event is a plain table: nothing was done.
	Partitioned bool
	Created     []Partition
	Dropped     []Partition
	Kept        []KeptPartition
	// Purged counts the rows deleted from the default partition.
	Purged int64
	// Warnings need an operator: a conversion left half done, rows in the default partition.
	Warnings []string
}

// PartitionLayout is how outbox_event is stored.
type PartitionLayout struct {
	// Partitioned is true once ConvertToPartitioned ran.
	Partitioned bool
	// Partitions in id order, the default partition last.
	Partitions []Partition
	// ConversionBound is non-zero when a conversion started and did not finish: the plain
	// table refuses ids from it on, until the conversion is run again.
	ConversionBound int64
}

// Partitions returns how outbox_event is stored, from the catalog alone.
func Partitions(ctx context.Context, db Querier) (PartitionLayout, error) {
	info, err := partition.Read(ctx, db, outboxPartitions)
	if err != nil {
		return PartitionLayout{}, fmt.Errorf("outbox partitions: %w", err)
	}
	if !info.Exists {
		return PartitionLayout{}, fmt.Errorf("outbox partitions: outbox_event: %w", partition.ErrNotMigrated)
	}
	return PartitionLayout{Partitioned: info.Partitioned, Partitions: partitionsOf(info.Parts), ConversionBound: info.Bound}, nil
}

// MaintainPartitions keeps a partitioned outbox_event ready and within its retention: it
// creates partitions until Ahead empty ones lie above the newest id (and the default
// partition, if missing), and, when Retention is positive, drops every partition whose rows
// were all published longer ago than Retention and deletes such rows from the default
// partition. It never drops the default partition, a partition new ids may still go to, or
// one holding an unpublished or quarantined row: each partition is checked again, and
// dropped, under a lock that makes concurrent writers (a Replay making its rows unpublished)
// wait. On a plain outbox_event it does nothing and reports Partitioned false.
//
// The relay Lambda calls it at each invocation; `sluice purge` and `sluice partition
// maintain` call it too. Run it at least every Interval: when no partition is ready, new rows
// go to the default partition, which is purged row by row.
func MaintainPartitions(ctx context.Context, db DB, opts *PartitionOptions) (PartitionReport, error) {
	o, err := opts.engine()
	if err != nil {
		return PartitionReport{}, err
	}
	return maintainPartitions(ctx, db, o, true, 5000)
}

func maintainPartitions(ctx context.Context, db DB, o partition.Options, create bool, batch int) (PartitionReport, error) {
	r, err := partition.Maintain(ctx, db, outboxPartitions, o, create, true)
	rep := PartitionReport{Partitioned: r.Partitioned, Created: partitionsOf(r.Created), Dropped: partitionsOf(r.Dropped), Warnings: r.Warnings}
	for _, k := range r.Kept {
		rep.Kept = append(rep.Kept, KeptPartition{Partition: partitionOf(k.Part), Reason: k.Reason})
	}
	if err != nil {
		return rep, fmt.Errorf("outbox: maintain partitions: %w", err)
	}
	if !r.Partitioned || o.Retention <= 0 || o.DryRun {
		return rep, nil
	}
	info, err := partition.Read(ctx, db, outboxPartitions)
	if err != nil {
		return rep, fmt.Errorf("outbox: maintain partitions: %w", err)
	}
	if d, ok := info.Default(); ok {
		var cutoff time.Time
		if err := db.QueryRow(ctx, "SELECT now() - $1 * interval '1 millisecond'", o.Retention.Milliseconds()).Scan(&cutoff); err != nil {
			return rep, fmt.Errorf("outbox: maintain partitions: %w", err)
		}
		rep.Purged, err = purgeRows(ctx, db, pgx.Identifier{info.Schema, d.Name}.Sanitize(), cutoff, batch, nil)
		if err != nil {
			return rep, fmt.Errorf("outbox: purge the default partition %s: %w", d.Name, err)
		}
	}
	return rep, nil
}

// purgePartitioned is Purge on a partitioned outbox_event: it drops the expired partitions and
// deletes expired rows from the default partition, and returns the rows removed (a dropped
// partition's counted from PostgreSQL's estimate).
func purgePartitioned(ctx context.Context, db Querier, olderThan time.Duration, batch int) (int64, error) {
	d, ok := db.(DB)
	if !ok {
		return 0, errors.New("purge outbox: outbox_event is partitioned: pass a *pgxpool.Pool or *pgx.Conn, which can drop partitions")
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
	// Rows is PostgreSQL's estimate of outbox_event's rows: none is copied or moved.
	Rows int64
	// Bound: the plain table becomes the partition of ids below it.
	Bound int64
	// Size is how many ids each new partition spans, from Rate and Interval (at least MinSize).
	Size int64
	// Rate is the observed rate of new ids per second (0: unknown).
	Rate float64
	// Resume: an earlier run started the conversion; this one finishes it.
	Resume bool
	// Steps say what the conversion does, in order; Notes what changes for users.
	Steps, Notes []string
}

func planOf(p partition.Plan) PartitionPlan {
	return PartitionPlan{Rows: p.Rows, Bound: p.Bound, Size: p.Size, Rate: p.Rate, Resume: p.Resume, Steps: p.Steps, Notes: p.Notes}
}

// PlanPartitioning checks that outbox_event can be converted to a partitioned table and
// returns what ConvertToPartitioned would do, changing nothing. A table it cannot convert
// safely (triggers, views or foreign keys on it, another unique index without id, ...) is
// refused with every problem named.
func PlanPartitioning(ctx context.Context, db DB, opts *PartitionOptions) (PartitionPlan, error) {
	o, err := opts.engine()
	if err != nil {
		return PartitionPlan{}, err
	}
	p, err := partition.PlanConversion(ctx, db, outboxPartitions, o)
	if err != nil {
		return PartitionPlan{}, fmt.Errorf("outbox: %w", err)
	}
	return planOf(p), nil
}

// ConvertToPartitioned converts a plain outbox_event into a partitioned one without copying,
// moving or deleting a row: the plain table becomes the first partition (ids below
// PartitionPlan.Bound) of a new partitioned outbox_event with the same columns, constraints,
// identity, grants, policies and owner, and Ahead partitions and a default partition are
// created above it. Unpublished rows stay unpublished and the relay publishes them, in key
// order, as before. It reports each completed step to progress (nil for none).
//
// Producers and relays keep running: validating the bound and building the BRIN index on
// published_at read the table while writers continue, and the switch itself holds an ACCESS
// EXCLUSIVE lock for the milliseconds its catalog changes take (waiting at most LockTimeout
// for it). An interrupted conversion is finished by running it again. Every service that
// writes or relays the outbox keeps working: the table keeps its name and columns.
func ConvertToPartitioned(ctx context.Context, db DB, opts *PartitionOptions, progress func(step string)) (PartitionPlan, error) {
	o, err := opts.engine()
	if err != nil {
		return PartitionPlan{}, err
	}
	p, err := partition.Convert(ctx, db, outboxPartitions, o, progress)
	if err != nil {
		return planOf(p), fmt.Errorf("outbox: %w", err)
	}
	return planOf(p), nil
}

// DescribePartition renders a partition for people: its name and id range.
func DescribePartition(p Partition) string {
	return outboxPartitions.Describe(partition.Part{Name: p.Name, From: p.From, To: p.To, Default: p.Default})
}
