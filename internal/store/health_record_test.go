package store_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/txhook/txhook/internal/store"
	"github.com/txhook/txhook/internal/testdb"
)

func dialect(db *testdb.DB) store.Dialect {
	if db.Backend.Postgres() {
		return store.Postgres
	}
	return store.SQLite
}

// rebind puts q's placeholders in db's dialect.
func rebind(db *testdb.DB, q string) string { return store.New(db.DB, dialect(db)).Rebind(q) }

func newEndpoint(t *testing.T, ctx context.Context, s *store.Store, id string, failingSince time.Time) {
	t.Helper()
	now := time.Now()
	if err := s.InsertEndpoint(ctx, s.DB, store.EndpointRow{ID: id, Tenant: "m", URL: "https://example.com/" + id,
		EventTypes: []byte(`[]`), Secrets: []byte(`[]`), Enabled: true, CreatedAt: now, UpdatedAt: now}); err != nil {
		t.Fatal(err)
	}
	if !failingSince.IsZero() {
		if _, err := s.DB.ExecContext(ctx, s.Rebind(`UPDATE txhook_endpoints SET failing_since = ? WHERE id = ?`), s.T(failingSince), id); err != nil {
			t.Fatal(err)
		}
	}
}

// Migration 003 derives the new columns from the attempt log, and repairs
// a failing_since that the old bookkeeping left set after a success.
func TestMigration003BackfillsEndpointHealth(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		ctx := context.Background()
		s := store.New(db.DB, dialect(db))
		ms, err := store.Migrations(s.Dialect)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := db.ExecContext(ctx, `CREATE TABLE txhook_migrations (version integer PRIMARY KEY, name text NOT NULL, applied_at text)`); err != nil {
			t.Fatal(err)
		}
		for _, m := range ms[:2] {
			if _, err := db.ExecContext(ctx, m.SQL); err != nil {
				t.Fatal(err)
			}
			if _, err := db.ExecContext(ctx, rebind(db, `INSERT INTO txhook_migrations (version, name) VALUES (?, ?)`), m.Version, m.Name); err != nil {
				t.Fatal(err)
			}
		}
		// Endpoints as version 2 left them, without the new columns.
		t0 := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
		at := func(m int) time.Time { return t0.Add(time.Duration(m) * time.Minute) }
		insert := func(id string, failingSince time.Time) {
			var fs any
			if !failingSince.IsZero() {
				fs = s.T(failingSince)
			}
			if _, err := db.ExecContext(ctx, rebind(db, `INSERT INTO txhook_endpoints (id, tenant, url, secrets, failing_since, created_at, updated_at)
VALUES (?, 'm', 'https://example.com', '[]', ?, ?, ?)`), id, fs, s.T(t0), s.T(t0)); err != nil {
				t.Fatal(err)
			}
		}
		attempt := func(ep string, m int, failed bool) {
			msg := ""
			if failed {
				msg = "HTTP 500"
			}
			if _, err := db.ExecContext(ctx, rebind(db, `INSERT INTO txhook_attempts (delivery_id, endpoint_id, attempt, started_at, duration_us, error)
VALUES (1, ?, 1, ?, 1, ?)`), ep, s.T(at(m)), msg); err != nil {
				t.Fatal(err)
			}
		}
		insert("stale", at(1)) // failed, then succeeded: not failing
		attempt("stale", 1, true)
		attempt("stale", 2, false)
		insert("failing", at(3)) // succeeded, then failed twice
		attempt("failing", 1, false)
		attempt("failing", 2, true)
		attempt("failing", 4, true)
		insert("pruned", at(5)) // failing, its attempts pruned
		insert("quiet", time.Time{})

		applied, err := s.Migrate(ctx)
		if err != nil || len(applied) == 0 || applied[0] != 3 { // and any later ones
			t.Fatalf("Migrate applied %v, %v", applied, err)
		}
		for _, c := range []struct {
			id          string
			fs, ok, bad time.Time
		}{
			{"stale", time.Time{}, at(2), at(1)},
			{"failing", at(2), at(1), at(4)},
			{"pruned", at(5), time.Time{}, at(5)},
			{"quiet", time.Time{}, time.Time{}, time.Time{}},
		} {
			e, err := s.GetEndpoint(ctx, db.DB, c.id)
			if err != nil {
				t.Fatal(err)
			}
			if !e.FailingSince.Equal(c.fs) || !e.LastSuccessAt.Equal(c.ok) || !e.LastFailureAt.Equal(c.bad) {
				t.Errorf("%s: failing since %v, last success %v, last failure %v; want %v %v %v",
					c.id, e.FailingSince, e.LastSuccessAt, e.LastFailureAt, c.fs, c.ok, c.bad)
			}
		}
	})
}

// Batches recorded concurrently, listing the same endpoints in different
// orders, neither deadlock nor fail, and leave the latest times whatever
// order they land in.
func TestRecordAttemptTimesConcurrently(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		ctx := context.Background()
		s := store.New(db.DB, dialect(db))
		if _, err := s.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		var ids []string
		for i := range 10 {
			ids = append(ids, fmt.Sprintf("ep_%02d", i))
			newEndpoint(t, ctx, s, ids[i], time.Time{})
		}
		t0 := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
		const workers, rounds = 6, 100
		var mu sync.Mutex
		last := map[string][2]time.Time{} // the latest success and failure fed, per endpoint
		var errs []error
		var wg sync.WaitGroup
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(w), 3))
				for range rounds {
					var batch []store.AttemptTimes
					for _, k := range rng.Perm(len(ids)) {
						a := store.AttemptTimes{EndpointID: ids[k]}
						tm := t0.Add(time.Duration(rng.IntN(1_000_000)) * time.Microsecond)
						if rng.IntN(2) == 0 {
							a.Success = tm
						} else {
							a.Failure = tm
						}
						batch = append(batch, a)
					}
					_, err := s.RecordAttemptTimes(ctx, batch)
					mu.Lock()
					if err != nil {
						errs = append(errs, err)
					}
					for _, a := range batch {
						l := last[a.EndpointID]
						if a.Success.After(l[0]) {
							l[0] = a.Success
						}
						if a.Failure.After(l[1]) {
							l[1] = a.Failure
						}
						last[a.EndpointID] = l
					}
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		for _, err := range errs {
			t.Errorf("recording failed: %v", err)
			if len(errs) > 3 {
				break
			}
		}
		for _, id := range ids {
			e, err := s.GetEndpoint(ctx, db.DB, id)
			if err != nil {
				t.Fatal(err)
			}
			l := last[id]
			if !e.LastSuccessAt.Equal(l[0]) || !e.LastFailureAt.Equal(l[1]) {
				t.Errorf("%s: last success %v, failure %v; want %v, %v", id, e.LastSuccessAt, e.LastFailureAt, l[0], l[1])
			}
			if failing := l[1].After(l[0]); failing == e.FailingSince.IsZero() {
				t.Errorf("%s: failing since %v with last success %v, failure %v", id, e.FailingSince, l[0], l[1])
			}
		}
	})
}
