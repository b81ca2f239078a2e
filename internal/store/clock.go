package store

import (
	"context"
	"time"
)

// DBNow reads the database's clock: the one that times leases (see
// pgClaim). On SQLite that is this machine's wall clock, which the
// relay's configured clock may differ from.
func (s *Store) DBNow(ctx context.Context) (time.Time, error) {
	q := `SELECT clock_timestamp()`
	if s.Dialect == SQLite {
		q = `SELECT ` + sqliteNow
	}
	var t Time
	err := s.DB.QueryRowContext(ctx, q).Scan(&t)
	return t.Time, err
}
