package dlq

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/txhook/txhook/internal/store"
	"github.com/txhook/txhook/outbox"
)

// deliveryView is a delivery with its attempt log.
type deliveryView struct {
	outbox.Delivery
	Log []outbox.Attempt
}

// withAttempts reads the attempt logs of ds in one query.
func (u *ui) withAttempts(r *http.Request, ds []outbox.Delivery) ([]deliveryView, error) {
	ids := make([]int64, len(ds))
	for i, d := range ds {
		ids[i] = d.ID
	}
	rows, err := u.in.Store.AttemptsOfDeliveries(r.Context(), ids)
	if err != nil {
		return nil, err
	}
	byID := map[int64][]outbox.Attempt{}
	for _, a := range rows {
		byID[a.DeliveryID] = append(byID[a.DeliveryID], outbox.Attempt{DeliveryID: a.DeliveryID, Number: a.Attempt,
			StartedAt: a.StartedAt, Duration: a.Duration, Status: a.Status, ResponseExcerpt: a.Excerpt, Error: a.Error})
	}
	out := make([]deliveryView, len(ds))
	for i, d := range ds {
		out[i] = deliveryView{Delivery: d, Log: byID[d.ID]}
	}
	return out, nil
}

// Endpoints.

type endpointsData struct {
	Tenant  string
	Window  time.Duration
	Rows    []outbox.Health
	NextURL string
	Paged   bool
}

func (u *ui) endpoints(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	tenant := u.tenantFilter(r)
	var after *store.EndpointCursor
	if c := q.Get("after"); c != "" {
		b, err := base64.RawURLEncoding.DecodeString(c)
		t, id, ok := strings.Cut(string(b), "\x00")
		if err != nil || !ok {
			u.fail(w, r, http.StatusBadRequest, "Invalid page cursor.")
			return
		}
		after = &store.EndpointCursor{Tenant: t, ID: id}
	}
	rows, err := u.in.Store.ListEndpointsPage(r.Context(), tenant, after, u.cfg.PageSize+1)
	if err != nil {
		u.internal(w, r, err)
		return
	}
	d := endpointsData{Tenant: tenant, Window: u.cfg.HealthWindow, Paged: after != nil}
	if len(rows) > u.cfg.PageSize {
		rows = rows[:u.cfg.PageSize]
		last := rows[len(rows)-1]
		v := url.Values{"after": {base64.RawURLEncoding.EncodeToString([]byte(last.Tenant + "\x00" + last.ID))}}
		if tenant != "" {
			v.Set("tenant", tenant)
		}
		d.NextURL = u.cfg.Prefix + "endpoints?" + v.Encode()
	}
	for _, row := range rows {
		h, err := u.ob.EndpointHealth(r.Context(), row.ID, u.cfg.HealthWindow)
		if errors.Is(err, outbox.ErrEndpointNotFound) {
			continue // deleted meanwhile
		}
		if err != nil {
			u.internal(w, r, err)
			return
		}
		d.Rows = append(d.Rows, h)
	}
	u.render(w, r, http.StatusOK, "endpoints", page{Title: "Endpoints", Nav: "endpoints", Data: d})
}

type endpointData struct {
	Endpoint   outbox.Endpoint
	Health     outbox.Health
	Day, Week  chartPair // success and latency charts over 24 h and 7 days
	Deliveries []deliveryView
	NextURL    string
	Paged      bool
	Revealed   bool
}

func (u *ui) endpoint(w http.ResponseWriter, r *http.Request) {
	u.showEndpoint(w, r, false)
}

