-- txhook schema, version 8 (PostgreSQL): fewer rows, index entries and WAL
-- bytes per delivery.
--
-- Measured by examples/bench (one endpoint, first attempts succeed), the
-- drain wrote 2,290 bytes of WAL per delivery before this version and
-- 1,605 after, enqueue adding 441 (docs/BENCHMARKS.md), and three rows
-- instead of four.
--
-- txhook_deliveries_endpoint indexed every delivery by (endpoint_id,
-- state), finished ones included, although every query that filters on an
-- endpoint's state looks for unfinished deliveries (the health backlog and
-- the relays' backlog gauge, pausing, resuming and parking an endpoint's
-- waiting deliveries); a listing of all of an endpoint's deliveries walks
-- txhook_deliveries_endpoint_created (endpoint_id, created_at, id), which
-- covers the endpoint_id prefix too. The partial index below holds only
-- unfinished deliveries, so the completion of a delivery (to 'succeeded' or
-- 'dead') adds no entry to it: one B-tree insert fewer, about 80 bytes of
-- WAL and its CPU, per delivery; and it stays as small as the backlog.
-- state comes first: the completion statement looks up the running
-- deliveries of a batch, and may walk this index for them; it then reads
-- the running ones only, never the whole backlog of pending retries.
--
-- Fill factor 50 on the queue tables. Each event is updated once after its
-- insert (dispatched) and each delivery about once (completed), and neither
-- update can be HOT: both change indexed columns. With full pages the new
-- row version goes to another page, which costs a second WAL record (the
-- old row's lock, written before the page is left) and the whole new row;
-- with room on the page the update stays there, logs one record, and logs
-- only the bytes that changed. The table takes about the same room: the
-- dead version sat on a page of its own before and beside the live one
-- now, until pruning or vacuum frees it. It applies to pages written from
-- now on.
--
-- A first attempt that succeeds is recorded in its delivery's row, not in
-- txhook_attempts: ok_started_at, ok_duration_us and ok_excerpt (the
-- status is last_status, the error ''), written by the same update that
-- marks the delivery succeeded. That is the common case, and it saves an
-- attempt row and its three index entries (about 420 bytes of WAL). Every
-- other attempt (failures, retries, a lapsed lease's record, a success
-- after a failure) is still a row of txhook_attempts. The attempt log is
-- the view txhook_attempt_log: the rows of txhook_attempts and, for each
-- delivery with ok_started_at set, its inline attempt, numbered 1, with id
-- 0. Anything that reads the attempt log should read it (txhook's reads of
-- an endpoint's latest attempts query both parts, each with its own limit,
-- which the planner cannot do through the view). txhook_deliveries_endpoint_ok serves the per-endpoint
-- reads of the log (health counts and latencies, the latest successes)
-- for the inline attempts, as txhook_attempts_endpoint does for the rows.
-- Going down moves the inline attempts into txhook_attempts first.
--
-- On a large, busy outbox, create the new indexes first with CREATE INDEX
-- CONCURRENTLY (same name and definition), so that this migration does not
-- hold a write lock while it is built.

-- +goose Up
CREATE INDEX IF NOT EXISTS txhook_deliveries_endpoint_unfinished
    ON txhook_deliveries (state, endpoint_id)
    WHERE state IN ('pending', 'running', 'paused', 'blocked');
DROP INDEX IF EXISTS txhook_deliveries_endpoint;
ALTER TABLE txhook_deliveries
    ADD COLUMN IF NOT EXISTS ok_started_at  timestamptz,
    ADD COLUMN IF NOT EXISTS ok_duration_us bigint,
    ADD COLUMN IF NOT EXISTS ok_excerpt     text;
CREATE INDEX IF NOT EXISTS txhook_deliveries_endpoint_ok
    ON txhook_deliveries (endpoint_id, ok_started_at)
    WHERE ok_started_at IS NOT NULL;
CREATE OR REPLACE VIEW txhook_attempt_log AS
SELECT id, delivery_id, endpoint_id, attempt, started_at, duration_us, status, response_excerpt, error
FROM txhook_attempts
UNION ALL
SELECT 0, id, endpoint_id, 1, ok_started_at, ok_duration_us, last_status, COALESCE(ok_excerpt, ''), ''
FROM txhook_deliveries
WHERE ok_started_at IS NOT NULL;
ALTER TABLE txhook_events SET (fillfactor = 50);
ALTER TABLE txhook_deliveries SET (fillfactor = 50);

INSERT INTO txhook_migrations (version, name) VALUES (8, '008_delivery_indexes');

-- +goose Down
INSERT INTO txhook_attempts (delivery_id, endpoint_id, attempt, started_at, duration_us, status, response_excerpt, error)
SELECT id, endpoint_id, 1, ok_started_at, ok_duration_us, last_status, COALESCE(ok_excerpt, ''), ''
FROM txhook_deliveries
WHERE ok_started_at IS NOT NULL;
DROP VIEW IF EXISTS txhook_attempt_log;
DROP INDEX IF EXISTS txhook_deliveries_endpoint_ok;
ALTER TABLE txhook_deliveries
    DROP COLUMN IF EXISTS ok_started_at,
    DROP COLUMN IF EXISTS ok_duration_us,
    DROP COLUMN IF EXISTS ok_excerpt;
ALTER TABLE txhook_events RESET (fillfactor);
ALTER TABLE txhook_deliveries RESET (fillfactor);
CREATE INDEX IF NOT EXISTS txhook_deliveries_endpoint ON txhook_deliveries (endpoint_id, state);
DROP INDEX IF EXISTS txhook_deliveries_endpoint_unfinished;
DELETE FROM txhook_migrations WHERE version = 8;
