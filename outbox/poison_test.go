package outbox_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log"
	"log/slog"
	"math/big"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/outbox"
	"github.com/txhook/txhook/retry"
)

// logRecorder is a slog.Handler that keeps every record, for tests that
// wait on a log line or check what the logs carry.
type logRecorder struct {
	mu   *sync.Mutex
	recs *[]loggedRecord
	pre  []slog.Attr
}

type loggedRecord struct {
	Level slog.Level
	Msg   string
	Attrs map[string]string
}

func newLogRecorder() *logRecorder {
	return &logRecorder{mu: &sync.Mutex{}, recs: &[]loggedRecord{}}
}

func (h *logRecorder) Enabled(context.Context, slog.Level) bool { return true }

func (h *logRecorder) Handle(_ context.Context, r slog.Record) error {
	rec := loggedRecord{Level: r.Level, Msg: r.Message, Attrs: map[string]string{}}
	for _, a := range h.pre {
		rec.Attrs[a.Key] = a.Value.Resolve().String()
	}
	r.Attrs(func(a slog.Attr) bool {
		rec.Attrs[a.Key] = a.Value.Resolve().String()
		return true
	})
	h.mu.Lock()
	*h.recs = append(*h.recs, rec)
	h.mu.Unlock()
	return nil
}

func (h *logRecorder) WithAttrs(as []slog.Attr) slog.Handler {
	return &logRecorder{mu: h.mu, recs: h.recs, pre: append(append([]slog.Attr(nil), h.pre...), as...)}
}

func (h *logRecorder) WithGroup(string) slog.Handler { return h }

func (h *logRecorder) records() []loggedRecord {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]loggedRecord(nil), *h.recs...)
}

func (h *logRecorder) count(match func(loggedRecord) bool) int {
	n := 0
	for _, r := range h.records() {
		if match(r) {
			n++
		}
	}
	return n
}

// unclean says what makes s unfit to store or show ("" when nothing):
// invalid UTF-8, a control character other than tab and newline, a bidi
// override.
func unclean(s string) string {
	if !utf8.ValidString(s) {
		return "invalid UTF-8"
	}
	for _, r := range s {
		switch {
		case r == '\t' || r == '\n':
		case r < 0x20, r == 0x7f, 0x80 <= r && r <= 0x9f, 0x202a <= r && r <= 0x202e, 0x2066 <= r && r <= 0x2069:
			return fmt.Sprintf("holds %U", r)
		}
	}
	return ""
}

// checkStoredClean fails t unless every text column a receiver can reach
// is clean, and no delivery is left running.
func checkStoredClean(t *testing.T, b *bundle) {
	t.Helper()
	for _, q := range []string{
		"SELECT last_error FROM txhook_deliveries",
		"SELECT error FROM txhook_attempt_log",
		"SELECT response_excerpt FROM txhook_attempt_log",
		"SELECT last_error FROM txhook_dead_letters",
	} {
		rows, err := b.db.QueryContext(b.ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var s string
			if err := rows.Scan(&s); err != nil {
				t.Fatal(err)
			}
			if why := unclean(s); why != "" {
				t.Errorf("%s: %s: %q", q, why, s)
			}
			if len(s) > 4096 {
				t.Errorf("%s: %d bytes", q, len(s))
			}
		}
		rows.Close()
	}
	if n := b.count("SELECT count(*) FROM txhook_deliveries WHERE state = 'running'"); n != 0 {
		t.Errorf("%d deliveries left running", n)
	}
}

// checkLogsClean fails t unless every value of every log record is clean.
func checkLogsClean(t *testing.T, logs *logRecorder) {
	t.Helper()
	for _, r := range logs.records() {
		for k, v := range r.Attrs {
			if why := unclean(v); why != "" {
				t.Errorf("log %q: %s %s: %q", r.Msg, k, why, v)
			}
		}
	}
}

// gatedReceiver answers 200 once gate is closed, counting requests and
// telling arrived about each.
type gatedReceiver struct {
	*httptest.Server
	n atomic.Int32
}

func newGatedReceiver(t *testing.T, gate <-chan struct{}, arrived chan<- string, name string) *gatedReceiver {
	rc := &gatedReceiver{}
	rc.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		rc.n.Add(1)
		arrived <- name
		<-gate
	}))
	t.Cleanup(rc.Close)
	return rc
}

// poisonServer is an HTTPS receiver whose certificate's only DNS name
// holds a NUL byte, reached as "localhost" so that the relay's hostname
// check fails with an error quoting that name. Its handshakes wait for
// gate and are counted.
func poisonServer(t *testing.T, gate <-chan struct{}, arrived chan<- string) (string, *atomic.Int32) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(9),
		DNSNames:     []string{"\x00evil.example"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	var handshakes atomic.Int32
	srv := httptest.NewUnstartedServer(http.NotFoundHandler())
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.TLS = &tls.Config{
		Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}},
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			handshakes.Add(1)
			arrived <- "poison"
			<-gate
			return nil, nil
		},
	}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return strings.Replace(srv.URL, "127.0.0.1", "localhost", 1), &handshakes
}

