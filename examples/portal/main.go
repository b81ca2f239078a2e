// Command portal runs the merchant portal (package outbox/portal) in a
// small host app on SQLite, with no server to install: three merchants
// with endpoints on local receivers (one of them failing), some traffic,
// a relay delivering it, and a signed access link per merchant printed to
// open in a browser. The operations UI (package dlq) is mounted too, at
// /ops/, with links into each merchant's portal.
//
//	go run ./examples/portal                  # serves until interrupted
//	go run ./examples/portal -duration 10m    # or for a while
//	go run ./examples/portal -addr 127.0.0.1:9000 -lang zh
//
// The database is a file in a temporary directory, removed on exit.
package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"sync/atomic"
	"time"

	_ "modernc.org/sqlite" // pure-Go SQLite, "sqlite"

	"github.com/txhook/txhook/dlq"
	"github.com/txhook/txhook/outbox"
	"github.com/txhook/txhook/outbox/portal"
	"github.com/txhook/txhook/retry"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8080", "address to serve the host app on")
	duration := flag.Duration("duration", 0, "stop after this long (0: until interrupted)")
	lang := flag.String("lang", "", `force the portal's language: "en" or "zh" (default: the browser's)`)
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if *duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *duration)
		defer cancel()
	}
	if err := run(ctx, os.Stdout, *addr, *lang); err != nil {
		fmt.Fprintln(os.Stderr, "portal:", err)
		os.Exit(1)
	}
}

// merchants of the demo: each gets endpoints at these receivers.
var merchants = []struct {
	tenant string
	hooks  []int // the status each endpoint's receiver answers
	events int
}{
	{"acme", []int{200}, 24},
	{"globex", []int{200, 503}, 16},
	{"initech", []int{500}, 6},
}

// catalog is the platform's event types.
func catalog() (*outbox.Catalog, error) {
	c := outbox.NewCatalog()
	for _, t := range []outbox.EventType{
		{Name: "payment.succeeded", Description: "A payment was captured.", Versions: []outbox.SchemaVersion{
			{Version: 1, Description: "First version.", Example: json.RawMessage(`{"payment_id":"pay_123","amount":1999,"currency":"CNY"}`)}}},
		{Name: "payment.failed", Description: "A payment was declined.", Versions: []outbox.SchemaVersion{
			{Version: 1, Example: json.RawMessage(`{"payment_id":"pay_124","reason":"card_declined"}`)}}},
		{Name: "refund.created", Description: "A refund was issued.", Versions: []outbox.SchemaVersion{
			{Version: 1, Example: json.RawMessage(`{"refund_id":"re_9","payment_id":"pay_123","amount":500}`)}}},
	} {
		if err := c.Register(t); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// receive starts a loopback receiver answering status and counting
// requests.
func receive(status int, n *atomic.Int64) (string, func(), error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		n.Add(1)
		w.WriteHeader(status)
		if status >= 300 {
			_, _ = io.WriteString(w, `{"error":"upstream database unavailable"}`)
		}
	})}
	go func() { _ = srv.Serve(ln) }()
	return "http://" + ln.Addr().String() + "/webhooks", func() { _ = srv.Close() }, nil
}

