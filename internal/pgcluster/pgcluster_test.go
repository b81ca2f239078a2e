package pgcluster_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/txhook/txhook/internal/pgcluster"
)

// TestPrimaryReplicaFailover starts a primary with Production settings and a
// synchronous replica, checks a committed row reached the replica, kills the
// primary with SIGKILL, promotes the replica and writes to it through a
// multi-host DSN.
func TestPrimaryReplicaFailover(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	p := pgcluster.ForTest(t, pgcluster.Options{Settings: pgcluster.Production()})
	settings, err := p.ShowSettings(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var shown []string
	for _, s := range settings {
		shown = append(shown, s.String())
	}
	t.Logf("settings: %s", strings.Join(shown, " "))
	joined := " " + strings.Join(shown, " ") + " "
	if !strings.Contains(joined, " autovacuum=on ") || !strings.Contains(joined, " shared_buffers=256MB ") {
		t.Errorf("autovacuum=on, shared_buffers=256MB not among the server's settings: %v", shown)
	}

	if err := p.CreateDatabase(ctx, "app"); err != nil {
		t.Fatal(err)
	}
	if err := p.Exec(ctx, "app", "CREATE TABLE t (id int PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	r := p.ReplicaForTest(t, pgcluster.ReplicaOptions{Name: "standby1", Synchronous: true})
	if err := p.Exec(ctx, "app", "INSERT INTO t VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	multi := pgcluster.MultiHostDSN("app", p, r)
	conn, err := pgx.Connect(ctx, multi)
	if err != nil {
		t.Fatal(err)
	}
	var inRecovery bool
	if err := conn.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&inRecovery); err != nil || inRecovery {
		t.Fatalf("multi-host DSN reached a standby (%v, %v), want the primary", inRecovery, err)
	}
	conn.Close(ctx)

	// Synchronous commit: the row is on the replica's disk, so it survives
	// the primary's death.
	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	if p.Running() {
		t.Fatal("primary still running after Kill")
	}
	if rec, err := r.InRecovery(ctx); err != nil || !rec {
		t.Fatalf("replica in recovery = %v, %v; want true", rec, err)
	}
	if err := r.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	for _, dsn := range []string{multi, pgcluster.MultiHostKeywordDSN("app", p, r)} {
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Fatalf("connect %s: %v", dsn, err)
		}
		var n int
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM t WHERE id = 1").Scan(&n); err != nil || n != 1 {
			t.Fatalf("row committed before the crash: count %d, %v", n, err)
		}
		// The promoted server takes writes without waiting for a standby.
		if _, err := conn.Exec(ctx, "INSERT INTO t VALUES ($1)", len(dsn)); err != nil {
			t.Fatal(err)
		}
		conn.Close(ctx)
	}

	// The killed primary restarts (crash recovery) on its own port. It is
	// a second primary now (split brain): nothing connects to it below.
	if err := p.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.Exec(ctx, "app", "SELECT 1"); err != nil {
		t.Fatal(err)
	}
}

func TestBadReplicaName(t *testing.T) {
	p := pgcluster.ForTest(t, pgcluster.Options{})
	_, err := p.Replica(context.Background(), pgcluster.ReplicaOptions{Name: "x'; DROP"})
	if err == nil || !strings.Contains(err.Error(), "replica name") {
		t.Fatalf("err = %v, want a replica name error", err)
	}
	if errors.Is(err, pgcluster.ErrNoBinaries) {
		t.Fatal("wrong error")
	}
}
