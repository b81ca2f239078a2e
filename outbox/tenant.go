package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/txhook/txhook/internal/store"
)

// Tenant-scoped errors. Each is returned wrapped; test with errors.Is.
var (
	// ErrNoTenant: a TenantView was made with an empty tenant, or one no
	// endpoint or event can have (more than 255 bytes, not printable).
	ErrNoTenant = errors.New("txhook: tenant view without a valid tenant")
	// ErrDeliveryNotFound: no delivery of the tenant has that ID.
	ErrDeliveryNotFound = errors.New("txhook: delivery not found")
	// ErrEventNotFound: no event of the tenant has that ID.
	ErrEventNotFound = errors.New("txhook: event not found")
	// ErrDeliveryActive: Resend was asked for a delivery that is not
	// finished (pending, running, paused or blocked): it will be attempted
	// anyway, and a second delivery would send the event twice.
	ErrDeliveryActive = errors.New("txhook: delivery not finished yet")
	// ErrInvalidFilter: a filter or range argument is out of bounds (the
	// message says which).
	ErrInvalidFilter = errors.New("txhook: invalid filter")
)

// TenantView is one tenant's view of the outbox: what a merchant portal
// (package outbox/portal) or a host's own merchant API may do. Every query
// names the tenant in SQL, so another tenant's endpoint, delivery or event
// ID behaves exactly like a missing one: the same not-found error, nothing
// read, nothing changed. Mutating calls write an audit row (see WithActor
// and AuditLog). It is safe for concurrent use.
type TenantView struct {
	o      *Outbox
	tenant string
}

// Tenant returns the view of one tenant. It checks nothing until used: a
// view of an empty tenant (or one no endpoint can have) fails every call
// with ErrNoTenant.
func (o *Outbox) Tenant(tenant string) *TenantView { return &TenantView{o: o, tenant: tenant} }

// Name returns the tenant the view is scoped to.
func (v *TenantView) Name() string { return v.tenant }

func (v *TenantView) check() error {
	if v.tenant == "" || len(v.tenant) > 255 || !printable(v.tenant) {
		return ErrNoTenant
	}
	return nil
}

// Endpoints returns the tenant's endpoints, ordered by ID, with their
// secrets and headers (decrypted).
func (v *TenantView) Endpoints(ctx context.Context) ([]Endpoint, error) {
	if err := v.check(); err != nil {
		return nil, err
	}
	return v.o.Endpoints(ctx, v.tenant)
}

// endpointRow returns the tenant's endpoint id; ErrEndpointNotFound when
// it does not exist or is another tenant's.
func (v *TenantView) endpointRow(ctx context.Context, id string) (store.EndpointRow, error) {
	if err := v.check(); err != nil {
		return store.EndpointRow{}, err
	}
	if err := checkEndpointID(id); err != nil {
		return store.EndpointRow{}, err
	}
	row, err := v.o.st.TenantEndpoint(ctx, v.o.db, v.tenant, id)
	return row, v.o.endpointErr(id, err)
}

// Endpoint returns one of the tenant's endpoints; ErrEndpointNotFound for
// another tenant's.
func (v *TenantView) Endpoint(ctx context.Context, id string) (Endpoint, error) {
	row, err := v.endpointRow(ctx, id)
	if err != nil {
		return Endpoint{}, err
	}
	return v.o.endpointOut(ctx, row)
}

// CreateEndpoint creates an endpoint of the tenant, as
// Outbox.CreateEndpoint does. ne.Tenant may be empty (the view's tenant is
// used); any other tenant is refused with ErrInvalidEndpoint.
func (v *TenantView) CreateEndpoint(ctx context.Context, ne NewEndpoint) (Endpoint, error) {
	if err := v.check(); err != nil {
		return Endpoint{}, err
	}
	if ne.Tenant != "" && ne.Tenant != v.tenant {
		return Endpoint{}, fmt.Errorf("%w: tenant differs from the view's", ErrInvalidEndpoint)
	}
	ne.Tenant = v.tenant
	detail := map[string]any{"url": ne.URL}
	if len(ne.EventTypes) > 0 {
		detail["event_types"] = ne.EventTypes
	}
	return v.o.createEndpoint(ctx, ne, func(id string) store.AuditRow {
		return v.audit(ctx, "endpoint.create", id, detail)
	})
}

// UpdateEndpoint changes one of the tenant's endpoints, as
// Outbox.UpdateEndpoint does; ErrEndpointNotFound for another tenant's.
func (v *TenantView) UpdateEndpoint(ctx context.Context, id string, up EndpointUpdate) (Endpoint, error) {
	row, err := v.endpointRow(ctx, id)
	if err != nil {
		return Endpoint{}, err
	}
	return v.o.updateEndpoint(ctx, row, up, func(id string) store.AuditRow {
		return v.audit(ctx, "endpoint.update", id, updateDetail(up))
	})
}

