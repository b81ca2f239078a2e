-- txhook schema, version 6 (PostgreSQL): delayed events.
--
-- The time before which no delivery of the event may be attempted, set by
-- Enqueue from Event.DeliverAt; NULL means at once (every event enqueued
-- before this version). A relay dispatches a delayed event as soon as it is
-- committed, as any other, but creates its deliveries 'pending' with
-- next_attempt_at = deliver_at instead of claiming them, so the claim
-- query's index times them like retries. A nullable column without a
-- default: adding it rewrites nothing. Going down keeps the deliveries
-- already created, with their times.

-- +goose Up
ALTER TABLE txhook_events ADD COLUMN IF NOT EXISTS deliver_at timestamptz;

INSERT INTO txhook_migrations (version, name) VALUES (6, '006_deliver_at');

-- +goose Down
ALTER TABLE txhook_events DROP COLUMN IF EXISTS deliver_at;
DELETE FROM txhook_migrations WHERE version = 6;
