package lambdaenv

import (
	"errors"
	"fmt"

	"github.com/sluicehq/sluice/pkg/inbox"
	"github.com/sluicehq/sluice/pkg/outbox"
)

// Partition maintenance of the inbox (the outbox's, OutboxRetention and
// OutboxPartitionInterval, are in lambdaenv.go). The migrate Lambda reads all four for its
// scheduled maintenance (lambdas/migrate); the CDK constructs set them on it.
const (
	// InboxRetention is the retention of a partitioned inbox_event (Go duration, e.g. 720h):
	// maintenance drops the partitions whose rows were all processed longer ago
	// (inbox.MaintainPartitions). A dropped message is no longer recognised as a duplicate, so
	// keep it above the queues' retention and any redrive or replay window. Defaults to unset:
	// nothing is dropped (partitions are still created ahead). A plain inbox_event is never
	// changed.
	InboxRetention = "SLUICE_INBOX_RETENTION"
	// InboxPartitionInterval is the time one new partition of a partitioned inbox_event covers
	// (Go duration). Defaults to inbox.DefaultPartitionInterval (24h).
	InboxPartitionInterval = "SLUICE_INBOX_PARTITION_INTERVAL"
)

// OutboxPartitions reads the maintenance of a partitioned outbox_event: OutboxRetention
// (unset: drop nothing) and OutboxPartitionInterval (unset: outbox.DefaultPartitionInterval).
// It returns nil when neither is set, so that a caller can tell "asked for" from "defaults" (a
// nil *outbox.PartitionOptions takes the defaults). Every problem is reported at once, each
// naming its variable.
func OutboxPartitions(getenv Getenv) (*outbox.PartitionOptions, error) {
	if getenv(OutboxRetention) == "" && getenv(OutboxPartitionInterval) == "" {
		return nil, nil
	}
	retention, rerr := Duration(getenv, OutboxRetention, 0)
	interval, ierr := Duration(getenv, OutboxPartitionInterval, outbox.DefaultPartitionInterval)
	if ierr == nil {
		if err := (&outbox.PartitionOptions{Interval: interval}).Check(); err != nil { // the retention's only bound, not negative, is Duration's
			ierr = fmt.Errorf("%s: %w", OutboxPartitionInterval, err)
		}
	}
	if err := errors.Join(rerr, ierr); err != nil {
		return nil, err
	}
	return &outbox.PartitionOptions{Interval: interval, Retention: retention}, nil
}

// InboxPartitions reads the maintenance of a partitioned inbox_event: InboxRetention (unset:
// drop nothing) and InboxPartitionInterval (unset: inbox.DefaultPartitionInterval). It returns
// nil when neither is set (a nil *inbox.PartitionOptions takes the defaults). Every problem is
// reported at once, each naming its variable.
func InboxPartitions(getenv Getenv) (*inbox.PartitionOptions, error) {
	if getenv(InboxRetention) == "" && getenv(InboxPartitionInterval) == "" {
		return nil, nil
	}
	retention, rerr := Duration(getenv, InboxRetention, 0)
	interval, ierr := Duration(getenv, InboxPartitionInterval, inbox.DefaultPartitionInterval)
	if ierr == nil {
		if err := (&inbox.PartitionOptions{Interval: interval}).Check(); err != nil {
			ierr = fmt.Errorf("%s: %w", InboxPartitionInterval, err)
		}
	}
	if err := errors.Join(rerr, ierr); err != nil {
		return nil, err
	}
	return &inbox.PartitionOptions{Interval: interval, Retention: retention}, nil
}