// updateDetail names the fields an update changes, with the new URL and
// event types; header values and client keys are left out.
func updateDetail(up EndpointUpdate) map[string]any {
	d := map[string]any{}
	var fields []string
	if up.URL != nil {
		fields, d["url"] = append(fields, "url"), *up.URL
	}
	if up.Description != nil {
		fields = append(fields, "description")
	}
	if up.EventTypes != nil {
		fields, d["event_types"] = append(fields, "event_types"), *up.EventTypes
	}
	if up.Limits != nil {
		fields = append(fields, "limits")
	}
	if up.Versions != nil {
		fields = append(fields, "versions")
	}
	if up.Headers != nil {
		fields = append(fields, "headers")
	}
	if up.ClientCert != nil {
		fields = append(fields, "client_cert")
	}
	d["fields"] = fields
	return d
}

// DeleteEndpoint deletes one of the tenant's endpoints, as
// Outbox.DeleteEndpoint does; ErrEndpointNotFound for another tenant's.
func (v *TenantView) DeleteEndpoint(ctx context.Context, id string) error {
	if _, err := v.endpointRow(ctx, id); err != nil {
		return err
	}
	return v.inTx(ctx, "endpoint.delete", id, nil, func(ctx context.Context) error { return v.o.DeleteEndpoint(ctx, id) })
}

// EnableEndpoint enables one of the tenant's endpoints, as
// Outbox.EnableEndpoint does; ErrEndpointNotFound for another tenant's.
func (v *TenantView) EnableEndpoint(ctx context.Context, id string) error {
	if _, err := v.endpointRow(ctx, id); err != nil {
		return err
	}
	return v.inTx(ctx, "endpoint.enable", id, nil, func(ctx context.Context) error { return v.o.EnableEndpoint(ctx, id) })
}

// DisableEndpoint disables one of the tenant's endpoints, as
// Outbox.DisableEndpoint does; ErrEndpointNotFound for another tenant's.
func (v *TenantView) DisableEndpoint(ctx context.Context, id, reason string) error {
	if _, err := v.endpointRow(ctx, id); err != nil {
		return err
	}
	return v.inTx(ctx, "endpoint.disable", id, map[string]any{"reason": truncateUTF8(reason, 1024)},
		func(ctx context.Context) error { return v.o.DisableEndpoint(ctx, id, reason) })
}

// RotateSecret rotates the signing secret of one of the tenant's
// endpoints, as Outbox.RotateSecret does; ErrEndpointNotFound for another
// tenant's. The audit row records the overlap, never a secret.
func (v *TenantView) RotateSecret(ctx context.Context, id string, r Rotation) (Endpoint, error) {
	if _, err := v.endpointRow(ctx, id); err != nil {
		return Endpoint{}, err
	}
	overlap := r.Overlap
	if overlap == 0 {
		overlap = DefaultRotationOverlap
	}
	var e Endpoint
	err := v.inTx(ctx, "endpoint.rotate_secret", id, map[string]any{"overlap": max(overlap, 0).String(), "supplied": r.Secret != ""},
		func(ctx context.Context) (err error) {
			e, err = v.o.RotateSecret(ctx, id, r)
			return err
		})
	return e, err
}

// inTx runs the change fn with ctx carrying its audit row, which the
// change's transaction writes; a change made of no single transaction has
// it written right after.
func (v *TenantView) inTx(ctx context.Context, action, target string, detail map[string]any, fn func(ctx context.Context) error) error {
	actx, written := store.WithAudit(ctx, v.audit(ctx, action, target, detail))
	if err := fn(actx); err != nil {
		return err
	}
	if !written() {
		return v.record(ctx, action, target, detail)
	}
	return nil
}

// Health returns the health of one of the tenant's endpoints, as
// Outbox.EndpointHealth does; ErrEndpointNotFound for another tenant's.
func (v *TenantView) Health(ctx context.Context, endpointID string, window time.Duration) (Health, error) {
	row, err := v.endpointRow(ctx, endpointID)
	if err != nil {
		return Health{}, err
	}
	return v.o.health(ctx, row, window)
}

// Recover queues again to one of the tenant's endpoints the events since a
// time it has not received, as Outbox.Recover does; ErrEndpointNotFound
// for another tenant's.
func (v *TenantView) Recover(ctx context.Context, endpointID string, since time.Time) (int, error) {
	if _, err := v.endpointRow(ctx, endpointID); err != nil {
		return 0, err
	}
	n, err := v.o.Recover(ctx, endpointID, since)
	if n > 0 || err == nil {
		if aerr := v.record(ctx, "endpoint.recover", endpointID, map[string]any{"since": since.UTC(), "queued": n}); err == nil {
			err = aerr
		}
	}
	return n, err
}

