package redisstore_test

import (
	"context"
	"crypto/rand"
	"os"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/txhook/txhook/verify"
	"github.com/txhook/txhook/verify/internal/storetest"
	"github.com/txhook/txhook/verify/redisstore"
)

// Environment variables of the Redis tests.
const (
	envAddr    = "TXHOOK_TEST_REDIS_ADDR" // e.g. 127.0.0.1:6379
	envRequire = "TXHOOK_REQUIRE_REDIS"   // 1: a missing address fails
)

// client returns a client on the test Redis, or skips.
func client(t *testing.T) *redis.Client {
	t.Helper()
	addr := os.Getenv(envAddr)
	if addr == "" {
		if os.Getenv(envRequire) == "1" {
			t.Fatalf("%s is not set but %s=1: Redis tests are mandatory here", envAddr, envRequire)
		}
		t.Skipf("Redis test skipped: set %s (e.g. 127.0.0.1:6379) to run it", envAddr)
	}
	c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 64})
	t.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("Redis at %s: %v", addr, err)
	}
	return c
}

// prefix returns a random key prefix and deletes its keys when t ends.
func prefix(t *testing.T, c *redis.Client) string {
	p := "txhook-test:" + rand.Text() + ":"
	t.Cleanup(func() {
		ctx := context.Background()
		iter := c.Scan(ctx, 0, p+"*", 100).Iterator()
		for iter.Next(ctx) {
			c.Del(ctx, iter.Val())
		}
	})
	return p
}

func TestStore(t *testing.T) {
	t.Parallel()
	c := client(t)
	storetest.Run(t, func(t *testing.T) storetest.Harness {
		p := prefix(t, c)
		return storetest.Harness{
			Store: redisstore.New(c, redisstore.Config{Prefix: p}),
			Lapse: func(t *testing.T, id string) {
				// What the lease's expiry does, without waiting for it.
				if err := c.Del(context.Background(), p+"{"+id+"}:claim").Err(); err != nil {
					t.Fatal(err)
				}
			},
		}
	})
}

// The claim expires after the lease, the done marker after DoneTTL.
func TestStoreExpiry(t *testing.T) {
	t.Parallel()
	c := client(t)
	ctx := context.Background()
	p := prefix(t, c)
	s := redisstore.New(c, redisstore.Config{Prefix: p, DoneTTL: 48 * time.Hour})
	id := storetest.ID()
	if st, err := s.Claim(ctx, id, "a", 90*time.Second); st != verify.Acquired || err != nil {
		t.Fatalf("%v %v", st, err)
	}
	if ttl := c.PTTL(ctx, p+"{"+id+"}:claim").Val(); ttl <= 80*time.Second || ttl > 90*time.Second {
		t.Fatalf("claim TTL %s, want the 90s lease", ttl)
	}
	if err := s.Complete(ctx, id, "a"); err != nil {
		t.Fatal(err)
	}
	if n := c.Exists(ctx, p+"{"+id+"}:claim").Val(); n != 0 {
		t.Fatal("claim key left after Complete")
	}
	if ttl := c.PTTL(ctx, p+"{"+id+"}:done").Val(); ttl <= 47*time.Hour || ttl > 48*time.Hour {
		t.Fatalf("done TTL %s, want 48h", ttl)
	}
	// A lease shorter than a millisecond still expires rather than living forever.
	id = storetest.ID()
	if st, err := s.Claim(ctx, id, "a", time.Microsecond); err != nil || st != verify.Acquired {
		t.Fatalf("%v %v", st, err)
	}
	if ttl := c.PTTL(ctx, p+"{"+id+"}:claim").Val(); ttl > time.Millisecond {
		t.Fatalf("claim TTL %s", ttl)
	}
}

func TestStoreDown(t *testing.T) {
	t.Parallel()
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: time.Second})
	defer c.Close()
	s := redisstore.New(c, redisstore.Config{})
	if _, err := s.Claim(context.Background(), "e", "t", time.Minute); err == nil {
		t.Fatal("Claim against no Redis succeeded")
	}
}
