package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	core "k8s.io/client-go/testing"

	"github.com/podjanitor/podjanitor/internal/apitest"
	"github.com/podjanitor/podjanitor/internal/wave"
)

// spreadFixture: n namespaces kept (podjanitor.io/keep) with 5 pods each,
// all due under the cluster rule `after: 1m` but for the keep; waves of
// more than 10 pods held.
func spreadFixture(t *testing.T, n int) (*fixture, []*corev1.Namespace) {
	t.Helper()
	return spreadFixtureWith(t, n, map[string]string{"podjanitor.io/keep": "true"})
}

// spreadFixtureWith is spreadFixture with each namespace annotated
// annotations.
func spreadFixtureWith(t *testing.T, n int, annotations map[string]string) (*fixture, []*corev1.Namespace) {
	t.Helper()
	var pods []*corev1.Pod
	var namespaces []*corev1.Namespace
	for i := range n {
		name := fmt.Sprintf("team-%d", i)
		namespaces = append(namespaces, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name),
			Annotations: maps.Clone(annotations)}})
		for j := range 5 {
			p := apitest.Pod(fmt.Sprintf("p%d", j), t0.Add(-time.Hour), corev1.PodSucceeded, nil)
			p.Namespace, p.UID = name, p.UID+types.UID("-"+name)
			pods = append(pods, p)
		}
	}
	f := newFixtureWithNamespaces(t, Options{
		Evaluator: evaluatorWithAfter(t, "1m"),
		Waves: &wave.Options{Threshold: wave.Threshold{Pods: 10}, Window: time.Minute,
			Record: wave.Record{Namespace: "podjanitor", Name: "podjanitor"}},
	}, namespaces, pods...)
	f.c.opts.Waves.Record.Client = f.client
	namespacesOf(f.c).Lead()
	ctx, cancel := context.WithCancel(f.ctx)
	done := make(chan struct{})
	go func() { defer close(done); f.c.spread.run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return f, namespaces
}

// takeKeepOffAll takes the keep annotation off each namespace in turn (as
// `kubectl annotate ns --all podjanitor.io/keep-` does), each decided again
// before the next, with no time passing.
func (f *fixture) takeKeepOffAll(namespaces []*corev1.Namespace) {
	f.t.Helper()
	for _, ns := range namespaces {
		ns = ns.DeepCopy()
		ns.ResourceVersion, ns.Annotations = "", nil
		if _, err := f.client.CoreV1().Namespaces().Update(f.ctx, ns, metav1.UpdateOptions{}); err != nil {
			f.t.Fatal(err)
		}
		if err := wait.PollUntilContextTimeout(f.ctx, time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
			return f.c.queue.Len() >= 5, nil
		}); err != nil {
			f.t.Fatalf("%d keys queued after %s's change, want 5", f.c.queue.Len(), ns.Name)
		}
		for f.c.queue.Len() > 0 {
			f.next()
		}
	}
}

