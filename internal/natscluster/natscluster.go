// Package natscluster runs a JetStream cluster of nats-server processes on
// loopback for tests: three nodes by default, each with its own store
// directory and free ports (client, cluster routes, HTTP monitoring), and
// the operations a failover test needs: SIGKILL a node, restart it on the
// same store, and wait until the cluster is usable again (a meta leader
// elected, a replicated stream with a leader and current replicas, a
// restarted node caught up).
//
//	c := natscluster.ForTest(t, natscluster.Options{})
//	nc, js := c.JetStream(t)
//	_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "EV", Subjects: []string{"ev.>"}, Replicas: 3})
//	leader, err := c.WaitStream(ctx, "EV")
//	err = c.Kill(leader)
//	...
//	err = c.Restart(ctx, leader)
//
// The servers are separate processes so that a kill is a real SIGKILL:
// no shutdown code runs, unflushed state is lost as in a crash. The binary
// is [Binary]'s: $TXHOOK_NATS_SERVER, or one built from go.mod's
// nats-server version and cached in the user cache directory.
//
// # Leftovers
//
// Each server is a child of the process that started it, in its own
// process group; on Linux it gets SIGKILL when that process dies
// (PR_SET_PDEATHSIG), so a test binary killed by a timeout leaves no
// servers behind. Debian's nats-server on 127.0.0.1:4222 is never used:
// ports come from the kernel's ephemeral range.
package natscluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/txhook/txhook/internal/natstest"
)

// readyTimeout bounds each wait for a node or the cluster, generous for a
// loaded 2-core machine (raft elections, store recovery).
const readyTimeout = 2 * time.Minute

// ClusterName is the NATS cluster's name (cluster.name in each config).
const ClusterName = "txhook"

// Options configure a cluster.
type Options struct {
	// Nodes is the number of servers; default 3. One runs standalone
	// JetStream (no cluster block).
	Nodes int
	// Dir holds one directory per node (n0/, n1/...: its config, store
	// and log); "" makes a temporary one that Close removes.
	Dir string
	// Config is added at the top level of every node's configuration
	// file, after this package's settings (NATS config syntax, e.g.
	// "max_payload: 2MB").
	Config string
	// Logf, if set, receives progress lines (t.Logf for tests).
	Logf func(format string, args ...any)
}

// Cluster is a running JetStream cluster. Its methods are safe for
// concurrent use.
type Cluster struct {
	bin   string
	dir   string
	temp  bool
	extra string
	logf  func(string, ...any)
	nodes []*node
}

type node struct {
	name                  string
	dir                   string
	port, route, httpPort int

	mu       sync.Mutex
	cmd      *exec.Cmd
	done     chan struct{} // closed when cmd has exited
	log      *os.File
	logStart int64 // size of server.log when cmd started
}

// ForTest starts a cluster for t (stores under t.TempDir()), waits until
// every node is healthy, and kills it in t.Cleanup, printing the end of
// each node's log when the test has failed.
func ForTest(t testing.TB, opts Options) *Cluster {
	t.Helper()
	if opts.Logf == nil {
		opts.Logf = t.Logf
	}
	if opts.Dir == "" {
		opts.Dir = t.TempDir()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*readyTimeout)
	defer cancel()
	c, err := Start(ctx, opts)
	if err != nil {
		t.Fatalf("natscluster: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for i := range c.nodes {
				t.Logf("natscluster: end of %s's log (%s):\n%s", c.Name(i), c.LogFile(i), c.logTail(i, 8000))
			}
		}
		if err := c.Close(); err != nil {
			t.Errorf("natscluster: close: %v", err)
		}
	})
	return c
}

