package main

import (
	"context"
	"fmt"
	"maps"
	"strings"
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
	"github.com/podjanitor/podjanitor/internal/namespacecontroller"
	"github.com/podjanitor/podjanitor/internal/wave"
	"github.com/podjanitor/podjanitor/policy"
)

// takeKeepOff decides team-a's pods, then takes its keep annotation off:
// a wave of 12, held.
func (f *fixture) takeKeepOff(ns *corev1.Namespace, pods []*corev1.Pod) {
	f.t.Helper()
	for _, p := range pods {
		f.process(keyOf(p))
	}
	f.setNamespaceAnnotations(ns, nil, len(pods))
}

// publishedLease records the held namespace changes as the leader does and
// returns the record Lease.
func (f *fixture) publishedLease() *coordinationv1.Lease {
	f.t.Helper()
	namespacesOf(f.c).Publish(f.ctx)
	l, err := f.client.CoordinationV1().Leases("podjanitor").Get(f.ctx, "podjanitor", metav1.GetOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	return l
}

// heldNamespacesRecorded records the held namespace changes as the leader
// does and returns the record's value of them ("" for none).
func (f *fixture) heldNamespacesRecorded() string {
	f.t.Helper()
	namespacesOf(f.c).Publish(f.ctx)
	return f.recordedKey(wave.KeyHeldNamespaces)
}

// recordedKey is the record ConfigMap's key ("" for none, or "{}").
func (f *fixture) recordedKey(key string) string {
	f.t.Helper()
	cm, err := f.client.CoreV1().ConfigMaps("podjanitor").Get(f.ctx, wave.RecordName("podjanitor"), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return ""
	}
	if err != nil {
		f.t.Fatal(err)
	}
	if v := cm.Data[key]; v != "{}" {
		return v
	}
	return ""
}

// heldNamespaceRecord holds team-a's keep taken off in a first podjanitor,
// records it as the leader does, and returns the record Lease a restart
// finds (with the policy acted on, as the leader records it too) and the
// held change.
func heldNamespaceRecord(t *testing.T) (*coordinationv1.Lease, wave.Hold) {
	t.Helper()
	f, ns, pods := namespaceWaveFixture(t)
	f.takeKeepOff(ns, pods)
	h, _, ok := namespacesOf(f.c).Holds().Held("team-a")
	if !ok {
		t.Fatal("the namespace's change is not held")
	}
	v := f.heldNamespacesRecorded()
	if !strings.Contains(v, h.ID) {
		t.Fatalf("recorded %q, want the change %s", v, h.ID)
	}
	// As podjanitor 0.8 recorded it, on the Lease: a restart reads it there.
	lease := recordedLease(t, "1m")
	lease.Annotations[wave.AnnotationHeldNamespaces] = v
	return lease, h
}

// TestNamespaceHoldOutlastsARestart: the keep annotation taken off a
// namespace of 12 due pods is held; podjanitor restarts (or another replica
// leads) with the namespace as changed. It holds the change again, by the
// same ID, and removes none of the 12 until the change is approved on the
// Namespace. Without the record, the restart took the changed namespace as
// the one acted on and removed all 12.
func TestNamespaceHoldOutlastsARestart(t *testing.T) {
	lease, h := heldNamespaceRecord(t)
	f, ns, pods := namespaceWaveFixtureWith(t, nil, lease)
	f.start(pods)
	if n := f.deletes(); n != 0 {
		t.Fatalf("%d pods removed after the restart of a held namespace change, want none", n)
	}
	got, _, ok := namespacesOf(f.c).Holds().Held("team-a")
	if !ok || got.ID != h.ID {
		t.Fatalf("held %+v, %v after the restart; want the change %s", got, ok, h.ID)
	}
	if v := metricValue(f.metrics, "podjanitor_pods_held", "source", "namespace"); v != 12 {
		t.Errorf("podjanitor_pods_held{source=namespace} = %v, want 12", v)
	}
	f.setNamespaceAnnotations(ns, map[string]string{wave.AnnotationApprove: h.ID}, len(pods))
	if n := f.deletes(); n != 12 {
		t.Errorf("%d pods removed after the approval, want 12", n)
	}
	if v := f.heldNamespacesRecorded(); v != "" {
		t.Errorf("the approved change is still recorded: %q", v)
	}
}

// TestNamespaceHoldApprovedWhileDown: the change was approved on the
// Namespace while no podjanitor ran: the start takes the approval, and the
// 12 pods go.
func TestNamespaceHoldApprovedWhileDown(t *testing.T) {
	lease, h := heldNamespaceRecord(t)
	f, _, pods := namespaceWaveFixtureWith(t, map[string]string{wave.AnnotationApprove: h.ID}, lease)
	f.start(pods)
	for f.c.queue.Len() > 0 {
		f.next()
	}
	if n := f.deletes(); n != 12 {
		t.Errorf("%d pods removed, want the 12 the approval lets go", n)
	}
	if _, _, ok := namespacesOf(f.c).Holds().Held("team-a"); ok {
		t.Error("still held after its approval")
	}
}

// TestNamespaceHoldRevertedWhileDown: keep put back while no podjanitor ran:
// nothing is held, nothing removed, and the record is cleared.
func TestNamespaceHoldRevertedWhileDown(t *testing.T) {
	lease, _ := heldNamespaceRecord(t)
	f, _, pods := namespaceWaveFixtureWith(t, map[string]string{"podjanitor.io/keep": "true"}, lease)
	f.start(pods)
	if n := f.deletes(); n != 0 {
		t.Errorf("%d pods removed of a kept namespace", n)
	}
	if _, _, ok := namespacesOf(f.c).Holds().Held("team-a"); ok {
		t.Error("held after the revert")
	}
	if v := f.heldNamespacesRecorded(); v != "" {
		t.Errorf("the reverted change is still recorded: %q", v)
	}
	l := f.publishedLease()
	if want := recordedLease(t, "1m").Annotations; !maps.Equal(l.Annotations, want) {
		t.Errorf("the Lease's other annotations changed: %v, want %v", l.Annotations, want)
	}
}

// TestNamespaceHoldRecordThatDoesNotParse: changes it cannot tell were
// held are not acted on: the start is measured as if nothing was acted on
// (a first install), its rules' wave held, none of its pods removed, and
// the record written anew (never a start that fails again and again).
func TestNamespaceHoldRecordThatDoesNotParse(t *testing.T) {
	lease := recordedLease(t, "1m")
	lease.Annotations[wave.AnnotationHeldNamespaces] = "{not json"
	f, _, pods := namespaceWaveFixtureWith(t, nil, lease)
	f.start(pods)
	if h, held := f.c.waves.Held(); !held || h.Source != wave.SourceStartup || h.Pods != len(pods) {
		t.Fatalf("held %+v, %v; want the start held as a first install over %d pods", h, held, len(pods))
	}
	if n := f.deletes(); n != 0 {
		t.Errorf("%d pods removed", n)
	}
	if v := f.heldNamespacesRecorded(); v != "" {
		t.Errorf("the record that does not parse is still there: %q", v)
	}
	if v, ok := f.publishedLease().Annotations[wave.AnnotationHeldNamespaces]; ok {
		t.Errorf("the record that does not parse is still on the Lease: %q", v)
	}
}

// TestRecordConfigMapThatDoesNotParse: garbage written into the record
// ConfigMap (its held namespace changes, its policy, or a policy that does
// not match its hash) is taken as nothing acted on: the start is measured
// as a first install's, its rules' wave held, none of its pods removed,
// and no start fails on it (no crash loop); what the Lease still carries of
// an earlier version does not count, the ConfigMap's keys do.
func TestRecordConfigMapThatDoesNotParse(t *testing.T) {
	for name, data := range map[string]map[string]string{
		"held namespaces": {wave.KeyHeldNamespaces: "{not json"},
		"policy":          {wave.KeyPolicy: "{rules", wave.KeyPolicyHash: wave.BaselineHash([]byte("{rules"))},
		"policy hash":     {wave.KeyPolicy: `{"Rules":null}`, wave.KeyPolicyHash: "0123"},
	} {
		t.Run(name, func(t *testing.T) {
			f, _, pods := namespaceWaveFixtureWith(t, nil, recordedLease(t, "1m"))
			f.restore(&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "podjanitor", Name: recordName}, Data: data})
			f.start(pods)
			if h, held := f.c.waves.Held(); !held || h.Source != wave.SourceStartup || h.Pods != len(pods) {
				t.Fatalf("held %+v, %v; want the start held as a first install over %d pods", h, held, len(pods))
			}
			if n := f.deletes(); n != 0 {
				t.Errorf("%d pods removed", n)
			}
		})
	}
}

