// Command receiver is a webhook receiver built on txhook's verify package:
// it verifies each delivery, deduplicates it in SQLite, acknowledges at
// once (202) and processes in a pool of background workers. Processing
// writes the event to a ledger table and marks it done in the same
// transaction, so each event is recorded exactly once.
//
// Usage:
//
//	RECEIVER_SECRETS=whsec_... receiver -addr 127.0.0.1:8080 -db receiver.db
//
// Secrets come from RECEIVER_SECRETS (comma-separated: list the old and the
// new one during a rotation) or from -secret flags, which other users of
// the machine can read in the process list. Logs are JSON lines on stdout;
// they never contain a secret.
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
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	_ "github.com/mattn/go-sqlite3"

	"github.com/txhook/txhook/verify"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "receiver:", err)
		os.Exit(1)
	}
}

// listFlag collects repeated -secret flags.
type listFlag []string

func (l *listFlag) String() string     { return fmt.Sprintf("%d secrets", len(*l)) }
func (l *listFlag) Set(s string) error { *l = append(*l, s); return nil }

// run serves until ctx ends, then stops taking requests, lets the workers
// finish the events already acknowledged, and returns.
func run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	fs := flag.NewFlagSet("receiver", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:8080", "listen address (port 0 picks a free one; the log says which)")
	var secrets listFlag
	fs.Var(&secrets, "secret", "a signing secret (repeatable); prefer RECEIVER_SECRETS")
	scheme := fs.String("scheme", "standard", "signature scheme: standard or stripe")
	stripeHeader := fs.String("stripe-header", "", "signature header of the stripe scheme (default X-Webhook-Signature)")
	dbPath := fs.String("db", "receiver.db", "SQLite database file")
	types := fs.String("types", "", "comma-separated event types to process; others are acknowledged and dropped (default all)")
	workers := fs.Int("workers", 4, "background workers")
	queue := fs.Int("queue", 1000, "events acknowledged but not yet processed, at most; beyond it deliveries get 503")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if env := getenv("RECEIVER_SECRETS"); env != "" {
		for _, s := range strings.Split(env, ",") {
			if s = strings.TrimSpace(s); s != "" {
				secrets = append(secrets, s)
			}
		}
	}
	if len(secrets) == 0 {
		return errors.New("no secret: set RECEIVER_SECRETS or -secret")
	}
	if *workers < 1 || *queue < 1 {
		return errors.New("-workers and -queue must be at least 1")
	}
	log := slog.New(slog.NewJSONHandler(stdout, nil))

	cfg := verify.Config{Secrets: secrets, StripeHeader: *stripeHeader, Logger: log}
	switch *scheme {
	case "standard":
	case "stripe":
		cfg.Scheme = verify.Stripe
	default:
		return fmt.Errorf("unknown -scheme %q", *scheme)
	}
	if *types != "" {
		cfg.Types = strings.Split(*types, ",")
	}

	db, err := sql.Open("sqlite3", "file:"+*dbPath+"?_journal_mode=WAL&_busy_timeout=10000&_txlock=immediate")
	if err != nil {
		return err
	}
	defer db.Close()
	inbox, err := verify.NewSQLStore(ctx, db, verify.SQLConfig{Dialect: "sqlite"})
	if err != nil {
		return err
	}
	if err := inbox.CreateTable(ctx); err != nil {
		return err
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS ledger (
		event_id     TEXT PRIMARY KEY,
		type         TEXT NOT NULL,
		data         TEXT,
		processed_at TEXT NOT NULL
	)`); err != nil {
		return err
	}
	cfg.Store = inbox
	v, err := verify.New(cfg)
	if err != nil {
		return err
	}

	a := &app{db: db, inbox: inbox, log: log, jobs: make(chan job, *queue)}
	var wg sync.WaitGroup
	for range *workers {
		wg.Go(a.work)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /webhooks", v.Middleware(http.HandlerFunc(a.enqueue)))
	srv := &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		a.closeJobs()
		wg.Wait()
		return err
	}
	log.Info("listening", "addr", ln.Addr().String(), "scheme", *scheme, "secrets", len(secrets), "db", *dbPath)

	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	select {
	case err = <-serveErr:
	case <-ctx.Done():
		log.Info("shutting down")
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		err = srv.Shutdown(sctx)
		cancel()
	}
	a.closeJobs() // handlers still running (Shutdown timed out) answer 503
	wg.Wait()
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	log.Info("stopped")
	return err
}

type app struct {
	db    *sql.DB
	inbox *verify.SQLStore
	log   *slog.Logger

	mu     sync.RWMutex // guards sending on jobs against closing it
	closed bool
	jobs   chan job
}

type job struct {
	ev   verify.Event
	done func(error)
}

// enqueue acknowledges a verified, first-time delivery by queueing it; the
// middleware answers 202. A full queue answers 503 and releases the claim.
func (a *app) enqueue(w http.ResponseWriter, r *http.Request) {
	ev, _ := verify.EventFrom(r.Context())
	a.mu.RLock()
	defer a.mu.RUnlock()
	if a.closed {
		http.Error(w, "shutting down", http.StatusServiceUnavailable)
		return
	}
	done := verify.Async(r.Context())
	select {
	case a.jobs <- job{ev: ev, done: done}:
	default:
		done(errors.New("queue full")) // releases the claim: the retry will find room
		http.Error(w, "busy", http.StatusServiceUnavailable)
	}
}

func (a *app) closeJobs() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.closed {
		a.closed = true
		close(a.jobs)
	}
}

func (a *app) work() {
	for j := range a.jobs {
		err := a.process(j.ev)
		switch {
		case errors.Is(err, verify.ErrDuplicate):
			a.log.Info("already processed", "event", j.ev.ID)
			err = nil
		case err != nil:
			a.log.Error("processing failed; the sender's retry will process it again", "event", j.ev.ID, "error", err)
		default:
			a.log.Info("processed", "event", j.ev.ID, "type", j.ev.Type)
		}
		j.done(err)
	}
}

// process is the business work: the ledger row and the done mark commit
// together, or neither does.
func (a *app) process(ev verify.Event) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tx, err := a.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := a.inbox.MarkDoneTx(ctx, tx, ev.ID); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO ledger (event_id, type, data, processed_at) VALUES (?, ?, ?, ?)`,
		ev.ID, ev.Type, string(ev.Data), time.Now().UTC().Format(time.RFC3339Nano)); err != nil {
		return err
	}
	return tx.Commit()
}
