package verify_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"time"

	_ "github.com/mattn/go-sqlite3"

	"github.com/txhook/txhook/signer"
	"github.com/txhook/txhook/verify"
)

// exampleSecret is a fixed secret so the examples' output is stable; load
// yours from the environment or a secret store.
const exampleSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

// exampleRequest returns a request as txhook's sender makes it.
func exampleRequest(url, id string, ts time.Time) *http.Request {
	body := `{"id":"` + id + `","type":"payment.succeeded","timestamp":"2026-03-01T12:00:00Z","data":{"payment":"pay_1","amount":100}}`
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if err := (signer.Standard{}).Sign(req.Header, id, ts, []byte(body), []string{exampleSecret}); err != nil {
		panic(err)
	}
	return req
}

func send(req *http.Request) string {
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	text, _ := io.ReadAll(resp.Body)
	return fmt.Sprintf("%d %s", resp.StatusCode, bytes.TrimSpace(text))
}

// Verifying a request read by other means, such as a serverless function's
// event: pass the headers and the raw body, exactly as received.
func ExampleVerifier_Verify() {
	signedAt := time.Unix(1772366400, 0)
	v, err := verify.New(verify.Config{
		Secrets: []string{exampleSecret},
		Now:     func() time.Time { return signedAt.Add(time.Minute) }, // leave nil in real code
	})
	if err != nil {
		panic(err)
	}
	req := exampleRequest("http://receiver.example/webhooks", "evt_01", signedAt)
	body, _ := io.ReadAll(req.Body)

	ev, err := v.Verify(req.Header, body)
	fmt.Println(ev.ID, ev.Type, string(ev.Data), err)

	tampered := bytes.Replace(body, []byte("100"), []byte("10000"), 1)
	_, err = v.Verify(req.Header, tampered)
	fmt.Println(errors.Is(err, verify.ErrNoMatchingSignature))

	late, _ := verify.New(verify.Config{Secrets: []string{exampleSecret}, Now: func() time.Time { return signedAt.Add(time.Hour) }})
	_, err = late.Verify(req.Header, body)
	fmt.Println(errors.Is(err, verify.ErrTimestampTooOld))
	// Output:
	// evt_01 payment.succeeded {"payment":"pay_1","amount":100} <nil>
	// true
	// true
}

// The middleware in front of a handler, with in-memory deduplication: a
// delivery that comes again is answered without running the handler.
func ExampleVerifier_Middleware() {
	v, err := verify.New(verify.Config{
		Secrets: []string{exampleSecret},
		Types:   []string{"payment.succeeded"},
		Store:   verify.NewMemoryStore(verify.MemoryConfig{}),
	})
	if err != nil {
		panic(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /webhooks", v.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ev, _ := verify.EventFrom(r.Context())
		fmt.Println("handling", ev.ID, ev.Type)
		// Answer 2xx when done; 5xx (or a panic) lets the retry run this again.
		fmt.Fprintln(w, "ok")
	})))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	now := time.Now()
	fmt.Println(send(exampleRequest(srv.URL+"/webhooks", "evt_01", now)))
	fmt.Println(send(exampleRequest(srv.URL+"/webhooks", "evt_01", now))) // the sender's retry

	forged := exampleRequest(srv.URL+"/webhooks", "evt_02", now)
	forged.Header.Set("Webhook-Signature", "v1,"+strings.Repeat("A", 43)+"=")
	fmt.Println(send(forged))
	// Output:
	// handling evt_01 payment.succeeded
	// 200 ok
	// 200 duplicate
	// 401 no matching signature
}

// Acknowledging at once and processing in the background: the first
// delivery gets 202, retries get 409 while the work runs and 200 after it.
func ExampleAsync() {
	v, _ := verify.New(verify.Config{Secrets: []string{exampleSecret}, Store: verify.NewMemoryStore(verify.MemoryConfig{})})
	type job struct {
		ev   verify.Event
		done func(error)
	}
	jobs := make(chan job, 100)
	srv := httptest.NewServer(v.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ev, _ := verify.EventFrom(r.Context())
		done := verify.Async(r.Context())
		select {
		case jobs <- job{ev, done}:
		default:
			done(errors.New("queue full")) // releases the claim
			http.Error(w, "busy", http.StatusServiceUnavailable)
		}
	})))
	defer srv.Close()

	now := time.Now()
	fmt.Println(send(exampleRequest(srv.URL, "evt_01", now)))
	fmt.Println(send(exampleRequest(srv.URL, "evt_01", now)))

	j := <-jobs // a worker
	fmt.Println("worker processes", j.ev.ID)
	j.done(nil) // or j.done(err) to have the sender's retry processed again

	fmt.Println(send(exampleRequest(srv.URL, "evt_01", now)))
	// Output:
	// 202 accepted
	// 409 in progress
	// worker processes evt_01
	// 200 duplicate
}

// Exactly-once effect: the event is marked done in the same transaction as
// the business write, so both commit or neither does, and a duplicate
// delivery cannot write twice whatever the timing.
func ExampleSQLStore_MarkDoneTx() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "txhook-example")
	defer os.RemoveAll(dir)
	db, err := sql.Open("sqlite3", "file:"+filepath.Join(dir, "app.db")+"?_journal_mode=WAL&_busy_timeout=10000&_txlock=immediate")
	if err != nil {
		panic(err)
	}
	defer db.Close()
	if _, err := db.Exec(`CREATE TABLE payments (payment_id TEXT, amount INTEGER)`); err != nil {
		panic(err)
	}
	inbox, err := verify.NewSQLStore(ctx, db, verify.SQLConfig{}) // dialect detected: sqlite
	if err != nil {
		panic(err)
	}
	if err := inbox.CreateTable(ctx); err != nil {
		panic(err)
	}
	v, _ := verify.New(verify.Config{Secrets: []string{exampleSecret}, Store: inbox})

	// process is the receiver's work: one business write, and the done
	// mark in the same transaction.
	process := func(ctx context.Context, id string) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		if _, err := tx.ExecContext(ctx, `INSERT INTO payments VALUES ('pay_1', 100)`); err != nil {
			return err
		}
		if err := inbox.MarkDoneTx(ctx, tx, id); err != nil {
			return err // ErrDuplicate: the deferred Rollback undoes the insert
		}
		return tx.Commit()
	}
	srv := httptest.NewServer(v.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ev, _ := verify.EventFrom(r.Context())
		switch err := process(r.Context(), ev.ID); {
		case errors.Is(err, verify.ErrDuplicate):
			fmt.Fprintln(w, "already processed")
		case err != nil:
			http.Error(w, "try later", http.StatusServiceUnavailable)
		default:
			fmt.Fprintln(w, "processed")
		}
	})))
	defer srv.Close()

	now := time.Now()
	fmt.Println(send(exampleRequest(srv.URL, "evt_01", now)))
	fmt.Println(send(exampleRequest(srv.URL, "evt_01", now)))

	// Even past the middleware's claim (a lost claim, a second receiver
	// with another store), the transaction refuses the duplicate.
	fmt.Println(errors.Is(process(ctx, "evt_01"), verify.ErrDuplicate))

	var n int
	db.QueryRow(`SELECT count(*) FROM payments`).Scan(&n)
	fmt.Println("payments:", n)
	// Output:
	// 200 processed
	// 200 duplicate
	// true
	// payments: 1
}
