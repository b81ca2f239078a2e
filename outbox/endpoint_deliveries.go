package outbox

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/txhook/txhook/internal/store"
)

// ErrInvalidCursor is returned for a page cursor this package did not
// produce.
var ErrInvalidCursor = errors.New("txhook: invalid cursor")

// MaxDeliveryPage is the largest page EndpointDeliveries returns.
const MaxDeliveryPage = 1000

// DeliveryPage is one page of deliveries. Next is the cursor of the
// following (older) page, empty on the last.
type DeliveryPage struct {
	Deliveries []Delivery
	Next       string
}

// EndpointDeliveries returns an endpoint's deliveries, newest first, limit
// at a time (default 50, at most MaxDeliveryPage): what an operator reads
// when a merchant says "we got nothing since noon". Pass the previous
// page's Next as cursor to continue; "" starts at the newest. Pages are
// keyed on creation time and ID, so deliveries created while paging never
// shift or repeat entries. An unknown endpoint has no deliveries.
func (o *Outbox) EndpointDeliveries(ctx context.Context, endpointID, cursor string, limit int) (DeliveryPage, error) {
	if limit <= 0 {
		limit = 50
	}
	limit = min(limit, MaxDeliveryPage)
	var after *store.DeliveryCursor
	if cursor != "" {
		c, err := decodeDeliveryCursor(cursor)
		if err != nil {
			return DeliveryPage{}, err
		}
		after = &c
	}
	rows, err := o.st.DeliveriesOfEndpoint(ctx, endpointID, after, limit+1)
	if err != nil {
		return DeliveryPage{}, fmt.Errorf("txhook: deliveries of endpoint: %w", err)
	}
	return deliveryPage(rows, limit), nil
}

func deliveryOf(r store.DeliveryRow) Delivery {
	return Delivery{ID: r.ID, EventID: r.EventID, EndpointID: r.EndpointID, State: r.State, Attempts: r.Attempts,
		NextAttemptAt: r.NextAttemptAt, LastStatus: r.LastStatus, LastError: r.LastError,
		CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt, RefusedSince: r.RefusedSince}
}

func encodeDeliveryCursor(c store.DeliveryCursor) string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(c.CreatedAt.UnixMicro(), 10) + "." + strconv.FormatInt(c.ID, 10)))
}

func decodeDeliveryCursor(s string) (store.DeliveryCursor, error) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return store.DeliveryCursor{}, ErrInvalidCursor
	}
	at, id, ok := strings.Cut(string(b), ".")
	us, err1 := strconv.ParseInt(at, 10, 64)
	n, err2 := strconv.ParseInt(id, 10, 64)
	if !ok || err1 != nil || err2 != nil {
		return store.DeliveryCursor{}, ErrInvalidCursor
	}
	return store.DeliveryCursor{CreatedAt: time.UnixMicro(us).UTC(), ID: n}, nil
}
