package cli

import (
	"context"
	"errors"
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
			opts := PurgeOptions{OlderThan: olderThan, Queues: queues, Consumer: consumer, BatchSize: batchSize,
				OutboxOnly: outboxOnly, InboxOnly: inboxOnly}
			if !cmd.Flags().Changed("older-than") {
				return usagef("--older-than is required (e.g. --older-than 30d)")
			}
			if err := opts.validate(); err != nil {
				return err
			}
			var c SQSAPI
			if len(queues) > 0 && !outboxOnly {
				var err error
				if c, err = a.sqsClient(ctx); err != nil {
					return err
				}
			}
			pool, err := a.db(ctx)
			if err != nil {
				return err
			}
			res, err := Purge(ctx, pool, c, opts)
			if res.Warning != "" {
				fmt.Fprintln(a.io.Err, "warning: "+res.Warning)
			}
			if res.OutboxPurged {
				fmt.Fprintf(a.io.Out, "deleted %d published outbox rows older than %s\n", res.OutboxDeleted, FormatDuration(olderThan))
			}
			if res.InboxPurged {
				fmt.Fprintf(a.io.Out, "deleted %d processed inbox rows older than %s\n", res.InboxDeleted, FormatDuration(olderThan))
			}
			return err
		},
	}
	fl := cmd.Flags()
	fl.Var(&durationValue{d: &olderThan}, "older-than", "retention: delete rows published/processed longer ago than this (required; e.g. 30d)")
	fl.StringArrayVar(&queues, "queue", nil, "SQS queue URL of an inbox consumer; refuse if its (or its DLQ's) retention is not shorter than --older-than (repeatable)")
	fl.StringVar(&consumer, "consumer", "", "purge only this inbox consumer's rows")
	fl.IntVar(&batchSize, "batch-size", 0, fmt.Sprintf("most rows per DELETE statement (default %d)", outbox.DefaultPurgeBatchSize))
	fl.BoolVar(&outboxOnly, "outbox-only", false, "purge only the outbox")
	fl.BoolVar(&inboxOnly, "inbox-only", false, "purge only the inbox")
	return cmd
}

// PurgeOptions configure Purge.
type PurgeOptions struct {
	// OlderThan is the retention: rows published or processed longer ago are deleted. Required.
	OlderThan time.Duration
	// Queues are SQS queue URLs of inbox consumers: Purge refuses when OlderThan is not longer
	// than one's message retention (or its DLQ's), since a message redelivered after its inbox
	// row is gone would be applied twice. Defaults to none: then it only warns when OlderThan
	// is not above SQS's 14-day maximum.
	Queues []string
	// Consumer purges only this inbox consumer's rows. Defaults to every consumer.
	Consumer string
	// BatchSize is the most rows per DELETE statement. Defaults to outbox.DefaultPurgeBatchSize
	// (the same as inbox.DefaultPurgeBatchSize).
	BatchSize int
	// OutboxOnly and InboxOnly purge one table only; at most one may be set.
	OutboxOnly, InboxOnly bool
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

// PurgeResult is what Purge deleted.
type PurgeResult struct {
	// OutboxPurged and InboxPurged report which tables were purged to the end; OutboxDeleted
	// and InboxDeleted how many rows each lost (also when an error stopped it midway).
	OutboxPurged, InboxPurged   bool
	OutboxDeleted, InboxDeleted int64
	// Warning is set when the inbox retention could not be checked against any queue.
	Warning string
}

// Purge deletes published outbox rows and processed inbox rows older than opts.OlderThan, in
// bounded batches; unpublished, quarantined, unprocessed and parked rows are never deleted.
// With opts.Queues it first checks every queue's retention (c is then required) and deletes
// nothing when one is too long.
func Purge(ctx context.Context, db Querier, c SQSAPI, opts PurgeOptions) (PurgeResult, error) {
	if err := opts.validate(); err != nil {
		return PurgeResult{}, err
	}
	var res PurgeResult
	doInbox, doOutbox := !opts.OutboxOnly, !opts.InboxOnly
	if doInbox && len(opts.Queues) > 0 {
		if c == nil {
			return res, errors.New("cli: Purge needs an SQS client to check the queues' retention")
		}
		if err := checkRetention(ctx, c, opts.OlderThan, opts.Queues); err != nil {
			return res, err
		}
	} else if doInbox && opts.OlderThan <= sqsMaxRetention {
		res.Warning = fmt.Sprintf("--older-than %s is not above SQS's 14-day maximum retention and no --queue was given to check; purged inbox rows no longer deduplicate redelivered messages",
			FormatDuration(opts.OlderThan))
	}
	var err error
	if doOutbox {
		if res.OutboxDeleted, err = outbox.Purge(ctx, db, opts.OlderThan, &outbox.PurgeOptions{BatchSize: opts.BatchSize}); err != nil {
			return res, fmt.Errorf("after deleting %d outbox rows: %w", res.OutboxDeleted, err)
		}
		res.OutboxPurged = true
	}
	if doInbox {
		if res.InboxDeleted, err = inbox.Purge(ctx, db, opts.OlderThan, &inbox.PurgeOptions{Consumer: opts.Consumer, BatchSize: opts.BatchSize}); err != nil {
			return res, fmt.Errorf("after deleting %d inbox rows: %w", res.InboxDeleted, err)
		}
		res.InboxPurged = true
	}
	return res, nil
}

// checkRetention fails when olderThan is not longer than the message retention of one of
// queues or of its DLQ.
func checkRetention(ctx context.Context, c SQSAPI, olderThan time.Duration, queues []string) error {
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
	return nil
}
