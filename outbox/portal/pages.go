package portal

import (
	"errors"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/txhook/txhook/outbox"
)

// endpointRow is an endpoint with its health over the two windows.
type endpointRow struct {
	outbox.Endpoint
	Day, Week outbox.Health
	// DisableIn is how long a failing endpoint has before the relays
	// disable it; zero when not failing or unknown.
	DisableIn time.Duration
}

func (p *Portal) endpointRow(r *http.Request, ep outbox.Endpoint) (endpointRow, error) {
	v := state(r).view
	row := endpointRow{Endpoint: ep}
	var err error
	if row.Day, err = v.Health(r.Context(), ep.ID, 24*time.Hour); err != nil {
		return row, err
	}
	if row.Week, err = v.Health(r.Context(), ep.ID, 7*24*time.Hour); err != nil {
		return row, err
	}
	if ep.Enabled && !ep.FailingSince.IsZero() && p.cfg.DisableAfter > 0 {
		row.DisableIn = max(ep.FailingSince.Add(p.cfg.DisableAfter).Sub(p.now()), time.Second)
	}
	return row, nil
}

func (p *Portal) endpoints(w http.ResponseWriter, r *http.Request) {
	st := state(r)
	eps, err := st.view.Endpoints(r.Context())
	if err != nil {
		p.internal(w, r, err)
		return
	}
	rows := make([]endpointRow, 0, len(eps))
	for _, ep := range eps {
		row, err := p.endpointRow(r, ep)
		if err != nil {
			p.internal(w, r, err)
			return
		}
		rows = append(rows, row)
	}
	p.render(w, r, http.StatusOK, "endpoints", page{Title: st.loc.T("nav.endpoints"), Nav: "endpoints", Data: rows})
}

// lookup reads the endpoint of the path, answering 404 (another tenant's
// or missing, alike) or 500 itself when it cannot.
func (p *Portal) lookup(w http.ResponseWriter, r *http.Request) (outbox.Endpoint, bool) {
	ep, err := state(r).view.Endpoint(r.Context(), r.PathValue("id"))
	if errors.Is(err, outbox.ErrEndpointNotFound) {
		p.notFound(w, r)
		return ep, false
	}
	if err != nil {
		p.internal(w, r, err)
		return ep, false
	}
	return ep, true
}

// endpointPage is the endpoint page's data.
type endpointPage struct {
	Row       endpointRow
	DayChart  chartSVG
	WeekChart chartSVG
	Secrets   []secretRow
	Recent    outbox.DeliveryPage
	TestTypes []string // catalog types, for a test event
}

type secretRow struct {
	Masked    string
	ExpiresIn time.Duration // 0: does not expire
}

func (p *Portal) endpoint(w http.ResponseWriter, r *http.Request) {
	ep, ok := p.lookup(w, r)
	if !ok {
		return
	}
	st := state(r)
	row, err := p.endpointRow(r, ep)
	if err != nil {
		p.internal(w, r, err)
		return
	}
	d := endpointPage{Row: row}
	if p.cfg.Catalog != nil {
		for _, t := range p.cfg.Catalog.Types() {
			d.TestTypes = append(d.TestTypes, t.Name)
		}
	}
	day, err := st.view.HealthSeries(r.Context(), ep.ID, 24*time.Hour, time.Hour)
	if err != nil {
		p.internal(w, r, err)
		return
	}
	week, err := st.view.HealthSeries(r.Context(), ep.ID, 7*24*time.Hour, 6*time.Hour)
	if err != nil {
		p.internal(w, r, err)
		return
	}
	d.DayChart, d.WeekChart = p.charts(st.loc, "24h", day), p.charts(st.loc, "7d", week)
	for _, s := range ep.Secrets {
		sr := secretRow{Masked: s.Masked()}
		if !s.ExpiresAt.IsZero() {
			sr.ExpiresIn = max(s.ExpiresAt.Sub(p.now()), 0)
		}
		d.Secrets = append(d.Secrets, sr)
	}
	if d.Recent, err = st.view.Deliveries(r.Context(), outbox.DeliveryFilter{EndpointID: ep.ID, Limit: 10}); err != nil {
		p.internal(w, r, err)
		return
	}
	p.render(w, r, http.StatusOK, "endpoint", page{Title: ep.URL, Nav: "endpoints", Data: d})
}

// formData is the create/edit form's data.
type formData struct {
	Edit        bool
	ID          string
	URL         string
	Description string
	EventTypes  []string
	Headers     string   // one "Name: value" per line, as typed; never read back
	HeaderNames []string // the endpoint's current custom headers, on edit
	Types       []string
	Problem     string
}

