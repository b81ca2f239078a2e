package outbox

import (
	"context"
	"database/sql"

	"github.com/txhook/txhook/internal/store"
)

// WakeChannel is the PostgreSQL notification channel on which Enqueue's
// NOTIFY wakes relays, and on which a Listener listens.
const WakeChannel = store.WakeChannel

// Listener waits for PostgreSQL notifications for a relay, so that it is
// woken as soon as an enqueuing transaction commits rather than at its next
// poll. Listening is driver-specific, so it lives in packages that only
// those who use the driver import: pgxoutbox.Listener for pgx (a pool, or
// its database/sql driver) and pqlisten.New for lib/pq. Package outbox
// itself imports no PostgreSQL driver.
type Listener interface {
	// Listen listens on channel and calls wake once it is listening, after
	// every notification, and after every reconnection (notifications sent
	// while not listening are lost). It returns when ctx is done or the
	// connection fails or stops answering (a primary that hangs: check it
	// when no notification came for a while); the relay then calls it
	// again after a backoff,
	// polling meanwhile. db is the Outbox's database.
	Listen(ctx context.Context, db *sql.DB, channel string, wake func()) error
}
