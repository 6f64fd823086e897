-- The privileges of a relay's database role: read outbox_event and update its rows
-- (publication and relay bookkeeping), read outbox_control, and execute sluice_horizon() (what
-- holds back VACUUM, without other sessions' query text; migration 0006). Nothing else: no
-- INSERT or DELETE of events, nothing of the inbox or of the service's tables.
--
-- Run it after the migrations, as their role (the tables' owner), once per relay role:
--
--     psql -v ON_ERROR_STOP=1 -v role=sluice_relay -f migrations/grants/relay.sql
--
-- or copy it into your own migrations with the role's name in place of the variable. The
-- migrations custom resource (lambdas/migrate) applies this same file to the roles it creates.
GRANT SELECT, UPDATE ON TABLE outbox_event TO :"role";
GRANT SELECT ON TABLE outbox_control TO :"role";
GRANT EXECUTE ON FUNCTION sluice_horizon() TO :"role";
