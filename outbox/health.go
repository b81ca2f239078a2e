package outbox

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"time"

	"github.com/txhook/txhook/internal/store"
)

// DefaultHealthWindow is the window EndpointHealth and TenantHealth use
// when given none.
const DefaultHealthWindow = 24 * time.Hour

// Health is an endpoint's delivery health over a time window: what a
// merchant's dashboard shows and what an operator checks first.
//
// An attempt succeeded when it got a 2xx; anything else (another status, a
// timeout, a refused connection, a lease that expired mid-attempt) is a
// failure. Every query behind it walks an index of the one endpoint: the
// counts are index-only scans of the window, the rest read at most 10,000
// rows (latencies) or 1,000 (the run of failures). A busy endpoint and a
// long window still make the counts grow; cache the result in front of a
// dashboard that many people reload.
type Health struct {
	EndpointID     string
	Tenant         string
	URL            string
	Enabled        bool
	DisabledReason string

	// Since and Until bound the window: attempts started at or after Since
	// and before Until (now) are counted.
	Since, Until time.Time

	Attempts    int     // attempts started in the window
	Succeeded   int     // of those, answered 2xx
	Failed      int     // of those, failed
	SuccessRate float64 // Succeeded / Attempts; 0 when there were none

	// LatencyP50 and LatencyP95 are percentiles of the request duration,
	// interpolated as PostgreSQL's percentile_cont does, over the latest
	// 10,000 attempts in the window that made a request; zero when none did.
	LatencyP50, LatencyP95 time.Duration

	// ConsecutiveFailures is the current run: failed attempts since the
	// last success, counted among the latest 1,000 attempts (1,000 means
	// at least that many).
	ConsecutiveFailures int
	// FailingSince is when the current run of failures began, as the
	// relays record it; zero when the endpoint is not failing.
	FailingSince time.Time

	// LastSuccess is the latest successful attempt, nil when there is none
	// among the latest 1,000 attempts. LastFailure is the latest failed
	// attempt, nil when there is none on record; its Status and Error say
	// why it failed.
	LastSuccess, LastFailure *Attempt

	// Backlog is the endpoint's deliveries not finished yet: pending,
	// running, or paused while the endpoint is disabled. Events a relay
	// has not dispatched yet (normally for milliseconds after their commit)
	// are not counted: which endpoints get an event is decided when it is
	// dispatched.
	Backlog int
	// DeadLetters is the endpoint's dead letters not yet replayed or
	// purged, whenever they failed.
	DeadLetters int
}

// EndpointHealth returns an endpoint's health over the window ending now
// (DefaultHealthWindow when window is not positive). The error matches
// ErrEndpointNotFound for an unknown endpoint.
func (o *Outbox) EndpointHealth(ctx context.Context, endpointID string, window time.Duration) (Health, error) {
	row, err := o.endpointRow(ctx, endpointID)
	if err != nil {
		return Health{}, err
	}
	return o.health(ctx, row, window)
}

// TenantHealth returns the health of each of a tenant's endpoints, ordered
// by endpoint ID, over the window ending now (DefaultHealthWindow when
// window is not positive). It never includes another tenant's endpoints;
// an unknown tenant has none.
func (o *Outbox) TenantHealth(ctx context.Context, tenant string, window time.Duration) ([]Health, error) {
	if tenant == "" {
		return []Health{}, nil
	}
	rows, err := o.st.ListEndpoints(ctx, tenant, false)
	if err != nil {
		return nil, fmt.Errorf("txhook: tenant health: %w", err)
	}
	out := make([]Health, 0, len(rows))
	for _, r := range rows {
		h, err := o.health(ctx, r, window)
		if err != nil {
			return nil, err
		}
		out = append(out, h)
	}
	return out, nil
}

