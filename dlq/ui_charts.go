package dlq

import (
	"errors"
	"html/template"
	"net/http"
	"net/url"
	"time"

	"github.com/txhook/txhook/internal/svgchart"
	"github.com/txhook/txhook/outbox"
)

// chartPair is an endpoint's success-rate and latency charts over one
// window.
type chartPair struct {
	Success, Latency template.HTML
}

// charts draws ep's health over window in buckets of step.
func (u *ui) charts(r *http.Request, ep outbox.Endpoint, window, step time.Duration, id, format string) (chartPair, error) {
	pts, err := u.ob.Tenant(ep.Tenant).HealthSeries(r.Context(), ep.ID, window, step)
	if err != nil {
		return chartPair{}, err
	}
	w := span(window)
	return chartPair{
		Success: svgchart.SuccessRate(pts, svgchart.Options{ID: "success-" + id, TimeFormat: format,
			Title: "Success rate, last " + w, Desc: "Share of attempts answered 2xx, per " + span(step) + " (UTC)."}),
		Latency: svgchart.Latency(pts, svgchart.Options{ID: "latency-" + id, TimeFormat: format,
			Title: "Latency p50 and p99, last " + w, Desc: "Request duration percentiles per " + span(step) + " (UTC)."}),
	}, nil
}

// Audit log.

type auditData struct {
	Tenant  string
	Limited bool
	Entries []outbox.AuditEntry
	NextURL string
	Paged   bool
}

func (u *ui) auditLog(w http.ResponseWriter, r *http.Request) {
	tenant := u.tenantFilter(r)
	_, limited := u.scope(r)
	cursor := r.URL.Query().Get("after")
	p, err := u.ob.AuditLog(r.Context(), outbox.AuditFilter{Tenant: tenant, Cursor: cursor, Limit: u.cfg.PageSize})
	if errors.Is(err, outbox.ErrInvalidCursor) {
		u.fail(w, r, http.StatusBadRequest, "Invalid page cursor.")
		return
	}
	if err != nil {
		u.internal(w, r, err)
		return
	}
	d := auditData{Tenant: tenant, Limited: limited, Entries: p.Entries, Paged: cursor != ""}
	if p.Next != "" {
		v := url.Values{"after": {p.Next}}
		if tenant != "" && !limited {
			v.Set("tenant", tenant)
		}
		d.NextURL = u.cfg.Prefix + "audit?" + v.Encode()
	}
	u.render(w, r, http.StatusOK, "audit", page{Title: "Audit log", Nav: "audit", Data: d})
}
