package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	core "k8s.io/client-go/testing"

	"github.com/podjanitor/podjanitor/internal/apitest"
	"github.com/podjanitor/podjanitor/internal/wave"
	"github.com/podjanitor/podjanitor/policy"
)

// waveFixture is a controller under a cluster rule `after: 7d` over n
// Running pods created an hour before t0, holding waves of more than 10 pods.
func waveFixture(t *testing.T, n int) (*fixture, []*corev1.Pod) {
	t.Helper()
	var pods []*corev1.Pod
	for i := range n {
		p := apitest.Pod(fmt.Sprintf("p%03d", i), t0.Add(-time.Hour), corev1.PodSucceeded, nil)
		pods = append(pods, p)
	}
	f := newFixture(t, Options{
		Evaluator: evaluatorWithAfter(t, "7d"),
		Waves: &wave.Options{Threshold: wave.Threshold{Pods: 10}, Window: time.Minute,
			Record: wave.Record{Namespace: "podjanitor", Name: "podjanitor"}},
	}, pods...)
	f.c.opts.Waves.Record.Client = f.client
	return f, pods
}

func evaluatorWithAfter(t *testing.T, after string) *policy.Evaluator {
	t.Helper()
	e, err := policyEvaluator("podjanitor.io")(policyWithAfter(after))
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// reload sets the policy `after: after` and decides every pod.
func (f *fixture) reload(after string, pods []*corev1.Pod) {
	f.t.Helper()
	if err := f.c.SetEvaluator(evaluatorWithAfter(f.t, after)); err != nil {
		f.t.Fatal(err)
	}
	for range pods {
		f.next()
	}
}

func (f *fixture) deletes() int {
	n := 0
	for _, a := range f.writes() {
		if a.GetVerb() == "delete" && a.GetResource().Resource == "pods" {
			n++
		}
	}
	return n
}

func TestReloadWaveIsHeldUntilApproved(t *testing.T) {
	f, pods := waveFixture(t, 12)
	ctx, cancel := context.WithCancel(f.ctx)
	done := make(chan struct{})
	go func() { defer close(done); f.c.waves.run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	f.reload("1m", pods)
	if n := f.deletes(); n != 0 {
		t.Fatalf("%d pods removed of a held wave", n)
	}
	if got := metricValue(f.metrics, "podjanitor_pods_held", "source", "file"); got != 12 {
		t.Errorf("podjanitor_pods_held{source=file} = %v, want 12", got)
	}
	h, ok := f.c.waves.Held()
	if !ok || h.Pods != 12 {
		t.Fatalf("held %+v, %v; want a hold of 12 pods", h, ok)
	}
	// The hold is published on the Lease, with a Warning Event there.
	var lease = waitLease(t, f, func(annotations map[string]string) bool { return annotations[wave.AnnotationHeld] == h.ID })
	if lease[wave.AnnotationHeldPods] != "12" {
		t.Errorf("lease annotations %v, want 12 held pods", lease)
	}
	warning := "Warning RemovalsHeld Hold Holding 12 pod removal(s)"
	command := "kubectl annotate lease -n podjanitor podjanitor --overwrite podjanitor.io/approve-wave=" + h.ID
	if err := wait.PollUntilContextTimeout(f.ctx, time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		for _, e := range f.events() {
			if strings.HasPrefix(e, warning) && strings.Contains(e, command) {
				return true, nil
			}
		}
		return false, nil
	}); err != nil {
		t.Error("no RemovalsHeld warning with the approval command")
	}

	// Another change's ID approves nothing.
	approve(t, f, "0123456789ab")
	f.clock.Step(waveRecordInterval)
	time.Sleep(100 * time.Millisecond)
	if f.c.queue.Len() != 0 || f.deletes() != 0 {
		t.Fatal("a wrong approval released the wave")
	}

	approve(t, f, h.ID)
	if err := wait.PollUntilContextTimeout(f.ctx, time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		f.clock.Step(waveRecordInterval)
		return f.c.queue.Len() == len(pods), nil
	}); err != nil {
		t.Fatalf("the approval did not decide the held pods again: %d queued", f.c.queue.Len())
	}
	for range pods {
		f.next()
	}
	if n := f.deletes(); n != 12 {
		t.Errorf("%d pods removed after the approval, want 12", n)
	}
	if got := metricValue(f.metrics, "podjanitor_pods_held", "source", "file"); got != 0 {
		t.Errorf("podjanitor_pods_held{source=file} = %v after the approval, want 0", got)
	}
	waitLease(t, f, func(annotations map[string]string) bool { return annotations[wave.AnnotationHeld] == "" })
	approved := false
	for _, e := range f.waitEvents(1) {
		approved = approved || strings.HasPrefix(e, "Normal RemovalsApproved Approve Change "+h.ID+" approved: its 12 held pod(s) go")
	}
	if !approved {
		t.Error("no RemovalsApproved event on the Lease")
	}
}

