package inbox

import "errors"

// Sentinel errors. Per-record errors in a [Report] wrap one of them; branch with errors.Is.
var (
	// ErrBadMessage marks a record that cannot be parsed: a body that is not JSON, a missing or
	// mistyped attribute, a broken SNS envelope. It fails the same way on every delivery and
	// reaches the DLQ after maxReceiveCount.
	ErrBadMessage = errors.New("inbox: bad message")
	// ErrUnknownEventType marks a message whose event type has no handler while the router's
	// OnUnknown policy is FailUnknown.
	ErrUnknownEventType = errors.New("inbox: no handler for event type")
	// ErrHandlerPanic marks a handler that panicked; the panic value is in the error text.
	ErrHandlerPanic = errors.New("inbox: handler panicked")
	// ErrDeadline marks a record that was not started because the invocation's remaining time
	// was below the configured margin (or the context was already done). Its source delivers it
	// again (SQS after the visibility timeout; Kinesis and Kafka retry the batch from it).
	ErrDeadline = errors.New("inbox: not started before the deadline")
	// ErrGroupBlocked marks a FIFO record not attempted because an earlier record of the same
	// message group failed in this batch; failing it too keeps the group in order.
	ErrGroupBlocked = errors.New("inbox: earlier record of the message group failed")
	// ErrUnknownTenant marks a message a fleet consumer (ConsumerConfig.Tenants) cannot apply:
	// it has no tenant header (TenantHeader), or TenantPoolsConfig.Resolve does not know its
	// tenant. No database owns it, so it has no dead letter: its source retries it, then
	// moves it to its DLQ (or on-failure destination).
	ErrUnknownTenant = errors.New("inbox: unknown tenant")
	// ErrCommit marks a record whose work succeeded but whose transaction failed to commit.
	ErrCommit = errors.New("inbox: commit failed")
	// ErrInvalidConfig is returned by the constructors for a bad ConsumerConfig or
	// ProcessorConfig, and by ConsumeKafka for bad KafkaOptions.
	ErrInvalidConfig = errors.New("inbox: invalid config")
	// ErrInvalidArgument is returned by the operator functions for bad arguments.
	ErrInvalidArgument = errors.New("inbox: invalid argument")
)
