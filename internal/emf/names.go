package emf

import "github.com/sluicehq/sluice/pkg/metrics"

// Dimension names and values: see pkg/metrics.
const (
	DimensionService      = metrics.DimensionService
	DimensionConsumer     = metrics.DimensionConsumer
	ServiceRelay          = metrics.ServiceRelay
	ServiceConsumer       = metrics.ServiceConsumer
	ServiceInboxProcessor = metrics.ServiceInboxProcessor
)

// Relay metric names: see pkg/metrics.
const (
	OutboxPending          = metrics.OutboxPending
	OutboxOldestPendingAge = metrics.OutboxOldestPendingAge
	OutboxQuarantined      = metrics.OutboxQuarantined
	RelayHeartbeat         = metrics.RelayHeartbeat
	Published              = metrics.Published
	PublishFailures        = metrics.PublishFailures
	DestinationsDown       = metrics.DestinationsDown
	OldestTransactionAge   = metrics.OldestTransactionAge
)

// Inbox metric names: see pkg/metrics.
const (
	InboxProcessed       = metrics.InboxProcessed
	InboxSkipped         = metrics.InboxSkipped
	InboxDuplicates      = metrics.InboxDuplicates
	InboxFailures        = metrics.InboxFailures
	InboxStored          = metrics.InboxStored
	InboxParked          = metrics.InboxParked
	CommitToApplyLatency = metrics.CommitToApplyLatency
)
