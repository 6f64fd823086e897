DROP TABLE IF EXISTS inbox_event;
