package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"

	"github.com/sluicehq/sluice/pkg/partition"
)

// DB runs single statements and transactions: what partition commands need (a *pgxpool.Pool).
type DB interface {
	Querier
	Begin(ctx context.Context) (pgx.Tx, error)
}

func (a *app) partitionCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "partition status|convert|maintain",
		Short: "Partitioned outbox and inbox tables: show, convert, create ahead and drop expired partitions",
		Long: `outbox_event and inbox_event are plain tables by default. A partitioned table lets retention drop
whole partitions instead of deleting rows: at high volume this replaces a long DELETE and its index
bloat with a catalog change. outbox_event is partitioned by RANGE (id), each partition sized from the
observed rate of new ids to fill in about --interval; inbox_event by RANGE (received_at), one
partition per --interval. 'sluice migrate' never converts a table: 'sluice partition convert' does,
explicitly (see docs/schema.md, "Partitioned tables").

Partitions must be created ahead of the rows: the relay Lambda does it for the outbox at every
invocation, and 'sluice partition maintain' (or 'sluice purge') for both; rows beyond the partitions
created go to a default partition, which is purged row by row.`,
		Example: `  sluice partition status
  sluice partition convert outbox             # prints the plan, changes nothing
  sluice partition convert outbox --yes
  sluice partition maintain --older-than 30d --queue https://sqs.eu-west-1.amazonaws.com/123456789012/billing`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(a.partitionStatusCommand(), a.partitionConvertCommand(), a.partitionMaintainCommand())
	readsOnly(cmd)
	return cmd
}

// PartitionStatus is how the outbox and inbox tables are stored.
type PartitionStatus struct {
	Outbox partition.Layout `json:"outbox"`
	Inbox  partition.Layout `json:"inbox"`
}

// of returns the layout of table t.
func (st *PartitionStatus) of(t *partition.Table) *partition.Layout {
	if t == partition.Inbox {
		return &st.Inbox
	}
	return &st.Outbox
}

// ReadPartitions returns how outbox_event and inbox_event are stored, from the catalog alone.
func ReadPartitions(ctx context.Context, db Querier) (PartitionStatus, error) {
	var st PartitionStatus
	for _, t := range partition.Tables() {
		l, err := partition.Read(ctx, db, t)
		if err != nil {
			return st, err
		}
		*st.of(t) = l
	}
	return st, nil
}

func (a *app) partitionStatusCommand() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:     "status",
		Short:   "Show whether outbox_event and inbox_event are partitioned, and their partitions",
		Example: "  sluice partition status\n  sluice partition status --json",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			pool, err := a.db(ctx)
			if err != nil {
				return err
			}
			st, err := ReadPartitions(ctx, pool)
			if err != nil {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(a.io.Out)
				enc.SetIndent("", "  ")
				return enc.Encode(st)
			}
			for _, t := range partition.Tables() {
				printLayout(a.io.Out, t, *st.of(t))
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	readsOnly(cmd)
	return cmd
}

// boundText renders a bound of table t's partitions: an id, or a time for the inbox.
func boundText(t *partition.Table, v int64) string {
	if v == math.MinInt64 {
		return "MINVALUE"
	}
	if at, ok := t.Time(v); ok {
		return at.Format(time.RFC3339)
	}
	return fmt.Sprint(v)
}

