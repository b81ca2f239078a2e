package store_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/txhook/txhook/internal/store"
	"github.com/txhook/txhook/internal/testdb"
)

func TestRebindQualifiesTablesInTheSchema(t *testing.T) {
	s := store.New(nil, store.Postgres)
	plain := `SELECT id FROM txhook_events WHERE id = ?`
	if got := s.Rebind(plain); got != `SELECT id FROM txhook_events WHERE id = $1` {
		t.Fatalf("no schema: %s", got)
	}
	if err := s.SetSchema("webhooks"); err != nil {
		t.Fatal(err)
	}
	for in, want := range map[string]string{
		plain: `SELECT id FROM "webhooks".txhook_events WHERE id = $1`,
		`SELECT e.id FROM txhook_events e JOIN txhook_endpoints ep ON ep.tenant = e.tenant WHERE txhook_endpoints.id = $1`: `SELECT e.id FROM "webhooks".txhook_events e JOIN "webhooks".txhook_endpoints ep ON ep.tenant = e.tenant WHERE "webhooks".txhook_endpoints.id = $1`,
		// A channel name is a string, not a table.
		`WITH ev AS (INSERT INTO txhook_events (id) VALUES ($1) RETURNING 1) SELECT pg_notify('txhook_wake', '') FROM ev`: `WITH ev AS (INSERT INTO "webhooks".txhook_events (id) VALUES ($1) RETURNING 1) SELECT pg_notify('txhook_wake', '') FROM ev`,
		// A new index takes its table's schema and cannot be qualified; an
		// existing one is found through its schema.
		"CREATE UNIQUE INDEX IF NOT EXISTS txhook_events_idem ON txhook_events (tenant)": `CREATE UNIQUE INDEX IF NOT EXISTS txhook_events_idem ON "webhooks".txhook_events (tenant)`,
		"create index concurrently\n  txhook_x on txhook_attempts (id)":                  "create index concurrently\n  txhook_x on \"webhooks\".txhook_attempts (id)",
		"DROP INDEX IF EXISTS txhook_x":                                                  `DROP INDEX IF EXISTS "webhooks".txhook_x`,
		// Comments pass through, apostrophes in them included.
		"-- the event's txhook_events row\nSELECT 1 FROM txhook_events WHERE a = 'txhook_x'": "-- the event's txhook_events row\nSELECT 1 FROM \"webhooks\".txhook_events WHERE a = 'txhook_x'",
		// Names that only contain txhook_ are not txhook's.
		`SELECT my_txhook_events, "txhook_events" FROM other.txhook_events`: `SELECT my_txhook_events, "txhook_events" FROM other.txhook_events`,
	} {
		got := s.Rebind(in)
		if got != want {
			t.Errorf("Rebind(%q)\n got %q\nwant %q", in, got, want)
		}
		if again := s.Rebind(got); again != got {
			t.Errorf("Rebind is not idempotent: %q", again)
		}
	}
}

func TestSetSchemaRefusesBadNames(t *testing.T) {
	for _, name := range []string{"", "Webhooks", "web-hooks", `x"; DROP TABLE y; --`, "pg_catalog", "1abc", strings.Repeat("a", 64), "ü"} {
		err := store.New(nil, store.Postgres).SetSchema(name)
		if !errors.Is(err, store.ErrInvalidSchema) {
			t.Errorf("SetSchema(%q) = %v, want ErrInvalidSchema", name, err)
		}
	}
	if err := store.New(nil, store.SQLite).SetSchema("webhooks"); !errors.Is(err, store.ErrInvalidSchema) || !strings.Contains(err.Error(), "PostgreSQL") {
		t.Errorf("SetSchema on SQLite = %v", err)
	}
	for _, name := range []string{"webhooks", "_x", "a1_b2", strings.Repeat("a", 63)} {
		if err := store.New(nil, store.Postgres).SetSchema(name); err != nil {
			t.Errorf("SetSchema(%q) = %v", name, err)
		}
	}
}