func (p *Portal) typeNames() []string {
	if p.cfg.Catalog == nil {
		return nil
	}
	var names []string
	seen := map[string]bool{}
	for _, t := range p.cfg.Catalog.Types() {
		names = append(names, t.Name)
		if i := strings.IndexByte(t.Name, '.'); i > 0 && !seen[t.Name[:i]] {
			seen[t.Name[:i]] = true
			names = append(names, t.Name[:i]+".*")
		}
	}
	sort.Strings(names)
	return names
}

func (p *Portal) newForm(w http.ResponseWriter, r *http.Request) {
	p.render(w, r, http.StatusOK, "form", page{Title: state(r).loc.T("form.new"), Nav: "endpoints", Data: formData{Types: p.typeNames()}})
}

func (p *Portal) editForm(w http.ResponseWriter, r *http.Request) {
	ep, ok := p.lookup(w, r)
	if !ok {
		return
	}
	f := formData{Edit: true, ID: ep.ID, URL: ep.URL, Description: ep.Description, EventTypes: ep.EventTypes, Types: p.typeNames()}
	// Header values can be credentials: like the secret, they are not
	// shown again, only their names.
	for k := range ep.Headers {
		f.HeaderNames = append(f.HeaderNames, k)
	}
	sort.Strings(f.HeaderNames)
	p.render(w, r, http.StatusOK, "form", page{Title: state(r).loc.T("form.edit"), Nav: "endpoints", Data: f})
}

// readForm reads the endpoint form; a problem is a message key.
func readForm(r *http.Request) (f formData, headers outbox.Headers, problem string) {
	f.URL = strings.TrimSpace(r.PostForm.Get("url"))
	f.Description = strings.TrimSpace(r.PostForm.Get("description"))
	for _, t := range r.PostForm["event_types"] {
		f.EventTypes = append(f.EventTypes, strings.FieldsFunc(t, func(c rune) bool { return c == ',' || c == ' ' || c == '\n' || c == '\r' })...)
	}
	f.Headers = r.PostForm.Get("headers")
	headers = outbox.Headers{}
	for _, line := range strings.Split(f.Headers, "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			return f, nil, "err.headers"
		}
		headers[strings.TrimSpace(k)] = strings.TrimSpace(v)
	}
	return f, headers, ""
}

// problemKey names the message of an error the merchant can fix, or ""
// for an internal one.
func problemKey(err error) string {
	switch {
	case errors.Is(err, outbox.ErrInsecureURL):
		return "err.insecure"
	case errors.Is(err, outbox.ErrForbiddenTarget):
		return "err.forbidden_target"
	case errors.Is(err, outbox.ErrHostNotFound), errors.Is(err, outbox.ErrDNSUnavailable):
		return "err.host"
	case errors.Is(err, outbox.ErrInvalidURL):
		return "err.url"
	case errors.Is(err, outbox.ErrReservedHeader):
		return "err.reserved_header"
	case errors.Is(err, outbox.ErrUnknownEventType):
		return "err.unknown_type"
	case errors.Is(err, outbox.ErrInvalidEndpoint):
		return "err.invalid_endpoint"
	case errors.Is(err, outbox.ErrInvalidSince):
		return "err.since"
	case errors.Is(err, outbox.ErrDeliveryActive):
		return "err.active"
	case errors.Is(err, outbox.ErrInvalidFilter), errors.Is(err, outbox.ErrInvalidCursor):
		return "err.filter"
	}
	return ""
}

// saveForm reads the endpoint form and calls save with it. It answers
// itself and returns false when the form or save fails: the form again
// with the problem for what the merchant can fix, 404 for an endpoint not
// the tenant's, 500 for the rest.
func (p *Portal) saveForm(w http.ResponseWriter, r *http.Request, edit bool, save func(formData, outbox.Headers) error) bool {
	st := state(r)
	f, headers, problem := readForm(r)
	f.Edit, f.Types = edit, p.typeNames()
	title := "form.new"
	if edit {
		f.ID, title = r.PathValue("id"), "form.edit"
	}
	if problem == "" {
		err := save(f, headers)
		switch {
		case notFound(err):
			p.notFound(w, r)
			return false
		case err != nil:
			if problem = problemKey(err); problem == "" {
				p.internal(w, r, err)
				return false
			}
		}
	}
	if problem != "" {
		f.Problem = st.loc.T(problem)
		p.render(w, r, http.StatusBadRequest, "form", page{Title: st.loc.T(title), Nav: "endpoints", Data: f})
		return false
	}
	return true
}