// endpointFor returns endpoint id when the request may see it (see
// UIConfig.Scope), answering 404 (or 500) and returning false otherwise.
func (u *ui) endpointFor(w http.ResponseWriter, r *http.Request, id string) (outbox.Endpoint, bool) {
	var ep outbox.Endpoint
	var err error
	if t := u.tenantFilter(r); t != "" {
		ep, err = u.ob.Tenant(t).Endpoint(r.Context(), id)
	} else {
		ep, err = u.ob.Endpoint(r.Context(), id)
	}
	if errors.Is(err, outbox.ErrEndpointNotFound) || errors.Is(err, outbox.ErrNoTenant) {
		u.fail(w, r, http.StatusNotFound, "No endpoint has that ID.")
		return ep, false
	}
	if err != nil {
		u.internal(w, r, err)
		return ep, false
	}
	return ep, true
}

func (u *ui) showEndpoint(w http.ResponseWriter, r *http.Request, reveal bool) {
	id := r.PathValue("id")
	ep, ok := u.endpointFor(w, r, id)
	if !ok {
		return
	}
	h, err := u.ob.EndpointHealth(r.Context(), id, u.cfg.HealthWindow)
	if err != nil {
		u.internal(w, r, err)
		return
	}
	cursor := ""
	if !reveal {
		cursor = r.URL.Query().Get("after")
	}
	dp, err := u.ob.EndpointDeliveries(r.Context(), id, cursor, u.cfg.PageSize)
	if errors.Is(err, outbox.ErrInvalidCursor) {
		u.fail(w, r, http.StatusBadRequest, "Invalid page cursor.")
		return
	}
	if err != nil {
		u.internal(w, r, err)
		return
	}
	ds, err := u.withAttempts(r, dp.Deliveries)
	if err != nil {
		u.internal(w, r, err)
		return
	}
	d := endpointData{Endpoint: ep, Health: h, Deliveries: ds, Paged: cursor != "", Revealed: reveal}
	if d.Day, err = u.charts(r, ep, 24*time.Hour, time.Hour, "day", "15:04"); err != nil {
		u.internal(w, r, err)
		return
	}
	if d.Week, err = u.charts(r, ep, 7*24*time.Hour, 6*time.Hour, "week", "01-02 15h"); err != nil {
		u.internal(w, r, err)
		return
	}
	if dp.Next != "" {
		d.NextURL = u.path("endpoints", id) + "?" + url.Values{"after": {dp.Next}}.Encode()
	}
	u.render(w, r, http.StatusOK, "endpoint", page{Title: "Endpoint " + id, Nav: "endpoints", Data: d})
}

func (u *ui) enable(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	ep, ok := u.endpointFor(w, r, id)
	if !ok || !u.endpointDone(w, r, u.ob.EnableEndpoint(r.Context(), id)) {
		return
	}
	u.audit(r, ep.Tenant, "endpoint.enable", id, nil)
	u.redirect(w, r, "endpoints/"+url.PathEscape(id)+"?done=enabled")
}

func (u *ui) disable(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	reason := strings.TrimSpace(r.PostForm.Get("reason"))
	if reason == "" {
		reason = "disabled by an operator"
	}
	ep, ok := u.endpointFor(w, r, id)
	if !ok || !u.endpointDone(w, r, u.ob.DisableEndpoint(r.Context(), id, reason)) {
		return
	}
	u.audit(r, ep.Tenant, "endpoint.disable", id, map[string]any{"reason": reason})
	u.redirect(w, r, "endpoints/"+url.PathEscape(id)+"?done=disabled")
}

// overlaps are the choices the rotate form offers.
var overlaps = map[string]time.Duration{"1h": time.Hour, "24h": 24 * time.Hour, "168h": 168 * time.Hour, "now": -1}

func (u *ui) rotate(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	overlap, ok := overlaps[r.PostForm.Get("overlap")]
	if !ok {
		u.fail(w, r, http.StatusBadRequest, "Pick how long the current secret keeps signing.")
		return
	}
	ep, ok := u.endpointFor(w, r, id)
	if !ok {
		return
	}
	_, err := u.ob.RotateSecret(r.Context(), id, outbox.Rotation{Overlap: overlap})
	if !u.endpointDone(w, r, err) {
		return
	}
	u.audit(r, ep.Tenant, "endpoint.rotate_secret", id, map[string]any{"overlap": max(overlap, 0).String()})
	u.redirect(w, r, "endpoints/"+url.PathEscape(id)+"?done=rotated")
}

