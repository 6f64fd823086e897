-- 0005: payloads keep the bytes written. jsonb reorders keys, drops whitespace and duplicate
-- keys and reprints numbers (the 8 bytes 1e131071 print as 131,072 digits), so the relay
-- published PostgreSQL's rendering instead of the producer's bytes and a small stored row could
-- explode when rendered. json stores the text as given, after checking that it is JSON; the relay
-- publishes it byte for byte (see docs/schema.md). Plain-SQL producers may still insert text or
-- jsonb values: both are assignment-cast to json.
--
-- Existing rows keep jsonb's text of their payload, which is what would have been published.
--
-- Cost: each ALTER rewrites its table and rebuilds its indexes while holding an ACCESS EXCLUSIVE
-- lock: producers (or consumers, for inbox_event), relays and readers wait until it commits.
-- Measured on a 2-core development machine: 4.3 s for one million small outbox rows (a 400 MB table); plan a
-- maintenance window, or purge published rows first (sluice purge), on a large table. A table
-- converted with `sluice partition` is altered through its parent, partition by partition, in
-- this same transaction; partitions created afterwards copy the parent's json column.
ALTER TABLE outbox_event ALTER COLUMN payload TYPE json USING payload::json;
ALTER TABLE inbox_event ALTER COLUMN payload TYPE json USING payload::json;
