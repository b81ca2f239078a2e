package verify

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"net/http"
	"sync"
	"time"
)

// storeTimeout bounds Complete and Release, which run after the request's
// context may have ended.
const storeTimeout = 10 * time.Second

type ctxKey struct{}

// delivery is the per-request state the handler reaches through its context.
type delivery struct {
	ev       Event
	finish   func(error) // completes (nil) or releases the claim, once
	mu       sync.Mutex
	deferred bool
}

// EventFrom returns the verified event of a request that passed through
// Middleware.
func EventFrom(ctx context.Context) (Event, bool) {
	d, ok := ctx.Value(ctxKey{}).(*delivery)
	if !ok {
		return Event{}, false
	}
	return d.ev, true
}

// Async tells Middleware that the handler acknowledges now and processes
// the event after it returns. Call it before returning; it returns done,
// which the background work must call once when it ends: done(nil) marks
// the event processed, done(err) releases the claim so the sender's retry
// processes it again. Until then, retries are answered 409 (mind
// Config.Lease). Once Async is called, only done decides the claim's fate,
// not the handler's status; unless the handler writes a status itself, the
// middleware answers 202 Accepted. If the handler panics, the claim is
// released and done does nothing. Outside Middleware, done does nothing.
//
// Call Async once the work is sure to be handed over, or call done(err)
// yourself if the hand-over fails (a full queue): a claim that nobody
// settles blocks retries until its lease ends.
func Async(ctx context.Context) (done func(err error)) {
	d, ok := ctx.Value(ctxKey{}).(*delivery)
	if !ok {
		return func(error) {}
	}
	d.mu.Lock()
	d.deferred = true
	d.mu.Unlock()
	return d.finish
}

// errHandlerStatus releases a claim after a handler's non-2xx answer.
var errHandlerStatus = errors.New("verify: handler did not answer 2xx")

// Middleware verifies each request, deduplicates it through Config.Store
// and passes it to next with the Event in its context (see EventFrom) and
// r.Body holding the raw body again. Its answers:
//
//   - 413 if the body exceeds Config.MaxBodyBytes;
//   - 401 with a short reason ("timestamp too old") if verification fails,
//     400 if the signed body is not an event envelope;
//   - 200 if the event's type is not in Config.Types, or the event is done;
//   - 409 if another delivery of the event is being processed;
//   - 503 if the store fails;
//   - otherwise next's answer.
//
// next signals failure by answering anything but 2xx, or by panicking:
// the claim is released and the sender's retry will reach next again. A
// 2xx answer (or none, which net/http sends as 200) completes the claim.
// See Async for handlers that acknowledge before processing.
func (v *Verifier) Middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		v.serve(w, r, next)
	})
}

