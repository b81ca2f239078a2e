package main

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/txhook/txhook/outbox"
)

// noopReceiver answers 204 to everything after reading the body.
func noopReceiver() (url string, count *atomic.Int64, stop func(), err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, nil, err
	}
	var n atomic.Int64
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		n.Add(1)
		w.WriteHeader(http.StatusNoContent)
	})}
	go srv.Serve(ln)
	return "http://" + ln.Addr().String() + "/hook", &n, func() { srv.Close() }, nil
}

// bareLoop POSTs total requests from conc goroutines, the baseline for
// drain: the cost of the HTTP alone.
func bareLoop(url string, conc, total int, body []byte) (float64, error) {
	tr := &http.Transport{MaxIdleConnsPerHost: conc, MaxConnsPerHost: 0, DisableCompression: true}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: 5 * time.Second}
	var next atomic.Int64
	var firstErr error
	var once sync.Once
	start := time.Now()
	var wg sync.WaitGroup
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(total) {
				req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				resp, err := c.Do(req)
				if err != nil {
					once.Do(func() { firstErr = err })
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}
	wg.Wait()
	return float64(total) / time.Since(start).Seconds(), firstErr
}

// fillBacklog enqueues n events for tenant in transactions of 500.
func fillBacklog(ctx context.Context, db *sql.DB, ob *outbox.Outbox, tenant string, n int) error {
	for i := 0; i < n; i += 500 {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		for k := i; k < min(n, i+500); k++ {
			if _, err := ob.Enqueue(ctx, tx, outbox.Event{Tenant: tenant, Type: "payment.succeeded", Payload: benchPayload}); err != nil {
				tx.Rollback()
				return err
			}
		}
		if err := tx.Commit(); err != nil {
			return err
		}
	}
	return nil
}

// benchDrain delivers a backlog of n events at concurrency conc and
// returns deliveries per second, counted when their outcome is written.
func benchDrain(ctx context.Context, db *sql.DB, ob *outbox.Outbox, url string, conc, n int) (float64, error) {
	tenant := fmt.Sprintf("drain_%d_%d", conc, time.Now().UnixNano())
	if _, err := ob.CreateEndpoint(ctx, outbox.NewEndpoint{Tenant: tenant, URL: url}); err != nil {
		return 0, err
	}
	if err := fillBacklog(ctx, db, ob, tenant, n); err != nil {
		return 0, err
	}
	r, err := ob.NewRelay(outbox.RelayConfig{Concurrency: conc, EndpointConcurrency: conc})
	if err != nil {
		return 0, err
	}
	start := time.Now()
	if err := r.Start(ctx); err != nil {
		return 0, err
	}
	for r.Stats().Succeeded < uint64(n) {
		time.Sleep(2 * time.Millisecond)
		if time.Since(start) > 5*time.Minute {
			return 0, fmt.Errorf("drain: only %d of %d after 5 minutes", r.Stats().Succeeded, n)
		}
	}
	el := time.Since(start)
	stop, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := r.Stop(stop); err != nil {
		return 0, err
	}
	return float64(n) / el.Seconds(), nil
}
