-- The privileges of a read-only `sluice console` role (docs/console.md): read the outbox, the
-- inbox and the dead letters, and nothing else: no INSERT, UPDATE or DELETE anywhere. inbox_event
-- and inbox_dead_letter have row level security (consumer.sql): the policy lets this role read
-- every consumer's rows. What holds a key (pg_locks, pg_stat_activity's pid, application name
-- and times) is readable by every role.
--
-- Run it after the migrations, as their role (the tables' owner), once per console role:
--
--     psql -v ON_ERROR_STOP=1 -v role=sluice_console -v policy=sluice_console_read \
--          -f migrations/grants/console.sql
--
-- A console started with --allow-actions retries rows as `sluice dead retry` does: run it with
-- the role the operator's CLI uses for that (the migrations' role), not this one.
GRANT SELECT ON TABLE outbox_event, inbox_event, inbox_dead_letter TO :"role";
DROP POLICY IF EXISTS :"policy" ON inbox_event;
CREATE POLICY :"policy" ON inbox_event FOR SELECT TO :"role" USING (true);
DROP POLICY IF EXISTS :"policy" ON inbox_dead_letter;
CREATE POLICY :"policy" ON inbox_dead_letter FOR SELECT TO :"role" USING (true);
