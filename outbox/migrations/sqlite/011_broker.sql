-- txhook schema, version 11 (SQLite): the broker mode tables of the
-- PostgreSQL schema (see postgres/011_broker.sql). SQLite has one writer
-- at a time, so its forwarder claims undispatched events under a lease
-- and marks them forwarded, as table-mode relays dispatch them; events
-- carry no transaction ID here.

-- +goose Up
CREATE TABLE IF NOT EXISTS txhook_forwarders (
    name        TEXT    PRIMARY KEY,
    position    TEXT    NOT NULL DEFAULT '',
    lease_owner TEXT,
    lease_until INTEGER,
    updated_at  INTEGER NOT NULL
);

CREATE TABLE IF NOT EXISTS txhook_broker_keys (
    name       TEXT    PRIMARY KEY,
    mac_key    TEXT    NOT NULL,
    created_at INTEGER NOT NULL
);

INSERT INTO txhook_migrations (version, name) VALUES (11, '011_broker');

-- +goose Down
DROP TABLE IF EXISTS txhook_broker_keys;
DROP TABLE IF EXISTS txhook_forwarders;
DELETE FROM txhook_migrations WHERE version = 11;
