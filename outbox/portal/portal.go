package portal

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
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

// Config configures a Portal. Tenant or LinkKeys (or both) is required.
type Config struct {
	// Prefix is the URL path the portal is served under, such as
	// "/merchant/webhooks/"; links and redirects use it. Mount the handler
	// there as it is or behind http.StripPrefix. Default "/".
	Prefix string

	// Tenant, if set, names the tenant of a request from the host's own
	// login (its session cookie, its API token). When it returns false the
	// portal falls back to the session of an access link; with neither the
	// request is refused with 403.
	Tenant func(*http.Request) (tenant string, ok bool)

	// LinkKeys sign and verify access links and the sessions they open
	// (HMAC-SHA256; each at least 32 bytes). The first signs, all verify:
	// to rotate, put the new key first, and drop the old one when its
	// links should stop working (that revokes them and their sessions at
	// once). Give every instance behind a load balancer the same keys.
	// Empty: no links, Tenant is required.
	LinkKeys [][]byte

	// SessionTTL is how long the session an access link opens lasts, at
	// most until the link itself would have expired. Default 1 hour.
	SessionTTL time.Duration

	// Actor names who makes a change, for the audit log, such as the
	// host's user ID; "" or nil means "link:<tenant>" for link sessions
	// and "host:<tenant>" otherwise.
	Actor func(*http.Request) string

	// Locale chooses the language of a request: "en" or "zh" (Simplified
	// Chinese). Nil or "" means from the Accept-Language header.
	Locale func(*http.Request) string

	// FrameAncestors are the origins allowed to frame the portal (the
	// host's dashboard), as CSP frame-ancestors sources such as
	// "https://dashboard.example.com". Empty: no framing at all
	// (frame-ancestors 'none' and X-Frame-Options DENY).
	FrameAncestors []string

	// TrustedProxies are the reverse proxies that terminate TLS in front
	// of the portal: a request from one of them with X-Forwarded-Proto
	// https counts as made over TLS (cookies get the __Host- prefix and
	// Secure), and its X-Forwarded-For names the client in the audit log.
	TrustedProxies []netip.Prefix

	// CSRFKey keys the CSRF tokens (at least 32 bytes). Default: derived
	// from the first LinkKey, else random for each New.
	CSRFKey []byte

	// Catalog is the event type catalog the outbox uses (outbox.Config.
	// Catalog), shown on the catalog page and offered for subscriptions
	// and test events. Nil: free-form event types, no test events.
	Catalog *outbox.Catalog

	// DisableAfter is the relays' RelayConfig.DisableAfter, to show how
	// long a failing endpoint has before it is disabled. Zero: not shown.
	DisableAfter time.Duration

	// PageSize is how many deliveries a page lists. Default 50, at most
	// outbox.MaxDeliveryPage.
	PageSize int
}

// Portal is the merchant portal: an http.Handler scoped to one tenant per
// request. Make one with New.
type Portal struct {
	ob      *outbox.Outbox
	cfg     Config
	csp     string
	proxies webui.Proxies
	csrf    *webui.CSRF
	log     *slog.Logger
	clock   interface{ Now() time.Time }
	mux     *http.ServeMux
	api     *http.ServeMux
	pages   map[string]*template.Template
}

//go:embed templates/*.html static/*
var files embed.FS

// New returns the portal of ob. See the package documentation.
func New(ob *outbox.Outbox, cfg Config) (*Portal, error) {
	if ob == nil {
		return nil, errors.New("txhook: portal.New: nil outbox")
	}
	if cfg.Tenant == nil && len(cfg.LinkKeys) == 0 {
		return nil, errors.New("txhook: portal.New: set Config.Tenant or Config.LinkKeys (there is no open access)")
	}
	for _, k := range cfg.LinkKeys {
		if len(k) < 32 {
			return nil, errors.New("txhook: portal.New: every LinkKey must be at least 32 bytes")
		}
	}
	prefix, err := webui.Prefix(cfg.Prefix)
	if err != nil {
		return nil, fmt.Errorf("txhook: portal.New: %w", err)
	}
	cfg.Prefix = prefix
	if cfg.SessionTTL <= 0 {
		cfg.SessionTTL = time.Hour
	}
	if cfg.PageSize <= 0 {
		cfg.PageSize = 50
	}
	cfg.PageSize = min(cfg.PageSize, outbox.MaxDeliveryPage)
	for _, a := range cfg.FrameAncestors {
		if a == "" || strings.ContainsAny(a, ";,\"' \t\r\n") {
			return nil, fmt.Errorf("txhook: portal.New: invalid FrameAncestors source %q", a)
		}
	}
	csrfKey := cfg.CSRFKey
	if csrfKey == nil && len(cfg.LinkKeys) > 0 {
		m := hmac.New(sha256.New, cfg.LinkKeys[0])
		m.Write([]byte("txhook-portal-csrf-key"))
		csrfKey = m.Sum(nil)
	}
	csrf, err := webui.NewCSRF(csrfKey, "txhook-portal-csrf", "txhook_portal_csrf", cfg.Prefix, cfg.TrustedProxies)
	if err != nil {
		return nil, fmt.Errorf("txhook: portal.New: CSRFKey: %w", err)
	}
	in := link.Outbox(ob)
	p := &Portal{ob: ob, cfg: cfg, proxies: cfg.TrustedProxies, csrf: csrf, log: in.Logger, clock: in.Clock}
	fa := "'none'"
	if len(cfg.FrameAncestors) > 0 {
		fa = strings.Join(cfg.FrameAncestors, " ")
	}
	p.csp = "default-src 'none'; style-src 'self'; img-src 'self' data:; form-action 'self'; frame-ancestors " + fa + "; base-uri 'none'"
	if err := p.parse(); err != nil {
		return nil, err
	}
	p.routes()
	return p, nil
}

