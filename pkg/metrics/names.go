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
	// ServiceAudit is the scheduled outbox → inbox audit's (the migrations function's schedule).
	ServiceAudit = "audit"
	// DimensionTenant names a fleet's tenant database (pkg/fleet): a fleet relay emits its
	// tenants' lag and publish metrics (Tenant*) with {Service=relay, Tenant=<name>} for its top
	// tenants by backlog and {Service=relay, Tenant=_other} for the rest, so their number stays
	// bounded.
	DimensionTenant = "Tenant"
)

// Metric is the one definition of a sluice metric. The relay and the inbox build their
// measurements from it ([Metric.Measure], [Metric.Observe]), the CDK alarms and dashboard
// (infra/) take its name and dimensions from it, and the metrics table of docs/deploy.md is
// generated from [All] (a test keeps it current).
type Metric struct {
	// Name is the CloudWatch metric name (the EMF key).
	Name string
	// Kind is how it is aggregated: a Counter's values add up, a Gauge is the latest value, a
	// Histogram is a distribution of samples.
	Kind Kind
	// Unit is the values' unit.
	Unit Unit
	// Services are the DimensionService values of the components that emit it.
	Services []string
	// Dimensions are the names of the dimensions it carries, DimensionService first.
	Dimensions []string
	// Doc says what it measures, in one sentence.
	Doc string
}

// Measure returns a measurement of m with value v: a counter's increment, a gauge's value or
// one histogram observation.
func (m Metric) Measure(v float64) Measurement {
	return Measurement{Name: m.Name, Kind: m.Kind, Unit: m.Unit, Value: v}
}

// Observe returns a measurement of m holding the observations samples (for a Histogram).
func (m Metric) Observe(samples []float64) Measurement {
	return Measurement{Name: m.Name, Kind: m.Kind, Unit: m.Unit, Samples: samples}
}

// The Services and Dimensions of the relay's and the inbox's metrics.
var (
	relay     = []string{ServiceRelay}
	inbox     = []string{ServiceConsumer, ServiceInboxProcessor}
	consumer  = []string{ServiceConsumer}
	processor = []string{ServiceInboxProcessor}
	audit     = []string{ServiceAudit}
	relayDims = []string{DimensionService}
	fleetDims = []string{DimensionService, DimensionTenant}
	inboxDims = []string{DimensionService, DimensionConsumer}
)

