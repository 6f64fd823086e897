-- inbox_dead_letter: why a consumer's record failed, kept where the operator's tools can read it
-- (docs/inbox.md, "Dead letters"). The consumer writes a row, in a statement of its own after
-- the record's transaction rolled back, each time a record fails through its own fault (not a
-- blocked FIFO group, not the invocation's deadline): one row per (consumer, record), its
-- attempts counted. The attempt the source will not repeat (the SQS receive before the DLQ, a
-- stream mapping's last retry, ConsumeKafka's give-up) sets dead_at.
--
-- Whether a dead letter was applied since (by `sluice dead retry`, a DLQ redrive, or a later
-- delivery) is not stored here: inbox_event says it, and the operator's tools read it there.
CREATE TABLE inbox_dead_letter (
    consumer        text        NOT NULL CHECK (consumer <> ''),
    -- The message id (the dedup key) or, for a record that could not be parsed, SOURCE_NAME/POSITION.
    record_key      text        NOT NULL CHECK (record_key <> ''),
    -- NULL when the record could not be parsed: it has no message id and cannot be retried.
    message_id      text        NULL,
    event_type      text        NOT NULL DEFAULT '',
    aggregate_type  text        NOT NULL DEFAULT '',
    aggregate_id    text        NOT NULL DEFAULT '',
    group_id        text        NULL,
    created_at      timestamptz NULL,
    -- Where it came from: aws:sqs, aws:kinesis or kafka; the queue ARN, stream ARN or topic; the
    -- SQS message id, SHARD/SEQUENCE or PARTITION@OFFSET of the last failed delivery.
    source          text        NOT NULL,
    source_name     text        NOT NULL DEFAULT '',
    source_position text        NOT NULL DEFAULT '',
    -- The source's own count (SQS ApproximateReceiveCount) at the last failure; NULL when the
    -- source gives none (Kinesis, Kafka).
    receive_count   integer     NULL,
    -- Failures recorded for this record.
    attempts        integer     NOT NULL DEFAULT 1,
    -- The last failure: its class (docs/inbox.md lists them), its text, and the chain of wrapped
    -- errors as [{"type": Go type, "text": message}, ...], outermost first.
    error_class     text        NOT NULL,
    error_text      text        NOT NULL,
    error_chain     jsonb       NOT NULL DEFAULT '[]',
    headers         jsonb       NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(headers) = 'object'),
    -- The payload as the handler got it (already fetched from S3 when a claim check had
    -- offloaded it), or the raw record body when it could not be parsed. Text: it may not be JSON.
    payload         text        NULL,
    first_failed_at timestamptz NOT NULL DEFAULT now(),
    last_failed_at  timestamptz NOT NULL DEFAULT now(),
    -- Set by the failure of the last attempt the source makes; cleared by a later failure on
    -- an earlier attempt (a redriven copy is retried again before it is dead again).
    dead_at         timestamptz NULL,
    -- When `sluice dead retry` last stored it in inbox_event for the processor.
    retried_at      timestamptz NULL,
    PRIMARY KEY (consumer, record_key)
);

-- Operators list a consumer's dead letters, newest failure first; the purge reads the oldest.
CREATE INDEX inbox_dead_letter_last_failed_idx ON inbox_dead_letter (consumer, last_failed_at);
CREATE INDEX inbox_dead_letter_purge_idx ON inbox_dead_letter (last_failed_at);
