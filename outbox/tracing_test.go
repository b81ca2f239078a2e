package outbox_test

import (
	"context"
	"database/sql"
	"net/http"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/internal/testlisten"
	"github.com/txhook/txhook/outbox"
	"github.com/txhook/txhook/retry"
)

// tracer is an SDK TracerProvider whose ended spans a test can read.
type tracer struct {
	*sdktrace.TracerProvider
	rec *tracetest.SpanRecorder
}

func newTracer(t *testing.T) tracer {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	return tracer{tp, rec}
}

// spans returns the ended spans named name.
func (tr tracer) spans(name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range tr.rec.Ended() {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

// paymentContext returns a context whose active span is a payment
// handler's, continuing a remote trace that carries a tracestate.
func paymentContext(t *testing.T, ctx context.Context, tp trace.TracerProvider) (context.Context, trace.Span) {
	t.Helper()
	ts, err := trace.ParseTraceState("vendor=abc")
	if err != nil {
		t.Fatal(err)
	}
	remote := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    trace.TraceID{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36},
		SpanID:     trace.SpanID{0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7},
		TraceFlags: trace.FlagsSampled, TraceState: ts, Remote: true,
	})
	return tp.Tracer("payments").Start(trace.ContextWithRemoteSpanContext(ctx, remote), "capture payment")
}

// enqueueIn enqueues ev in its own committed transaction under ctx.
func enqueueIn(t *testing.T, ctx context.Context, db *sql.DB, ob *outbox.Outbox, ev outbox.Event) (outbox.Enqueued, error) {
	t.Helper()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := ob.EnqueueDetail(ctx, tx, ev)
	if err != nil {
		tx.Rollback()
		return res, err
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	return res, nil
}

// The receiver sees the trace ID of the span active at Enqueue, and its
// tracestate, although the relay runs on another pool (another process,
// as far as it can tell) with a TracerProvider of its own: the enqueue's
// trace context travels with the event through the database.
func TestTraceReachesReceiver(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		app, relayHost := newTracer(t), newTracer(t)
		b := setup(t, db, outbox.Config{TracerProvider: app})
		rc := newReceiver(t, nil)
		ep := b.endpoint("m", rc.URL)

		ctx, payment := paymentContext(t, b.ctx, app)
		res, err := enqueueIn(t, ctx, db.DB, b.ob, outbox.Event{Tenant: "m", Type: "payment.succeeded", Payload: []byte(`{"n":1}`)})
		payment.End()
		if err != nil {
			t.Fatal(err)
		}

		// The enqueue span: a child of the payment's, its context stored.
		enq := app.spans("txhook.enqueue")
		if len(enq) != 1 {
			t.Fatalf("enqueue spans: %d", len(enq))
		}
		es := enq[0]
		if es.Parent().SpanID() != payment.SpanContext().SpanID() || es.SpanContext().TraceID() != payment.SpanContext().TraceID() {
			t.Fatalf("enqueue span's parent %v, want the payment span %v", es.Parent(), payment.SpanContext())
		}
		if es.SpanKind() != trace.SpanKindProducer {
			t.Errorf("enqueue span kind %v", es.SpanKind())
		}
		a := attrs(es)
		if a["txhook.event.id"].AsString() != res.ID || a["txhook.event.type"].AsString() != "payment.succeeded" ||
			a["txhook.tenant"].AsString() != "m" || a["txhook.event.duplicate"].AsBool() {
			t.Errorf("enqueue span attributes: %v", es.Attributes())
		}
		var parent, state sql.NullString
		if err := db.QueryRowContext(b.ctx, b.rebind("SELECT trace_parent, trace_state FROM txhook_events WHERE id = ?"), res.ID).Scan(&parent, &state); err != nil {
			t.Fatal(err)
		}
		want := "00-" + es.SpanContext().TraceID().String() + "-" + es.SpanContext().SpanID().String() + "-01"
		if parent.String != want || state.String != "vendor=abc" {
			t.Fatalf("stored trace context %q %q, want %q vendor=abc", parent.String, state.String, want)
		}

		other, err := outbox.New(b.ctx, testdb.Reopen(t, db), outbox.Config{TracerProvider: relayHost,
			AllowHTTP: true, AllowPrivateTargets: true, Logger: quietLogger(), Listener: testlisten.For(db.Backend.Driver, db.DSN)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { other.Close() })
		relay, err := other.NewRelay(outbox.RelayConfig{})
		if err != nil {
			t.Fatal(err)
		}
		if err := relay.Start(b.ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { relay.Stop(context.Background()) })

		var got received
		select {
		case got = <-rc.got:
		case <-time.After(waitFor):
			t.Fatal("no delivery")
		}
		rctx := propagation.TraceContext{}.Extract(context.Background(), propagation.HeaderCarrier(got.Header))
		seen := trace.SpanContextFromContext(rctx)
		if !seen.IsValid() || seen.TraceID() != payment.SpanContext().TraceID() {
			t.Fatalf("receiver saw traceparent %q, want trace ID %s", got.Header.Get("Traceparent"), payment.SpanContext().TraceID())
		}
		if got.Header.Get("Tracestate") != "vendor=abc" {
			t.Errorf("receiver saw tracestate %q", got.Header.Get("Tracestate"))
		}

		// The attempt span, on the relay's provider: a child of the enqueue
		// span, the parent of what the receiver continues.
		var att []sdktrace.ReadOnlySpan
		b.eventually("attempt span ended", func() bool { att = relayHost.spans("txhook.attempt"); return len(att) == 1 })
		as := att[0]
		if as.Parent().SpanID() != es.SpanContext().SpanID() || as.SpanContext().TraceID() != es.SpanContext().TraceID() || !as.Parent().IsRemote() {
			t.Errorf("attempt span's parent %v, want the enqueue span %v", as.Parent(), es.SpanContext())
		}
		if seen.SpanID() != as.SpanContext().SpanID() {
			t.Errorf("receiver's parent span %s, want the attempt span %s", seen.SpanID(), as.SpanContext().SpanID())
		}
		if as.SpanKind() != trace.SpanKindClient || as.Status().Code == codes.Error {
			t.Errorf("attempt span kind %v status %v", as.SpanKind(), as.Status())
		}
		a = attrs(as)
		if a["txhook.endpoint.id"].AsString() != ep.ID || a["txhook.event.type"].AsString() != "payment.succeeded" ||
			a["txhook.event.id"].AsString() != res.ID || a["txhook.attempt"].AsInt64() != 1 ||
			a["http.response.status_code"].AsInt64() != 200 || a["txhook.attempt.outcome"].AsString() != outbox.OutcomeSucceeded {
			t.Errorf("attempt span attributes: %v", as.Attributes())
		}
		if len(app.spans("txhook.attempt")) != 0 {
			t.Error("the enqueuing outbox's provider recorded an attempt: the relay must trace with its own")
		}
	})
}