func printLayout(w io.Writer, t *partition.Table, l partition.Layout) {
	if !l.Partitioned {
		fmt.Fprintf(w, "%s: plain table\n", t)
		if l.ConversionBound != 0 {
			fmt.Fprintf(w, "  a conversion started and did not finish: rows from %s on are refused; run 'sluice partition convert' again\n", boundText(t, l.ConversionBound))
		}
		return
	}
	fmt.Fprintf(w, "%s: partitioned, %d partitions\n", t, len(l.Partitions))
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  NAME\tFROM\tTO\tROWS (ESTIMATE)")
	for _, p := range l.Partitions {
		rows := "?"
		if p.Rows >= 0 {
			rows = fmt.Sprint(p.Rows)
		}
		from, to := "(default)", ""
		if !p.Default {
			from, to = boundText(t, p.From), boundText(t, p.To)
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", p.Name, from, to, rows)
	}
	_ = tw.Flush()
}

// PartitionConvertOptions configure ConvertPartitioned.
type PartitionConvertOptions struct {
	// Table is "outbox" or "inbox". Required.
	Table string
	// Interval, Ahead and Size are the partitions' (see partition.Options); zero takes the
	// defaults. Size applies to the outbox.
	Interval time.Duration
	Ahead    int
	Size     int64
	// Yes converts; without it ConvertPartitioned only plans and returns ErrNotConfirmed.
	Yes bool
	// Confirm, when set, is given the plan before anything changes (with Yes); an error stops
	// it, nothing changed.
	Confirm func(PartitionConvertResult) error
	// Progress receives each completed step (nil for none).
	Progress func(step string)
}

// ErrNotConfirmed is returned by ConvertPartitioned without Yes, and by a destructive command
// that was not confirmed (no --yes and no terminal, or the operator said no): nothing was
// changed.
var ErrNotConfirmed = errors.New("not confirmed")

func (o PartitionConvertOptions) validate() error {
	switch {
	case o.Table != "outbox" && o.Table != "inbox":
		return usagef("convert which table? give outbox or inbox, got %q", o.Table)
	case o.Interval < 0:
		return usagef("--interval must be positive")
	case o.Ahead < 0:
		return usagef("--ahead must not be negative")
	case o.Size < 0:
		return usagef("--size must not be negative")
	case o.Size > 0 && o.Table == "inbox":
		return usagef("--size applies to the outbox only: inbox partitions span --interval each")
	}
	return nil
}

// PartitionConvertResult is what a conversion does (Steps, Notes), and whether it ran.
type PartitionConvertResult struct {
	Table     string
	Steps     []string
	Notes     []string
	Converted bool
}

// ConvertPartitioned plans the conversion of outbox_event or inbox_event to a partitioned
// table and, with opts.Yes, runs it. Without Yes it returns the plan and an error wrapping
// ErrNotConfirmed, having changed nothing.
func ConvertPartitioned(ctx context.Context, db DB, opts PartitionConvertOptions) (PartitionConvertResult, error) {
	if err := opts.validate(); err != nil {
		return PartitionConvertResult{}, err
	}
	t := partition.Outbox
	if opts.Table == "inbox" {
		t = partition.Inbox
	}
	res := PartitionConvertResult{Table: t.Name()}
	o := &partition.Options{Interval: opts.Interval, Ahead: opts.Ahead, Size: opts.Size}
	plan, err := partition.PlanConversion(ctx, db, t, o)
	if err != nil {
		return res, err
	}
	res.Steps, res.Notes = plan.Steps, plan.Notes
	if !opts.Yes {
		return res, fmt.Errorf("refusing to convert %s without --yes (%w): nothing was changed", t, ErrNotConfirmed)
	}
	if opts.Confirm != nil {
		if err := opts.Confirm(res); err != nil {
			return res, err
		}
	}
	_, err = partition.Convert(ctx, db, t, o, opts.Progress)
	res.Converted = err == nil
	return res, err
}

func (a *app) partitionConvertCommand() *cobra.Command {
	var (
		opts PartitionConvertOptions
		g    guard
	)
	cmd := &cobra.Command{
		Use:   "convert outbox|inbox [--interval D] [--ahead N] [--size N] [--dry-run] [--yes]",
		Short: "Convert outbox_event or inbox_event to a partitioned table, without copying a row",
		Long: `Convert outbox_event (partitioned by RANGE (id)) or inbox_event (by RANGE (received_at)) to a
partitioned table. No row is copied, moved or deleted: the plain table becomes the first partition of
a new partitioned table of the same name, with the same columns, constraints, identity, indexes,
grants, row-level security policies and owner; partitions are created ahead of it.

It prints the plan first; --dry-run stops there. On a terminal it asks for confirmation; --yes
confirms for scripts; without a terminal and without --yes it refuses. Producers, relays and consumers keep running: the
table is validated and indexed while writers continue, then switched in a transaction that holds an
ACCESS EXCLUSIVE lock for milliseconds. Upgrade every consumer to this version before converting the
inbox (older ones fail every record until upgraded). An interrupted conversion is finished by running
it again. There is no automatic way back to a plain table.`,
		Example: `  sluice partition convert outbox --dry-run
  sluice partition convert outbox --yes
  sluice partition convert inbox --interval 7d --yes`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			opts.Table = args[0]
			if err := opts.validate(); err != nil {
				return err
			}
			pool, err := a.db(ctx)
			if err != nil {
				return err
			}
			opts.Progress = func(s string) {
				if g.json {
					emitJSON(a.io.Out, map[string]any{"event": "progress", "op": "partition convert", "done": s})
					return
				}
				fmt.Fprintln(a.io.Out, "done: "+s)
			}
			opts.Yes = true // the guard asks: Confirm
			opts.Confirm = func(plan PartitionConvertResult) error {
				a.printPlan(g, "partition convert", plan, func(w io.Writer) {
					fmt.Fprintf(w, "Converting %s to a partitioned table:\n", plan.Table)
					for i, s := range plan.Steps {
						fmt.Fprintf(w, "  %d. %s\n", i+1, s)
					}
					for _, n := range plan.Notes {
						fmt.Fprintln(w, "  note: "+n)
					}
				})
				return a.proceedOrStop(g, "Convert "+plan.Table+"?", "convert "+plan.Table)
			}
			res, err := ConvertPartitioned(ctx, pool, opts)
			if g.json && err == nil {
				emitJSON(a.io.Out, map[string]any{"event": "result", "op": "partition convert", "table": res.Table, "converted": res.Converted})
			}
			return ignoreDryRun(err)
		},
	}
	fl := cmd.Flags()
	fl.Var(&durationValue{d: &opts.Interval}, "interval", fmt.Sprintf("time one partition covers (inbox) or fills in at the observed rate (outbox) (default %s)", FormatDuration(partition.DefaultInterval)))
	fl.IntVar(&opts.Ahead, "ahead", 0, fmt.Sprintf("empty partitions to keep ready (default %d)", partition.DefaultAhead))
	fl.Int64Var(&opts.Size, "size", 0, "ids per outbox partition instead of a size from the observed rate")
	g.flags(cmd, "be done")
	return cmd
}

