package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	core "k8s.io/client-go/testing"

	"github.com/podjanitor/podjanitor/internal/tenant"
	"github.com/podjanitor/podjanitor/internal/tenantcontroller"
	"github.com/podjanitor/podjanitor/internal/wave"
	v1alpha1 "github.com/podjanitor/podjanitor/pkg/apis/podjanitor/v1alpha1"
	pjfake "github.com/podjanitor/podjanitor/pkg/generated/clientset/versioned/fake"
	"github.com/podjanitor/podjanitor/policy"
)

// testFinalizer is the fixtures' podjanitor's finalizer (the default Lease's).
var testFinalizer = tenant.FinalizerFor("podjanitor", "podjanitor")

// keepLongRule keeps every pod of its namespace 30 days, where the cluster's
// rule (tenantDeletionFixture) removes them after an hour.
var keepLongRule = v1alpha1.PodLifetimeRule{Name: "keep-long", Clock: "created", After: "720h"}

// tenantDeletionFixture: n Pending pods of team-a created 2 h before t0, a
// cluster rule that removes every pod an hour old (so all n are due but for
// a tenant rule), tenant policies honoured, waves of more than 10 pods held,
// the leader. setup seeds the tenant policies (a restart).
func tenantDeletionFixture(t *testing.T, n int, opts Options, setup ...func(*pjfake.Clientset)) (*tenantFixture, []*corev1.Pod) {
	t.Helper()
	return tenantDeletionFixtureWith(t, teamPods(n, t0.Add(-2*time.Hour)), opts, setup...)
}

// teamPods are n Pending pods of team-a created at created.
func teamPods(n int, created time.Time) []*corev1.Pod {
	var pods []*corev1.Pod
	for i := range n {
		pods = append(pods, tenantPod(fmt.Sprintf("p%03d", i), "team-a", created, nil))
	}
	return pods
}

// tenantDeletionFixtureWith is tenantDeletionFixture with pods.
func tenantDeletionFixtureWith(t *testing.T, pods []*corev1.Pod, opts Options, setup ...func(*pjfake.Clientset)) (*tenantFixture, []*corev1.Pod) {
	t.Helper()
	p, err := policy.Parse([]byte("apiVersion: podjanitor.io/v1alpha1\nkind: PodJanitorPolicy\nrules:\n- name: max-age\n  clock: created\n  after: 1h\n"))
	if err != nil {
		t.Fatal(err)
	}
	opts.Evaluator = &policy.Evaluator{Policy: p}
	f := newTenantFixtureWith(t, opts, policy.Restrictions{}, nil, pods, setup...)
	namespacesOf(f.c).Lead()
	return f, pods
}

// holdingWaves are the options that hold waves of more than 10 pods.
func holdingWaves() Options {
	return Options{Waves: &wave.Options{Threshold: wave.Threshold{Pods: 10}, Window: time.Minute}}
}

// policyNow reads the policy from the fake API server (nil: gone).
func (f *tenantFixture) policyNow(namespace, name string) *v1alpha1.PodLifetimePolicy {
	f.t.Helper()
	p, err := f.pj.PodjanitorV1alpha1().PodLifetimePolicies(namespace).Get(f.ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	} else if err != nil {
		f.t.Fatal(err)
	}
	return p
}

// waitPolicy waits, stepping the clock past the status interval and
// deciding the pods queued, until the policy as the API server has it
// satisfies ok.
func (f *tenantFixture) waitPolicy(namespace, name, what string, ok func(*v1alpha1.PodLifetimePolicy) bool) {
	f.t.Helper()
	if err := wait.PollUntilContextTimeout(f.ctx, time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		f.clock.Step(time.Second) // the namespace's pass; the status writer's interval
		f.drain()                 // the pods it queued, decided
		return ok(f.policyNow(namespace, name)), nil
	}); err != nil {
		f.t.Fatalf("policy %s/%s: never %s (now %+v)", namespace, name, what, f.policyNow(namespace, name))
	}
}