// Delivery returns one of the tenant's deliveries; ErrDeliveryNotFound for
// another tenant's.
func (v *TenantView) Delivery(ctx context.Context, id int64) (Delivery, error) {
	if err := v.check(); err != nil {
		return Delivery{}, err
	}
	r, err := v.o.st.TenantDelivery(ctx, v.tenant, id)
	if store.IsNotFound(err) {
		return Delivery{}, fmt.Errorf("%w: %d", ErrDeliveryNotFound, id)
	}
	if err != nil {
		return Delivery{}, fmt.Errorf("txhook: delivery: %w", err)
	}
	return deliveryOf(r), nil
}

// EventRecord is a stored event, as Enqueue wrote it.
type EventRecord struct {
	ID          string
	Tenant      string
	Type        string
	Version     int
	Payload     json.RawMessage
	OrderingKey string
	CreatedAt   time.Time
	// DeliverAt is the event's delay (Event.DeliverAt); zero for none.
	DeliverAt time.Time
	// DispatchedAt is when a relay created its deliveries; zero before.
	DispatchedAt time.Time
	// Test is true for an event SendTest made.
	Test bool
}

// Event returns one of the tenant's events; ErrEventNotFound for another
// tenant's. Events are kept while a delivery or dead letter refers to
// them (see Retention).
func (v *TenantView) Event(ctx context.Context, id string) (EventRecord, error) {
	if err := v.check(); err != nil {
		return EventRecord{}, err
	}
	if !utf8Valid(id) {
		return EventRecord{}, fmt.Errorf("%w: %.64q", ErrEventNotFound, id)
	}
	e, err := v.o.st.TenantEvent(ctx, v.tenant, id)
	if store.IsNotFound(err) {
		return EventRecord{}, fmt.Errorf("%w: %.64q", ErrEventNotFound, id)
	}
	if err != nil {
		return EventRecord{}, fmt.Errorf("txhook: event: %w", err)
	}
	return EventRecord{ID: e.ID, Tenant: e.Tenant, Type: e.Type, Version: e.Version, Payload: e.Payload,
		OrderingKey: e.OrderingKey, CreatedAt: e.CreatedAt, DeliverAt: e.DeliverAt, DispatchedAt: e.DispatchedAt,
		Test: strings.HasPrefix(e.ID, TestEventPrefix)}, nil
}

// DeliveryFilter selects a tenant's deliveries in TenantView.Deliveries;
// empty fields match every delivery.
type DeliveryFilter struct {
	EndpointID string
	EventID    string
	EventType  string
	// State is one of the State constants.
	State string
	// Since and Until bound the deliveries' creation time: at or after
	// Since, before Until.
	Since, Until time.Time
	// Cursor is the previous page's Next; "" starts at the newest.
	Cursor string
	// Limit is the page size: default 50, at most MaxDeliveryPage.
	Limit int
}

var deliveryStates = map[string]bool{StatePending: true, StateRunning: true, StateSucceeded: true, StateDead: true, StatePaused: true, StateBlocked: true}

// Deliveries returns a page of the tenant's deliveries matching f, newest
// first, keyed on creation time and ID like EndpointDeliveries. An unknown
// state is ErrInvalidFilter, a cursor this package did not make
// ErrInvalidCursor; another tenant's endpoint or event ID matches nothing.
func (v *TenantView) Deliveries(ctx context.Context, f DeliveryFilter) (DeliveryPage, error) {
	if err := v.check(); err != nil {
		return DeliveryPage{}, err
	}
	if f.State != "" && !deliveryStates[f.State] {
		return DeliveryPage{}, fmt.Errorf("%w: unknown state %.32q", ErrInvalidFilter, f.State)
	}
	if !f.Since.IsZero() && !f.Until.IsZero() && !f.Since.Before(f.Until) {
		return DeliveryPage{}, fmt.Errorf("%w: since must be before until", ErrInvalidFilter)
	}
	limit := f.Limit
	if limit <= 0 {
		limit = 50
	}
	limit = min(limit, MaxDeliveryPage)
	var after *store.DeliveryCursor
	if f.Cursor != "" {
		c, err := decodeDeliveryCursor(f.Cursor)
		if err != nil {
			return DeliveryPage{}, err
		}
		after = &c
	}
	if !utf8Valid(f.EndpointID) || !utf8Valid(f.EventID) || !utf8Valid(f.EventType) {
		return DeliveryPage{Deliveries: []Delivery{}}, nil // nothing can match, and PostgreSQL would refuse the query
	}
	rows, err := v.o.st.TenantDeliveries(ctx, v.tenant, store.DeliveryFilter{EndpointID: f.EndpointID, EventID: f.EventID,
		EventType: f.EventType, State: f.State, Since: f.Since, Until: f.Until}, after, limit+1)
	if err != nil {
		return DeliveryPage{}, fmt.Errorf("txhook: deliveries: %w", err)
	}
	return deliveryPage(rows, limit), nil
}

