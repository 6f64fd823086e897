// Package outbox is sluice's transactional outbox: [Write] records events in the caller's own
// PostgreSQL transaction, and a [Relay] publishes committed rows to SNS at least once, in
// per-partition-key order, with any number of relays running at once.
//
// Each relay round runs in one short transaction: it claims rows, locking only the oldest
// unpublished row of each partition key it takes (FOR UPDATE SKIP LOCKED), publishes them, and
// records the outcomes before it commits; the locks keep each key with one relay at a time.
// A row is marked published only after the broker acknowledged it: a crash at any point may
// publish a row twice, never lose it, and a dead relay's keys come free with its connection. Rows that cannot be published are quarantined
// with their last error, block only their own partition key, and can be retried.
package outbox
