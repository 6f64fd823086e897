// Package outbox is a fixture for doclint's tests: it publishes to SNS, EventBridge, Kinesis and Kafka.
package outbox

// Config is general.
type Config struct {
	// Topics maps a topic to an SNS topic ARN. (finding: names one destination of four)
	Topics map[string]string
	// Targets maps a topic to an SNS topic, an EventBridge bus, a Kinesis stream or a Kafka topic.
	Targets map[string]string
	// SNSLimit is SNS's own limit (specific by its name).
	SNSLimit int
}

// Publish sends events to SNS. (finding)
func Publish() {}

// Parse reads one SQS message (specific by its signature).
func Parse(m SQSMessage) {}

// SQSMessage stands in for an SQS record.
type SQSMessage struct{}

// unexported mentions SNS and is not checked.
func unexported() {}
