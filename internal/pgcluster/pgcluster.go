// Package pgcluster starts throwaway PostgreSQL clusters for tests and
// benchmarks: initdb into a temporary directory, a server on a free
// loopback port, streaming replicas made with pg_basebackup, and the
// operations a failover test needs (stop, kill -9, restart, promote).
//
// Tests call [ForTest], which skips with a message when the PostgreSQL
// server binaries are not installed (TXHOOK_REQUIRE_FAILOVER=1 turns the
// skip into a failure) and stops the cluster in t.Cleanup. Programs call
// [Start] and [Cluster.Close].
//
//	c := pgcluster.ForTest(t, pgcluster.Options{Settings: pgcluster.Production()})
//	db, err := sql.Open("pgx", c.DSN("postgres"))
//
// The binaries are looked up in $TXHOOK_PG_BIN, then in the newest
// /usr/lib/postgresql/<version>/bin, then on $PATH.
//
// # Running as root
//
// PostgreSQL refuses to run as root. When the process is root, initdb,
// pg_basebackup and the server run as the "postgres" OS user (setuid in
// the child, as runuser would), and the cluster's directory is owned by
// it. A non-root process runs them as itself.
//
// # Leftovers
//
// The server is a child of the process that started it; on Linux it gets
// SIGKILL when that process dies (PR_SET_PDEATHSIG), and its backends
// notice the postmaster's death and exit. A temporary cluster's directory
// (os.TempDir()/pgcluster-*) also holds owner.pid, the starting process's
// id: each [Start] removes the directories whose owner is gone, after
// killing any server still running in them (its pid from postmaster.pid,
// checked against /proc to be a postgres process), so a test killed
// mid-way does not leave servers or disk behind for long.
package pgcluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// EnvRequire, set to 1, makes [ForTest] fail instead of skipping when the
// PostgreSQL server binaries are missing. CI sets it.
const EnvRequire = "TXHOOK_REQUIRE_FAILOVER"

// EnvBin names a directory holding initdb, postgres and pg_basebackup,
// searched before /usr/lib/postgresql/*/bin.
const EnvBin = "TXHOOK_PG_BIN"

// ErrNoBinaries reports that initdb, postgres or pg_basebackup was not
// found.
var ErrNoBinaries = errors.New("pgcluster: PostgreSQL server binaries (initdb, postgres, pg_basebackup) not found")

// startTimeout bounds how long a server may take to accept connections,
// generous for a loaded machine (crash recovery included).
const startTimeout = 120 * time.Second

// Options configure a cluster.
type Options struct {
	// Settings are postgresql.conf parameters, added after the base
	// settings (listen on 127.0.0.1 only, the port, no Unix socket,
	// replication allowed) so they override them. Values are written
	// quoted: "256MB", "on", "0.9". See [Production].
	Settings map[string]string
	// Port is the TCP port on 127.0.0.1; 0 picks a free one.
	Port int
	// Dir is the cluster's directory (data/ and server.log inside it);
	// "" makes a temporary one that Close removes. A given Dir is kept.
	Dir string
	// Logf, if set, receives progress lines (t.Logf for tests).
	Logf func(format string, args ...any)
}

// ReplicaOptions configure a streaming replica made by [Cluster.Replica].
type ReplicaOptions struct {
	// Name is the standby's name: its replication slot on the primary and
	// its application_name (cluster_name), the name that
	// synchronous_standby_names lists. Default "replica".
	Name string
	// Synchronous adds Name to the primary's synchronous_standby_names,
	// so with synchronous_commit = on (the default) a commit on the
	// primary returns only once the replica has flushed it.
	Synchronous bool
	// Settings, Port, Dir and Logf are as in [Options]; the replica also
	// gets the primary's settings (pg_basebackup copies its
	// postgresql.conf).
	Settings map[string]string
	Port     int
	Dir      string
	Logf     func(format string, args ...any)
}

// Cluster is one running (or stopped) PostgreSQL cluster. Its methods are
// safe for concurrent use.
type Cluster struct {
	bin      string
	dir      string
	temp     bool
	port     int
	settings map[string]string
	logf     func(string, ...any)
	cred     *syscall.Credential // nil: run as this process's user

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
	log  *os.File
}

