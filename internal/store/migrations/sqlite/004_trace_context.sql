-- txhook schema, version 4 (SQLite): the trace context of the enqueue. See
-- the PostgreSQL file of the same version for the why.
--
-- Down (to version 3; SQLite 3.35 or later):
--   ALTER TABLE txhook_events DROP COLUMN trace_parent;
--   ALTER TABLE txhook_events DROP COLUMN trace_state;
--   DELETE FROM txhook_migrations WHERE version = 4;
ALTER TABLE txhook_events ADD COLUMN trace_parent TEXT;
ALTER TABLE txhook_events ADD COLUMN trace_state TEXT;
