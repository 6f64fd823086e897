-- Back to jsonb: rewrites both tables under an ACCESS EXCLUSIVE lock, as the up step does. A
-- payload that jsonb refuses (one holding \u0000, or a number beyond numeric's range such as
-- 1e400000) makes this step fail, naming the value; fix or delete such rows first.
ALTER TABLE inbox_event ALTER COLUMN payload TYPE jsonb USING payload::jsonb;
ALTER TABLE outbox_event ALTER COLUMN payload TYPE jsonb USING payload::jsonb;
