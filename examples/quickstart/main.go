// Command quickstart shows txhook end to end on SQLite, with no server to
// install: payments are written together with their webhook events in one
// transaction, a relay delivers them signed to two local receivers, one
// receiver is down long enough for its deliveries to land in the
// dead-letter table, and they are replayed once it recovers.
//
//	go run ./examples/quickstart
//
// It uses mattn/go-sqlite3 (cgo) when the build has cgo, modernc.org/sqlite
// (pure Go) otherwise; -driver picks one:
//
//	go run ./examples/quickstart -driver sqlite             # modernc.org/sqlite
//	CGO_ENABLED=0 go run ./examples/quickstart              # the same, without cgo
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

	_ "modernc.org/sqlite" // "sqlite"; mattn/go-sqlite3 ("sqlite3") is in driver_cgo.go

	"github.com/txhook/txhook/dlq"
	"github.com/txhook/txhook/outbox"
	"github.com/txhook/txhook/retry"
	"github.com/txhook/txhook/signer"
)

func main() {
	driver := flag.String("driver", drivers[0], "SQLite driver: "+fmt.Sprint(drivers)+" (sqlite3 is mattn/go-sqlite3, sqlite is modernc.org/sqlite)")
	flag.Parse()
	if err := run(os.Stdout, *driver); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}

// receiver is a merchant's webhook endpoint: it checks signatures and
// remembers the event IDs it has seen. It reports each receipt on got, for
// the main goroutine to print.
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

func run(out io.Writer, driver string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	dir, err := os.MkdirTemp("", "txhook-quickstart-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "shop.db")
	db, err := sql.Open(driver, outbox.SQLiteDSN(path))
	if err != nil {
		return err
	}
	defer db.Close()
	fmt.Fprintf(out, "txhook quickstart: SQLite database %s (driver %s)\n\n", path, driver)

	// The application's own table.
	if _, err := db.ExecContext(ctx, `CREATE TABLE payments (id TEXT PRIMARY KEY, merchant TEXT NOT NULL, amount INTEGER NOT NULL, status TEXT NOT NULL)`); err != nil {
		return err
	}

	ob, err := outbox.New(ctx, db, outbox.Config{
		// The receivers below live on 127.0.0.1 over plain http: allowed for
		// this demo only. Production keeps both off (https, public hosts).
		AllowHTTP:           true,
		AllowPrivateTargets: true,
		Logger:              slog.New(slog.NewTextHandler(io.Discard, nil)),
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
	endpoints := map[string]outbox.Endpoint{}
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
		rc.secret.Store(ep.Secrets[0].Value) // shared with the merchant once, out of band
		endpoints[merchant] = ep
	}
	fmt.Fprintf(out, "1. registered endpoints: acme %s, globex %s (globex is mid-deploy and answers 503)\n",
		endpoints["acme"].ID, endpoints["globex"].ID)

	// A short schedule so the demo dead-letters in a second; the default is
	// the article's 9 attempts over 24 hours. Likewise a short circuit
	// breaker cooldown (default 30 s): after 5 failures in a row the relay
	// stops sending to globex and probes it again after the cooldown.
	deadLettered := make(chan outbox.DeadLetterNotice, 10)
	relay, err := ob.NewRelay(outbox.RelayConfig{
		Retry:           retry.Intervals(100*time.Millisecond, 200*time.Millisecond),
		BreakerCooldown: 200 * time.Millisecond,
		OnDeadLetter:    func(n outbox.DeadLetterNotice) { deadLettered <- n },
	})
	if err != nil {
		return err
	}
	if err := relay.Start(ctx); err != nil {
		return err
	}

	fmt.Fprintln(out, "2. each payment and its event commit in one transaction:")
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

	// A payment whose transaction rolls back never produces a webhook.
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if _, err := ob.Enqueue(ctx, tx, outbox.Event{Tenant: "acme", Type: "payment.succeeded", Payload: []byte(`{"payment_id":"pay_5"}`)}); err != nil {
		return err
	}
	tx.Rollback()
	fmt.Fprintln(out, "  rolled back pay_5: its event is gone with it")

	fmt.Fprintln(out, "3. the relay delivers:")
	for range 2 {
		if err := waitFor(ctx, out, acme.got); err != nil {
			return err
		}
	}
	for range 2 {
		select {
		case n := <-deadLettered:
			fmt.Fprintf(out, "  globex: event %s failed %d times (last: %s) and moved to the dead-letter table\n", n.EventID, n.Attempts, n.LastError)
		case <-ctx.Done():
			return errors.New("timed out waiting for dead letters")
		}
	}

	q := dlq.New(ob)
	page, err := q.List(ctx, dlq.Filter{Tenant: "globex"}, "", 10)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "4. dead letters for globex: %d\n", len(page.Entries))
	globex.down.Store(false)
	n, err := q.ReplayAll(ctx, dlq.Filter{Tenant: "globex"})
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "5. globex is back; an operator replays %d dead letters (same event IDs, so receivers can deduplicate):\n", n)
	for range n {
		if err := waitFor(ctx, out, globex.got); err != nil {
			return err
		}
	}

	stopCtx, stopCancel := context.WithTimeout(ctx, 10*time.Second)
	defer stopCancel()
	if err := relay.Stop(stopCtx); err != nil {
		return err
	}
	left, err := q.Count(ctx, dlq.Filter{})
	if err != nil {
		return err
	}
	st := relay.Stats()
	fmt.Fprintf(out, "\ndone: %d deliveries succeeded, %d failed attempts retried, %d dead-lettered and replayed, %d dead letters left\n",
		st.Succeeded, st.Failed, st.DeadLettered, left)
	if left != 0 || st.Succeeded != 4 {
		return fmt.Errorf("unexpected outcome: %+v, %d dead letters left", st, left)
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
