package store

import "context"

// RefusedLine is a keyed delivery just dead-lettered for refusal
// (Completion.Refused): its ID and its line, the endpoint and key.
type RefusedLine struct {
	ID              int64
	EndpointID, Key string
}

// CarryRefusal gives each line's next deliveries, those blocked behind
// the dead-lettered one and the one an unblocking may already have made
// pending (no attempt yet), its refused_since where they have none: the
// rules that refused it refuse them too, and each would otherwise wait a
// whole RefusedLimit of its own, one after the other, before the line
// reaches its end. A relay that sends one of them clears it, as any
// attempt does. It returns how many deliveries it changed.
func (s *Store) CarryRefusal(ctx context.Context, lines []RefusedLine) (int, error) {
	n := 0
	for _, l := range lines {
		res, err := s.DB.ExecContext(ctx, s.Rebind(`UPDATE txhook_deliveries
SET refused_since = (SELECT p.refused_since FROM txhook_deliveries p WHERE p.id = ?)
WHERE endpoint_id = ? AND ordering_key = ? AND refused_since IS NULL
  AND (state = 'blocked' OR (state = 'pending' AND attempts = 0))`), l.ID, l.EndpointID, l.Key)
		if err != nil {
			return n, err
		}
		c, _ := res.RowsAffected()
		n += int(c)
	}
	return n, nil
}
