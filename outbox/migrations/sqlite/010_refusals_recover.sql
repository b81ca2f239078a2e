-- txhook schema, version 10 (SQLite): the columns and index of the
-- PostgreSQL schema (see postgres/010_refusals_recover.sql):
-- refused_since (microseconds since the epoch, by SQLite's clock), the
-- dead letters' reason, and the index of unrouted events by tenant in
-- place of the one by time.

-- +goose Up
ALTER TABLE txhook_deliveries ADD COLUMN refused_since INTEGER;
ALTER TABLE txhook_dead_letters ADD COLUMN reason TEXT NOT NULL DEFAULT 'failed';
CREATE INDEX IF NOT EXISTS txhook_events_unrouted_tenant ON txhook_events (tenant, dispatched_at) WHERE unrouted;
DROP INDEX IF EXISTS txhook_events_unrouted;
CREATE INDEX IF NOT EXISTS txhook_dead_letters_refused ON txhook_dead_letters (endpoint_id) WHERE reason = 'refused';

INSERT INTO txhook_migrations (version, name) VALUES (10, '010_refusals_recover');

-- +goose Down
DROP INDEX IF EXISTS txhook_dead_letters_refused;
CREATE INDEX IF NOT EXISTS txhook_events_unrouted ON txhook_events (dispatched_at) WHERE unrouted;
DROP INDEX IF EXISTS txhook_events_unrouted_tenant;
ALTER TABLE txhook_dead_letters DROP COLUMN reason;
ALTER TABLE txhook_deliveries DROP COLUMN refused_since;
DELETE FROM txhook_migrations WHERE version = 10;
