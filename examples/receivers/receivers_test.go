package receivers_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/txhook/txhook/signer"
)

// requireEnv makes a missing runtime a failure instead of a skip. CI sets it
// after running install-runtimes.sh.
const requireEnv = "TXHOOK_REQUIRE_RECEIVERS"

const requestTimeout = 30 * time.Second

// A runtime is one receiver implementation and how to start it; args are
// relative to this directory, where go test runs.
type runtime struct {
	name string
	bin  string // looked up in PATH
	args []string
	// prepare, if set, runs once per test binary before the first start
	// (compiling, say) and returns the arguments to use instead of args.
	prepare func(ctx context.Context) ([]string, error)
}

var runtimes = []runtime{
	{name: "python", bin: "python3", args: []string{"python/receiver.py"}},
	{name: "node", bin: "node", args: []string{"node/receiver.js"}},
	// Compiled once with javac: the source launcher (JEP 330) compiled the
	// file again on every start, 20 to 40 s each on a busy 2-core machine.
	// Serial GC and C1 only: a quicker start for a short-lived JVM.
	{name: "java", bin: "java", prepare: compileJava},
}

// classDir holds the compiled Java receiver; TestMain removes it.
var classDir string

func TestMain(m *testing.M) {
	code := m.Run()
	if classDir != "" {
		os.RemoveAll(classDir)
	}
	os.Exit(code)
}

var javaOnce struct {
	sync.Once
	args []string
	err  error
}

// compileJava compiles java/Receiver.java once per test binary and returns
// the arguments that run it. It needs a JDK 11 or later (javac).
func compileJava(ctx context.Context) ([]string, error) {
	javaOnce.Do(func() {
		javac, err := exec.LookPath("javac")
		if err != nil {
			javaOnce.err = fmt.Errorf("javac (a JDK, not a JRE) is needed to compile the Java receiver: %w", err)
			return
		}
		if classDir, err = os.MkdirTemp("", "txhook-receiver-java-"); err != nil {
			javaOnce.err = err
			return
		}
		cmd := exec.CommandContext(ctx, javac, "-d", classDir, "java/Receiver.java")
		ownProcessGroup(cmd)
		cmd.WaitDelay = 10 * time.Second
		if out, err := cmd.CombinedOutput(); err != nil {
			javaOnce.err = fmt.Errorf("javac java/Receiver.java: %v\n%s", err, out)
			return
		}
		javaOnce.args = []string{"-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-cp", classDir, "Receiver"}
	})
	return javaOnce.args, javaOnce.err
}

// untilDeadline returns a context that ends shortly before the test
// binary's -timeout would (none without one), so that waiting on a slow
// start fails the test with its output rather than panicking the binary;
// a loaded machine gets all the time the package has.
func untilDeadline(t *testing.T) (context.Context, context.CancelFunc) {
	deadline, ok := t.Deadline()
	if !ok {
		return context.WithCancel(context.Background())
	}
	margin := min(time.Until(deadline)/10, 30*time.Second)
	return context.WithDeadline(context.Background(), deadline.Add(-margin))
}

// TestReceivers starts each receiver in each scheme and checks its verdicts
// on requests signed by package signer.
func TestReceivers(t *testing.T) {
	required := os.Getenv(requireEnv) == "1"
	for _, rt := range runtimes {
		t.Run(rt.name, func(t *testing.T) {
			t.Parallel()
			path, err := exec.LookPath(rt.bin)
			if err != nil {
				if required {
					t.Fatalf("%s is not installed (%v) and %s=1; run examples/receivers/install-runtimes.sh", rt.bin, err, requireEnv)
				}
				t.Skipf("%s receiver not tested: %s is not in PATH (%s=1 makes this a failure; install-runtimes.sh installs it)", rt.name, rt.bin, requireEnv)
			}
			if rt.prepare != nil {
				ctx, cancel := untilDeadline(t)
				rt.args, err = rt.prepare(ctx)
				cancel()
				if err != nil {
					t.Fatalf("%s receiver: %v", rt.name, err)
				}
			}
			for _, scheme := range []string{"standard", "stripe"} {
				t.Run(scheme, func(t *testing.T) {
					t.Parallel()
					t.Run("overlap", func(t *testing.T) {
						t.Parallel()
						testOverlap(t, rt, path, scheme)
					})
					t.Run("after-rotation", func(t *testing.T) {
						t.Parallel()
						testAfterRotation(t, rt, path, scheme)
					})
				})
			}
			t.Run("bad-config", func(t *testing.T) {
				t.Parallel()
				testBadConfig(t, rt, path)
			})
		})
	}
}

