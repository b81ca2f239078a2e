package dlq_test

import (
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/txhook/txhook/dlq"
	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/outbox"
)

// Issue 11: a page filtered by ?tenant= still opened another tenant's dead
// letter or endpoint by ID. Detail pages now answer 404 when the ID is not
// the tenant's.
func TestUIDetailPagesRespectTheTenantFilter(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		s := seed(t, db, "/", false)
		globexDead := strconv.FormatInt(s.dead[3], 10)
		for _, p := range []string{"dead/" + globexDead + "?tenant=acme", "endpoints/" + s.globex.ID + "?tenant=acme"} {
			res, body := s.do("GET", p, nil, true)
			if res.StatusCode != http.StatusNotFound || strings.Contains(body, "globex-hook") || strings.Contains(body, "evt_3") {
				t.Errorf("GET %s: %d, want 404 without globex's data", p, res.StatusCode)
			}
		}
		// The tenant's own still open.
		s.get("dead/" + strconv.FormatInt(s.dead[0], 10) + "?tenant=acme")
		s.get("endpoints/" + s.acme.ID + "?tenant=acme")
	})
}

// An operator limited to one tenant by UIConfig.Scope sees and acts on
// that tenant's endpoints, deliveries and dead letters only: other IDs are
// 404 in every page and action, and lists ignore a ?tenant= naming another.
func TestUIScopeLimitsEveryRouteToOneTenant(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		s := seedWith(t, db, dlq.UIConfig{Scope: func(*http.Request) (string, bool) { return "acme", true }})
		globexDead := strconv.FormatInt(s.dead[3], 10)
		before := s.snapshot()
		for _, p := range []string{"dead/" + globexDead, "endpoints/" + s.globex.ID} {
			if res, body := s.do("GET", p, nil, true); res.StatusCode != http.StatusNotFound || strings.Contains(body, "globex-hook") {
				t.Errorf("GET %s: %d, want 404", p, res.StatusCode)
			}
		}
		for _, p := range []string{"dead?tenant=globex", "endpoints?tenant=globex", "deliveries?event_id=evt_3", "dead", "endpoints"} {
			if body := s.get(p); strings.Contains(body, "globex-hook") || strings.Contains(body, s.globex.ID) || strings.Contains(body, "/dead/"+globexDead) || strings.Contains(body, "evt_4") {
				t.Errorf("GET %s shows globex's data", p)
			}
		}
		token := s.token(s.get("dead"))
		for p, form := range map[string]url.Values{
			"endpoints/" + s.globex.ID + "/enable":  {},
			"endpoints/" + s.globex.ID + "/disable": {"reason": {"x"}},
			"endpoints/" + s.globex.ID + "/rotate":  {"overlap": {"1h"}},
			"endpoints/" + s.globex.ID + "/reveal":  {},
			"endpoints/" + s.globex.ID + "/recover": {"since": {"2020-01-01T00:00"}},
		} {
			form.Set("csrf", token)
			if res, body := s.do("POST", p, form, true); res.StatusCode != http.StatusNotFound || strings.Contains(body, "whsec_") {
				t.Errorf("POST %s: %d, want 404", p, res.StatusCode)
			}
		}
		for _, form := range []url.Values{{"replay": {globexDead}}, {"purge": {globexDead}}, {"action": {"purge-selected"}, "id": {globexDead, strconv.FormatInt(s.dead[4], 10)}}} {
			form.Set("csrf", token)
			s.do("POST", "dead/action", form, true)
		}
		if after := s.snapshot(); after != before {
			t.Errorf("a limited operator changed another tenant's data:\n%s\n%s", before, after)
		}
		// Its own tenant works.
		s.get("dead/" + strconv.FormatInt(s.dead[0], 10))
		if loc := s.post("dead/action", url.Values{"replay": {strconv.FormatInt(s.dead[0], 10)}}); !strings.Contains(loc, "n=1") {
			t.Errorf("replay of acme's dead letter: %s", loc)
		}
		// Actions on all matching act on the scope's tenant, whatever the
		// form says.
		for _, p := range []string{"dead/replay-all", "dead/purge-all"} {
			if loc := s.post(p, url.Values{"confirm": {"yes"}, "tenant": {"globex"}}); !strings.Contains(loc, "tenant=acme") {
				t.Errorf("POST %s with tenant=globex: %s", p, loc)
			}
		}
		if n := s.count("SELECT count(*) FROM txhook_dead_letters WHERE tenant = 'globex'"); n != 2 {
			t.Errorf("globex has %d dead letters left, want 2", n)
		}
		if n := s.count("SELECT count(*) FROM txhook_dead_letters WHERE tenant = 'acme'"); n != 0 {
			t.Errorf("acme has %d dead letters left, want 0", n)
		}
		// The audit log shows acme's entries only.
		if body := s.get("audit?tenant=globex"); !strings.Contains(body, "dlq.replay") || strings.Contains(body, "globex") {
			t.Errorf("audit page of a limited operator:\n%s", body)
		}
	})
}

// The endpoint page draws the health charts, tenant names link into the
// merchant portal when PortalLink is set, and operator actions land in the
// audit log page with the actor the host put in the request's context.
func TestUIChartsPortalLinksAndAudit(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		s := seedWith(t, db, dlq.UIConfig{PortalLink: func(tenant string) (string, error) {
			return "https://portal.example/t/" + tenant + "?sig=<x>", nil
		}})
		page := s.get("endpoints/" + s.acme.ID)
		for _, want := range []string{`<svg xmlns="http://www.w3.org/2000/svg" class="chart chart-success"`, `class="chart chart-latency"`,
			`id="success-day-title"`, `id="latency-week-title"`, `href="https://portal.example/t/acme?sig=%3cx%3e"`} {
			if !strings.Contains(page, want) {
				t.Errorf("endpoint page lacks %s", want)
			}
		}
		if strings.Contains(page, "style=") {
			t.Error("endpoint page has a style attribute (refused by the CSP)")
		}
		if list := s.get("endpoints"); !strings.Contains(list, `href="https://portal.example/t/globex?sig=%3cx%3e"`) {
			t.Error("endpoint list lacks the portal links")
		}
		s.post("endpoints/"+s.acme.ID+"/disable", url.Values{"reason": {"maintenance"}})
		s.post("dead/action", url.Values{"purge": {strconv.FormatInt(s.dead[3], 10)}})
		entries, err := s.ob.AuditLog(s.ctx, outbox.AuditFilter{})
		if err != nil {
			t.Fatal(err)
		}
		if len(entries.Entries) != 2 || entries.Entries[0].Action != "dlq.purge" || entries.Entries[1].Action != "endpoint.disable" ||
			entries.Entries[1].Tenant != "acme" || entries.Entries[1].Actor != "operator" || entries.Entries[1].Addr == "" {
			t.Fatalf("audit entries %+v", entries.Entries)
		}
		if body := s.get("audit"); !strings.Contains(body, "endpoint.disable") || !strings.Contains(body, "maintenance") {
			t.Errorf("audit page:\n%s", body)
		}
	})
}
