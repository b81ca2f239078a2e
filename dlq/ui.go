package dlq

import (
	"bytes"
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"github.com/txhook/txhook/internal/link"
	"github.com/txhook/txhook/internal/webui"
	"github.com/txhook/txhook/outbox"
)

// UIConfig configures the operations UI. Authorize is required.
type UIConfig struct {
	// Authorize reports whether a request may use the UI. Every request
	// (page, form post or stylesheet) for which it returns false is refused
	// with 403 before anything is read. The UI can replay and purge dead
	// letters, disable endpoints, rotate and reveal signing secrets: check
	// the operator's session and role here. Actions are the POST requests;
	// revealing secrets is a POST to a path ending in "/reveal", should
	// only some operators be allowed to.
	Authorize func(*http.Request) bool

	// Prefix is the URL path the UI is served under, such as
	// "/admin/webhooks/"; links and redirects use it. Mount the handler
	// there as it is (it strips Prefix itself) or behind http.StripPrefix.
	// Default "/".
	Prefix string

	// CSRFKey keys the HMAC that ties each form's token to the browser's
	// CSRF cookie; at least 32 bytes. Default: random for each NewUI, so
	// forms rendered before a restart are refused after it (reload the
	// page). Give every instance behind one load balancer the same key.
	CSRFKey []byte

	// HealthWindow is the window of the health figures. Default
	// outbox.DefaultHealthWindow.
	HealthWindow time.Duration

	// PageSize is how many rows a page lists. Default 50, at most 500.
	PageSize int

	// TrustedProxies are the addresses of the reverse proxies that
	// terminate TLS in front of the UI, such as 10.0.0.0/8. A request
	// whose peer is in one of them and whose X-Forwarded-Proto says https
	// (the last value, the one that proxy set) counts as made over TLS, as
	// does one the UI's own server received over TLS. Empty: only the
	// latter. Make sure those proxies overwrite X-Forwarded-Proto.
	//
	// Over TLS the CSRF cookie is "__Host-txhook_csrf": Secure, Path=/,
	// no Domain, so neither plain HTTP nor a sibling subdomain can set or
	// replace it, and only that cookie is accepted. Browsers refuse
	// __Host- cookies without Secure, so over plain HTTP (local
	// development) the cookie is "txhook_csrf", scoped to Prefix, without
	// Secure.
	TrustedProxies []netip.Prefix

	// Scope, if set, limits a request to one tenant when it returns
	// limited: for support staff who may see one merchant only. Lists
	// show that tenant's rows whatever ?tenant= says, and another tenant's
	// endpoint, dead letter or event ID is 404 on every page and action,
	// exactly like a missing one. Nil, or limited false, means every
	// tenant. Without Scope, ?tenant= is a filter, which the detail pages
	// honour too (another tenant's ID is 404), but not an access limit.
	Scope func(*http.Request) (tenant string, limited bool)

	// PortalLink, if set, makes each tenant's name a link into that
	// tenant's merchant portal, at the URL it returns (the host wires it to
	// outbox/portal's signed links). An error hides the link.
	PortalLink func(tenant string) (string, error)
}

//go:embed templates/*.html static/*
var uiFS embed.FS