// testOverlap runs the main cases against a receiver configured with an old
// and a new secret, as during a rotation overlap, configured with arguments.
func testOverlap(t *testing.T, rt runtime, path, scheme string) {
	oldSecret, newSecret, wrongSecret := newSecret(t, scheme), newSecret(t, scheme), newSecret(t, scheme)
	tg := &target{scheme: scheme, secrets: []string{oldSecret, newSecret}, leaks: []string{oldSecret, newSecret, wrongSecret}}
	if scheme == "stripe" {
		tg.header = signer.DefaultStripeHeader
	}
	tg.receiver = start(t, rt, path, []string{"--port", "0", "--scheme", scheme},
		[]string{"TXHOOK_SECRETS=" + oldSecret + "," + newSecret})
	sigHeader := tg.signatureHeader()

	t.Run("valid then duplicate", func(t *testing.T) {
		id := nextID()
		body := event(id)
		h := tg.sign(t, id, time.Now(), body, newSecret)
		tg.expect(t, h, body, http.StatusOK, "processed "+id)
		// The same request again, as a retry after a lost response.
		tg.expect(t, h, body, http.StatusOK, "duplicate "+id)
		// A later attempt, signed anew.
		tg.expect(t, tg.sign(t, id, time.Now(), body, newSecret), body, http.StatusOK, "duplicate "+id)
	})

	t.Run("tampered body", func(t *testing.T) {
		id := nextID()
		body := event(id)
		h := tg.sign(t, id, time.Now(), body, newSecret)
		tampered := bytes.Replace(body, []byte(`"amount":1999`), []byte(`"amount":9999`), 1)
		if bytes.Equal(tampered, body) {
			t.Fatal("test bug: nothing tampered")
		}
		tg.expect(t, h, tampered, http.StatusUnauthorized, "")
		// A rejected request must not claim the id: the genuine one still
		// gets processed.
		tg.expect(t, h, body, http.StatusOK, "processed "+id)
	})

	t.Run("wrong secret", func(t *testing.T) {
		id := nextID()
		body := event(id)
		tg.expect(t, tg.sign(t, id, time.Now(), body, wrongSecret), body, http.StatusUnauthorized, "")
	})

	t.Run("stale timestamp", func(t *testing.T) {
		id := nextID()
		body := event(id)
		tg.expect(t, tg.sign(t, id, time.Now().Add(-10*time.Minute), body, newSecret), body, http.StatusUnauthorized, "")
	})

	t.Run("future timestamp", func(t *testing.T) {
		id := nextID()
		body := event(id)
		tg.expect(t, tg.sign(t, id, time.Now().Add(10*time.Minute), body, newSecret), body, http.StatusUnauthorized, "")
	})

	t.Run("missing header", func(t *testing.T) {
		id := nextID()
		body := event(id)
		required := []string{sigHeader}
		if scheme == "standard" {
			required = []string{signer.HeaderID, signer.HeaderTimestamp, signer.HeaderSignature}
		}
		for _, name := range required {
			h := tg.sign(t, id, time.Now(), body, newSecret)
			h.Del(name)
			t.Logf("without %s", name)
			tg.expect(t, h, body, http.StatusUnauthorized, "")
			h.Set(name, "")
			t.Logf("with empty %s", name)
			tg.expect(t, h, body, http.StatusUnauthorized, "")
		}
		t.Log("no headers at all")
		tg.expect(t, http.Header{"Content-Type": {"application/json"}}, body, http.StatusUnauthorized, "")
	})

	t.Run("rotation", func(t *testing.T) {
		for _, c := range []struct {
			name    string
			secrets []string
		}{
			{"old secret only", []string{oldSecret}},
			{"new secret only", []string{newSecret}},
			{"old and new", []string{oldSecret, newSecret}},
			{"unknown and old", []string{wrongSecret, oldSecret}},
		} {
			id := nextID()
			body := event(id)
			t.Log(c.name)
			tg.expect(t, tg.sign(t, id, time.Now(), body, c.secrets...), body, http.StatusOK, "processed "+id)
		}
	})

	t.Run("malformed", func(t *testing.T) {
		id := nextID()
		body := event(id)
		valid := func() http.Header { return tg.sign(t, id, time.Now(), body, newSecret) }
		if scheme == "standard" {
			h := valid()
			h.Set(signer.HeaderTimestamp, "12x")
			tg.expect(t, h, body, http.StatusBadRequest, "")
			h = valid()
			h.Set(signer.HeaderSignature, "garbage")
			tg.expect(t, h, body, http.StatusBadRequest, "")
			h = valid()
			h.Add(signer.HeaderTimestamp, h.Get(signer.HeaderTimestamp))
			tg.expect(t, h, body, http.StatusBadRequest, "")
			h = valid()
			h.Set(signer.HeaderID, "evt.1") // '.' would make id.timestamp.body ambiguous
			tg.expect(t, h, body, http.StatusBadRequest, "")
		} else {
			h := valid()
			h.Set(sigHeader, "garbage")
			tg.expect(t, h, body, http.StatusBadRequest, "")
			h = valid()
			h.Set(sigHeader, strings.Replace(h.Get(sigHeader), "t=", "t=x", 1))
			tg.expect(t, h, body, http.StatusBadRequest, "")
			h = valid()
			h.Add(sigHeader, h.Get(sigHeader))
			tg.expect(t, h, body, http.StatusBadRequest, "")
		}
		// Signed correctly, but not an event.
		notJSON := []byte("not json")
		tg.expect(t, tg.sign(t, id, time.Now(), notJSON, newSecret), notJSON, http.StatusBadRequest, "")
		if scheme == "stripe" {
			// The body carries the dedup key in this scheme.
			for _, b := range []string{
				`{"type":"payment.succeeded","data":{}}`,
				`{"id":"","type":"payment.succeeded","data":{}}`,
				`{"id":42,"type":"payment.succeeded","data":{}}`,
				`{"id":"evt 1","type":"payment.succeeded","data":{}}`,
				`["evt_1"]`,
			} {
				t.Logf("body %s", b)
				tg.expect(t, tg.sign(t, id, time.Now(), []byte(b), newSecret), []byte(b), http.StatusBadRequest, "")
			}
		}
		// None of that claimed the id.
		tg.expect(t, valid(), body, http.StatusOK, "processed "+id)
	})

	t.Run("json bodies", func(t *testing.T) {
		// The receivers parse only what verified; they must agree on
		// what JSON is. $ID is the event id.
		for _, c := range []struct {
			body  string
			valid bool
		}{
			{`{"id":"$ID","type":"t","data":{"s":"a\"b\\c\/d\b\f\n\r\t\u00e9\ud83d\ude00","n":[-0,1.5e+3,2E-2,0.25,-7],"b":[true,false,null],"o":{},"a":[]}}`, true},
			{" \r\n\t{ \"id\" : \"$ID\" , \"data\" : [ ] } \n", true},
			{`{"id":"$ID","note":"é ✓ 😀"}`, true},
			{`{"id":"ignored","id":"$ID"}`, true}, // the last duplicate key wins everywhere
			{``, false},
			{`{"id":"$ID"`, false},
			{`{"id":"$ID",}`, false},
			{`{'id':'$ID'}`, false},
			{`{"id":"$ID"} x`, false},
			{`{"id":"$ID","n":01}`, false},
			{`{"id":"$ID","n":1.}`, false},
			{`{"id":"$ID","n":.5}`, false},
			{`{"id":"$ID","n":-}`, false},
			{`{"id":"$ID","n":NaN}`, false},
			{`{"id":"$ID","n":Infinity}`, false},
			{`{"id":"$ID","t":tru}`, false},
			{`{"id":"$ID","s":"\x"}`, false},
			{`{"id":"$ID","s":"\u12"}`, false},
			{"{\"id\":\"$ID\",\"s\":\"tab\there\"}", false},                          // raw control character
			{"{\"id\":\"$ID\",\"s\":\"\xff\"}", false},                               // invalid UTF-8
			{"\xef\xbb\xbf{\"id\":\"$ID\"}", false},                                  // BOM
			{"[" + strings.Repeat("[", 100) + strings.Repeat("]", 100) + "]", false}, // not an object
		} {
			id := nextID()
			body := []byte(strings.ReplaceAll(c.body, "$ID", id))
			t.Logf("body %q", body)
			if c.valid {
				tg.expect(t, tg.sign(t, id, time.Now(), body, newSecret), body, http.StatusOK, "processed "+id)
			} else {
				tg.expect(t, tg.sign(t, id, time.Now(), body, newSecret), body, http.StatusBadRequest, "")
			}
		}
	})

	if scheme == "stripe" {
		t.Run("dedup on the signed body id", func(t *testing.T) {
			// webhook-id is not signed in this scheme: a replay inside the
			// tolerance can change it, so the receiver must key on the
			// body's id.
			id := nextID()
			body := event(id)
			h := tg.sign(t, id, time.Now(), body, newSecret)
			tg.expect(t, h, body, http.StatusOK, "processed "+id)
			h.Set(signer.HeaderID, "evt_forged")
			tg.expect(t, h, body, http.StatusOK, "duplicate "+id)
			h.Del(signer.HeaderID)
			tg.expect(t, h, body, http.StatusOK, "duplicate "+id)
		})
	}

	t.Run("concurrent copies", func(t *testing.T) {
		// The "processing" state: copies racing the first one are
		// duplicates (200) or in progress (409), never processed again.
		const n = 16
		id := nextID()
		body := event(id)
		h := tg.sign(t, id, time.Now(), body, newSecret)
		type result struct {
			status int
			text   string
			err    error
		}
		results := make(chan result, n)
		var start sync.WaitGroup
		start.Add(1)
		for range n {
			go func() {
				start.Wait()
				status, text, err := tg.post(h, body)
				results <- result{status, text, err}
			}()
		}
		start.Done()
		processed := 0
		for range n {
			r := <-results
			switch {
			case r.err != nil:
				t.Error(r.err)
			case r.status == http.StatusOK && r.text == "processed "+id:
				processed++
			case r.status == http.StatusOK && r.text == "duplicate "+id:
			case r.status == http.StatusConflict && r.text == "in progress "+id:
			default:
				t.Errorf("got %d %q, want processed, duplicate or in progress of %s", r.status, r.text, id)
			}
		}
		if processed != 1 {
			t.Errorf("processed %d times, want exactly once", processed)
		}
	})
}