// TestPoisonedCertificateDoesNotHoldBackOtherTenants is issue 9's first
// finding: a certificate naming "\x00evil.example" made the attempt's
// error text unstorable on PostgreSQL, and the completer retried the batch
// holding it, with other tenants' outcomes, forever. Here the poisoned
// attempt is made to share a completion batch with four healthy tenants'
// deliveries: those are recorded once and never sent again, the poisoned
// one is recorded with clean text, retried and dead-lettered as usual.
func TestPoisonedCertificateDoesNotHoldBackOtherTenants(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		logs := newLogRecorder()
		b := setup(t, db, outbox.Config{Logger: slog.New(logs)})
		gate, blockerGate := make(chan struct{}), make(chan struct{})
		arrived := make(chan string, 100)
		tenants := []string{"acme", "globex", "initech", "umbrella"}
		receivers := map[string]*gatedReceiver{}
		healthyEps := map[string]bool{}
		for _, tn := range tenants {
			receivers[tn] = newGatedReceiver(t, gate, arrived, tn)
			healthyEps[b.endpoint(tn, receivers[tn].URL).ID] = true
		}
		receivers["zeta"] = newGatedReceiver(t, blockerGate, arrived, "zeta")
		b.endpoint("zeta", receivers["zeta"].URL)
		poisonURL, handshakes := poisonServer(t, gate, arrived)
		poisonEp := b.endpoint("mallory", poisonURL)

		// The blocker's callback holds the completion goroutine while the
		// other outcomes queue up behind it, so that they are written as
		// one batch.
		entered, release := make(chan struct{}), make(chan struct{})
		var enterOnce, releaseOnce sync.Once
		var mu sync.Mutex
		var attempts []outbox.AttemptNotice
		var deadLetters []outbox.DeadLetterNotice
		b.relay(outbox.RelayConfig{
			Retry:   retry.Intervals(10*time.Millisecond, 10*time.Millisecond),
			Timeout: 20 * time.Second,
			Lease:   time.Minute,
			OnAttempt: func(n outbox.AttemptNotice) {
				mu.Lock()
				attempts = append(attempts, n)
				mu.Unlock()
				if n.Tenant == "zeta" {
					enterOnce.Do(func() { close(entered); <-release })
				}
			},
			OnDeadLetter: func(n outbox.DeadLetterNotice) {
				mu.Lock()
				deadLetters = append(deadLetters, n)
				mu.Unlock()
			},
		})
		t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) }) // before the relay stops
		for _, tn := range append(tenants, "zeta", "mallory") {
			b.enqueue(outbox.Event{Tenant: tn, Type: "payment.succeeded", Payload: []byte(`{"amount":100}`)})
		}

		timeout := time.After(waitFor)
		for range 6 {
			select {
			case <-arrived:
			case <-timeout:
				t.Fatal("timed out waiting for the six requests")
			}
		}
		close(blockerGate)
		select {
		case <-entered:
		case <-timeout:
			t.Fatal("timed out waiting for the blocker's outcome")
		}
		close(gate)
		// The relay logs each outcome just before handing it over.
		b.eventually("the five outcomes made", func() bool {
			return logs.count(func(r loggedRecord) bool {
				return r.Msg == "txhook: delivered" && healthyEps[r.Attrs["endpoint"]]
			}) == 4 && logs.count(func(r loggedRecord) bool {
				return r.Msg == "txhook: delivery failed; will retry" && r.Attrs["endpoint"] == poisonEp.ID
			}) == 1
		})
		releaseOnce.Do(func() { close(release) })

		b.eventually("healthy deliveries written and the poisoned one dead-lettered", func() bool {
			return b.count("SELECT count(*) FROM txhook_deliveries WHERE state = 'succeeded'") == 5 &&
				b.count("SELECT count(*) FROM txhook_dead_letters WHERE endpoint_id = ?", poisonEp.ID) == 1
		})
		for name, rc := range receivers {
			if n := rc.n.Load(); n != 1 {
				t.Errorf("%s's receiver got %d requests, want 1", name, n)
			}
		}
		if n := handshakes.Load(); n != 3 {
			t.Errorf("poisoned receiver saw %d handshakes, want 3 (every attempt)", n)
		}
		const want = `x509: certificate is valid for \x00evil.example, not localhost`
		rows, err := b.db.QueryContext(b.ctx, b.rebind("SELECT error FROM txhook_attempt_log WHERE endpoint_id = ? ORDER BY attempt"), poisonEp.ID)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for rows.Next() {
			var e string
			if err := rows.Scan(&e); err != nil {
				t.Fatal(err)
			}
			if n++; !strings.Contains(e, want) {
				t.Errorf("attempt %d error %q, want it to hold %q", n, e, want)
			}
		}
		rows.Close()
		if n != 3 {
			t.Errorf("%d attempts recorded for the poisoned delivery, want 3", n)
		}
		checkStoredClean(t, b)
		checkLogsClean(t, logs)

		b.eventually("callbacks", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(deadLetters) == 1 && len(attempts) == 8
		})
		mu.Lock()
		defer mu.Unlock()
		for _, a := range attempts {
			if why := unclean(a.Error); why != "" || (a.EndpointID == poisonEp.ID && !strings.Contains(a.Error, want)) {
				t.Errorf("OnAttempt error %q (%s)", a.Error, why)
			}
		}
		if why := unclean(deadLetters[0].LastError); why != "" || !strings.Contains(deadLetters[0].LastError, want) {
			t.Errorf("OnDeadLetter error %q (%s)", deadLetters[0].LastError, why)
		}
	})
}

