package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/txhook/txhook/internal/gate"
	"github.com/txhook/txhook/outbox"
)

// The fairness part: a calm tenant's commit→receipt latency at a fixed
// rate beside hostile tenants, against the same tenant alone, both in this
// run and with default relay settings. The hostile tenants:
//
//   - hang: endpoints whose receiver never answers (each request ends at
//     the relay's timeout);
//   - throttled: endpoints limited to 0.01 requests/s;
//   - down: endpoints answering 500 at once, so their circuits open.
//
// Each starts with a backlog and keeps enqueuing during the run.
//
// The run beside them is made twice: first with the relays' shared gates
// off (internal/gate.Disabled: limits and circuits per relay, claims that
// skip nothing, as before issue 25), then on, to report how many claims
// each hands back unused (issue 25 §5), measured in the same run.
const (
	fairHangEndpoints      = 12
	fairHangBacklog        = 100
	fairThrottledEndpoints = 2
	fairThrottledBacklog   = 80
	fairDownEndpoints      = 2
	fairDownBacklog        = 300
	fairNoisePerTenant     = 20 // events/s each hostile tenant adds during the run
)

func partFairness(ctx context.Context, cfg config, rep *report, p *progress, rcv *receiver) error {
	alone, err := latencyRun(ctx, cfg, rcv, cfg.FairnessRate, p, nil)
	if err != nil {
		return fmt.Errorf("alone: %w", err)
	}
	gate.Disabled.Store(true)
	var hOff *hostile
	off, err := latencyRun(ctx, cfg, rcv, cfg.FairnessRate, p, func(ctx context.Context, s *pgSchema) (func(), error) {
		var err error
		hOff, err = startHostile(ctx, s)
		return func() { hOff.stop() }, err
	})
	gate.Disabled.Store(false)
	if err != nil {
		return fmt.Errorf("beside hostile tenants, gates off: %w", err)
	}
	var h *hostile
	beside, err := latencyRun(ctx, cfg, rcv, cfg.FairnessRate, p, func(ctx context.Context, s *pgSchema) (func(), error) {
		var err error
		h, err = startHostile(ctx, s)
		return func() { h.stop() }, err
	})
	if err != nil {
		return fmt.Errorf("beside hostile tenants: %w", err)
	}
	lost := beside.missing
	rep.add(row{
		Part: fmt.Sprintf("commit→receipt at %d events/s beside hostile tenants (%d hanging endpoints, %d limited to 0.01/s, %d with open circuits), default relay (p50 / p99 / p99.9 / max)",
			cfg.FairnessRate, fairHangEndpoints, fairThrottledEndpoints, fairDownEndpoints),
		Value:    fmt.Sprintf("%s / %s / %s / %s", ms(beside.p50), ms(beside.p99), ms(beside.p999), ms(beside.maxLat)),
		Baseline: fmt.Sprintf("%s / %s / %s / %s (alone)", ms(alone.p50), ms(alone.p99), ms(alone.p999), ms(alone.maxLat)),
		Ratio:    fmt.Sprintf("%.2f× (p99)", float64(beside.p99)/float64(max(alone.p99, time.Microsecond))),
		Target:   "p99 < 250 ms, none lost",
		Verdict:  verdict(beside.p99 < 250*time.Millisecond && lost == 0 && beside.dups == 0),
	})
	handBacks := func(st outbox.RelayStats) string {
		return fmt.Sprintf("%d of %d claims (%.1f%%)", st.Released, st.Claimed, 100*float64(st.Released)/float64(max(st.Claimed, 1)))
	}
	rep.add(row{
		Part:     "claims handed back unused beside hostile tenants (issue 25 §5), shared gates on",
		Value:    handBacks(beside.stats),
		Baseline: handBacks(off.stats) + " (gates off)",
		Ratio:    fmt.Sprintf("%.2f×", float64(beside.stats.Released)/float64(max(off.stats.Released, 1))),
		Target:   "fewer than with gates off",
		Verdict:  verdict(beside.stats.Released < off.stats.Released),
	})
	var b strings.Builder
	for _, x := range []struct {
		name string
		r    latencyResult
	}{{"alone", alone}, {"beside hostile, gates off", off}, {"beside hostile tenants", beside}} {
		fmt.Fprintf(&b, "%-24s %d measured of %d committed; p50 %s p90 %s p99 %s p99.9 %s max %s; missing %d, duplicates %d; relay: %+v\n",
			x.name, x.r.measured, x.r.sent, ms(x.r.p50), ms(x.r.p90), ms(x.r.p99), ms(x.r.p999), ms(x.r.maxLat),
			x.r.missing, x.r.dups, x.r.stats)
	}
	if hOff != nil {
		fmt.Fprintf(&b, "hostile tenants, gates off: %d events enqueued; %d requests reached the hanging receiver (at most %d at once), %d the failing one, %d the throttled one\n",
			hOff.enqueued.Load(), hOff.hangStarted.Load(), hOff.hangPeak.Load(), hOff.downHits.Load(), hOff.throttledHits.Load())
	}
	if h != nil {
		fmt.Fprintf(&b, "hostile tenants: %d events enqueued; %d requests reached the hanging receiver (at most %d at once), %d the failing one, %d the throttled one\n",
			h.enqueued.Load(), h.hangStarted.Load(), h.hangPeak.Load(), h.downHits.Load(), h.throttledHits.Load())
	}
	rep.section("Fairness runs", b.String())
	return nil
}