// Every attempt is a span with its number, status and outcome, each a
// child of the enqueue span; failures set the span's status.
func TestTraceAttemptsUntilDeadLetter(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		tr := newTracer(t)
		b := setup(t, db, outbox.Config{TracerProvider: tr})
		rc := newReceiver(t, func(int, *http.Request) int { return http.StatusServiceUnavailable })
		ep := b.endpoint("m", rc.URL)
		b.relay(outbox.RelayConfig{Retry: retry.Schedule{Offsets: []time.Duration{0, time.Millisecond}}})
		res, err := enqueueIn(t, b.ctx, db.DB, b.ob, outbox.Event{Tenant: "m", Type: "payment.failed", Payload: []byte(`{}`)})
		if err != nil {
			t.Fatal(err)
		}
		var att []sdktrace.ReadOnlySpan
		b.eventually("two attempt spans", func() bool { att = tr.spans("txhook.attempt"); return len(att) == 2 })
		enq := tr.spans("txhook.enqueue")
		if len(enq) != 1 || enq[0].Parent().IsValid() {
			t.Fatalf("want one enqueue span, a root (no span was active): %v", enq)
		}
		for i, s := range att {
			a := attrs(s)
			wantOutcome := outbox.OutcomeRetry
			if i == 1 {
				wantOutcome = outbox.OutcomeDeadLettered
			}
			if s.Parent().SpanID() != enq[0].SpanContext().SpanID() || a["txhook.attempt"].AsInt64() != int64(i+1) ||
				a["http.response.status_code"].AsInt64() != 503 || a["txhook.attempt.outcome"].AsString() != wantOutcome ||
				a["txhook.endpoint.id"].AsString() != ep.ID || a["txhook.event.id"].AsString() != res.ID {
				t.Errorf("attempt %d: parent %v attributes %v", i+1, s.Parent(), s.Attributes())
			}
			if s.Status().Code != codes.Error {
				t.Errorf("attempt %d: status %v", i+1, s.Status())
			}
		}
	})
}

// A refused event's enqueue span records the error; a duplicate says so
// and keeps the first enqueue's trace context.
func TestTraceEnqueueErrorsAndDuplicates(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		tr := newTracer(t)
		b := setup(t, db, outbox.Config{TracerProvider: tr})
		if _, err := enqueueIn(t, b.ctx, db.DB, b.ob, outbox.Event{Tenant: "m", Type: "payment.succeeded", Payload: []byte(`{`)}); err == nil {
			t.Fatal("invalid payload accepted")
		}
		ev := outbox.Event{Tenant: "m", Type: "payment.succeeded", IdempotencyKey: "k", Payload: []byte(`{}`)}
		first, err := enqueueIn(t, b.ctx, db.DB, b.ob, ev)
		if err != nil {
			t.Fatal(err)
		}
		again, err := enqueueIn(t, b.ctx, db.DB, b.ob, ev)
		if err != nil || !again.Duplicate {
			t.Fatalf("duplicate: %+v %v", again, err)
		}
		enq := tr.spans("txhook.enqueue")
		if len(enq) != 3 {
			t.Fatalf("enqueue spans: %d", len(enq))
		}
		if enq[0].Status().Code != codes.Error || len(enq[0].Events()) == 0 {
			t.Errorf("refused enqueue: status %v events %v", enq[0].Status(), enq[0].Events())
		}
		if !attrs(enq[2])["txhook.event.duplicate"].AsBool() || attrs(enq[2])["txhook.event.id"].AsString() != first.ID {
			t.Errorf("duplicate's span attributes: %v", enq[2].Attributes())
		}
		var parent string
		if err := db.QueryRowContext(b.ctx, b.rebind("SELECT trace_parent FROM txhook_events WHERE id = ?"), first.ID).Scan(&parent); err != nil {
			t.Fatal(err)
		}
		if want := enq[1].SpanContext().SpanID().String(); parent[36:52] != want {
			t.Errorf("stored traceparent %q, want the first enqueue's span %s", parent, want)
		}
	})
}

