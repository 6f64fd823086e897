// Package outbox is sluice's transactional outbox: [Write] records events in the caller's own
// PostgreSQL transaction, and a [Relay] publishes committed rows to SNS at least once, in
// per-partition-key order, with any number of relays running at once.
//
// The relay claims work with FOR UPDATE SKIP LOCKED in a short transaction and holds a lease
// (a timestamp in the row) while it publishes, so no transaction stays open during network
// calls. A row is marked published only after the broker acknowledged it: a crash at any
// point may publish a row twice, never lose it. Rows that cannot be published are quarantined
// with their last error, block only their own partition key, and can be retried.
package outbox
