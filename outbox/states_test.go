package outbox

import (
	"testing"

	"github.com/txhook/txhook/internal/store"
)

// The exported state values are written out, so that go doc shows them;
// they must stay those the store writes.
func TestStateConstantsMatchTheStore(t *testing.T) {
	for _, c := range [][2]string{
		{StatePending, store.StatePending}, {StateRunning, store.StateRunning},
		{StateSucceeded, store.StateSucceeded}, {StateDead, store.StateDead},
		{StatePaused, store.StatePaused}, {StateBlocked, store.StateBlocked},
	} {
		if c[0] != c[1] {
			t.Errorf("outbox state %q, store writes %q", c[0], c[1])
		}
	}
}
