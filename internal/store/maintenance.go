package store

import (
	"context"
	"encoding/json"
	"time"
)

// textIn renders "col IN (…)" over a JSON array of strings.
func (s *Store) textIn(col string) string {
	if s.Dialect == Postgres {
		return col + ` IN (SELECT jsonb_array_elements_text(?::jsonb))`
	}
	return col + ` IN (SELECT value FROM json_each(?))`
}

func jsonStrings(v []string) string {
	if v == nil {
		v = []string{}
	}
	b, _ := json.Marshal(v)
	return string(b)
}

// EndpointStreak is an endpoint and the start of its run of failures.
type EndpointStreak struct {
	ID           string
	Tenant       string
	FailingSince time.Time
}

// TrackEndpoints records attempt outcomes on endpoints: a success ends an
// endpoint's run of failures (those endpoints are returned as recovered), a
// failure starts one if none is running. Endpoints in failed (and not in ok)
// whose run started at or before disableBefore are returned as expired;
// a zero disableBefore returns none.
func (s *Store) TrackEndpoints(ctx context.Context, now time.Time, failed, ok []string, disableBefore time.Time) (recovered, expired []EndpointStreak, err error) {
	okSet := make(map[string]bool, len(ok))
	for _, id := range ok {
		okSet[id] = true
	}
	var stillFailing []string
	for _, id := range failed {
		if !okSet[id] {
			stillFailing = append(stillFailing, id)
		}
	}
	err = s.Tx(ctx, func(q Querier) error {
		recovered, expired = nil, nil
		if len(ok) > 0 {
			var err error
			recovered, err = s.streaks(ctx, q, s.textIn("id")+" AND failing_since IS NOT NULL", jsonStrings(ok))
			if err != nil {
				return err
			}
			if len(recovered) > 0 {
				ids := make([]string, len(recovered))
				for i, r := range recovered {
					ids[i] = r.ID
				}
				if _, err := q.ExecContext(ctx, s.Rebind(`UPDATE txhook_endpoints SET failing_since = NULL WHERE `+s.textIn("id")), jsonStrings(ids)); err != nil {
					return err
				}
			}
		}
		if len(stillFailing) == 0 {
			return nil
		}
		if _, err := q.ExecContext(ctx, s.Rebind(`UPDATE txhook_endpoints SET failing_since = ? WHERE `+s.textIn("id")+` AND failing_since IS NULL`),
			s.T(now), jsonStrings(stillFailing)); err != nil {
			return err
		}
		if disableBefore.IsZero() {
			return nil
		}
		var err error
		expired, err = s.streaks(ctx, q, s.textIn("id")+" AND enabled AND failing_since <= ?", jsonStrings(stillFailing), s.T(disableBefore))
		return err
	})
	return recovered, expired, err
}

func (s *Store) streaks(ctx context.Context, q Querier, where string, args ...any) ([]EndpointStreak, error) {
	rows, err := q.QueryContext(ctx, s.Rebind(`SELECT id, tenant, failing_since FROM txhook_endpoints WHERE `+where), args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []EndpointStreak
	for rows.Next() {
		var e EndpointStreak
		var t Time
		if err := rows.Scan(&e.ID, &e.Tenant, &t); err != nil {
			return nil, err
		}
		e.FailingSince = t.Time
		out = append(out, e)
	}
	return out, rows.Err()
}

// PruneFinished deletes up to limit finished deliveries last updated before
// `before`, with their attempts: succeeded ones, and dead ones whose dead
// letter is gone (purged or replayed). It returns how many deliveries and
// attempts it deleted.
func (s *Store) PruneFinished(ctx context.Context, before time.Time, limit int) (deliveries, attempts int, err error) {
	err = s.Tx(ctx, func(q Querier) error {
		lock := ""
		if s.Dialect == Postgres {
			lock = " FOR UPDATE SKIP LOCKED"
		}
		rows, err := q.QueryContext(ctx, s.Rebind(`SELECT id FROM txhook_deliveries d
WHERE state IN ('succeeded', 'dead') AND updated_at < ?
  AND (state = 'succeeded' OR NOT EXISTS (SELECT 1 FROM txhook_dead_letters dl WHERE dl.delivery_id = d.id))
ORDER BY updated_at LIMIT ?`+lock), s.T(before), limit)
		if err != nil {
			return err
		}
		ids, err := scanIDs(rows)
		if err != nil || len(ids) == 0 {
			return err
		}
		res, err := q.ExecContext(ctx, s.Rebind(`DELETE FROM txhook_attempts WHERE `+s.idsIn("delivery_id")), jsonIDs(ids))
		if err != nil {
			return err
		}
		n, _ := res.RowsAffected()
		attempts = int(n)
		res, err = q.ExecContext(ctx, s.Rebind(`DELETE FROM txhook_deliveries WHERE `+s.idsIn("id")), jsonIDs(ids))
		if err != nil {
			return err
		}
		n, _ = res.RowsAffected()
		deliveries = int(n)
		return nil
	})
	return deliveries, attempts, err
}

// PruneDeadLetters deletes up to limit dead letters that failed before
// `before`; PruneFinished then removes their deliveries.
func (s *Store) PruneDeadLetters(ctx context.Context, before time.Time, limit int) (int, error) {
	return s.PurgeDead(ctx, DeadFilter{Until: before}, limit)
}

// PruneEvents deletes up to limit events dispatched before `before` that
// no delivery or dead letter refers to any more.
func (s *Store) PruneEvents(ctx context.Context, before time.Time, limit int) (int, error) {
	res, err := s.DB.ExecContext(ctx, s.Rebind(`DELETE FROM txhook_events WHERE id IN (
    SELECT e.id FROM txhook_events e
    WHERE e.dispatched_at IS NOT NULL AND e.dispatched_at < ?
      AND NOT EXISTS (SELECT 1 FROM txhook_deliveries d WHERE d.event_id = e.id)
      AND NOT EXISTS (SELECT 1 FROM txhook_dead_letters dl WHERE dl.event_id = e.id)
    ORDER BY e.dispatched_at LIMIT ?)`), s.T(before), limit)
	if err != nil {
		return 0, err
	}
	n, err := res.RowsAffected()
	return int(n), err
}