// Each migration's down section undoes exactly its up section: after up
// then down, the schema is what it was before; then everything comes off
// and goes back on.
func TestMigrationsDownUndoesUp(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		ctx := context.Background()
		s := store.New(db.DB, dialect(db))
		ms, err := store.Migrations(s.Dialect)
		if err != nil {
			t.Fatal(err)
		}
		exec := func(what, sql string) {
			t.Helper()
			if _, err := db.ExecContext(ctx, sql); err != nil {
				t.Fatalf("%s: %v", what, err)
			}
		}
		for _, m := range ms {
			before := db.SchemaDump(t)
			exec(m.Name+" up", m.Up)
			after := db.SchemaDump(t)
			if after == before {
				t.Fatalf("%s up changed nothing", m.Name)
			}
			exec(m.Name+" down", m.Down)
			if got := db.SchemaDump(t); got != before {
				t.Fatalf("%s down left a different schema:\n%s\n--- want ---\n%s", m.Name, got, before)
			}
			exec(m.Name+" up again", m.Up)
			if got := db.SchemaDump(t); got != after {
				t.Fatalf("%s up after down differs:\n%s\n--- want ---\n%s", m.Name, got, after)
			}
		}
		if err := s.CheckSchema(ctx); err != nil {
			t.Fatal(err)
		}
		full := db.SchemaDump(t)
		for i := len(ms) - 1; i >= 0; i-- {
			exec(ms[i].Name+" down", ms[i].Down)
		}
		if got := db.SchemaDump(t); got != "" {
			t.Fatalf("left after every down:\n%s", got)
		}
		if _, err := s.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		if got := db.SchemaDump(t); got != full {
			t.Fatalf("Migrate after every down differs:\n%s\n--- want ---\n%s", got, full)
		}
	})
}

// With a schema set, every statement of every Store method finds txhook's
// tables there: the pool's search_path points at an empty schema, where an
// unqualified statement would fail. The test fails when an exported method
// is added without a call here.
func TestSchemaEveryStatementQualified(t *testing.T) {
	for _, b := range testdb.Backends {
		if !b.Postgres() {
			continue
		}
		for _, partitioned := range []bool{false, true} {
			name := b.Name
			if partitioned {
				name += "-partitioned"
			}
			t.Run(name, func(t *testing.T) { schemaEveryStatementQualified(t, b, partitioned) })
		}
	}
}