func run(ctx context.Context, out io.Writer, addr, lang string) error {
	dir, err := os.MkdirTemp("", "txhook-portal-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	db, err := sql.Open("sqlite", outbox.SQLiteDSN(filepath.Join(dir, "demo.db")))
	if err != nil {
		return err
	}
	defer db.Close()
	cat, err := catalog()
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	// Local receivers on 127.0.0.1 need AllowHTTP and AllowPrivateTargets:
	// for the demo only.
	ob, err := outbox.New(ctx, db, outbox.Config{Dialect: "sqlite", AllowHTTP: true, AllowPrivateTargets: true, Catalog: cat, Logger: log})
	if err != nil {
		return err
	}
	defer ob.Close()
	if err := ob.Migrate(ctx); err != nil {
		return err
	}

	var received atomic.Int64
	for _, m := range merchants {
		for i, status := range m.hooks {
			url, stop, err := receive(status, &received)
			if err != nil {
				return err
			}
			defer stop()
			desc := fmt.Sprintf("%s order system", m.tenant)
			if i > 0 {
				desc = fmt.Sprintf("%s analytics (down)", m.tenant)
			}
			if _, err := ob.CreateEndpoint(ctx, outbox.NewEndpoint{Tenant: m.tenant, URL: url, Description: desc}); err != nil {
				return err
			}
		}
	}
	relay, err := ob.NewRelay(outbox.RelayConfig{Retry: retry.Intervals(time.Second, 2*time.Second), DisableAfter: 5 * 24 * time.Hour})
	if err != nil {
		return err
	}
	if err := relay.Start(ctx); err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = relay.Stop(sctx)
	}()
	types := []string{"payment.succeeded", "payment.succeeded", "payment.failed", "refund.created"}
	total, okDeliveries, failingEndpoints := 0, 0, 0
	for _, m := range merchants {
		for i := 0; i < m.events; i++ {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			payload := fmt.Sprintf(`{"payment_id":"pay_%s_%d","amount":%d,"currency":"CNY"}`, m.tenant, i, 1000+i*37)
			if _, err := ob.Enqueue(ctx, tx, outbox.Event{Tenant: m.tenant, Type: types[i%len(types)], Payload: json.RawMessage(payload)}); err != nil {
				_ = tx.Rollback()
				return err
			}
			if err := tx.Commit(); err != nil {
				return err
			}
			total += len(m.hooks)
			for _, status := range m.hooks {
				if status == 200 {
					okDeliveries++
				}
			}
		}
		for _, status := range m.hooks {
			if status != 200 {
				failingEndpoints++
			}
		}
	}

	// The host app: its own pages, the merchant portal, the operations UI.
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return err
	}
	pcfg := portal.Config{Prefix: "/portal/", LinkKeys: [][]byte{key}, Catalog: cat, DisableAfter: 5 * 24 * time.Hour}
	if lang != "" {
		pcfg.Locale = func(*http.Request) string { return lang }
	}
	p, err := portal.New(ob, pcfg)
	if err != nil {
		return err
	}
	loopback := netip.MustParsePrefix("127.0.0.0/8")
	ops, err := dlq.NewUI(ob, dlq.UIConfig{Prefix: "/ops/",
		// The demo's "operator login": requests from this machine.
		Authorize: func(r *http.Request) bool {
			ap, err := netip.ParseAddrPort(r.RemoteAddr)
			return err == nil && loopback.Contains(ap.Addr().Unmap())
		},
		PortalLink: func(tenant string) (string, error) { return p.Link(tenant, 15*time.Minute) }})
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/portal/", p)
	mux.Handle("/ops/", ops)
	mux.HandleFunc("/{$}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "txhook portal demo: open a merchant's access link printed in the terminal, or the operations UI at /ops/.")
	})
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	base := "http://" + ln.Addr().String()

	// Wait until the working endpoints have every event and each failing
	// one has failed at least once (the relay's breaker then holds the
	// rest back), so the pages have something to show.
	for ready := false; !ready; {
		succeeded, failing := 0, map[string]bool{}
		for _, m := range merchants {
			pg, err := ob.Tenant(m.tenant).Deliveries(ctx, outbox.DeliveryFilter{Limit: outbox.MaxDeliveryPage})
			if err != nil {
				return err
			}
			for _, d := range pg.Deliveries {
				if d.State == outbox.StateSucceeded {
					succeeded++
				} else if d.Attempts > 0 {
					failing[d.EndpointID] = true
				}
			}
		}
		ready = succeeded >= okDeliveries && len(failing) >= failingEndpoints
		if !ready {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	fmt.Fprintf(out, "%d deliveries to the endpoints of %d merchants: %d succeeded, the rest are failing and retried (%d requests so far).\n",
		total, len(merchants), okDeliveries, received.Load())
	fmt.Fprintf(out, "Operations UI: %s/ops/\n", base)
	fmt.Fprintln(out, "Merchant portal access links (valid 15 minutes):")
	for _, m := range merchants {
		l, err := p.Link(m.tenant, 15*time.Minute)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "  %-8s %s%s\n", m.tenant, base, l)
	}
	fmt.Fprintln(out, "ready")

	select {
	case <-ctx.Done():
	case err := <-served:
		return err
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
