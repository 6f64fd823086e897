-- 0003: the relay claims by partition key instead of scanning rows in id order (issue 10), and
-- producers no longer pay for a NOTIFY in every commit (issue 11).

-- Relays now find new rows by polling the primary key and walk pending keys with a skip scan of
-- outbox_event_pending_key_idx, so the id-ordered partial index has no reader left: dropping it
-- saves every producer one index insertion.
DROP INDEX IF EXISTS outbox_event_pending_idx;

-- The statement-level NOTIFY serialized concurrent producers' commits on PostgreSQL's
-- notification queue lock; relays poll instead (see docs/outbox.md, "Waking up").
DROP TRIGGER IF EXISTS outbox_event_notify ON outbox_event;
DROP FUNCTION IF EXISTS outbox_event_notify();

-- When the row's current run of failed publish attempts began. Failures caused by a whole
-- destination failing do not count as attempts; they quarantine a row only once it has been
-- failing for longer than the relay's OutageLimit. Adding a nullable column is a catalog change.
ALTER TABLE outbox_event ADD COLUMN IF NOT EXISTS failing_since timestamptz NULL;

-- One row that operator actions bump (Replay, RetryQuarantined): relays see the change on their
-- next poll and re-read every key's head instead of continuing after the rows they published.
CREATE TABLE IF NOT EXISTS outbox_control (
    singleton    boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    admin_epoch  bigint  NOT NULL DEFAULT 0
);
INSERT INTO outbox_control (singleton) VALUES (true) ON CONFLICT DO NOTHING;
