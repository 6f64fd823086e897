package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"

	"github.com/sluicehq/sluice/internal/admin"
	"github.com/sluicehq/sluice/pkg/inbox"
	"github.com/sluicehq/sluice/pkg/outbox"
	"github.com/sluicehq/sluice/pkg/partition"
)

// sqsMaxRetention is the longest MessageRetentionPeriod SQS allows (14 days).
const sqsMaxRetention = 14 * 24 * time.Hour

func (a *app) purgeCommand() *cobra.Command {
	var (
		opts PurgeOptions
		g    guard
	)
	cmd := &cobra.Command{
		Use:   "purge --older-than D [--queue URL ...] [--dry-run] [--yes]",
		Short: "Delete published outbox rows and processed inbox rows older than a retention",
		Long: `Retention: delete outbox rows published more than --older-than ago and inbox rows processed
more than --older-than ago, in bounded batches (short statements, no long locks). Unpublished,
quarantined, unprocessed and parked rows are never deleted.

It first prints exactly what it would delete (rows, id and time ranges per table and consumer; the
partitions it would drop on a partitioned table) from one cutoff, which the run then uses. --dry-run
stops there. On a terminal it asks for confirmation; --yes confirms for scripts; without a terminal
and without --yes it refuses and changes nothing.

An inbox row is what makes a redelivered message a duplicate: once it is purged, the same message
would be applied again. So the inbox retention must outlast every way the message can come back:
the queue's MessageRetentionPeriod and its DLQ's (a redrive). Name the consumer's queues with
--queue and purge reads their retention (and their DLQs'); without --queue it assumes SQS's 14-day
maximum. It refuses an --older-than that is not longer, unless --allow-duplicate-applies accepts that
messages coming back after their row is gone are applied twice.

Progress (rows deleted, rate, time left) is a bar on a terminal, lines otherwise, JSON lines with
--json. Ctrl-C stops after the statement in flight: what was deleted stays deleted, and running the
same command again continues.

Durations: Go durations plus a day suffix (36h, 7d, 30d).`,
		Example: `  sluice purge --older-than 30d --dry-run
  sluice purge --older-than 15d --queue https://sqs.eu-west-1.amazonaws.com/123456789012/billing --yes
  sluice purge --older-than 7d --outbox-only --yes --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			if !cmd.Flags().Changed("older-than") {
				return usagef("--older-than is required (e.g. --older-than 30d)")
			}
			if err := opts.validate(); err != nil {
				return err
			}
			var c SQSAPI
			if !opts.OutboxOnly {
				var (
					closeSources func()
					err          error
				)
				if c, closeSources, err = a.connectSources(ctx, &opts.InboxSources); err != nil {
					return err
				}
				defer closeSources()
			}
			pool, err := a.db(ctx)
			if err != nil {
				return err
			}
			opts.DryRun = g.dryRun
			opts.Confirm = func(plan PurgePlan) error {
				a.printPurgePlan(plan, g)
				ok, err := a.proceed(g, "Delete these rows?", "purge")
				if err == nil && !ok {
					return errDryRun
				}
				return err
			}
			var m *meter
			opts.Progress = func(table string, total, deleted int64) {
				if m == nil || m.target != table {
					if m != nil {
						m.finish()
					}
					m = a.newMeter(g.json, "purge", table, "deleted", "rows", total)
				}
				m.update(deleted)
			}
			res, err := Purge(ctx, pool, c, opts)
			if m != nil {
				m.finish()
			}
			if errors.Is(err, errDryRun) {
				return nil
			}
			if res.Warning != "" {
				fmt.Fprintln(a.io.Err, "warning: "+res.Warning)
			}
			if g.json {
				if res.OutboxPurged || res.InboxPurged || errors.Is(err, ErrInterrupted) {
					emitJSON(a.io.Out, map[string]any{"event": "result", "op": "purge", "outbox_deleted": res.OutboxDeleted,
						"inbox_deleted": res.InboxDeleted, "interrupted": errors.Is(err, ErrInterrupted)})
				}
				return err
			}
			if res.OutboxPurged || res.OutboxDeleted > 0 {
				fmt.Fprintf(a.io.Out, "deleted %d published outbox rows older than %s\n", res.OutboxDeleted, FormatDuration(opts.OlderThan))
			}
			if res.InboxPurged || res.InboxDeleted > 0 {
				fmt.Fprintf(a.io.Out, "deleted %d processed inbox rows and dead letters older than %s\n", res.InboxDeleted, FormatDuration(opts.OlderThan))
			}
			return err
		},
	}
	fl := cmd.Flags()
	fl.Var(&durationValue{d: &opts.OlderThan}, "older-than", "retention: delete rows published/processed longer ago than this (required; e.g. 30d)")
	opts.InboxSources.flags(fl)
	fl.StringVar(&opts.Consumer, "consumer", "", "purge only this inbox consumer's rows")
	fl.IntVar(&opts.BatchSize, "batch-size", 0, fmt.Sprintf("most rows per DELETE statement (default %d)", outbox.DefaultPurgeBatchSize))
	fl.BoolVar(&opts.OutboxOnly, "outbox-only", false, "purge only the outbox")
	fl.BoolVar(&opts.InboxOnly, "inbox-only", false, "purge only the inbox")
	fl.BoolVar(&opts.AllowDuplicateApplies, "allow-duplicate-applies", false,
		"purge inbox rows even when --older-than is not longer than the retention a message can come back from (it will then be applied twice)")
	g.flags(cmd, "be deleted")
	return cmd
}

// errDryRun ends a command after its plan: not an error for the operator.
var errDryRun = errors.New("dry run")

// printPurgePlan prints a purge's plan (as one JSON line with --json).
func (a *app) printPurgePlan(p PurgePlan, g guard) {
	if g.json {
		emitJSON(a.io.Out, map[string]any{"event": "plan", "op": "purge", "dry_run": g.dryRun, "plan": p})
		return
	}
	w := a.io.Out
	verb := "Deleting"
	if g.dryRun {
		verb = "Dry run: would delete"
	}
	fmt.Fprintf(w, "%s rows older than the cutoff %s:\n", verb, p.Cutoff.UTC().Format(time.RFC3339))
	if o := p.Outbox; o != nil {
		switch {
		case o.Partitioned:
			printPartitionDrops(w, "outbox_event", o.DropPartitions)
		case o.Rows == 0:
			fmt.Fprintln(w, "  outbox_event: 0 published rows")
		default:
			fmt.Fprintf(w, "  outbox_event: %d published rows, ids %d..%d, published %s..%s\n", o.Rows, o.FromID, o.ToID,
				o.OldestPublished.UTC().Format(time.RFC3339), o.NewestPublished.UTC().Format(time.RFC3339))
		}
	}
	if i := p.Inbox; i != nil {
		switch {
		case i.Partitioned:
			printPartitionDrops(w, "inbox_event", i.DropPartitions)
		case i.Rows == 0:
			fmt.Fprintln(w, "  inbox_event: 0 processed rows")
		default:
			fmt.Fprintf(w, "  inbox_event: %d processed rows\n", i.Rows)
			for _, c := range i.Consumers {
				fmt.Fprintf(w, "    consumer %s: %d rows, processed %s..%s\n", c.Consumer, c.Rows,
					c.OldestProcessed.UTC().Format(time.RFC3339), c.NewestProcessed.UTC().Format(time.RFC3339))
			}
		}
	}
	if p.RetentionBound > 0 {
		fmt.Fprintf(w, "  inbox retention check: longer than %s (%s)\n", FormatDuration(p.RetentionBound), p.RetentionFrom)
	}
}

// printPartitionDrops prints the plan of a partitioned table's purge: the partitions it drops
// and the default partition's expired rows.
func printPartitionDrops(w io.Writer, table string, drops []string) {
	fmt.Fprintf(w, "  %s (partitioned): drop %d partitions", table, len(drops))
	printList(w, drops)
	fmt.Fprintln(w, "    and delete the expired rows of the default partition, if any")
}

func printList(w io.Writer, items []string) {
	if len(items) == 0 {
		fmt.Fprintln(w)
		return
	}
	fmt.Fprintln(w, ":")
	for _, s := range items {
		fmt.Fprintln(w, "    "+s)
	}
}

// PurgeOptions configure Purge.
type PurgeOptions struct {
	// OlderThan is the retention: rows published or processed longer ago are deleted. Required.
	OlderThan time.Duration
	// InboxSources name the inbox consumers' queues, streams and topics: Purge refuses when
	// OlderThan is not longer than the longest retention among them, since a message
	// delivered again after its inbox row is gone would be applied twice. Defaults to none:
	// then the bound is SQS's 14-day maximum retention.
	InboxSources
	// AllowDuplicateApplies purges inbox rows even when OlderThan is not above that bound.
	// Defaults to false: refused with ErrGuarantee.
	AllowDuplicateApplies bool
	// Consumer purges only this inbox consumer's rows. Defaults to every consumer.
	Consumer string
	// BatchSize is the most rows per DELETE statement. Defaults to outbox.DefaultPurgeBatchSize
	// (the same as inbox.DefaultPurgeBatchSize).
	BatchSize int
	// OutboxOnly and InboxOnly purge one table only; at most one may be set.
	OutboxOnly, InboxOnly bool
	// DryRun only plans (PurgeResult.Plan): nothing is deleted.
	DryRun bool
	// Confirm is given the plan before anything is deleted (also on a dry run); an error stops
	// the purge. Defaults to nil: no confirmation.
	Confirm func(PurgePlan) error
	// Progress is told, after each batch, the rows a table had to purge by the plan and the rows
	// deleted so far. Defaults to nil.
	Progress func(table string, planned, deleted int64)
}

func (o PurgeOptions) validate() error {
	switch {
	case o.OlderThan <= 0:
		return usagef("--older-than must be positive")
	case o.OutboxOnly && o.InboxOnly:
		return usagef("--outbox-only and --inbox-only exclude each other")
	case o.BatchSize < 0:
		return usagef("--batch-size must not be negative")
	}
	return nil
}

// PurgePlan is what Purge deletes, computed from one cutoff that the run then uses.
type PurgePlan struct {
	// Cutoff: rows published (outbox) or processed (inbox) before it are deleted.
	Cutoff time.Time `json:"cutoff"`
	// Outbox and Inbox are nil for a table that is not purged.
	Outbox *OutboxPurgePlan `json:"outbox,omitempty"`
	Inbox  *InboxPurgePlan  `json:"inbox,omitempty"`
	// RetentionBound is the longest retention a message can come back from (0 without an inbox
	// purge), named by RetentionFrom.
	RetentionBound time.Duration `json:"-"`
	RetentionFrom  string        `json:"retention_from,omitempty"`
}

// MarshalJSON writes RetentionBound as retention_bound_seconds, a number of seconds (-1 for a
// source that keeps its messages without a time limit).
func (p PurgePlan) MarshalJSON() ([]byte, error) {
	type plain PurgePlan
	v := struct {
		plain
		RetentionBoundSeconds float64 `json:"retention_bound_seconds,omitempty"`
	}{plain: plain(p), RetentionBoundSeconds: p.RetentionBound.Seconds()}
	if p.RetentionBound == admin.Forever {
		v.RetentionBoundSeconds = -1
	}
	return json.Marshal(v)
}

// OutboxPurgePlan is the outbox part of a PurgePlan. On a plain table, Rows published rows in
// ids [FromID, ToID]; on a partitioned one, DropPartitions.
type OutboxPurgePlan struct {
	Partitioned     bool       `json:"partitioned"`
	Rows            int64      `json:"rows"`
	FromID          int64      `json:"from_id,omitempty"`
	ToID            int64      `json:"to_id,omitempty"`
	OldestPublished *time.Time `json:"oldest_published,omitempty"`
	NewestPublished *time.Time `json:"newest_published,omitempty"`
	DropPartitions  []string   `json:"drop_partitions,omitempty"`
}

// InboxPurgePlan is the inbox part of a PurgePlan.
type InboxPurgePlan struct {
	Partitioned    bool            `json:"partitioned"`
	Rows           int64           `json:"rows"`
	Consumers      []ConsumerPurge `json:"consumers,omitempty"`
	DropPartitions []string        `json:"drop_partitions,omitempty"`
}

// ConsumerPurge is one consumer's rows in an InboxPurgePlan.
type ConsumerPurge struct {
	Consumer        string    `json:"consumer"`
	Rows            int64     `json:"rows"`
	OldestProcessed time.Time `json:"oldest_processed"`
	NewestProcessed time.Time `json:"newest_processed"`
}

// PurgeResult is what Purge planned and deleted.
type PurgeResult struct {
	Plan PurgePlan
	// OutboxPurged and InboxPurged report which tables were purged to the end; OutboxDeleted
	// and InboxDeleted how many rows each lost (also when an error stopped it midway).
	OutboxPurged, InboxPurged   bool
	OutboxDeleted, InboxDeleted int64
	// Warning is set when AllowDuplicateApplies let an inbox purge through.
	Warning string
}

// Purge deletes published outbox rows and processed inbox rows older than opts.OlderThan, in
// bounded batches; unpublished, quarantined, unprocessed and parked rows are never deleted.
// It checks the inbox retention first (with opts.Queues, c is required), then plans from one
// cutoff, asks opts.Confirm, and deletes with that cutoff. When ctx ends it stops after the
// statement in flight and returns an error wrapping ErrInterrupted.
func Purge(ctx context.Context, db DB, c SQSAPI, opts PurgeOptions) (PurgeResult, error) {
	if err := opts.validate(); err != nil {
		return PurgeResult{}, err
	}
	var res PurgeResult
	doInbox, doOutbox := !opts.OutboxOnly, !opts.InboxOnly
	if doInbox {
		var err error
		res.Plan.RetentionBound, res.Plan.RetentionFrom, res.Warning, err = checkInboxRetention(ctx, c, opts.InboxSources, opts.OlderThan, opts.AllowDuplicateApplies, "purge")
		if err != nil {
			return res, err
		}
	}
	var planNow time.Time
	if err := db.QueryRow(ctx, "SELECT now()").Scan(&planNow); err != nil {
		return res, fmt.Errorf("read the database clock: %w", err)
	}
	res.Plan.Cutoff = planNow.Add(-opts.OlderThan)
	if doOutbox {
		p, err := planOutboxPurge(ctx, db, res.Plan.Cutoff, opts)
		if err != nil {
			return res, err
		}
		res.Plan.Outbox = &p
	}
	if doInbox {
		p, err := planInboxPurge(ctx, db, res.Plan.Cutoff, opts)
		if err != nil {
			return res, err
		}
		res.Plan.Inbox = &p
	}
	if opts.Confirm != nil {
		if err := opts.Confirm(res.Plan); err != nil {
			return res, err
		}
	}
	if opts.DryRun {
		return res, nil
	}
	// The run deletes with the plan's cutoff: its retention is OlderThan plus the time the plan
	// and the confirmation took.
	var runNow time.Time
	if err := db.QueryRow(ctx, "SELECT now()").Scan(&runNow); err != nil {
		return res, fmt.Errorf("read the database clock: %w", err)
	}
	olderThan := runNow.Sub(res.Plan.Cutoff)
	work, atBatch, interrupted, cancel := stopAtBatch(ctx)
	defer cancel()
	progress := func(table string, planned int64) func(int64) {
		return func(n int64) {
			if opts.Progress != nil {
				opts.Progress(table, planned, n)
			}
			atBatch()
		}
	}
	stopped := func(table string, n int64, err error) error {
		if interrupted() {
			return fmt.Errorf("%w after deleting %d rows of %s at a batch boundary; what was deleted stays deleted: run the same command to continue", ErrInterrupted, n, table)
		}
		return fmt.Errorf("after deleting %d %s rows: %w", n, table, err)
	}
	var err error
	if doOutbox {
		res.OutboxDeleted, err = outbox.Purge(work, db, olderThan, &outbox.PurgeOptions{BatchSize: opts.BatchSize, Progress: progress("outbox_event", res.Plan.Outbox.Rows)})
		if err != nil {
			return res, stopped("outbox_event", res.OutboxDeleted, err)
		}
		res.OutboxPurged = true
	}
	if doInbox {
		res.InboxDeleted, err = inbox.Purge(work, db, olderThan, &inbox.PurgeOptions{Consumer: opts.Consumer, BatchSize: opts.BatchSize, Progress: progress("inbox_event", res.Plan.Inbox.Rows)})
		if err != nil {
			return res, stopped("inbox_event", res.InboxDeleted, err)
		}
		res.InboxPurged = true
	}
	return res, nil
}

// planPartitionDrop reports whether table t is partitioned and, if so, the partitions a purge
// with cutoff drops and their estimated rows (partition.Maintain's dry run).
func planPartitionDrop(ctx context.Context, db DB, t *partition.Table, cutoff time.Time) (partitioned bool, drop []string, rows int64, err error) {
	layout, err := partition.Read(ctx, db, t)
	if err != nil || !layout.Partitioned {
		return false, nil, 0, err
	}
	rep, err := partition.Maintain(ctx, db, t, &partition.Options{Retention: time.Since(cutoff), DryRun: true})
	for _, d := range rep.Dropped {
		rows += max(d.Rows, 0)
	}
	return true, describeAll(rep.Dropped), rows, err
}

// planOutboxPurge counts what outbox.Purge deletes with cutoff. On a plain table it walks the
// rows as the purge does (batches of BatchSize rows in id order, stopping after the first batch
// that holds a row created after the cutoff); on a partitioned one it asks partition.Maintain
// for a dry run.
func planOutboxPurge(ctx context.Context, db DB, cutoff time.Time, opts PurgeOptions) (OutboxPurgePlan, error) {
	partitioned, drop, rows, err := planPartitionDrop(ctx, db, partition.Outbox, cutoff)
	if err != nil || partitioned {
		return OutboxPurgePlan{Partitioned: partitioned, DropPartitions: drop, Rows: rows}, err
	}
	batch := opts.BatchSize
	if batch == 0 {
		batch = outbox.DefaultPurgeBatchSize
	}
	var p OutboxPurgePlan
	var from, to *int64
	err = db.QueryRow(ctx, `
		WITH r AS (SELECT id, created_at, published_at, row_number() OVER (ORDER BY id) AS rn FROM outbox_event),
		     stop AS (SELECT coalesce(((min(rn) - 1) / $2 + 1) * $2, 9223372036854775807) AS lim FROM r WHERE created_at >= $1)
		SELECT count(*), min(id), max(id), min(published_at), max(published_at)
		FROM r, stop WHERE r.rn <= stop.lim AND r.published_at < $1`, cutoff, int64(batch)).
		Scan(&p.Rows, &from, &to, &p.OldestPublished, &p.NewestPublished)
	if err != nil {
		return p, fmt.Errorf("plan the outbox purge: %w", err)
	}
	if from != nil {
		p.FromID, p.ToID = *from, *to
	}
	return p, nil
}

// planInboxPurge counts what inbox.Purge deletes with cutoff.
func planInboxPurge(ctx context.Context, db DB, cutoff time.Time, opts PurgeOptions) (InboxPurgePlan, error) {
	if opts.Consumer == "" {
		partitioned, drop, rows, err := planPartitionDrop(ctx, db, partition.Inbox, cutoff)
		if err != nil || partitioned {
			return InboxPurgePlan{Partitioned: partitioned, DropPartitions: drop, Rows: rows}, err
		}
	}
	rows, err := db.Query(ctx, `
		SELECT consumer, count(*), min(processed_at), max(processed_at) FROM inbox_event
		WHERE processed_at IS NOT NULL AND processed_at < $1 AND ($2 = '' OR consumer = $2)
		GROUP BY consumer ORDER BY consumer`, cutoff, opts.Consumer)
	if err != nil {
		return InboxPurgePlan{}, fmt.Errorf("plan the inbox purge: %w", err)
	}
	cs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (ConsumerPurge, error) {
		var c ConsumerPurge
		return c, r.Scan(&c.Consumer, &c.Rows, &c.OldestProcessed, &c.NewestProcessed)
	})
	if err != nil {
		return InboxPurgePlan{}, fmt.Errorf("plan the inbox purge: %w", err)
	}
	p := InboxPurgePlan{Consumers: cs}
	for _, c := range cs {
		p.Rows += c.Rows
	}
	return p, nil
}

// queuesRetention returns the longest message retention among queues and their DLQs, and
// which queue has it.
func queuesRetention(ctx context.Context, c SQSAPI, queues []string) (time.Duration, string, error) {
	var longest time.Duration
	var from string
	for _, u := range queues {
		q, err := describeQueue(ctx, c, u)
		if err != nil {
			return 0, "", err
		}
		if r := time.Duration(q.RetentionSeconds) * time.Second; r > longest {
			longest, from = r, u
		}
		if q.DLQARN != "" {
			dlqURL, err := urlOfARN(ctx, c, q.DLQARN)
			if err != nil {
				return 0, "", fmt.Errorf("DLQ of %s: %w", u, err)
			}
			d, err := describeQueue(ctx, c, dlqURL)
			if err != nil {
				return 0, "", fmt.Errorf("DLQ of %s: %w", u, err)
			}
			if r := time.Duration(d.RetentionSeconds) * time.Second; r > longest {
				longest, from = r, dlqURL+" (DLQ of "+q.Name+")"
			}
		}
	}
	return longest, from, nil
}