// recoverEvents queues again what the endpoint missed since the time in
// the form (UTC): the events enqueued while it was disabled and its dead
// letters.
func (u *ui) recoverEvents(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	since, err := parseTime(strings.TrimSpace(r.PostForm.Get("since")))
	if err != nil {
		u.fail(w, r, http.StatusBadRequest, "Pick the time to recover from, in UTC, as 2026-11-30T12:00.")
		return
	}
	ep, ok := u.endpointFor(w, r, id)
	if !ok {
		return
	}
	n, err := u.ob.Recover(r.Context(), id, since)
	if errors.Is(err, outbox.ErrInvalidSince) {
		u.fail(w, r, http.StatusBadRequest, "Recover from a time in the past (times are UTC).")
		return
	}
	if !u.endpointDone(w, r, err) {
		return
	}
	u.audit(r, ep.Tenant, "endpoint.recover", id, map[string]any{"since": since, "queued": n})
	u.redirect(w, r, "endpoints/"+url.PathEscape(id)+"?"+url.Values{"done": {"recovered"}, "n": {strconv.Itoa(n)}}.Encode())
}

// reveal answers with the endpoint page showing its secrets in full, once:
// it is the response to this POST, not a page to come back to.
func (u *ui) reveal(w http.ResponseWriter, r *http.Request) {
	ep, ok := u.endpointFor(w, r, r.PathValue("id"))
	if !ok {
		return
	}
	u.audit(r, ep.Tenant, "endpoint.reveal_secrets", ep.ID, nil)
	u.showEndpoint(w, r, true)
}

// endpointDone reports whether an endpoint action succeeded, answering the
// request when it did not.
func (u *ui) endpointDone(w http.ResponseWriter, r *http.Request, err error) bool {
	switch {
	case err == nil:
		return true
	case errors.Is(err, outbox.ErrEndpointNotFound):
		u.fail(w, r, http.StatusNotFound, "No endpoint has that ID.")
	default:
		u.internal(w, r, err)
	}
	return false
}

// Search.

type searchData struct {
	EventID    string
	Searched   bool
	Deliveries []deliveryView
}

func (u *ui) search(w http.ResponseWriter, r *http.Request) {
	id := strings.TrimSpace(r.URL.Query().Get("event_id"))
	d := searchData{EventID: id, Searched: id != ""}
	if len(id) > 128 {
		u.fail(w, r, http.StatusBadRequest, "Event IDs are at most 128 characters.")
		return
	}
	if id != "" {
		var ds []outbox.Delivery
		var err error
		if t := u.tenantFilter(r); t != "" {
			var p outbox.DeliveryPage
			p, err = u.ob.Tenant(t).Deliveries(r.Context(), outbox.DeliveryFilter{EventID: id, Limit: outbox.MaxDeliveryPage})
			ds = p.Deliveries
			slices.Reverse(ds) // oldest first, as EventDeliveries
		} else {
			ds, err = u.ob.EventDeliveries(r.Context(), id)
		}
		if err != nil {
			u.internal(w, r, err)
			return
		}
		if d.Deliveries, err = u.withAttempts(r, ds); err != nil {
			u.internal(w, r, err)
			return
		}
	}
	u.render(w, r, http.StatusOK, "deliveries", page{Title: "Find an event", Nav: "deliveries", Data: d})
}

// Dead letters.

// filterForm is a dead-letter filter as typed in the form.
type filterForm struct {
	Tenant, Endpoint, Type, Since, Until, Reason string
}

// Reasons are the values of the form's reason filter.
func (filterForm) Reasons() []string {
	return []string{outbox.DeadReasonFailed, outbox.DeadReasonRefused}
}