// PartitionMaintainOptions configure MaintainPartitions.
type PartitionMaintainOptions struct {
	// OlderThan, when positive, drops partitions whose rows were all published (outbox) or
	// processed (inbox) longer ago. Defaults to 0: only create partitions ahead.
	OlderThan time.Duration
	// InboxSources name the inbox consumers' queues, streams and topics: dropping inbox
	// partitions is refused when OlderThan is not longer than the longest retention among them
	// (without any, SQS's 14-day maximum), as in Purge.
	InboxSources
	// AllowDuplicateApplies drops inbox partitions even then. Defaults to false: ErrGuarantee.
	AllowDuplicateApplies bool
	// OutboxOnly and InboxOnly maintain one table only; at most one may be set.
	OutboxOnly, InboxOnly bool
	// Interval, Ahead, Size and LockTimeout are partition.Options'; zero takes their
	// defaults. Size applies to the outbox.
	Interval    time.Duration
	Ahead       int
	Size        int64
	LockTimeout time.Duration
	// DryRun reports the partitions that would be dropped (Plan) and changes nothing.
	DryRun bool
	// Confirm is given the plan of a drop (OlderThan positive) before anything changes, also
	// on a dry run; an error stops it. Defaults to nil: no confirmation.
	Confirm func(PartitionMaintainResult) error
	// Progress is told each table as it is done. Defaults to nil.
	Progress func(table string, done, total int64)
}

func (o PartitionMaintainOptions) validate() error {
	switch {
	case o.OlderThan < 0:
		return usagef("--older-than must be positive")
	case o.OutboxOnly && o.InboxOnly:
		return usagef("--outbox-only and --inbox-only exclude each other")
	case o.Interval < 0 || o.Ahead < 0 || o.Size < 0 || o.LockTimeout < 0:
		return usagef("--interval, --ahead, --size and --lock-timeout must not be negative")
	}
	return nil
}

// PartitionMaintainResult is what MaintainPartitions did (or, as a plan, would drop) to each
// table.
type PartitionMaintainResult struct {
	Outbox *partition.Report `json:"outbox,omitempty"`
	Inbox  *partition.Report `json:"inbox,omitempty"`
	// Warning is set when AllowDuplicateApplies let an inbox drop through.
	Warning string `json:"warning,omitempty"`
}

// of returns the report field of table t.
// partitioned reports whether any table maintained is partitioned (on a plain one
// maintenance does nothing).
func (r *PartitionMaintainResult) partitioned() bool {
	for _, t := range partition.Tables() {
		if rep := *r.of(t); rep != nil && rep.Partitioned {
			return true
		}
	}
	return false
}

func (r *PartitionMaintainResult) of(t *partition.Table) **partition.Report {
	if t == partition.Inbox {
		return &r.Inbox
	}
	return &r.Outbox
}

