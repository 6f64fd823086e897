// Package inbox applies messages published by sluice's outbox exactly once per consumer, on top
// of SQS's at-least-once delivery.
//
// For every SQS record a [Consumer] inserts a row into inbox_event keyed by (consumer, message id)
// with ON CONFLICT DO NOTHING and runs the [Handler] for the message's event type in the same
// PostgreSQL transaction. A duplicate delivery finds the row and succeeds without effect. A record
// is reported successful only after its transaction committed; a handler error or panic rolls the
// inbox row and every effect back and lists the record in the Lambda's BatchItemFailures, so SQS
// delivers it again (and, after maxReceiveCount, moves it to the DLQ).
//
// Three modes share that contract (see [Mode] and docs/inbox.md for when to use which):
//
//   - [PerRecord]: one transaction per record. The default.
//   - [Batched]: one transaction per batch: one statement inserts the batch's inbox rows (in key
//     order, so concurrent batches cannot deadlock on them), the handlers run, the batch commits
//     once. When a handler fails, the batch is applied again with a SAVEPOINT per record, so the
//     failing record rolls back alone.
//   - [Async]: the consumer only stores the full message and acknowledges; a [Processor] drains
//     the stored rows with FOR UPDATE SKIP LOCKED, applies each in its own transaction, retries
//     with backoff and parks rows that keep failing. [LagOf], [ListParked], [RetryParked] and
//     [RetryAllParked] serve operators; [Purge] removes processed rows after the retention period.
//
// Messages arrive either by raw delivery (attributes on the SQS message) or inside the SNS JSON
// envelope; [Parse] accepts both and takes the dedup key from the messageId attribute, falling
// back to the SNS MessageId and then the SQS messageId only when it is absent. It also accepts
// an EventBridge event an SQS-target rule delivered.
//
// The same rules apply to the other sources the relay publishes to: [Consumer.HandleKinesis]
// (Kinesis Data Streams), [Consumer.HandleKafka] (Amazon MSK, self-managed Kafka) and
// [ConsumeKafka] (a franz-go client outside Lambda); [Consumer.HandleEvent] recognises which
// Lambda event source invoked it. On the streams, a failed record fails the rest of its shard or
// partition in the batch, so each is applied in order and never past a failure (docs/inbox.md,
// "Event sources").
package inbox
