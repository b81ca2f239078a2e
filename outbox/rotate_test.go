package outbox_test

import (
	"errors"
	"testing"
	"time"

	"github.com/txhook/txhook/internal/clock"
	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/outbox"
	"github.com/txhook/txhook/verify"
)

func TestRotateSecretOverlapThenExpiry(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		fake := clock.NewFake(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
		b := setup(t, db, outbox.Config{Clock: fake})
		rc := newReceiver(t, nil)
		ep := b.endpoint("m", rc.URL)
		oldSecret := ep.Secrets[0].Value

		rotated, err := b.ob.RotateSecret(b.ctx, ep.ID, outbox.Rotation{})
		if err != nil {
			t.Fatal(err)
		}
		if len(rotated.Secrets) != 2 || rotated.Secrets[1].Value != oldSecret || rotated.Secrets[0].Value == oldSecret {
			t.Fatalf("after rotation: %v", rotated.Secrets)
		}
		newSecret := rotated.Secrets[0].Value
		if want := fake.Now().Add(24 * time.Hour); !rotated.Secrets[1].ExpiresAt.Equal(want) || !rotated.Secrets[0].ExpiresAt.IsZero() {
			t.Fatalf("expiries %v / %v, want old to end at %v", rotated.Secrets[0].ExpiresAt, rotated.Secrets[1].ExpiresAt, want)
		}
		verifier := func(secrets ...string) *verify.Verifier {
			v, err := verify.New(verify.Config{Secrets: secrets, Now: fake.Now})
			if err != nil {
				t.Fatal(err)
			}
			return v
		}
		b.relay(roomy(outbox.RelayConfig{}))

		// During the overlap: receivers holding either secret accept.
		b.enqueue(outbox.Event{Tenant: "m", Type: "a", Payload: []byte(`1`)})
		got := rc.next(t)
		for name, v := range map[string]*verify.Verifier{"old": verifier(oldSecret), "new": verifier(newSecret), "both": verifier(oldSecret, newSecret)} {
			if _, err := v.Verify(got.Header, got.Body); err != nil {
				t.Errorf("during overlap, receiver with the %s secret rejects: %v", name, err)
			}
		}

		// After it: only the new secret signs. The receiver has had the
		// request, but the relay may not have its answer yet; moving the
		// relay's clock a day while the request is in flight would make it
		// a day-long request to the scheduler, which then paces the
		// endpoint's next delivery minutes of that clock away, and the
		// clock does not move again. So the outcome is written first.
		b.eventually("the first delivery recorded", func() bool {
			return b.count("SELECT count(*) FROM txhook_deliveries WHERE state = 'succeeded'") == 1
		})
		fake.Advance(24*time.Hour + time.Second)
		b.enqueue(outbox.Event{Tenant: "m", Type: "a", Payload: []byte(`2`)})
		got = rc.next(t)
		if _, err := verifier(newSecret).Verify(got.Header, got.Body); err != nil {
			t.Errorf("after overlap, new secret rejects: %v", err)
		}
		if _, err := verifier(oldSecret).Verify(got.Header, got.Body); !errors.Is(err, verify.ErrNoMatchingSignature) {
			t.Errorf("after overlap, old secret: %v, want no matching signature", err)
		}

		// A second rotation drops the expired secret for good.
		again, err := b.ob.RotateSecret(b.ctx, ep.ID, outbox.Rotation{Secret: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", Overlap: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		if len(again.Secrets) != 2 || again.Secrets[1].Value != newSecret {
			t.Fatalf("second rotation: %v", again.Secrets)
		}
		if _, err := b.ob.RotateSecret(b.ctx, "ep_missing", outbox.Rotation{}); !errors.Is(err, outbox.ErrEndpointNotFound) {
			t.Fatalf("rotate missing endpoint: %v", err)
		}
		if _, err := b.ob.RotateSecret(b.ctx, ep.ID, outbox.Rotation{Secret: "short"}); !errors.Is(err, outbox.ErrInvalidSecret) {
			t.Fatalf("rotate to bad secret: %v", err)
		}
	})
}