func (v *Verifier) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	if r.ContentLength > v.cfg.MaxBodyBytes {
		v.reject(w, r, http.StatusRequestEntityTooLarge, "body too large", nil)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, v.cfg.MaxBodyBytes))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			v.reject(w, r, http.StatusRequestEntityTooLarge, "body too large", nil)
		} else {
			v.reject(w, r, http.StatusBadRequest, "cannot read body", err)
		}
		return
	}
	ev, err := v.Verify(r.Header, body)
	if err != nil {
		code, reason := rejection(err)
		if code == http.StatusInternalServerError {
			v.log.Error("txhook: webhook receiver misconfigured", "error", err)
		}
		v.reject(w, r, code, reason, err)
		return
	}
	if v.types != nil && !v.types[ev.Type] {
		v.log.Debug("txhook: webhook type ignored", "event", ev.ID, "type", ev.Type)
		answer(w, http.StatusOK, "ignored")
		return
	}

	d := &delivery{ev: ev, finish: func(error) {}}
	if st := v.cfg.Store; st != nil {
		token := rand.Text()
		status, err := st.Claim(r.Context(), ev.ID, token, v.cfg.Lease)
		if err != nil {
			v.log.Error("txhook: dedup store claim failed", "event", ev.ID, "error", err)
			answer(w, http.StatusServiceUnavailable, "dedup store unavailable")
			return
		}
		switch status {
		case Done:
			v.log.Debug("txhook: webhook duplicate", "event", ev.ID)
			answer(w, http.StatusOK, "duplicate")
			return
		case InProgress:
			v.log.Debug("txhook: webhook in progress elsewhere", "event", ev.ID)
			answer(w, http.StatusConflict, "in progress")
			return
		case Acquired:
		default:
			v.log.Error("txhook: dedup store returned an unknown status", "event", ev.ID, "status", status)
			answer(w, http.StatusServiceUnavailable, "dedup store unavailable")
			return
		}
		var once sync.Once
		bg := context.WithoutCancel(r.Context())
		d.finish = func(err error) {
			once.Do(func() { v.settle(bg, st, ev.ID, token, err) })
		}
	}

	sw := &statusWriter{ResponseWriter: w}
	r = r.WithContext(context.WithValue(r.Context(), ctxKey{}, d))
	r.Body = io.NopCloser(bytes.NewReader(body))
	defer func() {
		if p := recover(); p != nil {
			d.finish(errors.New("verify: handler panicked"))
			panic(p)
		}
	}()
	next.ServeHTTP(sw, r)

	d.mu.Lock()
	deferred := d.deferred
	d.mu.Unlock()
	switch {
	case deferred:
		if !sw.wrote {
			answer(sw, http.StatusAccepted, "accepted")
		}
	case sw.wrote && (sw.status < 200 || sw.status > 299):
		d.finish(errHandlerStatus)
	default:
		d.finish(nil)
	}
}

// settle completes (err == nil) or releases a claim.
func (v *Verifier) settle(ctx context.Context, st Store, id, token string, err error) {
	ctx, cancel := context.WithTimeout(ctx, storeTimeout)
	defer cancel()
	if err == nil {
		if err := st.Complete(ctx, id, token); err != nil {
			v.log.Error("txhook: dedup store complete failed; retries get 409 until the lease ends", "event", id, "error", err)
		}
		return
	}
	v.log.Info("txhook: webhook processing failed; claim released", "event", id, "error", err)
	if err := st.Release(ctx, id, token); err != nil {
		v.log.Error("txhook: dedup store release failed; retries get 409 until the lease ends", "event", id, "error", err)
	}
}

// rejection maps a Verify error to a status and a reason safe to send.
func rejection(err error) (int, string) {
	switch {
	case errors.Is(err, ErrInvalidSecret):
		return http.StatusInternalServerError, "receiver misconfigured"
	case errors.Is(err, ErrMalformedBody):
		return http.StatusBadRequest, "body is not a webhook event"
	case errors.Is(err, ErrMissingHeader):
		return http.StatusUnauthorized, "missing signature header"
	case errors.Is(err, ErrMalformedHeader):
		return http.StatusUnauthorized, "malformed signature header"
	case errors.Is(err, ErrTimestampTooOld):
		return http.StatusUnauthorized, "timestamp too old"
	case errors.Is(err, ErrTimestampTooNew):
		return http.StatusUnauthorized, "timestamp too new"
	}
	return http.StatusUnauthorized, "no matching signature"
}

func (v *Verifier) reject(w http.ResponseWriter, r *http.Request, code int, reason string, err error) {
	if code < 500 {
		attrs := []any{"status", code, "reason", reason, "remote", r.RemoteAddr}
		if err != nil {
			attrs = append(attrs, "error", err)
		}
		v.log.Info("txhook: webhook rejected", attrs...)
	}
	answer(w, code, reason)
}

func answer(w http.ResponseWriter, code int, text string) {
	http.Error(w, text, code)
}

// statusWriter records the status the handler answers with.
type statusWriter struct {
	http.ResponseWriter
	status int
	wrote  bool
}

func (w *statusWriter) WriteHeader(code int) {
	if !w.wrote && code >= 200 {
		w.status, w.wrote = code, true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if !w.wrote {
		w.status, w.wrote = http.StatusOK, true
	}
	return w.ResponseWriter.Write(b)
}

// Flush keeps http.Flusher working for handlers that stream.
func (w *statusWriter) Flush() {
	if !w.wrote {
		w.status, w.wrote = http.StatusOK, true
	}
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