// deletePolicy deletes the policy as the API server does: one with
// finalizers gets a deletion timestamp and its generation bumped, and stays;
// one without goes.
func (f *tenantFixture) deletePolicy(namespace, name string) {
	f.t.Helper()
	policies := f.pj.PodjanitorV1alpha1().PodLifetimePolicies(namespace)
	p := f.policyNow(namespace, name)
	if len(p.Finalizers) == 0 {
		if err := policies.Delete(f.ctx, name, metav1.DeleteOptions{}); err != nil {
			f.t.Fatal(err)
		}
		return
	}
	now := metav1.NewTime(f.clock.Now())
	p.DeletionTimestamp, p.Generation = &now, p.Generation+1
	if _, err := policies.Update(f.ctx, p, metav1.UpdateOptions{}); err != nil {
		f.t.Fatal(err)
	}
}

// finalize completes the deletion of a policy whose finalizers are all
// gone, as the API server does.
func (f *tenantFixture) finalize(namespace, name string) {
	f.t.Helper()
	if p := f.policyNow(namespace, name); p != nil && p.DeletionTimestamp != nil && len(p.Finalizers) == 0 {
		if err := f.pj.PodjanitorV1alpha1().PodLifetimePolicies(namespace).Delete(f.ctx, name, metav1.DeleteOptions{}); err != nil {
			f.t.Fatal(err)
		}
	}
}

func hasWaveGuard(p *v1alpha1.PodLifetimePolicy) bool {
	return p != nil && slices.Contains(p.Finalizers, testFinalizer)
}

// settle runs the namespace's passes and decides what they queue.
func (f *tenantFixture) settle() {
	f.t.Helper()
	for range 5 {
		f.clock.Step(time.Second)
		time.Sleep(20 * time.Millisecond)
		f.drain()
	}
}