func schemaEveryStatementQualified(t *testing.T, b testdb.Backend, partitioned bool) {
	t.Parallel()
	db := testdb.Open(t, b)
	ctx := context.Background()
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	schema := "txhook_custom_" + hex.EncodeToString(rnd[:])
	t.Cleanup(func() { _, _ = db.Exec(`DROP SCHEMA IF EXISTS "` + schema + `" CASCADE`) })
	s := store.New(db.DB, store.Postgres)
	if err := s.SetSchema(schema); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.CheckSchema(ctx); !errors.Is(err, store.ErrNotMigrated) || !strings.Contains(err.Error(), schema) {
		t.Fatalf("CheckSchema before Migrate: %v", err)
	}
	if _, err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Prepare(ctx, append(append(s.EnqueueQueries(false), s.ClaimQueries(10)...), s.CompleteQueries()...)...); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	ep := store.EndpointRow{ID: "ep_1", Tenant: "m", URL: "https://example.com/a", EventTypes: []byte(`[]`),
		Secrets: []byte(`[{"secret":"whsec_x","expires_at":null}]`), Versions: []byte(`{}`), Enabled: true, CreatedAt: now, UpdatedAt: now}
	ev := store.NewEvent{ID: "evt_1", Tenant: "m", Type: "payment.succeeded", Payload: `{}`, CreatedAt: now}
	keyed := store.NewEvent{ID: "evt_2", Tenant: "m", Type: "payment.succeeded", Payload: `{}`, OrderingKey: "k", CreatedAt: now}
	var claimed []store.Claimed
	calls := map[string]func() error{
		"CheckSchema": func() error { return s.CheckSchema(ctx) },
		// Names no table; the test's DSN has the drivers' default
		// settings, which it refuses.
		"CheckPooler": func() error {
			if err := s.CheckPooler(ctx); !errors.Is(err, store.ErrPoolerUnsafe) {
				return fmt.Errorf("want ErrPoolerUnsafe, got %v", err)
			}
			return nil
		},
		"Migrate": func() error { _, err := s.Migrate(ctx); return err },
		"Partition": func() error {
			if !partitioned {
				return nil
			}
			return s.Partition(ctx, 24*time.Hour, 2, now)
		},
		"Partitioning": func() error {
			pts, err := s.Partitioning(ctx)
			if err == nil && (len(pts) == 3) != partitioned {
				err = fmt.Errorf("Partitioning: %d tables", len(pts))
			}
			return err
		},
		"EnsurePartitions": func() error { _, err := s.EnsurePartitions(ctx, now.Add(48*time.Hour)); return err },
		"Partitions": func() error {
			ps, err := s.Partitions(ctx)
			if err == nil && partitioned && len(ps) != 3*5 {
				err = fmt.Errorf("Partitions: %d", len(ps))
			}
			return err
		},
		"DropPartitions": func() error {
			// Everything is old by then: the rows retention keeps
			// move to DEFAULT, the rest go with the partitions.
			d, err := s.DropPartitions(ctx, now.Add(30*24*time.Hour), 100, time.Minute)
			if err == nil && partitioned && (len(d.Dropped) != 3*5 || d.Moved == 0) {
				err = fmt.Errorf("DropPartitions: %+v", d)
			}
			return err
		},
		"InsertEndpoint": func() error { return s.InsertEndpoint(ctx, db.DB, ep) },
		"UpdateEndpoint": func() error { return s.UpdateEndpoint(ctx, db.DB, ep) },
		"GetEndpoint":    func() error { _, err := s.GetEndpoint(ctx, db.DB, ep.ID); return err },
		"ListEndpoints": func() error {
			_, err := s.ListEndpoints(ctx, "m", false)
			if err == nil {
				_, err = s.ListEndpoints(ctx, "", true)
			}
			return err
		},
		"ListEndpointsPage": func() error {
			_, err := s.ListEndpointsPage(ctx, "m", &store.EndpointCursor{Tenant: "m", ID: "a"}, 10)
			return err
		},
		"ModifySecrets": func() error {
			return s.ModifySecrets(ctx, ep.ID, now, func(cur []byte) ([]byte, error) { return cur, nil })
		},
		"InsertEvent": func() error {
			for _, e := range []store.NewEvent{ev, keyed} {
				for _, notify := range []bool{false, true} {
					if _, _, err := s.InsertEvent(ctx, s.SQLConn(db.DB), e, notify); err != nil {
						return err
					}
				}
			}
			return nil
		},
		"InsertEvents": func() error {
			batch := []store.NewEvent{{ID: "evt_b1", Tenant: "m", Type: "payment.succeeded", Payload: `{}`, CreatedAt: now, DeliverAt: now.Add(time.Hour)},
				{ID: "evt_b2", Tenant: "m", Type: "payment.succeeded", Payload: `{}`, CreatedAt: now, TraceParent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}}
			_, _, err := s.InsertEvents(ctx, s.SQLConn(db.DB), batch, true)
			return err
		},
		"DeleteEvents":      func() error { return s.DeleteEvents(ctx, s.SQLConn(db.DB), []string{"evt_b1", "evt_b2"}) },
		"ConflictingEvents": func() error { _, err := s.ConflictingEvents(ctx, s.SQLConn(db.DB), ev); return err },
		"Dispatch": func() error {
			c, err := s.Dispatch(ctx, "relay", now, time.Minute, 10)
			claimed = append(claimed, c...)
			return err
		},
		"DispatchKeyed": func() error {
			c, err := s.DispatchKeyed(ctx, "relay", now, time.Minute, 10)
			claimed = append(claimed, c...)
			return err
		},
		"Claim":        func() error { _, err := s.Claim(ctx, "relay", now, time.Minute, 10); return err },
		"BlockedLines": func() error { _, err := s.BlockedLines(ctx, 10); return err },
		"Unblock": func() error {
			_, err := s.Unblock(ctx, now, []store.OrderedPair{{Tenant: "m", EndpointID: ep.ID, Key: "k"}})
			return err
		},
		"DBNow": func() error { _, err := s.DBNow(ctx); return err },
		"Complete": func() error {
			if len(claimed) != 2 {
				return errors.New("dispatch claimed " + strings.Repeat("x", len(claimed)))
			}
			var cs []store.Completion
			for _, c := range claimed {
				x := c.Completion(now, true)
				x.State, x.Attempts, x.Record, x.Status, x.Error = store.StateDead, 1, true, 500, "HTTP 500"
				x.Records = []store.AttemptRecord{{Attempt: 1, StartedAt: now, Duration: time.Millisecond, Status: 500, Error: "HTTP 500"}}
				cs = append(cs, x)
			}
			res, err := s.Complete(ctx, "relay", now, cs)
			if err == nil && len(res.Applied) != 2 {
				err = errors.New("completions not applied")
			}
			for k, id := range res.Written {
				claimed[k].ID = id // a first attempt claimed with its event has a row now
			}
			return err
		},
		"Attempts":             func() error { _, err := s.Attempts(ctx, claimed[0].ID); return err },
		"AttemptsOfDeliveries": func() error { _, err := s.AttemptsOfDeliveries(ctx, []int64{claimed[0].ID}); return err },
		"Delivery":             func() error { _, err := s.Delivery(ctx, claimed[0].ID); return err },
		"DeliveriesOfEvent":    func() error { _, err := s.DeliveriesOfEvent(ctx, ev.ID); return err },
		"DeliveriesOfEndpoint": func() error { _, err := s.DeliveriesOfEndpoint(ctx, ep.ID, &store.DeliveryCursor{}, 10); return err },
		"EndpointHealth": func() error {
			_, err := s.EndpointHealth(ctx, ep.ID, now.Add(-time.Hour), now.Add(time.Hour))
			return err
		},
		"Backlog":          func() error { _, err := s.Backlog(ctx); return err },
		"Undispatched":     func() error { _, err := s.Undispatched(ctx); return err },
		"SecretsPage":      func() error { _, err := s.SecretsPage(ctx, "", 10); return err },
		"SecretKeySamples": func() error { _, err := s.SecretKeySamples(ctx); return err },
		"RewriteSecrets": func() error {
			_, err := s.RewriteSecrets(ctx, []string{ep.ID}, func(store.EndpointSecrets) (store.EndpointSecrets, error) { return store.EndpointSecrets{}, nil })
			return err
		},
		"DeadLettersByEndpoint":        func() error { _, err := s.DeadLettersByEndpoint(ctx); return err },
		"RefusedDeadLettersByEndpoint": func() error { _, err := s.RefusedDeadLettersByEndpoint(ctx); return err },
		"CarryRefusal": func() error {
			_, err := s.CarryRefusal(ctx, []store.RefusedLine{{ID: 1, EndpointID: ep.ID, Key: "k"}})
			return err
		},
		"ListDead": func() error {
			_, err := s.ListDead(ctx, store.DeadFilter{Tenant: "m", EndpointID: ep.ID, EventType: "payment.succeeded"}, &store.DeadCursor{FailedAt: now.Add(time.Hour), DeliveryID: 1 << 40}, 10)
			return err
		},
		"CountDead":    func() error { _, err := s.CountDead(ctx, store.DeadFilter{Since: now.Add(-time.Hour)}); return err },
		"EventPayload": func() error { _, _, _, err := s.EventPayload(ctx, ev.ID); return err },
		"DeadIDs":      func() error { _, err := s.DeadIDs(ctx, store.DeadFilter{}, 0, 10); return err },
		"ReplayDead":   func() error { _, err := s.ReplayDead(ctx, []int64{claimed[0].ID}, now); return err },
		"PurgeDead": func() error {
			_, err := s.PurgeDead(ctx, store.DeadFilter{IDs: []int64{claimed[1].ID}}, 10)
			return err
		},
		"RecordAttemptTimes": func() error {
			_, err := s.RecordAttemptTimes(ctx, []store.AttemptTimes{{EndpointID: ep.ID, Failure: now}})
			return err
		},
		"RepairHealth": func() error { _, err := s.RepairHealth(ctx, []string{ep.ID}, 10); return err },
		"EndpointIDs":  func() error { _, err := s.EndpointIDs(ctx, true, "", 10); return err },
		"DisableFailing": func() error {
			_, _, err := s.DisableFailing(ctx, ep.ID, 0, now.Add(time.Hour), func(time.Time) string { return "failing" })
			return err
		},
		"DisableGone":        func() error { _, _, err := s.DisableGone(ctx, ep.ID, now, now, "gone"); return err },
		"SetEndpointEnabled": func() error { return s.SetEndpointEnabled(ctx, ep.ID, true, "", now) },
		"RecoverNext": func() error {
			_, _, err := s.RecoverNext(ctx, ep.ID, now.Add(-time.Hour))
			return err
		},
		"RecoverCandidates": func() error {
			_, _, err := s.RecoverCandidates(ctx, ep.ID, now.Add(-time.Hour), now.Add(-time.Hour), now.Add(time.Hour), 10)
			return err
		},
		"Recover": func() error {
			_, err := s.Recover(ctx, ep.ID, []store.RecoverEvent{{ID: ev.ID, CreatedAt: now}}, now)
			return err
		},
		"PruneFinished": func() error {
			_, _, _, err := s.PruneFinished(ctx, now.Add(time.Hour), 10, &store.PruneCursor{})
			return err
		},
		"PruneDeadLetters": func() error { _, err := s.PruneDeadLetters(ctx, now.Add(time.Hour), 10); return err },
		"PruneEvents":      func() error { _, err := s.PruneEvents(ctx, now.Add(time.Hour), 10, &store.EventsWalk{}); return err },
		"TenantEndpoint":   func() error { _, err := s.TenantEndpoint(ctx, db.DB, "m", ep.ID); return err },
		"TenantDelivery":   func() error { _, err := s.TenantDelivery(ctx, "m", claimed[0].ID); return err },
		"TenantEvent":      func() error { _, err := s.TenantEvent(ctx, "m", ev.ID); return err },
		"TenantDeliveries": func() error {
			_, err := s.TenantDeliveries(ctx, "m", store.DeliveryFilter{EndpointID: ep.ID, EventID: ev.ID, EventType: ev.Type, State: "dead",
				Since: now.Add(-time.Hour), Until: now.Add(time.Hour)}, &store.DeliveryCursor{CreatedAt: now.Add(time.Hour), ID: 1 << 40}, 10)
			return err
		},
		"EachAttemptOf": func() error {
			return s.EachAttemptOf(ctx, ep.ID, now.Add(-time.Hour), now.Add(time.Hour), func(time.Time, time.Duration, int) {})
		},
		"ExportTenant": func() error {
			return s.ExportTenant(ctx, "m", store.ExportFilter{Since: now.Add(-time.Hour), Until: now.Add(time.Hour), EndpointID: ep.ID, EventType: ev.Type},
				func(store.ExportRow) error { return nil })
		},
		"Resend": func() error {
			a := store.AuditRow{At: now, Tenant: "m", Action: "delivery.resend"}
			_, err := s.Resend(ctx, "m", claimed[1].ID, now, &a)
			if err == nil {
				_, err = s.Resend(ctx, "m", claimed[0].ID, now, &a)
			}
			return err
		},
		"InsertTargeted": func() error {
			a := store.AuditRow{At: now, Tenant: "m", Action: "endpoint.send_test"}
			_, err := s.InsertTargeted(ctx, store.NewEvent{ID: "txtest_1", Tenant: "m", Type: "t", Payload: `{}`, Version: 1, CreatedAt: now}, ep.ID, &a)
			return err
		},
		"InsertAudit": func() error {
			return s.InsertAudit(ctx, db.DB, store.AuditRow{At: now, Tenant: "m", Action: "x", Detail: []byte(`{"a":1}`)})
		},
		"ListAudit": func() error {
			_, err := s.ListAudit(ctx, store.AuditFilter{Tenant: "m", Action: "x", Since: now.Add(-time.Hour), Until: now.Add(time.Hour)}, &store.AuditCursor{At: now.Add(time.Hour), ID: 1 << 40}, 10)
			return err
		},
		"PruneAudit": func() error { _, err := s.PruneAudit(ctx, now.Add(time.Hour), 10); return err },
		// Broker mode.
		"ForwardLease": func() error {
			_, held, err := s.ForwardLease(ctx, "S", "fwd", time.Minute)
			if err == nil && !held {
				err = errors.New("lease not taken")
			}
			return err
		},
		"CurrentSnapshot": func() error { _, err := s.CurrentSnapshot(ctx); return err },
		"ForwardFirst": func() error {
			_, _, err := s.ForwardFirst(ctx, store.Snapshot{Xmin: 1, Xmax: 2, Xip: []uint64{1}}, 10)
			return err
		},
		"ForwardPage": func() error {
			to, err := s.CurrentSnapshot(ctx)
			if err != nil {
				return err
			}
			from := store.Snapshot{Xmin: 1, Xmax: 2, Xip: []uint64{1}}
			for _, running := range []bool{true, false} {
				if _, err := s.ForwardPage(ctx, from, to, running, "0", "", 10); err != nil {
					return err
				}
			}
			return nil
		},
		"ForwardSave": func() error {
			held, err := s.ForwardSave(ctx, "S", "fwd", store.Snapshot{Xmin: 5, Xmax: 6}, time.Minute)
			if err == nil && !held {
				err = errors.New("cursor not saved")
			}
			return err
		},
		"ForwardRelease": func() error { return s.ForwardRelease(ctx, "S", "fwd") },
		"PendingOrdered": func() error { _, err := s.PendingOrdered(ctx); return err },
		"ClaimUnforwarded": func() error {
			f := store.NewEvent{ID: "evt_f1", Tenant: "m", Type: "payment.succeeded", Payload: `{}`, CreatedAt: now}
			if _, _, err := s.InsertEvent(ctx, s.SQLConn(db.DB), f, false); err != nil {
				return err
			}
			evs, err := s.ClaimUnforwarded(ctx, "fwd", time.Minute, 10)
			if err == nil && len(evs) != 1 {
				err = fmt.Errorf("ClaimUnforwarded: %d events", len(evs))
			}
			return err
		},
		"MarkForwarded": func() error { return s.MarkForwarded(ctx, "fwd", now, []string{"evt_f1"}, []string{"evt_f1"}) },
		"MarkUnrouted":  func() error { return s.MarkUnrouted(ctx, []string{"evt_f1"}) },
		"Subscriptions": func() error { _, err := s.Subscriptions(ctx, []string{"m"}); return err },
		"CopyEvents": func() error {
			return s.CopyEvents(ctx, now, []store.ForwardEvent{{ID: "evt_c1", Tenant: "m", Type: "t", Version: 1, Payload: []byte(`{}`), CreatedAt: now}}, nil)
		},
		"EndpointsByID": func() error { _, err := s.EndpointsByID(ctx, []string{ep.ID}); return err },
		"BrokerComplete": func() error {
			c := store.Completion{EventID: "evt_c1", EndpointID: ep.ID, Attempt: 1, State: store.StatePending, Attempts: 1, Record: true,
				Status: 500, Error: "HTTP 500", NextAt: now.Add(time.Hour), CreatedAt: now,
				Records: []store.AttemptRecord{{Attempt: 1, StartedAt: now, Status: 500, Error: "HTTP 500"}}}
			res, err := s.BrokerComplete(ctx, store.BrokerOwner("S"), now, []store.Completion{c})
			if err == nil && len(res.Written) != 1 {
				err = errors.New("broker completion not written")
			}
			return err
		},
		"BrokerRows": func() error {
			_, _, err := s.BrokerRows(ctx, []int64{1}, [][2]string{{"evt_c1", ep.ID}})
			return err
		},
		"ClaimDueRows": func() error {
			_, err := s.ClaimDueRows(ctx, store.BrokerOwner("S"), time.Minute, now.Add(2*time.Hour), 10)
			return err
		},
		"PruneForwarded": func() error {
			at, err := s.CurrentSnapshot(ctx)
			if err == nil {
				_, _, err = s.PruneForwarded(ctx, at, now.Add(time.Hour), 10)
			}
			return err
		},
		"BrokerKey": func() error {
			_, err := s.BrokerKey(ctx, "S", now, nil, nil)
			return err
		},
		"GateAcquire": func() error {
			_, err := s.GateAcquire(ctx, store.GateAsk{Endpoint: ep.ID, Relay: "S", Now: now, Rate: 1, MaxInFlight: 1, SlotLease: time.Minute, Threshold: 1})
			return err
		},
		"GateFinish": func() error {
			_, err := s.GateFinish(ctx, store.GateFinish{Endpoint: ep.ID, Relay: "S", Now: now, Slot: true, Fault: true, Threshold: 1, Cooldown: time.Second, MaxCooldown: time.Minute})
			return err
		},
		"GateSlots":      func() error { _, err := s.GateSlots(ctx, ep.ID, now); return err },
		"GatePeek":       func() error { _, _, err := s.GatePeek(ctx, ep.ID); return err },
		"GateBlock":      func() error { return s.GateBlock(ctx, ep.ID, now) },
		"DeleteEndpoint": func() error { return s.DeleteEndpoint(ctx, ep.ID) },
	}
	order := []string{"CheckSchema", "CheckPooler", "Migrate", "Partition", "Partitioning", "InsertEndpoint", "UpdateEndpoint", "GetEndpoint", "ListEndpoints", "ListEndpointsPage",
		"ModifySecrets", "InsertEvent", "InsertEvents", "DeleteEvents", "ConflictingEvents", "Dispatch", "DispatchKeyed", "Claim", "BlockedLines", "Unblock", "DBNow",
		"Complete", "Attempts", "AttemptsOfDeliveries", "Delivery", "DeliveriesOfEvent", "DeliveriesOfEndpoint", "EndpointHealth",
		"Backlog", "Undispatched", "SecretsPage", "SecretKeySamples", "RewriteSecrets", "DeadLettersByEndpoint", "RefusedDeadLettersByEndpoint", "ListDead", "CountDead", "EventPayload", "DeadIDs", "ReplayDead", "PurgeDead",
		"RecordAttemptTimes", "CarryRefusal", "RepairHealth", "EndpointIDs", "DisableFailing", "DisableGone", "SetEndpointEnabled",
		"RecoverNext", "RecoverCandidates", "Recover", "TenantEndpoint", "TenantDelivery", "TenantEvent", "TenantDeliveries", "EachAttemptOf", "ExportTenant",
		"Resend", "InsertTargeted", "InsertAudit", "ListAudit", "PruneAudit",
		"ForwardLease", "CurrentSnapshot", "ForwardFirst", "ForwardPage", "ForwardSave", "ForwardRelease", "PendingOrdered", "ClaimUnforwarded", "MarkForwarded",
		"MarkUnrouted", "Subscriptions", "CopyEvents", "EndpointsByID", "BrokerComplete", "BrokerRows", "ClaimDueRows", "PruneForwarded", "BrokerKey", "GateAcquire", "GateFinish", "GateSlots", "GatePeek", "GateBlock", "PruneFinished", "PruneDeadLetters", "PruneEvents", "EnsurePartitions", "Partitions", "DropPartitions", "DeleteEndpoint"}
	if len(order) != len(calls) {
		t.Fatalf("order lists %d calls, map has %d", len(order), len(calls))
	}
	for _, name := range order {
		if err := calls[name](); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}

	// Methods that run no statement of their own.
	noSQL := map[string]bool{"Close": true, "Prepare": true, "T": true, "JSONTime": true, "Rebind": true, "Tx": true,
		"SetSchema": true, "Schema": true, "EnqueueQueries": true, "ClaimQueries": true, "CompleteQueries": true,
		"BrokerCompleteQueries": true, "BrokerRowsQueries": true, "ForwardQueries": true,
		"WakeLocal": true, "SubscribeLocal": true, "SQLConn": true, "RecoverStatements": true}
	var missing []string
	typ := reflect.TypeFor[*store.Store]()
	for i := range typ.NumMethod() {
		if m := typ.Method(i).Name; calls[m] == nil && !noSQL[m] {
			missing = append(missing, m)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("Store methods this test does not call with a schema set: %v", missing)
	}

	if got := db.SchemaDump(t); got != "" {
		t.Fatalf("txhook objects outside schema %s:\n%s", schema, got)
	}
}