func (o *Outbox) health(ctx context.Context, row store.EndpointRow, window time.Duration) (Health, error) {
	if window <= 0 {
		window = DefaultHealthWindow
	}
	until := o.clock.Now().UTC()
	since := until.Add(-window)
	st, err := o.st.EndpointHealth(ctx, row.ID, since, until)
	if err != nil {
		return Health{}, fmt.Errorf("txhook: health of endpoint %s: %w", row.ID, err)
	}
	h := Health{
		EndpointID: row.ID, Tenant: row.Tenant, URL: row.URL, Enabled: row.Enabled, DisabledReason: row.DisabledReason,
		Since: since, Until: until,
		Attempts: st.Attempts, Failed: st.Failed, Succeeded: st.Attempts - st.Failed,
		ConsecutiveFailures: st.Streak, FailingSince: st.FailingSince,
		LastSuccess: attemptOf(st.LastSuccess), LastFailure: attemptOf(st.LastFailure),
		Backlog: st.Backlog, DeadLetters: st.DeadLetters,
	}
	if h.Attempts > 0 {
		h.SuccessRate = float64(h.Succeeded) / float64(h.Attempts)
	}
	if st.LatencyN > 0 {
		h.LatencyP50, h.LatencyP95 = microseconds(st.P50), microseconds(st.P95)
	}
	return h, nil
}

func microseconds(us float64) time.Duration {
	return time.Duration(math.Round(us * float64(time.Microsecond)))
}

func attemptOf(a *store.AttemptRow) *Attempt {
	if a == nil {
		return nil
	}
	return &Attempt{DeliveryID: a.DeliveryID, Number: a.Attempt, StartedAt: a.StartedAt, Duration: a.Duration,
		Status: a.Status, ResponseExcerpt: a.Excerpt, Error: a.Error}
}

// healthJSON is the documented JSON form of Health.
type healthJSON struct {
	EndpointID          string       `json:"endpoint_id"`
	Tenant              string       `json:"tenant"`
	URL                 string       `json:"url"`
	Enabled             bool         `json:"enabled"`
	DisabledReason      string       `json:"disabled_reason,omitempty"`
	Since               time.Time    `json:"since"`
	Until               time.Time    `json:"until"`
	Attempts            int          `json:"attempts"`
	Succeeded           int          `json:"succeeded"`
	Failed              int          `json:"failed"`
	SuccessRate         float64      `json:"success_rate"`
	LatencyP50MS        float64      `json:"latency_p50_ms"`
	LatencyP95MS        float64      `json:"latency_p95_ms"`
	ConsecutiveFailures int          `json:"consecutive_failures"`
	FailingSince        *time.Time   `json:"failing_since,omitempty"`
	LastSuccess         *attemptJSON `json:"last_success,omitempty"`
	LastFailure         *attemptJSON `json:"last_failure,omitempty"`
	Backlog             int          `json:"backlog"`
	DeadLetters         int          `json:"dead_letters"`
}

type attemptJSON struct {
	At         time.Time `json:"at"`
	DurationMS float64   `json:"duration_ms"`
	Status     int       `json:"status,omitempty"`
	Error      string    `json:"error,omitempty"`
}

// MarshalJSON writes the health in snake_case with latencies in
// milliseconds and times in RFC 3339, leaving out the response excerpts of
// the last attempts (they can be large; EndpointDeliveries has them).
func (h Health) MarshalJSON() ([]byte, error) {
	j := healthJSON{
		EndpointID: h.EndpointID, Tenant: h.Tenant, URL: h.URL, Enabled: h.Enabled, DisabledReason: h.DisabledReason,
		Since: h.Since, Until: h.Until, Attempts: h.Attempts, Succeeded: h.Succeeded, Failed: h.Failed,
		SuccessRate: h.SuccessRate, LatencyP50MS: ms(h.LatencyP50), LatencyP95MS: ms(h.LatencyP95),
		ConsecutiveFailures: h.ConsecutiveFailures, Backlog: h.Backlog, DeadLetters: h.DeadLetters,
		LastSuccess: attemptJSONOf(h.LastSuccess), LastFailure: attemptJSONOf(h.LastFailure),
	}
	if !h.FailingSince.IsZero() {
		t := h.FailingSince
		j.FailingSince = &t
	}
	return json.Marshal(j)
}

func ms(d time.Duration) float64 { return math.Round(float64(d)/float64(time.Millisecond)*1000) / 1000 }

func attemptJSONOf(a *Attempt) *attemptJSON {
	if a == nil {
		return nil
	}
	return &attemptJSON{At: a.StartedAt, DurationMS: ms(a.Duration), Status: a.Status, Error: a.Error}
}
