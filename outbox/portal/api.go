package portal

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/txhook/txhook/internal/webui"
	"github.com/txhook/txhook/outbox"
)

// APIHeader must be on every request to the JSON API, with the value "1".
// A browser sends a custom header cross-origin only after a CORS preflight,
// which the portal never allows, so another site cannot call the API with
// the merchant's cookies; forms cannot set headers at all. That is why the
// API needs no CSRF token.
const APIHeader = "X-Txhook-Portal"

// apiError answers with {"error": {"code": code, "message": msg}}.
func (p *Portal) apiError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]string{"code": code, "message": msg}})
}

func (p *Portal) apiJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// apiFail answers an error of a TenantView call: 404 for anything not
// found (another tenant's object alike), 400/409 for what the caller can
// fix, 500 (logged, not shown) for the rest.
func (p *Portal) apiFail(w http.ResponseWriter, r *http.Request, err error) {
	loc := state(r).loc
	switch {
	case notFound(err):
		p.apiError(w, http.StatusNotFound, "not_found", loc.T("err.notfound"))
	case errors.Is(err, outbox.ErrDeliveryActive):
		p.apiError(w, http.StatusConflict, "delivery_active", loc.T("err.active"))
	case problemKey(err) != "":
		key := problemKey(err)
		p.apiError(w, http.StatusBadRequest, strings.TrimPrefix(key, "err."), loc.T(key))
	default:
		p.log.Error("txhook: portal api", "method", r.Method, "path", r.URL.Path, "error", err)
		p.apiError(w, http.StatusInternalServerError, "internal", loc.T("err.internal"))
	}
}

// serveAPI serves Prefix + "api/...".
func (p *Portal) serveAPI(w http.ResponseWriter, r *http.Request) {
	loc := state(r).loc
	if r.Header.Get(APIHeader) != "1" {
		p.apiError(w, http.StatusForbidden, "missing_header", loc.T("err.api_header"))
		return
	}
	if p.csrf.CrossOrigin(r) {
		p.apiError(w, http.StatusForbidden, "cross_origin", loc.T("err.csrf"))
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		r.Body = http.MaxBytesReader(w, r.Body, webui.MaxForm)
	}
	p.api.ServeHTTP(w, r)
}

// decode reads a JSON body into v; an empty body leaves v as it is.
func decode(r *http.Request, v any) error {
	if ct := r.Header.Get("Content-Type"); ct != "" && !strings.HasPrefix(ct, "application/json") {
		return errBody
	}
	err := json.NewDecoder(r.Body).Decode(v)
	if err != nil && !errors.Is(err, io.EOF) {
		return errBody
	}
	return nil
}

var errBody = errors.New("request body is not a JSON object of the right shape")

func (p *Portal) badBody(w http.ResponseWriter, r *http.Request) {
	p.apiError(w, http.StatusBadRequest, "bad_request", state(r).loc.T("err.body"))
}

// apiEndpoint is an endpoint in the API. Secrets are masked except in the
// answer to the call that created or rotated them.
type apiEndpoint struct {
	ID             string         `json:"id"`
	URL            string         `json:"url"`
	Description    string         `json:"description"`
	EventTypes     []string       `json:"event_types"`
	Enabled        bool           `json:"enabled"`
	DisabledReason string         `json:"disabled_reason,omitempty"`
	Versions       map[string]int `json:"versions,omitempty"`
	HeaderNames    []string       `json:"header_names,omitempty"`
	Secrets        []apiSecret    `json:"secrets"`
	FailingSince   *time.Time     `json:"failing_since,omitempty"`
	DisableAt      *time.Time     `json:"disable_at,omitempty"`
	CreatedAt      time.Time      `json:"created_at"`
	Health         map[string]any `json:"health,omitempty"`
}

type apiSecret struct {
	Value     string     `json:"value"`
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
}

func ptime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	t = t.UTC()
	return &t
}

func (p *Portal) apiEndpointOf(ep outbox.Endpoint, reveal bool) apiEndpoint {
	a := apiEndpoint{ID: ep.ID, URL: ep.URL, Description: ep.Description, EventTypes: ep.EventTypes, Enabled: ep.Enabled,
		DisabledReason: ep.DisabledReason, Versions: ep.Versions, FailingSince: ptime(ep.FailingSince), CreatedAt: ep.CreatedAt.UTC()}
	if a.EventTypes == nil {
		a.EventTypes = []string{}
	}
	for k := range ep.Headers {
		a.HeaderNames = append(a.HeaderNames, k)
	}
	for i, s := range ep.Secrets {
		v := s.Masked()
		if reveal && i == 0 {
			v = s.Value
		}
		a.Secrets = append(a.Secrets, apiSecret{Value: v, ExpiresAt: ptime(s.ExpiresAt)})
	}
	if ep.Enabled && !ep.FailingSince.IsZero() && p.cfg.DisableAfter > 0 {
		a.DisableAt = ptime(ep.FailingSince.Add(p.cfg.DisableAfter))
	}
	return a
}

