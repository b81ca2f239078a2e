package verify

import (
	"container/list"
	"context"
	"sync"
	"time"
)

// MemoryConfig configures a MemoryStore.
type MemoryConfig struct {
	// DoneTTL is how long a done event is remembered; zero means 24 hours.
	// Keep it longer than the sender retries (txhook's default: 24 hours).
	DoneTTL time.Duration
	// MaxEntries bounds the store; zero means 100 000. When full, expired
	// entries go first, then the oldest done ones; live claims are never
	// dropped (Claim fails with ErrStoreFull instead).
	MaxEntries int
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// MemoryStore is a Store in process memory: for a single receiver process,
// or tests. It forgets everything on restart.
type MemoryStore struct {
	cfg MemoryConfig

	mu     sync.Mutex
	m      map[string]*memEntry
	claims *list.List // of *memEntry, oldest claim first
	done   *list.List // of *memEntry, oldest completion first
}

type memEntry struct {
	id    string
	token string
	until time.Time // end of the lease, or of the done TTL
	done  bool
	elem  *list.Element
}

// NewMemoryStore returns an empty MemoryStore.
func NewMemoryStore(cfg MemoryConfig) *MemoryStore {
	if cfg.DoneTTL <= 0 {
		cfg.DoneTTL = 24 * time.Hour
	}
	if cfg.MaxEntries <= 0 {
		cfg.MaxEntries = 100_000
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &MemoryStore{cfg: cfg, m: map[string]*memEntry{}, claims: list.New(), done: list.New()}
}

// Claim implements Store.
func (s *MemoryStore) Claim(_ context.Context, id, token string, lease time.Duration) (Status, error) {
	now := s.cfg.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.m[id]; ok {
		if e.until.After(now) {
			if e.done {
				return Done, nil
			}
			return InProgress, nil
		}
		s.removeLocked(e)
	}
	if !s.makeRoomLocked(now) {
		return 0, ErrStoreFull
	}
	e := &memEntry{id: id, token: token, until: now.Add(lease)}
	e.elem = s.claims.PushBack(e)
	s.m[id] = e
	return Acquired, nil
}

// Complete implements Store.
func (s *MemoryStore) Complete(_ context.Context, id, _ string) error {
	now := s.cfg.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.m[id]
	switch {
	case ok && e.done:
		return nil
	case ok:
		s.claims.Remove(e.elem)
	default:
		if !s.makeRoomLocked(now) {
			return ErrStoreFull
		}
		e = &memEntry{id: id}
		s.m[id] = e
	}
	e.done, e.token, e.until = true, "", now.Add(s.cfg.DoneTTL)
	e.elem = s.done.PushBack(e)
	return nil
}

// Release implements Store.
func (s *MemoryStore) Release(_ context.Context, id, token string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.m[id]; ok && !e.done && e.token == token {
		s.removeLocked(e)
	}
	return nil
}

func (s *MemoryStore) removeLocked(e *memEntry) {
	if e.done {
		s.done.Remove(e.elem)
	} else {
		s.claims.Remove(e.elem)
	}
	delete(s.m, e.id)
}

// makeRoomLocked evicts until one entry fits, and reports whether it does.
func (s *MemoryStore) makeRoomLocked(now time.Time) bool {
	for len(s.m) >= s.cfg.MaxEntries {
		// The done list is in expiry order (one TTL for all); the claim
		// list is in claim order, which is expiry order for one lease.
		if f := s.done.Front(); f != nil && !f.Value.(*memEntry).until.After(now) {
			s.removeLocked(f.Value.(*memEntry))
			continue
		}
		if f := s.claims.Front(); f != nil && !f.Value.(*memEntry).until.After(now) {
			s.removeLocked(f.Value.(*memEntry))
			continue
		}
		if f := s.done.Front(); f != nil {
			s.removeLocked(f.Value.(*memEntry))
			continue
		}
		return false
	}
	return true
}
