package cli

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluicehq/sluice/pkg/outbox"
)

func (a *app) replayCommand() *cobra.Command {
	var (
		f      outbox.ReplayFilter
		yes    bool
		dryRun bool
	)
	cmd := &cobra.Command{
		Use:   "replay --since T [--until T] [--topic X] [--aggregate-type A] [--aggregate-id ID]",
		Short: "Publish a range of already-published events again (same event_id)",
		Long: `Mark published outbox rows created in [--since, --until) as unpublished, so the relay
publishes them again with the same event_id: existing consumers recognise them as duplicates in
their inbox, while a new or rebuilt consumer applies the history. Each partition key's events go
out again in their original order.

It prints how many rows match and asks for confirmation unless --yes; without a terminal on stdin
and without --yes it refuses. --dry-run only counts. A running relay (the Lambda, or
'sluice relay') publishes the rows; 'sluice relay --once' drains them by hand.

Times are RFC 3339 (2026-11-28T09:00:00Z), a date (midnight UTC), "now", or relative (-2h, -7d).
--until defaults to now.`,
		Example: `  sluice replay --since -2h --topic orders --dry-run
  sluice replay --since 2026-11-28T00:00:00Z --until 2026-11-29T00:00:00Z --aggregate-type order --yes
  sluice replay --since -7d --aggregate-type order --aggregate-id o-1042`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			opts := ReplayOptions{Filter: f, DryRun: dryRun}
			if err := opts.validate(); err != nil {
				return err
			}
			if !yes {
				opts.Confirm = func(n int64) error {
					return a.confirm(cmd, fmt.Sprintf("Publish these %d events again?", n), fmt.Sprintf("refusing to replay %d events", n))
				}
			}
			pool, err := a.db(ctx)
			if err != nil {
				return err
			}
			opts.Counted = func(n int64) { fmt.Fprintf(a.io.Out, "%d published events match %s\n", n, describeFilter(f)) }
			res, err := Replay(ctx, pool, opts)
			if err == nil && res.Marked > 0 {
				fmt.Fprintf(a.io.Out, "marked %d events for publishing again; the relay publishes them (or run: sluice relay --once)\n", res.Marked)
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
	fl.BoolVarP(&yes, "yes", "y", false, "do not ask for confirmation")
	fl.BoolVar(&dryRun, "dry-run", false, "only count the matching events")
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
	// Counted, when set, is told the number of matching rows once they are counted.
	Counted func(matching int64)
	// Confirm is asked with the number of matching rows before anything changes; an error
	// stops the replay. Defaults to nil: no confirmation.
	Confirm func(matching int64) error
}

func (o ReplayOptions) validate() error {
	if o.Filter.Since.IsZero() {
		return usagef("--since is required (e.g. --since -2h or --since 2026-11-28T00:00:00Z)")
	}
	if !o.Filter.Until.IsZero() && !o.Filter.Until.After(o.Filter.Since) {
		return usagef("--until (%s) must be after --since (%s)", o.Filter.Until.Format(time.RFC3339), o.Filter.Since.Format(time.RFC3339))
	}
	return nil
}

// ReplayResult is what Replay found and did.
type ReplayResult struct {
	// Matching is the number of published rows the filter matched.
	Matching int64
	// Marked is the number of rows marked unpublished (zero on a dry run or without a match).
	Marked int64
}

// Replay marks the published outbox rows opts.Filter matches as unpublished, so that the relay
// publishes them again with the same event_id. It counts them first (opts.Counted), then asks
// opts.Confirm.
func Replay(ctx context.Context, db Querier, opts ReplayOptions) (ReplayResult, error) {
	if err := opts.validate(); err != nil {
		return ReplayResult{}, err
	}
	var res ReplayResult
	var err error
	if res.Matching, err = outbox.CountReplay(ctx, db, opts.Filter); err != nil {
		return res, err
	}
	if opts.Counted != nil {
		opts.Counted(res.Matching)
	}
	if res.Matching == 0 || opts.DryRun {
		return res, nil
	}
	if opts.Confirm != nil {
		if err := opts.Confirm(res.Matching); err != nil {
			return res, err
		}
	}
	res.Marked, err = outbox.Replay(ctx, db, opts.Filter)
	return res, err
}