// apiEndpointBody is the body of create and update.
type apiEndpointBody struct {
	URL         *string         `json:"url"`
	Description *string         `json:"description"`
	EventTypes  *[]string       `json:"event_types"`
	Headers     *outbox.Headers `json:"headers"`
}

func (p *Portal) apiRoutes() {
	m := http.NewServeMux()
	m.HandleFunc("GET /api/endpoints", func(w http.ResponseWriter, r *http.Request) {
		eps, err := state(r).view.Endpoints(r.Context())
		if err != nil {
			p.apiFail(w, r, err)
			return
		}
		out := make([]apiEndpoint, 0, len(eps))
		for _, ep := range eps {
			out = append(out, p.apiEndpointOf(ep, false))
		}
		p.apiJSON(w, http.StatusOK, map[string]any{"endpoints": out})
	})
	m.HandleFunc("POST /api/endpoints", func(w http.ResponseWriter, r *http.Request) {
		var b apiEndpointBody
		if decode(r, &b) != nil || b.URL == nil {
			p.badBody(w, r)
			return
		}
		ne := outbox.NewEndpoint{URL: *b.URL}
		if b.Description != nil {
			ne.Description = *b.Description
		}
		if b.EventTypes != nil {
			ne.EventTypes = *b.EventTypes
		}
		if b.Headers != nil {
			ne.Headers = *b.Headers
		}
		ep, err := state(r).view.CreateEndpoint(r.Context(), ne)
		if err != nil {
			p.apiFail(w, r, err)
			return
		}
		p.apiJSON(w, http.StatusCreated, p.apiEndpointOf(ep, true))
	})
	m.HandleFunc("GET /api/endpoints/{id}", func(w http.ResponseWriter, r *http.Request) {
		row, err := p.apiLookup(r)
		if err != nil {
			p.apiFail(w, r, err)
			return
		}
		a := p.apiEndpointOf(row.Endpoint, false)
		a.Health = map[string]any{"24h": row.Day, "7d": row.Week}
		p.apiJSON(w, http.StatusOK, a)
	})
	m.HandleFunc("PATCH /api/endpoints/{id}", func(w http.ResponseWriter, r *http.Request) {
		var b apiEndpointBody
		if decode(r, &b) != nil {
			p.badBody(w, r)
			return
		}
		ep, err := state(r).view.UpdateEndpoint(r.Context(), r.PathValue("id"), outbox.EndpointUpdate{URL: b.URL, Description: b.Description, EventTypes: b.EventTypes, Headers: b.Headers})
		if err != nil {
			p.apiFail(w, r, err)
			return
		}
		p.apiJSON(w, http.StatusOK, p.apiEndpointOf(ep, false))
	})
	m.HandleFunc("DELETE /api/endpoints/{id}", func(w http.ResponseWriter, r *http.Request) {
		if err := state(r).view.DeleteEndpoint(r.Context(), r.PathValue("id")); err != nil {
			p.apiFail(w, r, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	m.HandleFunc("POST /api/endpoints/{id}/enable", func(w http.ResponseWriter, r *http.Request) {
		p.apiDone(w, r, state(r).view.EnableEndpoint(r.Context(), r.PathValue("id")))
	})
	m.HandleFunc("POST /api/endpoints/{id}/disable", func(w http.ResponseWriter, r *http.Request) {
		var b struct {
			Reason string `json:"reason"`
		}
		if decode(r, &b) != nil {
			p.badBody(w, r)
			return
		}
		if b.Reason == "" {
			b.Reason = "disabled in the portal"
		}
		p.apiDone(w, r, state(r).view.DisableEndpoint(r.Context(), r.PathValue("id"), b.Reason))
	})
	m.HandleFunc("POST /api/endpoints/{id}/rotate", func(w http.ResponseWriter, r *http.Request) {
		var b struct {
			Overlap string `json:"overlap"`
		}
		if decode(r, &b) != nil {
			p.badBody(w, r)
			return
		}
		overlap, ok := parseOverlap(b.Overlap)
		if !ok {
			p.apiError(w, http.StatusBadRequest, "overlap", state(r).loc.T("err.overlap"))
			return
		}
		ep, err := state(r).view.RotateSecret(r.Context(), r.PathValue("id"), outbox.Rotation{Overlap: overlap})
		if err != nil {
			p.apiFail(w, r, err)
			return
		}
		p.apiJSON(w, http.StatusOK, p.apiEndpointOf(ep, true))
	})
	m.HandleFunc("POST /api/endpoints/{id}/recover", func(w http.ResponseWriter, r *http.Request) {
		var b struct {
			Since time.Time `json:"since"`
		}
		if decode(r, &b) != nil || b.Since.IsZero() {
			p.badBody(w, r)
			return
		}
		n, err := state(r).view.Recover(r.Context(), r.PathValue("id"), b.Since)
		if err != nil {
			p.apiFail(w, r, err)
			return
		}
		p.apiJSON(w, http.StatusOK, map[string]int{"recovered": n})
	})
	m.HandleFunc("POST /api/endpoints/{id}/test", func(w http.ResponseWriter, r *http.Request) {
		var b struct {
			Type string `json:"type"`
		}
		if decode(r, &b) != nil {
			p.badBody(w, r)
			return
		}
		d, err := state(r).view.SendTest(r.Context(), r.PathValue("id"), b.Type)
		if err != nil {
			p.apiFail(w, r, err)
			return
		}
		p.apiJSON(w, http.StatusAccepted, apiDeliveryOf(d))
	})
	m.HandleFunc("GET /api/endpoints/{id}/health", func(w http.ResponseWriter, r *http.Request) {
		window, step := 24*time.Hour, time.Hour
		if r.URL.Query().Get("window") == "7d" {
			window, step = 7*24*time.Hour, 6*time.Hour
		}
		pts, err := state(r).view.HealthSeries(r.Context(), r.PathValue("id"), window, step)
		if err != nil {
			p.apiFail(w, r, err)
			return
		}
		out := make([]map[string]any, 0, len(pts))
		for _, pt := range pts {
			out = append(out, map[string]any{"start": pt.Start.UTC(), "attempts": pt.Attempts, "succeeded": pt.Succeeded,
				"p50_ms": float64(pt.P50) / float64(time.Millisecond), "p99_ms": float64(pt.P99) / float64(time.Millisecond)})
		}
		p.apiJSON(w, http.StatusOK, map[string]any{"points": out})
	})
	m.HandleFunc("GET /api/deliveries", func(w http.ResponseWriter, r *http.Request) {
		f, ok := p.filterOf(r.URL.Query())
		if !ok {
			p.apiError(w, http.StatusBadRequest, "filter", state(r).loc.T("err.filter"))
			return
		}
		pg, err := state(r).view.Deliveries(r.Context(), f)
		if err != nil {
			p.apiFail(w, r, err)
			return
		}
		out := make([]apiDelivery, 0, len(pg.Deliveries))
		for _, d := range pg.Deliveries {
			out = append(out, apiDeliveryOf(d))
		}
		p.apiJSON(w, http.StatusOK, map[string]any{"deliveries": out, "next": pg.Next})
	})
	m.HandleFunc("GET /api/deliveries/{id}", func(w http.ResponseWriter, r *http.Request) {
		id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
		if err != nil {
			p.apiFail(w, r, outbox.ErrDeliveryNotFound)
			return
		}
		v := state(r).view
		d, err := v.Delivery(r.Context(), id)
		if err != nil {
			p.apiFail(w, r, err)
			return
		}
		as, err := v.Attempts(r.Context(), id)
		if err != nil {
			p.apiFail(w, r, err)
			return
		}
		out := apiDeliveryOf(d)
		out.AttemptLog = []apiAttempt{}
		for _, a := range as {
			out.AttemptLog = append(out.AttemptLog, apiAttemptOf(a))
		}
		p.apiJSON(w, http.StatusOK, out)
	})
	m.HandleFunc("POST /api/deliveries/{id}/resend", func(w http.ResponseWriter, r *http.Request) {
		id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
		if err != nil {
			p.apiFail(w, r, outbox.ErrDeliveryNotFound)
			return
		}
		d, err := state(r).view.Resend(r.Context(), id)
		if err != nil {
			p.apiFail(w, r, err)
			return
		}
		p.apiJSON(w, http.StatusAccepted, apiDeliveryOf(d))
	})
	m.HandleFunc("GET /api/events/{id}", func(w http.ResponseWriter, r *http.Request) {
		ev, err := state(r).view.Event(r.Context(), r.PathValue("id"))
		if err != nil {
			p.apiFail(w, r, err)
			return
		}
		p.apiJSON(w, http.StatusOK, map[string]any{"id": ev.ID, "type": ev.Type, "version": ev.Version, "payload": ev.Payload,
			"created_at": ev.CreatedAt.UTC(), "test": ev.Test})
	})
	m.HandleFunc("GET /api/catalog", func(w http.ResponseWriter, r *http.Request) {
		var out []map[string]any
		if p.cfg.Catalog != nil {
			for _, t := range p.cfg.Catalog.Types() {
				vs := []map[string]any{}
				for _, v := range t.Versions {
					vs = append(vs, map[string]any{"version": v.Version, "description": v.Description, "example": v.Example})
				}
				out = append(out, map[string]any{"name": t.Name, "description": t.Description, "versions": vs})
			}
		}
		p.apiJSON(w, http.StatusOK, map[string]any{"types": out})
	})
	m.HandleFunc("GET /api/export", func(w http.ResponseWriter, r *http.Request) {
		f, format, ok := p.exportFilter(r.URL.Query(), "json")
		if !ok {
			p.apiError(w, http.StatusBadRequest, "filter", state(r).loc.T("err.filter"))
			return
		}
		p.writeExport(w, r, f, format, func(err error) { p.apiFail(w, r, err) })
	})
	m.HandleFunc("GET /api/audit", func(w http.ResponseWriter, r *http.Request) {
		pg, err := state(r).view.AuditLog(r.Context(), outbox.AuditFilter{Cursor: r.URL.Query().Get("cursor"), Limit: p.cfg.PageSize})
		if err != nil {
			p.apiFail(w, r, err)
			return
		}
		out := make([]map[string]any, 0, len(pg.Entries))
		for _, e := range pg.Entries {
			out = append(out, map[string]any{"at": e.At.UTC(), "actor": e.Actor, "addr": e.Addr, "action": e.Action, "target": e.Target, "detail": e.Detail})
		}
		p.apiJSON(w, http.StatusOK, map[string]any{"entries": out, "next": pg.Next})
	})
	m.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		p.apiError(w, http.StatusNotFound, "not_found", state(r).loc.T("err.notfound"))
	})
	p.api = m
}

// apiLookup reads the path's endpoint with its health.
func (p *Portal) apiLookup(r *http.Request) (endpointRow, error) {
	ep, err := state(r).view.Endpoint(r.Context(), r.PathValue("id"))
	if err != nil {
		return endpointRow{}, err
	}
	return p.endpointRow(r, ep)
}

func (p *Portal) apiDone(w http.ResponseWriter, r *http.Request, err error) {
	if err != nil {
		p.apiFail(w, r, err)
		return
	}
	ep, err := state(r).view.Endpoint(r.Context(), r.PathValue("id"))
	if err != nil {
		p.apiFail(w, r, err)
		return
	}
	p.apiJSON(w, http.StatusOK, p.apiEndpointOf(ep, false))
}

type apiDelivery struct {
	ID            int64      `json:"id"`
	EventID       string     `json:"event_id"`
	EndpointID    string     `json:"endpoint_id"`
	State         string     `json:"state"`
	Attempts      int        `json:"attempts"`
	NextAttemptAt *time.Time `json:"next_attempt_at,omitempty"`
	LastStatus    int        `json:"last_status"`
	LastError     string     `json:"last_error,omitempty"`
	CreatedAt     time.Time  `json:"created_at"`
	// RefusedSince: the delivery rules refuse the endpoint's URL since
	// then (a dead delivery with it failed for that reason).
	RefusedSince *time.Time   `json:"refused_since,omitempty"`
	AttemptLog   []apiAttempt `json:"attempt_log,omitempty"`
}

func apiDeliveryOf(d outbox.Delivery) apiDelivery {
	return apiDelivery{ID: d.ID, EventID: d.EventID, EndpointID: d.EndpointID, State: d.State, Attempts: d.Attempts,
		NextAttemptAt: ptime(d.NextAttemptAt), LastStatus: d.LastStatus, LastError: d.LastError, CreatedAt: d.CreatedAt.UTC(),
		RefusedSince: ptime(d.RefusedSince)}
}

type apiAttempt struct {
	Number     int               `json:"number"`
	StartedAt  time.Time         `json:"started_at"`
	DurationMS float64           `json:"duration_ms"`
	Status     int               `json:"status"`
	Response   string            `json:"response_excerpt,omitempty"`
	Error      string            `json:"error,omitempty"`
	Headers    map[string]string `json:"request_headers,omitempty"`
}

func apiAttemptOf(a outbox.Attempt) apiAttempt {
	return apiAttempt{Number: a.Number, StartedAt: a.StartedAt.UTC(), DurationMS: float64(a.Duration) / float64(time.Millisecond),
		Status: a.Status, Response: a.ResponseExcerpt, Error: a.Error}
}