func (f filterForm) values() url.Values {
	v := url.Values{}
	for k, s := range map[string]string{"tenant": f.Tenant, "endpoint": f.Endpoint, "type": f.Type, "since": f.Since, "until": f.Until,
		"reason": f.Reason} {
		if s != "" {
			v.Set(k, s)
		}
	}
	return v
}

// Empty reports whether the filter matches every dead letter.
func (f filterForm) Empty() bool { return len(f.values()) == 0 }

// timeLayouts are accepted for the time range: the browser's
// datetime-local value first. Times are UTC.
var timeLayouts = []string{"2006-01-02T15:04", "2006-01-02T15:04:05", time.RFC3339, "2006-01-02 15:04:05", "2006-01-02 15:04", "2006-01-02"}

func parseTime(s string) (time.Time, error) {
	for _, l := range timeLayouts {
		if t, err := time.ParseInLocation(l, s, time.UTC); err == nil {
			return t.UTC(), nil
		}
	}
	return time.Time{}, fmt.Errorf("unreadable time %q", s)
}

// errBadReason: the form's reason is none of filterForm.Reasons.
var errBadReason = errors.New("unknown reason")

// filterProblem is what the UI says of readFilter's error.
func filterProblem(err error) string {
	if errors.Is(err, errBadReason) {
		return "The reason is failed or refused."
	}
	return "Times are UTC, as 2026-11-30T12:00."
}

func readFilter(v url.Values) (filterForm, Filter, error) {
	ff := filterForm{
		Tenant: strings.TrimSpace(v.Get("tenant")), Endpoint: strings.TrimSpace(v.Get("endpoint")),
		Type: strings.TrimSpace(v.Get("type")), Since: strings.TrimSpace(v.Get("since")), Until: strings.TrimSpace(v.Get("until")),
		Reason: strings.TrimSpace(v.Get("reason")),
	}
	f := Filter{Tenant: ff.Tenant, EndpointID: ff.Endpoint, EventType: ff.Type, Reason: ff.Reason}
	if ff.Reason != "" && !slices.Contains(ff.Reasons(), ff.Reason) {
		return ff, f, errBadReason
	}
	var err error
	if ff.Since != "" {
		if f.Since, err = parseTime(ff.Since); err != nil {
			return ff, f, err
		}
	}
	if ff.Until != "" {
		if f.Until, err = parseTime(ff.Until); err != nil {
			return ff, f, err
		}
	}
	return ff, f, nil
}

type deadData struct {
	Filter   filterForm
	Count    int
	Entries  []Entry
	NextURL  string
	FirstURL string
	Paged    bool
}

func (u *ui) deadList(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	ff, f, err := readFilter(q)
	if err != nil {
		u.fail(w, r, http.StatusBadRequest, filterProblem(err))
		return
	}
	ff.Tenant = u.tenantFilter(r)
	f.Tenant = ff.Tenant
	cursor := q.Get("after")
	p, err := u.q.List(r.Context(), f, cursor, u.cfg.PageSize)
	if errors.Is(err, ErrInvalidCursor) {
		u.fail(w, r, http.StatusBadRequest, "Invalid page cursor.")
		return
	}
	if err != nil {
		u.internal(w, r, err)
		return
	}
	d := deadData{Filter: ff, Entries: p.Entries, Paged: cursor != "", FirstURL: u.cfg.Prefix + "dead"}
	if !ff.Empty() {
		d.FirstURL += "?" + ff.values().Encode()
	}
	if d.Count, err = u.q.Count(r.Context(), f); err != nil {
		u.internal(w, r, err)
		return
	}
	if p.Next != "" {
		v := ff.values()
		v.Set("after", p.Next)
		d.NextURL = u.cfg.Prefix + "dead?" + v.Encode()
	}
	u.render(w, r, http.StatusOK, "dead", page{Title: "Dead letters", Nav: "dead", Data: d})
}

