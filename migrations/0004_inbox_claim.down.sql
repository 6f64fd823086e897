CREATE INDEX IF NOT EXISTS inbox_event_unprocessed_idx ON inbox_event (consumer, seq)
    WHERE processed_at IS NULL AND parked_at IS NULL;
DROP INDEX IF EXISTS inbox_event_ready_idx;
