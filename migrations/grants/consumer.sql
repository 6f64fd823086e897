-- The privileges of a consumer's database role: read, insert, update and delete the
-- inbox_event rows of its own consumer name, and record its own dead letters in
-- inbox_dead_letter, enforced by row level security. The batched
-- commit mode deletes the rows it inserted for records that did not finish before it commits.
-- The tables its handlers write are the service's: grant those separately.
--
-- Run it after the migrations, as their role (the tables' owner), once per consumer role:
--
--     psql -v ON_ERROR_STOP=1 -v role=sluice_consumer_billing -v consumer=billing \
--          -v policy=sluice_inbox_sluice_consumer_billing -f migrations/grants/consumer.sql
--
-- role is the login role, consumer the inbox consumer name its rows carry (inbox.Config.Consumer),
-- policy a policy name of its own on inbox_event (the custom resource uses "sluice_inbox_" and
-- the role's name). Or copy it into your own migrations with the values in place of the
-- variables. The migrations custom resource (lambdas/migrate) applies this same file to the
-- roles it creates.
GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE inbox_event TO :"role";
-- The owner (the migrations' role) is exempt; every other role sees only the rows a policy
-- gives it.
ALTER TABLE inbox_event ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS :"policy" ON inbox_event;
CREATE POLICY :"policy" ON inbox_event TO :"role"
    USING (consumer = :'consumer') WITH CHECK (consumer = :'consumer');
-- Dead letters: the consumer records and updates its failed records (the operator's tools,
-- running as the owner, list, retry and purge them).
GRANT SELECT, INSERT, UPDATE ON TABLE inbox_dead_letter TO :"role";
ALTER TABLE inbox_dead_letter ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS :"policy" ON inbox_dead_letter;
CREATE POLICY :"policy" ON inbox_dead_letter TO :"role"
    USING (consumer = :'consumer') WITH CHECK (consumer = :'consumer');
