package outbox

import (
	"encoding/json"
	"errors"
	"net/http"
	"time"
)

// Limits of the window HealthHandler accepts in its "window" parameter.
const (
	MinHealthWindow = time.Minute
	MaxHealthWindow = 30 * 24 * time.Hour
)

// HealthHandler returns a JSON http.Handler that shows one tenant the
// health of its own endpoints, and nobody else's: mount it behind your API's
// authentication and let tenant say whose endpoints the request may see.
// When tenant returns false (or an empty tenant) the handler answers 403
// and reads nothing; a nil tenant func refuses every request.
//
// GET (or HEAD) answers
//
//	{"tenant": "merchant_42", "window": "24h0m0s", "endpoints": [Health, …]}
//
// with each endpoint in Health's JSON form. Query parameters: window, a Go
// duration between MinHealthWindow and MaxHealthWindow (default
// DefaultHealthWindow); endpoint, an endpoint ID to show only that one (404
// unless it is the tenant's, so other tenants' IDs cannot be probed).
func HealthHandler(ob *Outbox, tenant func(*http.Request) (string, bool)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Cache-Control", "no-store")
		h.Set("X-Content-Type-Options", "nosniff")
		t, ok := "", false
		if tenant != nil {
			t, ok = tenant(r)
		}
		if !ok || t == "" {
			jsonError(w, http.StatusForbidden, "forbidden")
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			h.Set("Allow", "GET, HEAD")
			jsonError(w, http.StatusMethodNotAllowed, "method not allowed")
			return
		}
		window := DefaultHealthWindow
		if v := r.URL.Query().Get("window"); v != "" {
			d, err := time.ParseDuration(v)
			if err != nil || d < MinHealthWindow || d > MaxHealthWindow {
				jsonError(w, http.StatusBadRequest, "window must be a duration between 1m and 720h")
				return
			}
			window = d
		}
		var list []Health
		if id := r.URL.Query().Get("endpoint"); id != "" {
			// The tenant is checked before any number is computed.
			row, err := ob.endpointRow(r.Context(), id)
			if errors.Is(err, ErrEndpointNotFound) || err == nil && row.Tenant != t {
				jsonError(w, http.StatusNotFound, "endpoint not found")
				return
			}
			var hl Health
			if err == nil {
				hl, err = ob.health(r.Context(), row, window)
			}
			if err != nil {
				ob.log.Error("txhook: health handler", "error", err)
				jsonError(w, http.StatusInternalServerError, "internal error")
				return
			}
			list = []Health{hl}
		} else {
			var err error
			if list, err = ob.TenantHealth(r.Context(), t, window); err != nil {
				ob.log.Error("txhook: health handler", "error", err)
				jsonError(w, http.StatusInternalServerError, "internal error")
				return
			}
		}
		h.Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(struct {
			Tenant    string   `json:"tenant"`
			Window    string   `json:"window"`
			Endpoints []Health `json:"endpoints"`
		}{t, window.String(), list})
	})
}

func jsonError(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(struct {
		Error string `json:"error"`
	}{msg})
}
