package outbox_test

import (
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/txhook/txhook/internal/clock"
	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/outbox"
	"github.com/txhook/txhook/signer"
)

// tenantFixture is tenant A with one endpoint that has received one event
// (succeeded, two attempts: a 500 then a 200), and tenant B with an
// endpoint of its own.
type tenantFixture struct {
	b         *bundle
	rc        *receiver
	epA, epB  outbox.Endpoint
	eventA    string
	deliveryA outbox.Delivery
}

func newTenantFixture(t *testing.T, db *testdb.DB, cfg outbox.Config) *tenantFixture {
	b := setup(t, db, cfg)
	rc := newReceiver(t, func(n int, r *http.Request) int {
		if n == 1 {
			return http.StatusInternalServerError
		}
		return http.StatusOK
	})
	f := &tenantFixture{b: b, rc: rc}
	f.epA = b.endpoint("merchant-a", rc.URL)
	f.epB = b.endpoint("merchant-b", rc.URL+"/b")
	f.eventA = b.enqueue(outbox.Event{Tenant: "merchant-a", Type: "payment.succeeded", Payload: []byte(`{"amount":1}`)})
	b.relay(roomy(outbox.RelayConfig{Retry: fastRetry()}))
	rc.next(t)
	rc.next(t)
	var ds []outbox.Delivery
	b.eventually("delivery succeeded", func() bool {
		var err error
		ds, err = b.ob.EventDeliveries(b.ctx, f.eventA)
		return err == nil && len(ds) == 1 && ds[0].State == outbox.StateSucceeded
	})
	f.deliveryA = ds[0]
	return f
}

// snapshot is everything a tenant-B call must not change in tenant A's
// data.
func (f *tenantFixture) snapshot() string {
	b := f.b
	var secrets string
	var enabled bool
	if err := b.db.QueryRowContext(b.ctx, b.rebind(`SELECT secrets, enabled FROM txhook_endpoints WHERE id = ?`), f.epA.ID).Scan(&secrets, &enabled); err != nil {
		b.t.Fatal(err)
	}
	return fmt.Sprintf("endpoints=%d deliveries=%d events=%d dead=%d audit=%d enabled=%v secrets=%x",
		b.count(`SELECT count(*) FROM txhook_endpoints WHERE tenant = 'merchant-a'`),
		b.count(`SELECT count(*) FROM txhook_deliveries`), b.count(`SELECT count(*) FROM txhook_events`),
		b.count(`SELECT count(*) FROM txhook_dead_letters`), b.count(`SELECT count(*) FROM txhook_audit`), enabled, sha256.Sum256([]byte(secrets)))
}

