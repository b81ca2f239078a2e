-- txhook schema, version 5 (SQLite): per-endpoint transport settings. See
-- the PostgreSQL file of the same version.

-- +goose Up
ALTER TABLE txhook_endpoints ADD COLUMN headers TEXT NOT NULL DEFAULT '{}';
ALTER TABLE txhook_endpoints ADD COLUMN client_cert TEXT NOT NULL DEFAULT '';
ALTER TABLE txhook_endpoints ADD COLUMN client_key TEXT NOT NULL DEFAULT '';

INSERT INTO txhook_migrations (version, name) VALUES (5, '005_endpoint_transport');

-- +goose Down
ALTER TABLE txhook_endpoints DROP COLUMN client_key;
ALTER TABLE txhook_endpoints DROP COLUMN client_cert;
ALTER TABLE txhook_endpoints DROP COLUMN headers;
DELETE FROM txhook_migrations WHERE version = 5;