// testAfterRotation runs a receiver that was given only the new secret,
// configured through environment variables, with a non-default tolerance
// and, in the Stripe scheme, a non-default header.
func testAfterRotation(t *testing.T, rt runtime, path, scheme string) {
	oldSecret, newSecret := newSecret(t, scheme), newSecret(t, scheme)
	tg := &target{scheme: scheme, secrets: []string{newSecret}, tolerance: 20 * time.Minute, leaks: []string{oldSecret, newSecret}}
	env := []string{"TXHOOK_SECRETS=" + newSecret, "TXHOOK_PORT=0", "TXHOOK_SCHEME=" + scheme, "TXHOOK_TOLERANCE=1200"}
	if scheme == "stripe" {
		tg.header = "X-Kxp-Signature"
		env = append(env, "TXHOOK_HEADER="+tg.header)
	}
	tg.receiver = start(t, rt, path, nil, env)

	t.Run("old secret refused", func(t *testing.T) {
		id := nextID()
		body := event(id)
		tg.expect(t, tg.sign(t, id, time.Now(), body, oldSecret), body, http.StatusUnauthorized, "")
	})
	t.Run("sender still in overlap", func(t *testing.T) {
		id := nextID()
		body := event(id)
		tg.expect(t, tg.sign(t, id, time.Now(), body, oldSecret, newSecret), body, http.StatusOK, "processed "+id)
	})
	t.Run("tolerance", func(t *testing.T) {
		for _, c := range []struct {
			offset time.Duration
			want   int
		}{
			{-10 * time.Minute, http.StatusOK},
			{10 * time.Minute, http.StatusOK},
			{-30 * time.Minute, http.StatusUnauthorized},
			{30 * time.Minute, http.StatusUnauthorized},
		} {
			id := nextID()
			body := event(id)
			t.Logf("timestamp %s from now", c.offset)
			want := ""
			if c.want == http.StatusOK {
				want = "processed " + id
			}
			tg.expect(t, tg.sign(t, id, time.Now().Add(c.offset), body, newSecret), body, c.want, want)
		}
	})
	if scheme == "stripe" {
		t.Run("default header ignored", func(t *testing.T) {
			id := nextID()
			body := event(id)
			h := tg.sign(t, id, time.Now(), body, newSecret)
			h[signer.DefaultStripeHeader] = h[http.CanonicalHeaderKey(tg.header)]
			delete(h, http.CanonicalHeaderKey(tg.header))
			tg.expect(t, h, body, http.StatusUnauthorized, "")
		})
	}
}

