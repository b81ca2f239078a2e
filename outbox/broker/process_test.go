package broker_test

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/internal/testlisten"
	"github.com/txhook/txhook/outbox"
	"github.com/txhook/txhook/outbox/broker"
	"github.com/txhook/txhook/retry"
)

// The test binary doubles as a forwarder or worker process: with
// TXHOOK_TEST_CHILD set to "forwarder" or "worker" it runs one on the
// database and NATS servers its childConfig (TXHOOK_CHILD_CONFIG, JSON)
// names, prints READY once started, and runs until it is killed or sent
// SIGTERM. The crash tests start, kill and restart these.
func TestMain(m *testing.M) {
	if role := os.Getenv(envChild); role != "" {
		os.Exit(runChild(role))
	}
	os.Exit(m.Run())
}

const (
	envChild       = "TXHOOK_TEST_CHILD"
	envChildConfig = "TXHOOK_CHILD_CONFIG"
	// headerWorker names the worker process that sent a request.
	headerWorker = "X-Test-Worker"
)

// childConfig is what a forwarder or worker process runs with.
type childConfig struct {
	ID       string
	Driver   string // "postgres" (lib/pq), "pgx", "sqlite3"...
	DSN      string
	NATS     []string // server URLs, tried in this order (the first is the one it prefers)
	Replicas int

	// Workers.
	RelayLease  time.Duration
	Timeout     time.Duration
	Attempts    int
	RetryBase   time.Duration
	RetryCap    time.Duration
	Concurrency int
	BatchSize   int

	// Forwarders.
	ForwarderLease time.Duration
	SaveInterval   time.Duration
	PollInterval   time.Duration

	// LogLevel is the children's stderr log level (slog's text: "WARN").
	LogLevel string
}

func (c childConfig) brokerConfig(js jetstream.JetStream, log *slog.Logger) broker.Config {
	return broker.Config{
		JetStream: js,
		Replicas:  c.Replicas,
		Relay: outbox.RelayConfig{
			Lease: c.RelayLease, Timeout: c.Timeout, Concurrency: c.Concurrency, BatchSize: c.BatchSize,
			Retry:            retry.Exponential{Base: c.RetryBase, Cap: c.RetryCap, Attempts: c.Attempts},
			BreakerThreshold: -1,
			ID:               c.ID,
			WrapTransport:    func(rt http.RoundTripper) http.RoundTripper { return workerTag{rt, c.ID} },
		},
		Lease: c.ForwarderLease, SaveInterval: c.SaveInterval, PollInterval: c.PollInterval,
		Logger: log,
	}
}

// workerTag adds headerWorker to every request.
type workerTag struct {
	rt http.RoundTripper
	id string
}

func (t workerTag) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	req.Header.Set(headerWorker, t.id)
	return t.rt.RoundTrip(req)
}

// runChild runs a forwarder or worker until SIGTERM; its exit status is 0
// after a clean stop.
func runChild(role string) int {
	var cfg childConfig
	if err := json.Unmarshal([]byte(os.Getenv(envChildConfig)), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "child config:", err)
		return 2
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(cmp(cfg.LogLevel, "WARN"))); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	db, err := sql.Open(cfg.Driver, cfg.DSN)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer db.Close()
	ctx := context.Background()
	ob, err := outbox.New(ctx, db, outbox.Config{Broker: true, AllowHTTP: true, AllowPrivateTargets: true,
		Listener: testlisten.For(cfg.Driver, cfg.DSN), Logger: log})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer ob.Close()
	nc, err := nats.Connect(strings.Join(cfg.NATS, ","), nats.Name(cfg.ID), nats.DontRandomize(),
		nats.RetryOnFailedConnect(true), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond),
		nats.ReconnectJitter(0, 0), nats.Timeout(5*time.Second),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			log.Warn("nats: async error", "error", err)
		}))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	bcfg := cfg.brokerConfig(js, log)

	var start func(context.Context) error
	var stop func(context.Context) error
	switch role {
	case "forwarder":
		f, err := broker.NewForwarder(ob, bcfg)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		start, stop = f.Start, f.Stop
	case "worker":
		w, err := broker.NewWorker(ob, bcfg)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		start, stop = w.Start, w.Stop
	default:
		fmt.Fprintln(os.Stderr, "unknown child role", role)
		return 2
	}
	// A host starts again until JetStream answers: a cluster that lost a
	// node elects new leaders within seconds. (Start's context is the
	// run's: forwarders and workers stop when it ends.)
	deadline := time.Now().Add(2 * time.Minute)
	for {
		err := start(ctx)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			fmt.Fprintln(os.Stderr, "start:", err)
			return 2
		}
		log.Warn("child start failed; retrying", "error", err)
		time.Sleep(200 * time.Millisecond)
	}
	fmt.Println("READY")
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := stop(sctx); err != nil {
		fmt.Fprintln(os.Stderr, "stop:", err)
		return 1
	}
	fmt.Println("STOPPED")
	return 0
}

