package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluicehq/sluice/pkg/outbox"
)

func (a *app) replayCommand() *cobra.Command {
	var (
		opts ReplayOptions
		g    guard
	)
	f := &opts.Filter
	cmd := &cobra.Command{
		Use:   "replay --since T [--until T] [--topic X] [--aggregate-type A] [--aggregate-id ID] [--dry-run] [--yes]",
		Short: "Publish a range of already-published events again (same event_id)",
		Long: `Mark published outbox rows created in [--since, --until) as unpublished, so the relay
publishes them again with the same event_id: existing consumers recognise them as duplicates in
their inbox, while a new or rebuilt consumer applies the history. Each partition key's events go
out again in their original order.

It first counts the matching rows and their id range; --dry-run stops there. On a terminal it
asks for confirmation; --yes confirms for scripts; without a terminal and without --yes it
refuses and changes nothing. It then marks them in bounded batches (--batch-size ids per
statement, each its own transaction) in id order, never past the counted range, so a row
created meanwhile is not replayed; the count it prints at the end is exactly the rows it
marked (fewer than counted when some were made unpublished meanwhile). Progress is a bar on a
terminal, lines otherwise, JSON lines with --json. Ctrl-C stops after the batch in flight; the
rows of the batches done stay marked (running it again marks them again too; consumers
deduplicate them).

A running relay (the Lambda, or 'sluice relay') publishes the rows; 'sluice relay --once'
drains them by hand.

Times are RFC 3339 (2026-11-28T09:00:00Z), a date (midnight UTC), "now", or relative (-2h, -7d).
--until defaults to now.`,
		Example: `  sluice replay --since -2h --topic orders --dry-run
  sluice replay --since 2026-11-28T00:00:00Z --until 2026-11-29T00:00:00Z --aggregate-type order --yes
  sluice replay --since -7d --aggregate-type order --aggregate-id o-1042 --yes --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			if f.Until.IsZero() {
				f.Until = time.Now() // "now" is when the command started, in the plan and the run
			}
			if err := opts.validate(); err != nil {
				return err
			}
			pool, err := a.db(ctx)
			if err != nil {
				return err
			}
			opts.DryRun = g.dryRun
			printPlan := func(p outbox.ReplayPlan) {
				a.printPlan(g, "replay", map[string]any{"rows": p.Rows, "first_id": p.FirstID, "last_id": p.LastID, "filter": describeFilter(*f)},
					func(w io.Writer) {
						fmt.Fprintf(w, "%d published events match %s", p.Rows, describeFilter(*f))
						if p.Rows > 0 {
							fmt.Fprintf(w, ", ids %d..%d", p.FirstID, p.LastID)
						}
						fmt.Fprintln(w)
					})
			}
			opts.Confirm = func(p outbox.ReplayPlan) error {
				printPlan(p)
				return a.proceedOrStop(g, fmt.Sprintf("Publish these %d events again?", p.Rows), fmt.Sprintf("replay %d events", p.Rows))
			}
			var m *meter
			opts.Progress = func(plan outbox.ReplayPlan, marked, lastID int64) {
				if m == nil {
					m = a.newMeter(g.json, "replay", "outbox_event", "ids walked", "ids", plan.LastID-plan.FirstID+1)
				}
				m.update(lastID - plan.FirstID + 1)
			}
			res, err := Replay(ctx, pool, opts)
			if m != nil {
				m.finish()
			}
			if errors.Is(err, errDryRun) {
				return nil
			}
			if opts.DryRun || res.Plan.Rows == 0 {
				printPlan(res.Plan)
				return err
			}
			interrupted := errors.Is(err, ErrInterrupted)
			if g.json {
				emitJSON(a.io.Out, map[string]any{"event": "result", "op": "replay", "matching": res.Plan.Rows, "marked": res.Marked,
					"interrupted": interrupted})
				return err
			}
			if err == nil {
				fmt.Fprintf(a.io.Out, "marked %d events for publishing again; the relay publishes them (or run: sluice relay --once)\n", res.Marked)
				if res.Marked < res.Plan.Rows {
					fmt.Fprintf(a.io.Out, "%d of the %d counted were no longer published when their batch ran (already pending again)\n", res.Plan.Rows-res.Marked, res.Plan.Rows)
				}
			}
			return err
		},
	}
	fl := cmd.Flags()
	now := time.Now
	fl.Var(&timeValue{t: &f.Since, now: now}, "since", "replay events created at or after this time (required)")
	fl.Var(&timeValue{t: &f.Until, now: now}, "until", "replay events created before this time (default now)")
	fl.StringVar(&f.Topic, "topic", "", "only this logical topic")
	fl.StringVar(&f.AggregateType, "aggregate-type", "", "only this aggregate type")
	fl.StringVar(&f.AggregateID, "aggregate-id", "", "only this aggregate id")
	fl.IntVar(&opts.BatchSize, "batch-size", 0, fmt.Sprintf("most ids one UPDATE statement examines (default %d)", outbox.DefaultPurgeBatchSize))
	g.flags(cmd, "be marked for publishing again")
	return cmd
}

func describeFilter(f outbox.ReplayFilter) string {
	until := "now"
	if !f.Until.IsZero() {
		until = f.Until.UTC().Format(time.RFC3339)
	}
	parts := []string{fmt.Sprintf("created in [%s, %s)", f.Since.UTC().Format(time.RFC3339), until)}
	if f.Topic != "" {
		parts = append(parts, "topic="+f.Topic)
	}
	if f.AggregateType != "" {
		parts = append(parts, "aggregate_type="+f.AggregateType)
	}
	if f.AggregateID != "" {
		parts = append(parts, "aggregate_id="+f.AggregateID)
	}
	return strings.Join(parts, " ")
}

// ReplayOptions configure Replay.
type ReplayOptions struct {
	// Filter chooses the published rows to publish again. Filter.Since is required.
	Filter outbox.ReplayFilter
	// DryRun only counts.
	DryRun bool
	// BatchSize is the most ids one statement examines. Defaults to
	// outbox.DefaultPurgeBatchSize.
	BatchSize int
	// Confirm is given the plan (the matching rows and their ids) before anything changes; an
	// error stops the replay. It is not called on a dry run nor when nothing matches. Defaults
	// to nil: no confirmation.
	Confirm func(outbox.ReplayPlan) error
	// Progress, when set, is called after each batch with the plan, the rows marked so far and
	// the highest id reached.
	Progress func(plan outbox.ReplayPlan, marked, lastID int64)
}

func (o ReplayOptions) validate() error {
	if o.Filter.Since.IsZero() {
		return usagef("--since is required (e.g. --since -2h or --since 2026-11-28T00:00:00Z)")
	}
	if !o.Filter.Until.IsZero() && !o.Filter.Until.After(o.Filter.Since) {
		return usagef("--until (%s) must be after --since (%s)", o.Filter.Until.Format(time.RFC3339), o.Filter.Since.Format(time.RFC3339))
	}
	if o.BatchSize < 0 {
		return usagef("--batch-size must not be negative (0 means the default)")
	}
	return nil
}

// ReplayResult is what Replay found and did.
type ReplayResult struct {
	// Plan is what the filter matched when counted: the rows and the range of their ids.
	Plan outbox.ReplayPlan
	// Marked is exactly the number of rows marked unpublished (zero on a dry run or without a
	// match): at most Plan.Rows, fewer when some became unpublished meanwhile.
	Marked int64
}

// Replay marks the published outbox rows opts.Filter matches as unpublished, so that the relay
// publishes them again with the same event_id. It plans first (the rows and their id range),
// asks opts.Confirm, then marks them in batches (outbox.ReplayBatches) within that id range,
// so no row created after the plan is replayed.
func Replay(ctx context.Context, db Querier, opts ReplayOptions) (ReplayResult, error) {
	if err := opts.validate(); err != nil {
		return ReplayResult{}, err
	}
	var res ReplayResult
	var err error
	if res.Plan, err = outbox.PlanReplay(ctx, db, opts.Filter); err != nil {
		return res, err
	}
	if res.Plan.Rows == 0 || opts.DryRun {
		return res, nil
	}
	if opts.Confirm != nil {
		if err := opts.Confirm(res.Plan); err != nil {
			return res, err
		}
	}
	work, atBatch, interrupted, cancel := stopAtBatch(ctx)
	defer cancel()
	var last int64
	ro := &outbox.ReplayOptions{After: res.Plan.FirstID - 1, Through: res.Plan.LastID, BatchSize: opts.BatchSize,
		Progress: func(marked, lastID int64) {
			last = lastID
			if opts.Progress != nil {
				opts.Progress(res.Plan, marked, lastID)
			}
			atBatch()
		}}
	res.Marked, err = outbox.ReplayBatches(work, db, opts.Filter, ro)
	if interrupted() && (err == nil || errors.Is(err, context.Canceled)) && last < res.Plan.LastID {
		return res, fmt.Errorf("%w after marking %d of the %d events at a batch boundary (ids through %d); what was marked stays marked (running the same command again marks those again too: consumers deduplicate them)", ErrInterrupted, res.Marked, res.Plan.Rows, last)
	}
	return res, err
}
