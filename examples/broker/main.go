// Command broker shows txhook's broker mode end to end with nothing to
// install: an embedded NATS server with JetStream (a temporary directory)
// and SQLite. Payments commit with their webhook events in one
// transaction; a forwarder publishes each delivery to JetStream; two
// workers deliver them signed to local receivers; a receiver that is down
// has its retries scheduled in JetStream until they run out and land in
// the dead-letter table, from which they are replayed once it recovers.
//
//	go run ./examples/broker
//
// In production the JetStream client comes from a connection to your NATS
// cluster (streams with three replicas), the outbox is on PostgreSQL, and
// forwarders and workers run in as many processes as you like: see
// docs/broker.md.
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	_ "modernc.org/sqlite" // "sqlite"; mattn/go-sqlite3 ("sqlite3") is in driver_cgo.go

	"github.com/txhook/txhook/dlq"
	"github.com/txhook/txhook/outbox"
	"github.com/txhook/txhook/outbox/broker"
	"github.com/txhook/txhook/retry"
	"github.com/txhook/txhook/signer"
)

func main() {
	driver := flag.String("driver", drivers[0], "SQLite driver: "+fmt.Sprint(drivers))
	flag.Parse()
	if err := run(os.Stdout, *driver); err != nil {
		fmt.Fprintln(os.Stderr, "broker example:", err)
		os.Exit(1)
	}
}

// receiver is a merchant's endpoint: it checks signatures, counts copies
// per event ID, and reports each receipt on got.
type receiver struct {
	name   string
	secret atomic.Value // string
	down   atomic.Bool
	mu     sync.Mutex
	seen   map[string]int
	got    chan string
}

func (rc *receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		http.Error(w, "read error", http.StatusBadRequest)
		return
	}
	if rc.down.Load() {
		http.Error(w, "deploy in progress", http.StatusServiceUnavailable)
		return
	}
	secret, _ := rc.secret.Load().(string)
	msg, err := signer.Standard{}.Verify(r.Header, body, []string{secret})
	if err != nil {
		http.Error(w, "bad signature", http.StatusUnauthorized)
		return
	}
	rc.mu.Lock()
	rc.seen[msg.ID]++
	n := rc.seen[msg.ID]
	rc.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
	rc.got <- fmt.Sprintf("  %-7s received %s %s (signature ok, copy #%d)", rc.name, r.Header.Get(outbox.HeaderEventType), msg.ID, n)
}

func serve(h http.Handler) (url string, stop func(), err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	return "http://" + ln.Addr().String() + "/webhooks", func() { srv.Close() }, nil
}

// startJetStream runs an embedded NATS server with JetStream storing in
// dir, on a free loopback port, and connects to it.
func startJetStream(dir string) (js jetstream.JetStream, stop func(), err error) {
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true,
		StoreDir: filepath.Join(dir, "jetstream"), NoLog: true, NoSigs: true})
	if err != nil {
		return nil, nil, err
	}
	ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		ns.Shutdown()
		return nil, nil, errors.New("embedded NATS server did not start")
	}
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		ns.Shutdown()
		return nil, nil, err
	}
	js, err = jetstream.New(nc)
	if err != nil {
		nc.Close()
		ns.Shutdown()
		return nil, nil, err
	}
	return js, func() { nc.Close(); ns.Shutdown(); ns.WaitForShutdown() }, nil
}