// Every TenantView call of tenant B that names tenant A's endpoint, event
// or delivery gets the same not-found error as a missing ID, reads nothing
// of A's and changes nothing.
func TestTenantViewIsolation(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		f := newTenantFixture(t, db, outbox.Config{})
		b := f.b
		vb := b.ob.Tenant("merchant-b")
		ctx := b.ctx
		url := f.rc.URL + "/evil"
		desc := "x"
		type call struct {
			name string
			want error
			fn   func(id string, delivery int64, event string) error
		}
		calls := []call{
			{"Endpoint", outbox.ErrEndpointNotFound, func(id string, _ int64, _ string) error { _, err := vb.Endpoint(ctx, id); return err }},
			{"UpdateEndpoint", outbox.ErrEndpointNotFound, func(id string, _ int64, _ string) error {
				_, err := vb.UpdateEndpoint(ctx, id, outbox.EndpointUpdate{URL: &url, Description: &desc})
				return err
			}},
			{"DeleteEndpoint", outbox.ErrEndpointNotFound, func(id string, _ int64, _ string) error { return vb.DeleteEndpoint(ctx, id) }},
			{"EnableEndpoint", outbox.ErrEndpointNotFound, func(id string, _ int64, _ string) error { return vb.EnableEndpoint(ctx, id) }},
			{"DisableEndpoint", outbox.ErrEndpointNotFound, func(id string, _ int64, _ string) error { return vb.DisableEndpoint(ctx, id, "no") }},
			{"RotateSecret", outbox.ErrEndpointNotFound, func(id string, _ int64, _ string) error {
				_, err := vb.RotateSecret(ctx, id, outbox.Rotation{})
				return err
			}},
			{"Health", outbox.ErrEndpointNotFound, func(id string, _ int64, _ string) error { _, err := vb.Health(ctx, id, time.Hour); return err }},
			{"HealthSeries", outbox.ErrEndpointNotFound, func(id string, _ int64, _ string) error {
				_, err := vb.HealthSeries(ctx, id, 24*time.Hour, time.Hour)
				return err
			}},
			{"Recover", outbox.ErrEndpointNotFound, func(id string, _ int64, _ string) error {
				_, err := vb.Recover(ctx, id, time.Now().Add(-time.Hour))
				return err
			}},
			{"SendTest", outbox.ErrEndpointNotFound, func(id string, _ int64, _ string) error {
				_, err := vb.SendTest(ctx, id, "payment.succeeded")
				return err
			}},
			{"Delivery", outbox.ErrDeliveryNotFound, func(_ string, d int64, _ string) error { _, err := vb.Delivery(ctx, d); return err }},
			{"Attempts", outbox.ErrDeliveryNotFound, func(_ string, d int64, _ string) error { _, err := vb.Attempts(ctx, d); return err }},
			{"Resend", outbox.ErrDeliveryNotFound, func(_ string, d int64, _ string) error { _, err := vb.Resend(ctx, d); return err }},
			{"Event", outbox.ErrEventNotFound, func(_ string, _ int64, e string) error { _, err := vb.Event(ctx, e); return err }},
		}
		for _, c := range calls {
			before := f.snapshot()
			errA := c.fn(f.epA.ID, f.deliveryA.ID, f.eventA)
			if !errors.Is(errA, c.want) {
				t.Errorf("%s with tenant A's ID: %v, want %v", c.name, errA, c.want)
			}
			errMissing := c.fn("ep_01JMISSINGMISSINGMISSINGMI", 1<<40, "evt_missing")
			if !errors.Is(errMissing, c.want) {
				t.Errorf("%s with a missing ID: %v, want %v", c.name, errMissing, c.want)
			}
			if errA != nil && strings.Contains(errA.Error(), "merchant-a") {
				t.Errorf("%s error names tenant A: %v", c.name, errA)
			}
			if after := f.snapshot(); after != before {
				t.Errorf("%s changed tenant A's data:\n%s\n%s", c.name, before, after)
			}
		}
		// Listings and exports of B hold nothing of A's, even filtered on
		// A's IDs.
		page, err := vb.Deliveries(ctx, outbox.DeliveryFilter{EndpointID: f.epA.ID})
		if err != nil || len(page.Deliveries) != 0 {
			t.Errorf("B's deliveries of A's endpoint: %v %v", page.Deliveries, err)
		}
		page, err = vb.Deliveries(ctx, outbox.DeliveryFilter{EventID: f.eventA})
		if err != nil || len(page.Deliveries) != 0 {
			t.Errorf("B's deliveries of A's event: %v %v", page.Deliveries, err)
		}
		n := 0
		if err := vb.Export(ctx, outbox.ExportFilter{Since: time.Now().Add(-time.Hour), Until: time.Now().Add(time.Hour)}, func(outbox.ExportRow) error { n++; return nil }); err != nil || n != 0 {
			t.Errorf("B's export: %d rows, %v", n, err)
		}
		eps, err := vb.Endpoints(ctx)
		if err != nil || len(eps) != 1 || eps[0].ID != f.epB.ID {
			t.Errorf("B's endpoints: %v %v", eps, err)
		}
		// B's create cannot name A.
		if _, err := vb.CreateEndpoint(ctx, outbox.NewEndpoint{Tenant: "merchant-a", URL: f.rc.URL}); !errors.Is(err, outbox.ErrInvalidEndpoint) {
			t.Errorf("B creating for A: %v", err)
		}
		// A sees its own.
		va := b.ob.Tenant("merchant-a")
		if _, err := va.Delivery(ctx, f.deliveryA.ID); err != nil {
			t.Errorf("A's own delivery: %v", err)
		}
		if _, err := va.Event(ctx, f.eventA); err != nil {
			t.Errorf("A's own event: %v", err)
		}
		// An empty tenant can do nothing.
		if _, err := b.ob.Tenant("").Endpoints(ctx); !errors.Is(err, outbox.ErrNoTenant) {
			t.Errorf("empty tenant: %v", err)
		}
	})
}

