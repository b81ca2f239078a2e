package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/txhook/txhook/internal/store"
)

// ErrInvalidSince: Recover was given a zero time or a time in the future.
var ErrInvalidSince = errors.New("txhook: recover: since must be a time in the past")

// Recovery bounds: candidates are read recoverScan at a time, and queued
// in transactions of at most recoverBatch events.
const (
	recoverScan  = 10000
	recoverBatch = 1000
	// recoverWindow is the first window of dispatch time a scan covers,
	// maxRecoverWindow the longest.
	recoverWindow    = time.Hour
	maxRecoverWindow = 24 * time.Hour
)

// Recover queues again, to one endpoint, every event since a time that it
// should have received and has not: a fresh delivery, due now, of each
// event of the endpoint's tenant created at or after since, of a type it
// subscribes to now, that has no delivery to it that succeeded or is still
// unfinished (pending, running, paused or blocked). That covers the events
// enqueued while the endpoint was disabled (by an operator, by DisableAfter
// or by a 410 with DisableOnGone), which are not queued for a disabled
// endpoint, and its dead-lettered ones, whose dead letters it removes as a
// replay does. Succeeded deliveries are not sent again. Call it after
// EnableEndpoint; on a disabled endpoint the deliveries wait, paused,
// until it is enabled.
//
// The deliveries carry the events' own IDs, so receivers that deduplicate
// on them stay safe. Events with an ordering key keep their order: the
// first of a key waits behind any delivery of that key to the endpoint
// that is still unfinished, and the next ones behind it. Events the relays
// have not dispatched yet (normally milliseconds after their commit) are
// left to them. Recover works in transactions of at most 1,000 events, so
// it can run while relays deliver, and returns how many deliveries it
// queued, even when it stops early with an error.
//
// Only events still stored can be recovered: an event that no delivery or
// dead letter refers to (the case of one skipped while its only endpoint
// was disabled) is pruned once it is Retention.Succeeded old (7 days by
// default). Recover reads the tenant's deliveries created since `since`
// (and the events no endpoint was sent), up to a day of them at a time:
// recover the window you need, not all of history.
//
// The error matches ErrEndpointNotFound for an unknown endpoint and
// ErrInvalidSince for a zero since or one in the future.
func (o *Outbox) Recover(ctx context.Context, endpointID string, since time.Time) (int, error) {
	if since.IsZero() || since.After(o.clock.Now()) {
		return 0, fmt.Errorf("%w (got %s)", ErrInvalidSince, since.UTC().Format(time.RFC3339))
	}
	if _, err := o.endpointRow(ctx, endpointID); err != nil {
		return 0, err
	}
	total := 0
	// Windows of dispatch time, in order, from a little before since to
	// a little after now, each starting at the next dispatch (quiet
	// stretches are skipped); a window holding more than recoverScan
	// candidates is halved until it does not, and windows grow again
	// while they hold fewer.
	from, end := since.Add(-store.RecoverSlack), o.clock.Now().Add(store.RecoverSlack)
	step := recoverWindow
	for from.Before(end) {
		next, ok, err := o.st.RecoverNext(ctx, endpointID, from)
		if err != nil {
			return total, fmt.Errorf("txhook: recover: %w", err)
		}
		if !ok || !next.Before(end) {
			break
		}
		if next.After(from) {
			from = next
		}
		to := from.Add(step)
		page, more, err := o.st.RecoverCandidates(ctx, endpointID, since, from, to, recoverScan)
		if err != nil {
			return total, fmt.Errorf("txhook: recover: %w", err)
		}
		if more && step > time.Millisecond {
			step /= 2
			continue
		}
		for rest := page; len(rest) > 0; {
			batch := rest[:min(len(rest), recoverBatch)]
			rest = rest[len(batch):]
			n, err := o.st.Recover(ctx, endpointID, batch, o.clock.Now())
			if store.IsNotFound(err) {
				return total, o.endpointErr(endpointID, err) // deleted meanwhile
			}
			if err != nil {
				return total, fmt.Errorf("txhook: recover: %w", err)
			}
			total += n
			if n > 0 {
				o.wake(ctx)
			}
		}
		from = to
		if !more {
			step = min(2*step, maxRecoverWindow)
		}
	}
	return total, nil
}
