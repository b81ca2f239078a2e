-- txhook schema, version 2 (SQLite): indexes for the operations UI and
-- endpoint health.

-- +goose Up

-- One endpoint's deliveries, newest first, paged on (created_at, id).
CREATE INDEX IF NOT EXISTS txhook_deliveries_endpoint_created
    ON txhook_deliveries (endpoint_id, created_at, id);

-- An endpoint's latest failed attempt. Every failed attempt records an
-- error message and no successful one does; failures are the rare case, so
-- this partial index stays small and costs nothing on a successful attempt.
CREATE INDEX IF NOT EXISTS txhook_attempts_endpoint_failed
    ON txhook_attempts (endpoint_id, started_at) WHERE error <> '';

INSERT INTO txhook_migrations (version, name) VALUES (2, '002_ops_indexes');

-- +goose Down
DROP INDEX IF EXISTS txhook_attempts_endpoint_failed;
DROP INDEX IF EXISTS txhook_deliveries_endpoint_created;
DELETE FROM txhook_migrations WHERE version = 2;
