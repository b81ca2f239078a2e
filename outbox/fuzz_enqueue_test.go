package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/outbox"
)

// fuzzDB is one database FuzzEnqueueFields writes to.
type fuzzDB struct {
	db *testdb.DB
	ob *outbox.Outbox
}

// FuzzEnqueueFields feeds arbitrary bytes into every field of an Event,
// inside a caller's transaction that has already written a row of its own,
// on SQLite and, when TXHOOK_TEST_POSTGRES_DSN is set, on PostgreSQL through
// both drivers. Enqueue either refuses the event with one of its sentinel
// errors, writing nothing and leaving the transaction usable (SELECT 1 and
// COMMIT succeed, the caller's row is kept), or stores it so that it reads
// back byte for byte. A raw database error fails the target: on PostgreSQL
// it would have aborted the caller's business transaction.
//
// CI runs the seed corpus with go test, and can fuzz briefly with
//
//	go test -run '^$' -fuzz '^FuzzEnqueueFields$' -fuzztime 60s ./outbox/
func FuzzEnqueueFields(f *testing.F) {
	deep := func(n int) []byte { return []byte(strings.Repeat("[", n) + strings.Repeat("]", n)) }
	type seed struct {
		id, tenant, typ string
		payload         []byte
		key             string
		version         int64
		okey            string
	}
	for _, s := range []seed{
		{"", "merchant_1", "payment.succeeded", []byte(`{"amount":100}`), "", 0, ""},
		{"evt_1", "merchant_1", "payment.succeeded", []byte(`{"amount":100}`), "pay_1", 1, "pay_1"},
		{"evt_1", "merchant_2", "payment.succeeded", []byte(`{"amount":100}`), "pay_1", 1, "pay_1"}, // another tenant's ID
		{"", "merchant_1", "payment.succeeded", []byte(`{"amount":101}`), "pay_1", 1, "pay_1"},      // key reused
		{"", "merchant_1", "payment.succeeded", []byte(`{"amount":100}`), "pay_1", 1, "pay_1"},      // key replayed
		{"", "m", "a", []byte("{\"a\":\"\xff\"}"), "", 0, ""},
		{"", "m", "a", []byte("\"\xed\xa0\x80\""), "", 0, ""},
		{"", "m", "a", []byte("\"\xc0\xaf\""), "", 0, ""},
		{"", "m", "a", []byte(`"\u0000"`), "", 0, ""},
		{"", "m", "a", []byte(`"\ud800"`), "", 0, ""},
		{"", "m", "a", []byte(`"\udfff\ud800"`), "", 0, ""},
		{"", "m", "a", []byte(`"\ud83d\ude00"`), "", 0, ""},
		{"", "m", "a", []byte(`"\\u0000"`), "", 0, ""},
		{"", "m", "a", []byte("\ufeff[]"), "", 0, ""},
		{"", "m", "a", []byte("[1]\x00"), "", 0, ""},
		{"", "m", "a", []byte("\"a\x00b\""), "", 0, ""},
		{"", "m", "a", []byte(`1e999999999`), "", 0, ""},
		{"", "m", "a", []byte(`-123456789012345678901234567890.5e-99999`), "", 0, ""},
		{"", "m", "a", deep(64), "", 0, ""},
		{"", "m", "a", deep(65), "", 0, ""},
		{"", "m", "a", deep(20000), "", 0, ""},
		{"", "m", "a", []byte(" \t\r\n{} \n"), "", 0, ""},
		{"", "m", "a", []byte(`{"a":1,"a":2}`), "", 0, ""},
		{"", "m", "a", []byte{}, "", 0, ""},
		{"", "m", "a", []byte(`{}`), "", 1 << 40, ""},
		{"", "m", "a", []byte(`{}`), "", 2147483647, ""},
		{"", "m", "a", []byte(`{}`), "", 2147483648, ""},
		{"", "m", "a", []byte(`{}`), "", -1, ""},
		{"evt_\xff", "m", "a", []byte(`{}`), "", 0, ""},
		{"evt\x00", "m", "a", []byte(`{}`), "", 0, ""},
		{"", "m\xff", "a", []byte(`{}`), "", 0, ""},
		{"", "m\x00", "a", []byte(`{}`), "", 0, ""},
		{"", "é 😀", "a", []byte(`{}`), "", 0, ""},
		{"", strings.Repeat("é", 128), "a", []byte(`{}`), "", 0, ""},
		{"", "m", "a.\xff", []byte(`{}`), "", 0, ""},
		{"", "m", "a", []byte(`{}`), "k\xc3", 0, ""},
		{"", "m", "a", []byte(`{}`), "k\x00", 0, ""},
		{"", "m", "a", []byte(`{}`), "ключ", 0, "\x80"},
		{"", "m", "a", []byte(`{}`), "", 0, "o\u2028k"},
		{"", "m", "a", []byte(`{}`), "", 0, "o\u0085k"},
	} {
		f.Add(s.id, s.tenant, s.typ, s.payload, s.key, s.version, s.okey)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 24*time.Hour)
	f.Cleanup(cancel)
	dbs := []fuzzDB{openFuzzDB(ctx, f, testdb.SQLite(f))}
	if os.Getenv(testdb.EnvDSN) != "" || os.Getenv(testdb.EnvRequire) == "1" {
		dbs = append(dbs, openFuzzDB(ctx, f, testdb.Postgres(f, "postgres")), openFuzzDB(ctx, f, testdb.Postgres(f, "pgx")))
	}

	f.Fuzz(func(t *testing.T, id, tenant, typ string, payload []byte, key string, version int64, okey string) {
		ev := outbox.Event{ID: id, Tenant: tenant, Type: typ, Payload: payload, IdempotencyKey: key, Version: int(version), OrderingKey: okey}
		for _, d := range dbs {
			d.check(ctx, t, ev)
		}
	})
}

