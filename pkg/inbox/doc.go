// Package inbox applies messages published by sluice's outbox exactly once per consumer, on top
// of the at-least-once delivery of SQS, Kinesis and Kafka.
//
// # Getting started
//
// Register a [Handler] per event type on a [Router], build a [Consumer] once per process with
// [NewConsumer], and hand its Lambda handler to the runtime (see the example of NewConsumer):
//
//	r := inbox.NewRouter(inbox.FailUnknown)
//	r.Handle("OrderCreated", func(ctx context.Context, tx pgx.Tx, msg inbox.Message) error {
//		o, err := inbox.Decode[OrderCreated](msg)
//		...
//		_, err = tx.Exec(ctx, `INSERT INTO invoice ...`, o.OrderID)
//		return err
//	})
//	c, err := inbox.NewConsumer(pool, inbox.ConsumerConfig{Consumer: "billing", Router: r, Metrics: os.Stdout})
//	lambda.StartWithOptions(c.HandleSQS, lambda.WithEnableSIGTERM(pool.Close))
//
// For every record the Consumer inserts a row into inbox_event keyed by (consumer, message id)
// with ON CONFLICT DO NOTHING and runs the handler in the same PostgreSQL transaction. A
// duplicate delivery finds the row and succeeds without effect. A record is reported successful
// only after its transaction committed; a handler error or panic rolls the inbox row and every
// effect back and lists the record in the Lambda's BatchItemFailures, so it is delivered again
// (and, after maxReceiveCount, moved to the DLQ). Failures wrap the package's sentinel errors
// (ErrBadMessage, ErrUnknownEventType, ...); [Consumer.Process] returns a [Report] with each
// record's [Outcome].
//
// # Modes
//
// Three modes share that contract ([ConsumerConfig].Mode; docs/inbox.md says when to use which):
//
//   - [PerRecord]: one transaction per record. The default.
//   - [Batched]: one transaction per batch: one statement inserts the batch's inbox rows (in key
//     order, so concurrent batches cannot deadlock on them), the handlers run, the batch commits
//     once. When a handler fails, the batch is applied again with a SAVEPOINT per record, so the
//     failing record rolls back alone.
//   - [Async]: the consumer only stores the full message and acknowledges; a [Processor]
//     ([NewProcessor], a worker you run) drains the stored rows with FOR UPDATE SKIP LOCKED,
//     applies each in its own transaction, retries with backoff and parks rows that keep failing.
//
// # Event sources
//
// SQS messages arrive by raw delivery (attributes on the SQS message), inside the SNS JSON
// envelope, or as an EventBridge event an SQS-target rule delivered; [Parse] accepts all three
// and takes the dedup key from the messageId attribute, falling back to the SNS MessageId (or the
// EventBridge event id) and then the SQS messageId only when it is absent ([Message].IDSource).
// The same rules apply to the other sources the relay publishes to: [Consumer.HandleKinesis]
// (Kinesis Data Streams), [Consumer.HandleKafka] (Amazon MSK, self-managed Kafka) and
// [ConsumeKafka] (a franz-go client outside Lambda); [Consumer.HandleEvent] recognises which
// Lambda event source invoked it. On the streams, a failed record fails the rest of its shard or
// partition in the batch, so each is applied in order and never past a failure.
//
// # Fleets of tenant databases
//
// A fleet relay (pkg/fleet) names each message's tenant in the header [TenantHeader]. With
// [ConsumerConfig].Tenants set to a [TenantPools] ([NewTenantPools]: a bounded pool per tenant,
// opened from your resolver), a Consumer applies each message in its tenant's own database,
// exactly once per tenant, and records its dead letters there; a message of no known tenant
// fails with [ErrUnknownTenant]. [TenantProcessor] drains every tenant's stored rows.
//
// # Large payloads
//
// A payload a claim check stored in S3 (sluice's relay with outbox.ClaimCheck, or an AWS
// extended client) is fetched before the handler runs when [ConsumerConfig].ClaimCheck is set
// ([ClaimCheck], [NewS3PayloadStore]); without it the record fails with [ErrClaimCheck].
//
// # Operations
//
// [LagOf] reports each asynchronous consumer's backlog; [ListParked], [RetryParked] and
// [RetryAllParked] serve the operator of parked rows; [Purge] removes processed rows after the
// retention period (a purged message is no longer recognised as a duplicate). The sluice CLI
// calls these; it does not run a Processor.
//
// # Metrics and tracing
//
// ConsumerConfig.Metrics writes CloudWatch Embedded Metric Format lines, MetricsRecorder sends
// the same measurements to any metrics.Recorder (pkg/metrics defines each metric once:
// metrics.InboxProcessed, metrics.CommitToApplyLatency, ...). With a TracerProvider each record
// runs in a consumer span linked to the span that wrote the event (docs/tracing.md).
package inbox
