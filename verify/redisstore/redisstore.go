// Package redisstore is a verify.Store in Redis, for receivers that run as
// several processes and already have Redis at hand.
//
// A claim is a key set with SET NX and an expiry (the lease), so a claim
// of a receiver that died frees itself; completing writes a longer-lived
// done marker. Each operation is one Lua script, so the check for the done
// marker and the claim happen atomically.
//
// Redis forgets keys under memory pressure if its eviction policy allows,
// and may lose recent writes on a crash. Where that matters, back it with
// verify.SQLStore's MarkDoneTx in the business transaction: Redis at the
// door, the unique constraint as the backstop.
//
//	st := redisstore.New(redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"}), redisstore.Config{})
//	v, err := verify.New(verify.Config{Secrets: secrets, Store: st})
package redisstore

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/txhook/txhook/verify"
)

// Config configures a Store.
type Config struct {
	// Prefix starts every key; empty means "txhook:inbox:". Keys are
	// Prefix+"{"+id+"}:claim" and Prefix+"{"+id+"}:done", so that both keys
	// of an event share a Redis Cluster slot.
	Prefix string
	// DoneTTL is how long a done marker lives; zero means 7 days. Keep it
	// well above the sender's retry horizon.
	DoneTTL time.Duration
}

// Store is a verify.Store in Redis.
type Store struct {
	c   redis.Scripter
	cfg Config
}

var _ verify.Store = (*Store)(nil)

// New returns a Store on c: a *redis.Client, *redis.ClusterClient or
// *redis.Ring.
func New(c redis.Scripter, cfg Config) *Store {
	if cfg.Prefix == "" {
		cfg.Prefix = "txhook:inbox:"
	}
	if cfg.DoneTTL <= 0 {
		cfg.DoneTTL = 7 * 24 * time.Hour
	}
	return &Store{c: c, cfg: cfg}
}

// KEYS: claim, done. ARGV: token, lease in ms.
var claimScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[2]) == 1 then return 2 end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
return 3
`)

// KEYS: claim, done. ARGV: done TTL in ms.
var completeScript = redis.NewScript(`
redis.call('SET', KEYS[2], '1', 'PX', ARGV[1])
redis.call('DEL', KEYS[1])
return 1
`)

// KEYS: claim, done. ARGV: token.
var releaseScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
`)

func (s *Store) keys(id string) []string {
	k := s.cfg.Prefix + "{" + id + "}:"
	return []string{k + "claim", k + "done"}
}

// Claim implements verify.Store.
func (s *Store) Claim(ctx context.Context, id, token string, lease time.Duration) (verify.Status, error) {
	n, err := claimScript.Run(ctx, s.c, s.keys(id), token, max(lease.Milliseconds(), 1)).Int()
	if err != nil {
		return 0, fmt.Errorf("redisstore: claim: %w", err)
	}
	switch n {
	case 1:
		return verify.Acquired, nil
	case 2:
		return verify.Done, nil
	}
	return verify.InProgress, nil
}

// Complete implements verify.Store.
func (s *Store) Complete(ctx context.Context, id, _ string) error {
	if err := completeScript.Run(ctx, s.c, s.keys(id), max(s.cfg.DoneTTL.Milliseconds(), 1)).Err(); err != nil {
		return fmt.Errorf("redisstore: complete: %w", err)
	}
	return nil
}

// Release implements verify.Store.
func (s *Store) Release(ctx context.Context, id, token string) error {
	if err := releaseScript.Run(ctx, s.c, s.keys(id), token).Err(); err != nil {
		return fmt.Errorf("redisstore: release: %w", err)
	}
	return nil
}
