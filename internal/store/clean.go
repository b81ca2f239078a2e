package store

import (
	"unicode/utf8"
)

// Receiver text is anything a receiver chose that txhook stores or shows:
// the error text of an attempt (which quotes TLS certificate names, DNS
// names from redirect targets, parse errors), the response excerpt, the
// status. Every write of an outcome cleans it here, so no caller can
// forget; the relay cleans it once more where the outcome is made, so its
// logs and callbacks carry the same text the database does.

// Limits on receiver text, in bytes, after cleaning.
const (
	// MaxErrorBytes bounds the error text of an attempt and a delivery's
	// last error: enough for any message txhook makes, not for a
	// certificate listing ten thousand names.
	MaxErrorBytes = 1024
	// MaxExcerptBytes bounds the stored start of a response body, as the
	// HTTP client already does before cleaning.
	MaxExcerptBytes = 4096
)

// ellipsis ends text that CleanText cut.
const ellipsis = "…"

// CleanText returns s made safe to store in either dialect, to log and to
// show: valid UTF-8 (each run of invalid bytes becomes U+FFFD), no NUL,
// no control character but tab and newline ("\r\n" becomes "\n", any
// other control character an escape such as `\x00` or `\u009b`), no
// bidirectional override or isolate (written `\u202e`), and at most limit
// bytes, cut on a character boundary and marked with "…". Clean text comes
// back unchanged, so cleaning twice is cleaning once.
//
// Why escapes rather than dropping: an operator reading "valid for
// \x00evil.example" sees what the receiver did. Why those characters:
// PostgreSQL refuses NUL in text (and in jsonb strings), SQLite stores
// invalid UTF-8 that every reader then chokes on, and the other control
// characters and bidi overrides rewrite a terminal or disguise text in the
// operations UI. Tab and newline are kept because response bodies and
// multi-line error messages are readable only with them, and nothing that
// stores or shows text treats them specially.
func CleanText(s string, limit int) string {
	if limit <= 0 {
		return ""
	}
	if len(s) <= limit && plain(s) {
		return s
	}
	mark := ellipsis
	if limit < len(mark) {
		mark = ""
	}
	out := make([]byte, 0, min(len(s)+8, limit))
	fit := 0 // length of out at the last boundary that leaves room for mark
	var esc [6]byte
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		var tok []byte
		switch {
		case r == utf8.RuneError && size == 1:
			for i+size < len(s) {
				r, n := utf8.DecodeRuneInString(s[i+size:])
				if r != utf8.RuneError || n != 1 {
					break
				}
				size++
			}
			tok = []byte("\uFFFD")
		case r == '\r' && i+1 < len(s) && s[i+1] == '\n':
			i++
			continue
		case r == '\t' || r == '\n':
			tok = []byte(s[i : i+size])
		case r < 0x20 || r == 0x7f:
			tok = append(esc[:0], '\\', 'x', hexDigit(byte(r)>>4), hexDigit(byte(r)&15))
		case 0x80 <= r && r <= 0x9f, 0x202a <= r && r <= 0x202e, 0x2066 <= r && r <= 0x2069:
			tok = append(esc[:0], '\\', 'u', hexDigit(byte(r>>12)&15), hexDigit(byte(r>>8)&15), hexDigit(byte(r>>4)&15), hexDigit(byte(r)&15))
		default:
			tok = []byte(s[i : i+size])
		}
		if len(out)+len(tok) > limit {
			return string(append(out[:fit], mark...))
		}
		out = append(out, tok...)
		if len(out)+len(mark) <= limit {
			fit = len(out)
		}
		i += size
	}
	return string(out)
}

// plain reports whether s is printable ASCII, tabs and newlines only: the
// common case, which needs no copy.
func plain(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < 0x20 && c != '\t' && c != '\n') || c >= 0x7f {
			return false
		}
	}
	return true
}

func hexDigit(b byte) byte { return "0123456789abcdef"[b&15] }

// CleanError is CleanText for the error text of an attempt.
func CleanError(s string) string { return CleanText(s, MaxErrorBytes) }

// CleanExcerpt is CleanText for the stored start of a response body.
func CleanExcerpt(s string) string { return CleanText(s, MaxExcerptBytes) }

// CleanStatus returns status when it is a three-digit HTTP status, else 0
// (no response): net/http never reports another, and the column is a
// 32-bit integer.
func CleanStatus(status int) int {
	if status < 100 || status > 999 {
		return 0
	}
	return status
}

// Clean returns c with every value a receiver chose made safe to store. The
// records are copied when one of them changes, never modified in place.
func (c Completion) Clean() Completion {
	c.Error = CleanError(c.Error)
	c.Status = CleanStatus(c.Status)
	for i, r := range c.Records {
		if cr := r.Clean(); cr != r {
			c.Records = append([]AttemptRecord(nil), c.Records...)
			for j := i; j < len(c.Records); j++ {
				c.Records[j] = c.Records[j].Clean()
			}
			break
		}
	}
	return c
}

// Clean returns r with its error text, excerpt and status cleaned.
func (r AttemptRecord) Clean() AttemptRecord {
	r.Error = CleanError(r.Error)
	r.Excerpt = CleanExcerpt(r.Excerpt)
	r.Status = CleanStatus(r.Status)
	return r
}
