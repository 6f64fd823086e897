-- inbox_event: the consumer side's dedup record (see docs/inbox.md).
-- One row per (consumer, message_id): two consumers sharing a database each apply a fan-out
-- message once. Synchronous consumers insert the row in the same transaction as the effects
-- (processed_at set); the asynchronous inbox stores the full message (processed_at NULL) and a
-- processor applies it later.
CREATE TABLE inbox_event (
    consumer        text        NOT NULL CHECK (consumer <> ''),
    message_id      text        NOT NULL CHECK (message_id <> ''),
    -- Arrival order within the table; the asynchronous processor applies a message group in this order.
    seq             bigint      GENERATED ALWAYS AS IDENTITY,
    event_type      text        NOT NULL CHECK (event_type <> ''),
    aggregate_type  text        NOT NULL DEFAULT '',
    aggregate_id    text        NOT NULL DEFAULT '',
    -- FIFO MessageGroupId, NULL for standard queues.
    group_id        text        NULL,
    -- The producer's createdAt attribute, when it was present.
    created_at      timestamptz NULL,
    headers         jsonb       NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(headers) = 'object'),
    -- The message body. Optional for synchronous consumers, always stored by the asynchronous inbox.
    payload         jsonb       NULL,
    received_at     timestamptz NOT NULL DEFAULT now(),
    processed_at    timestamptz NULL,
    -- Asynchronous processor bookkeeping.
    attempts        integer     NOT NULL DEFAULT 0,
    last_error      text        NULL,
    next_attempt_at timestamptz NULL,
    parked_at       timestamptz NULL,
    PRIMARY KEY (consumer, message_id)
);

-- The processor's scan: unprocessed, unparked rows of a consumer in arrival order.
-- Its size follows the backlog, not the table.
CREATE INDEX inbox_event_unprocessed_idx ON inbox_event (consumer, seq)
    WHERE processed_at IS NULL AND parked_at IS NULL;

-- "Does an earlier row of this message group still wait?" (FIFO order in the asynchronous inbox).
CREATE INDEX inbox_event_unprocessed_group_idx ON inbox_event (consumer, group_id, seq)
    WHERE processed_at IS NULL AND group_id IS NOT NULL;

-- Parked rows are few; operators list and retry them.
CREATE INDEX inbox_event_parked_idx ON inbox_event (consumer, parked_at)
    WHERE parked_at IS NOT NULL AND processed_at IS NULL;

-- Retention purge of processed rows, oldest first.
CREATE INDEX inbox_event_processed_idx ON inbox_event (processed_at)
    WHERE processed_at IS NOT NULL;
