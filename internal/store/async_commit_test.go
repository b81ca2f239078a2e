package store_test

import (
	"testing"
	"time"

	"github.com/txhook/txhook/internal/store"
	"github.com/txhook/txhook/internal/testdb"
)

// The relay's statements (dispatch and claim, outcomes, endpoint health)
// commit with synchronous_commit off for their own transaction, unless
// SyncRelayCommits; no other transaction on the connection is affected.
// Triggers record the setting each statement's writes ran under, which is
// the setting its commit uses.
func TestRelayStatementsCommitAsynchronously(t *testing.T) {
	testdb.EachPostgres(t, func(t *testing.T, db *testdb.DB) {
		for _, sync := range []bool{false, true} {
			b := setupFresh(t, db, "m", 1)
			b.st.SyncRelayCommits = sync
			db.DB.SetMaxOpenConns(1) // one connection: a leak would show on the next statement
			if _, err := b.st.DB.ExecContext(b.ctx, `
CREATE TABLE commit_seen (what text, setting text);
CREATE FUNCTION commit_seen() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO commit_seen VALUES (TG_TABLE_NAME || ' ' || TG_OP, current_setting('synchronous_commit'));
    RETURN NULL;
END $$;
CREATE TRIGGER commit_seen AFTER INSERT OR UPDATE ON txhook_events FOR EACH ROW EXECUTE FUNCTION commit_seen();
CREATE TRIGGER commit_seen AFTER INSERT OR UPDATE ON txhook_deliveries FOR EACH ROW EXECUTE FUNCTION commit_seen();
CREATE TRIGGER commit_seen AFTER UPDATE ON txhook_endpoints FOR EACH ROW EXECUTE FUNCTION commit_seen();`); err != nil {
				t.Fatal(err)
			}
			b.event("evt_1", "m")
			cs := b.dispatch("relay-a", time.Minute)
			if len(cs) != 1 {
				t.Fatalf("claimed %d, want 1", len(cs))
			}
			c := b.succeeded(cs[0], true)
			c.State, c.Attempts, c.NextAt = store.StatePending, 1, b.now.Add(-time.Second) // a retry, due now
			c.Status, c.Error = 500, "HTTP 500"
			c.Records[0].Status, c.Records[0].Error, c.Records[0].Excerpt = 500, "HTTP 500", ""
			if res := b.complete("relay-a", c); len(res.Written) != 1 {
				t.Fatalf("completion wrote %v", res.Written)
			}
			again, err := b.st.Claim(b.ctx, "relay-a", b.now, time.Minute, 10)
			if err != nil || len(again) != 1 {
				t.Fatalf("retry claim: %d, %v", len(again), err)
			}
			r := again[0].Completion(b.now, true)
			r.State, r.Attempts, r.Record, r.Status = store.StateSucceeded, 2, true, 200
			r.Records = []store.AttemptRecord{{Attempt: 2, StartedAt: b.now, Duration: time.Millisecond, Status: 200}}
			if res := b.complete("relay-a", r); len(res.Written) != 1 {
				t.Fatalf("retry's completion wrote %v", res.Written)
			}
			if _, err := b.st.RecordAttemptTimes(b.ctx, []store.AttemptTimes{{EndpointID: "ep_m_0", Success: b.now}}); err != nil {
				t.Fatal(err)
			}
			// Enqueue's insert (the plain INSERT of b.event) keeps the
			// server's setting, and so does the next statement on the
			// connection after each relay statement.
			b.event("evt_2", "m")
			want := map[bool]string{false: "off", true: "on"}[sync]
			seen := map[string]bool{}
			rows, err := b.st.DB.QueryContext(b.ctx, `SELECT what, setting FROM commit_seen`)
			if err != nil {
				t.Fatal(err)
			}
			inserts := 0
			for rows.Next() {
				var what, setting string
				if err := rows.Scan(&what, &setting); err != nil {
					t.Fatal(err)
				}
				seen[what] = true
				if what == "txhook_events INSERT" {
					inserts++
					if setting != "on" {
						t.Errorf("SyncRelayCommits %v: an event's insert ran with synchronous_commit %s", sync, setting)
					}
					continue
				}
				if setting != want {
					t.Errorf("SyncRelayCommits %v: %s ran with synchronous_commit %s, want %s", sync, what, setting, want)
				}
			}
			if err := rows.Err(); err != nil {
				t.Fatal(err)
			}
			rows.Close()
			for _, w := range []string{"txhook_events UPDATE", "txhook_deliveries INSERT", "txhook_deliveries UPDATE", "txhook_endpoints UPDATE"} {
				if !seen[w] {
					t.Errorf("SyncRelayCommits %v: no %s seen (%v)", sync, w, seen)
				}
			}
			if inserts != 2 {
				t.Errorf("%d event inserts seen, want 2", inserts)
			}
			var now string
			if err := b.st.DB.QueryRowContext(b.ctx, `SHOW synchronous_commit`).Scan(&now); err != nil || now != "on" {
				t.Errorf("after the relay's statements the connection has synchronous_commit %q (%v), want on", now, err)
			}
			if _, err := b.st.DB.ExecContext(b.ctx, `DROP TABLE commit_seen; DROP FUNCTION commit_seen() CASCADE;
TRUNCATE txhook_events, txhook_deliveries, txhook_attempts, txhook_endpoints`); err != nil {
				t.Fatal(err)
			}
		}
	})
}
