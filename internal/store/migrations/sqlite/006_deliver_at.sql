-- txhook schema, version 6 (SQLite): delayed events.
--
-- Down (to undo by hand, SQLite 3.35 or newer):
--     ALTER TABLE txhook_events DROP COLUMN deliver_at;
--
-- The time before which no delivery of the event may be attempted
-- (microseconds since the epoch, as every time here), set by Enqueue from
-- Event.DeliverAt; NULL means at once. See the PostgreSQL file.
ALTER TABLE txhook_events ADD COLUMN deliver_at INTEGER;
