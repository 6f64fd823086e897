package cli

import (
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
			if f.Since.IsZero() {
				return usagef("--since is required (e.g. --since -2h or --since 2026-11-28T00:00:00Z)")
			}
			if !f.Until.IsZero() && !f.Until.After(f.Since) {
				return usagef("--until (%s) must be after --since (%s)", f.Until.Format(time.RFC3339), f.Since.Format(time.RFC3339))
			}
			pool, err := a.db(ctx)
			if err != nil {
				return err
			}
			n, err := outbox.CountReplay(ctx, pool, f)
			if err != nil {
				return err
			}
			desc := describeFilter(f)
			fmt.Fprintf(a.io.Out, "%d published events match %s\n", n, desc)
			if n == 0 || dryRun {
				return nil
			}
			if !yes {
				if err := a.confirm(cmd, fmt.Sprintf("Publish these %d events again?", n), fmt.Sprintf("refusing to replay %d events", n)); err != nil {
					return err
				}
			}
			got, err := outbox.Replay(ctx, pool, f)
			if err != nil {
				return err
			}
			fmt.Fprintf(a.io.Out, "marked %d events for publishing again; the relay publishes them (or run: sluice relay --once)\n", got)
			return nil
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
