package store_test

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/txhook/txhook/internal/store"
	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/retry"
)

// FuzzCompleteReceiverText writes what a receiver controls (the status,
// the Retry-After header, the body, the error text that quotes its
// certificate or redirect target) through Complete into real SQLite and,
// when configured, real PostgreSQL through both drivers (jsonb casts and
// all). Every input must be written (never refused, never a fallback), read
// back clean and equal to its cleaning, and leave the delivery in the state
// decided for it: retried when the hint says, or dead-lettered.
//
// The seed corpus runs in every `go test`; CI fuzzes it briefly with
//
//	go test -run '^$' -fuzz '^FuzzCompleteReceiverText$' -fuzztime 60s ./internal/store/
func FuzzCompleteReceiverText(f *testing.F) {
	f.Add(200, "", []byte(`{"ok":true}`), "", false)
	f.Add(0, "", []byte(nil), "TLS handshake failed: 127.0.0.1:443: tls: failed to verify certificate: x509: certificate is valid for \x00evil.example, not localhost", false)
	f.Add(503, "120", []byte("busy\x00\xff\xfe\r\n\x1b[2J"), "HTTP 503", false)
	f.Add(429, "Wed, 21 Oct 2099 07:28:00 GMT", []byte("slow down"), "HTTP 429", true)
	f.Add(302, "\x00\xff", []byte("<a href=\"\x01\">"), "redirect from https://a.example: lookup ev\xffil\u202e.example: no such host", false)
	f.Add(1<<40, "99999999999999999999999", []byte("\xc3"), "\xed\xa0\x80 surrogate \u0085 \u009b", true)
	f.Add(-7, "-1", []byte("\u2066\u2069"), string(make([]byte, 5000)), false)

	stores := fuzzStores(f)
	ctx := context.Background()
	f.Fuzz(func(t *testing.T, status int, retryAfter string, body []byte, errText string, last bool) {
		// The message the relay would make, with a header in it as
		// messages about rate limits do.
		msg := errText
		if retryAfter != "" {
			msg += " (Retry-After: " + retryAfter + ")"
		}
		for _, st := range stores {
			now := time.Now().UTC().Truncate(time.Microsecond)
			id := running(t, st, "relay-fuzz", "tenant", now)
			c := store.Completion{
				ID: id, Attempt: 1, Attempts: 1, Record: true, Status: status, Error: msg,
				Records: []store.AttemptRecord{{Attempt: 1, StartedAt: now, Duration: 3 * time.Millisecond,
					Status: status, Excerpt: string(body), Error: msg}},
			}
			state, next := store.StateDead, time.Time{}
			if !last {
				delay := 10 * time.Second
				if hint, ok := retry.ParseRetryAfter(retryAfter, now); ok {
					delay = retry.WithRetryAfter(delay, hint, time.Hour)
				}
				state, next = store.StatePending, now.Add(delay)
			}
			c.State, c.NextAt = state, next

			res, err := st.Complete(ctx, "relay-fuzz", now, []store.Completion{c})
			if err != nil {
				t.Fatalf("%s: Complete: %v", st.Dialect, err)
			}
			if len(res.Applied) != 1 || res.Applied[0] != id || len(res.Substituted) != 0 || len(res.Refused) != 0 {
				t.Fatalf("%s: result %+v, want the outcome itself written", st.Dialect, res)
			}

			wantErr, wantStatus := store.CleanError(msg), store.CleanStatus(status)
			d, err := st.Delivery(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			checkClean(t, "last_error", d.LastError, store.MaxErrorBytes)
			if d.State != state || d.Attempts != 1 || d.LastStatus != wantStatus || d.LastError != wantErr {
				t.Fatalf("%s: delivery %+v, want state %s status %d error %q", st.Dialect, d, state, wantStatus, wantErr)
			}
			if !last && !d.NextAttemptAt.Equal(next) {
				t.Fatalf("%s: next attempt %v, want %v", st.Dialect, d.NextAttemptAt, next)
			}
			atts, err := st.Attempts(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			if len(atts) != 1 {
				t.Fatalf("%s: %d attempt rows", st.Dialect, len(atts))
			}
			a := atts[0]
			checkClean(t, "attempt error", a.Error, store.MaxErrorBytes)
			checkClean(t, "response excerpt", a.Excerpt, store.MaxExcerptBytes)
			if a.Error != wantErr || a.Excerpt != store.CleanExcerpt(string(body)) || a.Status != wantStatus {
				t.Fatalf("%s: attempt %+v", st.Dialect, a)
			}
			dead, err := st.ListDead(ctx, store.DeadFilter{IDs: []int64{id}}, nil, 2)
			if err != nil {
				t.Fatal(err)
			}
			if last != (len(dead) == 1) || len(dead) > 1 {
				t.Fatalf("%s: dead letters %+v, dead-lettered %v", st.Dialect, dead, last)
			}
			if last {
				checkClean(t, "dead letter error", dead[0].LastError, store.MaxErrorBytes)
				if dead[0].LastError != wantErr || dead[0].LastStatus != wantStatus {
					t.Fatalf("%s: dead letter %+v", st.Dialect, dead[0])
				}
			}
		}
	})
}

// fuzzStores opens SQLite, and PostgreSQL through lib/pq and pgx when a
// DSN is configured (required in CI), each migrated.
func fuzzStores(f *testing.F) []*store.Store {
	stores := []*store.Store{openStore(f, testdb.SQLite(f))}
	if os.Getenv(testdb.EnvDSN) != "" || os.Getenv(testdb.EnvRequire) == "1" {
		stores = append(stores, openStore(f, testdb.Postgres(f, "postgres")), openStore(f, testdb.Postgres(f, "pgx")))
	}
	return stores
}

// FuzzCompleteFreshReceiverText is FuzzCompleteReceiverText for first
// attempts claimed with their events (PostgreSQL), whose outcomes travel
// as array literals (pgCompleteFresh): a success keeps the receiver's body
// in its row, a failure its error and status. Quotes, backslashes, braces,
// commas, "NULL" and bytes PostgreSQL would refuse must all be written as
// cleaned, never refused and never a fallback.
//
//	go test -run '^$' -fuzz '^FuzzCompleteFreshReceiverText$' -fuzztime 60s ./internal/store/
func FuzzCompleteFreshReceiverText(f *testing.F) {
	f.Add(200, []byte(`{"ok":true}`), "")
	f.Add(500, []byte(`NULL`), `NULL`)
	f.Add(503, []byte("a\"b\\c{d},e\x00\xff"), "HTTP 503: \"quoted\" \\ {x,y}")
	f.Add(0, []byte("\u202e\r\n\t"), string(make([]byte, 5000)))
	f.Add(-1, []byte(""), "\"")
	var stores []*store.Store
	for _, st := range fuzzStores(f) {
		if st.Dialect == store.Postgres {
			stores = append(stores, st)
		}
	}
	ctx := context.Background()
	var n int
	f.Fuzz(func(t *testing.T, status int, body []byte, errText string) {
		for _, st := range stores {
			n++
			now := time.Now().UTC().Truncate(time.Microsecond)
			tenant := "fuzz_" + strconv.Itoa(n)
			ep := store.EndpointRow{ID: "ep_" + tenant, Tenant: tenant, URL: "https://example.com/hook", EventTypes: []byte(`[]`),
				Secrets: []byte(`[]`), Versions: []byte(`{}`), Enabled: true, CreatedAt: now, UpdatedAt: now}
			if err := st.InsertEndpoint(ctx, st.DB, ep); err != nil {
				t.Fatal(err)
			}
			for _, id := range []string{"evt_ok_" + tenant, "evt_fail_" + tenant} {
				if _, err := st.DB.ExecContext(ctx, `INSERT INTO txhook_events (id, tenant, type, payload, created_at) VALUES ($1, $2, 'payment.succeeded', '{}', $3)`,
					id, tenant, now); err != nil {
					t.Fatal(err)
				}
			}
			cs, err := st.Dispatch(ctx, "relay-fuzz", now, time.Minute, 10)
			if err != nil || len(cs) != 2 {
				t.Fatalf("dispatch: %d claimed, %v", len(cs), err)
			}
			var batch []store.Completion
			for _, c := range cs {
				x := c.Completion(now, true)
				rec := store.AttemptRecord{Attempt: 1, StartedAt: now, Duration: time.Millisecond, Status: status, Excerpt: string(body)}
				if strings.HasPrefix(c.EventID, "evt_ok_") {
					x.State, x.Attempts, x.Record, x.Status = store.StateSucceeded, 1, true, 200
					rec.Status = 200
				} else {
					x.State, x.Attempts, x.NextAt, x.Record, x.Status, x.Error = store.StatePending, 1, now.Add(time.Minute), true, status, errText
					rec.Error = errText
				}
				x.Records = []store.AttemptRecord{rec}
				batch = append(batch, x)
			}
			res, err := st.Complete(ctx, "relay-fuzz", now, batch)
			if err != nil {
				t.Fatalf("Complete: %v", err)
			}
			if len(res.Written) != 2 || len(res.Substituted) != 0 || len(res.Refused) != 0 {
				t.Fatalf("result %+v, want both outcomes themselves written", res)
			}
			var excerpt, lastError string
			var lastStatus *int
			if err := st.DB.QueryRowContext(ctx, `SELECT COALESCE(ok_excerpt, '') FROM txhook_deliveries WHERE event_id = $1`, "evt_ok_"+tenant).Scan(&excerpt); err != nil {
				t.Fatal(err)
			}
			if want := store.CleanExcerpt(string(body)); excerpt != want {
				t.Fatalf("kept excerpt %q, want %q", excerpt, want)
			}
			if err := st.DB.QueryRowContext(ctx, `SELECT last_error, last_status FROM txhook_deliveries WHERE event_id = $1`, "evt_fail_"+tenant).Scan(&lastError, &lastStatus); err != nil {
				t.Fatal(err)
			}
			checkClean(t, "last_error", lastError, store.MaxErrorBytes)
			if want := store.CleanError(errText); lastError != want {
				t.Fatalf("last_error %q, want %q", lastError, want)
			}
			if want := store.CleanStatus(status); (want == 0) != (lastStatus == nil) || lastStatus != nil && *lastStatus != want {
				t.Fatalf("last_status %v, want %d", lastStatus, want)
			}
		}
	})
}