// Start starts the nodes and waits until each is healthy (its JetStream
// current with an elected meta leader) and the cluster places a stream
// on every node.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	bin, err := Binary(ctx)
	if err != nil {
		return nil, err
	}
	if opts.Nodes == 0 {
		opts.Nodes = 3
	}
	c := &Cluster{bin: bin, extra: opts.Config, logf: opts.Logf}
	if c.logf == nil {
		c.logf = func(string, ...any) {}
	}
	if opts.Dir == "" {
		d, err := os.MkdirTemp("", "natscluster-")
		if err != nil {
			return nil, fmt.Errorf("natscluster: %w", err)
		}
		c.dir, c.temp = d, true
	} else {
		c.dir = opts.Dir
	}
	for i := range opts.Nodes {
		n := &node{name: fmt.Sprintf("n%d", i), dir: filepath.Join(c.dir, fmt.Sprintf("n%d", i))}
		if err := os.MkdirAll(n.dir, 0o755); err != nil {
			c.Close()
			return nil, fmt.Errorf("natscluster: %w", err)
		}
		c.nodes = append(c.nodes, n)
	}
	// Ports are probed free and then bound by the servers; another process
	// may take one in between, so a start that fails on a port tries
	// again with new ones.
	for attempt := 0; ; attempt++ {
		err = c.startAll(ctx)
		if err == nil {
			break
		}
		c.killAll()
		if !errors.Is(err, errPortTaken) || attempt == 4 {
			c.Close()
			return nil, err
		}
		c.logf("natscluster: %v; retrying with other ports", err)
	}
	for i := range c.nodes {
		if err := c.WaitHealthy(ctx, i); err != nil {
			c.Close()
			return nil, err
		}
	}
	if err := c.waitPlacement(ctx); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// placementProbe names the stream waitPlacement creates and deletes.
const placementProbe = "natscluster_placement_probe"

// waitPlacement waits until the cluster places a stream on every node.
// Healthy nodes are not enough: the meta leader places replicas only on
// servers it has had a statistics update from, which comes a moment
// later, and until then a stream with as many replicas as nodes is
// refused ("no suitable peers for placement, peer offline", seen about
// once in 80 starts on a loaded machine).
func (c *Cluster) waitPlacement(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	nc, err := nats.Connect(c.ClientURL(), nats.Name("natscluster-probe"), nats.MaxReconnects(-1))
	if err != nil {
		return fmt.Errorf("natscluster: connect: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("natscluster: %w", err)
	}
	cfg := jetstream.StreamConfig{Name: placementProbe, Subjects: []string{"_natscluster.placement_probe"},
		Storage: jetstream.MemoryStorage, Replicas: len(c.nodes)}
	tick := time.NewTicker(25 * time.Millisecond)
	defer tick.Stop()
	for {
		rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := js.CreateStream(rctx, cfg)
		rcancel()
		if err == nil {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("natscluster: a stream of %d replicas cannot be placed: %w (last: %v)", len(c.nodes), ctx.Err(), err)
		case <-tick.C:
		}
	}
	for {
		rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
		err := js.DeleteStream(rctx, placementProbe)
		rcancel()
		if err == nil || errors.Is(err, jetstream.ErrStreamNotFound) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("natscluster: deleting the placement probe: %w (last: %v)", ctx.Err(), err)
		case <-tick.C:
		}
	}
}

func (c *Cluster) startAll(ctx context.Context) error {
	ports, err := freePorts(3 * len(c.nodes))
	if err != nil {
		return err
	}
	for i, n := range c.nodes {
		n.port, n.route, n.httpPort = ports[3*i], ports[3*i+1], ports[3*i+2]
	}
	for i := range c.nodes {
		if err := c.writeConfig(i); err != nil {
			return err
		}
	}
	for i := range c.nodes {
		if err := c.start(i); err != nil {
			return err
		}
	}
	for i := range c.nodes {
		if err := c.waitListening(ctx, i); err != nil {
			return err
		}
	}
	return nil
}

// Size is the number of nodes.
func (c *Cluster) Size() int { return len(c.nodes) }

// Name is node i's server name (n0, n1...), as stream and meta leaders
// are reported.
func (c *Cluster) Name(i int) string { return c.nodes[i].name }

// Index returns the index of the node with server name name, or -1.
func (c *Cluster) Index(name string) int {
	for i, n := range c.nodes {
		if n.name == name {
			return i
		}
	}
	return -1
}

// URL is node i's client URL, nats://127.0.0.1:<port>. It stays the same
// across Kill and Restart.
func (c *Cluster) URL(i int) string { return "nats://127.0.0.1:" + strconv.Itoa(c.nodes[i].port) }

// URLs are every node's client URL.
func (c *Cluster) URLs() []string {
	out := make([]string, len(c.nodes))
	for i := range c.nodes {
		out[i] = c.URL(i)
	}
	return out
}

// ClientURL is every node's client URL joined with commas, as
// nats.Connect takes a server list.
func (c *Cluster) ClientURL() string { return strings.Join(c.URLs(), ",") }

// MonitorURL is node i's HTTP monitoring endpoint (/healthz, /jsz...).
func (c *Cluster) MonitorURL(i int) string {
	return "http://127.0.0.1:" + strconv.Itoa(c.nodes[i].httpPort)
}