// testBadConfig checks that a receiver given an unusable secret refuses to
// start and does not print the secret.
func testBadConfig(t *testing.T, rt runtime, path string) {
	const marker = "NOTBASE64SECRETMARKER"
	ctx, cancel := untilDeadline(t)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, append(append([]string(nil), rt.args...), "--port", "0")...)
	cmd.Env = append(cleanEnv(), "TXHOOK_SECRETS=whsec_!!"+marker)
	ownProcessGroup(cmd)
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("receiver did not exit before the test's deadline; output:\n%s", out)
	}
	if err == nil {
		t.Errorf("receiver exited 0 with an invalid secret; output:\n%s", out)
	}
	if bytes.Contains(out, []byte("LISTENING")) {
		t.Errorf("receiver listened with an invalid secret; output:\n%s", out)
	}
	if bytes.Contains(out, []byte(marker)) {
		t.Errorf("receiver printed the secret; output:\n%s", out)
	}
	if !bytes.Contains(out, []byte("secrets[0]")) {
		t.Errorf("error does not say which secret is bad; output:\n%s", out)
	}
}

// target is a running receiver and what it was configured with.
type target struct {
	*receiver
	scheme    string        // "standard" or "stripe"
	header    string        // Stripe signature header
	tolerance time.Duration // zero: the default
	secrets   []string      // the receiver's
	leaks     []string      // must never appear in a response
}

