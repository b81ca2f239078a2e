package portal_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/internal/testob"
	"github.com/txhook/txhook/outbox"
	"github.com/txhook/txhook/outbox/portal"
)

// errLost is what the failing connection's writes return.
var errLost = errors.New("test: connection lost")

// failAfter is a ResponseWriter whose connection breaks after n bytes of
// body: it writes up to n, then fails every write with errLost.
type failAfter struct {
	http.ResponseWriter
	n int
}

func (f *failAfter) Write(b []byte) (int, error) {
	if len(b) <= f.n {
		f.n -= len(b)
		return f.ResponseWriter.Write(b)
	}
	k, _ := f.ResponseWriter.Write(b[:f.n])
	f.n = 0
	return k, errLost
}

// syncBuffer is a log destination the server's goroutines share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// An export whose writes to the client fail part-way, in the middle of
// the stream or in its last flush, in CSV and in JSON, from a page and from
// the API: the failure is logged, and the response is aborted so that the
// client's read of the body fails instead of ending, as a complete file
// would, after the rows that got through. Before the fix the last flush's
// error was dropped (no log, a clean end) and a failure mid-stream ended
// the body cleanly too.
func TestExportWriteFailure(t *testing.T) {
	logs := &syncBuffer{}
	logger := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	e := newEnv(t, testdb.SQLite(t), outbox.Config{Logger: logger, AllowPrivateTargets: true, AllowHTTP: true}, portal.Config{})
	rcv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	t.Cleanup(rcv.Close)

	// "small" exports 3 rows (a few hundred bytes: all of it waits in the
	// export's 32 KiB buffer until the last flush), "big" 400 (about
	// 60 KiB: the buffer is flushed while rows are still being read).
	sizes := map[string]int{"small": 3, "big": 400}
	for tenant, n := range sizes {
		if _, err := e.ob.CreateEndpoint(e.ctx, outbox.NewEndpoint{Tenant: tenant, URL: rcv.URL}); err != nil {
			t.Fatal(err)
		}
		events := make([]outbox.Event, n)
		for i := range events {
			events[i] = outbox.Event{Tenant: tenant, Type: "payment.succeeded", Payload: json.RawMessage(`{"id":"pay_1"}`)}
		}
		tx, err := e.db.BeginTx(e.ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.ob.EnqueueMany(e.ctx, tx, events); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	e.relay()
	rows := func(tenant string) (n int, size int) {
		var buf strings.Builder
		err := e.ob.Tenant(tenant).Export(e.ctx, outbox.ExportFilter{Since: time.Now().Add(-time.Hour)}, func(r outbox.ExportRow) error {
			n++
			fmt.Fprintln(&buf, r.EventID, r.EventType, r.CreatedAt, r.EndpointID, r.State, r.Attempts, r.LastStatus, r.DeliveredAt)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return n, buf.Len()
	}
	for tenant, n := range sizes {
		testob.Eventually(t, tenant+"'s deliveries", func() bool { got, _ := rows(tenant); return got == n })
	}

	// The same portal behind a host whose connection breaks after limit
	// bytes of an export's body.
	limit := map[string]int{"small": 100, "big": 40 << 10}
	broken := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if tenant := r.Header.Get("X-Test-Tenant"); tenant != "" && strings.Contains(r.URL.Path, "export") {
			w = &failAfter{ResponseWriter: w, n: limit[tenant]}
		}
		e.p.ServeHTTP(w, r)
	}))
	t.Cleanup(broken.Close)
	be := *e
	be.srv = broken

	for _, tc := range []struct{ tenant, path, format string }{
		{"small", "/portal/export?format=csv", "csv"},
		{"big", "/portal/export?format=csv", "csv"},
		{"small", "/portal/api/export?format=json", "json"},
		{"big", "/portal/api/export?format=json", "json"},
	} {
		t.Run(tc.tenant+"-"+tc.format, func(t *testing.T) {
			if _, size := rows(tc.tenant); size <= limit[tc.tenant] {
				t.Fatalf("the export (%d bytes or more) must be larger than where the connection breaks (%d)", size, limit[tc.tenant])
			}
			u := be.login(tc.tenant)
			before := strings.Count(logs.String(), "export cut short")
			req, err := http.NewRequestWithContext(e.ctx, "GET", broken.URL+tc.path, nil)
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("X-Test-Tenant", tc.tenant)
			req.Header.Set(portal.APIHeader, "1")
			// The client must see a failure: no response at all (what got
			// through was still in the server's buffer when it aborted),
			// or a 200 whose body breaks off.
			// A connection of its own: net/http's client sends a GET again
			// when a reused connection closes before any answer.
			client := &http.Client{Jar: u.client.Jar, Transport: &http.Transport{DisableKeepAlives: true}}
			res, err := client.Do(req)
			if err == nil {
				body, rerr := io.ReadAll(res.Body)
				res.Body.Close()
				if res.StatusCode != http.StatusOK {
					t.Fatalf("status %d: %.300s", res.StatusCode, body)
				}
				if len(body) > limit[tc.tenant] {
					t.Fatalf("read %d bytes through a connection that breaks after %d", len(body), limit[tc.tenant])
				}
				if rerr == nil {
					t.Errorf("the client read %d bytes and a clean end of the body: a truncated export looks complete", len(body))
				} else {
					t.Logf("the client read %d bytes, then %v", len(body), rerr)
				}
			} else {
				t.Logf("the client got no response: %v", err)
			}
			// The log line is written before the handler aborts, so it is
			// there by the time the client sees the broken body.
			lines := strings.Split(logs.String(), "\n")
			var found bool
			for _, l := range lines {
				if strings.Contains(l, "export cut short") && strings.Contains(l, "tenant="+tc.tenant) &&
					strings.Contains(l, "format="+tc.format) && strings.Contains(l, errLost.Error()) {
					found = true
				}
			}
			if !found || strings.Count(logs.String(), "export cut short") != before+1 {
				t.Errorf("no log line of this export's failure (tenant=%s format=%s, %q); log:\n%s", tc.tenant, tc.format, errLost, logs)
			}
		})
	}
}