// NewUI returns the operations UI of ob as an http.Handler: server-rendered
// pages, no JavaScript, nothing loaded from elsewhere. It lists endpoints
// with their health, shows an endpoint's recent deliveries and attempts,
// finds the deliveries of an event ID, lists dead letters by tenant,
// endpoint, event type and time, and replays or purges one, a selection, or
// all that match. It enables and disables endpoints, recovers the events an
// endpoint missed since a time (outbox.Outbox.Recover), and rotates their
// secrets, which it shows masked unless an operator asks to reveal them.
//
// Every request must pass cfg.Authorize. Every POST must carry the CSRF
// token of its form (a double-submit cookie checked with an HMAC; a
// __Host- cookie over TLS, see UIConfig.TrustedProxies) and pass
// net/http's cross-origin protection, or it is refused with 403; GET never
// changes anything. Responses forbid framing, caching, inline scripts and
// referrers.
func NewUI(ob *outbox.Outbox, cfg UIConfig) (http.Handler, error) {
	if ob == nil {
		return nil, errors.New("txhook: dlq.NewUI: nil outbox")
	}
	if cfg.Authorize == nil {
		return nil, errors.New("txhook: dlq.NewUI: UIConfig.Authorize is required (there is no default open access)")
	}
	prefix, err := webui.Prefix(cfg.Prefix)
	if err != nil {
		return nil, fmt.Errorf("txhook: dlq.NewUI: %w", err)
	}
	cfg.Prefix = prefix
	csrf, err := webui.NewCSRF(cfg.CSRFKey, "txhook-ui-csrf", "txhook_csrf", cfg.Prefix, cfg.TrustedProxies)
	if err != nil {
		return nil, fmt.Errorf("txhook: dlq.NewUI: CSRFKey: %w", err)
	}
	if cfg.HealthWindow <= 0 {
		cfg.HealthWindow = outbox.DefaultHealthWindow
	}
	if cfg.PageSize <= 0 {
		cfg.PageSize = 50
	}
	cfg.PageSize = min(cfg.PageSize, 500)

	u := &ui{ob: ob, q: New(ob), in: link.Outbox(ob), cfg: cfg, csrf: csrf}
	u.log = u.in.Logger
	if err := u.parse(); err != nil {
		return nil, err
	}
	static, err := fs.Sub(uiFS, "static")
	if err != nil {
		return nil, err
	}
	m := http.NewServeMux()
	m.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, u.cfg.Prefix+"endpoints", http.StatusFound)
	})
	m.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	m.HandleFunc("GET /endpoints", u.endpoints)
	m.HandleFunc("GET /endpoints/{id}", u.endpoint)
	m.HandleFunc("POST /endpoints/{id}/enable", u.enable)
	m.HandleFunc("POST /endpoints/{id}/disable", u.disable)
	m.HandleFunc("POST /endpoints/{id}/rotate", u.rotate)
	m.HandleFunc("POST /endpoints/{id}/reveal", u.reveal)
	m.HandleFunc("POST /endpoints/{id}/recover", u.recoverEvents)
	m.HandleFunc("GET /deliveries", u.search)
	m.HandleFunc("GET /dead", u.deadList)
	m.HandleFunc("GET /dead/{id}", u.deadDetail)
	m.HandleFunc("POST /dead/action", u.deadAction)
	m.HandleFunc("POST /dead/replay-all", u.deadAll)
	m.HandleFunc("POST /dead/purge-all", u.deadAll)
	m.HandleFunc("GET /audit", u.auditLog)
	m.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		u.fail(w, r, http.StatusNotFound, "No such page.")
	})
	u.mux = m
	return u, nil
}

type ui struct {
	ob    *outbox.Outbox
	q     *Queue
	in    link.Internals
	log   *slog.Logger
	cfg   UIConfig
	csrf  *webui.CSRF
	mux   *http.ServeMux
	pages map[string]*template.Template
}

const csrfField = "csrf"

func (u *ui) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	webui.SecurityHeaders(w.Header(), "default-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'", false)
	if !u.cfg.Authorize(r) {
		http.Error(w, "403 forbidden", http.StatusForbidden)
		return
	}
	r2 := webui.Strip(w, r, u.cfg.Prefix)
	if r2 == nil {
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		if err := u.csrf.Check(w, r2, csrfField, ""); err != nil {
			u.log.Warn("txhook: ui refused a request", "method", r.Method, "path", r.URL.Path, "reason", err.Error(), "remote", r.RemoteAddr)
			http.Error(w, "403 forbidden: "+err.Error(), http.StatusForbidden)
			return
		}
	}
	u.mux.ServeHTTP(w, r2)
}

// page is what every template gets.
type page struct {
	Title  string
	Nav    string
	Prefix string
	CSRF   string
	Flash  string
	Error  bool
	Now    time.Time
	Data   any
}