// hostile runs the hostile tenants' receivers and their enqueue stream.
type hostile struct {
	hang, down, throttled *http.Server
	quit                  chan struct{}
	wg                    sync.WaitGroup

	enqueued                       atomic.Int64
	hangStarted, hangNow, hangPeak atomic.Int64
	downHits, throttledHits        atomic.Int64
}

func serveLocal(h http.Handler) (*http.Server, string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, "", err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	return srv, "http://" + ln.Addr().String(), nil
}

func startHostile(ctx context.Context, s *pgSchema) (*hostile, error) {
	h := &hostile{quit: make(chan struct{})}
	var hangURL, downURL, thrURL string
	var err error
	if h.hang, hangURL, err = serveLocal(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Read the body first: only then does the server notice the relay
		// giving up on the request.
		io.Copy(io.Discard, r.Body)
		h.hangStarted.Add(1)
		n := h.hangNow.Add(1)
		defer h.hangNow.Add(-1)
		for {
			peak := h.hangPeak.Load()
			if n <= peak || h.hangPeak.CompareAndSwap(peak, n) {
				break
			}
		}
		select {
		case <-r.Context().Done():
		case <-h.quit:
		}
	})); err != nil {
		return nil, err
	}
	if h.down, downURL, err = serveLocal(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.downHits.Add(1)
		w.WriteHeader(http.StatusInternalServerError)
	})); err != nil {
		h.stop()
		return nil, err
	}
	if h.throttled, thrURL, err = serveLocal(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.throttledHits.Add(1)
		w.WriteHeader(http.StatusNoContent)
	})); err != nil {
		h.stop()
		return nil, err
	}
	type tenant struct {
		name    string
		url     string
		n       int
		limits  outbox.Limits
		backlog int
	}
	tenants := []tenant{
		{"hostile_hang", hangURL, fairHangEndpoints, outbox.Limits{}, fairHangBacklog},
		{"hostile_throttled", thrURL, fairThrottledEndpoints, outbox.Limits{RatePerSecond: 0.01}, fairThrottledBacklog},
		{"hostile_down", downURL, fairDownEndpoints, outbox.Limits{}, fairDownBacklog},
	}
	for _, t := range tenants {
		for i := range t.n {
			if _, err := s.ob.CreateEndpoint(ctx, outbox.NewEndpoint{Tenant: t.name, URL: fmt.Sprintf("%s/%d", t.url, i), Limits: t.limits}); err != nil {
				h.stop()
				return nil, err
			}
		}
		if err := fillByEnqueue(ctx, s.db, s.ob, t.name, t.backlog); err != nil {
			h.stop()
			return nil, err
		}
		h.enqueued.Add(int64(t.backlog))
	}
	for _, t := range tenants {
		h.wg.Add(1)
		go func() {
			defer h.wg.Done()
			tick := time.NewTicker(time.Second / fairNoisePerTenant)
			defer tick.Stop()
			for i := 0; ; i++ {
				select {
				case <-h.quit:
					return
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				tx, err := s.db.BeginTx(ctx, nil)
				if err != nil {
					continue
				}
				if _, err := s.ob.Enqueue(ctx, tx, outbox.Event{Tenant: t.name, Type: "payment.succeeded",
					Payload: []byte(fmt.Sprintf(`{"noise":%d}`, i))}); err != nil {
					tx.Rollback()
					continue
				}
				if tx.Commit() == nil {
					h.enqueued.Add(1)
				}
			}
		}()
	}
	return h, nil
}

func (h *hostile) stop() {
	select {
	case <-h.quit:
		return
	default:
	}
	close(h.quit)
	h.wg.Wait()
	for _, srv := range []*http.Server{h.hang, h.down, h.throttled} {
		if srv != nil {
			srv.Close()
		}
	}
}
