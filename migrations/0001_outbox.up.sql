-- outbox_event: the transactional outbox (see docs/schema.md).
-- Producers in any language may INSERT the classic columns with plain SQL;
-- everything after published_at is relay bookkeeping.
CREATE TABLE outbox_event (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id        uuid        NOT NULL UNIQUE,
    topic           text        NOT NULL CHECK (topic <> ''),
    aggregate_type  text        NOT NULL,
    aggregate_id    text        NOT NULL,
    event_type      text        NOT NULL CHECK (event_type <> ''),
    partition_key   text        NOT NULL,
    payload         jsonb       NOT NULL,
    headers         jsonb       NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(headers) = 'object'),
    created_at      timestamptz NOT NULL DEFAULT now(),
    published_at    timestamptz NULL,
    -- Relay bookkeeping.
    -- available_at: the row (and so its partition_key) is not claimable before this time:
    -- the backoff after a failed publish attempt.
    available_at    timestamptz NULL,
    attempts        integer     NOT NULL DEFAULT 0,
    last_error      text        NULL,
    quarantined_at  timestamptz NULL
)
-- Room on each page lets backoff and retry updates (available_at is in no index) stay HOT.
WITH (fillfactor = 80);

-- The relay's scan: unpublished rows in id order. Its size follows the backlog, not the table.
CREATE INDEX outbox_event_pending_idx ON outbox_event (id) WHERE published_at IS NULL;

-- Per-key ordering: "is this row the head of its partition_key?" and "the next rows of this key".
CREATE INDEX outbox_event_pending_key_idx ON outbox_event (partition_key, id) WHERE published_at IS NULL;

-- Quarantined rows are few; the relay excludes their keys and operators list them.
CREATE INDEX outbox_event_quarantined_idx ON outbox_event (partition_key, id)
    WHERE quarantined_at IS NOT NULL AND published_at IS NULL;

-- Wake relays early: one notification per inserting statement, not per row.
CREATE FUNCTION outbox_event_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('sluice_outbox', '');
    RETURN NULL;
END;
$$;

CREATE TRIGGER outbox_event_notify
    AFTER INSERT ON outbox_event
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_event_notify();