// deliveryPage turns up to limit+1 rows into a page with its Next cursor.
func deliveryPage(rows []store.DeliveryRow, limit int) DeliveryPage {
	var p DeliveryPage
	if len(rows) > limit {
		rows = rows[:limit]
		last := rows[limit-1]
		p.Next = encodeDeliveryCursor(store.DeliveryCursor{CreatedAt: last.CreatedAt, ID: last.ID})
	}
	p.Deliveries = make([]Delivery, len(rows))
	for i, r := range rows {
		p.Deliveries[i] = deliveryOf(r)
	}
	return p
}

// Resend queues a new delivery of a finished delivery's event to the same
// endpoint, due now, and returns it: a succeeded delivery is sent again
// (with the same event ID, so receivers that deduplicate stay safe), a dead
// one is replayed (its dead letter removed, as dlq replay does). A delivery
// not finished yet is ErrDeliveryActive: it will be attempted anyway. An
// event with an ordering key waits, blocked, behind an unfinished delivery
// of its key to the endpoint; on a disabled endpoint the new delivery
// waits, paused. ErrDeliveryNotFound for another tenant's delivery, or one
// whose endpoint was deleted.
func (v *TenantView) Resend(ctx context.Context, deliveryID int64) (Delivery, error) {
	if err := v.check(); err != nil {
		return Delivery{}, err
	}
	a := v.audit(ctx, "delivery.resend", fmt.Sprint(deliveryID), nil)
	nid, err := v.o.st.Resend(ctx, v.tenant, deliveryID, v.o.clock.Now().UTC(), &a)
	switch {
	case store.IsNotFound(err):
		return Delivery{}, fmt.Errorf("%w: %d", ErrDeliveryNotFound, deliveryID)
	case errors.Is(err, store.ErrActive):
		return Delivery{}, fmt.Errorf("%w: %d", ErrDeliveryActive, deliveryID)
	case err != nil:
		return Delivery{}, fmt.Errorf("txhook: resend: %w", err)
	}
	v.o.wake(ctx)
	return v.Delivery(ctx, nid)
}

// TestEventPrefix starts the ID of every event SendTest makes; Enqueue
// refuses IDs that start with it. Relays send such events with the header
// HeaderTest.
const TestEventPrefix = "txtest_"

// HeaderTest is set to "true" on requests carrying a test event (see
// TenantView.SendTest); receivers can skip their business logic for it.
const HeaderTest = "Webhook-Test"

// SendTest sends a test event of type eventType to one of the tenant's
// endpoints, and to no other: an event with an ID starting with
// TestEventPrefix, whose requests carry "Webhook-Test: true" besides the
// usual headers (Webhook-Event-Type is eventType), queued due now. Its
// payload is the latest version's example in Config.Catalog, or {} when
// the type has none or no catalog is set. With a catalog, a type it does
// not list is ErrUnknownEventType. It returns the delivery; follow it with
// Delivery and Attempts. ErrEndpointNotFound for another tenant's endpoint.
func (v *TenantView) SendTest(ctx context.Context, endpointID, eventType string) (Delivery, error) {
	if err := v.check(); err != nil {
		return Delivery{}, err
	}
	if err := checkEndpointID(endpointID); err != nil {
		return Delivery{}, err
	}
	if !typePattern.MatchString(eventType) {
		return Delivery{}, fmt.Errorf("%w: bad type", ErrInvalidEvent)
	}
	version, payload := 1, json.RawMessage(`{}`)
	if c := v.o.cfg.Catalog; c != nil {
		latest, ok := c.Latest(eventType)
		if !ok {
			return Delivery{}, fmt.Errorf("%w: %s", ErrUnknownEventType, eventType)
		}
		version = latest
		if ex := c.example(eventType, latest); len(ex) > 0 {
			payload = ex
		}
	}
	if err := checkPayload(payload); err != nil {
		return Delivery{}, err
	}
	now := v.o.clock.Now().UTC()
	id := TestEventPrefix + ulid.MustNew(ulid.Timestamp(now), ulid.DefaultEntropy()).String()
	a := v.audit(ctx, "endpoint.send_test", endpointID, map[string]any{"event_type": eventType, "event_id": id})
	nid, err := v.o.st.InsertTargeted(ctx, store.NewEvent{ID: id, Tenant: v.tenant, Type: eventType, Payload: string(payload),
		Version: version, CreatedAt: now}, endpointID, &a)
	if store.IsNotFound(err) {
		return Delivery{}, fmt.Errorf("%w: %.64q", ErrEndpointNotFound, endpointID)
	}
	if err != nil {
		return Delivery{}, fmt.Errorf("txhook: send test event: %w", err)
	}
	v.o.wake(ctx)
	return v.Delivery(ctx, nid)
}
