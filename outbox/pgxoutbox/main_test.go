package pgxoutbox_test

import (
	"flag"
	"fmt"
	"os"
	"testing"

	"github.com/txhook/txhook/internal/testdb"
)

// TestMain skips the Examples, which need PostgreSQL and cannot skip
// themselves, when there is none, as the tests skip; CI requires it.
func TestMain(m *testing.M) {
	flag.Parse()
	if os.Getenv(testdb.EnvDSN) == "" {
		if os.Getenv(testdb.EnvRequire) == "1" {
			fmt.Fprintf(os.Stderr, "%s is not set but %s=1: PostgreSQL tests are mandatory here\n", testdb.EnvDSN, testdb.EnvRequire)
			os.Exit(1)
		}
		fmt.Fprintf(os.Stderr, "pgxoutbox: Examples skipped: set %s to run them\n", testdb.EnvDSN)
		skip := "^Example"
		if s := flag.Lookup("test.skip").Value.String(); s != "" {
			skip = s + "|" + skip
		}
		flag.Set("test.skip", skip)
	}
	os.Exit(m.Run())
}

// exampleDSN returns a DSN on a fresh schema of the test database, and a
// function that drops it.
func exampleDSN() (string, func()) {
	dsn, drop, err := testdb.NewSchema(os.Getenv(testdb.EnvDSN))
	if err != nil {
		panic(err)
	}
	return dsn, drop
}
