-- txhook schema, version 3 (PostgreSQL): endpoint health derived from the
-- attempt log.
--
-- Each relay used to keep its own idea of which endpoints were healthy and
-- skipped recording successes it had seen recently, so a failure recorded
-- by another relay could leave failing_since set after later successes and
-- disable a healthy endpoint days later. Now every completion batch records,
-- per endpoint, the start of its latest successful and failed attempt; both
-- only move forward (GREATEST), so the order in which relays' batches land
-- does not matter, and failing_since is recomputed from them and from the
-- failed attempts on record.

-- +goose Up

-- Start of the endpoint's latest successful attempt (a 2xx), and of its
-- latest failed attempt; NULL when there was none. failing_since is set
-- exactly when last_failure_at is later than last_success_at (or there was
-- no success): it is the start of the first failed attempt after the last
-- success.
ALTER TABLE txhook_endpoints
    ADD COLUMN IF NOT EXISTS last_success_at timestamptz,
    ADD COLUMN IF NOT EXISTS last_failure_at timestamptz;

-- Backfill from the attempt log. An endpoint with no failed attempt on
-- record keeps its failing_since, if any, as its last failure: the attempts
-- may have been pruned. failing_since is then recomputed, which repairs the
-- ones the old bookkeeping left set after a success.
WITH h AS (
    SELECT ep.id, ep.failing_since AS old,
           (SELECT max(a.started_at) FROM txhook_attempts a
            WHERE a.endpoint_id = ep.id AND a.error = '') AS ok,
           COALESCE((SELECT max(a.started_at) FROM txhook_attempts a
                     WHERE a.endpoint_id = ep.id AND a.error <> ''), ep.failing_since) AS failed
    FROM txhook_endpoints ep
)
UPDATE txhook_endpoints ep
SET last_success_at = h.ok,
    last_failure_at = h.failed,
    failing_since = CASE
        WHEN h.failed IS NULL OR h.ok >= h.failed THEN NULL
        ELSE COALESCE(
            (SELECT min(a.started_at) FROM txhook_attempts a
             WHERE a.endpoint_id = h.id AND a.error <> '' AND (h.ok IS NULL OR a.started_at > h.ok)),
            CASE WHEN h.ok IS NULL OR h.old > h.ok THEN h.old END,
            h.failed)
    END
FROM h
WHERE ep.id = h.id;

-- The endpoints in a run of failures, for the relays' health sweep.
CREATE INDEX IF NOT EXISTS txhook_endpoints_failing
    ON txhook_endpoints (id) WHERE failing_since IS NOT NULL;

INSERT INTO txhook_migrations (version, name) VALUES (3, '003_endpoint_health');

-- +goose Down
-- failing_since keeps the values the backfill repaired: they are right for
-- version 2 too.
DROP INDEX IF EXISTS txhook_endpoints_failing;
ALTER TABLE txhook_endpoints
    DROP COLUMN IF EXISTS last_failure_at,
    DROP COLUMN IF EXISTS last_success_at;
DELETE FROM txhook_migrations WHERE version = 3;