func (p *Portal) now() time.Time { return p.clock.Now().UTC() }

// ctxKey carries the request's tenant view and locale.
type ctxKey struct{}

type reqState struct {
	view   *outbox.TenantView
	tenant string
	loc    *locale
	link   bool // the tenant came from an access link's session
}

func state(r *http.Request) *reqState { return r.Context().Value(ctxKey{}).(*reqState) }

// ServeHTTP serves the portal: the access link, the static files, the
// pages of the request's tenant and the JSON API.
func (p *Portal) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	webui.SecurityHeaders(w.Header(), p.csp, len(p.cfg.FrameAncestors) > 0)
	r2 := webui.Strip(w, r, p.cfg.Prefix)
	if r2 == nil {
		return
	}
	st := &reqState{loc: p.localeOf(r)}
	r2 = r2.WithContext(context.WithValue(r.Context(), ctxKey{}, st))
	path := r2.URL.Path
	if path == "/link" || strings.HasPrefix(path, "/static/") {
		p.mux.ServeHTTP(w, r2)
		return
	}
	tenant, ok := "", false
	if p.cfg.Tenant != nil {
		tenant, ok = p.cfg.Tenant(r)
		ok = ok && tenant != ""
	}
	if !ok {
		tenant, ok = p.linkTenant(r)
		st.link = ok
	}
	api := strings.HasPrefix(path, "/api/")
	if !ok {
		if api {
			p.apiError(w, http.StatusForbidden, "forbidden", st.loc.T("err.forbidden"))
			return
		}
		p.fail(w, r2, "", http.StatusForbidden, "err.forbidden")
		return
	}
	st.tenant, st.view = tenant, p.ob.Tenant(tenant)
	actor := ""
	if p.cfg.Actor != nil {
		actor = p.cfg.Actor(r)
	}
	if actor == "" {
		if st.link {
			actor = "link:" + tenant
		} else {
			actor = "host:" + tenant
		}
	}
	ctx := outbox.WithActor(r2.Context(), outbox.Actor{Name: actor, Addr: p.proxies.ClientAddr(r)})
	r2 = r2.WithContext(ctx)
	if api {
		p.serveAPI(w, r2)
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		if err := p.csrf.Check(w, r2, "csrf", tenant); err != nil {
			p.log.Warn("txhook: portal refused a request", "method", r.Method, "path", r.URL.Path, "reason", err.Error(), "remote", p.proxies.ClientAddr(r))
			p.fail(w, r2, tenant, http.StatusForbidden, "err.csrf")
			return
		}
	}
	p.mux.ServeHTTP(w, r2)
}

// linkTenant is the tenant of r's link session cookie.
func (p *Portal) linkTenant(r *http.Request) (string, bool) {
	if len(p.cfg.LinkKeys) == 0 {
		return "", false
	}
	c, err := r.Cookie(p.sessionCookie(r))
	if err != nil {
		return "", false
	}
	s, err := p.verify(purposeSession, c.Value, p.now())
	if err != nil {
		return "", false
	}
	return s.tenant, true
}

// page is what every template gets.
type page struct {
	*locale
	Title   string
	Nav     string
	Prefix  string
	CSRF    string
	Tenant  string
	Flash   string
	Error   bool
	Now     time.Time
	Refresh int // seconds; a meta refresh while a result is pending
	Data    any
}

