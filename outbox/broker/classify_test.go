package broker

import (
	"errors"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// classify tells what a host can wait out (JetStream or its cluster not
// answering now) from a stream that is gone and from other errors.
func TestClassify(t *testing.T) {
	cases := []struct {
		err  error
		want error
	}{
		{nats.ErrNoResponders, ErrUnavailable},
		{nats.ErrTimeout, ErrUnavailable},
		{&jetstream.APIError{Code: 400, ErrorCode: jsClusterNoPeers, Description: "no suitable peers for placement"}, ErrUnavailable},
		{&jetstream.APIError{Code: 503, ErrorCode: jsClusterNotAvailable}, ErrUnavailable},
		{jetstream.ErrStreamNotFound, ErrStreamMissing},
		{jetstream.ErrConsumerDeleted, ErrStreamMissing},
	}
	for _, c := range cases {
		got := classify(fmt.Errorf("creating stream: %w", c.err))
		if !errors.Is(got, c.want) {
			t.Errorf("classify(%v) = %v, want %v", c.err, got, c.want)
		}
	}
	other := errors.New("something else")
	if got := classify(other); got != other {
		t.Errorf("classify(%v) = %v, want it unchanged", other, got)
	}
}
