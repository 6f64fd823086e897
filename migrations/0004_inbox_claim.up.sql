-- 0004: the asynchronous inbox's claim no longer scans rows that cannot be taken (issue 10,
-- scenario 12). The Processor now finds work in two bounded ways (see docs/inbox.md, "How the
-- asynchronous processor works"):
--
--  * FIFO rows: a skip scan over message groups on inbox_event_unprocessed_group_idx (0002),
--    one index descent per group, so the rows waiting behind a parked or backing-off head are
--    never read;
--  * rows without a group: this index, ordered by when the row is ready, so rows in backoff and
--    FIFO rows are not in the range the claim reads.
--
-- The build takes a SHARE lock on inbox_event (inbox writes wait) while it reads the table once.
-- On a large table, create the index beforehand with CREATE INDEX CONCURRENTLY and the same
-- definition; IF NOT EXISTS then makes this step a no-op.
CREATE INDEX IF NOT EXISTS inbox_event_ready_idx
    ON inbox_event (consumer, (coalesce(next_attempt_at, received_at)), seq)
    WHERE processed_at IS NULL AND parked_at IS NULL AND group_id IS NULL;

-- The seq-ordered scan of every unprocessed row had no reader left: dropping it saves the
-- asynchronous consumer one index insertion per stored message.
DROP INDEX IF EXISTS inbox_event_unprocessed_idx;