// TestSpreadHoldsAChangeMadeInManyNamespaces: the keep taken off 4
// namespaces of 5 due pods each, one after another: no namespace's change
// is held on its own (5 pods), but together they make 20 pods due, over the
// cluster's threshold of 10. None is removed; the hold is on the Lease,
// with a Warning Event there; its ID on the Lease approves it, the 20 go,
// and the approval comes off.
func TestSpreadHoldsAChangeMadeInManyNamespaces(t *testing.T) {
	f, namespaces := spreadFixture(t, 4)
	f.takeKeepOffAll(namespaces)
	if n := f.deletes(); n != 0 {
		t.Fatalf("%d pods removed, want none: the change of 4 namespaces together is over the threshold", n)
	}
	for _, ns := range namespaces {
		if _, _, held := namespacesOf(f.c).Holds().Held(ns.Name); held {
			t.Errorf("%s's change held on its own (5 pods)", ns.Name)
		}
	}
	h, held, ok := f.c.spread.Held()
	if !ok || h.Pods != 20 || len(held) != 4 {
		t.Fatalf("spread hold %+v of %v, %v; want 20 pods of 4 namespaces", h, held, ok)
	}
	if got := metricValue(f.metrics, "podjanitor_pods_held", "source", wave.SourceSpread); got != 20 {
		t.Errorf("podjanitor_pods_held{source=namespaces} = %v, want 20", got)
	}
	lease := waitLease(t, f, func(a map[string]string) bool { return a[wave.AnnotationHeldSpread] == h.ID })
	if lease[wave.AnnotationHeldSpreadPods] != "20" || lease[wave.AnnotationHeldSpreadNamespaces] != "team-0, team-1, team-2, team-3" {
		t.Errorf("lease annotations %v", lease)
	}
	command := "kubectl annotate lease -n podjanitor podjanitor --overwrite podjanitor.io/approve-wave=" + h.ID
	// plan reads the hold from the Lease.
	var r planReport
	record := f.c.opts.Waves.Record
	markSpreadHeld(&r, record, readStored(t, record).Lease)
	var out strings.Builder
	if err := printPlan(&out, r); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "HELD on the Lease: changes of many namespaces' tenant policies, labels or keep made together (team-0, team-1, team-2, team-3) made 20 pod(s)") ||
		!strings.Contains(out.String(), command) {
		t.Errorf("plan:\n%s\nwant the held change of 4 namespaces and the command", out.String())
	}
	found := false
	for _, e := range f.waitEvents(1) {
		found = found || strings.HasPrefix(e, "Warning RemovalsHeld Hold Holding 20 pod removal(s): changes of 4 namespaces") && strings.Contains(e, command)
	}
	if !found {
		t.Error("no RemovalsHeld warning on the Lease with the approval command")
	}
	// Settle passes: still held.
	if f.stepAndCheckReady(time.Hour) {
		for f.c.queue.Len() > 0 {
			f.next()
		}
	}
	if n := f.deletes(); n != 0 {
		t.Fatalf("%d pods removed an hour later, want none before the approval", n)
	}

	approve(t, f, h.ID)
	if err := wait.PollUntilContextTimeout(f.ctx, time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		f.clock.Step(waveRecordInterval)
		return f.c.queue.Len() >= 20, nil
	}); err != nil {
		t.Fatalf("the approval did not decide the held pods again: %d queued", f.c.queue.Len())
	}
	for f.c.queue.Len() > 0 {
		f.next()
	}
	if n := f.deletes(); n != 20 {
		t.Errorf("%d pods removed after the approval, want 20", n)
	}
	waitLease(t, f, func(a map[string]string) bool {
		_, approval := a[wave.AnnotationApprove]
		return a[wave.AnnotationHeldSpread] == "" && !approval
	})
}

// TestSpreadLetsASmallChangeGo: the keep taken off 2 namespaces of 5 pods
// (10, the threshold): held for spreadSettle in case more come, then
// removed.
func TestSpreadLetsASmallChangeGo(t *testing.T) {
	f, namespaces := spreadFixture(t, 2)
	f.takeKeepOffAll(namespaces)
	if n := f.deletes(); n != 0 {
		t.Fatalf("%d pods removed before spreadSettle, want none", n)
	}
	if _, _, ok := f.c.spread.Held(); ok {
		t.Fatal("10 pods held")
	}
	if !f.stepAndWaitReady(spreadSettle) {
		t.Fatal("the pods did not come back after spreadSettle")
	}
	for f.c.queue.Len() > 0 {
		f.next()
	}
	if n := f.deletes(); n != 10 {
		t.Errorf("%d pods removed after spreadSettle, want 10", n)
	}
}

// TestSpreadHoldUnderLeaseErrors: while the API server answers 500 to the
// Lease's writes, the spread's hold still holds every pod (it lives in the
// leader), and is recorded on the Lease once the writes pass; the approval
// read through the same errors is taken then.
func TestSpreadHoldUnderLeaseErrors(t *testing.T) {
	f, namespaces := spreadFixture(t, 4)
	var mu sync.Mutex
	failing := true
	// The spread's record loop already calls the client: the reactor
	// chain is changed under the Fake's lock (PrependReactor takes none).
	f.client.Lock()
	f.client.PrependReactor("*", "leases", func(a core.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		if !failing {
			return false, nil, nil
		}
		return true, nil, apierrors.NewInternalError(errors.New("injected"))
	})
	f.client.Unlock()
	f.takeKeepOffAll(namespaces)
	h, _, ok := f.c.spread.Held()
	if !ok {
		t.Fatal("not held")
	}
	for range 5 {
		f.clock.Step(waveRecordInterval)
		time.Sleep(10 * time.Millisecond)
	}
	if n := f.deletes(); n != 0 {
		t.Fatalf("%d pods removed while the Lease could not be written, want none", n)
	}
	mu.Lock()
	failing = false
	mu.Unlock()
	waitLease(t, f, func(a map[string]string) bool { return a[wave.AnnotationHeldSpread] == h.ID })
	approve(t, f, h.ID)
	if err := wait.PollUntilContextTimeout(f.ctx, time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		f.clock.Step(waveRecordInterval)
		return f.c.queue.Len() >= 20, nil
	}); err != nil {
		t.Fatalf("the approval did not decide the held pods again: %d queued", f.c.queue.Len())
	}
}