// The portal shows each attempt's request headers as sent: rebuilt from
// the stored event, the attempt's start and the endpoint's secrets, they
// equal what the receiver got, signature included; once the signing
// secret is rotated out, the signature is left out with a note.
func TestTenantAttemptsShowHeadersAsSent(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		f := newTenantFixture(t, db, outbox.Config{})
		va := f.b.ob.Tenant("merchant-a")
		as, err := va.Attempts(f.b.ctx, f.deliveryA.ID)
		if err != nil {
			t.Fatal(err)
		}
		got := f.rc.requests()
		if len(as) != 2 || len(got) != 2 {
			t.Fatalf("%d attempts, %d requests", len(as), len(got))
		}
		for i, a := range as {
			if a.SignatureNote != "" {
				t.Errorf("attempt %d: note %q", i+1, a.SignatureNote)
			}
			for _, h := range []string{"Webhook-Id", "Webhook-Timestamp", "Webhook-Signature", "Webhook-Event-Type", "Webhook-Event-Version", "Content-Type"} {
				if a.RequestHeaders.Get(h) == "" || a.RequestHeaders.Get(h) != got[i].Header.Get(h) {
					t.Errorf("attempt %d %s: shown %q, sent %q", i+1, h, a.RequestHeaders.Get(h), got[i].Header.Get(h))
				}
			}
			if _, err := (signer.Standard{Tolerance: time.Hour}).Verify(a.RequestHeaders, got[i].Body, []string{f.epA.Secrets[0].Value}); err != nil {
				t.Errorf("attempt %d: rebuilt signature does not verify the body sent: %v", i+1, err)
			}
		}
		// Rotate twice without overlap: the secret that signed is gone.
		for range 2 {
			if _, err := va.RotateSecret(f.b.ctx, f.epA.ID, outbox.Rotation{Overlap: -1}); err != nil {
				t.Fatal(err)
			}
		}
		as, err = va.Attempts(f.b.ctx, f.deliveryA.ID)
		if err != nil {
			t.Fatal(err)
		}
		for i, a := range as {
			if a.RequestHeaders.Get("Webhook-Signature") != "" || !strings.Contains(a.SignatureNote, "rotated out") {
				t.Errorf("attempt %d after rotation: signature %q, note %q", i+1, a.RequestHeaders.Get("Webhook-Signature"), a.SignatureNote)
			}
			if a.RequestHeaders.Get("Webhook-Timestamp") != got[i].Header.Get("Webhook-Timestamp") {
				t.Errorf("attempt %d timestamp after rotation", i+1)
			}
		}
	})
}

