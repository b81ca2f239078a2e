package outbox

import (
	"context"
	"net/http"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/txhook/txhook/internal/store"
)

// Tracing with OpenTelemetry, on when Config.TracerProvider is set.
//
// Enqueue runs in a span of its own, a child of the span in the caller's
// context, and stores that span's W3C trace context (traceparent and
// tracestate) with the event. Each attempt a relay makes is a span that is
// a child of the Enqueue span, whichever process makes it and however much
// later, so the payment's trace shows its webhook's every attempt, replays
// included; the request carries the attempt span's traceparent (and
// tracestate), so the merchant's receiver continues the same trace. A
// child rather than a link: a link would start a new trace per attempt and
// the receiver would not see the payment's trace ID.
//
// With tracing off nothing is stored and no header is sent: Enqueue runs
// the statements it ran before tracing existed, and a relay only checks a
// nil tracer.

// Span names and attributes, as the package documentation lists them.
const (
	spanEnqueue     = "txhook.enqueue"
	spanEnqueueMany = "txhook.enqueue_many"
	spanAttempt     = "txhook.attempt"

	attrTenant     = attribute.Key("txhook.tenant")
	attrEventID    = attribute.Key("txhook.event.id")
	attrEventType  = attribute.Key("txhook.event.type")
	attrDuplicate  = attribute.Key("txhook.event.duplicate")
	attrBatchSize  = attribute.Key("txhook.batch.size")
	attrEndpointID = attribute.Key("txhook.endpoint.id")
	attrDelivery   = attribute.Key("txhook.delivery.id")
	attrAttempt    = attribute.Key("txhook.attempt")
	attrOutcome    = attribute.Key("txhook.attempt.outcome")
	attrHTTPStatus = attribute.Key("http.response.status_code")
)

// tracerName is the instrumentation scope of txhook's spans.
const tracerName = "github.com/txhook/txhook/outbox"

// newTracer returns the tracer of tp, nil when tracing is off.
func newTracer(tp trace.TracerProvider) trace.Tracer {
	if tp == nil {
		return nil
	}
	return tp.Tracer(tracerName)
}

// w3c carries a W3C trace context between the propagator and the two
// columns it is stored in.
type w3c struct{ parent, state string }

const (
	traceparentHeader = "traceparent"
	tracestateHeader  = "tracestate"
)

func (c *w3c) Get(key string) string {
	switch key {
	case traceparentHeader:
		return c.parent
	case tracestateHeader:
		return c.state
	}
	return ""
}

func (c *w3c) Set(key, value string) {
	switch key {
	case traceparentHeader:
		c.parent = value
	case tracestateHeader:
		c.state = value
	}
}

func (c *w3c) Keys() []string { return []string{traceparentHeader, tracestateHeader} }

// enqueueTraced is EnqueueDetail in a span.
func (o *Outbox) enqueueTraced(ctx context.Context, tx store.Conn, ev Event) (Enqueued, error) {
	ctx, span := o.tracer.Start(ctx, spanEnqueue, trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(attrTenant.String(ev.Tenant), attrEventType.String(ev.Type)))
	defer span.End()
	res, err := o.enqueueDetail(ctx, tx, ev)
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		return res, err
	}
	span.SetAttributes(attrEventID.String(res.ID), attrDuplicate.Bool(res.Duplicate))
	return res, nil
}

// enqueueManyTraced is EnqueueMany in one span.
func (o *Outbox) enqueueManyTraced(ctx context.Context, tx store.Conn, evs []Event) ([]Enqueued, error) {
	ctx, span := o.tracer.Start(ctx, spanEnqueueMany, trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(attrBatchSize.Int(len(evs))))
	defer span.End()
	res, err := o.enqueueMany(ctx, tx, evs)
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	return res, err
}

// traceInto stores the trace context of the span in ctx (Enqueue's) in
// row, when tracing is on and the span has a valid context.
func (o *Outbox) traceInto(ctx context.Context, row *store.NewEvent) {
	if o.tracer == nil {
		return
	}
	var c w3c
	propagation.TraceContext{}.Inject(ctx, &c)
	row.TraceParent, row.TraceState = c.parent, c.state
}

// startAttempt opens the span of the attempt j is about to make, when
// tracing is on: a child of the Enqueue span stored with the event, or a
// root span when the event has none.
func (r *Relay) startAttempt(j *job) {
	if r.o.tracer == nil {
		return
	}
	c := &j.c
	ctx := context.Background()
	if c.TraceParent != "" {
		ctx = propagation.TraceContext{}.Extract(ctx, &w3c{parent: c.TraceParent, state: c.TraceState})
	}
	attrs := []attribute.KeyValue{
		attrEventID.String(c.EventID), attrEventType.String(c.Type), attrTenant.String(c.Tenant),
		attrEndpointID.String(c.EndpointID), attrAttempt.Int(c.Attempt),
	}
	if c.ID != 0 {
		// A first attempt claimed with its event has no delivery row, so
		// no ID, until its outcome is written.
		attrs = append(attrs, attrDelivery.Int64(c.ID))
	}
	_, j.span = r.o.tracer.Start(ctx, spanAttempt, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
}

// traceHeaders puts the attempt span's traceparent and tracestate on the
// request.
func (r *Relay) traceHeaders(j *job, h http.Header) {
	if j.span == nil {
		return
	}
	propagation.TraceContext{}.Inject(trace.ContextWithSpan(context.Background(), j.span), propagation.HeaderCarrier(h))
}

// endAttempt closes j's attempt span with the attempt's outcome.
func (r *Relay) endAttempt(j *job, out *outcome) {
	if j.span == nil {
		return
	}
	span := j.span
	j.span = nil
	outcome := OutcomeRetry
	switch out.State {
	case store.StateSucceeded:
		outcome = OutcomeSucceeded
	case store.StateDead:
		outcome = OutcomeDeadLettered
	}
	span.SetAttributes(attrOutcome.String(outcome))
	if out.Status != 0 {
		span.SetAttributes(attrHTTPStatus.Int(out.Status))
	}
	if outcome != OutcomeSucceeded {
		span.SetStatus(codes.Error, out.Error)
	}
	span.End()
}