// MaintainPartitions creates partitions ahead and, with OlderThan, drops expired ones, on each
// partitioned table (a plain table is left alone). Before a drop it checks the inbox retention
// (with opts.Queues, c is required), plans with a dry run, and asks opts.Confirm.
func MaintainPartitions(ctx context.Context, db DB, c SQSAPI, opts PartitionMaintainOptions) (PartitionMaintainResult, error) {
	var res PartitionMaintainResult
	if err := opts.validate(); err != nil {
		return res, err
	}
	doInbox, doOutbox := !opts.OutboxOnly, !opts.InboxOnly
	if doInbox && opts.OlderThan > 0 {
		var err error
		if _, _, res.Warning, err = checkInboxRetention(ctx, c, opts.InboxSources, opts.OlderThan, opts.AllowDuplicateApplies, "drop inbox partitions"); err != nil {
			return res, err
		}
	}
	var tables []*partition.Table
	for _, t := range partition.Tables() {
		if t == partition.Outbox && doOutbox || t == partition.Inbox && doInbox {
			tables = append(tables, t)
		}
	}
	run := func(dry bool) (PartitionMaintainResult, error) {
		out := PartitionMaintainResult{Warning: res.Warning}
		for i, t := range tables {
			if i > 0 && !dry && ctx.Err() != nil {
				return out, fmt.Errorf("%w after maintaining %s; run the same command to maintain %s", ErrInterrupted, tables[i-1], t)
			}
			rep, err := partition.Maintain(ctx, db, t, &partition.Options{Interval: opts.Interval, Ahead: opts.Ahead, Size: opts.Size,
				Retention: opts.OlderThan, LockTimeout: opts.LockTimeout, DryRun: dry})
			*out.of(t) = &rep
			if err != nil {
				return out, err
			}
			if !dry && opts.Progress != nil {
				opts.Progress(t.Name(), int64(i+1), int64(len(tables)))
			}
		}
		return out, nil
	}
	if opts.OlderThan > 0 || opts.DryRun {
		plan, err := run(true)
		if err != nil || opts.Confirm == nil && opts.DryRun {
			return plan, err
		}
		if !opts.DryRun && !plan.partitioned() {
			return plan, nil // plain tables: nothing to create or drop, nothing to confirm
		}
		if opts.Confirm != nil {
			if err := opts.Confirm(plan); err != nil {
				return plan, err
			}
		}
		if opts.DryRun {
			return plan, nil
		}
	}
	return run(false)
}

func (a *app) partitionMaintainCommand() *cobra.Command {
	var (
		opts PartitionMaintainOptions
		g    guard
	)
	cmd := &cobra.Command{
		Use:   "maintain [--older-than D [--queue URL ...]] [--outbox-only|--inbox-only] [--dry-run] [--yes]",
		Short: "Create partitions ahead and drop the partitions whose rows all expired",
		Long: `On each partitioned table (plain tables are left alone): create partitions until --ahead empty ones
are ready, and with --older-than drop every partition whose rows were all published (outbox) or
processed (inbox) longer ago, and delete such rows from the default partition. A partition holding
an unpublished, quarantined, unprocessed or parked row is never dropped; each is checked again under
a lock that makes writers wait, for at most --lock-timeout.

With --older-than it first prints the partitions it would drop; --dry-run stops there (and creates
nothing). On a terminal it asks for confirmation; --yes confirms for scripts; without a terminal and
without --yes it refuses and changes nothing. Creating partitions ahead alone needs no confirmation.

As with 'sluice purge', dropped inbox rows no longer deduplicate redelivered messages: it refuses an
--older-than not longer than the consumers' queue and DLQ retention (--queue; without it SQS's 14-day
maximum) unless --allow-duplicate-applies accepts that risk. Ctrl-C stops between tables.`,
		Example: `  sluice partition maintain
  sluice partition maintain --older-than 30d --queue https://sqs.eu-west-1.amazonaws.com/123456789012/billing --dry-run
  sluice partition maintain --outbox-only --older-than 7d --yes`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			if err := opts.validate(); err != nil {
				return err
			}
			var c SQSAPI
			if !opts.OutboxOnly && opts.OlderThan > 0 {
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
			if opts.OlderThan > 0 || g.dryRun {
				opts.Confirm = func(plan PartitionMaintainResult) error {
					a.printMaintainPlan(plan, g)
					if opts.OlderThan <= 0 {
						return errDryRun
					}
					ok, err := a.proceed(g, "Drop these partitions?", "drop partitions")
					if err == nil && !ok {
						return errDryRun
					}
					return err
				}
			}
			m := a.newMeter(g.json, "partition maintain", "tables", "done", "tables", 0)
			opts.Progress = func(table string, done, total int64) { m.total = total; m.update(done) }
			res, err := MaintainPartitions(ctx, pool, c, opts)
			if errors.Is(err, errDryRun) {
				return nil
			}
			m.finish()
			if res.Warning != "" {
				fmt.Fprintln(a.io.Err, "warning: "+res.Warning)
			}
			if g.json {
				emitJSON(a.io.Out, map[string]any{"event": "result", "op": "partition maintain", "result": res, "interrupted": errors.Is(err, ErrInterrupted)})
				return err
			}
			a.printMaintenanceResult(res, "")
			return err
		},
	}
	fl := cmd.Flags()
	fl.Var(&durationValue{d: &opts.OlderThan}, "older-than", "retention: drop partitions whose rows were all published/processed longer ago (e.g. 30d)")
	opts.InboxSources.flags(fl)
	fl.BoolVar(&opts.OutboxOnly, "outbox-only", false, "maintain only the outbox")
	fl.BoolVar(&opts.InboxOnly, "inbox-only", false, "maintain only the inbox")
	fl.Var(&durationValue{d: &opts.Interval}, "interval", fmt.Sprintf("time one new partition covers (inbox) or fills in at the observed rate (outbox) (default %s)", FormatDuration(partition.DefaultInterval)))
	fl.IntVar(&opts.Ahead, "ahead", 0, fmt.Sprintf("empty partitions to keep ready (default %d)", partition.DefaultAhead))
	fl.Int64Var(&opts.Size, "size", 0, "ids per new outbox partition instead of a size from the observed rate")
	fl.Var(&durationValue{d: &opts.LockTimeout}, "lock-timeout", fmt.Sprintf("longest wait for a partition change's lock (default %s)", partition.DefaultLockTimeout))
	fl.BoolVar(&opts.AllowDuplicateApplies, "allow-duplicate-applies", false,
		"drop inbox partitions even when --older-than is not longer than the retention a message can come back from (it will then be applied twice)")
	g.flags(cmd, "be dropped")
	return cmd
}

