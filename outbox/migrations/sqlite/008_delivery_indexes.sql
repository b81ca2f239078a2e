-- txhook schema, version 8 (SQLite): txhook_deliveries_endpoint becomes a
-- partial index of unfinished deliveries. See the PostgreSQL file.

-- +goose Up
CREATE INDEX IF NOT EXISTS txhook_deliveries_endpoint_unfinished
    ON txhook_deliveries (state, endpoint_id)
    WHERE state IN ('pending', 'running', 'paused', 'blocked');
DROP INDEX IF EXISTS txhook_deliveries_endpoint;

INSERT INTO txhook_migrations (version, name) VALUES (8, '008_delivery_indexes');

-- +goose Down
CREATE INDEX IF NOT EXISTS txhook_deliveries_endpoint ON txhook_deliveries (endpoint_id, state);
DROP INDEX IF EXISTS txhook_deliveries_endpoint_unfinished;
DELETE FROM txhook_migrations WHERE version = 8;