// The relay's metrics, emitted every RelayConfig.MetricsInterval with dimensions {Service=relay}.
var (
	// OutboxPending is the number of unpublished, unquarantined outbox rows.
	OutboxPending = Metric{Name: "OutboxPending", Kind: Gauge, Unit: Count, Services: relay, Dimensions: relayDims,
		Doc: "unpublished, unquarantined outbox rows"}
	// OutboxOldestPendingAge is the age of the oldest unpublished row.
	OutboxOldestPendingAge = Metric{Name: "OutboxOldestPendingAgeSeconds", Kind: Gauge, Unit: Seconds, Services: relay, Dimensions: relayDims,
		Doc: "age of the oldest unpublished row"}
	// OutboxQuarantined is the number of quarantined outbox rows.
	OutboxQuarantined = Metric{Name: "OutboxQuarantined", Kind: Gauge, Unit: Count, Services: relay, Dimensions: relayDims,
		Doc: "quarantined outbox rows"}
	// RelayHeartbeat is emitted at least once a minute by every running relay.
	RelayHeartbeat = Metric{Name: "RelayHeartbeat", Kind: Counter, Unit: Count, Services: relay, Dimensions: relayDims,
		Doc: "1 per metrics interval of every running relay"}
	// Published counts messages the broker acknowledged.
	Published = Metric{Name: "Published", Kind: Counter, Unit: Count, Services: relay, Dimensions: relayDims,
		Doc: "messages the broker acknowledged"}
	// PublishFailures counts failed publish attempts.
	PublishFailures = Metric{Name: "PublishFailures", Kind: Counter, Unit: Count, Services: relay, Dimensions: relayDims,
		Doc: "failed publish attempts"}
	// DestinationsDown is the number of destinations a relay backs off as a whole because
	// every call to them fails.
	DestinationsDown = Metric{Name: "DestinationsDown", Kind: Gauge, Unit: Count, Services: relay, Dimensions: relayDims,
		Doc: "destinations backed off as a whole because every call to them fails"}
	// OrderViolations counts published rows their destination acknowledged in a call after
	// failing an earlier row of their key in that call, which a destination that keeps a key's
	// order in a call (outbox.Limits.KeyOrderInCall) promises never to do.
	OrderViolations = Metric{Name: "OrderViolations", Kind: Counter, Unit: Count, Services: relay, Dimensions: relayDims,
		Doc: "published rows a destination acknowledged after failing an earlier row of their key in the same call (a broken promise of per-key order; should stay 0)"}
	// WALWakeActive is 1 while a relay follows the WAL for new rows (outbox.WALWake), 0 while
	// it polls because it cannot; emitted only by relays configured to follow it.
	WALWakeActive = Metric{Name: "WALWakeActive", Kind: Gauge, Unit: Count, Services: relay, Dimensions: relayDims,
		Doc: "1 while a relay configured with the WAL wake-up follows the stream, 0 while it falls back to polling"}
	// OldestTransactionAge is the age of the database's oldest transaction holding a snapshot,
	// which holds back VACUUM.
	OldestTransactionAge = Metric{Name: "OldestTransactionAgeSeconds", Kind: Gauge, Unit: Seconds, Services: relay, Dimensions: relayDims,
		Doc: "age of the database's oldest transaction holding a snapshot (it holds back VACUUM)"}
	// Offloaded counts published messages whose payload the claim check stored in S3.
	Offloaded = Metric{Name: "Offloaded", Kind: Counter, Unit: Count, Services: relay, Dimensions: relayDims,
		Doc: "published messages whose payload the claim check stored in S3 (relays with a claim check)"}
	// OffloadedBytes counts the bytes of the payloads the claim check stored in S3.
	OffloadedBytes = Metric{Name: "OffloadedBytes", Kind: Counter, Unit: Bytes, Services: relay, Dimensions: relayDims,
		Doc: "bytes of the payloads the claim check stored in S3 (relays with a claim check)"}
)

// The fleet's metrics (pkg/fleet), emitted every RelayConfig.MetricsInterval: FleetTenants and
// FleetTenantsFailing with dimensions {Service=relay}, the Tenant* ones per tenant with
// {Service=relay, Tenant=<name or _other>}. A fleet relay emits none of the single relay's
// metrics, so that the alarms of an outbox in the same account never see a fleet's tenants.
var (
	// FleetTenants is the number of tenant databases a fleet relay serves.
	FleetTenants = Metric{Name: "FleetTenants", Kind: Gauge, Unit: Count, Services: relay, Dimensions: relayDims,
		Doc: "tenant databases a fleet relay serves (pkg/fleet)"}
	// FleetTenantsFailing is the number of tenants whose last turn failed.
	FleetTenantsFailing = Metric{Name: "FleetTenantsFailing", Kind: Gauge, Unit: Count, Services: relay, Dimensions: relayDims,
		Doc: "tenant databases whose last turn failed (unreachable, refused, broken schema); sluice status --fleet names them"}
	// TenantOldestPendingAge is OutboxOldestPendingAge per tenant (the most among _other's).
	TenantOldestPendingAge = Metric{Name: "TenantOldestPendingAgeSeconds", Kind: Gauge, Unit: Seconds, Services: relay, Dimensions: fleetDims,
		Doc: "a tenant's oldest unpublished row's age (for Tenant=_other, the oldest of the tenants outside the top ones)"}
	// TenantPending is OutboxPending per tenant (summed over _other's).
	TenantPending = Metric{Name: "TenantPending", Kind: Gauge, Unit: Count, Services: relay, Dimensions: fleetDims,
		Doc: "a tenant's unpublished, unquarantined rows (summed for Tenant=_other)"}
	// TenantQuarantined is OutboxQuarantined per tenant (summed over _other's).
	TenantQuarantined = Metric{Name: "TenantQuarantined", Kind: Gauge, Unit: Count, Services: relay, Dimensions: fleetDims,
		Doc: "a tenant's quarantined outbox rows (summed for Tenant=_other)"}
	// TenantPublished is Published per tenant (summed over _other's).
	TenantPublished = Metric{Name: "TenantPublished", Kind: Counter, Unit: Count, Services: relay, Dimensions: fleetDims,
		Doc: "messages of a tenant the broker acknowledged (summed for Tenant=_other)"}
)

