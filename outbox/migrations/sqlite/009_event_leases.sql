-- txhook schema, version 9 (SQLite): the event lease columns of the
-- PostgreSQL schema (see postgres/009_event_leases.sql). SQLite has one
-- writer at a time and keeps dispatching events into delivery rows, so
-- its relays leave these columns NULL; they are here so that both
-- dialects have the same tables.

-- Retention walks the deliveries by ID instead of
-- txhook_deliveries_finished, as on PostgreSQL: one index entry fewer per
-- delivery.

-- +goose Up
ALTER TABLE txhook_events ADD COLUMN lease_owner TEXT;
ALTER TABLE txhook_events ADD COLUMN lease_until INTEGER;
DROP INDEX IF EXISTS txhook_deliveries_finished;

INSERT INTO txhook_migrations (version, name) VALUES (9, '009_event_leases');

-- +goose Down
CREATE INDEX IF NOT EXISTS txhook_deliveries_finished ON txhook_deliveries (updated_at)
    WHERE state IN ('succeeded', 'dead');
ALTER TABLE txhook_events DROP COLUMN lease_owner;
ALTER TABLE txhook_events DROP COLUMN lease_until;
DELETE FROM txhook_migrations WHERE version = 9;
