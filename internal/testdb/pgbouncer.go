package testdb

import (
	"net/url"
	"strings"
	"testing"
)

// EnvPgBouncerDSN names the environment variable holding the DSN of the
// test database through PgBouncer in pool_mode = transaction
// (.ci/pgbouncer.sh starts one and prints it).
const EnvPgBouncerDSN = "TXHOOK_TEST_PGBOUNCER_DSN"

// EnvRequirePgBouncer, set to 1, makes a missing PgBouncer DSN fail the
// test instead of skipping it.
const EnvRequirePgBouncer = "TXHOOK_REQUIRE_PGBOUNCER"

// The PostgreSQL backends through PgBouncer.
var (
	// LibPQBouncer is lib/pq through PgBouncer.
	LibPQBouncer = Backend{Name: "pgbouncer-libpq", Driver: "postgres", Bouncer: true}
	// PGXBouncer is pgx's stdlib driver through PgBouncer.
	PGXBouncer = Backend{Name: "pgbouncer-pgx", Driver: "pgx", Bouncer: true}
)

// BouncerBackends are PostgreSQL through PgBouncer with both drivers.
var BouncerBackends = []Backend{LibPQBouncer, PGXBouncer}

// PoolerParams are the DSN settings that driver needs behind a pooler in
// transaction mode, as txhook's docs/drivers.md gives them: lib/pq sends each
// statement with its parameters in one go (binary_parameters), pgx uses
// unnamed statements only (default_query_exec_mode=cache_describe). Both
// drivers otherwise run a statement's parts in two server transactions,
// which the pooler may give to two server connections.
func PoolerParams(driver string) url.Values {
	switch driver {
	case LibPQ.Driver:
		return url.Values{"binary_parameters": {"yes"}}
	case PGX.Driver:
		return url.Values{"default_query_exec_mode": {"cache_describe"}}
	}
	return nil
}

// PgBouncerDSN returns the configured PgBouncer DSN, skipping (or failing,
// in CI) the test when there is none.
func PgBouncerDSN(t testing.TB) string {
	t.Helper()
	return envOrSkip(t, EnvPgBouncerDSN, EnvRequirePgBouncer, "PgBouncer",
		"run `export "+EnvPgBouncerDSN+"=$(bash .ci/pgbouncer.sh)` to run it")
}

// PgBouncer returns a pool through PgBouncer, with driver and the
// driver's PoolerParams, on a fresh schema of the configured PostgreSQL
// database, which PgBouncer must serve as database "test"; the schema is
// dropped when t ends. PgBouncer keeps no search_path, so the DSN selects
// no schema: DB.Schema names it.
func PgBouncer(t testing.TB, driver string) *DB {
	t.Helper()
	bouncer, base := PgBouncerDSN(t), PostgresDSN(t)
	schema, drop, err := createSchema(base)
	if err != nil {
		t.Fatal(err)
	}
	direct, err := withSearchPath(base, schema)
	if err != nil {
		drop()
		t.Fatal(err)
	}
	dsn, err := WithParams(bouncer, PoolerParams(driver))
	if err != nil {
		drop()
		t.Fatal(err)
	}
	b := LibPQBouncer
	if driver == PGX.Driver {
		b = PGXBouncer
	}
	return &DB{DB: openOrDrop(t, driver, dsn, drop), Backend: b, DSN: dsn, Schema: schema, DirectDSN: direct}
}

// WithParams adds params to a URL or key=value DSN.
func WithParams(dsn string, params url.Values) (string, error) {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return "", err
		}
		q := u.Query()
		for k, v := range params {
			q[k] = v
		}
		u.RawQuery = q.Encode()
		return u.String(), nil
	}
	for k, v := range params {
		dsn += " " + k + "=" + v[0]
	}
	return dsn, nil
}
