package cli

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluicehq/sluice/pkg/inbox"
	"github.com/sluicehq/sluice/pkg/outbox"
)

// sqsMaxRetention is the longest MessageRetentionPeriod SQS allows (14 days).
const sqsMaxRetention = 14 * 24 * time.Hour

func (a *app) purgeCommand() *cobra.Command {
	var (
		olderThan  time.Duration
		queues     []string
		consumer   string
		batchSize  int
		outboxOnly bool
		inboxOnly  bool
	)
	cmd := &cobra.Command{
		Use:   "purge --older-than D [--queue URL ...]",
		Short: "Delete published outbox rows and processed inbox rows older than a retention",
		Long: `Retention: delete outbox rows published more than --older-than ago and inbox rows processed
more than --older-than ago, in bounded batches (short statements, no long locks). Unpublished,
quarantined, unprocessed and parked rows are never deleted.

An inbox row is what makes a redelivered message a duplicate: once it is purged, the same message
would be applied again. So the inbox retention must outlast every way the message can come back:
the queue's MessageRetentionPeriod and its DLQ's (a redrive). Name the consumer's queues with
--queue; purge reads their retention (and their DLQs') and refuses when --older-than is shorter.
Without --queue it only warns when --older-than is under SQS's 14-day maximum.

Durations: Go durations plus a day suffix (36h, 7d, 30d).`,
		Example: `  sluice purge --older-than 30d
  sluice purge --older-than 15d --queue https://sqs.eu-west-1.amazonaws.com/123456789012/billing
  sluice purge --older-than 7d --outbox-only`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			if !cmd.Flags().Changed("older-than") {
				return usagef("--older-than is required (e.g. --older-than 30d)")
			}
			if olderThan <= 0 {
				return usagef("--older-than must be positive")
			}
			if outboxOnly && inboxOnly {
				return usagef("--outbox-only and --inbox-only exclude each other")
			}
			if batchSize < 0 {
				return usagef("--batch-size must not be negative")
			}
			doInbox, doOutbox := !outboxOnly, !inboxOnly
			if doInbox && len(queues) > 0 {
				// Check every queue before deleting anything.
				c, err := a.sqsClient(ctx)
				if err != nil {
					return err
				}
				for _, u := range queues {
					q, err := describeQueue(ctx, c, u)
					if err != nil {
						return err
					}
					longest, from := time.Duration(q.RetentionSeconds)*time.Second, u
					if q.DLQARN != "" {
						dlqURL, err := urlOfARN(ctx, c, q.DLQARN)
						if err != nil {
							return fmt.Errorf("DLQ of %s: %w", u, err)
						}
						d, err := describeQueue(ctx, c, dlqURL)
						if err != nil {
							return fmt.Errorf("DLQ of %s: %w", u, err)
						}
						if r := time.Duration(d.RetentionSeconds) * time.Second; r > longest {
							longest, from = r, dlqURL+" (DLQ of "+q.Name+")"
						}
					}
					if olderThan <= longest {
						return fmt.Errorf("refusing to purge: --older-than %s is not longer than the message retention of %s (%s); a message redelivered or redriven after its inbox row is purged would be applied twice. Use --older-than above %s, or --outbox-only",
							FormatDuration(olderThan), from, FormatDuration(longest), FormatDuration(longest))
					}
				}
			} else if doInbox && olderThan <= sqsMaxRetention {
				fmt.Fprintf(a.io.Err, "warning: --older-than %s is not above SQS's 14-day maximum retention and no --queue was given to check; purged inbox rows no longer deduplicate redelivered messages\n", FormatDuration(olderThan))
			}
			pool, err := a.db(ctx)
			if err != nil {
				return err
			}
			var outN, inN int64
			if doOutbox {
				if outN, err = outbox.Purge(ctx, pool, olderThan, &outbox.PurgeOptions{BatchSize: batchSize}); err != nil {
					return fmt.Errorf("after deleting %d outbox rows: %w", outN, err)
				}
				fmt.Fprintf(a.io.Out, "deleted %d published outbox rows older than %s\n", outN, FormatDuration(olderThan))
			}
			if doInbox {
				if inN, err = inbox.Purge(ctx, pool, olderThan, &inbox.PurgeOptions{Consumer: consumer, BatchSize: batchSize}); err != nil {
					return fmt.Errorf("after deleting %d inbox rows: %w", inN, err)
				}
				fmt.Fprintf(a.io.Out, "deleted %d processed inbox rows older than %s\n", inN, FormatDuration(olderThan))
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.Var(&durationValue{d: &olderThan}, "older-than", "retention: delete rows published/processed longer ago than this (required; e.g. 30d)")
	fl.StringArrayVar(&queues, "queue", nil, "SQS queue URL of an inbox consumer; refuse if its (or its DLQ's) retention is not shorter than --older-than (repeatable)")
	fl.StringVar(&consumer, "consumer", "", "purge only this inbox consumer's rows")
	fl.IntVar(&batchSize, "batch-size", 0, "rows per DELETE statement (default: the library's, 5000 outbox / 1000 inbox)")
	fl.BoolVar(&outboxOnly, "outbox-only", false, "purge only the outbox")
	fl.BoolVar(&inboxOnly, "inbox-only", false, "purge only the inbox")
	return cmd
}