func (p *Portal) create(w http.ResponseWriter, r *http.Request) {
	var ep outbox.Endpoint
	if p.saveForm(w, r, false, func(f formData, h outbox.Headers) (err error) {
		ep, err = state(r).view.CreateEndpoint(r.Context(), outbox.NewEndpoint{URL: f.URL, Description: f.Description, EventTypes: f.EventTypes, Headers: h})
		return err
	}) {
		p.showSecret(w, r, ep, "secret.created")
	}
}

// secretData is the one page that shows a secret in full: the answer to
// the POST that made it. It is never shown again.
type secretData struct {
	Endpoint outbox.Endpoint
	Secret   string
	Message  string
	Overlap  time.Duration
}

func (p *Portal) showSecret(w http.ResponseWriter, r *http.Request, ep outbox.Endpoint, msg string) {
	d := secretData{Endpoint: ep, Message: msg}
	if len(ep.Secrets) > 0 {
		d.Secret = ep.Secrets[0].Value
	}
	if len(ep.Secrets) > 1 && !ep.Secrets[1].ExpiresAt.IsZero() {
		d.Overlap = max(ep.Secrets[1].ExpiresAt.Sub(p.now()), 0)
	}
	p.render(w, r, http.StatusOK, "secret", page{Title: state(r).loc.T("secret.title"), Nav: "endpoints", Data: d})
}

func (p *Portal) update(w http.ResponseWriter, r *http.Request) {
	if p.saveForm(w, r, true, func(f formData, h outbox.Headers) error {
		up := outbox.EndpointUpdate{URL: &f.URL, Description: &f.Description, EventTypes: &f.EventTypes}
		// Empty keeps the current headers (their values are not in the
		// form); "clear_headers" removes them.
		if len(h) > 0 || r.PostForm.Get("clear_headers") == "yes" {
			up.Headers = &h
		}
		_, err := state(r).view.UpdateEndpoint(r.Context(), f.ID, up)
		return err
	}) {
		p.redirect(w, r, "endpoints/"+url.PathEscape(r.PathValue("id")), "saved")
	}
}

// act runs a mutating action on the path's endpoint and answers it.
func (p *Portal) act(w http.ResponseWriter, r *http.Request, done string, fn func(id string) error) {
	id := r.PathValue("id")
	p.finish(w, r, fn(id), http.StatusBadRequest, "endpoints/"+url.PathEscape(id), done)
}

// finish answers a POST: 404 for anything not found (another tenant's
// alike), status with the message of an error the merchant can fix, 500
// for the rest, else 303 to rel with the message done.
func (p *Portal) finish(w http.ResponseWriter, r *http.Request, err error, status int, rel, done string) {
	switch {
	case notFound(err):
		p.notFound(w, r)
	case err != nil && problemKey(err) != "":
		p.fail(w, r, state(r).tenant, status, problemKey(err))
	case err != nil:
		p.internal(w, r, err)
	default:
		p.redirect(w, r, rel, done)
	}
}

// notFound reports whether err says the object is not the tenant's.
func notFound(err error) bool {
	return errors.Is(err, outbox.ErrEndpointNotFound) || errors.Is(err, outbox.ErrDeliveryNotFound) || errors.Is(err, outbox.ErrEventNotFound)
}

func (p *Portal) enable(w http.ResponseWriter, r *http.Request) {
	p.act(w, r, "enabled", func(id string) error { return state(r).view.EnableEndpoint(r.Context(), id) })
}

func (p *Portal) disable(w http.ResponseWriter, r *http.Request) {
	reason := strings.TrimSpace(r.PostForm.Get("reason"))
	if reason == "" {
		reason = "disabled in the portal"
	}
	p.act(w, r, "disabled", func(id string) error { return state(r).view.DisableEndpoint(r.Context(), id, reason) })
}

func (p *Portal) delete(w http.ResponseWriter, r *http.Request) {
	st := state(r)
	if r.PostForm.Get("confirm") != "yes" {
		p.fail(w, r, st.tenant, http.StatusBadRequest, "err.confirm")
		return
	}
	p.finish(w, r, st.view.DeleteEndpoint(r.Context(), r.PathValue("id")), http.StatusBadRequest, "endpoints", "deleted")
}

