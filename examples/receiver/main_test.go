package main

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/txhook/txhook/signer"
)

const timeout = 60 * time.Second

// watch collects the JSON log lines a receiver writes.
type watch struct {
	mu      sync.Mutex
	lines   []map[string]any
	raw     bytes.Buffer
	changed chan struct{}
	eof     bool
}

func newWatch(r io.Reader) *watch {
	w := &watch{changed: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			var m map[string]any
			_ = json.Unmarshal(sc.Bytes(), &m)
			w.mu.Lock()
			w.raw.Write(sc.Bytes())
			w.raw.WriteByte('\n')
			w.lines = append(w.lines, m)
			close(w.changed)
			w.changed = make(chan struct{})
			w.mu.Unlock()
		}
		_, _ = io.Copy(io.Discard, r) // never block the writer
		w.mu.Lock()
		w.eof = true
		close(w.changed)
		w.changed = make(chan struct{})
		w.mu.Unlock()
	}()
	return w
}

// waitFor returns the first line with msg whose attrs match, waiting for it.
func (w *watch) waitFor(t *testing.T, msg string, attrs ...string) map[string]any {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		w.mu.Lock()
	lines:
		for _, l := range w.lines {
			if l["msg"] != msg {
				continue
			}
			for i := 0; i+1 < len(attrs); i += 2 {
				if fmt.Sprint(l[attrs[i]]) != attrs[i+1] {
					continue lines
				}
			}
			w.mu.Unlock()
			return l
		}
		ch, eof := w.changed, w.eof
		w.mu.Unlock()
		if eof {
			t.Fatalf("log ended without %q %v:\n%s", msg, attrs, w.String())
		}
		select {
		case <-ch:
		case <-deadline.C:
			t.Fatalf("no %q %v in the log after %s:\n%s", msg, attrs, timeout, w.String())
		}
	}
}

func (w *watch) count(msg string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, l := range w.lines {
		if l["msg"] == msg {
			n++
		}
	}
	return n
}

func (w *watch) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.raw.String()
}

func envelope(id string) []byte {
	return fmt.Appendf(nil, `{"id":%q,"type":"payment.succeeded","timestamp":"2026-03-01T12:00:00Z","data":{"amount":100}}`, id)
}

// send posts body signed with secrets (Standard scheme) at ts.
func send(t *testing.T, url, id string, ts time.Time, body []byte, secrets ...string) (int, string) {
	t.Helper()
	h := http.Header{}
	if err := (signer.Standard{}).Sign(h, id, ts, body, secrets); err != nil {
		t.Fatal(err)
	}
	return post(t, url, h, body)
}

func post(t *testing.T, url string, h http.Header, body []byte) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header = h
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	text, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(text))
}

func secrets(t *testing.T) (oldS, newS string) {
	oldS, err := signer.GenerateSecret()
	if err != nil {
		t.Fatal(err)
	}
	newS, err = signer.GenerateSecret()
	if err != nil {
		t.Fatal(err)
	}
	return oldS, newS
}

