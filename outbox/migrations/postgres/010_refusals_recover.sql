-- txhook schema, version 10 (PostgreSQL): a delivery that no relay will
-- send ends in the dead-letter table, and Recover reads only its own
-- tenant's unrouted events.
--
-- refused_since is when the relays' target rules started refusing the
-- delivery's endpoint URL (a relay hands such a delivery back without
-- spending an attempt), by the database's clock; NULL while it is not
-- refused. The completion that records a refusal sets it if it is NULL and
-- one that records an attempt clears it, so it survives relay restarts
-- and is the same for every relay. A refusal recorded once it is older
-- than the relay's RefusedLimit, while the endpoint had no attempt by any
-- relay in that time either, dead-letters the delivery instead (see
-- outbox.RelayConfig.RefusedLimit). A nullable column without a default:
-- adding it rewrites nothing, and no index reads it.
--
-- txhook_dead_letters.reason says why a delivery was dead-lettered:
-- 'failed' (its attempts ran out, or it failed in a way no retry mends:
-- every dead letter before this version) or 'refused' (the target rules
-- refused its endpoint for longer than RefusedLimit). A constant default:
-- adding it rewrites nothing either. The partial index
-- txhook_dead_letters_refused counts the refused ones per endpoint for the
-- metrics; it holds only them.
--
-- txhook_events_unrouted_tenant (tenant, dispatched_at) WHERE unrouted
-- replaces txhook_events_unrouted (dispatched_at) WHERE unrouted. Recover
-- finds the events an endpoint missed that no endpoint was sent through
-- that index; keyed by time alone, it made every recovery read every other
-- tenant's unrouted events of the window (a million rows of other tenants
-- made one Recover take seconds; see docs/BENCHMARKS.md). Retention, which
-- walked it by time, now walks it tenant by tenant
-- (store.PruneEvents). Only events dispatched to no endpoint have an entry
-- in either index, one each: a delivered event writes none. On a large,
-- busy outbox, create it first with CREATE INDEX CONCURRENTLY (same name
-- and definition), so that this migration does not hold a write lock
-- while it is built.

-- +goose Up
ALTER TABLE txhook_deliveries ADD COLUMN IF NOT EXISTS refused_since timestamptz;
ALTER TABLE txhook_dead_letters ADD COLUMN IF NOT EXISTS reason text NOT NULL DEFAULT 'failed';
CREATE INDEX IF NOT EXISTS txhook_events_unrouted_tenant ON txhook_events (tenant, dispatched_at) WHERE unrouted;
DROP INDEX IF EXISTS txhook_events_unrouted;
CREATE INDEX IF NOT EXISTS txhook_dead_letters_refused ON txhook_dead_letters (endpoint_id) WHERE reason = 'refused';

INSERT INTO txhook_migrations (version, name) VALUES (10, '010_refusals_recover');

-- +goose Down
DROP INDEX IF EXISTS txhook_dead_letters_refused;
CREATE INDEX IF NOT EXISTS txhook_events_unrouted ON txhook_events (dispatched_at) WHERE unrouted;
DROP INDEX IF EXISTS txhook_events_unrouted_tenant;
ALTER TABLE txhook_dead_letters DROP COLUMN IF EXISTS reason;
ALTER TABLE txhook_deliveries DROP COLUMN IF EXISTS refused_since;
DELETE FROM txhook_migrations WHERE version = 10;
