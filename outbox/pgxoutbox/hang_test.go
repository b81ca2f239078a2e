package pgxoutbox_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/txhook/txhook/internal/pgcluster"
	"github.com/txhook/txhook/outbox/pgxoutbox"
)

// A server that hangs without closing the listening connection (SIGSTOP:
// a paused VM, an old primary left running after a failover) makes Listen
// return, so the relay listens again elsewhere instead of waiting forever
// for notifications that cannot come.
func TestListenerGivesUpOnHungServer(t *testing.T) {
	c := pgcluster.ForTest(t, pgcluster.Options{})
	db, err := sql.Open("pgx", c.DSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	listening := make(chan struct{}, 1)
	done := make(chan error, 1)
	go func() {
		done <- pgxoutbox.Listener().Listen(context.Background(), db, "txhook_wake", func() {
			select {
			case listening <- struct{}{}:
			default:
			}
		})
	}()
	select {
	case <-listening:
	case err := <-done:
		t.Fatalf("Listen returned before listening: %v", err)
	case <-time.After(time.Minute):
		t.Fatal("Listen did not start listening")
	}
	if err := c.Freeze(); err != nil {
		t.Fatal(err)
	}
	// The listener notices within its idle period plus its ping timeout
	// (25 s); the bound is generous for a loaded machine.
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("Listen returned nil")
		}
		t.Logf("Listen returned: %v", err)
	case <-time.After(2 * time.Minute):
		t.Fatal("Listen still waiting on a hung server after 2 minutes")
	}
	if err := c.Thaw(); err != nil {
		t.Fatal(err)
	}
}
