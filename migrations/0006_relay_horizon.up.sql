-- 0006: the relay reads what holds back VACUUM without the pg_read_all_stats role (issue 22).
--
-- pg_read_all_stats shows every session's query text with its literals (card numbers, e-mail
-- addresses in a WHERE clause) to whoever holds it. The relay's horizon metric
-- (outbox.HorizonOf: OldestTransactionAgeSeconds) needs only, per session of this database that
-- holds a transaction id or a snapshot: its pid, application or user name, state, transaction
-- start and the age of its xid/xmin. This function returns exactly HorizonOf's rows and runs with
-- its owner's rights (the role that ran the migrations: on RDS the master user, whose
-- rds_superuser role includes pg_monitor, so pg_read_all_stats). The migrations custom resource
-- grants EXECUTE on it to the relay's role; nobody else may call it.
--
-- search_path is pinned, as every SECURITY DEFINER function's must be, so a caller cannot make it
-- run objects of its own. Only catalog views are read; nothing is written.
CREATE OR REPLACE FUNCTION sluice_horizon()
RETURNS TABLE (timed boolean, catalog_only boolean, holder text, age interval, xid_age bigint)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT true, false,
           format('session %s (%s, %s)', pid, coalesce(nullif(application_name, ''), usename::text, '?'), coalesce(state, '?')),
           now() - xact_start, greatest(age(backend_xid), age(backend_xmin))::bigint
    FROM pg_stat_activity
    WHERE (backend_xid IS NOT NULL OR backend_xmin IS NOT NULL) AND xact_start IS NOT NULL
      AND pid <> pg_backend_pid() AND datname = current_database()
      -- VACUUM's own snapshot is ignored by other VACUUMs.
      AND backend_type <> 'autovacuum worker'
    UNION ALL
    SELECT true, false, format('prepared transaction %s (owner %s)', gid, owner), now() - prepared, age(transaction)::bigint
    FROM pg_prepared_xacts
    WHERE database = current_database()
    UNION ALL
    SELECT false, xmin IS NULL,
           format('replication slot %s (%s, %s; %s %s transactions old)', slot_name, slot_type,
                  CASE WHEN active THEN 'active' ELSE 'inactive' END,
                  CASE WHEN xmin IS NOT NULL THEN 'xmin' ELSE 'catalog_xmin, which holds back only the system catalogs:' END,
                  coalesce(age(xmin), age(catalog_xmin))),
           NULL, coalesce(age(xmin), age(catalog_xmin))::bigint
    FROM pg_replication_slots
    WHERE xmin IS NOT NULL OR catalog_xmin IS NOT NULL
    UNION ALL
    SELECT false, false,
           format('standby feedback through walsender %s (%s; xmin %s transactions old)', pid,
                  coalesce(nullif(application_name, ''), usename::text, '?'), age(backend_xmin)),
           NULL, age(backend_xmin)::bigint
    FROM pg_stat_activity
    WHERE backend_type = 'walsender' AND backend_xmin IS NOT NULL
$$;

REVOKE ALL ON FUNCTION sluice_horizon() FROM PUBLIC;