// Production returns the settings benchmarks run with: what a production
// server of a small machine would have, autovacuum included (the machine's
// test server has it off). txhook's own per-table autovacuum settings come
// from its migrations and so apply on any cluster.
func Production() map[string]string {
	return map[string]string{
		"autovacuum":                   "on",
		"shared_buffers":               "256MB",
		"effective_cache_size":         "1GB",
		"work_mem":                     "8MB",
		"maintenance_work_mem":         "128MB",
		"max_connections":              "200",
		"wal_level":                    "replica",
		"synchronous_commit":           "on",
		"fsync":                        "on",
		"full_page_writes":             "on",
		"wal_compression":              "off",
		"checkpoint_timeout":           "5min",
		"checkpoint_completion_target": "0.9",
		"max_wal_size":                 "2GB",
		"min_wal_size":                 "256MB",
		"random_page_cost":             "1.1",
		"log_checkpoints":              "on",
		"log_autovacuum_min_duration":  "1s",
		"log_min_duration_statement":   "1s",
		"log_line_prefix":              "%m [%p] %q%u@%d ",
	}
}

// Available returns the directory holding the server binaries, or
// ErrNoBinaries.
func Available() (string, error) {
	has := func(dir string) bool {
		for _, b := range []string{"initdb", "postgres", "pg_basebackup"} {
			if fi, err := os.Stat(filepath.Join(dir, b)); err != nil || fi.IsDir() {
				return false
			}
		}
		return true
	}
	if d := os.Getenv(EnvBin); d != "" {
		if has(d) {
			return d, nil
		}
		return "", fmt.Errorf("%w in %s=%s", ErrNoBinaries, EnvBin, d)
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return versionOf(dirs[i]) > versionOf(dirs[j]) })
	for _, d := range dirs {
		if has(d) {
			return d, nil
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil && has(filepath.Dir(p)) {
		return filepath.Dir(p), nil
	}
	return "", ErrNoBinaries
}

func versionOf(binDir string) float64 {
	v, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(binDir)), 64)
	return v
}

// ForTest starts a cluster for t and stops and removes it in t.Cleanup.
// Without the server binaries it skips t, or fails it when
// TXHOOK_REQUIRE_FAILOVER=1.
func ForTest(t testing.TB, opts Options) *Cluster {
	t.Helper()
	skipWithoutBinaries(t)
	if opts.Logf == nil {
		opts.Logf = t.Logf
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*startTimeout)
	defer cancel()
	c, err := Start(ctx, opts)
	if err != nil {
		t.Fatalf("pgcluster: %v", err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("pgcluster: close: %v", err)
		}
	})
	return c
}

// ReplicaForTest is [Cluster.Replica] for t: the replica is closed in
// t.Cleanup (before the primary, which was registered earlier).
func (c *Cluster) ReplicaForTest(t testing.TB, opts ReplicaOptions) *Cluster {
	t.Helper()
	if opts.Logf == nil {
		opts.Logf = t.Logf
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*startTimeout)
	defer cancel()
	r, err := c.Replica(ctx, opts)
	if err != nil {
		t.Fatalf("pgcluster: replica: %v", err)
	}
	t.Cleanup(func() {
		if err := r.Close(); err != nil {
			t.Errorf("pgcluster: close replica: %v", err)
		}
	})
	return r
}

func skipWithoutBinaries(t testing.TB) {
	t.Helper()
	if _, err := Available(); err != nil {
		if os.Getenv(EnvRequire) == "1" {
			t.Fatalf("%v, and %s=1", err, EnvRequire)
		}
		t.Skipf("%v: install postgresql (Debian: apt-get install postgresql) or set %s; skipping", err, EnvBin)
	}
}