// SendTest delivers an event of the chosen type, with the catalog's
// example payload, to that endpoint only, marked Webhook-Test; Resend sends
// a finished delivery again and refuses one not finished.
func TestTenantSendTestAndResend(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		cat := outbox.NewCatalog()
		if err := cat.Register(outbox.EventType{Name: "refund.created", Versions: []outbox.SchemaVersion{
			{Version: 1, Example: json.RawMessage(`{"refund":"re_1"}`)}, {Version: 2, Example: json.RawMessage(`{"refund":"re_2","v":2}`)}}}); err != nil {
			t.Fatal(err)
		}
		b := setup(t, db, outbox.Config{Catalog: cat})
		rc := newReceiver(t, nil)
		other := newReceiver(t, nil)
		ep := b.endpoint("m", rc.URL)
		b.endpoint("m", other.URL) // subscribed to everything: must not get the test event
		v := b.ob.Tenant("m")
		ctx := outbox.WithActor(b.ctx, outbox.Actor{Name: "alice@m", Addr: "192.0.2.1"})
		if _, err := v.SendTest(ctx, ep.ID, "no.such.type"); !errors.Is(err, outbox.ErrUnknownEventType) {
			t.Fatalf("unknown type: %v", err)
		}
		d, err := v.SendTest(ctx, ep.ID, "refund.created")
		if err != nil {
			t.Fatal(err)
		}
		if d.State != outbox.StatePending || d.EndpointID != ep.ID || !strings.HasPrefix(d.EventID, outbox.TestEventPrefix) {
			t.Fatalf("test delivery: %+v", d)
		}
		if _, err := v.Resend(ctx, d.ID); !errors.Is(err, outbox.ErrDeliveryActive) {
			t.Fatalf("resend of a pending delivery: %v", err)
		}
		b.relay(roomy(outbox.RelayConfig{}))
		got := rc.next(t)
		if got.Header.Get("Webhook-Test") != "true" || got.Header.Get("Webhook-Event-Type") != "refund.created" || got.Header.Get("Webhook-Event-Version") != "2" {
			t.Fatalf("test request headers: %v", got.Header)
		}
		var env struct {
			ID   string          `json:"id"`
			Data json.RawMessage `json:"data"`
		}
		if err := json.Unmarshal(got.Body, &env); err != nil || env.ID != d.EventID || string(env.Data) != `{"refund":"re_2","v":2}` {
			t.Fatalf("test body %s: %v", got.Body, err)
		}
		b.eventually("test delivery succeeded", func() bool {
			x, err := v.Delivery(ctx, d.ID)
			return err == nil && x.State == outbox.StateSucceeded
		})
		ev, err := v.Event(ctx, d.EventID)
		if err != nil || !ev.Test || ev.Type != "refund.created" {
			t.Fatalf("test event record: %+v %v", ev, err)
		}
		// Resend the succeeded delivery: a new one, same event ID.
		nd, err := v.Resend(ctx, d.ID)
		if err != nil {
			t.Fatal(err)
		}
		if nd.ID == d.ID || nd.EventID != d.EventID {
			t.Fatalf("resent: %+v", nd)
		}
		again := rc.next(t)
		if again.Header.Get("Webhook-Id") != d.EventID {
			t.Fatalf("resent request id %q", again.Header.Get("Webhook-Id"))
		}
		if n := len(other.requests()); n != 0 {
			t.Fatalf("the other endpoint got %d requests", n)
		}
		// Both actions are in the audit log, with the actor.
		log, err := v.AuditLog(b.ctx, outbox.AuditFilter{})
		if err != nil {
			t.Fatal(err)
		}
		var actions []string
		for _, e := range log.Entries {
			actions = append(actions, e.Action)
			if e.Actor != "alice@m" || e.Addr != "192.0.2.1" || e.Tenant != "m" {
				t.Errorf("audit entry %+v", e)
			}
		}
		if strings.Join(actions, ",") != "delivery.resend,endpoint.send_test" {
			t.Errorf("audit actions %v", actions)
		}
		// User events cannot pose as test events.
		tx, _ := b.db.BeginTx(b.ctx, nil)
		defer tx.Rollback()
		if _, err := b.ob.Enqueue(b.ctx, tx, outbox.Event{ID: outbox.TestEventPrefix + "x", Tenant: "m", Type: "refund.created", Payload: []byte(`{}`)}); !errors.Is(err, outbox.ErrInvalidEvent) {
			t.Fatalf("enqueue with the test prefix: %v", err)
		}
	})
}

