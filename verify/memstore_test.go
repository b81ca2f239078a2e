package verify_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/txhook/txhook/verify"
	"github.com/txhook/txhook/verify/internal/storetest"
)

func TestMemoryStore(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T) storetest.Harness {
		clk := storetest.NewClock()
		return storetest.Harness{
			Store: verify.NewMemoryStore(verify.MemoryConfig{Now: clk.Now}),
			Lapse: func(*testing.T, string) { clk.Advance(storetest.Lease + time.Millisecond) },
		}
	})
}

func TestMemoryStoreDoneTTL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clk := storetest.NewClock()
	s := verify.NewMemoryStore(verify.MemoryConfig{Now: clk.Now, DoneTTL: time.Hour})
	if err := s.Complete(ctx, "e1", "a"); err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Hour - time.Millisecond)
	if st, _ := s.Claim(ctx, "e1", "b", time.Minute); st != verify.Done {
		t.Fatalf("within TTL: %v, want done", st)
	}
	clk.Advance(time.Millisecond)
	if st, _ := s.Claim(ctx, "e1", "b", time.Minute); st != verify.Acquired {
		t.Fatalf("after TTL: %v, want acquired", st)
	}
}

func TestMemoryStoreBound(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clk := storetest.NewClock()
	const max = 10
	s := verify.NewMemoryStore(verify.MemoryConfig{Now: clk.Now, MaxEntries: max})
	claim := func(id string) (verify.Status, error) { return s.Claim(ctx, id, "tok", time.Minute) }

	// Full of live claims: nothing may be dropped.
	for i := range max {
		if st, err := claim(fmt.Sprint("live", i)); st != verify.Acquired || err != nil {
			t.Fatalf("claim %d: %v %v", i, st, err)
		}
		clk.Advance(time.Second)
	}
	if _, err := claim("one-more"); !errors.Is(err, verify.ErrStoreFull) {
		t.Fatalf("claim into a store full of live claims: %v, want ErrStoreFull", err)
	}
	// An expired claim makes room: live0's lease ends now, the others later.
	clk.Advance(time.Minute - max*time.Second)
	if st, err := claim("one-more"); st != verify.Acquired || err != nil {
		t.Fatalf("after leases ended: %v %v", st, err)
	}
	if st, _ := claim("live1"); st != verify.InProgress {
		t.Fatalf("live1 = %v: evicted more than needed", st)
	}

	// Done entries are dropped before live claims, oldest first.
	s = verify.NewMemoryStore(verify.MemoryConfig{Now: clk.Now, MaxEntries: max})
	for i := range max / 2 {
		if err := s.Complete(ctx, fmt.Sprint("done", i), "tok"); err != nil {
			t.Fatal(err)
		}
		claim(fmt.Sprint("live", i))
	}
	for i := range max / 2 {
		if st, err := claim(fmt.Sprint("new", i)); st != verify.Acquired || err != nil {
			t.Fatalf("new%d: %v %v", i, st, err)
		}
		if st, _ := claim(fmt.Sprint("live", i)); st != verify.InProgress {
			t.Fatalf("live%d was dropped (%v) while done entries were left", i, st)
		}
	}
	if _, err := claim("full"); !errors.Is(err, verify.ErrStoreFull) {
		t.Fatalf("%v, want ErrStoreFull", err)
	}
}