// TestNamespaceHoldEndsWithTheNamespace: a held namespace deleted takes its
// hold and its record with it.
func TestNamespaceHoldEndsWithTheNamespace(t *testing.T) {
	f, ns, pods := namespaceWaveFixture(t)
	f.takeKeepOff(ns, pods)
	f.heldNamespacesRecorded()
	if err := f.client.CoreV1().Namespaces().Delete(f.ctx, ns.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(f.ctx, time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		_, _, held := namespacesOf(f.c).Holds().Held("team-a")
		return !held, nil
	}); err != nil {
		t.Fatal("the deleted namespace's change is still held")
	}
	if v := f.heldNamespacesRecorded(); v != "" {
		t.Errorf("the deleted namespace's change is still recorded: %q", v)
	}
}

// TestPlanMarksHeldNamespacePods: plan marks HELD the due pods of a
// namespace whose change the Lease records as held (due with the namespace
// as it is, not as it was), not another namespace's, and prints the
// approval command; once the Namespace carries the approval, nothing is
// held.
func TestPlanMarksHeldNamespacePods(t *testing.T) {
	minute := evaluatorWithAfter(t, "1m")
	held := apitest.Pod("held", t0.Add(-time.Hour), corev1.PodSucceeded, nil)
	held.Namespace = "team-a"
	other := apitest.Pod("other", t0.Add(-time.Hour), corev1.PodSucceeded, nil)
	other.Namespace = "team-b"
	pods := []*corev1.Pod{held, other}
	before := []byte(`{"annotations":{"podjanitor.io/keep":"true"},"labels":null,"namespace":"team-a"}`)
	id := wave.ChangeID(before, []byte(`{"annotations":null,"labels":null,"namespace":"team-a"}`))
	record := fmt.Sprintf(`{"team-a":{"change":%q,"pods":12,"before":%s}}`, id, before)
	client := fake.NewClientset(&coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "podjanitor", Name: "podjanitor",
		Annotations: map[string]string{wave.AnnotationHeldNamespaces: record}}})
	lease := wave.Record{Client: client, Namespace: "podjanitor", Name: "podjanitor"}

	namespaces := map[string]*policy.Namespace{"team-a": {}, "team-b": {}}
	r := buildPlan(minute, pods, namespaces, t0)
	markNamespaceHeld(&r, readStored(t, lease), minute, pods, namespaces, t0)
	marks := map[string]string{}
	for _, e := range r.Pods {
		if e.Held {
			marks[e.Pod] = e.HeldChange
		}
	}
	if marks["held"] != id || len(marks) != 1 {
		t.Fatalf("held %v, want team-a's pod held by %s alone", marks, id)
	}
	var out strings.Builder
	if err := printPlan(&out, r); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"HELD " + id, "kubectl annotate namespace team-a --overwrite podjanitor.io/approve-wave=" + id} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("plan does not print %q:\n%s", want, out.String())
		}
	}

	namespaces["team-a"] = &policy.Namespace{Annotations: map[string]string{wave.AnnotationApprove: id}}
	r = buildPlan(minute, pods, namespaces, t0)
	markNamespaceHeld(&r, readStored(t, lease), minute, pods, namespaces, t0)
	for _, e := range r.Pods {
		if e.Held {
			t.Errorf("pod %s HELD after the change's approval", e.Pod)
		}
	}
}