func ledger(t *testing.T, dbPath string) int {
	t.Helper()
	db, err := sql.Open("sqlite3", "file:"+dbPath+"?_busy_timeout=10000")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM ledger`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// The receiver in process: verification, async processing, dedup, rotation,
// graceful stop.
func TestReceiver(t *testing.T) {
	t.Parallel()
	oldS, newS := secrets(t)
	dbPath := filepath.Join(t.TempDir(), "receiver.db")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pr, pw := io.Pipe()
	logs := newWatch(pr)
	env := map[string]string{"RECEIVER_SECRETS": oldS + ", " + newS}
	runErr := make(chan error, 1)
	go func() {
		runErr <- run(ctx, []string{"-addr", "127.0.0.1:0", "-db", dbPath, "-workers", "2"}, func(k string) string { return env[k] }, pw)
		pw.Close()
	}()
	url := "http://" + logs.waitFor(t, "listening")["addr"].(string) + "/webhooks"

	now := time.Now()
	code, text := send(t, url, "evt_1", now, envelope("evt_1"), newS)
	if code != http.StatusAccepted {
		t.Fatalf("first delivery: %d %q", code, text)
	}
	logs.waitFor(t, "processed", "event", "evt_1")
	if code, text := send(t, url, "evt_1", now, envelope("evt_1"), newS); code != 200 || text != "duplicate" {
		t.Fatalf("retry: %d %q", code, text)
	}
	// The old secret of the rotation still works.
	if code, _ := send(t, url, "evt_2", now, envelope("evt_2"), oldS); code != http.StatusAccepted {
		t.Fatalf("old secret: %d", code)
	}
	logs.waitFor(t, "processed", "event", "evt_2")

	other, _ := signer.GenerateSecret()
	for name, c := range map[string]struct {
		code   int
		status int
	}{
		"wrong secret": {func() int { c, _ := send(t, url, "evt_x", now, envelope("evt_x"), other); return c }(), 401},
		"stale":        {func() int { c, _ := send(t, url, "evt_x", now.Add(-time.Hour), envelope("evt_x"), newS); return c }(), 401},
		"tampered": {func() int {
			h := http.Header{}
			(signer.Standard{}).Sign(h, "evt_x", now, envelope("evt_x"), []string{newS})
			c, _ := post(t, url, h, bytes.Replace(envelope("evt_x"), []byte("100"), []byte("1"), 1))
			return c
		}(), 401},
		"no headers": {func() int { c, _ := post(t, url, http.Header{}, envelope("evt_x")); return c }(), 401},
	} {
		if c.code != c.status {
			t.Errorf("%s: %d, want %d", name, c.code, c.status)
		}
	}

	// Many events at once, each delivered twice concurrently.
	const n = 20
	var wg sync.WaitGroup
	for i := range n {
		id := fmt.Sprint("evt_many_", i)
		for range 2 {
			wg.Go(func() {
				if c, text := send(t, url, id, now, envelope(id), newS); c != 202 && c != 409 && c != 200 {
					t.Errorf("%s: %d %q", id, c, text)
				}
			})
		}
	}
	wg.Wait()
	for i := range n {
		logs.waitFor(t, "processed", "event", fmt.Sprint("evt_many_", i))
	}

	// A connection the client dialled but never used stays "new" on the
	// server, and Shutdown waits 5 s for such connections.
	http.DefaultClient.CloseIdleConnections()
	cancel()
	select {
	case err := <-runErr:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(timeout):
		t.Fatal("run did not return after cancel")
	}
	if got := ledger(t, dbPath); got != n+2 {
		t.Fatalf("ledger has %d rows, want %d", got, n+2)
	}
	if c := logs.count("processed"); c != n+2 {
		t.Fatalf("%d processed lines, want %d", c, n+2)
	}
	if l := logs.String(); strings.Contains(l, strings.TrimPrefix(newS, "whsec_")) || strings.Contains(l, strings.TrimPrefix(oldS, "whsec_")) {
		t.Fatalf("a secret is in the log:\n%s", l)
	}
}

// The Stripe scheme: the ID is the one in the signed body.
func TestReceiverStripe(t *testing.T) {
	t.Parallel()
	const secret = "stripe-style-secret-0123456789"
	dbPath := filepath.Join(t.TempDir(), "receiver.db")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pr, pw := io.Pipe()
	logs := newWatch(pr)
	runErr := make(chan error, 1)
	go func() {
		runErr <- run(ctx, []string{"-addr", "127.0.0.1:0", "-db", dbPath, "-scheme", "stripe",
			"-stripe-header", "X-Kxp-Signature", "-secret", secret}, func(string) string { return "" }, pw)
		pw.Close()
	}()
	url := "http://" + logs.waitFor(t, "listening")["addr"].(string) + "/webhooks"
	body := envelope("evt_s1")
	h := http.Header{}
	if err := (signer.Stripe{Header: "X-Kxp-Signature"}).Sign(h, "evt_s1", time.Now(), body, []string{secret}); err != nil {
		t.Fatal(err)
	}
	if c, text := post(t, url, h.Clone(), body); c != 202 {
		t.Fatalf("%d %q", c, text)
	}
	logs.waitFor(t, "processed", "event", "evt_s1")
	h.Set("Webhook-Id", "evt_other") // unsigned in this scheme: must not defeat dedup
	if c, text := post(t, url, h, body); c != 200 || text != "duplicate" {
		t.Fatalf("replay with another header id: %d %q", c, text)
	}
	cancel()
	if err := <-runErr; err != nil {
		t.Fatal(err)
	}
}

func TestRunConfigErrors(t *testing.T) {
	t.Parallel()
	good, _ := signer.GenerateSecret()
	dir := t.TempDir()
	for name, args := range map[string][]string{
		"no secret":     {"-db", filepath.Join(dir, "a.db")},
		"bad secret":    {"-secret", "whsec_???", "-db", filepath.Join(dir, "b.db")},
		"bad scheme":    {"-secret", good, "-scheme", "hmac", "-db", filepath.Join(dir, "c.db")},
		"bad flag":      {"-secret", good, "-nope"},
		"bad address":   {"-secret", good, "-addr", "127.0.0.1:99999", "-db", filepath.Join(dir, "d.db")},
		"zero workers":  {"-secret", good, "-workers", "0"},
		"private key":   {"-secret", "whsk_" + strings.Repeat("A", 43) + "=", "-db", filepath.Join(dir, "e.db")},
		"unwritable db": {"-secret", good, "-db", filepath.Join(dir, "missing-dir", "f.db")},
	} {
		err := run(context.Background(), args, func(string) string { return "" }, io.Discard)
		if err == nil {
			t.Errorf("%s: run succeeded", name)
		} else if strings.Contains(err.Error(), good) {
			t.Errorf("%s: error shows the secret: %v", name, err)
		}
	}
}

// The built binary as a subprocess: it starts, processes a delivery, and
// exits 0 on SIGTERM after finishing its work.
func TestBinary(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bin := filepath.Join(dir, "receiver")
	build := exec.Command("go", "build", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	secret, _ := signer.GenerateSecret()
	dbPath := filepath.Join(dir, "receiver.db")
	cmd := exec.Command(bin, "-addr", "127.0.0.1:0", "-db", dbPath)
	cmd.Env = append(os.Environ(), "RECEIVER_SECRETS="+secret)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	logs := newWatch(stdout)
	go func() {
		// Wait closes stdout, so it must come after the log reader is done.
		logs.waitForEOF()
		exited <- cmd.Wait()
	}()
	t.Cleanup(func() { _ = cmd.Process.Kill() })

	url := "http://" + logs.waitFor(t, "listening")["addr"].(string) + "/webhooks"
	if c, text := send(t, url, "evt_bin", time.Now(), envelope("evt_bin"), secret); c != 202 {
		t.Fatalf("%d %q", c, text)
	}
	logs.waitFor(t, "processed", "event", "evt_bin")
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("exit: %v\nstderr: %s\nlog:\n%s", err, stderr.String(), logs.String())
		}
	case <-time.After(timeout):
		t.Fatal("no exit after SIGTERM")
	}
	logs.waitFor(t, "stopped")
	if got := ledger(t, dbPath); got != 1 {
		t.Fatalf("ledger has %d rows", got)
	}
}

// waitForEOF blocks until the log stream ends.
func (w *watch) waitForEOF() {
	for {
		w.mu.Lock()
		ch, eof := w.changed, w.eof
		w.mu.Unlock()
		if eof {
			return
		}
		<-ch
	}
}