func (p *Portal) render(w http.ResponseWriter, r *http.Request, status int, name string, pg page) {
	t, ok := p.pages[name]
	if !ok {
		panic("txhook: portal: no template " + name)
	}
	st := state(r)
	pg.locale, pg.Prefix, pg.Now = st.loc, p.cfg.Prefix, p.now()
	if pg.Tenant == "" {
		pg.Tenant = st.tenant
	}
	if pg.Tenant != "" {
		pg.CSRF = p.csrf.Token(w, r, pg.Tenant)
	}
	if pg.Flash == "" {
		if f := r.URL.Query().Get("done"); f != "" && st.loc.has("done."+f) {
			pg.Flash = st.loc.T("done." + f)
		}
	}
	var buf bytes.Buffer
	if err := t.ExecuteTemplate(&buf, "layout", pg); err != nil {
		p.log.Error("txhook: portal template", "page", name, "error", err)
		http.Error(w, "500 internal error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Content-Language", st.loc.Lang)
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// fail renders the error page with the message of key.
func (p *Portal) fail(w http.ResponseWriter, r *http.Request, tenant string, status int, key string) {
	loc := state(r).loc
	p.render(w, r, status, "error", page{Title: loc.T("status." + fmt.Sprint(status)), Flash: loc.T(key), Error: true, Tenant: tenant, Data: status})
}

func (p *Portal) notFound(w http.ResponseWriter, r *http.Request) {
	p.fail(w, r, "", http.StatusNotFound, "err.notfound")
}

// internal logs err and answers 500 without showing it.
func (p *Portal) internal(w http.ResponseWriter, r *http.Request, err error) {
	p.log.Error("txhook: portal", "method", r.Method, "path", r.URL.Path, "error", err)
	p.fail(w, r, "", http.StatusInternalServerError, "err.internal")
}

// redirect answers a POST with 303 to a page of the portal, with a done
// message key.
func (p *Portal) redirect(w http.ResponseWriter, r *http.Request, rel, done string) {
	u := p.cfg.Prefix + rel
	if done != "" {
		if strings.Contains(u, "?") {
			u += "&done=" + done
		} else {
			u += "?done=" + done
		}
	}
	http.Redirect(w, r, u, http.StatusSeeOther)
}

func (p *Portal) path(parts ...any) string { return webui.Path(p.cfg.Prefix, parts...) }

func (p *Portal) parse() error {
	funcs := template.FuncMap{
		"path":   p.path,
		"time":   webui.Time,
		"dur":    webui.Duration,
		"status": webui.Status,
		"pct":    func(f float64) string { return fmt.Sprintf("%.1f%%", f*100) },
		"join":   strings.Join,
		"list":   func(v ...any) []any { return v },
		"add":    func(a, b int) int { return a + b },
	}
	p.pages = map[string]*template.Template{}
	for _, name := range pageNames {
		t, err := template.New(name).Funcs(funcs).ParseFS(files, "templates/layout.html", "templates/parts.html", "templates/"+name+".html")
		if err != nil {
			return fmt.Errorf("txhook: portal: templates: %w", err)
		}
		p.pages[name] = t
	}
	return nil
}

var pageNames = []string{"endpoints", "endpoint", "form", "secret", "deliveries", "delivery", "event", "catalog", "audit", "error"}

func (p *Portal) routes() {
	static, _ := fs.Sub(files, "static")
	m := http.NewServeMux()
	m.HandleFunc("GET /link", p.redeem)
	m.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	m.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, p.cfg.Prefix+"endpoints", http.StatusFound)
	})
	m.HandleFunc("GET /endpoints", p.endpoints)
	m.HandleFunc("GET /endpoints/new", p.newForm)
	m.HandleFunc("POST /endpoints", p.create)
	m.HandleFunc("GET /endpoints/{id}", p.endpoint)
	m.HandleFunc("GET /endpoints/{id}/edit", p.editForm)
	m.HandleFunc("POST /endpoints/{id}", p.update)
	m.HandleFunc("POST /endpoints/{id}/enable", p.enable)
	m.HandleFunc("POST /endpoints/{id}/disable", p.disable)
	m.HandleFunc("POST /endpoints/{id}/delete", p.delete)
	m.HandleFunc("POST /endpoints/{id}/rotate", p.rotate)
	m.HandleFunc("POST /endpoints/{id}/recover", p.recoverSince)
	m.HandleFunc("POST /endpoints/{id}/test", p.sendTest)
	m.HandleFunc("GET /deliveries", p.deliveries)
	m.HandleFunc("GET /deliveries/{id}", p.delivery)
	m.HandleFunc("POST /deliveries/{id}/resend", p.resend)
	m.HandleFunc("GET /events/{id}", p.event)
	m.HandleFunc("GET /catalog", p.catalog)
	m.HandleFunc("GET /export", p.export)
	m.HandleFunc("GET /audit", p.audit)
	m.HandleFunc("/", p.notFound)
	p.mux = m
	p.apiRoutes()
}