func TestReloadWaveRevertedRemovesNothing(t *testing.T) {
	f, pods := waveFixture(t, 12)
	f.reload("1m", pods)
	f.reload("7d", pods)
	if n := f.deletes(); n != 0 {
		t.Fatalf("%d pods removed", n)
	}
	if _, ok := f.c.waves.Held(); ok {
		t.Error("a hold stands after the revert")
	}
	if got := metricValue(f.metrics, "podjanitor_pods_held", "source", "file"); got != 0 {
		t.Errorf("podjanitor_pods_held{source=file} = %v after the revert, want 0", got)
	}
	// Their deadlines are 7d again: parked until then.
	res, err := f.c.syncHandler(f.ctx, keyOf(pods[0]))
	if err != nil || res.RequeueAfter != 7*24*time.Hour-time.Hour {
		t.Errorf("syncHandler = %+v, %v; want the pod parked until its 7d deadline", res, err)
	}
}

func TestSmallReloadWaveIsNotHeld(t *testing.T) {
	f, pods := waveFixture(t, 10)
	f.reload("1m", pods)
	if n := f.deletes(); n != 10 {
		t.Errorf("%d pods removed of a wave of 10 (threshold 10), want 10", n)
	}
}

// Pods due under the running policy already (the steady flow) go while a
// change is held.
func TestHeldWaveLeavesTheSteadyFlow(t *testing.T) {
	f, pods := waveFixture(t, 12)
	old := apitest.Pod("old", t0.Add(-8*24*time.Hour), corev1.PodSucceeded, nil)
	f.reload("1m", pods)
	if err := f.c.pods.Add(old); err != nil {
		t.Fatal(err)
	}
	f.process(keyOf(old))
	if n := f.deletes(); n != 1 {
		t.Errorf("%d pods removed, want the one due under the old policy", n)
	}
}

