package metrics

// Namespace is the CloudWatch namespace of every sluice metric.
const Namespace = "Sluice"

// Dimension names and values of every sluice metric: relay metrics carry exactly
// {Service=relay}; consumer metrics {Service=consumer, Consumer=<name>}; the asynchronous inbox
// processor {Service=inbox-processor, Consumer=<name>}. The CDK alarms (infra/) are built on
// these names and dimensions: renaming one is a breaking change for every deployed alarm.
const (
	DimensionService      = "Service"
	DimensionConsumer     = "Consumer"
	ServiceRelay          = "relay"
	ServiceConsumer       = "consumer"
	ServiceInboxProcessor = "inbox-processor"
)

// Relay metric names.
const (
	// OutboxPending is the number of unpublished, unquarantined outbox rows (Gauge, Count).
	OutboxPending = "OutboxPending"
	// OutboxOldestPendingAge is the age of the oldest unpublished row (Gauge, Seconds).
	OutboxOldestPendingAge = "OutboxOldestPendingAgeSeconds"
	// OutboxQuarantined is the number of quarantined outbox rows (Gauge, Count).
	OutboxQuarantined = "OutboxQuarantined"
	// RelayHeartbeat is emitted at least once a minute by every running relay (Counter, Count).
	RelayHeartbeat = "RelayHeartbeat"
	// Published counts messages the broker acknowledged (Counter, Count).
	Published = "Published"
	// PublishFailures counts failed publish attempts (Counter, Count).
	PublishFailures = "PublishFailures"
	// DestinationsDown is the number of destinations a relay backs off as a whole because
	// every call to them fails (Gauge, Count).
	DestinationsDown = "DestinationsDown"
	// OldestTransactionAge is the age of the database's oldest transaction holding a snapshot,
	// which holds back VACUUM (Gauge, Seconds).
	OldestTransactionAge = "OldestTransactionAgeSeconds"
	// Offloaded counts published messages whose payload the claim check stored in S3 (Counter,
	// Count); emitted by relays with a claim check.
	Offloaded = "Offloaded"
	// OffloadedBytes counts the bytes of the payloads the claim check stored in S3 (Counter,
	// Bytes); emitted with Offloaded.
	OffloadedBytes = "OffloadedBytes"
)

// Inbox metric names (consumer and asynchronous processor).
const (
	// InboxProcessed counts messages applied and committed (Counter, Count).
	InboxProcessed = "InboxProcessed"
	// InboxSkipped counts unknown event types recorded without effect (Counter, Count).
	InboxSkipped = "InboxSkipped"
	// InboxDuplicates counts deliveries the inbox already had (Counter, Count).
	InboxDuplicates = "InboxDuplicates"
	// InboxFailures counts records or attempts that failed (Counter, Count).
	InboxFailures = "InboxFailures"
	// InboxStored counts messages stored by the asynchronous inbox (Counter, Count).
	InboxStored = "InboxStored"
	// InboxParked counts rows the processor parked (Counter, Count).
	InboxParked = "InboxParked"
	// CommitToApplyLatency is now minus the createdAt attribute, per applied message
	// (Histogram, Milliseconds).
	CommitToApplyLatency = "CommitToApplyLatency"
)