// TestNamespaceHoldIsRecordedAtOnce: a new hold is written to the Lease as
// soon as it starts, not at the record's next tick (the fake clock never
// ticks here), so that a crash right after it loses nothing.
func TestNamespaceHoldIsRecordedAtOnce(t *testing.T) {
	f, ns, pods := namespaceWaveFixture(t)
	for _, p := range pods {
		f.process(keyOf(p))
	}
	ctx, cancel := context.WithCancel(f.ctx)
	done := make(chan struct{})
	go func() { defer close(done); namespacesOf(f.c).RunRecord(ctx) }()
	defer func() { cancel(); <-done }()
	time.Sleep(100 * time.Millisecond) // its first look, with nothing held, is done
	changed := ns.DeepCopy()
	changed.Annotations = nil
	namespacesOf(f.c).Measure(&ns.ObjectMeta, &changed.ObjectMeta) // as the namespace informer's update does
	h, _, ok := namespacesOf(f.c).Holds().Held("team-a")
	if !ok {
		t.Fatal("the namespace's change is not held")
	}
	if err := wait.PollUntilContextTimeout(f.ctx, 5*time.Millisecond, 5*time.Second, true, func(ctx context.Context) (bool, error) {
		return strings.Contains(f.recordedKey(wave.KeyHeldNamespaces), h.ID), nil
	}); err != nil {
		t.Fatal("the hold is not recorded 5 s after it started, with no tick of the record's clock")
	}
}

