package lambdaenv

import (
	"errors"
	"fmt"

	"github.com/sluicehq/sluice/pkg/partition"
)

// Partition maintenance of the inbox (the outbox's, OutboxRetention and
// OutboxPartitionInterval, are in lambdaenv.go). The migrate Lambda reads all four for its
// scheduled maintenance (lambdas/migrate); the CDK constructs set them on it.
const (
	// InboxRetention is the retention of a partitioned inbox_event (Go duration, e.g. 720h):
	// maintenance drops the partitions whose rows were all processed longer ago
	// (partition.Maintain). A dropped message is no longer recognised as a duplicate, so keep
	// it above the queues' retention and any redrive or replay window. Defaults to unset:
	// nothing is dropped (partitions are still created ahead). A plain inbox_event is never
	// changed.
	InboxRetention = "SLUICE_INBOX_RETENTION"
	// InboxPartitionInterval is the time one new partition of a partitioned inbox_event covers
	// (Go duration). Defaults to partition.DefaultInterval (24h).
	InboxPartitionInterval = "SLUICE_INBOX_PARTITION_INTERVAL"
)

// partitionVars are the retention and interval variables of each table.
func partitionVars(t *partition.Table) (retention, interval string) {
	if t == partition.Inbox {
		return InboxRetention, InboxPartitionInterval
	}
	return OutboxRetention, OutboxPartitionInterval
}

// Partitions reads the maintenance of partitioned table t: its retention (OutboxRetention,
// InboxRetention; unset: drop nothing) and interval (OutboxPartitionInterval,
// InboxPartitionInterval; unset: partition.DefaultInterval). It returns nil when neither is
// set, so that a caller can tell "asked for" from "defaults" (a nil *partition.Options takes
// the defaults). Every problem is reported at once, each naming its variable.
func Partitions(getenv Getenv, t *partition.Table) (*partition.Options, error) {
	rvar, ivar := partitionVars(t)
	if getenv(rvar) == "" && getenv(ivar) == "" {
		return nil, nil
	}
	retention, rerr := Duration(getenv, rvar, 0)
	interval, ierr := Duration(getenv, ivar, partition.DefaultInterval)
	if ierr == nil {
		if err := (&partition.Options{Interval: interval}).Check(); err != nil { // the retention's only bound, not negative, is Duration's
			ierr = fmt.Errorf("%s: %w", ivar, err)
		}
	}
	if err := errors.Join(rerr, ierr); err != nil {
		return nil, err
	}
	return &partition.Options{Interval: interval, Retention: retention}, nil
}
