package outbox_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/outbox"
)

func TestMigrateConcurrentlyAndTwice(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		var wg sync.WaitGroup
		errs := make(chan error, 4)
		for range 4 {
			// Separate pools, as separate processes would have.
			other := testdb.Reopen(t, db)
			wg.Add(1)
			go func() {
				defer wg.Done()
				ob, err := outbox.New(ctx, other, outbox.Config{Logger: quietLogger()})
				if err == nil {
					err = ob.Migrate(ctx)
				}
				errs <- err
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatalf("concurrent migrate: %v", err)
			}
		}
		b := setup(t, db, outbox.Config{}) // migrates once more
		if err := b.ob.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		if n := b.count("SELECT count(*) FROM txhook_migrations"); n < 1 {
			t.Fatalf("migrations recorded: %d", n)
		}
		if n := b.count("SELECT count(DISTINCT version) FROM txhook_migrations"); n != b.count("SELECT count(*) FROM txhook_migrations") {
			t.Fatal("a migration was recorded twice")
		}
	})
}
