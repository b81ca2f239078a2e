-- txhook schema, version 3 (SQLite): endpoint health derived from the
-- attempt log. See the PostgreSQL file of the same version for the why.

-- +goose Up

-- Start of the endpoint's latest successful attempt (a 2xx), and of its
-- latest failed attempt; NULL when there was none. failing_since is set
-- exactly when last_failure_at is later than last_success_at (or there was
-- no success): it is the start of the first failed attempt after the last
-- success.
ALTER TABLE txhook_endpoints ADD COLUMN last_success_at INTEGER;
ALTER TABLE txhook_endpoints ADD COLUMN last_failure_at INTEGER;

-- Backfill from the attempt log. An endpoint with no failed attempt on
-- record keeps its failing_since, if any, as its last failure: the attempts
-- may have been pruned. failing_since is then recomputed, which repairs the
-- ones the old bookkeeping left set after a success.
UPDATE txhook_endpoints SET
    last_success_at = (SELECT max(a.started_at) FROM txhook_attempts a
                       WHERE a.endpoint_id = txhook_endpoints.id AND a.error = ''),
    last_failure_at = COALESCE((SELECT max(a.started_at) FROM txhook_attempts a
                                WHERE a.endpoint_id = txhook_endpoints.id AND a.error <> ''), failing_since);

UPDATE txhook_endpoints SET failing_since = CASE
    WHEN last_failure_at IS NULL OR last_success_at >= last_failure_at THEN NULL
    ELSE COALESCE(
        (SELECT min(a.started_at) FROM txhook_attempts a
         WHERE a.endpoint_id = txhook_endpoints.id AND a.error <> ''
           AND (txhook_endpoints.last_success_at IS NULL OR a.started_at > txhook_endpoints.last_success_at)),
        CASE WHEN last_success_at IS NULL OR failing_since > last_success_at THEN failing_since END,
        last_failure_at)
END;

-- The endpoints in a run of failures, for the relays' health sweep.
CREATE INDEX IF NOT EXISTS txhook_endpoints_failing
    ON txhook_endpoints (id) WHERE failing_since IS NOT NULL;

INSERT INTO txhook_migrations (version, name) VALUES (3, '003_endpoint_health');

-- +goose Down
-- failing_since keeps the values the backfill repaired: they are right for
-- version 2 too.
DROP INDEX IF EXISTS txhook_endpoints_failing;
ALTER TABLE txhook_endpoints DROP COLUMN last_failure_at;
ALTER TABLE txhook_endpoints DROP COLUMN last_success_at;
DELETE FROM txhook_migrations WHERE version = 3;