// printMaintainPlan prints the partitions a maintenance would drop.
func (a *app) printMaintainPlan(plan PartitionMaintainResult, g guard) {
	if g.json {
		emitJSON(a.io.Out, map[string]any{"event": "plan", "op": "partition maintain", "dry_run": g.dryRun, "plan": plan})
		return
	}
	if g.dryRun {
		fmt.Fprintln(a.io.Out, "Dry run (nothing is created or dropped):")
	}
	a.printMaintenanceResult(plan, "would ")
}

func (a *app) printMaintenanceResult(res PartitionMaintainResult, would string) {
	for _, t := range partition.Tables() {
		if r := *res.of(t); r != nil {
			printMaintenance(a.io.Out, a.io.Err, t.Name(), would, r)
		}
	}
}

// describeAll renders partitions for people.
func describeAll(ps []partition.Partition) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.String()
	}
	return out
}

func printMaintenance(out, errw io.Writer, table, would string, r *partition.Report) {
	partitioned, purged, warnings, created, dropped := r.Partitioned, r.Purged, r.Warnings, describeAll(r.Created), describeAll(r.Dropped)
	var kept []string
	for _, k := range r.Kept {
		kept = append(kept, k.String()+": "+k.Reason)
	}
	if !partitioned {
		fmt.Fprintf(out, "%s: plain table, nothing to do (see 'sluice partition convert')\n", table)
	}
	past := func(done, plan string) string {
		if would != "" {
			return would + plan
		}
		return done
	}
	for _, s := range created {
		fmt.Fprintf(out, "%s: %s %s\n", table, past("created", "create"), s)
	}
	for _, s := range dropped {
		fmt.Fprintf(out, "%s: %s %s\n", table, past("dropped", "drop"), s)
	}
	for _, s := range kept {
		fmt.Fprintf(out, "%s: %s %s\n", table, past("kept", "keep"), s)
	}
	if would != "" && partitioned {
		fmt.Fprintf(out, "%s: expired rows of the default partition, if any, are deleted row by row (not counted in the plan)\n", table)
	}
	if purged > 0 {
		fmt.Fprintf(out, "%s: deleted %d expired rows from the default partition\n", table, purged)
	}
	if partitioned && len(created)+len(dropped)+len(kept) == 0 && purged == 0 {
		fmt.Fprintf(out, "%s: nothing to do\n", table)
	}
	for _, w := range warnings {
		fmt.Fprintln(errw, "warning: "+strings.TrimSpace(w))
	}
}