// Start creates a cluster with initdb (superuser "postgres", trust
// authentication on loopback, replication allowed) and starts it.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	bin, err := Available()
	if err != nil {
		return nil, err
	}
	c, err := newCluster(bin, opts.Dir, opts.Port, opts.Logf)
	if err != nil {
		return nil, err
	}
	if err := c.run(ctx, "initdb", "-D", c.DataDir(), "-U", "postgres", "--auth=trust",
		"--encoding=UTF8", "--locale=C", "--no-sync"); err != nil {
		c.removeTemp()
		return nil, err
	}
	if err := c.configure(opts.Settings); err != nil {
		c.removeTemp()
		return nil, err
	}
	if err := c.startWithPortRetry(ctx, opts.Port == 0); err != nil {
		c.removeTemp()
		return nil, err
	}
	return c, nil
}

func newCluster(bin, dir string, port int, logf func(string, ...any)) (*Cluster, error) {
	c := &Cluster{bin: bin, port: port, logf: logf}
	if c.logf == nil {
		c.logf = func(string, ...any) {}
	}
	cred, err := serverCredential()
	if err != nil {
		return nil, err
	}
	c.cred = cred
	if dir == "" {
		reapOrphans()
		d, err := os.MkdirTemp("", "pgcluster-")
		if err != nil {
			return nil, fmt.Errorf("pgcluster: %w", err)
		}
		c.dir, c.temp = d, true
		if err := os.WriteFile(filepath.Join(d, "owner.pid"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
			os.RemoveAll(d)
			return nil, fmt.Errorf("pgcluster: %w", err)
		}
	} else {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("pgcluster: %w", err)
		}
		c.dir = dir
	}
	if c.cred != nil {
		// The server user must be able to create data/ here.
		if err := os.Chmod(c.dir, 0o755); err != nil {
			return nil, fmt.Errorf("pgcluster: %w", err)
		}
		if err := os.Chown(c.dir, int(c.cred.Uid), int(c.cred.Gid)); err != nil {
			return nil, fmt.Errorf("pgcluster: %w", err)
		}
	}
	if c.port == 0 {
		p, err := freePort()
		if err != nil {
			return nil, err
		}
		c.port = p
	}
	return c, nil
}

// Dir is the cluster's directory: data/, server.log, owner.pid.
func (c *Cluster) Dir() string { return c.dir }

// DataDir is the PostgreSQL data directory.
func (c *Cluster) DataDir() string { return filepath.Join(c.dir, "data") }

// LogFile is the server's log (its stderr).
func (c *Cluster) LogFile() string { return filepath.Join(c.dir, "server.log") }

// Host is the address the server listens on.
func (c *Cluster) Host() string { return "127.0.0.1" }

// Port is the server's TCP port.
func (c *Cluster) Port() int { return c.port }

// Settings returns the postgresql.conf parameters this package wrote
// (base settings and Options.Settings), for a report to print.
func (c *Cluster) Settings() map[string]string {
	m := make(map[string]string, len(c.settings))
	for k, v := range c.settings {
		m[k] = v
	}
	return m
}

// DSN returns a URL DSN for database db as the superuser "postgres",
// usable by lib/pq and pgx.
func (c *Cluster) DSN(db string) string {
	return MultiHostDSN(db, c)
}

// KeywordDSN returns a keyword/value DSN ("host=... port=...") for db.
func (c *Cluster) KeywordDSN(db string) string {
	return MultiHostKeywordDSN(db, c)
}

// MultiHostDSN returns a URL DSN listing every cluster's host:port in
// order, with target_session_attrs=read-write when there are several, so
// a client connects to whichever of them is the primary.
func MultiHostDSN(db string, cs ...*Cluster) string {
	hosts := make([]string, len(cs))
	for i, c := range cs {
		hosts[i] = net.JoinHostPort(c.Host(), strconv.Itoa(c.port))
	}
	q := url.Values{"sslmode": {"disable"}}
	if len(cs) > 1 {
		q.Set("target_session_attrs", "read-write")
	}
	return "postgres://postgres@" + strings.Join(hosts, ",") + "/" + url.PathEscape(db) + "?" + q.Encode()
}

