-- txhook schema, version 7 (SQLite): audit log. Times are microseconds
-- since the epoch, as every time here. See the PostgreSQL file.

-- +goose Up
CREATE TABLE IF NOT EXISTS txhook_audit (
    id     INTEGER PRIMARY KEY AUTOINCREMENT,
    at     INTEGER NOT NULL,
    tenant TEXT    NOT NULL DEFAULT '',
    actor  TEXT    NOT NULL DEFAULT '',
    addr   TEXT    NOT NULL DEFAULT '',
    action TEXT    NOT NULL,
    target TEXT    NOT NULL DEFAULT '',
    detail TEXT    NOT NULL DEFAULT '{}'
);
CREATE INDEX IF NOT EXISTS txhook_audit_tenant ON txhook_audit (tenant, at);
CREATE INDEX IF NOT EXISTS txhook_audit_at ON txhook_audit (at);

INSERT INTO txhook_migrations (version, name) VALUES (7, '007_audit_log');

-- +goose Down
DROP TABLE IF EXISTS txhook_audit;
DELETE FROM txhook_migrations WHERE version = 7;
