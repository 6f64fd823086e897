-- Roles granted EXECUTE lose it with the function; outbox.HorizonOf then reads the views
-- directly again (seeing other roles' sessions only with pg_read_all_stats).
DROP FUNCTION IF EXISTS sluice_horizon();
