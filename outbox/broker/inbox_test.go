package broker_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/txhook/txhook/outbox"
	"github.com/txhook/txhook/verify"
)

// inbox is one endpoint's receiver as a merchant would write it: package
// verify's middleware, with a dedup store of its own (event IDs are the
// dedup key, and one event goes to several endpoints), in front of a
// handler that records each event it processes. Whatever gets past the
// dedup reaches the handler; the test checks that nothing reached it
// twice.
//
// It can also misbehave on purpose, deterministically by event:
// failFirst makes the handler fail (500, processing rolled back) the first
// time it sees an event; lie makes the receiver drop the connection after
// the handler processed an event, the first time, so the sender retries
// something done; hold, if set, runs before the handler (to block it).
type inbox struct {
	name      string
	mw        http.Handler
	failFirst func(eventID string) bool
	lie       func(eventID string) bool
	hold      func(r *http.Request, ev verify.Event)
	// check, if set, returns why ev should not have come here.
	check func(ev verify.Event) error

	mu        sync.Mutex
	processed map[string]int    // event ID → successful handler runs
	failed    map[string]bool   // failFirst done
	lied      map[string]bool   // lie done
	workers   map[string]string // event ID → the worker whose request the handler processed
	dupsBy    map[string]int    // event ID → requests stopped by the dedup store
	requests  int               // every request
	dups      int               // stopped by the dedup store: the event was done
	busy      int               // answered 409: another delivery of the event was being processed
	bad       int               // failed verification
	wrong     []string          // what check refused
}

func newInbox(t *testing.T, name string, ep outbox.Endpoint) *inbox {
	t.Helper()
	in := &inbox{name: name, processed: map[string]int{}, failed: map[string]bool{}, lied: map[string]bool{},
		workers: map[string]string{}, dupsBy: map[string]int{}}
	v, err := verify.New(verify.Config{Secrets: []string{ep.Secrets[0].Value},
		Store: verify.NewMemoryStore(verify.MemoryConfig{})})
	if err != nil {
		t.Fatal(err)
	}
	in.mw = v.Middleware(http.HandlerFunc(in.handle))
	return in
}

type lieKey struct{}

func (in *inbox) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// The middleware answers into a recorder, so that the answer can be
	// dropped after the handler (and the dedup store) took the event.
	lie := new(bool)
	rec := httptest.NewRecorder()
	in.mw.ServeHTTP(rec, r.WithContext(context.WithValue(r.Context(), lieKey{}, lie)))
	in.mu.Lock()
	in.requests++
	switch body := strings.TrimSpace(rec.Body.String()); {
	case rec.Code == http.StatusOK && body == "duplicate":
		in.dups++
		in.dupsBy[r.Header.Get(outbox.HeaderEventID)]++
	case rec.Code == http.StatusConflict:
		in.busy++
	case rec.Code == http.StatusUnauthorized || rec.Code == http.StatusBadRequest:
		in.bad++
	}
	in.mu.Unlock()
	if *lie {
		panic(http.ErrAbortHandler) // the connection closes without an answer
	}
	for k, v := range rec.Header() {
		w.Header()[k] = v
	}
	w.WriteHeader(rec.Code)
	_, _ = w.Write(rec.Body.Bytes())
}

func (in *inbox) handle(w http.ResponseWriter, r *http.Request) {
	ev, ok := verify.EventFrom(r.Context())
	if !ok {
		panic("no verified event")
	}
	if in.hold != nil {
		in.hold(r, ev)
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.check != nil {
		if err := in.check(ev); err != nil {
			in.wrong = append(in.wrong, fmt.Sprintf("%s: event %s: %v", in.name, ev.ID, err))
		}
	}
	if in.failFirst != nil && in.failFirst(ev.ID) && !in.failed[ev.ID] {
		in.failed[ev.ID] = true
		w.WriteHeader(http.StatusInternalServerError)
		return
	}
	in.processed[ev.ID]++
	in.workers[ev.ID] = r.Header.Get(headerWorker)
	if in.lie != nil && in.lie(ev.ID) && !in.lied[ev.ID] {
		in.lied[ev.ID] = true
		*r.Context().Value(lieKey{}).(*bool) = true
	}
	w.WriteHeader(http.StatusNoContent)
}

// inboxCounts is a snapshot of an inbox's counters.
type inboxCounts struct {
	requests, dups, busy, bad, lies int
}

func (in *inbox) counts() inboxCounts {
	in.mu.Lock()
	defer in.mu.Unlock()
	return inboxCounts{requests: in.requests, dups: in.dups, busy: in.busy, bad: in.bad, lies: len(in.lied)}
}

// runs returns how many times the handler processed the event.
func (in *inbox) runs(eventID string) int {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.processed[eventID]
}
