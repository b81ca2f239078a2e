package verify

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Status is the outcome of a Store's Claim.
type Status int

const (
	// Acquired: first receipt, or the previous claim's lease ran out. The
	// caller processes the event, then calls Complete or Release.
	Acquired Status = iota + 1
	// Done: the event was processed before; answer 200 and do nothing.
	Done
	// InProgress: another delivery holds a live claim; answer 409 so the
	// sender retries later.
	InProgress
)

func (s Status) String() string {
	switch s {
	case Acquired:
		return "acquired"
	case Done:
		return "done"
	case InProgress:
		return "in progress"
	}
	return fmt.Sprintf("Status(%d)", int(s))
}

// Store records which events were received, so each is processed once.
// The middleware passes a fresh random token per delivery; a store uses it
// so that a delivery whose lease ran out cannot release the claim of the
// delivery that took over. Implementations must be safe for concurrent use
// by many processes: Claim is the point where they race.
type Store interface {
	// Claim marks id as being processed by token for lease, unless it is
	// done or claimed by a lease that has not ended.
	Claim(ctx context.Context, id, token string, lease time.Duration) (Status, error)
	// Complete marks id done, whoever holds its claim (the work happened).
	Complete(ctx context.Context, id, token string) error
	// Release drops token's claim on id, if it still holds it and id is not
	// done, so that a retry can process the event.
	Release(ctx context.Context, id, token string) error
}

// ErrDuplicate is returned by SQLStore.MarkDoneTx when the event is already
// done: roll the business transaction back.
var ErrDuplicate = errors.New("verify: event already processed")

// ErrStoreFull is returned by MemoryStore.Claim when every entry is a live
// claim and none can be evicted.
var ErrStoreFull = errors.New("verify: dedup store full")
