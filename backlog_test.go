package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/podjanitor/podjanitor/internal/apitest"
)

// overdue is a Succeeded pod whose 1m ttl ended by at t0.
func overdue(name string, by time.Duration) *corev1.Pod {
	return apitest.Pod(name, t0.Add(-time.Minute-by), corev1.PodSucceeded, map[string]string{"podjanitor.io/ttl": "1m"})
}

// deletedNames is the pods deleted so far, in the order of their deletes.
func (f *fixture) deletedNames() []string {
	var names []string
	for _, a := range f.writes() {
		if a.GetVerb() == "delete" && a.GetResource().Resource == "pods" {
			names = append(names, a.(interface{ GetName() string }).GetName())
		}
	}
	return names
}

// Under the cap, the waiting pods go most overdue first, whatever order they
// were decided in; pods that came due at the same time go in the order they
// came to wait; a pod decided later but more overdue passes the others.
func TestBacklogGoesMostOverdueFirst(t *testing.T) {
	first := overdue("first", time.Minute) // takes the burst
	a := overdue("a", 10*time.Minute)
	b := overdue("b", 20*time.Minute)
	tieLate, tieEarly := overdue("tie-2", 5*time.Minute), overdue("tie-1", 5*time.Minute)
	most := overdue("most", time.Hour)
	f := newFixture(t, Options{MaxRemovalsPerSecond: 1, RemovalBurst: 1, NoRemovalEvents: true}, first, a, b, tieLate, tieEarly, most)
	for _, p := range []*corev1.Pod{first, a, b, tieLate, tieEarly} {
		f.process(keyOf(p))
	}
	if got := f.c.state.waitingForSlot(); got != 4 {
		t.Fatalf("%d pods wait for a slot, want 4", got)
	}
	f.process(keyOf(most)) // decided last, due longest
	f.stepUntilWritten(6, 10, nil)
	want := []string{"first", "most", "b", "a", "tie-2", "tie-1"}
	if got := f.deletedNames(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("removal order %q, want %q (most overdue first, ties as they came)", got, want)
	}
	if w := metricValue(f.metrics, "podjanitor_pods_waiting_for_removal"); w != 0 {
		t.Errorf("waiting for removal %v after the backlog, want 0", w)
	}
}

// A pod decided again while it waits keeps its place by its new deadline,
// and leaves the backlog when it is no longer due or gone.
func TestBacklogFollowsDecisionsAgain(t *testing.T) {
	first, a, b, c := overdue("first", time.Minute), overdue("a", 10*time.Minute), overdue("b", 20*time.Minute), overdue("c", 30*time.Minute)
	f := newFixture(t, Options{MaxRemovalsPerSecond: 1, RemovalBurst: 1, NoRemovalEvents: true}, first, a, b, c)
	for _, p := range []*corev1.Pod{first, a, b, c} {
		f.process(keyOf(p))
	}
	kept := c.DeepCopy()
	kept.Annotations["podjanitor.io/keep"] = "true"
	if err := f.c.pods.Update(kept); err != nil {
		t.Fatal(err)
	}
	f.process(keyOf(c)) // kept now: leaves the backlog
	if err := f.c.pods.Delete(b); err != nil {
		t.Fatal(err)
	}
	f.process(keyOf(b)) // gone
	if got := f.c.state.waitingForSlot(); got != 1 {
		t.Fatalf("%d pods wait for a slot, want 1 (a)", got)
	}
	if w := metricValue(f.metrics, "podjanitor_pods_waiting_for_removal"); w != 1 {
		t.Errorf("waiting for removal %v, want 1", w)
	}
	f.stepUntilWritten(2, 5, nil)
	if got := f.deletedNames(); fmt.Sprint(got) != "[first a]" {
		t.Errorf("removed %q, want first and a", got)
	}
	if got := f.c.state.len(); got != 2 { // the removed marks of first and a
		t.Errorf("%d state entries, want 2", got)
	}
}

// After a start (or a takeover) over an overdue backlog, the first pass
// decides every cached pod before a slot is handed out: the backlog goes
// most overdue first from its first removal, not in the order the pods were
// listed, the burst included.
func TestBacklogAfterAStartGoesMostOverdueFirst(t *testing.T) {
	const n = 40
	var pods []*corev1.Pod
	for i := range n { // listed least overdue first
		pods = append(pods, overdue(fmt.Sprintf("pod-%02d", i), time.Duration(i)*time.Minute))
	}
	f := newFixture(t, Options{MaxRemovalsPerSecond: 10, RemovalBurst: 5, NoRemovalEvents: true}, pods...)
	for _, p := range pods {
		f.c.enqueue(p) // the initial list
	}
	ctx, cancel := context.WithCancel(f.ctx)
	ran := make(chan struct{})
	t.Cleanup(func() { cancel(); <-ran })
	go func() { defer close(ran); _ = f.c.Run(ctx, 1) }()
	if err := wait.PollUntilContextTimeout(ctx, time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return f.deletes() == 5, nil
	}); err != nil {
		t.Fatalf("%d removed at the start, want the burst of 5", f.deletes())
	}
	for f.deletes() < n {
		f.clock.Step(100 * time.Millisecond)
		if err := wait.PollUntilContextTimeout(ctx, time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
			return f.c.Pending() == 0 && f.c.state.settled(), nil
		}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Millisecond)
	}
	got := f.deletedNames()
	for i, name := range got {
		if want := fmt.Sprintf("pod-%02d", n-1-i); name != want {
			t.Fatalf("removal %d: %s, want %s (most overdue first); order %q", i, name, want, got)
		}
	}
}