// Every mutating TenantView call writes one audit row with the actor; the
// tenant reads only its own, operators all; no secret is recorded.
func TestTenantAuditLog(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		b := setup(t, db, outbox.Config{})
		va, vb := b.ob.Tenant("a"), b.ob.Tenant("b")
		ctx := outbox.WithActor(b.ctx, outbox.Actor{Name: "bob", Addr: "198.51.100.7"})
		ep, err := va.CreateEndpoint(ctx, outbox.NewEndpoint{URL: "http://127.0.0.1:9/a"})
		if err != nil {
			t.Fatal(err)
		}
		u := "http://127.0.0.1:9/b"
		if _, err := va.UpdateEndpoint(ctx, ep.ID, outbox.EndpointUpdate{URL: &u}); err != nil {
			t.Fatal(err)
		}
		if err := va.DisableEndpoint(ctx, ep.ID, "maintenance"); err != nil {
			t.Fatal(err)
		}
		if err := va.EnableEndpoint(ctx, ep.ID); err != nil {
			t.Fatal(err)
		}
		rot, err := va.RotateSecret(ctx, ep.ID, outbox.Rotation{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := va.Recover(ctx, ep.ID, time.Now().Add(-time.Hour)); err != nil {
			t.Fatal(err)
		}
		if _, err := vb.CreateEndpoint(ctx, outbox.NewEndpoint{URL: "http://127.0.0.1:9/c"}); err != nil {
			t.Fatal(err)
		}
		if err := va.DeleteEndpoint(ctx, ep.ID); err != nil {
			t.Fatal(err)
		}
		want := []string{"endpoint.delete", "endpoint.recover", "endpoint.rotate_secret", "endpoint.enable", "endpoint.disable", "endpoint.update", "endpoint.create"}
		var got []string
		cursor := ""
		for {
			p, err := va.AuditLog(b.ctx, outbox.AuditFilter{Limit: 3, Cursor: cursor})
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range p.Entries {
				got = append(got, e.Action)
				if e.Tenant != "a" || e.Actor != "bob" || e.Addr != "198.51.100.7" || e.Target != ep.ID {
					t.Errorf("entry %+v", e)
				}
				for _, s := range append(rot.Secrets, ep.Secrets...) {
					if strings.Contains(string(e.Detail), s.Value) {
						t.Errorf("%s detail holds a secret", e.Action)
					}
				}
			}
			if cursor = p.Next; cursor == "" {
				break
			}
		}
		if strings.Join(got, ",") != strings.Join(want, ",") {
			t.Fatalf("tenant a's audit log:\n got %v\nwant %v", got, want)
		}
		all, err := b.ob.AuditLog(b.ctx, outbox.AuditFilter{})
		if err != nil || len(all.Entries) != len(want)+1 {
			t.Fatalf("operator audit log: %d entries, %v", len(all.Entries), err)
		}
		onlyB, err := b.ob.AuditLog(b.ctx, outbox.AuditFilter{Tenant: "b"})
		if err != nil || len(onlyB.Entries) != 1 || onlyB.Entries[0].Tenant != "b" {
			t.Fatalf("operator audit log of b: %+v %v", onlyB.Entries, err)
		}
		if _, err := va.AuditLog(b.ctx, outbox.AuditFilter{Cursor: "!!"}); !errors.Is(err, outbox.ErrInvalidCursor) {
			t.Fatalf("bad cursor: %v", err)
		}
	})
}