// MultiHostKeywordDSN is [MultiHostDSN] in keyword/value form:
// host=a,b port=p,q.
func MultiHostKeywordDSN(db string, cs ...*Cluster) string {
	hosts := make([]string, len(cs))
	ports := make([]string, len(cs))
	for i, c := range cs {
		hosts[i], ports[i] = c.Host(), strconv.Itoa(c.port)
	}
	s := fmt.Sprintf("host=%s port=%s user=postgres dbname=%s sslmode=disable",
		strings.Join(hosts, ","), strings.Join(ports, ","), quoteKeyword(db))
	if len(cs) > 1 {
		s += " target_session_attrs=read-write"
	}
	return s
}

func quoteKeyword(v string) string {
	if v != "" && !strings.ContainsAny(v, ` '\`) {
		return v
	}
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(v) + "'"
}

// Exec runs SQL statements on database db as the superuser.
func (c *Cluster) Exec(ctx context.Context, db string, sql string, args ...any) error {
	conn, err := pgx.Connect(ctx, c.DSN(db))
	if err != nil {
		return fmt.Errorf("pgcluster: connect to port %d: %w", c.port, err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, sql, args...); err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	return nil
}

// CreateDatabase creates database name.
func (c *Cluster) CreateDatabase(ctx context.Context, name string) error {
	return c.Exec(ctx, "postgres", "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
}

// Setting is one server parameter: its value as SHOW prints it ("256MB")
// and where it came from (pg_settings.source).
type Setting struct {
	Name, Value, Source string
}

// String formats s as name=value.
func (s Setting) String() string { return s.Name + "=" + s.Value }

// ShowSettings returns the parameters the running server has from
// somewhere other than its built-in defaults (configuration file, ALTER
// SYSTEM, command line), sorted by name: what a benchmark report prints.
func (c *Cluster) ShowSettings(ctx context.Context) ([]Setting, error) {
	conn, err := pgx.Connect(ctx, c.DSN("postgres"))
	if err != nil {
		return nil, fmt.Errorf("pgcluster: %w", err)
	}
	defer conn.Close(context.Background())
	rows, err := conn.Query(ctx, `SELECT name, current_setting(name), source FROM pg_settings
		WHERE source NOT IN ('default', 'override', 'client', 'session') ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("pgcluster: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Setting, error) {
		var s Setting
		err := r.Scan(&s.Name, &s.Value, &s.Source)
		return s, err
	})
	if err != nil {
		return nil, fmt.Errorf("pgcluster: %w", err)
	}
	return out, nil
}

// configure appends the base settings and extra to postgresql.conf; later
// lines override earlier ones.
func (c *Cluster) configure(extra map[string]string) error {
	base := map[string]string{
		"listen_addresses":        "127.0.0.1",
		"port":                    strconv.Itoa(c.port),
		"unix_socket_directories": "",
		"max_wal_senders":         "10",
		"max_replication_slots":   "10",
		"wal_level":               "replica",
		"hot_standby":             "on",
	}
	if c.settings == nil {
		c.settings = map[string]string{}
	}
	for k, v := range base {
		c.settings[k] = v
	}
	for k, v := range extra {
		if k == "port" {
			continue // the cluster's port is Options.Port
		}
		c.settings[k] = v
	}
	return c.writeSettings()
}

