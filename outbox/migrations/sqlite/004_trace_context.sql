-- txhook schema, version 4 (SQLite): the trace context of the enqueue. See
-- the PostgreSQL file of the same version for the why.

-- +goose Up
ALTER TABLE txhook_events ADD COLUMN trace_parent TEXT;
ALTER TABLE txhook_events ADD COLUMN trace_state TEXT;

INSERT INTO txhook_migrations (version, name) VALUES (4, '004_trace_context');

-- +goose Down
ALTER TABLE txhook_events DROP COLUMN trace_state;
ALTER TABLE txhook_events DROP COLUMN trace_parent;
DELETE FROM txhook_migrations WHERE version = 4;
