package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/podjanitor/podjanitor/internal/tenant"
	"github.com/podjanitor/podjanitor/internal/wave"
	v1alpha1 "github.com/podjanitor/podjanitor/pkg/apis/podjanitor/v1alpha1"
	pjfake "github.com/podjanitor/podjanitor/pkg/generated/clientset/versioned/fake"
	"github.com/podjanitor/podjanitor/policy"
)

// keepLongRule keeps every pod of its namespace 30 days, where the cluster's
// rule (tenantDeletionFixture) removes them after an hour.
var keepLongRule = v1alpha1.PodLifetimeRule{Name: "keep-long", Clock: "created", After: "720h"}

// tenantDeletionFixture: n Pending pods of team-a created 2 h before t0, a
// cluster rule that removes every pod an hour old (so all n are due but for
// a tenant rule), tenant policies honoured, waves of more than 10 pods held,
// the leader. setup seeds the tenant policies (a restart).
func tenantDeletionFixture(t *testing.T, n int, opts Options, setup ...func(*pjfake.Clientset)) (*tenantFixture, []*corev1.Pod) {
	t.Helper()
	p, err := policy.Parse([]byte("apiVersion: podjanitor.io/v1alpha1\nkind: PodJanitorPolicy\nrules:\n- name: max-age\n  clock: created\n  after: 1h\n"))
	if err != nil {
		t.Fatal(err)
	}
	var pods []*corev1.Pod
	for i := range n {
		pods = append(pods, tenantPod(fmt.Sprintf("p%03d", i), "team-a", t0.Add(-2*time.Hour), nil))
	}
	opts.Evaluator = &policy.Evaluator{Policy: p}
	f := newTenantFixtureWith(t, opts, policy.Restrictions{}, nil, pods, setup...)
	f.c.running.Store(true)
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

// waitPolicy waits, stepping the clock past the status interval, until the
// policy as the API server has it satisfies ok.
func (f *tenantFixture) waitPolicy(namespace, name, what string, ok func(*v1alpha1.PodLifetimePolicy) bool) {
	f.t.Helper()
	if err := wait.PollUntilContextTimeout(f.ctx, time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		f.clock.Step(time.Second) // the namespace's pass; the status writer's interval
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
	return p != nil && slices.Contains(p.Finalizers, tenant.Finalizer)
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
	h, object, ok := f.c.tenantWaves.Held("team-a")
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

// TestTenantPolicyDeletionUnderTheThresholdGoes: the deletion of a policy
// that keeps 5 pods (fewer than the 10 a wave needs) is not held: podjanitor
// takes its finalizer off at once and the 5 go by the cluster's rule.
func TestTenantPolicyDeletionUnderTheThresholdGoes(t *testing.T) {
	f, pods := tenantDeletionFixture(t, 5, holdingWaves())
	if _, err := f.pj.PodjanitorV1alpha1().PodLifetimePolicies("team-a").Create(f.ctx, lifetimePolicy("team-a", "keep-long", keepLongRule), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitPolicy("team-a", "keep-long", "given podjanitor's finalizer", hasWaveGuard)
	f.deletePolicy("team-a", "keep-long")
	f.waitPolicy("team-a", "keep-long", "without the finalizer", func(p *v1alpha1.PodLifetimePolicy) bool { return !hasWaveGuard(p) })
	f.finalize("team-a", "keep-long")
	f.waitQueued(1)
	f.settle()
	if _, _, ok := f.c.tenantWaves.Held("team-a"); ok {
		t.Error("a deletion under the threshold is held")
	}
	if n := len(f.podWrites()); n != len(pods) {
		t.Errorf("%d pods removed, want %d", n, len(pods))
	}
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
	h, _, ok := first.c.tenantWaves.Held("team-a")
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
	got, object, ok := f.c.tenantWaves.Held("team-a")
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
	f.c.running.Store(true)
	if _, err := f.pj.PodjanitorV1alpha1().PodLifetimePolicies("team-a").Create(f.ctx, lifetimePolicy("team-a", "keep-long", keepLongRule), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitPolicy("team-a", "keep-long", "given podjanitor's finalizer", hasWaveGuard)
	f.deletePolicy("team-a", "keep-long")
	f.settle()
	if _, _, ok := f.c.tenantWaves.Held("team-a"); !ok {
		t.Fatal("the deletion is not held")
	}
	deleted := ns.DeepCopy()
	now := metav1.NewTime(f.clock.Now())
	deleted.DeletionTimestamp = &now
	if _, err := f.client.CoreV1().Namespaces().Update(f.ctx, deleted, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitPolicy("team-a", "keep-long", "without the finalizer in a namespace being deleted", func(p *v1alpha1.PodLifetimePolicy) bool { return !hasWaveGuard(p) })
	if _, _, ok := f.c.tenantWaves.Held("team-a"); ok {
		t.Error("still held in a namespace being deleted")
	}
}

// TestTenantFinalizerOnlyWithHeldWaves: without --hold-waves no deletion is
// held, so podjanitor takes its finalizer off a policy that has it (an
// earlier run's) and puts it on none; in a dry run it puts it on none.
func TestTenantFinalizerOnlyWithHeldWaves(t *testing.T) {
	withGuard := lifetimePolicy("team-a", "old", keepLongRule)
	withGuard.Finalizers = []string{"example.com/gitops", tenant.Finalizer}
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
	dry, _ := tenantDeletionFixture(t, 2, opts)
	if _, err := dry.pj.PodjanitorV1alpha1().PodLifetimePolicies("team-a").Create(dry.ctx, lifetimePolicy("team-a", "new", keepLongRule), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	dry.waitStatusWrites(1)
	dry.settle()
	if hasWaveGuard(dry.policyNow("team-a", "new")) {
		t.Error("the finalizer is put on in a dry run")
	}
}
