package portal_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/outbox"
	"github.com/txhook/txhook/outbox/portal"
)

// A delivery the platform's target rules refuse is shown to the merchant
// as such, in words that say what to change and without the relay's
// internals: waiting while refused, failed once refused too long; the API
// gives refused_since.
func TestRefusedDeliveriesAreExplained(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		e := newEnv(t, db, outbox.Config{}, portal.Config{})
		ep, err := e.ob.CreateEndpoint(e.ctx, outbox.NewEndpoint{Tenant: "acme", URL: "http://127.0.0.1:1/hook"})
		if err != nil {
			t.Fatal(err)
		}
		since := time.Now().Add(-3 * time.Hour).UTC().Truncate(time.Microsecond)
		ts := func(t time.Time) any {
			if db.Backend.Postgres() {
				return t
			}
			return t.UnixMicro()
		}
		rebind := func(q string) string {
			if !db.Backend.Postgres() {
				return q
			}
			for i := 1; strings.Contains(q, "?"); i++ {
				q = strings.Replace(q, "?", "$"+strconv.Itoa(i), 1)
			}
			return q
		}
		msg := "not sent, no attempt spent: relay host-7/4242/AB12 refuses the endpoint by its target rules: txhook: loopback target refused: 127.0.0.1"
		ids := map[string]int64{}
		for _, state := range []string{"pending", "dead"} {
			ev := e.enqueue("acme", "payment.succeeded", `{"id":"pay_1","amount":1}`)
			var id int64
			if err := e.db.QueryRowContext(e.ctx, rebind(`INSERT INTO txhook_deliveries
(event_id, endpoint_id, state, attempts, next_attempt_at, last_error, created_at, updated_at, refused_since)
VALUES (?, ?, ?, 0, ?, ?, ?, ?, ?) RETURNING id`), ev, ep.ID, state, ts(time.Now().Add(time.Minute)), msg, ts(since), ts(since), ts(since)).Scan(&id); err != nil {
				t.Fatal(err)
			}
			ids[state] = id
		}
		u := e.login("acme")
		list := u.get("deliveries")
		if strings.Count(list, "URL refused") != 2 || !strings.Contains(list, "Not sent yet: since") ||
			!strings.Contains(list, "Failed without being sent") || strings.Contains(list, "host-7") {
			t.Errorf("deliveries page:\n%s", list)
		}
		page := u.get("deliveries/" + strconv.FormatInt(ids["dead"], 10))
		if !strings.Contains(page, "Failed without being sent") || !strings.Contains(page, "public https address") || strings.Contains(page, "host-7") {
			t.Errorf("refused delivery's page:\n%s", page)
		}
		res, body := u.api("GET", "deliveries/"+strconv.FormatInt(ids["pending"], 10), "")
		if res.StatusCode != 200 || !strings.Contains(body, `"refused_since":"`+since.Format(time.RFC3339Nano)) {
			t.Errorf("API delivery: %d %s", res.StatusCode, body)
		}
	})
}
