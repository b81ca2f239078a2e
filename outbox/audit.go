package outbox

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/txhook/txhook/internal/store"
)

// Actor is who makes a change: a merchant's user, an operator, a service.
// Name and Addr are the host's to choose (a user ID or e-mail, the client
// address); they are recorded in the audit log as given, cut to 255 bytes.
type Actor struct {
	Name string
	Addr string
}

type actorKey struct{}

// WithActor returns ctx carrying the actor that TenantView's mutating
// calls (and the operator UI's and package dlq's) record in the audit log.
// Without it the actor is recorded empty.
func WithActor(ctx context.Context, a Actor) context.Context {
	return context.WithValue(ctx, actorKey{}, a)
}

// ActorFrom returns the actor WithActor put in ctx, if any.
func ActorFrom(ctx context.Context) (Actor, bool) {
	a, ok := ctx.Value(actorKey{}).(Actor)
	return a, ok
}

// AuditEntry is one row of the audit log: who did what, to which object of
// which tenant, when and from where. Detail is a small JSON object (an
// endpoint's new URL, a disable reason, the overlap of a rotation); it
// never holds a secret, header value or key.
type AuditEntry struct {
	ID     int64
	At     time.Time
	Tenant string // "" for an operator action on several tenants
	Actor  string
	Addr   string
	// Action is what was done, such as "endpoint.create",
	// "endpoint.rotate_secret", "delivery.resend", "dlq.replay".
	Action string
	// Target is the endpoint ID, delivery ID or other object acted on.
	Target string
	Detail json.RawMessage
}

// AuditFilter selects audit entries; empty fields match all.
type AuditFilter struct {
	// Tenant limits Outbox.AuditLog to one tenant; TenantView.AuditLog
	// ignores it (it reads its own tenant's only).
	Tenant string
	Action string
	// Since and Until bound the entries' time: at or after Since, before
	// Until.
	Since, Until time.Time
	// Cursor is the previous page's Next; "" starts at the newest.
	Cursor string
	// Limit is the page size: default 50, at most MaxAuditPage.
	Limit int
}

// MaxAuditPage is the largest page AuditLog returns.
const MaxAuditPage = 1000

// AuditPage is one page of the audit log, newest first. Next is the cursor
// of the following (older) page, empty on the last.
type AuditPage struct {
	Entries []AuditEntry
	Next    string
}

// AuditLog returns a page of the tenant's audit log, newest first.
func (v *TenantView) AuditLog(ctx context.Context, f AuditFilter) (AuditPage, error) {
	if err := v.check(); err != nil {
		return AuditPage{}, err
	}
	return v.o.auditLog(ctx, store.AuditFilter{Tenant: v.tenant}, f)
}

// AuditLog returns a page of the audit log of every tenant (or of
// f.Tenant when set), newest first: for operators.
func (o *Outbox) AuditLog(ctx context.Context, f AuditFilter) (AuditPage, error) {
	return o.auditLog(ctx, store.AuditFilter{AllTenants: f.Tenant == "", Tenant: f.Tenant}, f)
}

func (o *Outbox) auditLog(ctx context.Context, sf store.AuditFilter, f AuditFilter) (AuditPage, error) {
	if !utf8Valid(sf.Tenant) || !utf8Valid(f.Action) {
		return AuditPage{Entries: []AuditEntry{}}, nil
	}
	sf.Action, sf.Since, sf.Until = f.Action, f.Since, f.Until
	limit := f.Limit
	if limit <= 0 {
		limit = 50
	}
	limit = min(limit, MaxAuditPage)
	var after *store.AuditCursor
	if f.Cursor != "" {
		c, err := decodeAuditCursor(f.Cursor)
		if err != nil {
			return AuditPage{}, err
		}
		after = &c
	}
	rows, err := o.st.ListAudit(ctx, sf, after, limit+1)
	if err != nil {
		return AuditPage{}, fmt.Errorf("txhook: audit log: %w", err)
	}
	var p AuditPage
	if len(rows) > limit {
		rows = rows[:limit]
		last := rows[limit-1]
		p.Next = encodeDeliveryCursor(store.DeliveryCursor{CreatedAt: last.At, ID: last.ID}) // the same shape
	}
	p.Entries = make([]AuditEntry, len(rows))
	for i, r := range rows {
		p.Entries[i] = AuditEntry{ID: r.ID, At: r.At, Tenant: r.Tenant, Actor: r.Actor, Addr: r.Addr, Action: r.Action,
			Target: r.Target, Detail: json.RawMessage(r.Detail)}
	}
	return p, nil
}

func decodeAuditCursor(s string) (store.AuditCursor, error) {
	c, err := decodeDeliveryCursor(s) // the same shape: microseconds "." ID
	return store.AuditCursor{At: c.CreatedAt, ID: c.ID}, err
}

// auditRow is the audit row of an action by ctx's actor on tenant.
func (o *Outbox) auditRow(ctx context.Context, tenant, action, target string, detail map[string]any) store.AuditRow {
	a, _ := ActorFrom(ctx)
	b := []byte("{}")
	if len(detail) > 0 {
		if j, err := json.Marshal(detail); err == nil {
			b = j
		}
	}
	return store.AuditRow{At: o.clock.Now().UTC(), Tenant: tenant, Actor: clean(a.Name), Addr: clean(a.Addr),
		Action: action, Target: target, Detail: b}
}

// clean makes s storable: valid UTF-8 without NUL, at most 255 bytes.
func clean(s string) string {
	s = strings.ToValidUTF8(strings.ReplaceAll(s, "\x00", ""), "\uFFFD")
	return truncateUTF8(s, 255)
}

func (v *TenantView) audit(ctx context.Context, action, target string, detail map[string]any) store.AuditRow {
	return v.o.auditRow(ctx, v.tenant, action, target, detail)
}

// record writes the audit row of an action already committed (by a call
// that runs its own transaction).
func (v *TenantView) record(ctx context.Context, action, target string, detail map[string]any) error {
	return v.o.Record(ctx, v.tenant, action, target, detail)
}

// Record writes one audit log entry for an action by ctx's actor (see
// WithActor) on tenant ("" for an operator action across tenants): for
// hosts and packages (the operator UI, package dlq) that act through
// Outbox methods. detail must hold no secret.
func (o *Outbox) Record(ctx context.Context, tenant, action, target string, detail map[string]any) error {
	if err := o.st.InsertAudit(ctx, o.db, o.auditRow(ctx, clean(tenant), clean(action), clean(target), detail)); err != nil {
		return fmt.Errorf("txhook: audit log: %w", err)
	}
	return nil
}

// withAudit runs fn with the database, or, when audit is not nil, in a
// transaction that also writes audit(id).
func (o *Outbox) withAudit(ctx context.Context, audit func(id string) store.AuditRow, id string, fn func(q store.Querier) error) error {
	if audit == nil {
		return fn(o.db)
	}
	return o.st.Tx(ctx, func(q store.Querier) error {
		if err := fn(q); err != nil {
			return err
		}
		return o.st.InsertAudit(ctx, q, audit(id))
	})
}
