-- txhook schema, version 11 (PostgreSQL): broker mode (package
-- outbox/broker), which forwards events to NATS JetStream instead of
-- dispatching them into delivery rows.
--
-- An event enqueued by an Outbox in broker mode (Config.Broker) carries
-- the ID of the transaction that wrote it, forward_xid, and is written
-- with dispatched_at set, so that it never enters the partial indexes of
-- undispatched events that table-mode relays claim from. A forwarder
-- finds new events by comparing forward_xid with the snapshot it read
-- last (a cursor kept in txhook_forwarders), so forwarding writes nothing
-- per event: the index below is the only cost an event pays for it, as
-- table mode's undispatched index is the one an event pays there. Events
-- of table mode leave forward_xid NULL and are not in the index.
--
-- txhook_forwarders holds one cursor per stream: the snapshot up to which
-- events were forwarded, leased to one forwarder at a time.
-- txhook_broker_keys holds, per stream, the key with which forwarders
-- authenticate the messages they publish and workers check them, so that a
-- message published on the stream's subjects by anyone else is never
-- delivered.

-- +goose Up
ALTER TABLE txhook_events ADD COLUMN IF NOT EXISTS forward_xid xid8;
CREATE INDEX IF NOT EXISTS txhook_events_forward ON txhook_events (forward_xid)
    WHERE forward_xid IS NOT NULL;

CREATE TABLE IF NOT EXISTS txhook_forwarders (
    name        text        PRIMARY KEY,
    -- pg_snapshot text of the last round forwarded; '' before the first.
    position    text        NOT NULL DEFAULT '',
    lease_owner text,
    lease_until timestamptz,
    updated_at  timestamptz NOT NULL
);

CREATE TABLE IF NOT EXISTS txhook_broker_keys (
    name       text        PRIMARY KEY,
    mac_key    text        NOT NULL,
    created_at timestamptz NOT NULL
);

INSERT INTO txhook_migrations (version, name) VALUES (11, '011_broker');

-- +goose Down
DROP TABLE IF EXISTS txhook_broker_keys;
DROP TABLE IF EXISTS txhook_forwarders;
DROP INDEX IF EXISTS txhook_events_forward;
ALTER TABLE txhook_events DROP COLUMN IF EXISTS forward_xid;
DELETE FROM txhook_migrations WHERE version = 11;