func approve(t *testing.T, f *fixture, id string) {
	t.Helper()
	leases := f.client.CoordinationV1().Leases("podjanitor")
	l, err := leases.Get(f.ctx, "podjanitor", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	l.Annotations[wave.AnnotationApprove] = id
	if _, err := leases.Update(f.ctx, l, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func waitLease(t *testing.T, f *fixture, cond func(map[string]string) bool) map[string]string {
	t.Helper()
	var annotations map[string]string
	if err := wait.PollUntilContextTimeout(f.ctx, time.Millisecond, 5*time.Second, true, func(ctx context.Context) (bool, error) {
		l, err := f.client.CoordinationV1().Leases("podjanitor").Get(ctx, "podjanitor", metav1.GetOptions{})
		if err != nil {
			f.clock.Step(waveRecordInterval)
			return false, nil
		}
		annotations = l.Annotations
		if !cond(annotations) {
			f.clock.Step(waveRecordInterval)
			return false, nil
		}
		return true, nil
	}); err != nil {
		t.Fatalf("lease annotations %v", annotations)
	}
	return annotations
}

// waitRecord waits, stepping the record's clock, until cond holds of the
// record (the Lease and the ConfigMap, either there or not).
func waitRecord(t *testing.T, f *fixture, cond func(wave.Stored) bool) {
	t.Helper()
	var s wave.Stored
	if err := wait.PollUntilContextTimeout(f.ctx, time.Millisecond, 5*time.Second, true, func(ctx context.Context) (bool, error) {
		var err error
		if s, err = f.c.opts.Waves.Record.Read(ctx); err != nil || !cond(s) {
			f.clock.Step(waveRecordInterval)
			return false, nil
		}
		return true, nil
	}); err != nil {
		hash, policy := s.Baseline()
		id, _ := s.Held()
		t.Fatalf("the record: policy %s (%s), held %q", policy, hash, id)
	}
}

// TestPlanMarksHeldPods: plan marks HELD the due pods of the held change its
// policy file is (the Lease records the change and the policy acted on), not
// those due under that policy, and prints the approval command.
func TestPlanMarksHeldPods(t *testing.T) {
	week, minute := evaluatorWithAfter(t, "7d"), evaluatorWithAfter(t, "1m")
	young := apitest.Pod("young", t0.Add(-time.Hour), corev1.PodSucceeded, nil)
	old := apitest.Pod("old", t0.Add(-8*24*time.Hour), corev1.PodSucceeded, nil)
	pods := []*corev1.Pod{young, old}
	namespaces := map[string]*policy.Namespace{young.Namespace: {}}
	id := wave.ChangeID(policyJSON(week), policyJSON(minute))
	client := fake.NewClientset(&coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "podjanitor", Name: "podjanitor",
		Annotations: map[string]string{wave.AnnotationHeld: id, wave.AnnotationHeldPods: "1", wave.AnnotationHeldSource: wave.SourceFile,
			wave.AnnotationBaseline: string(policyJSON(week)), wave.AnnotationBaselineHash: wave.BaselineHash(policyJSON(week))}}})
	record := wave.Record{Client: client, Namespace: "podjanitor", Name: "podjanitor"}

	r := buildPlan(minute, pods, namespaces, t0)
	if err := markHeld(&r, record, readStored(t, record), minute, decisionScope{}, pods, namespaces, t0); err != nil {
		t.Fatal(err)
	}
	held := map[string]bool{}
	for _, e := range r.Pods {
		held[e.Pod] = e.Held
	}
	if !held["young"] || held["old"] || r.Hold == nil || r.Hold.Change != id {
		t.Fatalf("held %v, hold %+v; want young held (due by 1m, not by 7d), old not (due by both)", held, r.Hold)
	}
	var out strings.Builder
	if err := printPlan(&out, r); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"HELD " + id, "kubectl annotate lease -n podjanitor podjanitor --overwrite podjanitor.io/approve-wave=" + id} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("plan does not print %q:\n%s", want, out.String())
		}
	}

	// An approval on the Lease shows beside the hold: the held change's,
	// or another's that approves nothing.
	for approval, want := range map[string]string{
		id:             "approved: podjanitor.io/approve-wave=" + id + " is there",
		"0123456789ab": "not approved: podjanitor.io/approve-wave=0123456789ab names another change",
	} {
		stored := readStored(t, record)
		stored.Lease.Annotations[wave.AnnotationApprove] = approval
		r = buildPlan(minute, pods, namespaces, t0)
		if err := markHeld(&r, record, stored, minute, decisionScope{}, pods, namespaces, t0); err != nil {
			t.Fatal(err)
		}
		out.Reset()
		if err := printPlan(&out, r); err != nil {
			t.Fatal(err)
		}
		if r.Hold == nil || r.Hold.Approved != approval || !strings.Contains(out.String(), want) {
			t.Errorf("approval %s on the Lease: hold %+v, plan:\n%s\nwant %q", approval, r.Hold, out.String(), want)
		}
	}

	// A plan of another policy file is not the held change: nothing is held.
	other := evaluatorWithAfter(t, "2m")
	r = buildPlan(other, pods, namespaces, t0)
	if err := markHeld(&r, record, readStored(t, record), other, decisionScope{}, pods, namespaces, t0); err != nil || r.Hold != nil {
		t.Errorf("markHeld for another policy: hold %+v, %v; want none", r.Hold, err)
	}
}

// startFixture is a controller under a cluster rule `after: after` over n
// Running pods created ago before t0, holding waves of more than 10 pods,
// with the record Lease lease (nil: none, a first install).
func startFixture(t *testing.T, after string, ago time.Duration, n int, lease *coordinationv1.Lease) (*fixture, []*corev1.Pod) {
	t.Helper()
	return startFixtureWith(t, Options{}, after, ago, n, lease)
}

// startFixtureWith is startFixture with opts (DryRun) besides the policy and waves.
func startFixtureWith(t *testing.T, opts Options, after string, ago time.Duration, n int, lease *coordinationv1.Lease) (*fixture, []*corev1.Pod) {
	t.Helper()
	var pods []*corev1.Pod
	for i := range n {
		pods = append(pods, apitest.Pod(fmt.Sprintf("p%03d", i), t0.Add(-ago), corev1.PodSucceeded, nil))
	}
	opts.Evaluator = evaluatorWithAfter(t, after)
	opts.Waves = &wave.Options{Threshold: wave.Threshold{Pods: 10}, Window: time.Minute,
		Record: wave.Record{Namespace: "podjanitor", Name: "podjanitor"}}
	f := newFixture(t, opts, pods...)
	f.c.opts.Waves.Record.Client = f.client
	if lease != nil {
		if _, err := f.client.CoordinationV1().Leases("podjanitor").Create(f.ctx, lease, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	return f, pods
}

// recordedLease is the record Lease of a leader that acted on `after: after`.
func recordedLease(t *testing.T, after string) *coordinationv1.Lease {
	b := policyJSON(evaluatorWithAfter(t, after))
	return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "podjanitor", Name: "podjanitor",
		Annotations: map[string]string{wave.AnnotationBaseline: string(b), wave.AnnotationBaselineHash: wave.BaselineHash(b)}}}
}