type deadDetail struct {
	Detail
	PrettyPayload string
	EndpointGone  bool
}

func (u *ui) deadDetail(w http.ResponseWriter, r *http.Request) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil {
		u.fail(w, r, http.StatusNotFound, "No dead letter has that ID.")
		return
	}
	det, err := u.q.Get(r.Context(), id)
	if t := u.tenantFilter(r); err == nil && t != "" && det.Tenant != t {
		err = ErrNotFound // another tenant's: exactly like a missing one
	}
	if errors.Is(err, ErrNotFound) {
		u.fail(w, r, http.StatusNotFound, "No dead letter has that ID: it may have been replayed or purged.")
		return
	}
	if err != nil {
		u.internal(w, r, err)
		return
	}
	d := deadDetail{Detail: det}
	var buf bytes.Buffer
	if json.Indent(&buf, det.Payload, "", "  ") == nil {
		d.PrettyPayload = buf.String()
	} else {
		d.PrettyPayload = string(det.Payload)
	}
	if _, err := u.ob.Tenant(det.Tenant).Endpoint(r.Context(), det.EndpointID); errors.Is(err, outbox.ErrEndpointNotFound) || errors.Is(err, outbox.ErrNoTenant) {
		d.EndpointGone = true
	}
	u.render(w, r, http.StatusOK, "deadletter", page{Title: "Dead letter " + strconv.FormatInt(id, 10), Nav: "dead", Data: d})
}

// deadAction replays or purges one dead letter (the "replay" or "purge"
// button of its row) or the selected ones ("action" with the "id" boxes).
func (u *ui) deadAction(w http.ResponseWriter, r *http.Request) {
	form := r.PostForm
	ff, _, _ := readFilter(form)
	var verb string
	var ids []int64
	switch {
	case form.Get("replay") != "":
		verb, ids = "replay", parseIDs([]string{form.Get("replay")})
	case form.Get("purge") != "":
		verb, ids = "purge", parseIDs([]string{form.Get("purge")})
	case form.Get("action") == "replay-selected":
		verb, ids = "replay", parseIDs(form["id"])
	case form.Get("action") == "purge-selected":
		verb, ids = "purge", parseIDs(form["id"])
	default:
		u.fail(w, r, http.StatusBadRequest, "Unknown action.")
		return
	}
	if ids == nil {
		u.fail(w, r, http.StatusBadRequest, "Invalid dead-letter ID.")
		return
	}
	v := ff.values()
	if len(ids) == 0 {
		v.Set("done", "none")
		u.redirect(w, r, "dead?"+v.Encode())
		return
	}
	if len(ids) > MaxPage {
		u.fail(w, r, http.StatusBadRequest, fmt.Sprintf("At most %d dead letters at once; use the actions on all matching.", MaxPage))
		return
	}
	asked := len(ids)
	if t, limited := u.scope(r); limited {
		// Only the scope's tenant's dead letters; others count as skipped,
		// exactly like missing ones.
		mine := ids[:0:0]
		for _, id := range ids {
			det, err := u.q.Get(r.Context(), id)
			if err == nil && det.Tenant == t {
				mine = append(mine, id)
			} else if err != nil && !errors.Is(err, ErrNotFound) {
				u.internal(w, r, err)
				return
			}
		}
		if ids = mine; len(ids) == 0 {
			v.Set("done", "none")
			u.redirect(w, r, "dead?"+v.Encode())
			return
		}
	}
	var n int
	var err error
	if verb == "replay" {
		var got map[int64]int64
		got, err = u.in.Store.ReplayDead(r.Context(), ids, u.in.Clock.Now())
		n = len(got)
		if n > 0 {
			u.in.Wake()
		}
		v.Set("done", "replayed")
	} else {
		n, err = u.in.Store.PurgeDead(r.Context(), store.DeadFilter{IDs: ids}, len(ids))
		v.Set("done", "purged")
	}
	if err != nil {
		u.internal(w, r, err)
		return
	}
	if n > 0 {
		u.audit(r, u.tenantFilter(r), "dlq."+verb, "", map[string]any{"ids": ids, "count": n})
	}
	v.Set("n", strconv.Itoa(n))
	if n < asked {
		v.Set("skipped", strconv.Itoa(asked-n))
	}
	u.redirect(w, r, "dead?"+v.Encode())
}

