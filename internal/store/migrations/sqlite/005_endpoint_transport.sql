-- txhook schema, version 5 (SQLite): per-endpoint transport settings. See
-- the PostgreSQL file of the same version.
--
-- Down (by hand; Migrate only goes up; DROP COLUMN needs SQLite 3.35):
--   ALTER TABLE txhook_endpoints DROP COLUMN headers;
--   ALTER TABLE txhook_endpoints DROP COLUMN client_cert;
--   ALTER TABLE txhook_endpoints DROP COLUMN client_key;
--   DELETE FROM txhook_migrations WHERE version = 5;

ALTER TABLE txhook_endpoints ADD COLUMN headers TEXT NOT NULL DEFAULT '{}';
ALTER TABLE txhook_endpoints ADD COLUMN client_cert TEXT NOT NULL DEFAULT '';
ALTER TABLE txhook_endpoints ADD COLUMN client_key TEXT NOT NULL DEFAULT '';
