package main

import (
	"context"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
)

type deleteCall struct {
	name string
	uid  types.UID
	at   time.Time
}

// fakeDeletes records the ideal remover's DELETEs at the fake clock's time.
func fakeDeletes(c *clocktesting.FakeClock) (func(context.Context, string, types.UID) error, <-chan deleteCall) {
	ch := make(chan deleteCall, 100)
	return func(_ context.Context, name string, uid types.UID) error {
		ch <- deleteCall{name, uid, c.Now()}
		return nil
	}, ch
}

func nextDelete(t *testing.T, ch <-chan deleteCall) deleteCall {
	t.Helper()
	select {
	case d := <-ch:
		return d
	case <-time.After(10 * time.Second): // the DELETE runs in a goroutine of its own
		t.Fatal("no DELETE")
		return deleteCall{}
	}
}

func noDelete(t *testing.T, ch <-chan deleteCall) {
	t.Helper()
	select {
	case d := <-ch:
		t.Fatalf("DELETE of %s at %s, before its deadline", d.name, d.at)
	case <-time.After(100 * time.Millisecond):
	}
}

func TestIdealRemoverDeletesEachPodAtItsDeadline(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	c := clocktesting.NewFakeClock(t0)
	del, calls := fakeDeletes(c)
	r := newIdealRemover(context.Background(), c, del)
	r.schedule("a", "uid-a", t0.Add(time.Second))
	r.schedule("b", "uid-b", t0.Add(2*time.Second))
	r.schedule("a", "uid-a2", t0.Add(3*time.Second)) // a pod keeps its first timer
	r.schedule("past", "uid-p", t0.Add(-time.Second))

	c.Step(0)
	if d := nextDelete(t, calls); d.name != "past" || !d.at.Equal(t0) {
		t.Fatalf("first DELETE %+v, want the pod past its deadline, at once", d)
	}
	c.Step(999 * time.Millisecond)
	noDelete(t, calls)
	c.Step(time.Millisecond)
	if d := nextDelete(t, calls); d.name != "a" || d.uid != "uid-a" || !d.at.Equal(t0.Add(time.Second)) {
		t.Fatalf("DELETE %+v, want a with its UID at its deadline", d)
	}
	noDelete(t, calls)
	c.Step(time.Second)
	if d := nextDelete(t, calls); d.name != "b" || d.uid != "uid-b" || !d.at.Equal(t0.Add(2*time.Second)) {
		t.Fatalf("DELETE %+v, want b with its UID at its deadline", d)
	}
	c.Step(time.Minute)
	noDelete(t, calls) // a's second schedule made no timer
	r.stop()

	fires := r.results()
	if len(fires) != 3 {
		t.Fatalf("%d fires, want 3: %v", len(fires), fires)
	}
	if f := fires["b"]; !f.Deadline.Equal(t0.Add(2*time.Second)) || !f.Fired.Equal(f.Deadline) || f.Err != nil {
		t.Errorf("b's fire %+v, want fired at its deadline", f)
	}
	var s idealSide
	s.fillFires(fires)
	if s.TimerLate.Count != 3 || s.TimerLate.Max != 1000 || s.DeleteErrors != 0 {
		t.Errorf("timer figures %+v (errors %d), want 3 fires, the latest 1 s after its deadline (the pod past it)", s.TimerLate, s.DeleteErrors)
	}
}

func TestIdealRemoverStopCancelsPendingTimers(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	c := clocktesting.NewFakeClock(t0)
	del, calls := fakeDeletes(c)
	r := newIdealRemover(context.Background(), c, del)
	r.schedule("later", "uid", t0.Add(time.Minute))
	done := make(chan struct{})
	go func() { r.stop(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("stop waits for a timer that has not fired")
	}
	c.Step(2 * time.Minute)
	noDelete(t, calls)
	if n := len(r.results()); n != 0 {
		t.Fatalf("%d fires after stop, want 0", n)
	}
}

func TestIdealRemoverWaitsForDeletesInFlight(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	c := clocktesting.NewFakeClock(t0)
	release := make(chan struct{})
	var mu sync.Mutex
	deleted := false
	r := newIdealRemover(context.Background(), c, func(context.Context, string, types.UID) error {
		<-release
		mu.Lock()
		deleted = true
		mu.Unlock()
		return nil
	})
	r.schedule("now", "uid", t0)
	c.Step(0)
	go func() { time.Sleep(50 * time.Millisecond); close(release) }()
	r.stop()
	mu.Lock()
	defer mu.Unlock()
	if !deleted {
		t.Fatal("stop returned before the DELETE in flight")
	}
}

func TestInterleavedCopies(t *testing.T) {
	seen := map[[2]int]bool{}
	for i := range 20 {
		k, second := interleaved(i)
		if got := copyIndex(k, second); got != i {
			t.Fatalf("copyIndex(interleaved(%d)) = %d", i, got)
		}
		b := 0
		if second {
			b = 1
		}
		seen[[2]int{k, b}] = true
	}
	for k := range 10 {
		if !seen[[2]int{k, 0}] || !seen[[2]int{k, 1}] {
			t.Fatalf("pod %d lacks a copy: %v", k, seen)
		}
		if _, second := interleaved(2 * k); second != (k%2 == 1) {
			t.Errorf("pod %d: the second namespace's copy goes first %v, want alternating", k, second)
		}
	}
}

func TestSortLateness(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	deadline := func(k int) time.Time { return t0.Add(time.Duration(k+10) * time.Second) }
	created := func(k int) time.Time {
		switch k {
		case 0:
			return time.Time{} // creation failed
		case 1:
			return deadline(1).Add(-500 * time.Millisecond) // created late
		}
		return t0
	}
	gone := map[string]time.Time{
		"steady-000002": deadline(2).Add(5 * time.Millisecond),
		"steady-000003": deadline(3).Add(-time.Millisecond), // early
		"steady-000005": deadline(5).Add(7 * time.Millisecond),
	}
	s := sortLateness(6, created, deadline, gone, deadline(4)) // pod 4 not removed
	if s.createdLate != 1 || s.notRemoved != 1 || s.early != 1 || len(s.all) != 3 {
		t.Fatalf("%+v: want 1 created late, 1 not removed, 1 early, 3 measured", s)
	}
	if len(s.during) != 2 || len(s.after) != 1 || s.after[0] != 7*time.Millisecond {
		t.Fatalf("during %v after %v: want pods 2 and 3 during creation, 5 after", s.during, s.after)
	}
}

func TestCompareToIdeal(t *testing.T) {
	v := compareToIdeal(latency{P50: 9, P99: 25}, latency{P50: 6, P99: 20})
	if v.P50Ratio != 1.5 || v.P50DiffMs != 3 || v.P99Ratio != 1.25 || v.P99DiffMs != 5 {
		t.Fatalf("%+v", v)
	}
}