func (c *Cluster) writeSettings() error {
	keys := make([]string, 0, len(c.settings))
	for k := range c.settings {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	b.WriteString("\n# written by txhook internal/pgcluster\n")
	for _, k := range keys {
		fmt.Fprintf(&b, "%s = '%s'\n", k, strings.ReplaceAll(c.settings[k], "'", "''"))
	}
	f, err := os.OpenFile(filepath.Join(c.DataDir(), "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	if _, err := f.WriteString(b.String()); err != nil {
		f.Close()
		return fmt.Errorf("pgcluster: %w", err)
	}
	return f.Close()
}

// run runs one of the PostgreSQL programs as the server user and waits.
func (c *Cluster) run(ctx context.Context, prog string, args ...string) error {
	cmd := exec.CommandContext(ctx, filepath.Join(c.bin, prog), args...)
	cmd.Dir = c.dir
	cmd.Env = append(os.Environ(), "LC_ALL=C", "TZ=UTC")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("pgcluster: %s: %w\n%s", prog, err, out)
	}
	return nil
}

func (c *Cluster) startWithPortRetry(ctx context.Context, mayMove bool) error {
	for attempt := 0; ; attempt++ {
		err := c.start(ctx)
		if err == nil || !mayMove || attempt == 4 || !errors.Is(err, errPortTaken) {
			return err
		}
		// Another process took the free port between our probe and the
		// server's bind: pick another.
		p, perr := freePort()
		if perr != nil {
			return perr
		}
		c.port = p
		c.settings["port"] = strconv.Itoa(p)
		if err := c.writeSettings(); err != nil {
			return err
		}
	}
}

var errPortTaken = errors.New("port in use")

// start starts the postmaster and waits until it accepts connections.
func (c *Cluster) start(ctx context.Context) error {
	c.mu.Lock()
	if c.cmd != nil {
		c.mu.Unlock()
		return fmt.Errorf("pgcluster: server on port %d already running", c.port)
	}
	logf, err := os.OpenFile(c.LogFile(), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		c.mu.Unlock()
		return fmt.Errorf("pgcluster: %w", err)
	}
	before, _ := logf.Seek(0, 2)
	cmd := exec.Command(filepath.Join(c.bin, "postgres"), "-D", c.DataDir())
	cmd.Dir = c.dir
	cmd.Env = append(os.Environ(), "LC_ALL=C", "TZ=UTC")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = serverProcAttr(c.cred)
	if err := cmd.Start(); err != nil {
		c.mu.Unlock()
		logf.Close()
		return fmt.Errorf("pgcluster: start postgres: %w", err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	c.cmd, c.done, c.log = cmd, done, logf
	c.mu.Unlock()
	c.logf("pgcluster: postgres pid %d on 127.0.0.1:%d, data %s", cmd.Process.Pid, c.port, c.DataDir())

	if err := c.waitReady(ctx, done); err != nil {
		_ = c.signal(syscall.SIGKILL)
		<-done
		c.forget(cmd)
		tail := c.logSince(before)
		if strings.Contains(tail, "could not bind") || strings.Contains(tail, "Address already in use") {
			return fmt.Errorf("pgcluster: port %d: %w", c.port, errPortTaken)
		}
		return fmt.Errorf("pgcluster: server on port %d did not start: %w\nlog:\n%s", c.port, err, tail)
	}
	return nil
}

func (c *Cluster) logSince(off int64) string {
	b, err := os.ReadFile(c.LogFile())
	if err != nil || off > int64(len(b)) {
		return ""
	}
	b = b[off:]
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// waitReady polls until the server answers a query or exits.
func (c *Cluster) waitReady(ctx context.Context, done <-chan struct{}) error {
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
		conn, err := pgx.Connect(cctx, c.DSN("postgres"))
		if err == nil {
			err = conn.Ping(cctx)
			conn.Close(context.Background())
		}
		ccancel()
		if err == nil {
			return nil
		}
		last = err
		select {
		case <-done:
			return errors.New("postgres exited")
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), last)
		case <-tick.C:
		}
	}
}

func (c *Cluster) forget(cmd *exec.Cmd) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cmd == cmd {
		c.cmd, c.done = nil, nil
		if c.log != nil {
			c.log.Close()
			c.log = nil
		}
	}
}

// signal sends sig to the postmaster's process group: the postmaster and
// every backend it forked.
func (c *Cluster) signal(sig syscall.Signal) error {
	c.mu.Lock()
	cmd := c.cmd
	c.mu.Unlock()
	if cmd == nil {
		return nil
	}
	if sig == syscall.SIGKILL {
		return syscall.Kill(-cmd.Process.Pid, sig)
	}
	return cmd.Process.Signal(sig)
}

// Running reports whether the server process is alive.
func (c *Cluster) Running() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cmd == nil {
		return false
	}
	select {
	case <-c.done:
		return false
	default:
		return true
	}
}