// Dir is node i's directory: nats.conf, server.log, jetstream/.
func (c *Cluster) Dir(i int) string { return c.nodes[i].dir }

// LogFile is node i's log (stdout and stderr of every run).
func (c *Cluster) LogFile(i int) string { return filepath.Join(c.nodes[i].dir, "server.log") }

// Connect connects to all nodes with natstest.ConnectOptions and then
// opts (so a client follows the cluster through a node's death), and
// closes the connection in t.Cleanup.
func (c *Cluster) Connect(t testing.TB, opts ...nats.Option) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(c.ClientURL(), append(natstest.ConnectOptions(t.Name(), c.logf), opts...)...)
	if err != nil {
		t.Fatalf("natscluster: connect to %s: %v", c.ClientURL(), err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// JetStream connects as Connect does and returns a JetStream context on
// the connection.
func (c *Cluster) JetStream(t testing.TB, opts ...nats.Option) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc := c.Connect(t, opts...)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("natscluster: jetstream: %v", err)
	}
	return nc, js
}

func (c *Cluster) writeConfig(i int) error {
	n := c.nodes[i]
	var routes []string
	for j, o := range c.nodes {
		if j != i {
			routes = append(routes, strconv.Quote("nats-route://127.0.0.1:"+strconv.Itoa(o.route)))
		}
	}
	// One node runs standalone JetStream: a cluster block without routes
	// is refused ("JetStream cluster requires configured routes").
	clusterBlock := ""
	if len(c.nodes) > 1 {
		clusterBlock = fmt.Sprintf("cluster {\n  name: %q\n  listen: \"127.0.0.1:%d\"\n  routes: [%s]\n}", ClusterName, n.route, strings.Join(routes, ", "))
	}
	conf := fmt.Sprintf(`# written by txhook internal/natscluster
server_name: %q
listen: "127.0.0.1:%d"
http: "127.0.0.1:%d"
# Notice dead clients and peers within seconds, not minutes.
ping_interval: "2s"
ping_max: 2
jetstream {
  store_dir: %q
  max_memory_store: 256MB
  max_file_store: 4GB
}
%s
%s
`, n.name, n.port, n.httpPort, filepath.Join(n.dir, "jetstream"), clusterBlock, c.extra)
	if err := os.WriteFile(filepath.Join(n.dir, "nats.conf"), []byte(conf), 0o644); err != nil {
		return fmt.Errorf("natscluster: %w", err)
	}
	return nil
}

