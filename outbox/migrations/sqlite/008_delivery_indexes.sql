-- txhook schema, version 8 (SQLite): txhook_deliveries_endpoint becomes a
-- partial index of unfinished deliveries, and a first attempt that
-- succeeds is recorded in its delivery's row; the attempt log is the view
-- txhook_attempt_log. See the PostgreSQL file.

-- +goose Up
CREATE INDEX IF NOT EXISTS txhook_deliveries_endpoint_unfinished
    ON txhook_deliveries (state, endpoint_id)
    WHERE state IN ('pending', 'running', 'paused', 'blocked');
DROP INDEX IF EXISTS txhook_deliveries_endpoint;
ALTER TABLE txhook_deliveries ADD COLUMN ok_started_at INTEGER;
ALTER TABLE txhook_deliveries ADD COLUMN ok_duration_us INTEGER;
ALTER TABLE txhook_deliveries ADD COLUMN ok_excerpt TEXT;
CREATE INDEX IF NOT EXISTS txhook_deliveries_endpoint_ok
    ON txhook_deliveries (endpoint_id, ok_started_at)
    WHERE ok_started_at IS NOT NULL;
CREATE VIEW IF NOT EXISTS txhook_attempt_log AS
SELECT id, delivery_id, endpoint_id, attempt, started_at, duration_us, status, response_excerpt, error
FROM txhook_attempts
UNION ALL
SELECT 0, id, endpoint_id, 1, ok_started_at, ok_duration_us, last_status, COALESCE(ok_excerpt, ''), ''
FROM txhook_deliveries
WHERE ok_started_at IS NOT NULL;

INSERT INTO txhook_migrations (version, name) VALUES (8, '008_delivery_indexes');

-- +goose Down
INSERT INTO txhook_attempts (delivery_id, endpoint_id, attempt, started_at, duration_us, status, response_excerpt, error)
SELECT id, endpoint_id, 1, ok_started_at, ok_duration_us, last_status, COALESCE(ok_excerpt, ''), ''
FROM txhook_deliveries
WHERE ok_started_at IS NOT NULL;
DROP VIEW IF EXISTS txhook_attempt_log;
DROP INDEX IF EXISTS txhook_deliveries_endpoint_ok;
ALTER TABLE txhook_deliveries DROP COLUMN ok_started_at;
ALTER TABLE txhook_deliveries DROP COLUMN ok_duration_us;
ALTER TABLE txhook_deliveries DROP COLUMN ok_excerpt;
CREATE INDEX IF NOT EXISTS txhook_deliveries_endpoint ON txhook_deliveries (endpoint_id, state);
DROP INDEX IF EXISTS txhook_deliveries_endpoint_unfinished;
DELETE FROM txhook_migrations WHERE version = 8;
