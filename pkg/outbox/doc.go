// Package outbox is sluice's transactional outbox: [Write] records events in the caller's own
// PostgreSQL transaction, and a [Relay] publishes committed rows to their destinations (SNS,
// EventBridge, Kinesis, Kafka: see [Publishers]) at least once, in per-partition-key order, with
// any number of relays running at once.
//
// A relay round locks partition keys (one advisory lock per key, never waited for), reads each
// key's first pending rows in a snapshot taken after the lock (the statement that enforces
// per-key order, against the database), publishes each key's rows one after another, and
// records each key's outcomes and releases it as soon as its own rows are done. A row is marked
// published only after the broker acknowledged it: a crash at any point may publish a row
// twice, never lose it, and a dead relay's keys come free with its connection. Rows that cannot
// be published are quarantined with their last error, block only their own partition key, and
// can be retried. docs/outbox.md describes the model in one page.
package outbox