// Deliveries filters by endpoint, event, type, state and time and pages
// with a keyset cursor; Export streams one row per delivery in a stable
// order; HealthSeries buckets the attempts.
func TestTenantDeliveriesExportAndSeries(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		start := time.Date(2026, 3, 1, 10, 30, 0, 0, time.UTC)
		clk := clock.NewFake(start)
		b := setup(t, db, outbox.Config{Clock: clk})
		rc := newReceiver(t, func(n int, r *http.Request) int {
			if strings.Contains(r.Header.Get("Webhook-Event-Type"), "fail") {
				return http.StatusBadRequest
			}
			return http.StatusOK
		})
		ep1 := b.endpoint("m", rc.URL)
		ep2 := b.endpoint("m", rc.URL+"/2", "order.*")
		b.endpoint("other", rc.URL+"/o")
		var ids []string
		for i := range 5 {
			ids = append(ids, b.enqueue(outbox.Event{Tenant: "m", Type: "order.created", Payload: []byte(fmt.Sprintf(`{"i":%d}`, i))}))
		}
		ids = append(ids, b.enqueue(outbox.Event{Tenant: "m", Type: "payment.fail", Payload: []byte(`{}`)}))
		b.enqueue(outbox.Event{Tenant: "other", Type: "order.created", Payload: []byte(`{}`)})
		b.relay(roomy(outbox.RelayConfig{Retry: fastRetryAttempts(1)}))
		v := b.ob.Tenant("m")
		b.eventually("all delivered", func() bool {
			return b.count(`SELECT count(*) FROM txhook_deliveries WHERE state IN ('succeeded', 'dead')`) == 12
		})
		all := map[int64]bool{}
		cursor := ""
		for {
			p, err := v.Deliveries(b.ctx, outbox.DeliveryFilter{Limit: 4, Cursor: cursor})
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range p.Deliveries {
				if all[d.ID] {
					t.Fatalf("delivery %d twice", d.ID)
				}
				all[d.ID] = true
			}
			if cursor = p.Next; cursor == "" {
				break
			}
		}
		if len(all) != 11 {
			t.Fatalf("paged %d deliveries, want 11", len(all))
		}
		check := func(f outbox.DeliveryFilter, want int) {
			t.Helper()
			p, err := v.Deliveries(b.ctx, f)
			if err != nil || len(p.Deliveries) != want {
				t.Errorf("filter %+v: %d deliveries, want %d (%v)", f, len(p.Deliveries), want, err)
			}
		}
		check(outbox.DeliveryFilter{EndpointID: ep2.ID}, 5)
		check(outbox.DeliveryFilter{EventID: ids[0]}, 2)
		check(outbox.DeliveryFilter{EventType: "payment.fail"}, 1)
		check(outbox.DeliveryFilter{State: outbox.StateDead}, 1)
		check(outbox.DeliveryFilter{EndpointID: ep1.ID, State: outbox.StateSucceeded}, 5)
		check(outbox.DeliveryFilter{Since: start.Add(time.Minute)}, 0)
		check(outbox.DeliveryFilter{Until: start.Add(time.Minute)}, 11)
		if _, err := v.Deliveries(b.ctx, outbox.DeliveryFilter{State: "lost"}); !errors.Is(err, outbox.ErrInvalidFilter) {
			t.Errorf("unknown state: %v", err)
		}
		if _, err := v.Deliveries(b.ctx, outbox.DeliveryFilter{Cursor: "nope"}); !errors.Is(err, outbox.ErrInvalidCursor) {
			t.Errorf("bad cursor: %v", err)
		}

		var rows []outbox.ExportRow
		if err := v.Export(b.ctx, outbox.ExportFilter{Since: start.Add(-time.Hour)}, func(r outbox.ExportRow) error {
			rows = append(rows, r)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if len(rows) != 11 {
			t.Fatalf("export: %d rows", len(rows))
		}
		for i, r := range rows {
			if i > 0 && (r.CreatedAt.Before(rows[i-1].CreatedAt) || r.CreatedAt.Equal(rows[i-1].CreatedAt) && r.EventID < rows[i-1].EventID) {
				t.Errorf("export row %d out of order", i)
			}
			switch r.EventType {
			case "payment.fail":
				if r.State != outbox.StateDead || r.LastStatus != 400 || !r.DeliveredAt.IsZero() {
					t.Errorf("failed row %+v", r)
				}
			default:
				if r.State != outbox.StateSucceeded || r.LastStatus != 200 || r.DeliveredAt.IsZero() || r.Attempts != 1 {
					t.Errorf("row %+v", r)
				}
			}
		}
		stop := fmt.Errorf("stop")
		n := 0
		if err := v.Export(b.ctx, outbox.ExportFilter{Since: start.Add(-time.Hour), EndpointID: ep2.ID}, func(outbox.ExportRow) error {
			n++
			return stop
		}); err != stop || n != 1 {
			t.Errorf("export stops at fn's error: %v after %d", err, n)
		}
		if err := v.Export(b.ctx, outbox.ExportFilter{}, func(outbox.ExportRow) error { return nil }); !errors.Is(err, outbox.ErrInvalidFilter) {
			t.Errorf("export without since: %v", err)
		}

		// Health series: all 6 attempts to ep1 fall in the 10:00 bucket.
		clk.Advance(3 * time.Hour)
		pts, err := v.HealthSeries(b.ctx, ep1.ID, 24*time.Hour, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if len(pts) != 24 || !pts[23].Start.Equal(time.Date(2026, 3, 1, 13, 0, 0, 0, time.UTC)) {
			t.Fatalf("%d points, last at %v", len(pts), pts[len(pts)-1].Start)
		}
		for _, p := range pts {
			if p.Start.Equal(time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)) {
				if p.Attempts != 6 || p.Succeeded != 5 || p.P50 <= 0 || p.P99 < p.P50 {
					t.Errorf("10:00 bucket %+v", p)
				}
			} else if p.Attempts != 0 {
				t.Errorf("bucket %v has %d attempts", p.Start, p.Attempts)
			}
		}
		if _, err := v.HealthSeries(b.ctx, ep1.ID, time.Hour, 2*time.Hour); !errors.Is(err, outbox.ErrInvalidFilter) {
			t.Errorf("step > window: %v", err)
		}
		if _, err := v.HealthSeries(b.ctx, ep1.ID, 7*24*time.Hour, time.Minute); !errors.Is(err, outbox.ErrInvalidFilter) {
			t.Errorf("too many buckets: %v", err)
		}
	})
}

