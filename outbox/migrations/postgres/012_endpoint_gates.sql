-- txhook schema, version 12 (PostgreSQL): limits and circuit breakers that
-- hold for an endpoint across every relay sharing the database.
--
-- txhook_endpoint_gates has one row per endpoint a relay has gated
-- (created by the first relay that needs it): the rate limit's token
-- bucket (tokens at refilled_at, refilled at the endpoint's rate up to its
-- burst), and the shared circuit breaker (receiver faults in a row,
-- open_until while open, the cooldown that doubles with each failed
-- probe, and probe_until while one relay's probe of a half-open circuit
-- is under way). blocked_until is when the endpoint may take a request
-- again, as the last relay to ask found it (circuit open, no token, no
-- in-flight room); a claim skips deliveries of endpoints blocked at its
-- now, so that they are not claimed and handed back over and over.
--
-- txhook_gate_slots holds each relay's share of an endpoint's in-flight
-- cap: slots requests under way, leased until expires_at (renewed by each
-- request the relay starts, longer than any request may run). A relay
-- that dies leaves its row, which stops counting once it expires.
--
-- Every change to either table takes the endpoint's gate row lock first
-- (store/gate.go), so that relays see each other's slots. The rows are
-- small and few (one per endpoint with limits or with failures, one per
-- such endpoint and relay); nothing else reads them.

-- +goose Up
CREATE TABLE IF NOT EXISTS txhook_endpoint_gates (
    endpoint_id   text             PRIMARY KEY,
    tokens        double precision NOT NULL DEFAULT 0,
    refilled_at   timestamptz,
    failures      integer          NOT NULL DEFAULT 0,
    cooldown_us   bigint           NOT NULL DEFAULT 0,
    open_until    timestamptz,
    probe_until   timestamptz,
    blocked_until timestamptz
);

CREATE TABLE IF NOT EXISTS txhook_gate_slots (
    endpoint_id text        NOT NULL,
    relay       text        NOT NULL,
    slots       integer     NOT NULL,
    expires_at  timestamptz NOT NULL,
    PRIMARY KEY (endpoint_id, relay)
);

INSERT INTO txhook_migrations (version, name) VALUES (12, '012_endpoint_gates');

-- +goose Down
DROP TABLE IF EXISTS txhook_gate_slots;
DROP TABLE IF EXISTS txhook_endpoint_gates;
DELETE FROM txhook_migrations WHERE version = 12;
