package store_test

import (
	"strings"
	"testing"

	"github.com/txhook/txhook/internal/store"
)

func TestCleanText(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, in string
		limit    int
		want     string
	}{
		{"plain", "HTTP 503", 64, "HTTP 503"},
		{"tab and newline kept", "a\tb\nc", 64, "a\tb\nc"},
		{"crlf becomes lf", "a\r\nb", 64, "a\nb"},
		{"lone cr escaped", "a\rb", 64, `a\x0db`},
		{"nul from a certificate", "x509: certificate is valid for \x00evil.example, not localhost", 128,
			`x509: certificate is valid for \x00evil.example, not localhost`},
		{"escape and del", "\x1b[31mred\x7f", 64, `\x1b[31mred\x7f`},
		{"c1 control", "a\u009bb", 64, `a\u009bb`},
		{"bidi override", "abc\u202edcb", 64, `abc\u202edcb`},
		{"invalid utf-8 run", "a\xff\xfe\xfdb", 64, "a\uFFFDb"},
		{"truncated rune", "a\xe2\x82", 64, "a\uFFFD"},
		{"unicode kept", "reçu ✓ 支付", 64, "reçu ✓ 支付"},
		{"cut on a rune boundary", "ééééé", 8, "éé…"},
		{"cut before an escape", "abcd\x00", 6, "abc…"},
		{"tiny limit", "abcdef", 2, "ab"},
		{"zero limit", "abc", 0, ""},
	}
	for _, c := range cases {
		got := store.CleanText(c.in, c.limit)
		if got != c.want {
			t.Errorf("%s: CleanText(%q, %d) = %q, want %q", c.name, c.in, c.limit, got, c.want)
		}
		checkClean(t, c.name, got, max(c.limit, 0))
		if again := store.CleanText(got, c.limit); again != got {
			t.Errorf("%s: not idempotent: %q then %q", c.name, got, again)
		}
	}
}

func TestCleanTextBounds(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("\x00", 4096)
	got := store.CleanError(long)
	checkClean(t, "error", got, store.MaxErrorBytes)
	if !strings.HasSuffix(got, "…") || !strings.HasPrefix(got, `\x00\x00`) {
		t.Fatalf("cut error text = %q…", got[:16])
	}
	body := strings.Repeat("é\x01", 3000)
	checkClean(t, "excerpt", store.CleanExcerpt(body), store.MaxExcerptBytes)
}

func TestCompletionCleanCopiesRecords(t *testing.T) {
	t.Parallel()
	recs := []store.AttemptRecord{{Attempt: 1, Error: "lease expired"}, {Attempt: 2, Status: 1 << 40, Excerpt: "a\x00", Error: "b\xff"}}
	c := store.Completion{Status: -1, Error: "x\x00", Records: recs}.Clean()
	if recs[1].Excerpt != "a\x00" || recs[1].Status != 1<<40 {
		t.Fatal("Clean modified the caller's records")
	}
	want := store.AttemptRecord{Attempt: 2, Status: 0, Excerpt: `a\x00`, Error: "b\uFFFD"}
	if c.Records[1] != want || c.Records[0] != recs[0] || c.Status != 0 || c.Error != `x\x00` {
		t.Fatalf("cleaned = %+v", c)
	}
}