// start starts node i's process (not waiting for anything).
func (c *Cluster) start(i int) error {
	n := c.nodes[i]
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd != nil {
		return fmt.Errorf("natscluster: %s already running", n.name)
	}
	logf, err := os.OpenFile(c.LogFile(i), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("natscluster: %w", err)
	}
	start, _ := logf.Seek(0, io.SeekEnd)
	fmt.Fprintf(logf, "\n==== natscluster: start %s %s\n", n.name, time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(c.bin, "-c", filepath.Join(n.dir, "nats.conf"))
	cmd.Dir = n.dir
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = serverProcAttr()
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("natscluster: start %s: %w", c.bin, err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	n.cmd, n.done, n.log, n.logStart = cmd, done, logf, start
	c.logf("natscluster: %s pid %d on %s (routes :%d, monitor :%d)", n.name, cmd.Process.Pid, c.URL(i), n.route, n.httpPort)
	return nil
}

var errPortTaken = errors.New("port in use")

// waitListening waits until node i answers its monitoring endpoint, or
// fails at once if the process exits (errPortTaken if it could not bind).
func (c *Cluster) waitListening(ctx context.Context, i int) error {
	return c.poll(ctx, i, func() (bool, string) {
		code, body, err := c.get(ctx, i, "/healthz?js-server-only=true")
		if err != nil {
			return false, err.Error()
		}
		return code == http.StatusOK, body
	})
}

// poll calls check until it reports done, node i's process exits, or the
// wait times out.
func (c *Cluster) poll(ctx context.Context, i int, check func() (bool, string)) error {
	n := c.nodes[i]
	n.mu.Lock()
	done := n.done
	n.mu.Unlock()
	if done == nil {
		return fmt.Errorf("natscluster: %s is not running", n.name)
	}
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	tick := time.NewTicker(25 * time.Millisecond)
	defer tick.Stop()
	var last string
	for {
		ok, detail := check()
		if ok {
			return nil
		}
		last = detail
		select {
		case <-done:
			n.mu.Lock()
			start := n.logStart
			n.mu.Unlock()
			tail := c.logSince(i, start, 4000)
			if strings.Contains(tail, "address already in use") {
				return fmt.Errorf("natscluster: %s: %w", n.name, errPortTaken)
			}
			c.forget(i)
			return fmt.Errorf("natscluster: %s exited; log:\n%s", n.name, tail)
		case <-ctx.Done():
			return fmt.Errorf("natscluster: %s: %w (last: %s)", n.name, ctx.Err(), last)
		case <-tick.C:
		}
	}
}

// get fetches a monitoring path from node i.
func (c *Cluster) get(ctx context.Context, i int, path string) (int, string, error) {
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodGet, c.MonitorURL(i)+path, nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, string(b), err
}

// WaitHealthy waits until node i's /healthz reports ok: its JetStream has
// contact with a meta leader and is current with it, and every stream and
// consumer replica placed on the node is current. After Restart that
// means the node has caught up.
func (c *Cluster) WaitHealthy(ctx context.Context, i int) error {
	return c.poll(ctx, i, func() (bool, string) {
		code, body, err := c.get(ctx, i, "/healthz")
		if err != nil {
			return false, err.Error()
		}
		return code == http.StatusOK, strings.TrimSpace(body)
	})
}

// WaitMetaLeader waits until a running node reports an elected JetStream
// meta leader and returns that leader's index.
func (c *Cluster) WaitMetaLeader(ctx context.Context) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	tick := time.NewTicker(25 * time.Millisecond)
	defer tick.Stop()
	last := "no node running"
	for {
		for i := range c.nodes {
			if !c.Running(i) {
				continue
			}
			var jsz struct {
				Meta *struct {
					Leader string `json:"leader"`
				} `json:"meta_cluster"`
			}
			code, body, err := c.get(ctx, i, "/jsz")
			if err != nil || code != http.StatusOK {
				last = fmt.Sprintf("%s: %d %v", c.Name(i), code, err)
				continue
			}
			if err := json.Unmarshal([]byte(body), &jsz); err != nil {
				last = fmt.Sprintf("%s: %v", c.Name(i), err)
				continue
			}
			if jsz.Meta == nil || jsz.Meta.Leader == "" {
				last = c.Name(i) + ": no meta leader"
				continue
			}
			if l := c.Index(jsz.Meta.Leader); l >= 0 && c.Running(l) {
				return l, nil
			}
			last = fmt.Sprintf("%s: meta leader %q not running", c.Name(i), jsz.Meta.Leader)
		}
		select {
		case <-ctx.Done():
			return -1, fmt.Errorf("natscluster: no meta leader: %w (last: %s)", ctx.Err(), last)
		case <-tick.C:
		}
	}
}

// WaitStream waits until stream has a leader on a running node, every
// replica on a running node is current (no lag), as the leader reports on
// its monitoring endpoint, and a publish through each running node
// reaches the stream, and returns the leader's index. Use it after
// creating a replicated stream and after a kill or restart.
//
// The last check matters: the leader's interest in the stream's subjects
// reaches the other nodes over their routes a moment after the election,
// and until then a publish through them fails with
// jetstream.ErrNoStreamResponse.
func (c *Cluster) WaitStream(ctx context.Context, stream string) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	conns := map[int]*nats.Conn{}
	defer func() {
		for _, nc := range conns {
			nc.Close()
		}
	}()
	var last string
	for {
		leader, subjects, detail := c.streamReady(ctx, stream)
		if leader >= 0 {
			detail = c.reachable(ctx, conns, subjects)
			if detail == "" {
				return leader, nil
			}
		}
		last = detail
		select {
		case <-ctx.Done():
			return -1, fmt.Errorf("natscluster: stream %s not ready: %w (last: %s)", stream, ctx.Err(), last)
		case <-tick.C:
		}
	}
}

// streamReady returns the index of the running node that leads stream
// with every running replica current, and the stream's subjects; or -1
// and why not.
func (c *Cluster) streamReady(ctx context.Context, stream string) (int, []string, string) {
	why := "no running node holds stream " + stream
	for i := range c.nodes {
		if !c.Running(i) {
			continue
		}
		sd, err := c.streamDetail(ctx, i, stream)
		if err != nil {
			why = err.Error()
			continue
		}
		if sd.Cluster.Leader != c.Name(i) {
			continue // only the leader's view of the replicas counts
		}
		for _, r := range sd.Cluster.Replicas {
			if j := c.Index(r.Name); j >= 0 && c.Running(j) && (!r.Current || r.Offline || r.Lag > 0) {
				return -1, nil, fmt.Sprintf("replica %s current=%v offline=%v lag=%d", r.Name, r.Current, r.Offline, r.Lag)
			}
		}
		var subjects []string
		if sd.Config != nil {
			subjects = sd.Config.Subjects
		}
		return i, subjects, ""
	}
	return -1, nil, why
}

