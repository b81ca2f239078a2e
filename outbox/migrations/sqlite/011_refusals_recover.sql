-- txhook schema, version 11 (SQLite): the columns and index of the
-- PostgreSQL schema (see postgres/011_refusals_recover.sql):
-- place of the one by time.

-- +goose Up
CREATE INDEX IF NOT EXISTS txhook_events_unrouted_tenant ON txhook_events (tenant, dispatched_at) WHERE unrouted;
DROP INDEX IF EXISTS txhook_events_unrouted;

INSERT INTO txhook_migrations (version, name) VALUES (11, '011_refusals_recover');

-- +goose Down
CREATE INDEX IF NOT EXISTS txhook_events_unrouted ON txhook_events (dispatched_at) WHERE unrouted;
DROP INDEX IF EXISTS txhook_events_unrouted_tenant;
DELETE FROM txhook_migrations WHERE version = 11;
