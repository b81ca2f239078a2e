package dlq_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/txhook/txhook/internal/testdb"
)

// The endpoint page recovers what an endpoint missed since a time: here its
// dead letters, which are queued again and leave the dead-letter table.
func TestUIRecoversAnEndpoint(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		s := seed(t, db, "/", false)
		path := "endpoints/" + s.acme.ID
		page := s.get(path)
		if !strings.Contains(page, `action="/`+path+`/recover"`) || !strings.Contains(page, `type="datetime-local" name="since"`) {
			t.Fatalf("endpoint page has no recover form:\n%s", page)
		}

		since := s.base.Add(-2 * time.Hour).Format("2006-01-02T15:04")
		loc := s.post(path+"/recover", url.Values{"since": {since}})
		if loc != path+"?done=recovered&n=3" {
			t.Fatalf("recover redirects to %q", loc)
		}
		if page := s.get(loc); !strings.Contains(page, "Recovered 3 events") {
			t.Errorf("no result on the page:\n%s", page)
		}
		if n := s.count("SELECT count(*) FROM txhook_dead_letters WHERE endpoint_id = ?", s.acme.ID); n != 0 {
			t.Errorf("%d dead letters of the endpoint left", n)
		}
		if n := s.count("SELECT count(*) FROM txhook_deliveries WHERE endpoint_id = ? AND state = 'pending'", s.acme.ID); n != 3 {
			t.Errorf("%d deliveries queued, want 3", n)
		}
		if n := s.count("SELECT count(*) FROM txhook_dead_letters"); n != 2 {
			t.Errorf("the other tenant's dead letters were touched: %d left", n)
		}
		// Nothing left to recover.
		if loc := s.post(path+"/recover", url.Values{"since": {since}}); !strings.Contains(s.get(loc), "Nothing to recover") {
			t.Errorf("second recovery: %q", loc)
		}

		// Bad times and unknown endpoints change nothing.
		before := s.snapshot()
		tok := s.token(page)
		for _, tc := range []struct {
			path, since string
			status      int
		}{
			{path, "", http.StatusBadRequest},
			{path, "yesterday", http.StatusBadRequest},
			{path, time.Now().UTC().Add(48 * time.Hour).Format("2006-01-02T15:04"), http.StatusBadRequest},
			{"endpoints/ep_nope", since, http.StatusNotFound},
		} {
			res, body := s.do("POST", tc.path+"/recover", url.Values{"csrf": {tok}, "since": {tc.since}}, true)
			if res.StatusCode != tc.status {
				t.Errorf("recover %s since %q: %d, want %d\n%.300s", tc.path, tc.since, res.StatusCode, tc.status, body)
			}
		}
		if after := s.snapshot(); after != before {
			t.Errorf("refused recoveries changed state")
		}
	})
}