// Stop shuts the server down ("fast": open transactions roll back) and
// waits for it to exit. The data directory stays; Restart starts it again.
func (c *Cluster) Stop(ctx context.Context) error {
	c.mu.Lock()
	cmd, done := c.cmd, c.done
	c.mu.Unlock()
	if cmd == nil {
		return nil
	}
	_ = cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-done:
	case <-ctx.Done():
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
		c.forget(cmd)
		return fmt.Errorf("pgcluster: stop: %w (killed)", ctx.Err())
	}
	c.forget(cmd)
	return nil
}

// Kill sends SIGKILL to the postmaster and all its backends at once, as a
// crash of the host would end them, and waits until the postmaster has
// exited. Open connections see their socket closed. The data directory
// stays; Restart runs crash recovery.
func (c *Cluster) Kill() error {
	c.mu.Lock()
	cmd, done := c.cmd, c.done
	c.mu.Unlock()
	if cmd == nil {
		return nil
	}
	if err := syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("pgcluster: kill: %w", err)
	}
	<-done
	c.forget(cmd)
	return nil
}

// Restart starts a stopped or killed server again (stopping it first if
// it runs) and waits until it accepts connections.
func (c *Cluster) Restart(ctx context.Context) error {
	if err := c.Stop(ctx); err != nil {
		return err
	}
	return c.start(ctx)
}

// Promote turns a replica into a primary and waits until it accepts
// writes.
func (c *Cluster) Promote(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, c.DSN("postgres"))
	if err != nil {
		return fmt.Errorf("pgcluster: promote: %w", err)
	}
	defer conn.Close(context.Background())
	var ok bool
	if err := conn.QueryRow(ctx, "SELECT pg_promote(true, $1)", int(startTimeout/time.Second)).Scan(&ok); err != nil {
		return fmt.Errorf("pgcluster: promote: %w", err)
	}
	if !ok {
		return fmt.Errorf("pgcluster: promote: server on port %d did not leave recovery in %s", c.port, startTimeout)
	}
	c.logf("pgcluster: promoted 127.0.0.1:%d", c.port)
	return nil
}

// InRecovery reports whether the server is a standby.
func (c *Cluster) InRecovery(ctx context.Context) (bool, error) {
	conn, err := pgx.Connect(ctx, c.DSN("postgres"))
	if err != nil {
		return false, fmt.Errorf("pgcluster: %w", err)
	}
	defer conn.Close(context.Background())
	var r bool
	if err := conn.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&r); err != nil {
		return false, fmt.Errorf("pgcluster: %w", err)
	}
	return r, nil
}

// Replica makes a streaming replica of c with pg_basebackup -R (using a
// physical replication slot named opts.Name, created on c), starts it and
// waits until c reports it streaming (and, when opts.Synchronous, as a
// synchronous standby). c must be running.
func (c *Cluster) Replica(ctx context.Context, opts ReplicaOptions) (*Cluster, error) {
	if opts.Name == "" {
		opts.Name = "replica"
	}
	for _, r := range opts.Name {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_') {
			return nil, fmt.Errorf("pgcluster: replica name %q: use lower-case letters, digits and _", opts.Name)
		}
	}
	if opts.Logf == nil {
		opts.Logf = c.logf
	}
	r, err := newCluster(c.bin, opts.Dir, opts.Port, opts.Logf)
	if err != nil {
		return nil, err
	}
	if err := c.Exec(ctx, "postgres", "SELECT pg_create_physical_replication_slot($1)", opts.Name); err != nil {
		r.removeTemp()
		return nil, err
	}
	if err := r.run(ctx, "pg_basebackup", "-D", r.DataDir(), "-h", c.Host(), "-p", strconv.Itoa(c.port),
		"-U", "postgres", "-R", "-S", opts.Name, "-X", "stream", "-c", "fast", "--no-sync"); err != nil {
		r.removeTemp()
		return nil, err
	}
	// A standby must not wait for standbys of its own once promoted:
	// drop what ALTER SYSTEM wrote on the primary and the backup copied.
	if err := r.dropAutoConf("synchronous_standby_names"); err != nil {
		r.removeTemp()
		return nil, err
	}
	r.settings = c.Settings()
	delete(r.settings, "synchronous_standby_names")
	extra := map[string]string{"cluster_name": opts.Name}
	for k, v := range opts.Settings {
		extra[k] = v
	}
	if err := r.configure(extra); err != nil {
		r.removeTemp()
		return nil, err
	}
	if opts.Synchronous {
		if err := c.addSyncStandby(ctx, opts.Name); err != nil {
			r.removeTemp()
			return nil, err
		}
	}
	if err := r.startWithPortRetry(ctx, opts.Port == 0); err != nil {
		r.removeTemp()
		return nil, err
	}
	if err := c.waitStreaming(ctx, opts.Name, opts.Synchronous); err != nil {
		_ = r.Close()
		return nil, err
	}
	return r, nil
}