// The inbox's metrics, emitted per batch by a consumer ({Service=consumer, Consumer=<name>})
// and per drain by the asynchronous processor ({Service=inbox-processor, Consumer=<name>}).
var (
	// InboxProcessed counts messages applied and committed.
	InboxProcessed = Metric{Name: "InboxProcessed", Kind: Counter, Unit: Count, Services: inbox, Dimensions: inboxDims,
		Doc: "messages applied and committed"}
	// InboxSkipped counts unknown event types recorded without effect.
	InboxSkipped = Metric{Name: "InboxSkipped", Kind: Counter, Unit: Count, Services: inbox, Dimensions: inboxDims,
		Doc: "messages of unknown event types recorded without effect (SkipUnknown)"}
	// InboxDuplicates counts deliveries the inbox already had.
	InboxDuplicates = Metric{Name: "InboxDuplicates", Kind: Counter, Unit: Count, Services: consumer, Dimensions: inboxDims,
		Doc: "deliveries the inbox already had"}
	// InboxFailures counts records or attempts that failed.
	InboxFailures = Metric{Name: "InboxFailures", Kind: Counter, Unit: Count, Services: inbox, Dimensions: inboxDims,
		Doc: "records (consumer) or attempts (processor) that failed"}
	// InboxStored counts messages stored by the asynchronous inbox.
	InboxStored = Metric{Name: "InboxStored", Kind: Counter, Unit: Count, Services: consumer, Dimensions: inboxDims,
		Doc: "messages stored for the processor (async mode)"}
	// InboxDeadLetters counts records that failed their last attempt and were kept as dead letters.
	InboxDeadLetters = Metric{Name: "InboxDeadLetters", Kind: Counter, Unit: Count, Services: consumer, Dimensions: inboxDims,
		Doc: "records that failed their source's last attempt (the receive before the DLQ, a stream mapping's last retry, ConsumeKafka's give-up), kept in inbox_dead_letter"}
	// InboxParked counts rows the processor parked.
	InboxParked = Metric{Name: "InboxParked", Kind: Counter, Unit: Count, Services: processor, Dimensions: inboxDims,
		Doc: "rows the processor parked after their last attempt"}
	// CommitToApplyLatency is now minus the createdAt attribute, per applied message.
	CommitToApplyLatency = Metric{Name: "CommitToApplyLatency", Kind: Histogram, Unit: Milliseconds, Services: inbox, Dimensions: inboxDims,
		Doc: "now minus the message's createdAt attribute, per applied or skipped message"}
)

// The scheduled audit's metrics, per audited consumer, with dimensions {Service=audit,
// Consumer=<name>} (internal/audit, run by the migrations function on its schedule).
var (
	// AuditMissingEvents is the number of published events the consumer has not applied
	// longer than the audit's alarm threshold after their publication.
	AuditMissingEvents = Metric{Name: "AuditMissingEvents", Kind: Gauge, Unit: Count, Services: audit, Dimensions: inboxDims,
		Doc: "published events the consumer has not applied past the audit's threshold (sluice audit names them)"}
	// AuditUnpublishedEvents is the number of events the consumer applied that the outbox
	// never published in the audited window.
	AuditUnpublishedEvents = Metric{Name: "AuditUnpublishedEvents", Kind: Gauge, Unit: Count, Services: audit, Dimensions: inboxDims,
		Doc: "events the consumer applied that the outbox did not publish (there should be none)"}
)

// All returns every sluice metric, relay metrics first.
func All() []Metric {
	return []Metric{
		OutboxPending, OutboxOldestPendingAge, OutboxQuarantined, RelayHeartbeat, Published,
		PublishFailures, DestinationsDown, OrderViolations, WALWakeActive, OldestTransactionAge, Offloaded, OffloadedBytes,
		FleetTenants, FleetTenantsFailing, TenantOldestPendingAge, TenantPending, TenantQuarantined, TenantPublished,
		InboxProcessed, InboxSkipped, InboxDuplicates, InboxFailures, InboxStored, InboxDeadLetters, InboxParked,
		CommitToApplyLatency, AuditMissingEvents, AuditUnpublishedEvents,
	}
}
