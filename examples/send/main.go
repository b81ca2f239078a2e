// Command send fires one signed test event at a URL through txhook's real
// path (a SQLite outbox in a temporary directory, the relay, HTTP), like
// `stripe trigger`: a quick way to check a receiver's signature code.
//
//	go run ./examples/send -url https://example.com/webhooks -secret whsec_…
//	go run ./examples/send -url http://localhost:8080/hook -allow-private -scheme stripe -secret my-shared-secret
//
// It prints every attempt and exits 0 exactly when the receiver answered
// 2xx, 1 when it did not, 2 on bad flags.
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	_ "github.com/mattn/go-sqlite3"

	"github.com/txhook/txhook/outbox"
	"github.com/txhook/txhook/retry"
	"github.com/txhook/txhook/signer"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

type options struct {
	url, secret, scheme, header, typ, data string
	attempts                               int
	allowPrivate, allowHTTP                bool
	timeout                                time.Duration
}

func parse(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("send", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.url, "url", "", "receiver URL (required)")
	fs.StringVar(&o.secret, "secret", "", "signing secret: whsec_… for -scheme standard, any 16+ characters for stripe; empty generates one and prints it")
	fs.StringVar(&o.scheme, "scheme", "standard", "signature scheme: standard (Standard Webhooks) or stripe (t=,v1=)")
	fs.StringVar(&o.header, "header", signer.DefaultStripeHeader, "signature header name for -scheme stripe")
	fs.StringVar(&o.typ, "type", "test.event", "event type")
	fs.StringVar(&o.data, "data", `{"hello":"world"}`, "event payload (JSON)")
	fs.IntVar(&o.attempts, "attempts", 1, "attempts before giving up (1 to 10), one second apart")
	fs.BoolVar(&o.allowPrivate, "allow-private", false, "allow loopback and private addresses (and plain http), for local receivers")
	fs.BoolVar(&o.allowHTTP, "allow-http", false, "allow plain http to public addresses")
	fs.DurationVar(&o.timeout, "timeout", outbox.DefaultTimeout, "per-attempt timeout")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	switch {
	case o.url == "":
		return o, errors.New("-url is required")
	case o.scheme != "standard" && o.scheme != "stripe":
		return o, fmt.Errorf("-scheme must be standard or stripe, not %q", o.scheme)
	case o.attempts < 1 || o.attempts > 10:
		return o, errors.New("-attempts must be 1 to 10")
	case fs.NArg() > 0:
		return o, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	return o, nil
}

func run(args []string, stdout, stderr io.Writer) int {
	o, err := parse(args, stderr)
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(stderr, "send:", err)
		}
		return 2
	}
	ok, err := send(o, stdout)
	if err != nil {
		fmt.Fprintln(stderr, "send:", err)
		var bad *badInput
		if errors.As(err, &bad) {
			return 2
		}
		return 1
	}
	if !ok {
		return 1
	}
	return 0
}

type badInput struct{ err error }

func (b *badInput) Error() string { return b.err.Error() }
func (b *badInput) Unwrap() error { return b.err }

func send(o options, out io.Writer) (bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(o.attempts)*(o.timeout+2*time.Second)+30*time.Second)
	defer cancel()

	dir, err := os.MkdirTemp("", "txhook-send-")
	if err != nil {
		return false, err
	}
	defer os.RemoveAll(dir)
	db, err := sql.Open("sqlite3", outbox.SQLiteDSN(filepath.Join(dir, "outbox.db")))
	if err != nil {
		return false, err
	}
	defer db.Close()
	ob, err := outbox.New(ctx, db, outbox.Config{
		AllowHTTP:           o.allowHTTP || o.allowPrivate,
		AllowPrivateTargets: o.allowPrivate,
		Logger:              slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		return false, err
	}
	defer ob.Close()
	if err := ob.Migrate(ctx); err != nil {
		return false, err
	}
	if o.secret == "" {
		if o.secret, err = signer.GenerateSecret(); err != nil {
			return false, err
		}
		fmt.Fprintf(out, "secret: %s (generated; configure your receiver with it)\n", o.secret)
	}
	ep, err := ob.CreateEndpoint(ctx, outbox.NewEndpoint{Tenant: "send", URL: o.url, Secret: o.secret})
	if err != nil {
		return false, &badInput{err}
	}
	var sig signer.Signer = signer.Standard{}
	if o.scheme == "stripe" {
		sig = signer.Stripe{Header: o.header}
	}
	delays := make([]time.Duration, o.attempts-1)
	for i := range delays {
		delays[i] = time.Second
	}
	relay, err := ob.NewRelay(outbox.RelayConfig{Signer: sig, Retry: retry.Intervals(delays...), Timeout: o.timeout,
		Lease: max(outbox.DefaultLease, 2*o.timeout)})
	if err != nil {
		return false, &badInput{err}
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return false, err
	}
	id, err := ob.Enqueue(ctx, tx, outbox.Event{Tenant: "send", Type: o.typ, Payload: []byte(o.data)})
	if err != nil {
		tx.Rollback()
		return false, &badInput{err}
	}
	if err := tx.Commit(); err != nil {
		return false, err
	}
	fmt.Fprintf(out, "event %s (%s) to %s, %s scheme\n", id, o.typ, ep.URL, o.scheme)
	if err := relay.Start(ctx); err != nil {
		return false, err
	}
	defer func() {
		stop, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		relay.Stop(stop)
	}()

	var d outbox.Delivery
	for {
		ds, err := ob.EventDeliveries(ctx, id)
		if err != nil {
			return false, err
		}
		// No delivery yet: the relay has not dispatched the event.
		if len(ds) > 1 {
			return false, fmt.Errorf("expected one delivery, found %d", len(ds))
		}
		if len(ds) == 1 {
			d = ds[0]
			if d.State == outbox.StateSucceeded || d.State == outbox.StateDead {
				break
			}
		}
		select {
		case <-ctx.Done():
			return false, errors.New("timed out")
		case <-time.After(20 * time.Millisecond):
		}
	}
	atts, err := ob.DeliveryAttempts(ctx, d.ID)
	if err != nil {
		return false, err
	}
	for _, a := range atts {
		status := "no response"
		if a.Status != 0 {
			status = fmt.Sprintf("HTTP %d", a.Status)
		}
		fmt.Fprintf(out, "attempt %d: %s in %s", a.Number, status, a.Duration.Round(time.Millisecond))
		if a.Error != "" {
			fmt.Fprintf(out, " (%s)", a.Error)
		}
		fmt.Fprintln(out)
		if ex := strings.TrimSpace(a.ResponseExcerpt); ex != "" {
			if len(ex) > 200 {
				ex = ex[:200] + "…"
			}
			fmt.Fprintf(out, "  response: %s\n", ex)
		}
	}
	if d.State == outbox.StateSucceeded {
		fmt.Fprintln(out, "delivered")
		return true, nil
	}
	fmt.Fprintln(out, "not delivered")
	return false, nil
}