// Without a TracerProvider nothing is stored and no trace header is sent,
// even when the caller's context has an active span.
func TestTracingOff(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		tr := newTracer(t)
		b := setup(t, db, outbox.Config{})
		rc := newReceiver(t, nil)
		b.endpoint("m", rc.URL)
		b.relay(outbox.RelayConfig{})
		ctx, span := paymentContext(t, b.ctx, tr)
		defer span.End()
		if _, err := enqueueIn(t, ctx, db.DB, b.ob, outbox.Event{Tenant: "m", Type: "payment.succeeded", Payload: []byte(`{}`)}); err != nil {
			t.Fatal(err)
		}
		select {
		case got := <-rc.got:
			for _, h := range []string{"Traceparent", "Tracestate"} {
				if v, ok := got.Header[h]; ok {
					t.Errorf("%s sent with tracing off: %q", h, v)
				}
			}
		case <-time.After(waitFor):
			t.Fatal("no delivery")
		}
		if n := b.count("SELECT count(*) FROM txhook_events WHERE trace_parent IS NOT NULL OR trace_state IS NOT NULL"); n != 0 {
			t.Errorf("%d events stored a trace context with tracing off", n)
		}
		if n := len(tr.rec.Ended()); n != 0 {
			t.Errorf("%d spans recorded with tracing off", n)
		}
	})
}

// EnqueueMany is one span whose context every event of the batch stores,
// and an event with a DeliverAt (which takes the batch path) is traced as
// Enqueue is: its attempts continue the caller's trace.
func TestTraceEnqueueManyAndDelayed(t *testing.T) {
	testdb.Each(t, func(t *testing.T, db *testdb.DB) {
		tr := newTracer(t)
		b := setup(t, db, outbox.Config{TracerProvider: tr})
		rc := newReceiver(t, nil)
		b.endpoint("m", rc.URL)
		ctx, payment := paymentContext(t, b.ctx, tr)
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		many, err := b.ob.EnqueueMany(ctx, tx, []outbox.Event{
			{Tenant: "m", Type: "payment.succeeded", Payload: []byte(`{"n":1}`)},
			{Tenant: "m", Type: "payment.succeeded", Payload: []byte(`{"n":2}`)},
		})
		if err != nil {
			t.Fatal(err)
		}
		delayed, err := b.ob.EnqueueDetail(ctx, tx, outbox.Event{Tenant: "m", Type: "payment.succeeded",
			Payload: []byte(`{"n":3}`), DeliverAt: time.Now().Add(50 * time.Millisecond)})
		if err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		payment.End()

		batch := tr.spans("txhook.enqueue_many")
		one := tr.spans("txhook.enqueue")
		if len(batch) != 1 || len(one) != 1 {
			t.Fatalf("spans: %d enqueue_many, %d enqueue; want 1 and 1 (the delayed event's batch path opens no second span)", len(batch), len(one))
		}
		if attrs(batch[0])["txhook.batch.size"].AsInt64() != 2 || batch[0].Parent().SpanID() != payment.SpanContext().SpanID() {
			t.Errorf("enqueue_many span: parent %v attributes %v", batch[0].Parent(), batch[0].Attributes())
		}
		want := map[string]trace.SpanID{many[0].ID: batch[0].SpanContext().SpanID(), many[1].ID: batch[0].SpanContext().SpanID(),
			delayed.ID: one[0].SpanContext().SpanID()}
		for id, span := range want {
			var parent sql.NullString
			if err := db.QueryRowContext(b.ctx, b.rebind("SELECT trace_parent FROM txhook_events WHERE id = ?"), id).Scan(&parent); err != nil {
				t.Fatal(err)
			}
			if len(parent.String) != 55 || parent.String[36:52] != span.String() {
				t.Errorf("event %s stored traceparent %q, want span %s", id, parent.String, span)
			}
		}

		b.relay(outbox.RelayConfig{})
		for range 3 {
			var got received
			select {
			case got = <-rc.got:
			case <-time.After(waitFor):
				t.Fatal("not every event was delivered")
			}
			seen := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), propagation.HeaderCarrier(got.Header)))
			if seen.TraceID() != payment.SpanContext().TraceID() {
				t.Errorf("receiver saw traceparent %q, want trace ID %s", got.Header.Get("Traceparent"), payment.SpanContext().TraceID())
			}
		}
	})
}
