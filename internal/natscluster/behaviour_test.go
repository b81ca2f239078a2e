package natscluster_test

// What JetStream (nats-server v2.15.3, nats.go v1.56.0) does in the cases
// txhook's broker mode relies on, asserted on the embedded single node
// (internal/natstest) and on the three-node cluster of server processes
// where the answer could differ. Each test documents one behaviour for the
// broker's authors and fails if a server or client upgrade changes it.
// Timings (schedule lateness, failover, redelivery) are logged with -v;
// bounds on them are generous, for a loaded machine.

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/txhook/txhook/internal/natscluster"
	"github.com/txhook/txhook/internal/natstest"
)

// broker is a JetStream under test: the embedded single node or the
// three-node cluster.
type broker struct {
	replicas int
	nc       *nats.Conn
	js       jetstream.JetStream
	server   *natstest.Server     // embedded; nil on the cluster
	cluster  *natscluster.Cluster // cluster; nil on the embedded server
}

func embedded(t *testing.T) *broker {
	s := natstest.Start(t, natstest.Options{})
	nc, js := s.JetStream(t)
	return &broker{replicas: 1, nc: nc, js: js, server: s}
}

func cluster(t *testing.T) *broker {
	c := natscluster.ForTest(t, natscluster.Options{})
	nc, js := c.JetStream(t)
	return &broker{replicas: 3, nc: nc, js: js, cluster: c}
}

// onBoth runs f on the embedded server and on the cluster.
func onBoth(t *testing.T, f func(t *testing.T, b *broker)) {
	t.Run("embedded", func(t *testing.T) { f(t, embedded(t)) })
	t.Run("cluster", func(t *testing.T) { f(t, cluster(t)) })
}

// createStream creates cfg with the broker's replica count and waits (on
// the cluster) for its leader and current replicas.
func (b *broker) createStream(t *testing.T, ctx context.Context, cfg jetstream.StreamConfig) jetstream.Stream {
	t.Helper()
	cfg.Replicas = b.replicas
	st, err := b.js.CreateStream(ctx, cfg)
	if err != nil {
		t.Fatalf("create stream %s: %v", cfg.Name, err)
	}
	if b.cluster != nil {
		if _, err := b.cluster.WaitStream(ctx, cfg.Name); err != nil {
			t.Fatal(err)
		}
	}
	return st
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// publish publishes and fails the test on error.
func publish(t *testing.T, ctx context.Context, js jetstream.JetStream, m *nats.Msg) *jetstream.PubAck {
	t.Helper()
	ack, err := js.PublishMsg(ctx, m)
	if err != nil {
		t.Fatalf("publish to %s: %v", m.Subject, err)
	}
	return ack
}

func msgWithID(subject, id, data string) *nats.Msg {
	m := nats.NewMsg(subject)
	m.Header.Set(jetstream.MsgIDHeader, id)
	m.Data = []byte(data)
	return m
}

// scheduleMsg is a one-shot schedule on subject: at `at` the server
// publishes its data and headers (less the schedule's own) to target.
// The time is written with nanoseconds: the server honours them.
func scheduleMsg(subject, target string, at time.Time) *nats.Msg {
	m := nats.NewMsg(subject)
	m.Header.Set(jetstream.ScheduleHeader, "@at "+at.UTC().Format(time.RFC3339Nano))
	m.Header.Set(jetstream.ScheduleTargetHeader, target)
	return m
}

// next fetches one message, retrying through errors the cluster returns
// while a consumer leader is elected (logged once each), until ctx ends.
func next(t *testing.T, ctx context.Context, cons jetstream.Consumer) jetstream.Msg {
	t.Helper()
	seen := map[string]bool{}
	for {
		m, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
		if err == nil {
			return m
		}
		if ctx.Err() != nil {
			t.Fatalf("no message: %v (last error: %v)", ctx.Err(), err)
		}
		if errors.Is(err, nats.ErrTimeout) {
			continue
		}
		if !seen[err.Error()] {
			seen[err.Error()] = true
			t.Logf("Next: %v (%T), retrying", err, err)
		}
		// nats.ErrNoResponders comes back at once while the consumer has
		// no leader: do not spin.
		select {
		case <-ctx.Done():
		case <-time.After(25 * time.Millisecond):
		}
	}
}

// fetchNone checks that a fetch waiting for wait gets nothing.
func fetchNone(t *testing.T, cons jetstream.Consumer, wait time.Duration, why string) {
	t.Helper()
	b, err := cons.Fetch(10, jetstream.FetchMaxWait(wait))
	if err != nil {
		t.Fatal(err)
	}
	for m := range b.Messages() {
		md, _ := m.Metadata()
		t.Fatalf("%s: got stream seq %d (delivery %d) %q", why, md.Sequence.Stream, md.NumDelivered, m.Data())
	}
	if err := b.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
		t.Fatalf("%s: %v", why, err)
	}
}

// waitEmpty waits until a work-queue stream holds no message. An ack,
// even a DoubleAck, returns once the consumer has recorded it; the stream
// removes the message after that, on its own (on the cluster through a
// replicated proposal of its own), so a stream info read right after the
// ack may still count it.
func waitEmpty(t *testing.T, ctx context.Context, st jetstream.Stream) {
	t.Helper()
	waitUntil(t, ctx, func() bool { return info(t, ctx, st).State.Msgs == 0 }, "the work queue to empty")
}

func info(t *testing.T, ctx context.Context, st jetstream.Stream) *jetstream.StreamInfo {
	t.Helper()
	i, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return i
}

