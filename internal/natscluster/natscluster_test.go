package natscluster_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/txhook/txhook/internal/natscluster"
)

// TestKillStreamLeaderLosesNothingAcked publishes to an R3 stream without
// pause, SIGKILLs the stream's leader, keeps publishing through the
// failover (each message retried with its Nats-Msg-Id until acknowledged),
// restarts the killed node on its store, and checks that every
// acknowledged message is in the stream exactly once, on every replica,
// the restarted one included.
func TestKillStreamLeaderLosesNothingAcked(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	c := natscluster.ForTest(t, natscluster.Options{})
	if c.Size() != 3 {
		t.Fatalf("Size %d, want 3", c.Size())
	}
	for _, u := range c.URLs() {
		if !strings.HasPrefix(u, "nats://127.0.0.1:") || strings.HasSuffix(u, ":4222") {
			t.Fatalf("client URL %s: want a free port on 127.0.0.1, never 4222", u)
		}
	}
	meta, err := c.WaitMetaLeader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("meta leader %s", c.Name(meta))
	_, js := c.JetStream(t)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: "EV", Subjects: []string{"ev.>"}, Replicas: 3, Storage: jetstream.FileStorage,
		Duplicates: 10 * time.Minute,
	}); err != nil {
		t.Fatal(err)
	}
	leader, err := c.WaitStream(ctx, "EV")
	if err != nil {
		t.Fatal(err)
	}

	var (
		mu      sync.Mutex
		acked   []int
		retries int
	)
	ackedCount := func() int { mu.Lock(); defer mu.Unlock(); return len(acked) }
	stop := make(chan struct{})
	pubDone := make(chan error, 1)
	go func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				pubDone <- nil
				return
			default:
			}
			for attempt := 0; ; attempt++ {
				pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
				ack, err := js.Publish(pctx, "ev."+strconv.Itoa(i%7), []byte(strconv.Itoa(i)),
					jetstream.WithMsgID(strconv.Itoa(i)))
				pcancel()
				if err == nil {
					mu.Lock()
					if attempt == 0 && ack.Duplicate {
						mu.Unlock()
						pubDone <- fmt.Errorf("first publish of %d acked as duplicate", i)
						return
					}
					acked = append(acked, i)
					retries += attempt
					mu.Unlock()
					break
				}
				if ctx.Err() != nil {
					pubDone <- fmt.Errorf("publish %d: %w", i, err)
					return
				}
			}
		}
	}()
	waitUntil(t, ctx, func() bool { return ackedCount() >= 200 }, "200 acknowledged publishes")

	if err := c.Kill(leader); err != nil {
		t.Fatal(err)
	}
	if c.Running(leader) || c.Pid(leader) != 0 {
		t.Fatalf("%s still running after Kill", c.Name(leader))
	}
	killedAt := ackedCount()
	t.Logf("killed stream leader %s after %d acknowledged publishes", c.Name(leader), killedAt)
	newLeader, err := c.WaitStream(ctx, "EV")
	if err != nil {
		t.Fatal(err)
	}
	if newLeader == leader {
		t.Fatalf("stream leader after the kill is the killed node %s", c.Name(leader))
	}
	waitUntil(t, ctx, func() bool { return ackedCount() >= killedAt+200 }, "200 publishes acknowledged after the kill")

	if err := c.Restart(ctx, leader); err != nil {
		t.Fatal(err)
	}
	restartedAt := ackedCount()
	waitUntil(t, ctx, func() bool { return ackedCount() >= restartedAt+100 }, "100 publishes acknowledged after the restart")
	close(stop)
	if err := <-pubDone; err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitStream(ctx, "EV"); err != nil {
		t.Fatal(err)
	}

	mu.Lock()
	want := append([]int(nil), acked...)
	t.Logf("%d acknowledged, %d retried publishes (timeouts during the failover)", len(want), retries)
	mu.Unlock()

	// Every acknowledged ID exactly once, read from the stream's leader.
	got := map[int]int{}
	cons, err := js.OrderedConsumer(ctx, "EV", jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(ctx, "EV")
	if err != nil {
		t.Fatal(err)
	}
	total := st.CachedInfo().State.Msgs
	for n := uint64(0); n < total; {
		batch, err := cons.Fetch(500, jetstream.FetchMaxWait(10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for m := range batch.Messages() {
			id, err := strconv.Atoi(m.Headers().Get(jetstream.MsgIDHeader))
			if err != nil {
				t.Fatalf("message without a numeric Nats-Msg-Id: %v", m.Headers())
			}
			got[id]++
			n++
		}
		if err := batch.Error(); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range want {
		if got[id] != 1 {
			t.Errorf("acknowledged message %d stored %d times, want 1", id, got[id])
		}
	}
	// The publisher stops only after its current message is acknowledged,
	// and retries carry the same ID: nothing stored beyond what was acked.
	if total != uint64(len(want)) {
		t.Errorf("stream holds %d messages, %d acknowledged", total, len(want))
	}
	// Every replica, the restarted one included, holds the same.
	for i := range c.Size() {
		rs, err := c.ReplicaState(ctx, i, "EV")
		if err != nil {
			t.Fatal(err)
		}
		if rs.Msgs != total {
			t.Errorf("%s's replica holds %d messages, the leader %d", c.Name(i), rs.Msgs, total)
		}
	}
}

// TestStopAndRestartNode stops a node cleanly, checks the others still
// serve an R3 stream (2 of 3 is a quorum), and restarts it.
func TestStopAndRestartNode(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c := natscluster.ForTest(t, natscluster.Options{})
	_, js := c.JetStream(t)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s"}, Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitStream(ctx, "S"); err != nil {
		t.Fatal(err)
	}
	if err := c.Stop(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if c.Running(1) {
		t.Fatal("n1 running after Stop")
	}
	if _, err := js.Publish(ctx, "s", []byte("with n1 down")); err != nil {
		t.Fatalf("publish with one node of three down: %v", err)
	}
	if err := c.Restart(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitStream(ctx, "S"); err != nil {
		t.Fatal(err)
	}
	if rs, err := c.ReplicaState(ctx, 1, "S"); err != nil || rs.Msgs != 1 {
		t.Fatalf("restarted n1's replica: %+v, %v; want 1 message", rs, err)
	}
}

// TestRestartWaitsForItsPort holds a killed node's client port with
// another listener: Restart keeps the node's ports, retrying until the
// port is free, and the node then rejoins.
func TestRestartWaitsForItsPort(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c := natscluster.ForTest(t, natscluster.Options{})
	url := c.URL(2)
	if err := c.Kill(2); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", strings.TrimPrefix(url, "nats://"))
	if err != nil {
		t.Fatalf("hold %s: %v", url, err)
	}
	defer l.Close()
	go func() {
		// Release the port once a start has failed on it.
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			b, _ := os.ReadFile(c.LogFile(2))
			if strings.Contains(string(b), "address already in use") {
				l.Close()
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	if err := c.Restart(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if c.URL(2) != url || !c.Running(2) {
		t.Fatalf("after restart: %s running=%v, want %s running", c.URL(2), c.Running(2), url)
	}
}

// TestServersDieWithTheirParent starts a cluster in a child process (this
// test binary), SIGKILLs the child, and checks the kernel killed its
// servers (PR_SET_PDEATHSIG), so a test killed by a timeout leaves none.
func TestServersDieWithTheirParent(t *testing.T) {
	if dir := os.Getenv("NATSCLUSTER_CHILD_DIR"); dir != "" {
		c, err := natscluster.Start(context.Background(), natscluster.Options{Dir: dir})
		if err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		var pids []string
		for i := range c.Size() {
			pids = append(pids, strconv.Itoa(c.Pid(i)))
		}
		fmt.Println("pids:", strings.Join(pids, " "))
		select {} // until killed
	}
	if runtime.GOOS != "linux" {
		t.Skip("the parent-death signal is Linux only")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// Build (or find) the binary here, so that the child does not race
	// this process's timeout building it.
	if _, err := natscluster.Binary(ctx); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestServersDieWithTheirParent$")
	cmd.Env = append(os.Environ(), "NATSCLUSTER_CHILD_DIR="+t.TempDir())
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer cmd.Process.Kill()
	var pids []int
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, "pids: "); ok {
			for _, f := range strings.Fields(rest) {
				p, _ := strconv.Atoi(f)
				pids = append(pids, p)
			}
			break
		}
		t.Logf("child: %s", line)
	}
	if len(pids) != 3 {
		t.Fatalf("child printed pids %v, want 3", pids)
	}
	for _, p := range pids {
		if !isNATSServer(p) {
			t.Fatalf("pid %d is not a running nats-server", p)
		}
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	waitUntil(t, ctx, func() bool {
		for _, p := range pids {
			if isNATSServer(p) {
				return false
			}
		}
		return true
	}, "servers gone after their parent's SIGKILL")
}

// isNATSServer reports whether pid is a live (not zombie) nats-server.
func isNATSServer(pid int) bool {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || !strings.Contains(s[:i], "nats-server") {
		return false
	}
	f := strings.Fields(s[i+1:])
	return len(f) > 0 && f[0] != "Z"
}

// TestCIScriptPrintsTheBinary runs .ci/nats.sh and checks it prints the
// binary this package runs, so CI's TXHOOK_NATS_SERVER and a local test
// run agree.
func TestCIScriptPrintsTheBinary(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	want, err := natscluster.Binary(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("no bash")
	}
	cmd := exec.CommandContext(ctx, "bash", "../../.ci/nats.sh")
	cmd.Env = append(os.Environ(), natscluster.EnvServer+"=")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf(".ci/nats.sh: %v\n%s", err, stderr.String())
	}
	got := strings.TrimSpace(string(out))
	// With TXHOOK_NATS_SERVER set to another binary, Binary runs that.
	if env := os.Getenv(natscluster.EnvServer); (env == "" || env == got) && got != want {
		t.Fatalf(".ci/nats.sh printed %q, natscluster.Binary is %q", got, want)
	}
	v, err := exec.CommandContext(ctx, got, "--version").Output()
	if err != nil || !strings.Contains(string(v), "nats-server: v") {
		t.Fatalf("%s --version: %q, %v", got, v, err)
	}
	t.Logf("%s: %s", got, strings.TrimSpace(string(v)))
}

// waitUntil polls cond until it holds or ctx ends.
func waitUntil(t *testing.T, ctx context.Context, cond func() bool, what string) {
	t.Helper()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for %s: %v", what, ctx.Err())
		case <-tick.C:
		}
	}
}
