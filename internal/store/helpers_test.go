package store_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/txhook/txhook/internal/store"
	"github.com/txhook/txhook/internal/testdb"
)

// openStore returns a migrated Store on db.
func openStore(t testing.TB, db *testdb.DB) *store.Store {
	t.Helper()
	d := store.SQLite
	if db.Backend.Postgres() {
		d = store.Postgres
	}
	st := store.New(db.DB, d)
	if _, err := st.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

var seq atomic.Int64

// running inserts an event of tenant and its delivery, claimed by owner for
// attempt 1 (as a dispatch leaves it), and returns the delivery's ID. Plain
// SQL, so that the test does not depend on how claims are made.
func running(t testing.TB, st *store.Store, owner, tenant string, now time.Time) int64 {
	t.Helper()
	ctx := context.Background()
	ev := fmt.Sprintf("evt_%d_%d", time.Now().UnixNano(), seq.Add(1))
	if _, err := st.DB.ExecContext(ctx, st.Rebind(`INSERT INTO txhook_events (id, tenant, type, payload, created_at) VALUES (?, ?, 'payment.succeeded', '{}', ?)`),
		ev, tenant, st.T(now)); err != nil {
		t.Fatal(err)
	}
	var id int64
	err := st.DB.QueryRowContext(ctx, st.Rebind(`INSERT INTO txhook_deliveries (event_id, endpoint_id, state, attempts, next_attempt_at, lease_owner, created_at, updated_at)
VALUES (?, ?, 'running', 1, ?, ?, ?, ?) RETURNING id`), ev, "ep_"+tenant, st.T(now.Add(30*time.Second)), owner, st.T(now), st.T(now)).Scan(&id)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// checkClean fails t unless s is what CleanText promises: valid UTF-8, no
// control character but tab and newline, no bidi override, at most limit
// bytes.
func checkClean(t testing.TB, what, s string, limit int) {
	t.Helper()
	if !utf8.ValidString(s) {
		t.Errorf("%s: invalid UTF-8: %q", what, s)
	}
	if len(s) > limit {
		t.Errorf("%s: %d bytes, limit %d", what, len(s), limit)
	}
	for _, r := range s {
		switch {
		case r == '\t' || r == '\n':
		case r < 0x20, r == 0x7f, 0x80 <= r && r <= 0x9f, 0x202a <= r && r <= 0x202e, 0x2066 <= r && r <= 0x2069:
			t.Errorf("%s: holds %U: %q", what, r, s)
			return
		}
	}
	if strings.Contains(s, "\x00") {
		t.Errorf("%s: holds NUL", what)
	}
}