// start is Run's start: the wave measured, then every pod decided.
func (f *fixture) start(pods []*corev1.Pod) {
	f.t.Helper()
	if err := f.c.startWave(f.ctx); err != nil {
		f.t.Fatal(err)
	}
	for _, p := range pods {
		f.process(keyOf(p))
	}
}

// TestRestartWithTheSamePolicyHoldsNothing: the Lease records the policy
// podjanitor starts with: its 12 overdue pods go, nothing is held.
func TestRestartWithTheSamePolicyHoldsNothing(t *testing.T) {
	f, pods := startFixture(t, "1m", time.Hour, 12, recordedLease(t, "1m"))
	f.start(pods)
	if _, held := f.c.waves.Held(); held {
		t.Error("a restart with the same policy is held")
	}
	if n := f.deletes(); n != 12 {
		t.Errorf("%d pods removed, want 12", n)
	}
}

// TestStartWithAnotherPolicyIsMeasuredAgainstTheRecord: the Lease records
// `after: 7d`, podjanitor starts with `after: 1m`: the 12 pods an hour old
// are held; a pod due under both goes.
func TestStartWithAnotherPolicyIsMeasuredAgainstTheRecord(t *testing.T) {
	f, pods := startFixture(t, "1m", time.Hour, 12, recordedLease(t, "7d"))
	old := apitest.Pod("old", t0.Add(-8*24*time.Hour), corev1.PodSucceeded, nil)
	if err := f.c.pods.Add(old); err != nil {
		t.Fatal(err)
	}
	f.start(append(pods, old))
	h, held := f.c.waves.Held()
	week, minute := policyJSON(evaluatorWithAfter(t, "7d")), policyJSON(evaluatorWithAfter(t, "1m"))
	if !held || h.Source != wave.SourceStartup || h.Pods != 12 || h.ID != wave.ChangeID(week, minute) {
		t.Fatalf("held %+v, %v; want the start's change from 7d to 1m holding 12 pods", h, held)
	}
	if n := f.deletes(); n != 1 {
		t.Errorf("%d pods removed, want 1 (due under the recorded policy too)", n)
	}
	if got := metricValue(f.metrics, "podjanitor_pods_held", "source", "startup"); got != 12 {
		t.Errorf("podjanitor_pods_held{source=startup} = %v, want 12", got)
	}
}

// TestFirstInstallOnABacklogIsHeld: no policy recorded, 12 pods overdue
// by the policy's rule: the first start is a wave; none of them is removed
// (a pod due by its own ttl is: not in the wave), and none of the policy is
// recorded until it is approved, after which the 12 go and the policy is
// recorded for the next start.
func TestFirstInstallOnABacklogIsHeld(t *testing.T) {
	f, pods := startFixture(t, "1m", time.Hour, 12, nil)
	own := apitest.Pod("own", t0.Add(-time.Hour), corev1.PodSucceeded, map[string]string{"podjanitor.io/ttl": "1m"})
	if err := f.c.pods.Add(own); err != nil {
		t.Fatal(err)
	}
	f.start(append(pods, own))
	h, held := f.c.waves.Held()
	if !held || h.ID != wave.ChangeID(nil, policyJSON(evaluatorWithAfter(t, "1m"))) {
		t.Fatalf("held %+v, %v; want the first install held", h, held)
	}
	if n := f.deletes(); n != 1 {
		t.Fatalf("%d pods removed of a held first install, want 1: the pod due by its own ttl", n)
	}
	ctx, cancel := context.WithCancel(f.ctx)
	done := make(chan struct{})
	go func() { defer close(done); f.c.waves.run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	lease := waitLease(t, f, func(a map[string]string) bool { return a[wave.AnnotationHeld] == h.ID })
	if hash, _ := readStored(t, f.c.opts.Waves.Record).Baseline(); hash != "" {
		t.Errorf("a policy recorded while the first install is held: %v", lease)
	}
	approve(t, f, h.ID)
	if err := wait.PollUntilContextTimeout(f.ctx, time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		f.clock.Step(waveRecordInterval)
		return f.c.queue.Len() >= len(pods), nil
	}); err != nil {
		t.Fatalf("the approval did not decide the held pods again: %d queued", f.c.queue.Len())
	}
	for f.c.queue.Len() > 0 {
		f.next()
	}
	removed := map[string]bool{}
	for _, a := range f.writes() {
		if d, ok := a.(core.DeleteAction); ok && a.GetResource().Resource == "pods" {
			removed[d.GetName()] = true
		}
	}
	if len(removed) != 13 {
		t.Errorf("%d pods removed in all after the approval, want 13", len(removed))
	}
	minute := policyJSON(evaluatorWithAfter(t, "1m"))
	waitRecord(t, f, func(s wave.Stored) bool {
		hash, baseline := s.Baseline()
		id, _ := s.Held()
		return hash == wave.BaselineHash(minute) && string(baseline) == string(minute) && id == ""
	})
}

