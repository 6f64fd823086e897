package emf

// Dimension names and values of every sluice metric: relay metrics carry exactly
// {Service=relay}; consumer metrics {Service=consumer, Consumer=<name>}; the asynchronous inbox
// processor {Service=inbox-processor, Consumer=<name>}. The CDK alarms are built on these.
const (
	DimensionService      = "Service"
	DimensionConsumer     = "Consumer"
	ServiceRelay          = "relay"
	ServiceConsumer       = "consumer"
	ServiceInboxProcessor = "inbox-processor"
)

// Relay metric names.
const (
	// OutboxPending is the number of unpublished, unquarantined outbox rows (Count).
	OutboxPending = "OutboxPending"
	// OutboxOldestPendingAge is the age of the oldest unpublished row (Seconds).
	OutboxOldestPendingAge = "OutboxOldestPendingAgeSeconds"
	// OutboxQuarantined is the number of quarantined outbox rows (Count).
	OutboxQuarantined = "OutboxQuarantined"
	// RelayHeartbeat is emitted at least once a minute by every running relay (Count).
	RelayHeartbeat = "RelayHeartbeat"
	// Published counts messages the broker acknowledged (Count).
	Published = "Published"
	// PublishFailures counts failed publish attempts (Count).
	PublishFailures = "PublishFailures"
	// DestinationsDown is the number of destinations a relay backs off as a whole because
	// every call to them fails (Count).
	DestinationsDown = "DestinationsDown"
	// OldestTransactionAge is the age of the database's oldest transaction holding a snapshot,
	// which holds back VACUUM (Seconds).
	OldestTransactionAge = "OldestTransactionAgeSeconds"
)

// Inbox metric names (consumer and asynchronous processor).
const (
	// InboxProcessed counts messages applied and committed (Count).
	InboxProcessed = "InboxProcessed"
	// InboxSkipped counts unknown event types recorded without effect (Count).
	InboxSkipped = "InboxSkipped"
	// InboxDuplicates counts deliveries the inbox already had (Count).
	InboxDuplicates = "InboxDuplicates"
	// InboxFailures counts records or attempts that failed (Count).
	InboxFailures = "InboxFailures"
	// InboxStored counts messages stored by the asynchronous inbox (Count).
	InboxStored = "InboxStored"
	// InboxParked counts rows the processor parked (Count).
	InboxParked = "InboxParked"
	// CommitToApplyLatency is now minus the createdAt attribute, per applied message (Milliseconds).
	CommitToApplyLatency = "CommitToApplyLatency"
)