// reachable checks that a publish to each of subjects through each running
// node reaches the stream, and returns "" or why not. The publish carries
// an expected last sequence no stream has, so the stream answers with an
// error and stores nothing.
func (c *Cluster) reachable(ctx context.Context, conns map[int]*nats.Conn, subjects []string) string {
	for i := range c.nodes {
		if !c.Running(i) {
			continue
		}
		nc := conns[i]
		if nc == nil || nc.IsClosed() {
			// Only this node: no reconnect to another, no discovered URLs.
			var err error
			nc, err = nats.Connect(c.URL(i), nats.NoReconnect(), nats.Name("natscluster-probe"))
			if err != nil {
				return fmt.Sprintf("connect to %s: %v", c.Name(i), err)
			}
			conns[i] = nc
		}
		for _, subj := range subjects {
			m := nats.NewMsg(literal(subj))
			m.Header.Set(jetstream.ExpectedLastSeqHeader, "18446744073709551615")
			rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			resp, err := nc.RequestMsgWithContext(rctx, m)
			cancel()
			if err != nil {
				return fmt.Sprintf("publish to %s through %s: %v", m.Subject, c.Name(i), err)
			}
			var r struct {
				Error *struct {
					ErrCode int `json:"err_code"`
				} `json:"error"`
			}
			if json.Unmarshal(resp.Data, &r) != nil || r.Error == nil {
				return fmt.Sprintf("publish to %s through %s: unexpected answer %q", m.Subject, c.Name(i), resp.Data)
			}
		}
	}
	return ""
}

// literal turns a stream subject with wildcards into one subject it
// matches.
func literal(subject string) string {
	toks := strings.Split(subject, ".")
	for i, t := range toks {
		if t == "*" || t == ">" {
			toks[i] = "_natscluster_probe"
		}
	}
	return strings.Join(toks, ".")
}

// streamDetail is the part of /jsz's stream detail this package reads.
type streamDetail struct {
	Name   string `json:"name"`
	Config *struct {
		Subjects []string `json:"subjects"`
	} `json:"config"`
	Cluster struct {
		Leader   string `json:"leader"`
		Replicas []struct {
			Name    string `json:"name"`
			Current bool   `json:"current"`
			Offline bool   `json:"offline"`
			Lag     uint64 `json:"lag"`
		} `json:"replicas"`
	} `json:"cluster"`
	State struct {
		Msgs     uint64 `json:"messages"`
		FirstSeq uint64 `json:"first_seq"`
		LastSeq  uint64 `json:"last_seq"`
	} `json:"state"`
}

// streamDetail reads node i's own view of its replica of stream (in any
// account) from its monitoring endpoint.
func (c *Cluster) streamDetail(ctx context.Context, i int, stream string) (*streamDetail, error) {
	code, body, err := c.get(ctx, i, "/jsz?accounts=true&streams=true&config=true")
	if err != nil {
		return nil, fmt.Errorf("natscluster: %s: %w", c.Name(i), err)
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("natscluster: %s: /jsz: %d %s", c.Name(i), code, body)
	}
	var jsz struct {
		Accounts []struct {
			Streams []streamDetail `json:"stream_detail"`
		} `json:"account_details"`
	}
	if err := json.Unmarshal([]byte(body), &jsz); err != nil {
		return nil, fmt.Errorf("natscluster: %s: /jsz: %w", c.Name(i), err)
	}
	for _, a := range jsz.Accounts {
		for k := range a.Streams {
			if a.Streams[k].Name == stream {
				return &a.Streams[k], nil
			}
		}
	}
	return nil, fmt.Errorf("natscluster: %s holds no replica of stream %s", c.Name(i), stream)
}

// ReplicaState is what one node's replica of a stream holds.
type ReplicaState struct {
	Msgs, FirstSeq, LastSeq uint64
}

// ReplicaState returns what node i's replica of stream holds, from the
// node's own monitoring endpoint: not the leader's view.
func (c *Cluster) ReplicaState(ctx context.Context, i int, stream string) (ReplicaState, error) {
	sd, err := c.streamDetail(ctx, i, stream)
	if err != nil {
		return ReplicaState{}, err
	}
	return ReplicaState{Msgs: sd.State.Msgs, FirstSeq: sd.State.FirstSeq, LastSeq: sd.State.LastSeq}, nil
}