func (tg *target) signer() signer.Signer {
	if tg.scheme == "stripe" {
		return signer.Stripe{Header: tg.header}
	}
	return signer.Standard{}
}

func (tg *target) verifier() signer.Verifier {
	if tg.scheme == "stripe" {
		return signer.Stripe{Header: tg.header, Tolerance: tg.tolerance}
	}
	return signer.Standard{Tolerance: tg.tolerance}
}

func (tg *target) signatureHeader() string {
	if tg.scheme == "stripe" {
		return http.CanonicalHeaderKey(tg.header)
	}
	return signer.HeaderSignature
}

func (tg *target) sign(t *testing.T, id string, ts time.Time, body []byte, secrets ...string) http.Header {
	t.Helper()
	h := http.Header{"Content-Type": {"application/json"}}
	if err := tg.signer().Sign(h, id, ts, body, secrets); err != nil {
		t.Fatalf("Sign: %v", err)
	}
	return h
}

// expect posts body with headers h and checks the status and, unless
// wantText is empty, the response text. It also checks the receiver agrees
// with signer's own Verify: what it accepts must verify, what it refuses
// with 401 must not.
func (tg *target) expect(t *testing.T, h http.Header, body []byte, wantStatus int, wantText string) {
	t.Helper()
	status, text, err := tg.post(h, body)
	if err != nil {
		t.Fatal(err)
	}
	if status != wantStatus || (wantText != "" && text != wantText) {
		want := strconv.Itoa(wantStatus)
		if wantText != "" {
			want += fmt.Sprintf(" %q", wantText)
		}
		t.Errorf("got %d %q, want %s", status, text, want)
	}
	for _, s := range tg.leaks {
		if strings.Contains(text, s) || strings.Contains(text, strings.TrimPrefix(s, "whsec_")) {
			t.Errorf("response %q contains a secret", text)
		}
	}
	_, verr := tg.verifier().Verify(h, body, tg.secrets)
	switch {
	case (wantStatus/100 == 2 || wantStatus == http.StatusConflict) && verr != nil:
		t.Errorf("test bug: request expected to pass fails signer's Verify: %v", verr)
	case wantStatus == http.StatusUnauthorized && verr == nil:
		t.Errorf("test bug: request expected to be refused passes signer's Verify")
	}
}

// receiver is a running receiver process.
type receiver struct {
	url    string
	client *http.Client
}

// post sends one request and returns the status and the response text
// without its trailing newline.
func (r *receiver) post(h http.Header, body []byte) (int, string, error) {
	req, err := http.NewRequest(http.MethodPost, r.url, bytes.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	req.Header = h.Clone()
	resp, err := r.client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return 0, "", err
	}
	return resp.StatusCode, strings.TrimRight(string(b), "\r\n"), nil
}