// ---------------------------------------------------------------------
// a. Deduplication by Nats-Msg-Id

// TestDedupByMsgID: a second publish with the same Nats-Msg-Id inside the
// stream's Duplicates window is acknowledged with Duplicate=true and the
// first message's sequence, and not stored, whatever its subject or data.
func TestDedupByMsgID(t *testing.T) {
	t.Parallel()
	onBoth(t, func(t *testing.T, b *broker) {
		ctx := testCtx(t)
		st := b.createStream(t, ctx, jetstream.StreamConfig{Name: "D", Subjects: []string{"d.>"}, Duplicates: time.Minute})
		first := publish(t, ctx, b.js, msgWithID("d.a", "ev-1", "one"))
		if first.Duplicate {
			t.Fatal("first publish acked as duplicate")
		}
		again := publish(t, ctx, b.js, msgWithID("d.b", "ev-1", "other data, other subject"))
		if !again.Duplicate || again.Sequence != first.Sequence {
			t.Fatalf("second publish of ev-1: %+v, want Duplicate with sequence %d", again, first.Sequence)
		}
		// jetstream.WithMsgID sets the same header.
		viaOpt, err := b.js.Publish(ctx, "d.a", []byte("one"), jetstream.WithMsgID("ev-1"))
		if err != nil || !viaOpt.Duplicate {
			t.Fatalf("publish with WithMsgID(ev-1): %+v, %v; want Duplicate", viaOpt, err)
		}
		if n := info(t, ctx, st).State.Msgs; n != 1 {
			t.Fatalf("stream holds %d messages, want 1", n)
		}
	})
}

// TestDedupWindowEnds: once the Duplicates window has passed, the same ID
// is stored again (the window, not the stream, is the dedup guarantee).
func TestDedupWindowEnds(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	b := embedded(t)
	const window = 500 * time.Millisecond
	st := b.createStream(t, ctx, jetstream.StreamConfig{Name: "W", Subjects: []string{"w"}, Duplicates: window})
	start := time.Now()
	publish(t, ctx, b.js, msgWithID("w", "x", ""))
	for publish(t, ctx, b.js, msgWithID("w", "x", "")).Duplicate {
		time.Sleep(20 * time.Millisecond) // polling the server, not waiting out the window
	}
	elapsed := time.Since(start)
	t.Logf("ID accepted again %v after the first publish (window %v)", elapsed.Round(time.Millisecond), window)
	if elapsed < window {
		t.Fatalf("ID accepted again after %v, inside the %v window", elapsed, window)
	}
	if n := info(t, ctx, st).State.Msgs; n != 2 {
		t.Fatalf("stream holds %d, want 2", n)
	}
}

// TestDedupSurvivesLeaderKillAndFullRestart: IDs published before the
// stream leader is SIGKILLed are still duplicates on the new leader, on
// the restarted node, and after all three nodes are killed and restarted
// (the window is rebuilt from the stored messages).
func TestDedupSurvivesLeaderKillAndFullRestart(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	b := cluster(t)
	c := b.cluster
	st := b.createStream(t, ctx, jetstream.StreamConfig{Name: "D", Subjects: []string{"d.>"}, Duplicates: 10 * time.Minute})
	const n = 100
	for i := range n {
		publish(t, ctx, b.js, msgWithID("d."+strconv.Itoa(i), "ev-"+strconv.Itoa(i), "x"))
	}
	republishAll := func(when string) {
		t.Helper()
		for i := range n {
			var ack *jetstream.PubAck
			var err error
			for {
				pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				ack, err = b.js.PublishMsg(pctx, msgWithID("d."+strconv.Itoa(i), "ev-"+strconv.Itoa(i), "x"))
				cancel()
				if err == nil || ctx.Err() != nil {
					break
				}
			}
			if err != nil || !ack.Duplicate {
				t.Fatalf("%s: republish of ev-%d: %+v, %v; want Duplicate", when, i, ack, err)
			}
		}
	}

	leader, err := c.WaitStream(ctx, "D")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Kill(leader); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitStream(ctx, "D"); err != nil {
		t.Fatal(err)
	}
	republishAll("after the leader's SIGKILL")
	if err := c.Restart(ctx, leader); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitStream(ctx, "D"); err != nil {
		t.Fatal(err)
	}
	republishAll("after the killed leader's restart")

	for i := range c.Size() {
		if err := c.Kill(i); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	errs := make([]error, c.Size())
	for i := range c.Size() {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = c.Restart(ctx, i) }()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitStream(ctx, "D"); err != nil {
		t.Fatal(err)
	}
	republishAll("after SIGKILL and restart of all three nodes")
	if got := info(t, ctx, st).State.Msgs; got != n {
		t.Fatalf("stream holds %d messages, want %d", got, n)
	}
}

// TestDedupForgetsDeliveredAfterRestart: in a work-queue stream, the ID of
// a message that was delivered and acknowledged (so removed) is still a
// duplicate while the server runs, but not once it has restarted: the
// window is rebuilt from the messages the stream holds. A copy published
// then is stored as a new message. (On the cluster the same happens when
// a node that restarted comes to lead the stream, depending on what its
// raft log still replays; the broker's workers check every delivery
// against its row for that reason.)
func TestDedupForgetsDeliveredAfterRestart(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	b := embedded(t)
	st := b.createStream(t, ctx, jetstream.StreamConfig{Name: "F", Subjects: []string{"f.>"},
		Retention: jetstream.WorkQueuePolicy, Duplicates: 10 * time.Minute})
	cons, err := st.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "w", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	publish(t, ctx, b.js, msgWithID("f.done", "done-1", "x"))
	publish(t, ctx, b.js, msgWithID("f.kept", "kept-1", "x"))
	m := next(t, ctx, cons)
	if m.Subject() != "f.done" {
		t.Fatalf("got %s first", m.Subject())
	}
	if err := m.DoubleAck(ctx); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, ctx, func() bool { return info(t, ctx, st).State.Msgs == 1 }, "the acknowledged message to be removed")
	if ack := publish(t, ctx, b.js, msgWithID("f.done", "done-1", "x")); !ack.Duplicate {
		t.Fatalf("before the restart: %+v, want Duplicate", ack)
	}

	b.server.Restart()
	if ack := publish(t, ctx, b.js, msgWithID("f.kept", "kept-1", "x")); !ack.Duplicate {
		t.Fatalf("after the restart, the ID of a message the stream holds: %+v, want Duplicate", ack)
	}
	if ack := publish(t, ctx, b.js, msgWithID("f.done", "done-1", "x")); ack.Duplicate {
		t.Fatalf("after the restart, the ID of a delivered message: %+v; JetStream now remembers it (update the broker's comments)", ack)
	}
	if got := info(t, ctx, st).State.Msgs; got != 2 {
		t.Fatalf("stream holds %d messages, want 2 (the copy stored again)", got)
	}
}