// parseOverlap reads a rotation's overlap: default 24 h, at most 7 days.
func parseOverlap(s string) (time.Duration, bool) {
	if s == "" {
		return outbox.DefaultRotationOverlap, true
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 || d > 7*24*time.Hour {
		return 0, false
	}
	if d == 0 {
		d = -1 // retire the old secret at once
	}
	return d, true
}

func (p *Portal) rotate(w http.ResponseWriter, r *http.Request) {
	st := state(r)
	overlap, ok := parseOverlap(r.PostForm.Get("overlap"))
	if !ok {
		p.fail(w, r, st.tenant, http.StatusBadRequest, "err.overlap")
		return
	}
	ep, err := st.view.RotateSecret(r.Context(), r.PathValue("id"), outbox.Rotation{Overlap: overlap})
	if errors.Is(err, outbox.ErrEndpointNotFound) {
		p.notFound(w, r)
		return
	}
	if err != nil {
		p.internal(w, r, err)
		return
	}
	p.showSecret(w, r, ep, "secret.rotated")
}

// parseTime reads a time from a form or query: RFC 3339 or the
// "2006-01-02T15:04" of a datetime-local input (UTC).
func parseTime(s string) (time.Time, bool) {
	s = strings.TrimSpace(s)
	if s == "" {
		return time.Time{}, true
	}
	for _, layout := range []string{time.RFC3339, "2006-01-02T15:04", "2006-01-02T15:04:05", "2006-01-02"} {
		if t, err := time.Parse(layout, s); err == nil {
			return t.UTC(), true
		}
	}
	return time.Time{}, false
}

func (p *Portal) recoverSince(w http.ResponseWriter, r *http.Request) {
	st := state(r)
	since, ok := parseTime(r.PostForm.Get("since"))
	if !ok || since.IsZero() {
		p.fail(w, r, st.tenant, http.StatusBadRequest, "err.since")
		return
	}
	p.act(w, r, "recovered", func(id string) error {
		_, err := st.view.Recover(r.Context(), id, since)
		return err
	})
}

func (p *Portal) sendTest(w http.ResponseWriter, r *http.Request) {
	st := state(r)
	d, err := st.view.SendTest(r.Context(), r.PathValue("id"), r.PostForm.Get("type"))
	p.finish(w, r, err, http.StatusBadRequest, "deliveries/"+strconv.FormatInt(d.ID, 10), "test_sent")
}

// deliveriesData is the delivery log's data.
type deliveriesData struct {
	Filter    outbox.DeliveryFilter
	SinceText string
	UntilText string
	Page      outbox.DeliveryPage
	States    []string
	Types     []string
	Endpoints []outbox.Endpoint
	NextURL   string
}

// filterOf reads a delivery filter from the query.
func (p *Portal) filterOf(q url.Values) (outbox.DeliveryFilter, bool) {
	f := outbox.DeliveryFilter{EndpointID: q.Get("endpoint"), EventID: strings.TrimSpace(q.Get("event")), EventType: strings.TrimSpace(q.Get("type")),
		State: q.Get("status"), Cursor: q.Get("cursor"), Limit: p.cfg.PageSize}
	var ok1, ok2 bool
	f.Since, ok1 = parseTime(q.Get("since"))
	f.Until, ok2 = parseTime(q.Get("until"))
	return f, ok1 && ok2
}

var states = []string{outbox.StatePending, outbox.StateRunning, outbox.StateSucceeded, outbox.StateDead, outbox.StatePaused}

func (p *Portal) deliveries(w http.ResponseWriter, r *http.Request) {
	st := state(r)
	q := r.URL.Query()
	f, ok := p.filterOf(q)
	if !ok {
		p.fail(w, r, st.tenant, http.StatusBadRequest, "err.filter")
		return
	}
	page1, err := st.view.Deliveries(r.Context(), f)
	if problemKey(err) != "" {
		p.fail(w, r, st.tenant, http.StatusBadRequest, problemKey(err))
		return
	}
	if err != nil {
		p.internal(w, r, err)
		return
	}
	eps, err := st.view.Endpoints(r.Context())
	if err != nil {
		p.internal(w, r, err)
		return
	}
	d := deliveriesData{Filter: f, SinceText: q.Get("since"), UntilText: q.Get("until"), Page: page1, States: states, Types: p.typeNames(), Endpoints: eps}
	if page1.Next != "" {
		q2 := url.Values{}
		for k, v := range q {
			if k != "cursor" && k != "done" {
				q2[k] = v
			}
		}
		q2.Set("cursor", page1.Next)
		d.NextURL = p.cfg.Prefix + "deliveries?" + q2.Encode()
	}
	p.render(w, r, http.StatusOK, "deliveries", page{Title: st.loc.T("nav.deliveries"), Nav: "deliveries", Data: d})
}

// deliveryData is a delivery with its attempts, event and endpoint.
type deliveryData struct {
	Delivery outbox.Delivery
	Attempts []outbox.Attempt
	Event    outbox.EventRecord
	Endpoint outbox.Endpoint
	Done     bool
}

func (p *Portal) deliveryID(w http.ResponseWriter, r *http.Request) (int64, bool) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id <= 0 {
		p.notFound(w, r)
		return 0, false
	}
	return id, true
}

