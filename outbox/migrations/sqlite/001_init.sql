-- txhook schema, version 1 (SQLite 3.35 or newer).
--
-- Times are integers: microseconds since the Unix epoch, UTC, so that they
-- compare and index correctly. JSON columns are text checked with json_valid.

-- +goose Up

CREATE TABLE txhook_endpoints (
    id              TEXT    PRIMARY KEY,
    tenant          TEXT    NOT NULL,
    url             TEXT    NOT NULL,
    description     TEXT    NOT NULL DEFAULT '',
    event_types     TEXT    NOT NULL DEFAULT '[]' CHECK (json_valid(event_types)),
    secrets         TEXT    NOT NULL CHECK (json_valid(secrets)),
    enabled         INTEGER NOT NULL DEFAULT 1,
    rate_limit      REAL    NOT NULL DEFAULT 0,
    rate_burst      INTEGER NOT NULL DEFAULT 0,
    max_in_flight   INTEGER NOT NULL DEFAULT 0,
    versions        TEXT    NOT NULL DEFAULT '{}' CHECK (json_valid(versions)),
    disabled_reason TEXT    NOT NULL DEFAULT '',
    failing_since   INTEGER,
    created_at      INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL
);
CREATE INDEX txhook_endpoints_tenant ON txhook_endpoints (tenant, id);

CREATE TABLE txhook_events (
    id              TEXT    PRIMARY KEY,
    tenant          TEXT    NOT NULL,
    type            TEXT    NOT NULL,
    payload         TEXT    NOT NULL,
    idempotency_key TEXT,
    version         INTEGER NOT NULL DEFAULT 1,
    ordering_key    TEXT,
    created_at      INTEGER NOT NULL,
    dispatched_at   INTEGER
);
CREATE UNIQUE INDEX txhook_events_idempotency ON txhook_events (tenant, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX txhook_events_undispatched ON txhook_events (created_at)
    WHERE dispatched_at IS NULL AND ordering_key IS NULL;
CREATE INDEX txhook_events_undispatched_keyed ON txhook_events (created_at)
    WHERE dispatched_at IS NULL AND ordering_key IS NOT NULL;
CREATE INDEX txhook_events_undispatched_by_key ON txhook_events (tenant, ordering_key, created_at)
    WHERE dispatched_at IS NULL AND ordering_key IS NOT NULL;
CREATE INDEX txhook_events_dispatched ON txhook_events (dispatched_at)
    WHERE dispatched_at IS NOT NULL;

CREATE TABLE txhook_deliveries (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id        TEXT    NOT NULL,
    endpoint_id     TEXT    NOT NULL,
    state           TEXT    NOT NULL CHECK (state IN ('pending', 'running', 'succeeded', 'dead', 'paused', 'blocked')),
    ordering_key    TEXT,
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at INTEGER NOT NULL,
    lease_owner     TEXT,
    last_status     INTEGER,
    last_error      TEXT    NOT NULL DEFAULT '',
    created_at      INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL
);
CREATE INDEX txhook_deliveries_due ON txhook_deliveries (next_attempt_at)
    WHERE state IN ('pending', 'running');
CREATE INDEX txhook_deliveries_event ON txhook_deliveries (event_id);
CREATE INDEX txhook_deliveries_endpoint ON txhook_deliveries (endpoint_id, state);
CREATE INDEX txhook_deliveries_ordered ON txhook_deliveries (endpoint_id, ordering_key, id)
    WHERE ordering_key IS NOT NULL AND state IN ('pending', 'running', 'paused', 'blocked');
CREATE INDEX txhook_deliveries_finished ON txhook_deliveries (updated_at)
    WHERE state IN ('succeeded', 'dead');

CREATE TABLE txhook_attempts (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    delivery_id      INTEGER NOT NULL,
    endpoint_id      TEXT    NOT NULL,
    attempt          INTEGER NOT NULL,
    started_at       INTEGER NOT NULL,
    duration_us      INTEGER NOT NULL,
    status           INTEGER,
    response_excerpt TEXT    NOT NULL DEFAULT '',
    error            TEXT    NOT NULL DEFAULT ''
);
CREATE INDEX txhook_attempts_delivery ON txhook_attempts (delivery_id, attempt);
CREATE INDEX txhook_attempts_endpoint ON txhook_attempts (endpoint_id, started_at);

CREATE TABLE txhook_dead_letters (
    delivery_id INTEGER PRIMARY KEY,
    event_id    TEXT    NOT NULL,
    endpoint_id TEXT    NOT NULL,
    tenant      TEXT    NOT NULL,
    event_type  TEXT    NOT NULL,
    attempts    INTEGER NOT NULL,
    last_status INTEGER,
    last_error  TEXT    NOT NULL DEFAULT '',
    failed_at   INTEGER NOT NULL
);
CREATE INDEX txhook_dead_letters_failed ON txhook_dead_letters (failed_at, delivery_id);
CREATE INDEX txhook_dead_letters_tenant ON txhook_dead_letters (tenant, failed_at);
CREATE INDEX txhook_dead_letters_endpoint ON txhook_dead_letters (endpoint_id, failed_at);
CREATE INDEX txhook_dead_letters_event ON txhook_dead_letters (event_id);

-- Each migration records itself here, whichever tool applies it: the
-- relay checks this table at start for the migrations it needs.
CREATE TABLE IF NOT EXISTS txhook_migrations (
    version    INTEGER PRIMARY KEY,
    name       TEXT    NOT NULL,
    applied_at INTEGER NOT NULL DEFAULT (CAST((julianday('now') - 2440587.5) * 86400000000 AS INTEGER))
);
INSERT INTO txhook_migrations (version, name) VALUES (1, '001_init');

-- +goose Down
DROP TABLE txhook_dead_letters;
DROP TABLE txhook_attempts;
DROP TABLE txhook_deliveries;
DROP TABLE txhook_events;
DROP TABLE txhook_endpoints;
DROP TABLE txhook_migrations;
