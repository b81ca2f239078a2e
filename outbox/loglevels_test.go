package outbox_test

import (
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/outbox"
)

// A failed attempt that will be retried is routine: Info. What an operator
// must act on is Warn: a dead letter, an endpoint disabled.
func TestLogLevels(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		logs := newLogRecorder()
		b := setup(t, db, outbox.Config{Logger: slog.New(logs), SecretCipher: keyring(t, aesKey(t, "k1"))})
		rc := newReceiver(t, func(_ int, r *http.Request) int {
			if strings.HasSuffix(r.URL.Path, "/gone") {
				return http.StatusGone
			}
			return http.StatusInternalServerError
		})
		b.endpoint("m", rc.URL+"/failing", "a")
		gone := b.endpoint("m", rc.URL+"/gone", "b")
		b.relay(outbox.RelayConfig{Retry: fastRetryAttempts(2), DisableOnGone: true})
		b.enqueue(outbox.Event{Tenant: "m", Type: "a", Payload: []byte(`1`)})
		b.enqueue(outbox.Event{Tenant: "m", Type: "b", Payload: []byte(`2`)})

		level := func(prefix string) (slog.Level, bool) {
			for _, r := range logs.records() {
				if strings.HasPrefix(r.Msg, prefix) {
					return r.Level, true
				}
			}
			return 0, false
		}
		b.eventually("dead-lettered and disabled", func() bool {
			_, dead := level("txhook: delivery dead-lettered")
			_, disabled := level("txhook: endpoint disabled")
			return dead && disabled
		})
		want := map[string]slog.Level{
			"txhook: delivery failed; will retry": slog.LevelInfo,
			"txhook: delivery dead-lettered":      slog.LevelWarn,
			"txhook: endpoint disabled":           slog.LevelWarn,
		}
		for prefix, lv := range want {
			if got, ok := level(prefix); !ok || got != lv {
				t.Errorf("%q logged at %v (found %v), want %v", prefix, got, ok, lv)
			}
		}
		for _, r := range logs.records() {
			if r.Level >= slog.LevelWarn && strings.Contains(r.Msg, "will retry") && r.Attrs["endpoint"] != "" {
				t.Errorf("a retried attempt logged at %v: %s", r.Level, r.Msg)
			}
		}
		if ep, err := b.ob.Endpoint(b.ctx, gone.ID); err != nil || ep.Enabled {
			t.Fatalf("gone endpoint: enabled %v, %v", ep.Enabled, err)
		}
	})
}