// Audit entries go after Retention.Audit (400 days by default), not before.
func TestRetentionPrunesAudit(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
		b := setup(t, db, outbox.Config{Clock: clk})
		for i := range 3 {
			if err := b.ob.Record(b.ctx, "m", "test.action", fmt.Sprint(i), nil); err != nil {
				t.Fatal(err)
			}
			clk.Advance(100 * 24 * time.Hour)
		}
		// Now 300 days after the first: nothing is 400 days old.
		if p, err := b.ob.Prune(b.ctx, outbox.Retention{}); err != nil || p.Audit != 0 {
			t.Fatalf("prune at 300 days: %+v %v", p, err)
		}
		clk.Advance(150 * 24 * time.Hour) // 450, 350, 250 days old
		if p, err := b.ob.Prune(b.ctx, outbox.Retention{BatchSize: 1}); err != nil || p.Audit != 1 {
			t.Fatalf("prune at 450 days: %+v %v", p, err)
		}
		if p, err := b.ob.Prune(b.ctx, outbox.Retention{Audit: 300 * 24 * time.Hour}); err != nil || p.Audit != 1 {
			t.Fatalf("prune with 300 days: %+v %v", p, err)
		}
		if p, err := b.ob.Prune(b.ctx, outbox.Retention{Audit: -1}); err != nil || p.Audit != 0 {
			t.Fatalf("prune with audit kept forever: %+v %v", p, err)
		}
		if n := b.count(`SELECT count(*) FROM txhook_audit`); n != 1 {
			t.Fatalf("%d audit rows left", n)
		}
	})
}
