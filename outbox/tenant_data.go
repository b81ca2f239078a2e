package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/txhook/txhook/internal/store"
	"github.com/txhook/txhook/signer"
)

// HealthPoint is one bucket of TenantView.HealthSeries.
type HealthPoint struct {
	Start     time.Time
	Attempts  int
	Succeeded int
	P50, P99  time.Duration
}

// HealthSeries is not implemented yet.
func (v *TenantView) HealthSeries(ctx context.Context, endpointID string, window, step time.Duration) ([]HealthPoint, error) {
	return nil, errors.New("txhook: not implemented yet")
}

// ExportFilter selects what Export writes.
type ExportFilter struct {
	Since, Until time.Time
	EndpointID   string
	EventType    string
}

// ExportRow is one line of an export.
type ExportRow struct {
	EventID     string
	EventType   string
	CreatedAt   time.Time
	EndpointID  string
	State       string
	Attempts    int
	LastStatus  int
	DeliveredAt time.Time
}

// Export is not implemented yet.
func (v *TenantView) Export(ctx context.Context, f ExportFilter, fn func(ExportRow) error) error {
	return errors.New("txhook: not implemented yet")
}

// Attempts returns the attempt log of one of the tenant's deliveries, in
// order, each with the request headers as sent (Attempt.RequestHeaders,
// rebuilt, see there); ErrDeliveryNotFound for another tenant's delivery.
func (v *TenantView) Attempts(ctx context.Context, deliveryID int64) ([]Attempt, error) {
	d, err := v.Delivery(ctx, deliveryID)
	if err != nil {
		return nil, err
	}
	rows, err := v.o.st.Attempts(ctx, d.ID)
	if err != nil {
		return nil, fmt.Errorf("txhook: attempts: %w", err)
	}
	out := make([]Attempt, len(rows))
	for i, a := range rows {
		out[i] = Attempt{DeliveryID: a.DeliveryID, Number: a.Attempt, StartedAt: a.StartedAt, Duration: a.Duration,
			Status: a.Status, ResponseExcerpt: a.Excerpt, Error: a.Error}
	}
	if len(out) == 0 {
		return out, nil
	}
	rb, err := v.requestBuilder(ctx, d)
	if err != nil {
		return nil, err
	}
	for i := range out {
		out[i].RequestHeaders, out[i].SignatureNote = rb.headers(out[i].StartedAt)
	}
	return out, nil
}

// requestBuilder rebuilds the headers of a delivery's requests.
type requestBuilder struct {
	eventID, typ string
	version      int
	test         bool
	body         []byte
	secrets      []Secret
	note         string // why no signature can be rebuilt at all; "" if it can
}

func (v *TenantView) requestBuilder(ctx context.Context, d Delivery) (*requestBuilder, error) {
	ev, err := v.o.st.TenantEvent(ctx, v.tenant, d.EventID)
	if err != nil {
		if store.IsNotFound(err) {
			return &requestBuilder{eventID: d.EventID, note: "the event is no longer stored"}, nil
		}
		return nil, fmt.Errorf("txhook: attempts: %w", err)
	}
	rb := &requestBuilder{eventID: ev.ID, typ: ev.Type, version: ev.Version, test: strings.HasPrefix(ev.ID, TestEventPrefix)}
	ep, err := v.o.st.TenantEndpoint(ctx, v.o.db, v.tenant, d.EndpointID)
	if store.IsNotFound(err) {
		rb.note = "the endpoint was deleted, with its secrets"
		return rb, nil
	}
	if err != nil {
		return nil, fmt.Errorf("txhook: attempts: %w", err)
	}
	data := json.RawMessage(ev.Payload)
	var pins map[string]int
	if len(ep.Versions) > 0 {
		_ = json.Unmarshal(ep.Versions, &pins)
	}
	if want, ok := pins[ev.Type]; ok && want != ev.Version {
		if v.o.cfg.Catalog == nil {
			rb.note = "the endpoint pins another version and no catalog is configured"
			return rb, nil
		}
		if data, err = v.o.cfg.Catalog.Convert(ev.Type, ev.Version, want, data); err != nil {
			rb.note = "the payload does not convert to the endpoint's pinned version"
			return rb, nil
		}
		rb.version = want
	}
	rb.body = envelope(&store.Claimed{EventID: ev.ID, Type: ev.Type, EventTime: ev.CreatedAt}, rb.version, data)
	if rb.secrets, err = v.o.openSecrets(ctx, ep.ID, ep.Secrets); err != nil {
		rb.note = "the endpoint's secrets cannot be decrypted with the configured keys"
	}
	return rb, nil
}

// headers returns the headers of the request started at t, and a note when
// the signature is missing or uncertain.
func (rb *requestBuilder) headers(t time.Time) (http.Header, string) {
	h := http.Header{}
	h["Content-Type"] = jsonContentType
	h[HeaderEventID] = []string{rb.eventID}
	if rb.typ != "" {
		h[HeaderEventType] = []string{rb.typ}
		h[HeaderEventVersion] = []string{strconv.Itoa(rb.version)}
	}
	if rb.test {
		h[HeaderTest] = []string{"true"}
	}
	h["Webhook-Timestamp"] = []string{strconv.FormatInt(t.Unix(), 10)}
	if rb.note != "" {
		return h, "signature not shown: " + rb.note
	}
	var use []string
	unsure := false
	for _, s := range rb.secrets {
		if !s.Active(t) || !s.CreatedAt.IsZero() && s.CreatedAt.After(t) {
			continue
		}
		unsure = unsure || s.CreatedAt.IsZero()
		use = append(use, s.Value)
	}
	if len(use) == 0 {
		return h, "signature not shown: the secret that signed it was rotated out"
	}
	if err := (signer.Standard{}).Sign(h, rb.eventID, t, rb.body, use); err != nil {
		return h, "signature not shown: " + err.Error()
	}
	if unsure {
		return h, "signature rebuilt with the secrets on record; one of them was stored without its creation time and may be newer than the attempt"
	}
	return h, ""
}