// ---------------------------------------------------------------------
// b. Message schedules

// TestScheduleOnWorkQueue: a stream with WorkQueue retention accepts
// AllowMsgSchedules (and turns on AllowRollup, which schedules need). A
// one-shot "@at" schedule on x.s.<id> targeting x.q.<id> in the same
// stream reaches a durable pull consumer filtered on x.q.> at its time,
// never before; the fired message keeps the schedule's data and custom
// headers but not its Nats-Msg-Id; the schedule message is purged when it
// fires; Nats-Msg-Id deduplicates schedule publishes; a later schedule on
// the same subject replaces the earlier one, which never fires; a time in
// the past fires at once.
func TestScheduleOnWorkQueue(t *testing.T) {
	t.Parallel()
	onBoth(t, func(t *testing.T, b *broker) {
		ctx := testCtx(t)
		st := b.createStream(t, ctx, jetstream.StreamConfig{
			Name: "X", Subjects: []string{"x.>"}, Retention: jetstream.WorkQueuePolicy,
			AllowMsgSchedules: true, Duplicates: time.Minute,
		})
		cfg := info(t, ctx, st).Config
		if !cfg.AllowRollup || cfg.DenyPurge {
			t.Errorf("AllowMsgSchedules stream: AllowRollup %v, DenyPurge %v; want the server to set true, false", cfg.AllowRollup, cfg.DenyPurge)
		}
		cons, err := b.js.CreateOrUpdateConsumer(ctx, "X", jetstream.ConsumerConfig{
			Durable: "q", FilterSubject: "x.q.>", AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Minute,
		})
		if err != nil {
			t.Fatal(err)
		}
		var seqs uint64 // messages stored so far (sequence accounting)

		// One schedule, published twice with the same Nats-Msg-Id.
		due := time.Now().Add(1500 * time.Millisecond)
		m := scheduleMsg("x.s.1", "x.q.1", due)
		m.Header.Set(jetstream.MsgIDHeader, "sched-1")
		m.Header.Set("Txhook-Event-Id", "ev-1")
		m.Header.Set("Txhook-Attempt", "3")
		m.Data = []byte(`{"event":"ev-1"}`)
		ack := publish(t, ctx, b.js, m)
		dup := publish(t, ctx, b.js, m)
		if ack.Duplicate || !dup.Duplicate || dup.Sequence != ack.Sequence {
			t.Fatalf("schedule published twice with one Nats-Msg-Id: acks %+v, %+v; want the second a duplicate", ack, dup)
		}
		seqs++
		if _, err := st.GetLastMsgForSubject(ctx, "x.s.1"); err != nil {
			t.Fatalf("schedule message not stored before its time: %v", err)
		}
		fired := next(t, ctx, cons)
		late := time.Since(due)
		seqs++
		t.Logf("schedule fired %v after its time", late.Round(time.Millisecond))
		if late < 0 {
			t.Fatalf("schedule fired %v before its time", -late)
		}
		if late > 30*time.Second {
			t.Fatalf("schedule fired %v late", late)
		}
		if fired.Subject() != "x.q.1" || string(fired.Data()) != `{"event":"ev-1"}` {
			t.Fatalf("fired %s %q, want x.q.1 with the schedule's data", fired.Subject(), fired.Data())
		}
		h := fired.Headers()
		want := map[string]string{
			"Txhook-Event-Id":            "ev-1",
			"Txhook-Attempt":             "3",
			jetstream.SchedulerHeader:    "x.s.1", // the schedule's subject
			jetstream.ScheduleNextHeader: "purge", // one-shot: the schedule is purged
		}
		for k, v := range want {
			if h.Get(k) != v {
				t.Errorf("fired header %s = %q, want %q (all: %v)", k, h.Get(k), v, h)
			}
		}
		for _, k := range []string{jetstream.MsgIDHeader, jetstream.ScheduleHeader, jetstream.ScheduleTargetHeader} {
			if _, ok := h[k]; ok {
				t.Errorf("fired message keeps header %s (all: %v)", k, h)
			}
		}
		if err := fired.DoubleAck(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := st.GetLastMsgForSubject(ctx, "x.s.1"); !errors.Is(err, jetstream.ErrMsgNotFound) {
			t.Fatalf("schedule message after firing: %v, want jetstream.ErrMsgNotFound (purged)", err)
		}

		// A second schedule on the same subject replaces the first: only
		// the later publish fires, even though it is due earlier.
		early, late2 := time.Now().Add(time.Second), time.Now().Add(2*time.Second)
		publish(t, ctx, b.js, scheduleMsg("x.s.2", "x.q.replaced", late2))
		publish(t, ctx, b.js, scheduleMsg("x.s.2", "x.q.replacement", early))
		seqs += 2
		// A sentinel due after the replaced schedule's time: once it has
		// fired, the replaced one would have too.
		publish(t, ctx, b.js, scheduleMsg("x.s.sentinel", "x.q.sentinel", late2.Add(time.Second)))
		seqs++
		// A time in the past fires at once.
		publish(t, ctx, b.js, scheduleMsg("x.s.past", "x.q.past", time.Now().Add(-time.Hour)))
		seqs++
		var got []string
		for len(got) < 3 {
			m := next(t, ctx, cons)
			got = append(got, m.Subject())
			seqs++
			if err := m.DoubleAck(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if strings.Join(got, " ") != "x.q.past x.q.replacement x.q.sentinel" {
			t.Fatalf("fired %v, want x.q.past x.q.replacement x.q.sentinel (x.q.replaced never)", got)
		}
		waitEmpty(t, ctx, st) // all acked or purged
		if last := info(t, ctx, st).State.LastSeq; last != seqs {
			t.Fatalf("stream last seq %d, want %d (no extra firing)", last, seqs)
		}
	})
}

// TestScheduleAtOptionTruncatesToSeconds: nats.go's WithScheduleAt writes
// the time in whole seconds, dropping the fraction, so a schedule made
// with it may fire up to a second BEFORE the time given. Write the header
// with RFC3339Nano (as scheduleMsg does) or round the time up.
func TestScheduleAtOptionTruncatesToSeconds(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	b := embedded(t)
	st := b.createStream(t, ctx, jetstream.StreamConfig{Name: "X", Subjects: []string{"x.>"}, AllowMsgSchedules: true})
	at := time.Now().Add(time.Hour).Truncate(time.Second).Add(900 * time.Millisecond)
	if _, err := b.js.Publish(ctx, "x.s.1", nil, jetstream.WithScheduleAt(at), jetstream.WithScheduleTarget("x.q.1")); err != nil {
		t.Fatal(err)
	}
	m, err := st.GetLastMsgForSubject(ctx, "x.s.1")
	if err != nil {
		t.Fatal(err)
	}
	want := "@at " + at.UTC().Truncate(time.Second).Format(time.RFC3339)
	if got := m.Header.Get(jetstream.ScheduleHeader); got != want {
		t.Fatalf("WithScheduleAt(%s) wrote %q, want %q", at.UTC().Format(time.RFC3339Nano), got, want)
	}
}

// TestScheduleErrors: what the server answers to schedules it will not
// take.
func TestScheduleErrors(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	b := embedded(t)
	b.createStream(t, ctx, jetstream.StreamConfig{Name: "X", Subjects: []string{"x.>"}, AllowMsgSchedules: true})
	b.createStream(t, ctx, jetstream.StreamConfig{Name: "P", Subjects: []string{"p.>"}})
	noTarget := nats.NewMsg("x.s.1")
	noTarget.Header.Set(jetstream.ScheduleHeader, "@at "+time.Now().Add(time.Hour).UTC().Format(time.RFC3339))
	badPattern := scheduleMsg("x.s.2", "x.q.2", time.Now())
	badPattern.Header.Set(jetstream.ScheduleHeader, "@at tomorrow")
	for _, c := range []struct {
		name string
		m    *nats.Msg
		want error
	}{
		{"schedules not allowed on the stream", scheduleMsg("p.s.1", "p.q.1", time.Now().Add(time.Hour)), jetstream.ErrMessageSchedulesDisabled},
		{"no target", noTarget, jetstream.ErrScheduleTargetInvalid},
		{"target is the schedule's own subject", scheduleMsg("x.s.3", "x.s.3", time.Now().Add(time.Hour)), jetstream.ErrScheduleTargetInvalid},
		{"target outside the stream", scheduleMsg("x.s.4", "elsewhere.q", time.Now().Add(time.Hour)), jetstream.ErrScheduleTargetInvalid},
		{"unparsable time", badPattern, jetstream.ErrSchedulePatternInvalid},
	} {
		_, err := b.js.PublishMsg(ctx, c.m)
		if !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
}

// TestScheduleFiresOnceAfterLeaderKill: a schedule whose time passes while
// the stream leader is SIGKILLed fires after the failover, exactly once,
// also after the killed node comes back.
func TestScheduleFiresOnceAfterLeaderKill(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	b := cluster(t)
	c := b.cluster
	st := b.createStream(t, ctx, jetstream.StreamConfig{
		Name: "X", Subjects: []string{"x.>"}, Retention: jetstream.WorkQueuePolicy, AllowMsgSchedules: true,
	})
	cons, err := b.js.CreateOrUpdateConsumer(ctx, "X", jetstream.ConsumerConfig{
		Durable: "q", FilterSubject: "x.q.>", AckPolicy: jetstream.AckExplicitPolicy,
	})
	if err != nil {
		t.Fatal(err)
	}
	leader, err := c.WaitStream(ctx, "X")
	if err != nil {
		t.Fatal(err)
	}
	// Due before any new leader can be elected (that takes seconds).
	due := time.Now().Add(2 * time.Second)
	publish(t, ctx, b.js, scheduleMsg("x.s.1", "x.q.1", due))
	if err := c.Kill(leader); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	if !killed.Before(due) {
		t.Fatalf("the kill came %v after the schedule's time; the test needs it before", killed.Sub(due))
	}
	newLeader, err := c.WaitStream(ctx, "X")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("killed %s; %s leads the stream (and takes publishes through every node) %v later", c.Name(leader), c.Name(newLeader), time.Since(killed).Round(time.Millisecond))
	m := next(t, ctx, cons)
	t.Logf("fired on the new leader %v after its time, %v after the kill", time.Since(due).Round(time.Millisecond), time.Since(killed).Round(time.Millisecond))
	if m.Subject() != "x.q.1" || time.Now().Before(due) {
		t.Fatalf("got %s at %v before its time", m.Subject(), time.Until(due))
	}
	if err := m.DoubleAck(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Restart(ctx, leader); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitStream(ctx, "X"); err != nil {
		t.Fatal(err)
	}
	// A sentinel due now: by the time it has fired, a second firing of
	// x.s.1 would have been stored before it.
	sentinelDue := time.Now().Add(500 * time.Millisecond)
	publish(t, ctx, b.js, scheduleMsg("x.s.sentinel", "x.q.sentinel", sentinelDue))
	m = next(t, ctx, cons)
	t.Logf("a schedule due after the failover fired %v after its time", time.Since(sentinelDue).Round(time.Millisecond))
	if m.Subject() != "x.q.sentinel" {
		t.Fatalf("after the restart got %s, want only x.q.sentinel (x.q.1 fired twice?)", m.Subject())
	}
	if err := m.DoubleAck(ctx); err != nil {
		t.Fatal(err)
	}
	// Schedule, firing, sentinel, its firing: four sequences, nothing else.
	waitEmpty(t, ctx, st)
	if last := info(t, ctx, st).State.LastSeq; last != 4 {
		t.Fatalf("stream last seq %d, want 4", last)
	}
}

// ---------------------------------------------------------------------
// c. Durable pull consumers: AckWait, NakWithDelay, DoubleAck, Term,
// InProgress, MaxAckPending

func consumerSetup(t *testing.T, ctx context.Context, b *broker, cfg jetstream.ConsumerConfig) (jetstream.Stream, jetstream.Consumer) {
	t.Helper()
	st := b.createStream(t, ctx, jetstream.StreamConfig{Name: "Q", Subjects: []string{"q.>"}, Retention: jetstream.WorkQueuePolicy})
	cfg.Durable = "w"
	cfg.AckPolicy = jetstream.AckExplicitPolicy
	cons, err := b.js.CreateOrUpdateConsumer(ctx, "Q", cfg)
	if err != nil {
		t.Fatal(err)
	}
	return st, cons
}

func meta(t *testing.T, m jetstream.Msg) *jetstream.MsgMetadata {
	t.Helper()
	md, err := m.Metadata()
	if err != nil {
		t.Fatal(err)
	}
	return md
}

// TestAckWaitRedelivers: a message fetched and not acknowledged comes back
// after AckWait with NumDelivered=2; NakWithDelay(d) brings it back after
// d; DoubleAck returns once the server has the ack (WorkQueue: the message
// is gone); Term ends redelivery at once.
func TestAckWaitRedelivers(t *testing.T) {
	t.Parallel()
	onBoth(t, func(t *testing.T, b *broker) {
		ctx := testCtx(t)
		const ackWait = time.Second
		st, cons := consumerSetup(t, ctx, b, jetstream.ConsumerConfig{AckWait: ackWait})
		publish(t, ctx, b.js, msgWithID("q.1", "1", "one"))

		m := next(t, ctx, cons)
		start := time.Now()
		if md := meta(t, m); md.NumDelivered != 1 {
			t.Fatalf("first delivery NumDelivered %d", md.NumDelivered)
		}
		m = next(t, ctx, cons) // not acked: redelivered after AckWait
		after := time.Since(start)
		t.Logf("unacked message redelivered after %v (AckWait %v)", after.Round(time.Millisecond), ackWait)
		if md := meta(t, m); md.NumDelivered != 2 || md.Sequence.Stream != 1 {
			t.Fatalf("redelivery: NumDelivered %d, stream seq %d; want 2, 1", md.NumDelivered, md.Sequence.Stream)
		}
		if after < ackWait*9/10 {
			t.Fatalf("redelivered after %v, before AckWait %v", after, ackWait)
		}

		const delay = 2 * time.Second
		if err := m.NakWithDelay(delay); err != nil {
			t.Fatal(err)
		}
		start = time.Now()
		m = next(t, ctx, cons)
		after = time.Since(start)
		t.Logf("NakWithDelay(%v): redelivered after %v", delay, after.Round(time.Millisecond))
		if md := meta(t, m); md.NumDelivered != 3 {
			t.Fatalf("after the nak NumDelivered %d, want 3", md.NumDelivered)
		}
		if after < delay*9/10 {
			t.Fatalf("redelivered %v after NakWithDelay(%v)", after, delay)
		}

		if err := m.DoubleAck(ctx); err != nil {
			t.Fatalf("DoubleAck: %v", err)
		}
		if err := m.DoubleAck(ctx); !errors.Is(err, jetstream.ErrMsgAlreadyAckd) {
			t.Fatalf("second DoubleAck: %v, want jetstream.ErrMsgAlreadyAckd", err)
		}
		if ci, err := cons.Info(ctx); err != nil || ci.NumAckPending != 0 {
			t.Fatalf("consumer after DoubleAck returned: %+v, %v; want nothing ack pending", ci, err)
		}
		waitEmpty(t, ctx, st)

		publish(t, ctx, b.js, msgWithID("q.2", "2", "two"))
		m = next(t, ctx, cons)
		if err := m.Term(); err != nil {
			t.Fatal(err)
		}
		// Term has no reply, and the consumer handles acks apart from
		// info requests: wait until it no longer counts the message.
		waitUntil(t, ctx, func() bool {
			ci, err := cons.Info(ctx)
			return err == nil && ci.NumAckPending == 0 && ci.NumRedelivered == 0
		}, "the termed message to leave the consumer's pending list")
		waitEmpty(t, ctx, st) // a termed message leaves a work queue
		fetchNone(t, cons, ackWait*3, "a termed message must not come back")
	})
}

// TestInProgressHoldsAMessage: InProgress resets AckWait, so a message
// held longer than AckWait by a worker that says so is not handed to
// another worker.
func TestInProgressHoldsAMessage(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	b := embedded(t)
	const ackWait = 2 * time.Second
	_, cons := consumerSetup(t, ctx, b, jetstream.ConsumerConfig{AckWait: ackWait})
	publish(t, ctx, b.js, msgWithID("q.1", "1", "one"))
	m := next(t, ctx, cons)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(ackWait / 8)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				_ = m.InProgress()
			}
		}
	}()
	fetchNone(t, cons, 3*ackWait, "a message kept in progress must not be redelivered")
	close(stop)
	wg.Wait()
	if err := m.DoubleAck(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestMaxAckPendingFullOfDelayedNaks: MaxAckPending counts messages
// NakWithDelay'd and waiting for their delay. When all of them are, the
// consumer hands out NOTHING else until a delay ends, however many other
// messages wait: delayed retries held by NakWithDelay block fresh work.
func TestMaxAckPendingFullOfDelayedNaks(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	b := embedded(t)
	const maxAckPending = 3
	_, cons := consumerSetup(t, ctx, b, jetstream.ConsumerConfig{AckWait: time.Minute, MaxAckPending: maxAckPending})
	for i := range 10 {
		publish(t, ctx, b.js, msgWithID("q."+strconv.Itoa(i), strconv.Itoa(i), strconv.Itoa(i)))
	}
	batch, err := cons.Fetch(10, jetstream.FetchMaxWait(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var held []jetstream.Msg
	for m := range batch.Messages() {
		held = append(held, m)
	}
	if len(held) != maxAckPending {
		t.Fatalf("fetch of 10 with MaxAckPending %d got %d", maxAckPending, len(held))
	}
	const delay = 4 * time.Second
	naked := time.Now()
	for _, m := range held {
		if err := m.NakWithDelay(delay); err != nil {
			t.Fatal(err)
		}
	}
	ci, err := cons.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ci.NumAckPending != maxAckPending || ci.NumPending != 7 {
		t.Fatalf("after the naks: %d ack pending, %d pending; want %d, 7", ci.NumAckPending, ci.NumPending, maxAckPending)
	}
	fetchNone(t, cons, delay/2, "seven messages wait, but MaxAckPending is full of delayed naks")
	// When the delays end, the naked ones come back first.
	m := next(t, ctx, cons)
	md := meta(t, m)
	t.Logf("first delivery after the block: stream seq %d, delivery %d, %v after the naks", md.Sequence.Stream, md.NumDelivered, time.Since(naked).Round(time.Millisecond))
	if md.NumDelivered != 2 || md.Sequence.Stream > maxAckPending {
		t.Fatalf("after the delay got stream seq %d (delivery %d), want a redelivery of 1..%d", md.Sequence.Stream, md.NumDelivered, maxAckPending)
	}
	if time.Since(naked) < delay*9/10 {
		t.Fatalf("delivery %v after the naks, before the delay %v", time.Since(naked), delay)
	}
}

// TestConsumerLeaderKillRedeliversOnlyUnacked (cluster): with the
// consumer's leader SIGKILLed, messages delivered but not acknowledged
// come back on the new leader (NumDelivered 2); messages acknowledged with
// DoubleAck before the kill never do.
func TestConsumerLeaderKillRedeliversOnlyUnacked(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	b := cluster(t)
	c := b.cluster
	st, cons := consumerSetup(t, ctx, b, jetstream.ConsumerConfig{AckWait: 2 * time.Second})
	for i := range 10 {
		publish(t, ctx, b.js, msgWithID("q."+strconv.Itoa(i), strconv.Itoa(i), strconv.Itoa(i)))
	}
	acked := map[uint64]bool{}
	for len(acked) < 10 {
		m := next(t, ctx, cons)
		seq := meta(t, m).Sequence.Stream
		if seq%2 == 0 {
			if err := m.DoubleAck(ctx); err != nil {
				t.Fatal(err)
			}
		}
		acked[seq] = seq%2 == 0
	}
	ci, err := cons.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	leader := c.Index(ci.Cluster.Leader)
	if leader < 0 {
		t.Fatalf("consumer leader %q", ci.Cluster.Leader)
	}
	if err := c.Kill(leader); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	got := map[uint64]int{}
	for len(got) < 5 {
		m := next(t, ctx, cons)
		md := meta(t, m)
		if acked[md.Sequence.Stream] {
			t.Fatalf("stream seq %d acked before the kill was redelivered", md.Sequence.Stream)
		}
		if md.NumDelivered != 2 {
			t.Fatalf("stream seq %d redelivered with NumDelivered %d, want 2", md.Sequence.Stream, md.NumDelivered)
		}
		got[md.Sequence.Stream]++
		if err := m.DoubleAck(ctx); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("killed consumer leader %s; the 5 unacked messages were back within %v", c.Name(leader), time.Since(killed).Round(time.Millisecond))
	// Nothing is left for the consumer. (The stream's own count may keep
	// messages acknowledged just before the kill for a while: their
	// removal went with the dead leader's proposals, and on a loaded
	// machine the stream took longer than the test's deadline to drop
	// them; the consumer never hands them out again.)
	waitUntil(t, ctx, func() bool {
		ci, err := cons.Info(ctx)
		return err == nil && ci.NumAckPending == 0 && ci.NumPending == 0
	}, "the consumer to have nothing pending")
	_ = st
}

// ---------------------------------------------------------------------
// d. The stream deleted under a consumer; the server unreachable

// TestStreamDeletedUnderConsumer: a Fetch, Consume or Messages waiting on
// a consumer whose stream is deleted ends with jetstream.ErrConsumerDeleted;
// later fetches on the same handle fail with nats.ErrNoResponders (in the
// batch's Error, not Fetch's return); looking the consumer or stream up
// gives jetstream.ErrStreamNotFound; a publish to its subjects gives
// jetstream.ErrNoStreamResponse. Deleting only the consumer gives the
// same ErrConsumerDeleted, and lookups jetstream.ErrConsumerNotFound.
func TestStreamDeletedUnderConsumer(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	b := embedded(t)
	for _, deleteStream := range []bool{true, false} {
		name := map[bool]string{true: "stream", false: "consumer"}[deleteStream]
		t.Run("delete "+name, func(t *testing.T) {
			st := b.createStream(t, ctx, jetstream.StreamConfig{Name: "D", Subjects: []string{"d.>"}})
			cons, err := b.js.CreateOrUpdateConsumer(ctx, "D", jetstream.ConsumerConfig{Durable: "w", AckPolicy: jetstream.AckExplicitPolicy})
			if err != nil {
				t.Fatal(err)
			}
			fetchErr := make(chan error, 1)
			batch, err := cons.Fetch(10, jetstream.FetchMaxWait(time.Minute))
			if err != nil {
				t.Fatal(err)
			}
			go func() {
				for range batch.Messages() {
				}
				fetchErr <- batch.Error()
			}()
			consumeErr := make(chan error, 10)
			cc, err := cons.Consume(func(jetstream.Msg) {},
				jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) { consumeErr <- err }))
			if err != nil {
				t.Fatal(err)
			}
			defer cc.Stop()
			it, err := cons.Messages()
			if err != nil {
				t.Fatal(err)
			}
			defer it.Stop()
			iterErr := make(chan error, 1)
			go func() { _, err := it.Next(); iterErr <- err }()
			// The pull requests are in flight once the consumer reports
			// them waiting.
			waitUntil(t, ctx, func() bool {
				ci, err := cons.Info(ctx)
				return err == nil && ci.NumWaiting >= 3
			}, "three pull requests waiting")

			if deleteStream {
				err = b.js.DeleteStream(ctx, "D")
			} else {
				err = st.DeleteConsumer(ctx, "w")
			}
			if err != nil {
				t.Fatal(err)
			}
			for what, ch := range map[string]chan error{"Fetch": fetchErr, "Consume": consumeErr, "Messages": iterErr} {
				select {
				case err := <-ch:
					if !errors.Is(err, jetstream.ErrConsumerDeleted) {
						t.Errorf("%s waiting when the %s is deleted: %v, want jetstream.ErrConsumerDeleted", what, name, err)
					}
				case <-ctx.Done():
					t.Fatalf("%s: no error after the %s was deleted", what, name)
				}
			}
			batch, err = cons.Fetch(1, jetstream.FetchMaxWait(time.Second))
			if err != nil {
				t.Fatalf("Fetch after the delete returned %v; want the error in the batch", err)
			}
			for range batch.Messages() {
			}
			if err := batch.Error(); !errors.Is(err, nats.ErrNoResponders) {
				t.Errorf("Fetch after the %s was deleted: batch error %v, want nats.ErrNoResponders", name, err)
			}
			wantLookup := jetstream.ErrStreamNotFound
			if !deleteStream {
				wantLookup = jetstream.ErrConsumerNotFound
			}
			if _, err := cons.Info(ctx); !errors.Is(err, wantLookup) {
				t.Errorf("Consumer.Info: %v, want %v", err, wantLookup)
			}
			if _, err := b.js.Consumer(ctx, "D", "w"); !errors.Is(err, wantLookup) {
				t.Errorf("js.Consumer: %v, want %v", err, wantLookup)
			}
			if deleteStream {
				if _, err := b.js.Stream(ctx, "D"); !errors.Is(err, jetstream.ErrStreamNotFound) {
					t.Errorf("js.Stream: %v, want jetstream.ErrStreamNotFound", err)
				}
				if _, err := b.js.Publish(ctx, "d.x", nil); !errors.Is(err, jetstream.ErrNoStreamResponse) {
					t.Errorf("publish with no stream: %v, want jetstream.ErrNoStreamResponse", err)
				}
			} else if err := b.js.DeleteStream(ctx, "D"); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestServerUnreachable: what clients see when the server is down, at
// connect and mid-run, and after it comes back.
//
//   - Connect: nats.ErrNoServers at once (nats.RetryOnFailedConnect(true)
//     returns a connection that connects later; see natstest).
//   - Publish with the default reconnect buffer: blocks until its context
//     ends (context.DeadlineExceeded), but the message stays buffered and
//     IS STORED after the reconnect. Retrying with the same Nats-Msg-Id
//     makes that harmless.
//   - Publish with nats.ReconnectBufSize(-1): nats.ErrReconnectBufExceeded
//     at once, nothing buffered.
//   - PublishAsync: without WithPublishAsyncTimeout the future waits for
//     the reconnect; with it, ErrAsyncPublishTimeout, yet the message is
//     stored after the reconnect.
//   - Fetch: an empty batch with a nil error after FetchMaxWait,
//     indistinguishable from an idle queue.
//   - JetStream API calls (stream info): block until their context ends.
//   - A Consume started before the outage consumes again after it.
func TestServerUnreachable(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	b := embedded(t)
	s := b.server
	st := b.createStream(t, ctx, jetstream.StreamConfig{Name: "U", Subjects: []string{"u.>"}})
	cons, err := b.js.CreateOrUpdateConsumer(ctx, "U", jetstream.ConsumerConfig{Durable: "w", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	consumed := make(chan string, 100)
	cc, err := cons.Consume(func(m jetstream.Msg) { consumed <- string(m.Data()); _ = m.Ack() })
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Stop()
	_, jsNoBuf := s.JetStream(t, nats.ReconnectBufSize(-1))
	jsAsyncTimeout, err := jetstream.New(s.Connect(t), jetstream.WithPublishAsyncTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	asyncNoTimeout, err := b.js.PublishAsync("u.warm", []byte("warm")) // all connections up before the stop
	if err != nil {
		t.Fatal(err)
	}
	<-asyncNoTimeout.Ok()
	if got := <-consumed; got != "warm" {
		t.Fatalf("consumed %q", got)
	}

	s.Stop()
	if _, err := nats.Connect(s.URL(), natstest.ConnectOptions(t.Name(), t.Logf)...); !errors.Is(err, nats.ErrNoServers) {
		t.Errorf("connect to a stopped server: %v, want nats.ErrNoServers", err)
	}
	pctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	_, err = b.js.Publish(pctx, "u.1", []byte("buffered"), jetstream.WithMsgID("buffered"))
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("publish while down: %v, want context.DeadlineExceeded", err)
	}
	if _, err := jsNoBuf.Publish(ctx, "u.1", []byte("unbuffered")); !errors.Is(err, nats.ErrReconnectBufExceeded) {
		t.Errorf("publish while down without a reconnect buffer: %v, want nats.ErrReconnectBufExceeded", err)
	}
	asyncNoTimeout, err = b.js.PublishAsync("u.1", []byte("async"), jetstream.WithMsgID("async"))
	if err != nil {
		t.Fatal(err)
	}
	asyncTimeout, err := jsAsyncTimeout.PublishAsync("u.1", []byte("async-timeout"), jetstream.WithMsgID("async-timeout"))
	if err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-asyncTimeout.Err():
		if !errors.Is(err, jetstream.ErrAsyncPublishTimeout) {
			t.Errorf("PublishAsync with a timeout while down: %v, want jetstream.ErrAsyncPublishTimeout", err)
		}
	case <-asyncTimeout.Ok():
		t.Error("PublishAsync acknowledged while the server is down")
	case <-ctx.Done():
		t.Fatal("PublishAsync with WithPublishAsyncTimeout(1s) never completed")
	}
	fetchStart := time.Now()
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(500*time.Millisecond))
	if err != nil {
		t.Fatalf("Fetch while down returned %v", err)
	}
	for m := range batch.Messages() {
		t.Fatalf("Fetch while down got %q", m.Data())
	}
	if err := batch.Error(); err != nil {
		t.Errorf("Fetch while down: batch error %v, want nil (an empty batch)", err)
	}
	t.Logf("Fetch while down: empty batch, nil error, after %v", time.Since(fetchStart).Round(time.Millisecond))
	ictx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	_, err = st.Info(ictx)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("stream info while down: %v, want context.DeadlineExceeded", err)
	}
	select {
	case <-asyncNoTimeout.Ok():
		t.Error("PublishAsync without a timeout acknowledged while the server is down")
	case err := <-asyncNoTimeout.Err():
		t.Errorf("PublishAsync without a timeout failed while the server is down: %v", err)
	default:
	}

	s.Restart()
	select {
	case <-asyncNoTimeout.Ok():
	case err := <-asyncNoTimeout.Err():
		t.Fatalf("PublishAsync without a timeout, after the restart: %v", err)
	case <-ctx.Done():
		t.Fatal("PublishAsync without a timeout not acknowledged after the restart")
	}
	publish(t, ctx, b.js, msgWithID("u.2", "after", "after"))
	// Everything buffered during the outage was stored (the unbuffered
	// publish was not), and the Consume from before the outage got it.
	want := map[string]bool{"buffered": true, "async": true, "async-timeout": true, "after": true}
	for len(want) > 0 {
		select {
		case got := <-consumed:
			if !want[got] {
				t.Fatalf("consumed %q, not expected", got)
			}
			delete(want, got)
		case <-ctx.Done():
			t.Fatalf("not consumed after the restart: %v", want)
		}
	}
	if n := info(t, ctx, st).State.Msgs; n != 5 {
		t.Fatalf("stream holds %d, want 5 (warm, three buffered during the outage, after)", n)
	}
}
