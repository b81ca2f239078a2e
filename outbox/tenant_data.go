package outbox

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/txhook/txhook/internal/store"
	"github.com/txhook/txhook/signer"
)

// HealthPoint is one bucket of TenantView.HealthSeries: the attempts to
// the endpoint started in [Start, Start+step).
type HealthPoint struct {
	Start     time.Time
	Attempts  int // attempts started in the bucket
	Succeeded int // of those, answered 2xx
	// P50 and P99 are percentiles of the request duration of the bucket's
	// attempts that made a request (interpolated as in Health), over a
	// uniform random sample of them when there are many (see
	// HealthSeriesSample); zero when none did.
	P50, P99 time.Duration
}

// HealthSeries bounds.
const (
	// MaxHealthPoints is the most buckets HealthSeries returns.
	MaxHealthPoints = 1000
	// HealthSeriesSample is the most latencies HealthSeries keeps for its
	// percentiles, shared among the buckets (at least 1,000 each), so
	// memory stays flat whatever the traffic: 24 hourly buckets keep up to
	// 8,333 each.
	HealthSeriesSample = 200_000
)

// HealthSeries returns the health of one of the tenant's endpoints over the
// window ending now, in buckets of step, oldest first: what the portal's
// charts draw (24 h by the hour, 7 days by 6 hours). Buckets are aligned on
// multiples of step since the Unix epoch (whole hours for an hour), the
// last one holding now; buckets without attempts are included, zero. A
// window or step that is not positive, a step longer than the window, or
// more than MaxHealthPoints buckets is ErrInvalidFilter;
// ErrEndpointNotFound for another tenant's endpoint.
//
// It reads the window's attempts through the (endpoint_id, started_at)
// index, row by row, keeping counts and a bounded latency sample per
// bucket; a busy endpoint over 7 days reads many rows: cache the result in
// front of a page many people reload.
func (v *TenantView) HealthSeries(ctx context.Context, endpointID string, window, step time.Duration) ([]HealthPoint, error) {
	if window <= 0 || step <= 0 || step > window {
		return nil, fmt.Errorf("%w: want 0 < step <= window", ErrInvalidFilter)
	}
	n := int((window + step - 1) / step)
	if n > MaxHealthPoints {
		return nil, fmt.Errorf("%w: more than %d buckets", ErrInvalidFilter, MaxHealthPoints)
	}
	row, err := v.endpointRow(ctx, endpointID)
	if err != nil {
		return nil, err
	}
	now := v.o.clock.Now().UTC()
	end := time.Unix(0, 0).UTC().Add(now.Sub(time.Unix(0, 0)) / step * step).Add(step)
	start := end.Add(-time.Duration(n) * step)
	points := make([]HealthPoint, n)
	samples := make([]latencySample, n)
	capacity := max(1000, HealthSeriesSample/n)
	for i := range points {
		points[i].Start = start.Add(time.Duration(i) * step)
		samples[i].rng, samples[i].max = uint64(i)*0x9E3779B97F4A7C15+1, capacity
	}
	err = v.o.st.EachAttemptOf(ctx, row.ID, start, end, func(at time.Time, d time.Duration, status int) {
		i := int(at.Sub(start) / step)
		if i < 0 || i >= n {
			return
		}
		points[i].Attempts++
		if status >= 200 && status <= 299 {
			points[i].Succeeded++
		}
		if d > 0 {
			samples[i].add(float64(d / time.Microsecond))
		}
	})
	if err != nil {
		return nil, fmt.Errorf("txhook: health series: %w", err)
	}
	for i := range points {
		us := samples[i].kept
		if len(us) == 0 {
			continue
		}
		sort.Float64s(us)
		points[i].P50, points[i].P99 = microseconds(store.Percentile(us, 0.5)), microseconds(store.Percentile(us, 0.99))
	}
	return points, nil
}

// latencySample keeps a uniform random sample of at most max values
// (reservoir sampling, deterministic seed).
type latencySample struct {
	kept []float64
	seen uint64
	rng  uint64
	max  int
}

func (s *latencySample) add(x float64) {
	s.seen++
	if len(s.kept) < s.max {
		s.kept = append(s.kept, x)
		return
	}
	s.rng ^= s.rng << 13 // xorshift64
	s.rng ^= s.rng >> 7
	s.rng ^= s.rng << 17
	if j := s.rng % s.seen; j < uint64(s.max) {
		s.kept[j] = x
	}
}

// ExportFilter selects what Export writes: the tenant's events created in
// [Since, Until), optionally of one type, with their deliveries, optionally
// to one endpoint.
type ExportFilter struct {
	Since, Until time.Time // Since is required; zero Until means no end
	EndpointID   string
	EventType    string
}

// ExportRow is one line of an export: an event and one of its deliveries.
// An event replayed or resent has a row per delivery.
type ExportRow struct {
	EventID    string
	EventType  string
	CreatedAt  time.Time // when the event was enqueued
	EndpointID string
	State      string // the delivery's state: StateSucceeded, StateDead, ...
	Attempts   int
	LastStatus int // 0: no HTTP response
	// DeliveredAt is when the delivery succeeded; zero unless State is
	// StateSucceeded.
	DeliveredAt time.Time
}

// Export calls fn with each delivery of the tenant's events in the filter's
// range, ordered by event creation time, event ID and delivery ID (stable:
// the same range exports the same rows in the same order while nothing is
// delivered or pruned), reading them from the database row by row, so
// memory stays flat however many there are: what a merchant reconciles
// against its own records (对账). Events not dispatched yet, and events
// that had no endpoint, have no row. It stops at fn's first error and
// returns it. A zero Since, or Since not before a non-zero Until, is
// ErrInvalidFilter; another tenant's endpoint ID matches nothing.
//
// The query holds a database connection (and, on SQLite, a read
// transaction) until the last row: write rows to the client as they come,
// not to something that can block for long.
func (v *TenantView) Export(ctx context.Context, f ExportFilter, fn func(ExportRow) error) error {
	if err := v.check(); err != nil {
		return err
	}
	if f.Since.IsZero() || !f.Until.IsZero() && !f.Since.Before(f.Until) {
		return fmt.Errorf("%w: export needs since before until", ErrInvalidFilter)
	}
	if !utf8Valid(f.EndpointID) || !utf8Valid(f.EventType) {
		return nil
	}
	return v.o.st.ExportTenant(ctx, v.tenant, store.ExportFilter{Since: f.Since, Until: f.Until, EndpointID: f.EndpointID, EventType: f.EventType},
		func(r store.ExportRow) error {
			x := ExportRow{EventID: r.EventID, EventType: r.EventType, CreatedAt: r.CreatedAt, EndpointID: r.EndpointID,
				State: r.State, Attempts: r.Attempts, LastStatus: r.LastStatus}
			if r.State == StateSucceeded {
				x.DeliveredAt = r.UpdatedAt
			}
			return fn(x)
		})
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
