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
	relayDims = []string{DimensionService}
	inboxDims = []string{DimensionService, DimensionConsumer}
)

func relayGauge(name string, u Unit, doc string) Metric {
	return Metric{Name: name, Kind: Gauge, Unit: u, Services: relay, Dimensions: relayDims, Doc: doc}
}

func relayCount(name string, u Unit, doc string) Metric {
	return Metric{Name: name, Kind: Counter, Unit: u, Services: relay, Dimensions: relayDims, Doc: doc}
}

func inboxCount(name string, services []string, doc string) Metric {
	return Metric{Name: name, Kind: Counter, Unit: Count, Services: services, Dimensions: inboxDims, Doc: doc}
}

// The relay's metrics, emitted every RelayConfig.MetricsInterval with dimensions {Service=relay}.
var (
	// OutboxPending is the number of unpublished, unquarantined outbox rows.
	OutboxPending = relayGauge("OutboxPending", Count, "unpublished, unquarantined outbox rows")
	// OutboxOldestPendingAge is the age of the oldest unpublished row.
	OutboxOldestPendingAge = relayGauge("OutboxOldestPendingAgeSeconds", Seconds, "age of the oldest unpublished row")
	// OutboxQuarantined is the number of quarantined outbox rows.
	OutboxQuarantined = relayGauge("OutboxQuarantined", Count, "quarantined outbox rows")
	// RelayHeartbeat is emitted at least once a minute by every running relay.
	RelayHeartbeat = relayCount("RelayHeartbeat", Count, "1 per metrics interval of every running relay")
	// Published counts messages the broker acknowledged.
	Published = relayCount("Published", Count, "messages the broker acknowledged")
	// PublishFailures counts failed publish attempts.
	PublishFailures = relayCount("PublishFailures", Count, "failed publish attempts")
	// DestinationsDown is the number of destinations a relay backs off as a whole because
	// every call to them fails.
	DestinationsDown = relayGauge("DestinationsDown", Count, "destinations backed off as a whole because every call to them fails")
	// OldestTransactionAge is the age of the database's oldest transaction holding a snapshot,
	// which holds back VACUUM.
	OldestTransactionAge = relayGauge("OldestTransactionAgeSeconds", Seconds, "age of the database's oldest transaction holding a snapshot (it holds back VACUUM)")
	// Offloaded counts published messages whose payload the claim check stored in S3.
	Offloaded = relayCount("Offloaded", Count, "published messages whose payload the claim check stored in S3 (relays with a claim check)")
	// OffloadedBytes counts the bytes of the payloads the claim check stored in S3.
	OffloadedBytes = relayCount("OffloadedBytes", Bytes, "bytes of the payloads the claim check stored in S3 (relays with a claim check)")
)

// The inbox's metrics, emitted per batch by a consumer ({Service=consumer, Consumer=<name>})
// and per drain by the asynchronous processor ({Service=inbox-processor, Consumer=<name>}).
var (
	// InboxProcessed counts messages applied and committed.
	InboxProcessed = inboxCount("InboxProcessed", inbox, "messages applied and committed")
	// InboxSkipped counts unknown event types recorded without effect.
	InboxSkipped = inboxCount("InboxSkipped", inbox, "messages of unknown event types recorded without effect (SkipUnknown)")
	// InboxDuplicates counts deliveries the inbox already had.
	InboxDuplicates = inboxCount("InboxDuplicates", consumer, "deliveries the inbox already had")
	// InboxFailures counts records or attempts that failed.
	InboxFailures = inboxCount("InboxFailures", inbox, "records (consumer) or attempts (processor) that failed")
	// InboxStored counts messages stored by the asynchronous inbox.
	InboxStored = inboxCount("InboxStored", consumer, "messages stored for the processor (async mode)")
	// InboxParked counts rows the processor parked.
	InboxParked = inboxCount("InboxParked", processor, "rows the processor parked after their last attempt")
	// CommitToApplyLatency is now minus the createdAt attribute, per applied message.
	CommitToApplyLatency = Metric{Name: "CommitToApplyLatency", Kind: Histogram, Unit: Milliseconds, Services: inbox,
		Dimensions: inboxDims, Doc: "now minus the message's createdAt attribute, per applied or skipped message"}
)

// All returns every sluice metric, relay metrics first.
func All() []Metric {
	return []Metric{
		OutboxPending, OutboxOldestPendingAge, OutboxQuarantined, RelayHeartbeat, Published,
		PublishFailures, DestinationsDown, OldestTransactionAge, Offloaded, OffloadedBytes,
		InboxProcessed, InboxSkipped, InboxDuplicates, InboxFailures, InboxStored, InboxParked,
		CommitToApplyLatency,
	}
}