// deadAll replays or purges every dead letter matching the form's filter,
// once the confirmation box is ticked.
func (u *ui) deadAll(w http.ResponseWriter, r *http.Request) {
	ff, f, err := readFilter(r.PostForm)
	if err != nil {
		u.fail(w, r, http.StatusBadRequest, filterProblem(err))
		return
	}
	ff.Tenant = u.tenantFilter(r)
	f.Tenant = ff.Tenant
	v := ff.values()
	if r.PostForm.Get("confirm") != "yes" {
		v.Set("done", "unconfirmed")
		u.redirect(w, r, "dead?"+v.Encode())
		return
	}
	var n int
	if strings.HasSuffix(r.URL.Path, "/replay-all") {
		n, err = u.q.ReplayAll(actorCtx(r), f) // which writes the audit log entry
		v.Set("done", "replayed")
	} else {
		n, err = u.q.PurgeAll(actorCtx(r), f)
		v.Set("done", "purged")
	}
	if err != nil {
		u.internal(w, r, err)
		return
	}
	u.log.Info("txhook: ui action", "action", strings.TrimPrefix(r.URL.Path, "/dead/"), "filter", ff.values().Encode(), "done", n, "remote", r.RemoteAddr)
	v.Set("n", strconv.Itoa(n))
	u.redirect(w, r, "dead?"+v.Encode())
}

// parseIDs parses delivery IDs; nil when one is not an ID.
func parseIDs(ss []string) []int64 {
	out := make([]int64, 0, len(ss))
	for _, s := range ss {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n <= 0 {
			return nil
		}
		out = append(out, n)
	}
	return out
}

// flash turns the outcome a redirect carries into a message. Only known
// outcomes and numbers are read, so a crafted link cannot put words on
// the page.
func flash(r *http.Request) (string, bool) {
	q := r.URL.Query()
	n, _ := strconv.Atoi(q.Get("n"))
	skipped, _ := strconv.Atoi(q.Get("skipped"))
	switch q.Get("done") {
	case "replayed":
		msg := fmt.Sprintf("Replayed %s: each is queued again as a new delivery with the same event ID.", plural(n, "dead letter"))
		if skipped > 0 {
			msg += fmt.Sprintf(" %s could not be: already replayed or purged, or the endpoint was deleted.", plural(skipped, "dead letter"))
		}
		return msg, false
	case "purged":
		msg := fmt.Sprintf("Purged %s.", plural(n, "dead letter"))
		if skipped > 0 {
			msg += fmt.Sprintf(" %d were already gone.", skipped)
		}
		return msg, false
	case "none":
		return "Nothing selected: tick the dead letters to act on.", true
	case "unconfirmed":
		return "Nothing done: tick the box to confirm an action on every matching dead letter.", true
	case "enabled":
		return "Endpoint enabled: its waiting deliveries are due now.", false
	case "disabled":
		return "Endpoint disabled: its deliveries wait, spending no attempts, until it is enabled.", false
	case "recovered":
		if n == 0 {
			return "Nothing to recover: every event since then reached the endpoint or is queued for it.", false
		}
		return fmt.Sprintf("Recovered %s: each is queued again as a new delivery with the same event ID.", plural(n, "event")), false
	case "rotated":
		return "Secret rotated. Every request is now signed with the new secret, and with the previous one until it expires. Reveal the secrets to hand the new one over.", false
	}
	return "", false
}