// TestFirstInstallOnACleanClusterIsNotHeld: no policy recorded, no pod
// due: nothing held, and the policy is recorded for the next start.
func TestFirstInstallOnACleanClusterIsNotHeld(t *testing.T) {
	f, pods := startFixture(t, "7d", time.Hour, 12, nil)
	f.start(pods)
	if _, held := f.c.waves.Held(); held {
		t.Fatal("a first install with no pod due is held")
	}
	ctx, cancel := context.WithCancel(f.ctx)
	done := make(chan struct{})
	go func() { defer close(done); f.c.waves.run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	week := policyJSON(evaluatorWithAfter(t, "7d"))
	waitRecord(t, f, func(s wave.Stored) bool {
		hash, _ := s.Baseline()
		return hash == wave.BaselineHash(week)
	})
}

// TestPlanMarksAFirstInstallsPods: a held first install (no policy
// recorded) holds every pod due by a rule, not those due by their own
// annotations, and plan says so.
func TestPlanMarksAFirstInstallsPods(t *testing.T) {
	minute := evaluatorWithAfter(t, "1m")
	young := apitest.Pod("young", t0.Add(-time.Hour), corev1.PodSucceeded, nil)
	old := apitest.Pod("old", t0.Add(-8*24*time.Hour), corev1.PodSucceeded, nil)
	own := apitest.Pod("own", t0.Add(-time.Hour), corev1.PodSucceeded, map[string]string{"podjanitor.io/ttl": "1m"})
	pods := []*corev1.Pod{young, old, own}
	namespaces := map[string]*policy.Namespace{young.Namespace: {}}
	id := wave.ChangeID(nil, policyJSON(minute))
	client := fake.NewClientset(&coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "podjanitor", Name: "podjanitor",
		Annotations: map[string]string{wave.AnnotationHeld: id, wave.AnnotationHeldPods: "2", wave.AnnotationHeldSource: wave.SourceStartup}}})
	record := wave.Record{Client: client, Namespace: "podjanitor", Name: "podjanitor"}
	r := buildPlan(minute, pods, namespaces, t0)
	if err := markHeld(&r, record, readStored(t, record), minute, decisionScope{}, pods, namespaces, t0); err != nil {
		t.Fatal(err)
	}
	for _, e := range r.Pods {
		if e.Held != (e.Pod != "own") {
			t.Errorf("pod %s HELD %v; want every pod due by a rule held, not the one due by its own ttl", e.Pod, e.Held)
		}
	}
	if r.Hold == nil || r.Hold.Change != id {
		t.Errorf("hold %+v, want %s", r.Hold, id)
	}
}

// namespaceWaveFixture: 12 pods of namespace team-a an hour old under a
// cluster rule `after: 1m`, team-a annotated keep; waves of more than 10
// pods held.
func namespaceWaveFixture(t *testing.T) (*fixture, *corev1.Namespace, []*corev1.Pod) {
	t.Helper()
	return namespaceWaveFixtureWith(t, map[string]string{"podjanitor.io/keep": "true"}, nil)
}