// rawReceiver answers every request with the bytes of response, written
// straight to the connection so that nothing cleans them on the way.
func rawReceiver(t *testing.T, response string) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		conn, buf, err := w.(http.Hijacker).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		buf.WriteString(response)
		buf.Flush()
	}))
	t.Cleanup(srv.Close)
	return srv
}

// TestReceiverJunkIsStoredClean: a body of invalid UTF-8, NUL bytes,
// terminal escapes and a bidi override under a status line of junk, and a
// redirect to a host name of junk bytes, are recorded and dead-lettered
// with clean text on every backend.
func TestReceiverJunkIsStoredClean(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		logs := newLogRecorder()
		b := setup(t, db, outbox.Config{Logger: slog.New(logs)})
		body := "head\xff\xfe\x00mid\x01\x1b[2J\r\nline2\u202eend\x7f\u009b"
		junk := rawReceiver(t, fmt.Sprintf("HTTP/1.1 500 B\x00a\xffd\x1b\r\nContent-Type: text/plain\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(body), body))
		redirect := rawReceiver(t, "HTTP/1.1 302 Found\r\nLocation: http://ev\xffil\u202e\u009b.example:1/x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
		junkEp, redirectEp := b.endpoint("junk", junk.URL), b.endpoint("redirect", redirect.URL)
		var mu sync.Mutex
		var notices []string
		b.relay(outbox.RelayConfig{
			Retry: retry.Intervals(10 * time.Millisecond),
			OnAttempt: func(n outbox.AttemptNotice) {
				mu.Lock()
				notices = append(notices, n.Error)
				mu.Unlock()
			},
			OnDeadLetter: func(n outbox.DeadLetterNotice) {
				mu.Lock()
				notices = append(notices, n.LastError)
				mu.Unlock()
			},
		})
		b.enqueue(outbox.Event{Tenant: "junk", Type: "payment.succeeded", Payload: []byte(`{}`)})
		b.enqueue(outbox.Event{Tenant: "redirect", Type: "payment.succeeded", Payload: []byte(`{}`)})
		b.eventually("both dead-lettered", func() bool {
			return b.count("SELECT count(*) FROM txhook_dead_letters") == 2
		})

		excerpts := func(ep string) []string {
			rows, err := b.db.QueryContext(b.ctx, b.rebind("SELECT response_excerpt || '|' || error FROM txhook_attempt_log WHERE endpoint_id = ? ORDER BY attempt"), ep)
			if err != nil {
				t.Fatal(err)
			}
			defer rows.Close()
			var out []string
			for rows.Next() {
				var s string
				if err := rows.Scan(&s); err != nil {
					t.Fatal(err)
				}
				out = append(out, s)
			}
			return out
		}
		got := excerpts(junkEp.ID)
		if len(got) != 2 {
			t.Fatalf("junk receiver's attempts: %q", got)
		}
		for _, s := range got {
			for _, part := range []string{`mid\x01\x1b[2J`, "\nline2", `\u202eend\x7f\u009b`, "|HTTP 500"} {
				if !strings.Contains(s, part) {
					t.Errorf("junk attempt %q lacks %q", s, part)
				}
			}
		}
		got = excerpts(redirectEp.ID)
		if len(got) != 2 {
			t.Fatalf("redirecting receiver's attempts: %q", got)
		}
		for _, s := range got {
			// The redirect is followed; connecting to its host fails.
			if !strings.Contains(s, "lookup ev\uFFFDil"+`\u202e\u009b.example`) {
				t.Errorf("redirect attempt %q", s)
			}
		}
		checkStoredClean(t, b)
		checkLogsClean(t, logs)
		mu.Lock()
		defer mu.Unlock()
		for _, s := range notices {
			if why := unclean(s); why != "" {
				t.Errorf("callback text %q: %s", s, why)
			}
		}
	})
}

// failCompletions makes the database fail every outcome write, not
// claims, with an error that says nothing about the rows (a serialization
// failure on PostgreSQL, a runtime error on SQLite); the returned func
// lifts it.
func failCompletions(t *testing.T, b *bundle) func() {
	t.Helper()
	create := []string{`CREATE TRIGGER txhook_test_fail BEFORE UPDATE ON txhook_deliveries
WHEN NEW.state <> 'running'
BEGIN SELECT json('not json'); END`}
	drop := []string{"DROP TRIGGER txhook_test_fail"}
	if b.db.Backend.Postgres() {
		// A first attempt claimed with its event writes its delivery row
		// with the outcome: an insert, not an update.
		create = []string{`CREATE FUNCTION txhook_test_fail() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'could not serialize (test)' USING ERRCODE = '40001';
END $$`, `CREATE TRIGGER txhook_test_fail BEFORE INSERT OR UPDATE ON txhook_deliveries
FOR EACH ROW WHEN (NEW.state <> 'running') EXECUTE FUNCTION txhook_test_fail()`}
		drop = []string{"DROP TRIGGER txhook_test_fail ON txhook_deliveries"}
	}
	for _, q := range create {
		if _, err := b.db.ExecContext(b.ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	return func() {
		for _, q := range drop {
			// The relay writes meanwhile; on partitioned tables dropping a
			// trigger locks every partition, and PostgreSQL may end it as
			// a deadlock with a relay's statement: try again.
			var err error
			for range 10 {
				if _, err = b.db.ExecContext(b.ctx, q); err == nil || !strings.Contains(err.Error(), "deadlock") {
					break
				}
			}
			if err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestFailingOutcomeWritesNeitherStallNorRetryForever: while the database
// refuses to record outcomes, the relay keeps sending (the completer keeps
// accepting outcomes instead of stalling every worker), gives each outcome
// up once its lease has ended, with one log line saying why, and when the
// database recovers every delivery ends recorded.
func TestFailingOutcomeWritesNeitherStallNorRetryForever(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		logs := newLogRecorder()
		b := setup(t, db, outbox.Config{Logger: slog.New(logs)})
		var mu sync.Mutex
		seen := map[string]int{}
		rc := newReceiver(t, func(n int, r *http.Request) int {
			mu.Lock()
			seen[r.Header.Get(outbox.HeaderEventID)]++
			mu.Unlock()
			return http.StatusOK
		})
		b.endpoint("acme", rc.URL)
		lift := failCompletions(t, b)
		// One worker and one-delivery claims: the completer's queue holds
		// two outcomes, so a completer stuck on one batch stops the relay
		// after a handful of requests.
		b.relay(outbox.RelayConfig{Concurrency: 1, BatchSize: 1, Lease: 3 * time.Second, Timeout: time.Second})
		const n = 12
		for i := range n {
			b.enqueue(outbox.Event{Tenant: "acme", Type: "payment.succeeded", Payload: []byte(fmt.Sprintf(`{"n":%d}`, i))})
		}
		b.eventually("every event sent while no outcome can be written", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(seen) == n
		})
		expired := func(r loggedRecord) bool {
			return r.Level == slog.LevelWarn && strings.Contains(r.Msg, "not written before the lease ended")
		}
		b.eventually("outcomes given up when their lease ended", func() bool { return logs.count(expired) > 0 })
		for _, r := range logs.records() {
			if expired(r) && r.Attrs["error"] == "" {
				t.Errorf("given up without a cause: %+v", r)
			}
		}
		if logs.count(func(r loggedRecord) bool {
			return r.Level == slog.LevelWarn && strings.Contains(r.Msg, "writing delivery outcomes failed") && r.Attrs["error"] != ""
		}) == 0 {
			t.Error("no warning with the cause of the failed writes")
		}
		lift()
		b.eventually("every delivery recorded once the database recovers", func() bool {
			return b.count("SELECT count(*) FROM txhook_deliveries WHERE state = 'succeeded'") == n
		})
		// Each outcome is given up once, however often its batch failed.
		perDelivery := map[string]int{}
		for _, r := range logs.records() {
			if expired(r) {
				perDelivery[r.Attrs["event"]+"/"+r.Attrs["endpoint"]+"/"+r.Attrs["attempt"]]++
			}
		}
		for k, c := range perDelivery {
			if c != 1 {
				t.Errorf("outcome %s given up %d times", k, c)
			}
		}
	})
}
