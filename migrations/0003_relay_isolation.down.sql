DROP TABLE IF EXISTS outbox_control;
ALTER TABLE outbox_event DROP COLUMN IF EXISTS failing_since;

CREATE INDEX IF NOT EXISTS outbox_event_pending_idx ON outbox_event (id) WHERE published_at IS NULL;

CREATE OR REPLACE FUNCTION outbox_event_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('sluice_outbox', '');
    RETURN NULL;
END;
$$;
DROP TRIGGER IF EXISTS outbox_event_notify ON outbox_event;
CREATE TRIGGER outbox_event_notify
    AFTER INSERT ON outbox_event
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_event_notify();