// TestNamespaceHoldRecordWritesAreBounded: a namespace whose keep flaps on
// and off 50 times (a hold, a revert, each a change of the record) costs
// the Lease at most namespacecontroller.RecordBurst writes while no time passes, not
// one per flap; the last state is written at the next look once time has
// passed.
func TestNamespaceHoldRecordWritesAreBounded(t *testing.T) {
	f, ns, pods := namespaceWaveFixture(t)
	for _, p := range pods {
		f.process(keyOf(p))
	}
	kept, changed := ns.DeepCopy(), ns.DeepCopy()
	changed.Annotations = nil
	for range 50 {
		namespacesOf(f.c).Measure(&kept.ObjectMeta, &changed.ObjectMeta)
		namespacesOf(f.c).Publish(f.ctx)
		namespacesOf(f.c).Measure(&changed.ObjectMeta, &kept.ObjectMeta)
		namespacesOf(f.c).Publish(f.ctx)
	}
	writes := 0
	for _, a := range f.client.Actions() {
		if a.GetResource().Resource == "configmaps" && (a.GetVerb() == "update" || a.GetVerb() == "create") {
			writes++
		}
	}
	if writes > namespacecontroller.RecordBurst {
		t.Errorf("%d record writes for 100 flaps with no time passing, want at most %d", writes, namespacecontroller.RecordBurst)
	}
	namespacesOf(f.c).Measure(&kept.ObjectMeta, &changed.ObjectMeta) // held at last
	f.clock.Step(time.Second)
	if v := f.heldNamespacesRecorded(); !strings.Contains(v, "team-a") {
		t.Errorf("the last hold is not recorded a second later: %q", v)
	}
}