func (p *Portal) delivery(w http.ResponseWriter, r *http.Request) {
	st := state(r)
	id, ok := p.deliveryID(w, r)
	if !ok {
		return
	}
	var d deliveryData
	var err error
	d.Delivery, err = st.view.Delivery(r.Context(), id)
	if errors.Is(err, outbox.ErrDeliveryNotFound) {
		p.notFound(w, r)
		return
	}
	if err == nil {
		d.Attempts, err = st.view.Attempts(r.Context(), id)
	}
	if err == nil {
		d.Event, err = st.view.Event(r.Context(), d.Delivery.EventID)
	}
	if err == nil {
		d.Endpoint, err = st.view.Endpoint(r.Context(), d.Delivery.EndpointID)
	}
	if err != nil {
		p.internal(w, r, err)
		return
	}
	pg := page{Title: st.loc.T("delivery.title"), Nav: "deliveries", Data: &d}
	switch d.Delivery.State {
	case outbox.StatePending, outbox.StateRunning:
		// The result of a test event or a resend shows up on its own,
		// without JavaScript, while the delivery is on its way.
		pg.Refresh = 2
	default:
		d.Done = true
	}
	p.render(w, r, http.StatusOK, "delivery", pg)
}

func (p *Portal) resend(w http.ResponseWriter, r *http.Request) {
	st := state(r)
	id, ok := p.deliveryID(w, r)
	if !ok {
		return
	}
	d, err := st.view.Resend(r.Context(), id)
	p.finish(w, r, err, http.StatusConflict, "deliveries/"+strconv.FormatInt(d.ID, 10), "resent")
}

// eventData is an event with its deliveries to the tenant's endpoints.
type eventData struct {
	Event      outbox.EventRecord
	Deliveries []outbox.Delivery
}

func (p *Portal) event(w http.ResponseWriter, r *http.Request) {
	st := state(r)
	ev, err := st.view.Event(r.Context(), r.PathValue("id"))
	if errors.Is(err, outbox.ErrEventNotFound) {
		p.notFound(w, r)
		return
	}
	if err != nil {
		p.internal(w, r, err)
		return
	}
	ds, err := st.view.Deliveries(r.Context(), outbox.DeliveryFilter{EventID: ev.ID, Limit: outbox.MaxDeliveryPage})
	if err != nil {
		p.internal(w, r, err)
		return
	}
	p.render(w, r, http.StatusOK, "event", page{Title: st.loc.T("event.title"), Nav: "deliveries", Data: eventData{Event: ev, Deliveries: ds.Deliveries}})
}

// catalogData lists the catalog, with the versions the tenant's endpoints
// pin.
type catalogData struct {
	Types  []outbox.EventType
	Pinned map[string][]pin // by type
}

type pin struct {
	Endpoint outbox.Endpoint
	Version  int
}

func (p *Portal) catalog(w http.ResponseWriter, r *http.Request) {
	st := state(r)
	d := catalogData{Pinned: map[string][]pin{}}
	if p.cfg.Catalog != nil {
		d.Types = p.cfg.Catalog.Types()
	}
	eps, err := st.view.Endpoints(r.Context())
	if err != nil {
		p.internal(w, r, err)
		return
	}
	for _, ep := range eps {
		for typ, v := range ep.Versions {
			d.Pinned[typ] = append(d.Pinned[typ], pin{Endpoint: ep, Version: v})
		}
	}
	p.render(w, r, http.StatusOK, "catalog", page{Title: st.loc.T("nav.catalog"), Nav: "catalog", Data: d})
}

func (p *Portal) audit(w http.ResponseWriter, r *http.Request) {
	st := state(r)
	pg, err := st.view.AuditLog(r.Context(), outbox.AuditFilter{Cursor: r.URL.Query().Get("cursor"), Limit: p.cfg.PageSize})
	if errors.Is(err, outbox.ErrInvalidCursor) {
		p.fail(w, r, st.tenant, http.StatusBadRequest, "err.filter")
		return
	}
	if err != nil {
		p.internal(w, r, err)
		return
	}
	p.render(w, r, http.StatusOK, "audit", page{Title: st.loc.T("nav.audit"), Nav: "audit", Data: pg})
}