func openFuzzDB(ctx context.Context, f *testing.F, db *testdb.DB) fuzzDB {
	ob, err := outbox.New(ctx, db.DB, outbox.Config{Logger: quietLogger()})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { ob.Close() })
	if err := ob.Migrate(ctx); err != nil {
		f.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE fuzz_business (n INTEGER NOT NULL)`); err != nil {
		f.Fatal(err)
	}
	return fuzzDB{db: db, ob: ob}
}

func (d fuzzDB) q(query string) string {
	if !d.db.Backend.Postgres() {
		return query
	}
	return strings.ReplaceAll(query, "?", "$1")
}

func (d fuzzDB) count(ctx context.Context, t *testing.T, query string) int {
	t.Helper()
	var n int
	if err := d.db.QueryRowContext(ctx, query).Scan(&n); err != nil {
		t.Fatalf("%s: %s: %v", d.db.Backend.Name, query, err)
	}
	return n
}

func (d fuzzDB) check(ctx context.Context, t *testing.T, ev outbox.Event) {
	t.Helper()
	name := d.db.Backend.Name
	events := d.count(ctx, t, "SELECT count(*) FROM txhook_events")
	business := d.count(ctx, t, "SELECT count(*) FROM fuzz_business")

	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, "INSERT INTO fuzz_business (n) VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	r, err := d.ob.EnqueueDetail(ctx, tx, ev)
	if err != nil {
		known := false
		for _, s := range []error{outbox.ErrInvalidEvent, outbox.ErrInvalidPayload, outbox.ErrPayloadTooLarge,
			outbox.ErrEventConflict, outbox.ErrIdempotencyConflict} {
			known = known || errors.Is(err, s)
		}
		if !known {
			t.Fatalf("%s: %#v: error matches no sentinel: %v", name, ev, err)
		}
		if r != (outbox.Enqueued{}) {
			t.Fatalf("%s: error %v with result %+v", name, err, r)
		}
	}
	var one int
	if serr := tx.QueryRowContext(ctx, "SELECT 1").Scan(&one); serr != nil {
		t.Fatalf("%s: %#v: transaction unusable after Enqueue (%v): %v", name, ev, err, serr)
	}

	if err == nil {
		var got outbox.Event
		var payload []byte
		var key, okey sql.NullString
		if err := tx.QueryRowContext(ctx, d.q(`SELECT id, tenant, type, payload, idempotency_key, version, ordering_key
FROM txhook_events WHERE id = ?`), r.ID).Scan(&got.ID, &got.Tenant, &got.Type, &payload, &key, &got.Version, &okey); err != nil {
			t.Fatalf("%s: reading back %s: %v", name, r.ID, err)
		}
		got.Payload, got.IdempotencyKey, got.OrderingKey = payload, key.String, okey.String
		want := ev
		if want.ID == "" {
			want.ID = r.ID
		}
		if want.Version == 0 {
			want.Version = 1
		}
		if got.ID != want.ID || got.Tenant != want.Tenant || got.Type != want.Type || string(got.Payload) != string(want.Payload) ||
			got.IdempotencyKey != want.IdempotencyKey || got.Version != want.Version || got.OrderingKey != want.OrderingKey {
			t.Fatalf("%s: stored %#v, enqueued %#v (duplicate %v)", name, got, want, r.Duplicate)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatalf("%s: commit: %v", name, err)
	}

	wantEvents := events
	if err == nil && !r.Duplicate {
		wantEvents++
	}
	if n := d.count(ctx, t, "SELECT count(*) FROM txhook_events"); n != wantEvents {
		t.Fatalf("%s: %d events after Enqueue (err %v, duplicate %v), want %d", name, n, err, r.Duplicate, wantEvents)
	}
	if n := d.count(ctx, t, "SELECT count(*) FROM fuzz_business"); n != business+1 {
		t.Fatalf("%s: the caller's row was lost", name)
	}
}