// StreamLeader returns the index of the node leading stream now, asking
// through js.
func (c *Cluster) StreamLeader(ctx context.Context, js jetstream.JetStream, stream string) (int, error) {
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return -1, fmt.Errorf("natscluster: %w", err)
	}
	if ci := s.CachedInfo().Cluster; ci != nil {
		if i := c.Index(ci.Leader); i >= 0 {
			return i, nil
		}
		return -1, fmt.Errorf("natscluster: stream %s has no leader (%q)", stream, ci.Leader)
	}
	return -1, fmt.Errorf("natscluster: stream %s has no cluster info", stream)
}

// Running reports whether node i's process is alive.
func (c *Cluster) Running(i int) bool {
	n := c.nodes[i]
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil {
		return false
	}
	select {
	case <-n.done:
		return false
	default:
		return true
	}
}

// Pid is node i's process id, or 0 when it is not running.
func (c *Cluster) Pid(i int) int {
	n := c.nodes[i]
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil {
		return 0
	}
	return n.cmd.Process.Pid
}

// Kill sends SIGKILL to node i, as a crash would end it, and waits until
// it has exited. Its store stays; Restart starts it again.
func (c *Cluster) Kill(i int) error {
	n := c.nodes[i]
	n.mu.Lock()
	cmd, done := n.cmd, n.done
	n.mu.Unlock()
	if cmd == nil {
		return nil
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	<-done
	c.forget(i)
	c.logf("natscluster: killed %s", n.name)
	return nil
}

// Stop shuts node i down cleanly (SIGTERM: it flushes its store and
// tells its peers), waiting until it has exited; if ctx ends first it is
// killed.
func (c *Cluster) Stop(ctx context.Context, i int) error {
	n := c.nodes[i]
	n.mu.Lock()
	cmd, done := n.cmd, n.done
	n.mu.Unlock()
	if cmd == nil {
		return nil
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-ctx.Done():
		_ = cmd.Process.Signal(syscall.SIGKILL)
		<-done
		c.forget(i)
		return fmt.Errorf("natscluster: stop %s: %w (killed)", n.name, ctx.Err())
	}
	c.forget(i)
	return nil
}

// Restart starts node i again (killing it first if it runs) with the same
// store and ports, and waits until it is healthy, that is caught up with
// the cluster (see WaitHealthy). The port may be held for a moment by
// another process; it retries until it is free.
func (c *Cluster) Restart(ctx context.Context, i int) error {
	if err := c.Kill(i); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	wait := 10 * time.Millisecond
	for {
		if err := c.start(i); err != nil {
			return err
		}
		err := c.waitListening(ctx, i)
		if err == nil {
			break
		}
		_ = c.Kill(i)
		if !errors.Is(err, errPortTaken) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
		wait = min(2*wait, time.Second)
	}
	return c.WaitHealthy(ctx, i)
}

// forget drops node i's exited process.
func (c *Cluster) forget(i int) {
	n := c.nodes[i]
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.done == nil {
		return
	}
	select {
	case <-n.done:
	default:
		return // still running
	}
	n.cmd, n.done = nil, nil
	if n.log != nil {
		n.log.Close()
		n.log = nil
	}
}

func (c *Cluster) killAll() {
	for i := range c.nodes {
		_ = c.Kill(i)
	}
}

// Close kills every node and removes a temporary directory.
func (c *Cluster) Close() error {
	c.killAll()
	if c.temp {
		return os.RemoveAll(c.dir)
	}
	return nil
}

// logSince returns at most the last n bytes node i logged after offset
// start.
func (c *Cluster) logSince(i int, start int64, n int) string {
	b, err := os.ReadFile(c.LogFile(i))
	if err != nil {
		return err.Error()
	}
	if start < int64(len(b)) {
		b = b[start:]
	} else {
		b = nil
	}
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

func (c *Cluster) logTail(i, n int) string {
	b, err := os.ReadFile(c.LogFile(i))
	if err != nil {
		return err.Error()
	}
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// freePorts returns n distinct free TCP ports on 127.0.0.1, never 4222
// (where Debian's own nats-server may run).
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var out []int
	for len(out) < n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("natscluster: free port: %w", err)
		}
		ls = append(ls, l)
		if p := l.Addr().(*net.TCPAddr).Port; p != 4222 {
			out = append(out, p)
		}
	}
	return out, nil
}