func (c *Cluster) addSyncStandby(ctx context.Context, name string) error {
	conn, err := pgx.Connect(ctx, c.DSN("postgres"))
	if err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	defer conn.Close(context.Background())
	var cur string
	if err := conn.QueryRow(ctx, "SHOW synchronous_standby_names").Scan(&cur); err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	names := name
	if cur != "" {
		// Any one of the listed standbys confirms a commit.
		names = "ANY 1 (" + strings.TrimSuffix(strings.TrimPrefix(cur, "ANY 1 ("), ")") + ", " + name + ")"
	}
	if _, err := conn.Exec(ctx, "ALTER SYSTEM SET synchronous_standby_names = "+quoteLiteral(names)); err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	if _, err := conn.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	c.mu.Lock()
	c.settings["synchronous_standby_names"] = names
	c.mu.Unlock()
	return nil
}

// dropAutoConf removes parameter name from postgresql.auto.conf.
func (c *Cluster) dropAutoConf(name string) error {
	p := filepath.Join(c.DataDir(), "postgresql.auto.conf")
	b, err := os.ReadFile(p)
	if err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	var keep []string
	for _, line := range strings.SplitAfter(string(b), "\n") {
		if k, _, ok := strings.Cut(line, "="); ok && strings.TrimSpace(k) == name {
			continue
		}
		keep = append(keep, line)
	}
	if err := os.WriteFile(p, []byte(strings.Join(keep, "")), 0o600); err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	return nil
}

func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// waitStreaming waits until pg_stat_replication on c lists name as
// streaming (and sync, if sync).
func (c *Cluster) waitStreaming(ctx context.Context, name string, sync bool) error {
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.DSN("postgres"))
	if err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	defer conn.Close(context.Background())
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		var state, syncState string
		err := conn.QueryRow(ctx, `SELECT state, sync_state FROM pg_stat_replication WHERE application_name = $1`,
			name).Scan(&state, &syncState)
		if err == nil && state == "streaming" && (!sync || syncState == "sync" || syncState == "quorum") {
			return nil
		}
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("pgcluster: %w", err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pgcluster: replica %q not streaming (state %q, sync_state %q): %w", name, state, syncState, ctx.Err())
		case <-tick.C:
		}
	}
}

// Close stops the server (killing it if a fast shutdown takes more than a
// minute) and removes a temporary directory.
func (c *Cluster) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := c.Stop(ctx)
	c.removeTemp()
	return err
}

func (c *Cluster) removeTemp() {
	if c.temp {
		_ = os.RemoveAll(c.dir)
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pgcluster: free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// reapOrphans removes temporary clusters whose owner process is gone,
// killing their server first.
func reapOrphans() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), "pgcluster-*"))
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(d, "owner.pid"))
		if err != nil {
			continue
		}
		owner, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || owner <= 0 || processAlive(owner) {
			continue
		}
		if pb, err := os.ReadFile(filepath.Join(d, "data", "postmaster.pid")); err == nil {
			line, _, _ := strings.Cut(string(pb), "\n")
			if pid, err := strconv.Atoi(strings.TrimSpace(line)); err == nil && pid > 0 && isPostgres(pid) {
				_ = syscall.Kill(-pid, syscall.SIGKILL)
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		_ = os.RemoveAll(d)
	}
}

func processAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

func isPostgres(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	return err == nil && strings.HasPrefix(strings.TrimSpace(string(b)), "postgres")
}
