package store

import (
	"database/sql"
	"sync"
)

// local carries in-process wake-ups for databases without NOTIFY (SQLite).
var local sync.Map // *sql.DB -> *signal

type signal struct {
	mu   sync.Mutex
	subs map[chan struct{}]struct{}
}

func localSignal(db *sql.DB) *signal {
	v, _ := local.LoadOrStore(db, &signal{subs: map[chan struct{}]struct{}{}})
	return v.(*signal)
}

// WakeLocal wakes the relays of this process that use this database.
func (s *Store) WakeLocal() {
	sig := localSignal(s.DB)
	sig.mu.Lock()
	for c := range sig.subs {
		select {
		case c <- struct{}{}:
		default:
		}
	}
	sig.mu.Unlock()
}

// SubscribeLocal returns a channel that receives in-process wake-ups, and a
// function that unsubscribes it.
func (s *Store) SubscribeLocal() (<-chan struct{}, func()) {
	sig := localSignal(s.DB)
	c := make(chan struct{}, 1)
	sig.mu.Lock()
	sig.subs[c] = struct{}{}
	sig.mu.Unlock()
	return c, func() {
		sig.mu.Lock()
		delete(sig.subs, c)
		sig.mu.Unlock()
	}
}
