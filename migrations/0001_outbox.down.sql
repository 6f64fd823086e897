DROP TRIGGER IF EXISTS outbox_event_notify ON outbox_event;
DROP FUNCTION IF EXISTS outbox_event_notify();
DROP TABLE IF EXISTS outbox_event;
