-- txhook schema, version 9 (PostgreSQL): a new event's first attempts are
-- leased on the event's row, and each delivery row is written once.
--
-- Until version 8 a relay dispatched an event by marking it dispatched and
-- inserting a 'running' delivery row per endpoint, which the completion
-- then updated to its outcome: two writes of the row, and the update could
-- not be HOT (it changes indexed columns), so every index took two
-- entries. Now the claim leases the event itself (lease_owner, lease_until:
-- columns no index reads, so the update is HOT and writes no index entry),
-- and the completion inserts the delivery with its outcome and marks the
-- event dispatched with its last delivery. A relay that dies leaves the
-- lease to expire; the next relay to claim the event writes only the
-- deliveries that are missing. Measured by examples/bench (one endpoint,
-- first attempts succeed): see docs/BENCHMARKS.md.
--
-- Both columns are NULL for every event not leased now; adding nullable
-- columns without a default rewrites nothing.
--
-- Going down: stop every relay first (Relay.Stop writes back or releases
-- what it holds, which ends its leases). An event still leased when the
-- columns go is dispatched again by the relays of version 8, to every
-- endpoint, including those that already have its delivery: sent twice,
-- never lost.

-- txhook_deliveries_finished (updated_at) WHERE state IN ('succeeded',
-- 'dead') indexed every finished delivery for retention alone, one entry
-- (about 80 bytes of WAL, and its CPU) per delivery. Retention now walks
-- the deliveries by ID (IDs follow creation, and a delivery finishes
-- after it is created; see store.PruneFinished), reading what it keeps
-- once per walk.
--
-- Fill factor 90 on txhook_deliveries (was 50 since version 8): a
-- delivery is written once, with its outcome, and updated only when its
-- first attempt failed; half-empty pages were room for an update every row
-- used to get.
--
-- +goose Up
ALTER TABLE txhook_events
    ADD COLUMN IF NOT EXISTS lease_owner text,
    ADD COLUMN IF NOT EXISTS lease_until timestamptz;
DROP INDEX IF EXISTS txhook_deliveries_finished;
ALTER TABLE txhook_deliveries SET (fillfactor = 90);

INSERT INTO txhook_migrations (version, name) VALUES (9, '009_event_leases');

-- +goose Down
ALTER TABLE txhook_deliveries SET (fillfactor = 50);
CREATE INDEX IF NOT EXISTS txhook_deliveries_finished ON txhook_deliveries (updated_at)
    WHERE state IN ('succeeded', 'dead');
ALTER TABLE txhook_events
    DROP COLUMN IF EXISTS lease_owner,
    DROP COLUMN IF EXISTS lease_until;
DELETE FROM txhook_migrations WHERE version = 9;