func (u *ui) render(w http.ResponseWriter, r *http.Request, status int, name string, p page) {
	t, ok := u.pages[name]
	if !ok {
		panic("txhook: dlq: no template " + name)
	}
	p.Prefix, p.Now = u.cfg.Prefix, u.in.Clock.Now().UTC()
	p.CSRF = u.csrf.Token(w, r, "")
	if p.Flash == "" {
		p.Flash, p.Error = flash(r)
	}
	var buf bytes.Buffer
	if err := t.ExecuteTemplate(&buf, "layout", p); err != nil {
		u.log.Error("txhook: ui template", "page", name, "error", err)
		http.Error(w, "500 internal error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

func (u *ui) fail(w http.ResponseWriter, r *http.Request, status int, msg string) {
	u.render(w, r, status, "error", page{Title: http.StatusText(status), Flash: msg, Error: true, Data: status})
}

// internal logs err and answers 500 without showing it.
func (u *ui) internal(w http.ResponseWriter, r *http.Request, err error) {
	u.log.Error("txhook: ui", "method", r.Method, "path", r.URL.Path, "error", err)
	u.fail(w, r, http.StatusInternalServerError, "Something went wrong; the error is in the server log.")
}

// audit logs an operator's action and writes it to the audit log, as
// done by the actor in the request's context (outbox.WithActor), or else
// by "operator" from the request's address.
func (u *ui) audit(r *http.Request, tenant, action, target string, detail map[string]any) {
	u.log.Info("txhook: ui action", "action", action, "tenant", tenant, "target", target, "remote", r.RemoteAddr)
	if err := u.ob.Record(actorCtx(r), tenant, action, target, detail); err != nil {
		u.log.Error("txhook: ui: audit log", "action", action, "error", err)
	}
}

// actorCtx is the request's context with an actor: the one the host set
// with outbox.WithActor, else "operator" at the request's address.
func actorCtx(r *http.Request) context.Context {
	if _, ok := outbox.ActorFrom(r.Context()); ok {
		return r.Context()
	}
	return outbox.WithActor(r.Context(), outbox.Actor{Name: "operator", Addr: r.RemoteAddr})
}

// scope returns the tenant a request is limited to, if any.
func (u *ui) scope(r *http.Request) (string, bool) {
	if u.cfg.Scope == nil {
		return "", false
	}
	t, limited := u.cfg.Scope(r)
	return t, limited
}

// tenantFilter is the tenant a page shows: the scope's when limited, else
// ?tenant= (GET) or the form's tenant (POST), "" for every tenant.
func (u *ui) tenantFilter(r *http.Request) string {
	if t, ok := u.scope(r); ok {
		return t
	}
	if r.Method == http.MethodPost {
		return strings.TrimSpace(r.PostForm.Get("tenant"))
	}
	return strings.TrimSpace(r.URL.Query().Get("tenant"))
}

// portalLink is the link into tenant's merchant portal; "" without one.
func (u *ui) portalLink(tenant string) string {
	if u.cfg.PortalLink == nil || tenant == "" {
		return ""
	}
	l, err := u.cfg.PortalLink(tenant)
	if err != nil {
		u.log.Warn("txhook: ui: portal link", "error", err)
		return ""
	}
	return l
}

// redirect answers a POST with 303 to a page of the UI.
func (u *ui) redirect(w http.ResponseWriter, r *http.Request, rel string) {
	http.Redirect(w, r, u.cfg.Prefix+rel, http.StatusSeeOther)
}

func (u *ui) parse() error {
	funcs := template.FuncMap{
		"path":       u.path,
		"time":       webui.Time,
		"ago":        func(now, t time.Time) string { return ago(now, t) },
		"dur":        webui.Duration,
		"pct":        func(f float64) string { return fmt.Sprintf("%.1f%%", f*100) },
		"status":     webui.Status,
		"plural":     plural,
		"healthy":    healthClass,
		"list":       func(v ...any) []any { return v },
		"span":       span,
		"reason":     reason,
		"deadReason": deadReason,
		"portal":     u.portalLink,
	}
	u.pages = map[string]*template.Template{}
	for _, name := range []string{"endpoints", "endpoint", "deliveries", "dead", "deadletter", "audit", "error"} {
		t, err := template.New(name).Funcs(funcs).ParseFS(uiFS, "templates/layout.html", "templates/parts.html", "templates/"+name+".html")
		if err != nil {
			return fmt.Errorf("txhook: dlq: templates: %w", err)
		}
		u.pages[name] = t
	}
	return nil
}
