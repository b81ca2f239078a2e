package clock

import (
	"testing"
	"time"
)

func TestFakeTimerFiresOnAdvance(t *testing.T) {
	f := NewFake(time.Unix(1000, 0))
	tm := f.NewTimer(10 * time.Second)
	select {
	case <-tm.C():
		t.Fatal("fired early")
	default:
	}
	f.Advance(9 * time.Second)
	select {
	case <-tm.C():
		t.Fatal("fired early")
	default:
	}
	f.Advance(time.Second)
	select {
	case got := <-tm.C():
		if !got.Equal(time.Unix(1010, 0)) {
			t.Fatalf("fired at %v", got)
		}
	default:
		t.Fatal("did not fire")
	}
	if f.Waiters() != 0 {
		t.Fatalf("waiters = %d", f.Waiters())
	}
}

func TestFakeTimerStopAndReset(t *testing.T) {
	f := NewFake(time.Unix(0, 0))
	tm := f.NewTimer(time.Second)
	if !tm.Stop() {
		t.Fatal("Stop of active timer returned false")
	}
	if tm.Stop() {
		t.Fatal("second Stop returned true")
	}
	f.Advance(2 * time.Second)
	select {
	case <-tm.C():
		t.Fatal("stopped timer fired")
	default:
	}
	tm.Reset(0)
	select {
	case <-tm.C():
	default:
		t.Fatal("zero reset did not fire")
	}
	tm.Reset(5 * time.Second)
	if d, ok := f.NextDeadline(); !ok || !d.Equal(time.Unix(7, 0)) {
		t.Fatalf("next deadline %v %v", d, ok)
	}
	ch := f.Changed()
	f.Set(time.Unix(7, 0))
	select {
	case <-ch:
	default:
		t.Fatal("Changed not closed on fire")
	}
	select {
	case <-tm.C():
	default:
		t.Fatal("did not fire on Set")
	}
}