func run(out io.Writer, driver string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))

	dir, err := os.MkdirTemp("", "txhook-broker-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	js, stopJS, err := startJetStream(dir)
	if err != nil {
		return err
	}
	defer stopJS()
	path := filepath.Join(dir, "shop.db")
	db, err := sql.Open(driver, outbox.SQLiteDSN(path))
	if err != nil {
		return err
	}
	defer db.Close()
	fmt.Fprintf(out, "txhook broker mode: SQLite database %s (driver %s), embedded JetStream in %s\n\n", path, driver, dir)

	if _, err := db.ExecContext(ctx, `CREATE TABLE payments (id TEXT PRIMARY KEY, merchant TEXT NOT NULL, amount INTEGER NOT NULL, status TEXT NOT NULL)`); err != nil {
		return err
	}
	ob, err := outbox.New(ctx, db, outbox.Config{
		Broker: true,
		// Local receivers over plain http: for this demo only.
		AllowHTTP:           true,
		AllowPrivateTargets: true,
		Logger:              quiet,
	})
	if err != nil {
		return err
	}
	defer ob.Close()
	if err := ob.Migrate(ctx); err != nil {
		return err
	}

	acme := &receiver{name: "acme", seen: map[string]int{}, got: make(chan string, 100)}
	globex := &receiver{name: "globex", seen: map[string]int{}, got: make(chan string, 100)}
	globex.down.Store(true)
	for merchant, rc := range map[string]*receiver{"acme": acme, "globex": globex} {
		url, stop, err := serve(rc)
		if err != nil {
			return err
		}
		defer stop()
		ep, err := ob.CreateEndpoint(ctx, outbox.NewEndpoint{Tenant: merchant, URL: url, EventTypes: []string{"payment.*"}})
		if err != nil {
			return err
		}
		rc.secret.Store(ep.Secrets[0].Value)
	}
	fmt.Fprintln(out, "1. registered endpoints for acme and globex (globex is mid-deploy and answers 503)")

	// A short schedule so the demo dead-letters in a second; retries are
	// messages JetStream holds until their time.
	deadLettered := make(chan outbox.DeadLetterNotice, 10)
	cfg := broker.Config{
		JetStream: js,
		Relay: outbox.RelayConfig{
			Retry:           retry.Intervals(300*time.Millisecond, 600*time.Millisecond),
			BreakerCooldown: 300 * time.Millisecond,
			OnDeadLetter:    func(n outbox.DeadLetterNotice) { deadLettered <- n },
		},
		Logger: quiet,
	}
	fwd, err := broker.NewForwarder(ob, cfg)
	if err != nil {
		return err
	}
	if err := fwd.Start(ctx); err != nil {
		return err
	}
	var workers []*outbox.Relay
	for range 2 {
		w, err := broker.NewWorker(ob, cfg)
		if err != nil {
			return err
		}
		if err := w.Start(ctx); err != nil {
			return err
		}
		workers = append(workers, w)
	}
	fmt.Fprintf(out, "2. a forwarder and %d workers share the stream %s (created by the first to start)\n", len(workers), broker.DefaultStream)

	fmt.Fprintln(out, "3. each payment and its event commit in one transaction:")
	payments := []struct {
		id, merchant string
		amount       int
	}{{"pay_1", "acme", 1200}, {"pay_2", "globex", 800}, {"pay_3", "acme", 450}, {"pay_4", "globex", 9900}}
	for _, p := range payments {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO payments (id, merchant, amount, status) VALUES (?, ?, ?, 'succeeded')`, p.id, p.merchant, p.amount); err != nil {
			tx.Rollback()
			return err
		}
		id, err := ob.Enqueue(ctx, tx, outbox.Event{
			Tenant:         p.merchant,
			Type:           "payment.succeeded",
			IdempotencyKey: p.id + ":succeeded",
			Payload:        []byte(fmt.Sprintf(`{"payment_id":%q,"amount":%d,"currency":"usd"}`, p.id, p.amount)),
		})
		if err != nil {
			tx.Rollback()
			return err
		}
		if err := tx.Commit(); err != nil {
			return err
		}
		fmt.Fprintf(out, "  committed %s (%s, %d) with event %s\n", p.id, p.merchant, p.amount, id)
	}

	fmt.Fprintln(out, "4. the workers deliver what the forwarder published:")
	for range 2 {
		if err := waitFor(ctx, out, acme.got); err != nil {
			return err
		}
	}
	for range 2 {
		select {
		case n := <-deadLettered:
			fmt.Fprintf(out, "  globex: event %s failed %d times (last: %s), its retries scheduled in JetStream, and moved to the dead-letter table\n",
				n.EventID, n.Attempts, n.LastError)
		case <-ctx.Done():
			return errors.New("timed out waiting for dead letters")
		}
	}

	q := dlq.New(ob)
	globex.down.Store(false)
	n, err := q.ReplayAll(ctx, dlq.Filter{Tenant: "globex"})
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "5. globex is back; an operator replays %d dead letters, which the forwarder hands to JetStream:\n", n)
	for range n {
		if err := waitFor(ctx, out, globex.got); err != nil {
			return err
		}
	}

	stopCtx, stopCancel := context.WithTimeout(ctx, 10*time.Second)
	defer stopCancel()
	var succeeded, retried uint64
	for _, w := range workers {
		if err := w.Stop(stopCtx); err != nil {
			return err
		}
		st := w.Stats()
		succeeded += st.Succeeded
		retried += st.Failed
	}
	if err := fwd.Stop(stopCtx); err != nil {
		return err
	}
	left, err := q.Count(ctx, dlq.Filter{})
	if err != nil {
		return err
	}
	fs := fwd.Stats()
	fmt.Fprintf(out, "\ndone: forwarder published %d deliveries of %d events and %d replayed rows; workers: %d succeeded, %d failed attempts retried; %d dead letters left\n",
		fs.Messages-fs.Rows, fs.Events, fs.Rows, succeeded, retried, left)
	if left != 0 || succeeded != 4 {
		return fmt.Errorf("unexpected outcome: %d succeeded, %d dead letters left", succeeded, left)
	}
	return nil
}

// waitFor prints the next receipt reported on ch.
func waitFor(ctx context.Context, out io.Writer, ch <-chan string) error {
	select {
	case line := <-ch:
		fmt.Fprintln(out, line)
		return nil
	case <-ctx.Done():
		return errors.New("timed out waiting for a delivery")
	}
}