// start runs a receiver on a free loopback port and waits for its LISTENING
// line, or its exit, for as long as the test binary's -timeout allows. The
// process (group) is killed when the test ends; its output is logged if the
// test failed.
func start(t *testing.T, rt runtime, path string, args, env []string) *receiver {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, path, append(append([]string(nil), rt.args...), args...)...)
	cmd.Env = append(cleanEnv(), env...)
	ownProcessGroup(cmd)
	cmd.WaitDelay = 10 * time.Second // bounds Wait if something still holds the pipes

	output := new(syncBuffer)
	ready := make(chan string, 1)
	cmd.Stdout = &firstLine{out: output, line: ready}
	cmd.Stderr = output
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatalf("start %s: %v", rt.name, err)
	}
	exited := make(chan struct{})
	var waitErr error
	go func() {
		waitErr = cmd.Wait()
		close(exited)
	}()
	client := &http.Client{
		Timeout:   requestTimeout,
		Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 16},
	}
	t.Cleanup(func() {
		client.CloseIdleConnections()
		cancel()
		<-exited
		if t.Failed() {
			t.Logf("%s receiver output:\n%s", rt.name, output.String())
		}
	})

	wait, stopWaiting := untilDeadline(t)
	defer stopWaiting()
	began := time.Now()
	select {
	case line := <-ready:
		t.Logf("%s receiver listening after %s", rt.name, time.Since(began).Round(time.Millisecond))
		rest, ok := strings.CutPrefix(line, "LISTENING ")
		port, err := strconv.Atoi(rest)
		if !ok || err != nil || port <= 0 || port > 65535 {
			t.Fatalf("first line of stdout is %q, want \"LISTENING <port>\"", line)
		}
		return &receiver{url: fmt.Sprintf("http://127.0.0.1:%d/webhooks", port), client: client}
	case <-exited:
		t.Fatalf("%s receiver exited before listening: %v", rt.name, waitErr)
	case <-wait.Done():
		t.Fatalf("%s receiver printed no LISTENING line in %s, until shortly before the test binary's -timeout", rt.name, time.Since(began).Round(time.Second))
	}
	return nil
}

// cleanEnv is this process's environment without TXHOOK_ variables, which
// would configure the receivers.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "TXHOOK_") {
			env = append(env, kv)
		}
	}
	return env
}

// firstLine copies a process's stdout to out and sends its first line on line.
type firstLine struct {
	out  io.Writer
	line chan<- string
	buf  []byte
	sent bool
}

// Write is called from one goroutine only: os/exec copies stdout in one.
func (w *firstLine) Write(p []byte) (int, error) {
	w.out.Write(p)
	if !w.sent {
		w.buf = append(w.buf, p...)
		if i := bytes.IndexByte(w.buf, '\n'); i >= 0 || len(w.buf) > 4096 {
			if i < 0 {
				i = len(w.buf)
			}
			w.line <- strings.TrimRight(string(w.buf[:i]), "\r")
			w.sent, w.buf = true, nil
		}
	}
	return len(p), nil
}

// syncBuffer is a bytes.Buffer safe for the stdout and stderr copiers.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// newSecret returns a fresh secret for scheme: a whsec_ secret for Standard,
// 32 random bytes in hex (as the article does) for Stripe.
func newSecret(t *testing.T, scheme string) string {
	t.Helper()
	if scheme == "standard" {
		s, err := signer.GenerateSecret()
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	b := make([]byte, 32)
	rand.Read(b)
	return hex.EncodeToString(b)
}

var idSeq atomic.Int64

// nextID returns an event id not used before in this test binary.
func nextID() string {
	return fmt.Sprintf("evt_%d_%d", time.Now().UnixNano(), idSeq.Add(1))
}

// event returns the body the txhook sender would send for event id.
func event(id string) []byte {
	b, err := json.Marshal(struct {
		ID        string         `json:"id"`
		Type      string         `json:"type"`
		Timestamp string         `json:"timestamp"`
		Data      map[string]any `json:"data"`
	}{
		ID:        id,
		Type:      "payment.succeeded",
		Timestamp: time.Now().UTC().Format("2006-01-02T15:04:05.000000Z"),
		Data:      map[string]any{"amount": 1999, "currency": "EUR", "note": "é ✓"},
	})
	if err != nil {
		panic(err)
	}
	return b
}