// readStored is the record as plan reads it.
func readStored(t *testing.T, r wave.Record) wave.Stored {
	t.Helper()
	s, err := r.Read(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestNamespaceHoldRecordWriteFailing: the Lease's update answers 500, 503,
// 429 and a timeout: nothing is removed meanwhile (the hold is in memory),
// the write is made again at each later look, and lands once the API server
// takes it; a 409 is retried at once (RetryOnConflict).
func TestNamespaceHoldRecordWriteFailing(t *testing.T) {
	f, ns, pods := namespaceWaveFixture(t)
	faults := []error{
		apierrors.NewInternalError(fmt.Errorf("etcd leader changed")),
		apierrors.NewServiceUnavailable("unavailable"),
		apierrors.NewTooManyRequests("slow down", 1),
		apierrors.NewTimeoutError("request timed out", 1),
		apierrors.NewConflict(coordinationv1.Resource("leases"), "podjanitor", fmt.Errorf("changed")),
	}
	var writes int
	f.client.PrependReactor("create", "leases", func(core.Action) (bool, runtime.Object, error) {
		if writes++; writes <= len(faults) {
			return true, nil, faults[writes-1]
		}
		return false, nil, nil
	})
	f.takeKeepOff(ns, pods)
	for range len(faults) - 1 { // the conflict is retried within the last look
		f.clock.Step(time.Second) // the write budget refills
		namespacesOf(f.c).Publish(f.ctx)
		if _, err := f.client.CoordinationV1().Leases("podjanitor").Get(f.ctx, "podjanitor", metav1.GetOptions{}); err == nil {
			t.Fatal("the record was written while the API server refused it")
		}
	}
	if n := f.deletes(); n != 0 {
		t.Fatalf("%d pods removed while the record could not be written", n)
	}
	f.clock.Step(time.Second)
	if v := f.heldNamespacesRecorded(); !strings.Contains(v, "team-a") {
		t.Errorf("the hold is not recorded once the API server takes the write: %q", v)
	}
}

// TestNamespaceChangeMeasuredAgainstTheRulesActedOn: a reload from 7d to
// 1m is held (team-b's 12 pods); then team-a's keep comes off. Under the
// rules acted on (7d) that brings none of team-a's 12 pods forward: the
// namespace's change is not held on its own, and its pods, due only by the
// held 1m, wait in the reload's hold, which one approval on the Lease ends
// for all 24. Before, the namespace's change was measured by the held rules
// and held too: two approvals, each of which let none of them go.
func TestNamespaceChangeMeasuredAgainstTheRulesActedOn(t *testing.T) {
	a := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a", UID: "uid-team-a", Annotations: map[string]string{"podjanitor.io/keep": "true"}}}
	b := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-b", UID: "uid-team-b"}}
	var pods []*corev1.Pod
	for _, ns := range []string{"team-a", "team-b"} {
		for i := range 12 {
			p := apitest.Pod(fmt.Sprintf("p%03d", i), t0.Add(-time.Hour), corev1.PodSucceeded, nil)
			p.Namespace = ns
			pods = append(pods, p)
		}
	}
	f := newFixtureWithNamespaces(t, Options{
		Evaluator: evaluatorWithAfter(t, "7d"),
		Waves: &wave.Options{Threshold: wave.Threshold{Pods: 10}, Window: time.Minute,
			Record: wave.Record{Namespace: "podjanitor", Name: "podjanitor"}},
	}, []*corev1.Namespace{a, b}, pods...)
	f.c.opts.Waves.Record.Client = f.client
	namespacesOf(f.c).Lead()
	for _, p := range pods {
		f.process(keyOf(p))
	}
	f.reload("1m", pods)
	h, held := f.c.waves.Held()
	if !held || h.Pods != 12 {
		t.Fatalf("reload held %+v, %v; want team-b's 12 pods", h, held)
	}
	f.setNamespaceAnnotations(a, nil, 12)
	if hn, _, ok := namespacesOf(f.c).Holds().Held("team-a"); ok {
		t.Errorf("team-a's change held on its own (%+v), though under the rules acted on it brings nothing forward", hn)
	}
	if n := f.deletes(); n != 0 {
		t.Fatalf("%d pods removed while the reload is held, want none", n)
	}
	ctx, cancel := context.WithCancel(f.ctx)
	done := make(chan struct{})
	go func() { defer close(done); f.c.waves.run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	waitLease(t, f, func(a map[string]string) bool { return a[wave.AnnotationHeld] == h.ID })
	approve(t, f, h.ID)
	if err := wait.PollUntilContextTimeout(f.ctx, time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		f.clock.Step(waveRecordInterval)
		return f.c.queue.Len() > 0, nil
	}); err != nil {
		t.Fatal("the approval decided nothing again")
	}
	time.Sleep(50 * time.Millisecond) // the rest of the approved keys
	for f.c.queue.Len() > 0 {
		f.next()
	}
	if n := f.deletes(); n != 24 {
		t.Errorf("%d pods removed after the reload's approval, want all 24", n)
	}
}
