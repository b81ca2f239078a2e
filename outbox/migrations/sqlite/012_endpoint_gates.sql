-- txhook schema, version 12 (SQLite): the shared gates of the PostgreSQL
-- schema (see postgres/012_endpoint_gates.sql), times in microseconds
-- since the epoch. SQLite serves one process, so they hold its relays to
-- an endpoint's limits together.

-- +goose Up
CREATE TABLE IF NOT EXISTS txhook_endpoint_gates (
    endpoint_id   TEXT    PRIMARY KEY,
    tokens        REAL    NOT NULL DEFAULT 0,
    refilled_at   INTEGER,
    failures      INTEGER NOT NULL DEFAULT 0,
    cooldown_us   INTEGER NOT NULL DEFAULT 0,
    open_until    INTEGER,
    probe_until   INTEGER,
    blocked_until INTEGER
);

CREATE TABLE IF NOT EXISTS txhook_gate_slots (
    endpoint_id TEXT    NOT NULL,
    relay       TEXT    NOT NULL,
    slots       INTEGER NOT NULL,
    expires_at  INTEGER NOT NULL,
    PRIMARY KEY (endpoint_id, relay)
);

INSERT INTO txhook_migrations (version, name) VALUES (12, '012_endpoint_gates');

-- +goose Down
DROP TABLE IF EXISTS txhook_gate_slots;
DROP TABLE IF EXISTS txhook_endpoint_gates;
DELETE FROM txhook_migrations WHERE version = 12;