// namespaceWaveFixtureWith is namespaceWaveFixture with team-a annotated
// annotations and the record Lease lease (nil: none).
func namespaceWaveFixtureWith(t *testing.T, annotations map[string]string, lease *coordinationv1.Lease) (*fixture, *corev1.Namespace, []*corev1.Pod) {
	t.Helper()
	var pods []*corev1.Pod
	for i := range 12 {
		p := apitest.Pod(fmt.Sprintf("p%03d", i), t0.Add(-time.Hour), corev1.PodSucceeded, nil)
		p.Namespace = "team-a"
		pods = append(pods, p)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a", UID: "uid-team-a", Annotations: annotations}}
	f := newFixtureWithNamespaces(t, Options{
		Evaluator: evaluatorWithAfter(t, "1m"),
		Waves: &wave.Options{Threshold: wave.Threshold{Pods: 10}, Window: time.Minute,
			Record: wave.Record{Namespace: "podjanitor", Name: "podjanitor"}},
	}, []*corev1.Namespace{ns}, pods...)
	f.c.opts.Waves.Record.Client = f.client
	if lease != nil {
		if _, err := f.client.CoordinationV1().Leases("podjanitor").Create(f.ctx, lease, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	namespacesOf(f.c).Lead() // the leader: it reports holds in Events
	return f, ns, pods
}

func (f *fixture) setNamespaceAnnotations(ns *corev1.Namespace, annotations map[string]string, n int) {
	f.t.Helper()
	ns = ns.DeepCopy()
	ns.ResourceVersion, ns.Annotations = "", annotations
	if _, err := f.client.CoreV1().Namespaces().Update(f.ctx, ns, metav1.UpdateOptions{}); err != nil {
		f.t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(f.ctx, time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		f.clock.Step(time.Second) // the coalesced re-decision's interval, if any
		return f.c.queue.Len() >= n, nil
	}); err != nil {
		f.t.Fatalf("%d keys queued after the namespace's change, want %d", f.c.queue.Len(), n)
	}
	for f.c.queue.Len() > 0 {
		f.next()
	}
}

// TestNamespaceWaveIsHeldUntilApproved: the keep annotation taken off a
// namespace of 12 due pods is a wave: none is removed, a Warning Event on
// the Namespace has the command, podjanitor_pods_held{source="namespace"}
// is 12; the change's ID on the Namespace approves it and the 12 go.
func TestNamespaceWaveIsHeldUntilApproved(t *testing.T) {
	f, ns, pods := namespaceWaveFixture(t)
	f.takeKeepOff(ns, pods)
	if n := f.deletes(); n != 0 {
		t.Fatalf("%d pods removed of a held namespace wave", n)
	}
	h, _, ok := namespacesOf(f.c).Holds().Held("team-a")
	if !ok || h.Pods != 12 || h.Source != wave.SourceNamespace {
		t.Fatalf("held %+v, %v; want 12 pods held", h, ok)
	}
	if got := metricValue(f.metrics, "podjanitor_pods_held", "source", "namespace"); got != 12 {
		t.Errorf("podjanitor_pods_held{source=namespace} = %v, want 12", got)
	}
	command := "kubectl annotate namespace team-a --overwrite podjanitor.io/approve-wave=" + h.ID
	found := false
	for _, e := range f.waitEvents(1) {
		found = found || strings.HasPrefix(e, "Warning RemovalsHeld Hold Holding 12 pod removal(s)") && strings.Contains(e, command)
	}
	if !found {
		t.Error("no RemovalsHeld warning with the approval command")
	}
	f.setNamespaceAnnotations(ns, map[string]string{wave.AnnotationApprove: h.ID}, len(pods))
	if n := f.deletes(); n != 12 {
		t.Errorf("%d pods removed after the approval, want 12", n)
	}
	approved := false
	for _, e := range f.waitEvents(1) {
		approved = approved || strings.HasPrefix(e, "Normal RemovalsApproved Approve Change "+h.ID+" approved: its 12 held pod(s) go")
	}
	if !approved {
		t.Error("no RemovalsApproved event on the Namespace")
	}
}

// TestNamespaceWaveRevertedRemovesNothing: keep taken off, then put back:
// the hold ends, nothing is removed.
func TestNamespaceWaveRevertedRemovesNothing(t *testing.T) {
	f, ns, pods := namespaceWaveFixture(t)
	f.takeKeepOff(ns, pods)
	f.setNamespaceAnnotations(ns, map[string]string{"podjanitor.io/keep": "true"}, len(pods))
	if n := f.deletes(); n != 0 {
		t.Errorf("%d pods removed, want none", n)
	}
	if _, _, ok := namespacesOf(f.c).Holds().Held("team-a"); ok {
		t.Error("held after the revert")
	}
}

// TestDryRunReportsAHeldWaveAsItWouldBe: with --dry-run, a first install on
// a backlog is held as it would be: no WouldRemove for its pods, the hold
// counted; a pod due by its own ttl is reported WouldRemove.
func TestDryRunReportsAHeldWaveAsItWouldBe(t *testing.T) {
	f, pods := startFixtureWith(t, Options{DryRun: true}, "1m", time.Hour, 12, nil)
	own := apitest.Pod("own", t0.Add(-time.Hour), corev1.PodSucceeded, map[string]string{"podjanitor.io/ttl": "1m"})
	if err := f.c.pods.Add(own); err != nil {
		t.Fatal(err)
	}
	f.start(append(pods, own))
	if _, held := f.c.waves.Held(); !held {
		t.Fatal("the dry run's first install on a backlog is not held")
	}
	var would []string
	for _, e := range f.waitEvents(1) {
		if strings.Contains(e, "WouldRemove") {
			would = append(would, e)
		}
	}
	if len(would) != 1 || !strings.Contains(would[0], "(podjanitor.io/ttl)") {
		t.Errorf("WouldRemove events %q, want one, of the pod due by its own ttl", would)
	}
	if got := metricValue(f.metrics, "podjanitor_pods_held", "source", "startup"); got != 12 {
		t.Errorf("podjanitor_pods_held{source=startup} = %v, want 12", got)
	}
	if n := f.deletes(); n != 0 {
		t.Errorf("%d deletes in a dry run", n)
	}
}

// TestStartLeaseReadFailing: the record Lease's read at the start answers
// 500, 503, 429 and a timeout. A few failures are retried, and the start then
// measures against what the Lease records (here the same policy: nothing
// held, the 12 pods go); failures that go on make Run return the error
// before any worker decides, and nothing is removed.
func TestStartLeaseReadFailing(t *testing.T) {
	faults := []error{
		apierrors.NewInternalError(fmt.Errorf("etcd leader changed")),
		apierrors.NewServiceUnavailable("unavailable"),
		apierrors.NewTooManyRequests("slow down", 1),
		apierrors.NewTimeoutError("request timed out", 1),
	}
	failLeaseReads := func(f *fixture, n int) *atomic.Int32 {
		var reads atomic.Int32
		f.client.PrependReactor("get", "leases", func(core.Action) (bool, runtime.Object, error) {
			if i := int(reads.Add(1)); i <= n {
				return true, nil, faults[(i-1)%len(faults)]
			}
			return false, nil, nil
		})
		return &reads
	}

	f, pods := startFixture(t, "1m", time.Hour, 12, recordedLease(t, "1m"))
	reads := failLeaseReads(f, 3)
	f.start(pods)
	if got := reads.Load(); got != 4 {
		t.Errorf("the Lease was read %d times, want 3 failures and the read that passed", got)
	}
	if _, held := f.c.waves.Held(); held {
		t.Error("the same policy is held after the Lease read recovered")
	}
	if n := f.deletes(); n != 12 {
		t.Errorf("%d pods removed, want 12", n)
	}

	f, _ = startFixture(t, "1m", time.Hour, 12, recordedLease(t, "1m"))
	failLeaseReads(f, 1<<30)
	f.c.opts.Waves.StartReadFor = time.Second // tried for a second, not the renew deadline
	f.c.podsSynced = alwaysReady
	ctx, cancel := context.WithTimeout(f.ctx, 30*time.Second)
	defer cancel()
	err := f.c.Run(ctx, 2)
	var status apierrors.APIStatus
	if err == nil || !errors.As(err, &status) || !strings.Contains(err.Error(), "--hold-waves: the policy the last leader acted on") {
		t.Errorf("Run with the Lease unreadable = %v, want the read's error", err)
	}
	if ctx.Err() != nil {
		t.Error("Run did not give up on the Lease read before the test's deadline")
	}
	if n := f.deletes(); n != 0 {
		t.Errorf("%d pods removed with the Lease unreadable, want none", n)
	}
}

// TestApprovalIsUsedOnce: an approval covers one occurrence of a change.
// Approved, the change is carried out and the approval comes off the Lease;
// the file reverted, then changed the same way again, is held again with
// the same ID and removes nothing until approved anew. An approval of a
// change reverted before it was taken comes off too.
func TestApprovalIsUsedOnce(t *testing.T) {
	f, pods := waveFixture(t, 12)
	ctx, cancel := context.WithCancel(f.ctx)
	done := make(chan struct{})
	go func() { defer close(done); f.c.waves.run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	f.reload("1m", pods)
	h, ok := f.c.waves.Held()
	if !ok {
		t.Fatal("the change is not held")
	}
	waitLease(t, f, func(a map[string]string) bool { return a[wave.AnnotationHeld] == h.ID })
	approve(t, f, h.ID)
	waitLease(t, f, func(a map[string]string) bool {
		_, approval := a[wave.AnnotationApprove]
		return a[wave.AnnotationHeld] == "" && !approval
	})
	for f.c.queue.Len() > 0 {
		f.next()
	}
	if n := f.deletes(); n != 12 {
		t.Fatalf("%d pods removed after the approval, want 12", n)
	}

	// The same change again, over 12 new pods: held, the same ID.
	var again []*corev1.Pod
	for i := range 12 {
		p := apitest.Pod(fmt.Sprintf("again-%02d", i), t0.Add(-time.Hour), corev1.PodSucceeded, nil)
		if err := f.c.pods.Add(p); err != nil {
			t.Fatal(err)
		}
		again = append(again, p)
	}
	f.reload("7d", again)
	f.reload("1m", again)
	h2, ok := f.c.waves.Held()
	if !ok || h2.ID != h.ID {
		t.Fatalf("held %+v, %v; want the same change held again as %s", h2, ok, h.ID)
	}
	waitLease(t, f, func(a map[string]string) bool { return a[wave.AnnotationHeld] == h.ID })
	for range 3 {
		f.clock.Step(waveRecordInterval)
		time.Sleep(10 * time.Millisecond)
	}
	if _, still := f.c.waves.Held(); !still || f.deletes() != 12 {
		t.Fatalf("the change made again went on the first approval: held %v, %d removed", still, f.deletes())
	}

	// Approved, then reverted before the approval is taken: the approval
	// comes off with the hold.
	f.reload("7d", again)
	approve(t, f, h.ID)
	waitLease(t, f, func(a map[string]string) bool {
		_, approval := a[wave.AnnotationApprove]
		return a[wave.AnnotationHeld] == "" && !approval
	})

	// An approval left on the Lease while nothing is held (set after the
	// revert) is an earlier occurrence's: the change made again is held,
	// and the approval comes off unused.
	approve(t, f, h.ID)
	f.reload("1m", again)
	waitLease(t, f, func(a map[string]string) bool {
		_, approval := a[wave.AnnotationApprove]
		return a[wave.AnnotationHeld] == h.ID && !approval
	})
	for range 3 {
		f.clock.Step(waveRecordInterval)
		time.Sleep(10 * time.Millisecond)
	}
	if _, still := f.c.waves.Held(); !still || f.deletes() != 12 {
		t.Fatalf("a stale approval released the change: held %v, %d removed", still, f.deletes())
	}
}

// TestTakeoverAfterAnApprovalHoldsNothing: a standby reloaded the policy
// while the leader held it; the leader's approval made `after: 1m` the
// policy acted on, recorded on the Lease, and the leader died while its
// wave drained. The standby takes over: its own measure of the reload
// (in its memory) is replaced by the record, and the pods go.
func TestTakeoverAfterAnApprovalHoldsNothing(t *testing.T) {
	f, pods := startFixture(t, "7d", time.Hour, 12, recordedLease(t, "1m"))
	if err := f.c.SetEvaluator(evaluatorWithAfter(t, "1m")); err != nil {
		t.Fatal(err)
	}
	if _, held := f.c.waves.Held(); !held {
		t.Fatal("the standby's reload is not held before it leads")
	}
	f.start(pods)
	if h, held := f.c.waves.Held(); held {
		t.Fatalf("the approved change is held again after a takeover: %+v", h)
	}
	if n := f.deletes(); n != 12 {
		t.Errorf("%d pods removed, want 12", n)
	}
}

// TestStaleApprovalOnTheLeaseApprovesNoStart: an approval on the Lease of
// a change that no leader held there (left from an earlier occurrence of
// the same change) does not approve the start that makes it again: it
// comes off unused and the pods stay held. One written for the hold the
// last leader recorded on the Lease approves it.
func TestStaleApprovalOnTheLeaseApprovesNoStart(t *testing.T) {
	id := wave.ChangeID(policyJSON(evaluatorWithAfter(t, "7d")), policyJSON(evaluatorWithAfter(t, "1m")))
	for _, tc := range []struct {
		name     string
		recorded string // the hold the last leader recorded
		wantHeld bool
		wantGone int
	}{
		{name: "stale", recorded: "", wantHeld: true, wantGone: 0},
		{name: "for the recorded hold", recorded: id, wantHeld: false, wantGone: 12},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lease := recordedLease(t, "7d")
			lease.Annotations[wave.AnnotationApprove] = id
			if tc.recorded != "" {
				lease.Annotations[wave.AnnotationHeld] = tc.recorded
			}
			f, pods := startFixture(t, "1m", time.Hour, 12, lease)
			f.start(pods)
			ctx, cancel := context.WithCancel(f.ctx)
			done := make(chan struct{})
			go func() { defer close(done); f.c.waves.run(ctx) }()
			t.Cleanup(func() { cancel(); <-done })
			waitLease(t, f, func(a map[string]string) bool {
				_, approval := a[wave.AnnotationApprove]
				return !approval
			})
			for f.c.queue.Len() > 0 {
				f.next()
			}
			if _, held := f.c.waves.Held(); held != tc.wantHeld {
				t.Errorf("held %v, want %v", held, tc.wantHeld)
			}
			if n := f.deletes(); n != tc.wantGone {
				t.Errorf("%d pods removed, want %d", n, tc.wantGone)
			}
		})
	}
}
