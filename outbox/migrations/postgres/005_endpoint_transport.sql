-- txhook schema, version 5 (PostgreSQL): per-endpoint transport settings.
--
-- Headers the merchant asked for on every request, as a JSON object of
-- name to value (names that would spoof txhook's own are refused when the
-- endpoint is written).
-- The TLS client certificate presented to the endpoint (mTLS): PEM chain,
-- leaf first, and its PEM private key, '' for none. The key has a column of
-- its own so that it can be encrypted at rest apart from the rest.

-- +goose Up
ALTER TABLE txhook_endpoints
    ADD COLUMN IF NOT EXISTS headers     jsonb NOT NULL DEFAULT '{}',
    ADD COLUMN IF NOT EXISTS client_cert text  NOT NULL DEFAULT '',
    ADD COLUMN IF NOT EXISTS client_key  text  NOT NULL DEFAULT '';

INSERT INTO txhook_migrations (version, name) VALUES (5, '005_endpoint_transport');

-- +goose Down
ALTER TABLE txhook_endpoints
    DROP COLUMN IF EXISTS headers,
    DROP COLUMN IF EXISTS client_cert,
    DROP COLUMN IF EXISTS client_key;
DELETE FROM txhook_migrations WHERE version = 5;
