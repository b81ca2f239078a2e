-- txhook schema, version 6 (SQLite): delayed events.
--
-- The time before which no delivery of the event may be attempted
-- (microseconds since the epoch, as every time here), set by Enqueue from
-- Event.DeliverAt; NULL means at once. See the PostgreSQL file.

-- +goose Up
ALTER TABLE txhook_events ADD COLUMN deliver_at INTEGER;

INSERT INTO txhook_migrations (version, name) VALUES (6, '006_deliver_at');

-- +goose Down
ALTER TABLE txhook_events DROP COLUMN deliver_at;
DELETE FROM txhook_migrations WHERE version = 6;
