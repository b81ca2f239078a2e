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
-- txhook_deliveries_endpoint_log (endpoint_id, created_at) INCLUDE
-- (ok_started_at) replaces both txhook_deliveries_endpoint_created
-- (endpoint_id, created_at, id), for an endpoint's deliveries newest first
-- (deliveries created in the same microsecond are put in ID order by a
-- sort of those few), and
-- txhook_deliveries_endpoint_ok (endpoint_id, ok_started_at): one entry
-- per delivery instead of two. A first attempt is kept in its delivery's
-- row only when it started within a second of the row's created_at (a
-- first attempt claimed with its event writes its row with created_at =
-- the attempt's start), so the endpoint's attempt log by start time is
-- found through created_at; a first success that waited longer (a delayed
-- event, a delivery given back to wait for its endpoint) is an attempt
-- row, as every later attempt is. For deliveries written before this
-- version the reads by start time are off by how long their first attempt
-- waited, usually milliseconds; they age out with retention. On a large,
-- busy outbox, create the new index first with CREATE INDEX CONCURRENTLY
-- (same name and definition).
--
-- txhook_events_dispatched (dispatched_at) indexed every dispatched
-- event, again one entry per event on the path every event takes, for
-- retention and Outbox.Recover. An event now goes with the last of its
-- deliveries (store.PruneFinished); events with no delivery are marked
-- unrouted (when dispatched with none, or when deleting their endpoint
-- left them with none) and the partial index txhook_events_unrouted holds
-- those only. Recover finds an endpoint's missed events through its
-- tenant's deliveries and the unrouted events, by time. The UPDATE below
-- marks the events dispatched so far that have no delivery and no dead
-- letter: on a large outbox it reads every dispatched event once.
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
CREATE INDEX IF NOT EXISTS txhook_deliveries_endpoint_log
    ON txhook_deliveries (endpoint_id, created_at) INCLUDE (ok_started_at);
DROP INDEX IF EXISTS txhook_deliveries_endpoint_created;
DROP INDEX IF EXISTS txhook_deliveries_endpoint_ok;
ALTER TABLE txhook_deliveries SET (fillfactor = 90);
ALTER TABLE txhook_events ADD COLUMN IF NOT EXISTS unrouted boolean;
UPDATE txhook_events e SET unrouted = true
WHERE e.dispatched_at IS NOT NULL
  AND NOT EXISTS (SELECT 1 FROM txhook_deliveries d WHERE d.event_id = e.id)
  AND NOT EXISTS (SELECT 1 FROM txhook_dead_letters dl WHERE dl.event_id = e.id);
CREATE INDEX IF NOT EXISTS txhook_events_unrouted ON txhook_events (dispatched_at) WHERE unrouted;
DROP INDEX IF EXISTS txhook_events_dispatched;

INSERT INTO txhook_migrations (version, name) VALUES (9, '009_event_leases');

-- +goose Down
CREATE INDEX IF NOT EXISTS txhook_events_dispatched ON txhook_events (dispatched_at)
    WHERE dispatched_at IS NOT NULL;
DROP INDEX IF EXISTS txhook_events_unrouted;
ALTER TABLE txhook_events DROP COLUMN IF EXISTS unrouted;
ALTER TABLE txhook_deliveries SET (fillfactor = 50);
CREATE INDEX IF NOT EXISTS txhook_deliveries_endpoint_created
    ON txhook_deliveries (endpoint_id, created_at, id);
CREATE INDEX IF NOT EXISTS txhook_deliveries_endpoint_ok
    ON txhook_deliveries (endpoint_id, ok_started_at)
    WHERE ok_started_at IS NOT NULL;
DROP INDEX IF EXISTS txhook_deliveries_endpoint_log;
CREATE INDEX IF NOT EXISTS txhook_deliveries_finished ON txhook_deliveries (updated_at)
    WHERE state IN ('succeeded', 'dead');
ALTER TABLE txhook_events
    DROP COLUMN IF EXISTS lease_owner,
    DROP COLUMN IF EXISTS lease_until;
DELETE FROM txhook_migrations WHERE version = 9;
