package outbox

import (
	"context"
	"time"

	"github.com/txhook/txhook/signer"
)

// DefaultRotationOverlap is how long a replaced secret keeps signing.
const DefaultRotationOverlap = 24 * time.Hour

// Rotation describes a secret rotation.
type Rotation struct {
	// Secret is the new secret; empty means a new "whsec_" secret from
	// crypto/rand.
	Secret string
	// Overlap is how long the secrets in use keep signing alongside the new
	// one, so the receiver can switch at its own pace. Default 24 h;
	// negative retires them at once.
	Overlap time.Duration
}

// RotateSecret gives an endpoint a new signing secret without downtime:
// from now on every request carries a signature by the new secret and, until
// the overlap ends, one by each secret in use before, so a receiver verifying
// with either one accepts it. Secrets whose overlap has ended are dropped.
// It returns the endpoint with its secrets, newest first. With
// Config.SecretCipher set, the secrets are stored encrypted under its
// current key, whatever form they had before.
func (o *Outbox) RotateSecret(ctx context.Context, id string, r Rotation) (Endpoint, error) {
	if err := checkEndpointID(id); err != nil {
		return Endpoint{}, err
	}
	secret := r.Secret
	var err error
	if secret == "" {
		if secret, err = signer.GenerateSecret(); err != nil {
			return Endpoint{}, err
		}
	} else if err := checkSecret(secret); err != nil {
		return Endpoint{}, err
	}
	overlap := r.Overlap
	if overlap == 0 {
		overlap = DefaultRotationOverlap
	}
	now := o.clock.Now().UTC()
	err = o.st.ModifySecrets(ctx, id, now, func(cur []byte) ([]byte, error) {
		old, err := o.openSecrets(ctx, id, cur)
		if err != nil {
			return nil, err
		}
		next := []Secret{{Value: secret, CreatedAt: now}}
		end := now.Add(overlap)
		for _, s := range old {
			if !s.Active(now) || overlap < 0 || s.Value == secret {
				continue
			}
			if s.ExpiresAt.IsZero() || s.ExpiresAt.After(end) {
				s.ExpiresAt = end
			}
			next = append(next, s)
		}
		return o.sealSecrets(ctx, id, next)
	})
	if err != nil {
		return Endpoint{}, o.endpointErr(id, err)
	}
	return o.Endpoint(ctx, id)
}