func cmp(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// proc is a forwarder or worker process.
type proc struct {
	id      string
	cmd     *exec.Cmd
	exited  chan struct{} // closed when the process has exited
	stopped chan struct{} // closed when it printed STOPPED (a clean stop)
}

// childWait bounds how long a child may take to start or stop: a loaded
// machine with a cluster electing leaders is slow.
const childWait = 2 * time.Minute

// spawn starts a child process of role with cfg, its stderr to stderr,
// and waits until it prints READY. It is safe to call from any goroutine.
func spawn(role string, cfg childConfig, stderr io.Writer) (*proc, error) {
	data, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envChild+"="+role, envChildConfig+"="+string(data))
	cmd.Stderr = &prefixWriter{w: stderr, prefix: cfg.ID + ": "}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &proc{id: cfg.ID, cmd: cmd, exited: make(chan struct{}), stopped: make(chan struct{})}
	ready := make(chan error, 1)
	go func() {
		r := bufio.NewReader(out)
		line, err := r.ReadString('\n')
		if err == nil && strings.TrimSpace(line) != "READY" {
			err = fmt.Errorf("unexpected first line %q", line)
		}
		ready <- err
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			if sc.Text() == "STOPPED" {
				close(p.stopped)
			}
		}
		_ = cmd.Wait()
		close(p.exited)
	}()
	select {
	case err := <-ready:
		if err != nil {
			p.kill()
			return nil, fmt.Errorf("%s %s: %w", role, cfg.ID, err)
		}
	case <-time.After(childWait):
		p.kill()
		return nil, fmt.Errorf("%s %s did not start within %s", role, cfg.ID, childWait)
	}
	return p, nil
}

// kill sends SIGKILL (no stop code runs: nothing is released, flushed or
// acknowledged) and waits until the process has exited.
func (p *proc) kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.exited
}

// terminate asks the process to stop cleanly and waits; it reports
// whether the process stopped cleanly in time (it is killed otherwise).
func (p *proc) terminate() error {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(childWait):
		p.kill()
		return fmt.Errorf("%s did not stop within %s", p.id, childWait)
	}
	select {
	case <-p.stopped:
		return nil
	default:
		return fmt.Errorf("%s exited without a clean stop: %v", p.id, p.cmd.ProcessState)
	}
}

// prefixWriter writes each line to w with a prefix.
type prefixWriter struct {
	w      io.Writer
	prefix string
	mu     sync.Mutex
	part   []byte
}

func (p *prefixWriter) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.part = append(p.part, b...)
	for {
		i := bytes.IndexByte(p.part, '\n')
		if i < 0 {
			return len(b), nil
		}
		if _, err := fmt.Fprintf(p.w, "%s%s\n", p.prefix, p.part[:i]); err != nil {
			return 0, err
		}
		p.part = p.part[i+1:]
	}
}

// logBuffer keeps what children log, for the assertions and for a failed
// test's output.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(b)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// tail returns at most the last n bytes logged.
func (l *logBuffer) tail(n int) string {
	s := l.String()
	if len(s) > n {
		s = s[len(s)-n:]
	}
	return s
}

// childDriver returns the driver a child of db uses: the slot's choice
// on PostgreSQL (pgx for odd slots, lib/pq for even ones), db's own
// otherwise.
func childDriver(db *testdb.DB, slot int) string {
	if !db.Backend.Postgres() {
		return db.Backend.Driver
	}
	if slot%2 == 1 {
		return testdb.PGX.Driver
	}
	return testdb.LibPQ.Driver
}
