-- txhook schema, version 9 (SQLite): the event lease columns of the
-- PostgreSQL schema (see postgres/009_event_leases.sql). SQLite has one
-- writer at a time and keeps dispatching events into delivery rows, so
-- its relays leave these columns NULL; they are here so that both
-- dialects have the same tables.

-- Retention walks the deliveries by ID instead of
-- txhook_deliveries_finished, as on PostgreSQL: one index entry fewer per
-- delivery. txhook_deliveries_endpoint_log replaces
-- txhook_deliveries_endpoint_created and txhook_deliveries_endpoint_ok,
-- as on PostgreSQL (ok_started_at is a key column here: SQLite has no
-- INCLUDE). txhook_events_unrouted replaces txhook_events_dispatched,
-- as on PostgreSQL.

-- +goose Up
ALTER TABLE txhook_events ADD COLUMN lease_owner TEXT;
ALTER TABLE txhook_events ADD COLUMN lease_until INTEGER;
DROP INDEX IF EXISTS txhook_deliveries_finished;
CREATE INDEX IF NOT EXISTS txhook_deliveries_endpoint_log
    ON txhook_deliveries (endpoint_id, created_at, id, ok_started_at);
DROP INDEX IF EXISTS txhook_deliveries_endpoint_created;
DROP INDEX IF EXISTS txhook_deliveries_endpoint_ok;
ALTER TABLE txhook_events ADD COLUMN unrouted INTEGER;
UPDATE txhook_events SET unrouted = 1
WHERE dispatched_at IS NOT NULL
  AND NOT EXISTS (SELECT 1 FROM txhook_deliveries d WHERE d.event_id = txhook_events.id)
  AND NOT EXISTS (SELECT 1 FROM txhook_dead_letters dl WHERE dl.event_id = txhook_events.id);
CREATE INDEX IF NOT EXISTS txhook_events_unrouted ON txhook_events (dispatched_at) WHERE unrouted;
DROP INDEX IF EXISTS txhook_events_dispatched;

INSERT INTO txhook_migrations (version, name) VALUES (9, '009_event_leases');

-- +goose Down
CREATE INDEX IF NOT EXISTS txhook_events_dispatched ON txhook_events (dispatched_at)
    WHERE dispatched_at IS NOT NULL;
DROP INDEX IF EXISTS txhook_events_unrouted;
ALTER TABLE txhook_events DROP COLUMN unrouted;
CREATE INDEX IF NOT EXISTS txhook_deliveries_endpoint_created
    ON txhook_deliveries (endpoint_id, created_at, id);
CREATE INDEX IF NOT EXISTS txhook_deliveries_endpoint_ok
    ON txhook_deliveries (endpoint_id, ok_started_at)
    WHERE ok_started_at IS NOT NULL;
DROP INDEX IF EXISTS txhook_deliveries_endpoint_log;
CREATE INDEX IF NOT EXISTS txhook_deliveries_finished ON txhook_deliveries (updated_at)
    WHERE state IN ('succeeded', 'dead');
ALTER TABLE txhook_events DROP COLUMN lease_owner;
ALTER TABLE txhook_events DROP COLUMN lease_until;
DELETE FROM txhook_migrations WHERE version = 9;
