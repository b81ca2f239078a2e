-- txhook schema, version 4 (PostgreSQL): the trace context of the enqueue.
--
-- When the Outbox has a TracerProvider (Config.TracerProvider), Enqueue
-- stores the W3C trace context of its span with the event: traceparent and,
-- if any, tracestate, as the headers carry them. A relay, in this process or
-- another and however much later, makes each delivery attempt's span a
-- child of it and sends it on to the receiver. Both stay NULL when tracing
-- is off, and Enqueue then runs the same statement as before this version.
-- Adding nullable columns without a default rewrites nothing.

-- +goose Up
ALTER TABLE txhook_events
    ADD COLUMN IF NOT EXISTS trace_parent text,
    ADD COLUMN IF NOT EXISTS trace_state text;

INSERT INTO txhook_migrations (version, name) VALUES (4, '004_trace_context');

-- +goose Down
ALTER TABLE txhook_events
    DROP COLUMN IF EXISTS trace_parent,
    DROP COLUMN IF EXISTS trace_state;
DELETE FROM txhook_migrations WHERE version = 4;
