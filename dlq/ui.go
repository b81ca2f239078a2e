package dlq

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"embed"
	"encoding/base64"
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
	if cfg.Prefix == "" {
		cfg.Prefix = "/"
	}
	if !strings.HasPrefix(cfg.Prefix, "/") {
		cfg.Prefix = "/" + cfg.Prefix
	}
	if !strings.HasSuffix(cfg.Prefix, "/") {
		cfg.Prefix += "/"
	}
	if strings.ContainsAny(cfg.Prefix, "?#\"'<> ") {
		return nil, fmt.Errorf("txhook: dlq.NewUI: invalid Prefix %q", cfg.Prefix)
	}
	if cfg.CSRFKey == nil {
		cfg.CSRFKey = make([]byte, 32)
		if _, err := rand.Read(cfg.CSRFKey); err != nil {
			return nil, err
		}
	} else if len(cfg.CSRFKey) < 32 {
		return nil, errors.New("txhook: dlq.NewUI: CSRFKey must be at least 32 bytes")
	}
	if cfg.HealthWindow <= 0 {
		cfg.HealthWindow = outbox.DefaultHealthWindow
	}
	if cfg.PageSize <= 0 {
		cfg.PageSize = 50
	}
	cfg.PageSize = min(cfg.PageSize, 500)

	u := &ui{ob: ob, q: New(ob), in: link.Outbox(ob), cfg: cfg, cop: http.NewCrossOriginProtection()}
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
	cop   *http.CrossOriginProtection
	mux   *http.ServeMux
	pages map[string]*template.Template
}

const (
	csrfCookie       = "txhook_csrf"
	csrfSecureCookie = "__Host-txhook_csrf"
	csrfField        = "csrf"
	maxForm          = 1 << 20
)

func (u *ui) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
	h.Set("X-Frame-Options", "DENY")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
	if !u.cfg.Authorize(r) {
		http.Error(w, "403 forbidden", http.StatusForbidden)
		return
	}

	// Accept the path with the prefix (mounted as is) or without it
	// (behind http.StripPrefix).
	p := r.URL.Path
	switch {
	case strings.HasPrefix(p, u.cfg.Prefix):
		p = "/" + p[len(u.cfg.Prefix):]
	case p+"/" == u.cfg.Prefix:
		http.Redirect(w, r, u.cfg.Prefix, http.StatusFound)
		return
	case !strings.HasPrefix(p, "/"):
		p = "/" + p
	}
	r2 := new(http.Request)
	*r2 = *r
	u2 := *r.URL
	u2.Path, u2.RawPath = p, ""
	r2.URL = &u2

	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		if err := u.checkCSRF(w, r2); err != nil {
			u.log.Warn("txhook: ui refused a request", "method", r.Method, "path", r.URL.Path, "reason", err.Error(), "remote", r.RemoteAddr)
			http.Error(w, "403 forbidden: "+err.Error(), http.StatusForbidden)
			return
		}
	}
	u.mux.ServeHTTP(w, r2)
}

// checkCSRF checks a state-changing request: not cross-origin by the
// browser's own account, and carrying the token of its CSRF cookie.
func (u *ui) checkCSRF(w http.ResponseWriter, r *http.Request) error {
	if err := u.cop.Check(r); err != nil {
		return errors.New("cross-origin request")
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxForm)
	if err := r.ParseForm(); err != nil {
		return errors.New("unreadable form")
	}
	c, err := r.Cookie(u.csrfCookie(r))
	if err != nil || !validNonce(c.Value) {
		return errors.New("missing CSRF cookie; reload the page")
	}
	got := r.PostForm.Get(csrfField)
	if got == "" {
		return errors.New("missing CSRF token")
	}
	if !hmac.Equal([]byte(got), []byte(u.token(c.Value))) {
		return errors.New("wrong CSRF token; reload the page")
	}
	return nil
}

func validNonce(s string) bool {
	b, err := base64.RawURLEncoding.DecodeString(s)
	return err == nil && len(b) == 32
}

func (u *ui) token(nonce string) string {
	m := hmac.New(sha256.New, u.cfg.CSRFKey)
	m.Write([]byte("txhook-ui-csrf\x00"))
	m.Write([]byte(nonce))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// csrf returns the form token for the request's CSRF cookie, setting a new
// cookie when it has none.
func (u *ui) csrf(w http.ResponseWriter, r *http.Request) string {
	name := u.csrfCookie(r)
	if c, err := r.Cookie(name); err == nil && validNonce(c.Value) {
		return u.token(c.Value)
	}
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	nonce := base64.RawURLEncoding.EncodeToString(b)
	c := &http.Cookie{Name: name, Value: nonce, Path: u.cfg.Prefix, HttpOnly: true, SameSite: http.SameSiteStrictMode}
	if name == csrfSecureCookie {
		c.Path, c.Secure = "/", true
	}
	http.SetCookie(w, c)
	return u.token(nonce)
}

// csrfCookie names the CSRF cookie of r: the __Host- one over TLS.
func (u *ui) csrfCookie(r *http.Request) string {
	if u.overTLS(r) {
		return csrfSecureCookie
	}
	return csrfCookie
}

// overTLS reports whether r reached the UI's server over TLS, or reached
// a trusted proxy over TLS by that proxy's X-Forwarded-Proto.
func (u *ui) overTLS(r *http.Request) bool {
	if r.TLS != nil {
		return true
	}
	if len(u.cfg.TrustedProxies) == 0 {
		return false
	}
	peer, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return false
	}
	trusted := false
	for _, p := range u.cfg.TrustedProxies {
		trusted = trusted || p.Contains(peer.Addr().Unmap())
	}
	vals := r.Header.Values("X-Forwarded-Proto")
	if !trusted || len(vals) == 0 {
		return false
	}
	last := vals[len(vals)-1]
	if i := strings.LastIndexByte(last, ','); i >= 0 {
		last = last[i+1:]
	}
	return strings.EqualFold(strings.TrimSpace(last), "https")
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
	p.CSRF = u.csrf(w, r)
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
		"path":    u.path,
		"time":    fmtTime,
		"ago":     func(now, t time.Time) string { return ago(now, t) },
		"dur":     fmtDur,
		"pct":     func(f float64) string { return fmt.Sprintf("%.1f%%", f*100) },
		"status":  fmtStatus,
		"plural":  plural,
		"healthy": healthClass,
		"list":    func(v ...any) []any { return v },
		"span":    span,
		"reason":  reason,
		"portal":  u.portalLink,
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