// TestTenantPolicyDeletionIsHeld: a tenant policy that keeps 12 pods of
// team-a 30 days, where the cluster's rule removes them after an hour, is
// deleted. Its deletion makes all 12 due at once: it is held. podjanitor's
// finalizer keeps the policy, none of the 12 is removed, its Ready condition
// says RemovalsHeld with the approval command, a Warning Event has it, and
// podjanitor_pods_held{source="tenant"} is 12. The approval on the policy
// lets the policy go (the finalizer off) and the 12 pods with it. Without
// the finalizer the API server deletes the policy at once, and the 12 go.
func TestTenantPolicyDeletionIsHeld(t *testing.T) {
	f, pods := tenantDeletionFixture(t, 12, holdingWaves())
	if _, err := f.pj.PodjanitorV1alpha1().PodLifetimePolicies("team-a").Create(f.ctx, lifetimePolicy("team-a", "keep-long", keepLongRule), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitPolicy("team-a", "keep-long", "given podjanitor's finalizer", hasWaveGuard)
	f.settle()
	if n := len(f.podWrites()); n != 0 {
		t.Fatalf("%d pods removed while the policy keeps them", n)
	}

	f.deletePolicy("team-a", "keep-long")
	f.settle()
	if n := len(f.podWrites()); n != 0 {
		t.Fatalf("%d of 12 pods removed after the deletion of the policy that kept them, want none: it is held", n)
	}
	h, object, ok := tenantsOf(f.c).Holds().Held("team-a")
	if !ok || h.Pods != 12 || object != "team-a/keep-long" {
		t.Fatalf("held %+v by %q, %v; want 12 pods held by team-a/keep-long", h, object, ok)
	}
	if got := metricValue(f.metrics, "podjanitor_pods_held", "source", "tenant"); got != 12 {
		t.Errorf("podjanitor_pods_held{source=tenant} = %v, want 12", got)
	}
	command := "kubectl annotate podlifetimepolicy -n team-a keep-long --overwrite podjanitor.io/approve-wave=" + h.ID
	f.waitPolicy("team-a", "keep-long", "Ready=False RemovalsHeld with the command", func(p *v1alpha1.PodLifetimePolicy) bool {
		ready := f.readyOf([]*v1alpha1.PodLifetimePolicy{p})
		return ready != nil && ready.Reason == wave.ReasonRemovalsHeld && strings.Contains(ready.Message, "holds 12 pod removal(s)") &&
			strings.Contains(ready.Message, "deletion") && strings.Contains(ready.Message, command)
	})
	f.waitEvent("Warning RemovalsHeld Hold Holding 12 pod removal(s): the deletion of the PodLifetimePolicy", command)
	if p := f.policyNow("team-a", "keep-long"); !hasWaveGuard(p) {
		t.Fatalf("the finalizer is off a policy whose deletion is held: %+v", p)
	}

	// A wrong ID approves nothing.
	f.annotatePolicy("team-a", "keep-long", "0123456789ab")
	f.settle()
	if n := len(f.podWrites()); n != 0 || !hasWaveGuard(f.policyNow("team-a", "keep-long")) {
		t.Fatalf("a wrong approval: %d pods removed, finalizer %v", n, f.policyNow("team-a", "keep-long").Finalizers)
	}

	f.annotatePolicy("team-a", "keep-long", h.ID)
	f.waitPolicy("team-a", "keep-long", "without the finalizer after the approval", func(p *v1alpha1.PodLifetimePolicy) bool { return !hasWaveGuard(p) })
	f.finalize("team-a", "keep-long")
	f.waitQueued(1)
	f.settle()
	if n := len(f.podWrites()); n != len(pods) {
		t.Errorf("%d pods removed after the approval, want %d", n, len(pods))
	}
	if got := metricValue(f.metrics, "podjanitor_pods_held", "source", "tenant"); got != 0 {
		t.Errorf("podjanitor_pods_held{source=tenant} = %v after the approval, want 0", got)
	}
}

// TestTenantPolicyDeletionUnderTheThresholdGoes: a policy that keeps 12
// pods (so it gets the finalizer: more than the 10 a wave needs), of which
// its deletion makes 3 due at once (the 9 others are due by the cluster's
// rule only in an hour, past the window): not held. podjanitor takes its
// finalizer off at the namespace's next pass, not at the end of the status
// writer's interval, and the 3 go by the cluster's rule.
func TestTenantPolicyDeletionUnderTheThresholdGoes(t *testing.T) {
	pods := append(teamPods(3, t0.Add(-2*time.Hour)), teamPods(12, t0)[3:]...)
	f, _ := tenantDeletionFixtureWith(t, pods, holdingWaves())
	if _, err := f.pj.PodjanitorV1alpha1().PodLifetimePolicies("team-a").Create(f.ctx, lifetimePolicy("team-a", "keep-long", keepLongRule), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitPolicy("team-a", "keep-long", "given podjanitor's finalizer", hasWaveGuard)
	f.deletePolicy("team-a", "keep-long")
	// Within the namespace's pass (1 s here), not at the end of the
	// status interval (10 s) that the finalizer's write began.
	released := false
	for range 4 {
		f.clock.Step(time.Second)
		time.Sleep(100 * time.Millisecond)
		if released = !hasWaveGuard(f.policyNow("team-a", "keep-long")); released {
			break
		}
	}
	if !released {
		t.Fatal("the finalizer is still on 4 s after a deletion that holds nothing")
	}
	f.finalize("team-a", "keep-long")
	f.waitQueued(1)
	f.settle()
	if _, _, ok := tenantsOf(f.c).Holds().Held("team-a"); ok {
		t.Error("a deletion under the threshold is held")
	}
	if n := len(f.podWrites()); n != 3 {
		t.Errorf("%d pods removed, want the 3 an hour old", n)
	}
}

// TestTenantPolicyOfFewPodsGetsNoFinalizer: a policy that gives 5 pods a
// deadline (no more than the 10 a wave needs to be held) gets no finalizer:
// its deletion could hold nothing, so it (and its namespace's deletion)
// never waits for podjanitor. Past 10 pods it gets one.
func TestTenantPolicyOfFewPodsGetsNoFinalizer(t *testing.T) {
	f, pods := tenantDeletionFixture(t, 5, holdingWaves())
	if _, err := f.pj.PodjanitorV1alpha1().PodLifetimePolicies("team-a").Create(f.ctx, lifetimePolicy("team-a", "keep-long", keepLongRule), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitPolicy("team-a", "keep-long", "counting its 5 pods", func(p *v1alpha1.PodLifetimePolicy) bool { return p.Status.PodsWithDeadline == 5 })
	f.settle()
	if p := f.policyNow("team-a", "keep-long"); hasWaveGuard(p) {
		t.Fatalf("a policy of 5 pods has the finalizer: %v", p.Finalizers)
	}
	f.deletePolicy("team-a", "keep-long") // no finalizer: gone at once
	f.waitQueued(1)
	f.settle()
	if n := len(f.podWrites()); n != len(pods) {
		t.Errorf("%d pods removed, want %d", n, len(pods))
	}

	g, _ := tenantDeletionFixture(t, 11, holdingWaves())
	if _, err := g.pj.PodjanitorV1alpha1().PodLifetimePolicies("team-a").Create(g.ctx, lifetimePolicy("team-a", "keep-long", keepLongRule), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	g.waitPolicy("team-a", "keep-long", "given podjanitor's finalizer at 11 pods", hasWaveGuard)
}

// TestTenantPolicyDeletionHeldOutlastsARestart: podjanitor starts (a
// restart, a new leader) with a policy that is being deleted and carries its
// finalizer: the deletion is measured again from the policy's rules, which
// the policy still has, and held by the same change ID; none of the 12 pods
// goes until the approval. Without the measure at the start, the policy is
// taken as gone and the 12 are removed.
func TestTenantPolicyDeletionHeldOutlastsARestart(t *testing.T) {
	// The first leader holds the deletion: its change ID.
	first, _ := tenantDeletionFixture(t, 12, holdingWaves())
	if _, err := first.pj.PodjanitorV1alpha1().PodLifetimePolicies("team-a").Create(first.ctx, lifetimePolicy("team-a", "keep-long", keepLongRule), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	first.waitPolicy("team-a", "keep-long", "given podjanitor's finalizer", hasWaveGuard)
	first.deletePolicy("team-a", "keep-long")
	first.settle()
	h, _, ok := tenantsOf(first.c).Holds().Held("team-a")
	if !ok {
		t.Fatal("the first leader does not hold the deletion")
	}
	deleting := first.policyNow("team-a", "keep-long")

	seed := func(pj *pjfake.Clientset) {
		if err := pj.Tracker().Add(deleting.DeepCopy()); err != nil {
			t.Fatal(err)
		}
	}
	f, pods := tenantDeletionFixture(t, 12, holdingWaves(), seed)
	for _, p := range pods { // every pod is decided once the caches have synced
		f.process(keyOf(p))
	}
	f.settle()
	if n := len(f.podWrites()); n != 0 {
		t.Fatalf("%d pods removed after the restart of a held deletion, want none", n)
	}
	got, object, ok := tenantsOf(f.c).Holds().Held("team-a")
	if !ok || got.ID != h.ID || object != "team-a/keep-long" {
		t.Fatalf("held %+v by %q, %v after the restart; want the change %s by team-a/keep-long", got, object, ok, h.ID)
	}
	if !hasWaveGuard(f.policyNow("team-a", "keep-long")) {
		t.Fatal("the finalizer is off after the restart")
	}
	f.annotatePolicy("team-a", "keep-long", h.ID)
	f.waitPolicy("team-a", "keep-long", "without the finalizer after the approval", func(p *v1alpha1.PodLifetimePolicy) bool { return !hasWaveGuard(p) })
	f.finalize("team-a", "keep-long")
	f.waitQueued(1)
	f.settle()
	if n := len(f.podWrites()); n != len(pods) {
		t.Errorf("%d pods removed after the approval, want %d", n, len(pods))
	}
}

// TestTenantPolicyDeletionInADeletedNamespace: the namespace of a held
// deletion is deleted itself: its pods go with it whatever the policy says,
// so the hold ends and the finalizer comes off (else the namespace's
// deletion would wait for the approval).
func TestTenantPolicyDeletionInADeletedNamespace(t *testing.T) {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a", UID: "uid-team-a"}}
	opts := holdingWaves()
	p, err := policy.Parse([]byte("apiVersion: podjanitor.io/v1alpha1\nkind: PodJanitorPolicy\nrules:\n- name: max-age\n  clock: created\n  after: 1h\n"))
	if err != nil {
		t.Fatal(err)
	}
	opts.Evaluator = &policy.Evaluator{Policy: p}
	var pods []*corev1.Pod
	for i := range 12 {
		pods = append(pods, tenantPod(fmt.Sprintf("p%03d", i), "team-a", t0.Add(-2*time.Hour), nil))
	}
	f := newTenantFixtureWith(t, opts, policy.Restrictions{}, []*corev1.Namespace{ns}, pods)
	namespacesOf(f.c).Lead()
	if _, err := f.pj.PodjanitorV1alpha1().PodLifetimePolicies("team-a").Create(f.ctx, lifetimePolicy("team-a", "keep-long", keepLongRule), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitPolicy("team-a", "keep-long", "given podjanitor's finalizer", hasWaveGuard)
	f.deletePolicy("team-a", "keep-long")
	f.settle()
	if _, _, ok := tenantsOf(f.c).Holds().Held("team-a"); !ok {
		t.Fatal("the deletion is not held")
	}
	deleted := ns.DeepCopy()
	now := metav1.NewTime(f.clock.Now())
	deleted.DeletionTimestamp = &now
	if _, err := f.client.CoreV1().Namespaces().Update(f.ctx, deleted, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitPolicy("team-a", "keep-long", "without the finalizer in a namespace being deleted", func(p *v1alpha1.PodLifetimePolicy) bool { return !hasWaveGuard(p) })
	if _, _, ok := tenantsOf(f.c).Holds().Held("team-a"); ok {
		t.Error("still held in a namespace being deleted")
	}
}

// TestTenantFinalizerOnlyWithHeldWaves: without --hold-waves no deletion is
// held, so podjanitor takes its finalizer off a policy that has it (an
// earlier run's) and puts it on none; in a dry run it puts it on none.
func TestTenantFinalizerOnlyWithHeldWaves(t *testing.T) {
	withGuard := lifetimePolicy("team-a", "old", keepLongRule)
	withGuard.Finalizers = []string{"example.com/gitops", testFinalizer}
	seed := func(pj *pjfake.Clientset) {
		if err := pj.Tracker().Add(withGuard.DeepCopy()); err != nil {
			t.Fatal(err)
		}
	}
	f, _ := tenantDeletionFixture(t, 2, Options{}, seed)
	f.waitPolicy("team-a", "old", "without podjanitor's finalizer", func(p *v1alpha1.PodLifetimePolicy) bool { return !hasWaveGuard(p) })
	if got := f.policyNow("team-a", "old").Finalizers; !slices.Equal(got, []string{"example.com/gitops"}) {
		t.Errorf("finalizers %v, want the other one kept", got)
	}
	if _, err := f.pj.PodjanitorV1alpha1().PodLifetimePolicies("team-a").Create(f.ctx, lifetimePolicy("team-a", "new", keepLongRule), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitStatusWrites(2)
	f.settle()
	if hasWaveGuard(f.policyNow("team-a", "new")) {
		t.Error("the finalizer is put on without --hold-waves")
	}

	opts := holdingWaves()
	opts.DryRun = true
	dry, _ := tenantDeletionFixture(t, 12, opts)
	if _, err := dry.pj.PodjanitorV1alpha1().PodLifetimePolicies("team-a").Create(dry.ctx, lifetimePolicy("team-a", "new", keepLongRule), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	dry.waitStatusWrites(1)
	dry.settle()
	if hasWaveGuard(dry.policyNow("team-a", "new")) {
		t.Error("the finalizer is put on in a dry run")
	}
}

// TestPlanMarksAHeldDeletionsPods: plan lists a policy being deleted as not
// used (Deleting) and, when its status says its deletion is held, marks
// HELD the pods due without its rules and not with them, and prints the
// approval command; a pod of another namespace is not marked.
func TestPlanMarksAHeldDeletionsPods(t *testing.T) {
	deleting := lifetimePolicy("team-a", "keep-long", keepLongRule)
	now := metav1.NewTime(t0)
	deleting.DeletionTimestamp, deleting.Generation, deleting.Finalizers = &now, 2, []string{testFinalizer}
	deleting.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse, ObservedGeneration: 2,
		Reason: wave.ReasonRemovalsHeld, Message: tenantcontroller.HeldMessage(deleting, wave.Hold{ID: "0123456789ab", Pods: 12}), LastTransitionTime: now}}
	deleting.Status.HeldChange = &v1alpha1.HeldChange{ID: "0123456789ab", Pods: 12}
	pj := pjfake.NewSimpleClientset(deleting)
	tenants, listed, err := listTenantPolicies(context.Background(), pj, scopeFlags{}, policy.Restrictions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(listed) != 1 || listed[0].Used || listed[0].Reason != tenantcontroller.DeletingReason || !listed[0].HeldDeletion || listed[0].Held == nil {
		t.Fatalf("listed %+v; want keep-long not used (Deleting), its deletion held", listed)
	}
	p, err := policy.Parse([]byte("apiVersion: podjanitor.io/v1alpha1\nkind: PodJanitorPolicy\nrules:\n- name: max-age\n  clock: created\n  after: 1h\n"))
	if err != nil {
		t.Fatal(err)
	}
	pods := []*corev1.Pod{tenantPod("old", "team-a", t0.Add(-2*time.Hour), nil), tenantPod("old", "team-b", t0.Add(-2*time.Hour), nil)}
	namespaces := map[string]*policy.Namespace{"team-a": {}, "team-b": {}}
	e := &policy.Evaluator{Policy: p, Tenants: tenants}
	r := buildPlan(e, pods, namespaces, t0)
	r.TenantPolicies = listed
	markTenantHeld(&r, e, pods, namespaces, t0)
	got := map[string]string{}
	for _, p := range r.Pods {
		got[p.Namespace+"/"+p.Pod] = p.HeldChange
	}
	if got["team-a/old"] != "0123456789ab" || got["team-b/old"] != "" {
		t.Errorf("held changes %v; want team-a/old held by the deletion, team-b/old not", got)
	}
	var out strings.Builder
	if err := printPlan(&out, r); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"HELD 0123456789ab", "its deletion (change 0123456789ab)", tenantcontroller.ApproveCommand("team-a", "keep-long", "0123456789ab")} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("plan lacks %q:\n%s", want, out.String())
		}
	}
}

// TestTenantFinalizerStaysUntilTheDeletionIsRead: the informer's cache has
// the policy's deletion before its handler has read it (the cache is updated
// first), and a status write marked earlier comes in between: it must not
// take the finalizer off a deletion not yet measured. Found against the real
// API server, where such a write let a held deletion's 50 pods go.
func TestTenantFinalizerStaysUntilTheDeletionIsRead(t *testing.T) {
	f, _ := tenantDeletionFixture(t, 12, holdingWaves())
	if _, err := f.pj.PodjanitorV1alpha1().PodLifetimePolicies("team-a").Create(f.ctx, lifetimePolicy("team-a", "keep-long", keepLongRule), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitPolicy("team-a", "keep-long", "given podjanitor's finalizer", hasWaveGuard)
	var cached *v1alpha1.PodLifetimePolicy
	if err := wait.PollUntilContextTimeout(f.ctx, time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		cached, _ = tenantsOf(f.c).Lister().PodLifetimePolicies("team-a").Get("keep-long")
		return hasWaveGuard(cached), nil
	}); err != nil {
		t.Fatalf("cached %+v; want the policy with the finalizer", cached)
	}
	deleting := cached.DeepCopy()
	now := metav1.NewTime(f.clock.Now())
	deleting.DeletionTimestamp, deleting.Generation = &now, deleting.Generation+1
	if err := f.policies.Update(deleting); err != nil { // the cache, not the handler
		t.Fatal(err)
	}
	if err := tenantsOf(f.c).WriteStatus(f.ctx, "team-a/keep-long"); err != nil && err != tenant.ErrNotYet {
		t.Fatal(err)
	}
	for _, a := range f.pj.Actions() {
		if a.GetVerb() == "patch" && a.GetSubresource() == "" && a.GetResource().Resource == "podlifetimepolicies" {
			if p, ok := a.(interface{ GetPatch() []byte }); ok && !strings.Contains(string(p.GetPatch()), testFinalizer) {
				t.Fatalf("the finalizer taken off a deletion the handler has not read: %s", p.GetPatch())
			}
		}
	}
	if !hasWaveGuard(f.policyNow("team-a", "keep-long")) {
		t.Fatal("the finalizer is off a deletion the handler has not read")
	}
}

// TestTenantPolicyDeletionHeldByOneOfTwo: two podjanitors (two releases,
// each with its record Lease) use the same policy for 12 pods; the deletion
// makes the 12 due for one (its cluster rule removes them after an hour) and
// none for the other (no cluster rule). Each has its own
// finalizer: the other takes its own off, the first holds the deletion, and
// the policy stays until its approval. With one finalizer for both, the
// other took it off and the policy went with the 12 pods.
func TestTenantPolicyDeletionHeldByOneOfTwo(t *testing.T) {
	f, pods := tenantDeletionFixture(t, 12, holdingWaves())
	// The other has no cluster rule: without the policy the pods have no
	// deadline, so the deletion makes none due.
	other := newTenantFixtureOn(t, holdingWaves(), policy.Restrictions{}, nil, teamPods(12, t0.Add(-2*time.Hour)), f.pj)
	namespacesOf(other.c).Lead()
	tenantsOf(other.c).SetFinalizer("team-b", "podjanitor")
	otherFinalizer := tenant.FinalizerFor("team-b", "podjanitor")
	if otherFinalizer == testFinalizer {
		t.Fatalf("two Leases, one finalizer %s", testFinalizer)
	}
	if _, err := f.pj.PodjanitorV1alpha1().PodLifetimePolicies("team-a").Create(f.ctx, lifetimePolicy("team-a", "keep-long", keepLongRule), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitPolicy("team-a", "keep-long", "given both finalizers", func(p *v1alpha1.PodLifetimePolicy) bool {
		other.clock.Step(time.Second)
		other.drain()
		return hasWaveGuard(p) && slices.Contains(p.Finalizers, otherFinalizer)
	})
	f.deletePolicy("team-a", "keep-long")
	f.waitPolicy("team-a", "keep-long", "without the other's finalizer", func(p *v1alpha1.PodLifetimePolicy) bool {
		other.clock.Step(time.Second)
		other.drain()
		return p != nil && !slices.Contains(p.Finalizers, otherFinalizer)
	})
	f.settle()
	if p := f.policyNow("team-a", "keep-long"); !hasWaveGuard(p) {
		t.Fatalf("the finalizer of the podjanitor that holds the deletion is off: %+v", p)
	}
	if _, _, ok := tenantsOf(f.c).Holds().Held("team-a"); !ok {
		t.Fatal("the deletion is not held")
	}
	if n := len(f.podWrites()); n != 0 {
		t.Errorf("%d of %d pods removed while the deletion is held", n, len(pods))
	}
}

// TestTenantFinalizerRefused: RBAC without patch on podlifetimepolicies (a
// Deployment whose image was upgraded and not its ClusterRole): the first
// refusal is logged and no policy is asked again, rather than one refused
// write per policy every status interval; the policies are used as before.
func TestTenantFinalizerRefused(t *testing.T) {
	refuse := func(pj *pjfake.Clientset) {
		pj.PrependReactor("patch", "podlifetimepolicies", func(a core.Action) (bool, runtime.Object, error) {
			if a.GetSubresource() == "" {
				return true, nil, apierrors.NewForbidden(v1alpha1.Resource("podlifetimepolicies"), "", errors.New("RBAC: patch not allowed"))
			}
			return false, nil, nil
		})
	}
	f, _ := tenantDeletionFixture(t, 12, holdingWaves(), refuse)
	for i := range 3 {
		if _, err := f.pj.PodjanitorV1alpha1().PodLifetimePolicies("team-a").Create(f.ctx, lifetimePolicy("team-a", fmt.Sprintf("p%d", i), keepLongRule), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	f.waitStatusWrites(3)
	for range 30 {
		f.clock.Step(time.Second) // three status intervals
		time.Sleep(5 * time.Millisecond)
		f.drain()
	}
	refused := 0
	for _, a := range f.pj.Actions() {
		if a.GetVerb() == "patch" && a.GetSubresource() == "" {
			refused++
		}
	}
	if refused != 1 {
		t.Errorf("%d finalizer patches refused for 3 policies over 3 status intervals, want 1 (then none asked)", refused)
	}
	if !tenantsOf(f.c).FinalizerRefused() {
		t.Error("the refusal is not remembered")
	}
}
