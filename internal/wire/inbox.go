package wire

// InboxOutcomeAttr is the attribute of pkg/inbox's consumer spans that names the record's
// outcome (applied, duplicate, skipped, stored or failed; docs/tracing.md); the demo reads it.
const InboxOutcomeAttr = "sluice.inbox.outcome"

// KafkaEventResponse is the partial batch response of a Kafka event source mapping (Amazon MSK
// or self-managed Apache Kafka) with ReportBatchItemFailures, which inbox.Consumer.HandleKafka
// returns; aws-lambda-go has no type for it. Unlike SQS and Kinesis, a Kafka item identifier is
// an object naming the topic-partition and the offset:
//
//	{"batchItemFailures": [{"itemIdentifier": {"partition": "orders-3", "offset": 42}}]}
type KafkaEventResponse struct {
	BatchItemFailures []KafkaBatchItemFailure `json:"batchItemFailures"`
}

// KafkaBatchItemFailure is one record that failed.
type KafkaBatchItemFailure struct {
	ItemIdentifier KafkaItemIdentifier `json:"itemIdentifier"`
}

// KafkaItemIdentifier names a record of a Kafka event: Partition is its key in the event's
// records map, TOPIC-PARTITION ("orders-3"), and Offset its offset.
type KafkaItemIdentifier struct {
	Partition string `json:"partition"`
	Offset    int64  `json:"offset"`
}
