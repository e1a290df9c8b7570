package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	core "k8s.io/client-go/testing"

	"github.com/podjanitor/podjanitor/internal/redecide"
	"github.com/podjanitor/podjanitor/internal/tenant"
	"github.com/podjanitor/podjanitor/internal/tenantcontroller"
	"github.com/podjanitor/podjanitor/internal/wave"
	v1alpha1 "github.com/podjanitor/podjanitor/pkg/apis/podjanitor/v1alpha1"
	pjfake "github.com/podjanitor/podjanitor/pkg/generated/clientset/versioned/fake"
	"github.com/podjanitor/podjanitor/policy"
)

// tenantWaveFixture: n pods of team-a created 2 h before t0, tenant
// policies honoured, waves of more than 10 pods (or 50 % of a namespace's
// pods, when more than 10) held.
func tenantWaveFixture(t *testing.T, n int) (*tenantFixture, []*corev1.Pod) {
	t.Helper()
	var pods []*corev1.Pod
	for i := range n {
		pods = append(pods, tenantPod(fmt.Sprintf("p%03d", i), "team-a", t0.Add(-2*time.Hour), nil))
	}
	opts := Options{Waves: &wave.Options{Threshold: wave.Threshold{Pods: 10, Percent: 50, MinPods: 10}, Window: time.Minute,
		Record: wave.Record{Namespace: "podjanitor", Name: "podjanitor"}}}
	f := newTenantFixtureWith(t, opts, policy.Restrictions{}, nil, pods)
	f.c.opts.Waves.Record.Client = f.client
	return f, pods
}

// readyOf is the Ready condition of the last status written.
func (f *tenantFixture) readyOf(writes []*v1alpha1.PodLifetimePolicy) *metav1.Condition {
	if len(writes) == 0 {
		return nil
	}
	return meta.FindStatusCondition(writes[len(writes)-1].Status.Conditions, v1alpha1.ConditionReady)
}

// waitEvent waits for an event with prefix that contains each of want.
func (f *tenantFixture) waitEvent(prefix string, want ...string) {
	f.t.Helper()
	var seen []string
	if err := wait.PollUntilContextTimeout(f.ctx, time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		seen = append(seen, f.events()...)
		for _, e := range seen {
			if !strings.HasPrefix(e, prefix) {
				continue
			}
			ok := true
			for _, w := range want {
				ok = ok && strings.Contains(e, w)
			}
			if ok {
				return true, nil
			}
		}
		return false, nil
	}); err != nil {
		f.t.Errorf("no event %q with %q among %q", prefix, want, seen)
	}
}

// editCleanup makes team-a/cleanup's one rule rule, at generation (the
// fake clientset does not count generations).
func (f *tenantFixture) editCleanup(rule v1alpha1.PodLifetimeRule, generation int64) {
	f.t.Helper()
	policies := f.pj.PodjanitorV1alpha1().PodLifetimePolicies("team-a")
	p, err := policies.Get(f.ctx, "cleanup", metav1.GetOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	p.Spec.Rules, p.Generation = []v1alpha1.PodLifetimeRule{rule}, generation
	if _, err := policies.Update(f.ctx, p, metav1.UpdateOptions{}); err != nil {
		f.t.Fatal(err)
	}
}

func (f *tenantFixture) annotatePolicy(namespace, name, id string) {
	f.t.Helper()
	policies := f.pj.PodjanitorV1alpha1().PodLifetimePolicies(namespace)
	p, err := policies.Get(f.ctx, name, metav1.GetOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	if p.Annotations == nil {
		p.Annotations = map[string]string{}
	}
	p.Annotations[wave.AnnotationApprove] = id
	if _, err := policies.Update(f.ctx, p, metav1.UpdateOptions{}); err != nil {
		f.t.Fatal(err)
	}
}

// TestTenantWaveIsHeldUntilApproved: a tenant policy created in a namespace
// of 12 pods that makes all of them due is held: no pod removed, Ready=False
// reason RemovalsHeld with the count, a Warning Event on the policy with the
// approval command, podjanitor_pods_held{source="tenant"}; a wrong ID on the
// policy approves nothing; the change's ID does, and the 12 pods go.
func TestTenantWaveIsHeldUntilApproved(t *testing.T) {
	f, pods := tenantWaveFixture(t, 12)
	if _, err := f.pj.PodjanitorV1alpha1().PodLifetimePolicies("team-a").Create(f.ctx, lifetimePolicy("team-a", "cleanup", maxAgeRule), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitQueued(len(pods))
	f.drain()
	if n := len(f.podWrites()); n != 0 {
		t.Fatalf("%d pod writes of a held wave, want none", n)
	}
	h, object, ok := tenantsOf(f.c).Holds().Held("team-a")
	if !ok || h.Pods != 12 || object != "team-a/cleanup" {
		t.Fatalf("held %+v by %q, %v; want 12 pods held by team-a/cleanup", h, object, ok)
	}
	if got := metricValue(f.metrics, "podjanitor_pods_held", "source", "tenant"); got != 12 {
		t.Errorf("podjanitor_pods_held{source=tenant} = %v, want 12", got)
	}
	command := "kubectl annotate podlifetimepolicy -n team-a cleanup --overwrite podjanitor.io/approve-wave=" + h.ID
	ready := f.readyOf(f.waitStatusWrites(1))
	if ready == nil || ready.Status != metav1.ConditionFalse || ready.Reason != wave.ReasonRemovalsHeld ||
		!strings.Contains(ready.Message, "holds 12 pod removal(s)") || !strings.Contains(ready.Message, command) {
		t.Errorf("Ready = %+v; want False, RemovalsHeld, 12 pods and the command", ready)
	}
	f.waitEvent("Warning RemovalsHeld Hold Holding 12 pod removal(s)", command)

	// The file's hold ID or another change's approves nothing.
	f.annotatePolicy("team-a", "cleanup", "0123456789ab")
	time.Sleep(100 * time.Millisecond)
	if _, _, ok := tenantsOf(f.c).Holds().Held("team-a"); !ok || f.c.queue.Len() != 0 {
		t.Fatal("a wrong approval released the wave")
	}

	f.annotatePolicy("team-a", "cleanup", h.ID)
	f.waitQueued(len(pods))
	f.drain()
	if n := len(f.podWrites()); n != 12 {
		t.Errorf("%d pods removed after the approval, want 12", n)
	}
	if got := metricValue(f.metrics, "podjanitor_pods_held", "source", "tenant"); got != 0 {
		t.Errorf("podjanitor_pods_held{source=tenant} = %v after the approval, want 0", got)
	}
	// Ready again, at the end of the status interval.
	f.clock.Step(tenantStatusInterval)
	if err := wait.PollUntilContextTimeout(f.ctx, time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		r := f.readyOf(f.statusWrites())
		return r != nil && r.Status == metav1.ConditionTrue, nil
	}); err != nil {
		t.Errorf("Ready = %+v after the approval, want True", f.readyOf(f.statusWrites()))
	}
}

// TestSmallTenantWaveIsNotHeld: a tenant policy that makes 10 pods of its
// namespace due (threshold 10) is carried out, once no other namespace's
// change has come for spreadSettle (many such changes together are held).
func TestSmallTenantWaveIsNotHeld(t *testing.T) {
	f, pods := tenantWaveFixture(t, 10)
	if _, err := f.pj.PodjanitorV1alpha1().PodLifetimePolicies("team-a").Create(f.ctx, lifetimePolicy("team-a", "cleanup", maxAgeRule), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitQueued(len(pods))
	f.drain()
	if n := len(f.podWrites()); n != 0 {
		t.Errorf("%d pods removed at once, want none before spreadSettle", n)
	}
	if !f.stepAndWaitReady(spreadSettle) {
		t.Fatal("the pods did not come back after spreadSettle")
	}
	f.waitQueued(len(pods))
	f.drain()
	if n := len(f.podWrites()); n != 10 {
		t.Errorf("%d pods removed of a wave of 10, want 10", n)
	}
	if _, _, ok := tenantsOf(f.c).Holds().Held("team-a"); ok {
		t.Error("a wave of 10 is held")
	}
}

// TestTenantWaveRevertedRemovesNothing: a policy `after: 7d` changed to
// `after: 1h` is held; changed back, the hold ends and no pod is removed:
// they keep their 7d deadlines.
func TestTenantWaveRevertedRemovesNothing(t *testing.T) {
	f, pods := tenantWaveFixture(t, 12)
	policies := f.pj.PodjanitorV1alpha1().PodLifetimePolicies("team-a")
	week := v1alpha1.PodLifetimeRule{Name: "max-age", Clock: "created", After: "7d"}
	if _, err := policies.Create(f.ctx, lifetimePolicy("team-a", "cleanup", week), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitQueued(len(pods))
	f.drain()
	edit := func(rule v1alpha1.PodLifetimeRule, generation int64) { t.Helper(); f.editCleanup(rule, generation) }
	edit(maxAgeRule, 2)
	if err := wait.PollUntilContextTimeout(f.ctx, time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		_, _, ok := tenantsOf(f.c).Holds().Held("team-a")
		return ok, nil
	}); err != nil {
		t.Fatal("the change to 1h is not held")
	}
	f.waitQueued(len(pods))
	f.drain()
	edit(week, 3)
	if err := wait.PollUntilContextTimeout(f.ctx, time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		_, _, ok := tenantsOf(f.c).Holds().Held("team-a")
		return !ok, nil
	}); err != nil {
		t.Fatal("the revert did not end the hold")
	}
	f.waitQueued(len(pods))
	f.drain()
	if n := len(f.podWrites()); n != 0 {
		t.Errorf("%d pod writes, want none", n)
	}
	res, err := f.c.syncHandler(f.ctx, keyOf(pods[0]))
	if err != nil || res.RequeueAfter != 7*24*time.Hour-2*time.Hour {
		t.Errorf("syncHandler = %+v, %v; want the pod parked until its 7d deadline", res, err)
	}
}

// TestTenantApprovalNeverApprovesTheFile: a held wave of the policy file is
// not approved by its ID on a tenant policy; only the Lease approves it.
func TestTenantApprovalNeverApprovesTheFile(t *testing.T) {
	f, pods := tenantWaveFixture(t, 12)
	if err := f.c.SetEvaluator(evaluatorWithAfter(t, "1m")); err != nil {
		t.Fatal(err)
	}
	h, ok := f.c.waves.Held()
	if !ok {
		t.Fatal("the file's wave is not held")
	}
	f.drain()
	p := lifetimePolicy("team-a", "owner", v1alpha1.PodLifetimeRule{Name: "keep", Clock: "created", After: "30d"})
	p.Annotations = map[string]string{wave.AnnotationApprove: h.ID}
	if _, err := f.pj.PodjanitorV1alpha1().PodLifetimePolicies("team-a").Create(f.ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitQueued(len(pods))
	f.annotatePolicy("team-a", "owner", h.ID+" ") // an annotation change too
	time.Sleep(100 * time.Millisecond)
	if got, ok := f.c.waves.Held(); !ok || got.ID != h.ID {
		t.Fatalf("the file's hold is %+v, %v after a tenant policy named it; want it held", got, ok)
	}
}

// heldPolicy is team-a's policy `after: 1h` whose status, as a leader wrote
// it, says its change id is held.
func heldPolicy(id string) *v1alpha1.PodLifetimePolicy {
	p := lifetimePolicy("team-a", "cleanup", maxAgeRule)
	p.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse, ObservedGeneration: 1,
		Reason: wave.ReasonRemovalsHeld, Message: tenantcontroller.HeldMessage(p, wave.Hold{ID: id, Pods: 12}), LastTransitionTime: metav1.NewTime(t0)}}
	since := metav1.NewTime(t0.Add(-time.Hour))
	p.Status.HeldChange = &v1alpha1.HeldChange{ID: id, Pods: 12, Since: &since}
	return p
}

// restartedTenantFixture is tenantWaveFixture starting with p in the API
// server: the restart of a replica.
func restartedTenantFixture(t *testing.T, p *v1alpha1.PodLifetimePolicy) (*tenantFixture, []*corev1.Pod) {
	t.Helper()
	return restartedTenantFixtureWith(t, p, nil)
}

// restartedTenantFixtureWith is restartedTenantFixture with the cluster's
// rules of e (nil: none).
func restartedTenantFixtureWith(t *testing.T, p *v1alpha1.PodLifetimePolicy, e *policy.Evaluator) (*tenantFixture, []*corev1.Pod) {
	t.Helper()
	var pods []*corev1.Pod
	for i := range 12 {
		pods = append(pods, tenantPod(fmt.Sprintf("p%03d", i), "team-a", t0.Add(-2*time.Hour), nil))
	}
	opts := Options{Evaluator: e, Waves: &wave.Options{Threshold: wave.Threshold{Pods: 10}, Window: time.Minute,
		Record: wave.Record{Namespace: "podjanitor", Name: "podjanitor"}}}
	f := newTenantFixtureWith(t, opts, policy.Restrictions{}, nil, pods, func(pj *pjfake.Clientset) {
		if err := pj.Tracker().Add(p); err != nil {
			t.Fatal(err)
		}
	})
	for _, p := range pods {
		f.process(keyOf(p))
	}
	return f, pods
}

// TestTenantWaveHeldAcrossARestart: a policy whose status says its change
// is held, not approved, is held again when podjanitor starts (the hold is
// in the API server, not only in the old leader's memory); its recorded ID
// approves it.
func TestTenantWaveHeldAcrossARestart(t *testing.T) {
	f, pods := restartedTenantFixture(t, heldPolicy("0123456789ab"))
	if n := len(f.podWrites()); n != 0 {
		t.Fatalf("%d pod writes after a restart of a held change, want none", n)
	}
	if h, _, ok := tenantsOf(f.c).Holds().Held("team-a"); !ok || h.ID != "0123456789ab" {
		t.Fatalf("held %+v, %v; want the recorded change held", h, ok)
	}
	// The status says since when, as the last leader wrote it; a change
	// held anew says now.
	p, err := tenantsOf(f.c).Lister().PodLifetimePolicies("team-a").Get("cleanup")
	if err != nil {
		t.Fatal(err)
	}
	seen := tenantPolicy(f.c, "team-a/cleanup")
	if got := tenantsOf(f.c).Status(p, seen).HeldChange; got == nil || got.ID != "0123456789ab" || got.Since == nil || !got.Since.Equal(p.Status.HeldChange.Since) {
		t.Errorf("status.heldChange %+v, want the change held since %v", got, p.Status.HeldChange.Since)
	}
	anew := p.DeepCopy()
	anew.Status.HeldChange = nil
	if got := tenantsOf(f.c).Status(anew, seen).HeldChange; got == nil || got.Since == nil || !got.Since.Time.Equal(f.c.now().UTC().Truncate(time.Second)) {
		t.Errorf("status.heldChange %+v of a change held anew, want since %v", got, f.c.now())
	}
	f.annotatePolicy("team-a", "cleanup", "0123456789ab")
	f.waitQueued(len(pods))
	f.drain()
	if n := len(f.podWrites()); n != 12 {
		t.Errorf("%d pods removed after the approval, want 12", n)
	}
}

// TestApprovedTenantWaveIsNotHeldAfterARestart: the same, approved before
// the restart: nothing held, the pods go.
func TestApprovedTenantWaveIsNotHeldAfterARestart(t *testing.T) {
	p := heldPolicy("0123456789ab")
	p.Annotations = map[string]string{wave.AnnotationApprove: "0123456789ab"}
	f, _ := restartedTenantFixture(t, p)
	if _, _, ok := tenantsOf(f.c).Holds().Held("team-a"); ok {
		t.Error("an approved change held after a restart")
	}
	if n := len(f.podWrites()); n != 12 {
		t.Errorf("%d pods removed, want 12", n)
	}
}

// TestPlanMarksATenantPolicysHeldPods: plan marks HELD the due pods of a
// tenant policy whose status says its change is held (due with it, not
// without it), and prints the approval command on the policy.
func TestPlanMarksATenantPolicysHeldPods(t *testing.T) {
	held := heldPolicy("0123456789ab")
	pj := pjfake.NewSimpleClientset(held)
	tenants, listed, err := listTenantPolicies(context.Background(), pj, scopeFlags{}, policy.Restrictions{})
	if err != nil {
		t.Fatal(err)
	}
	own := tenantPod("own", "team-a", t0.Add(-2*time.Hour), nil)
	own.Annotations = map[string]string{"podjanitor.io/ttl": "1m"}
	pods := []*corev1.Pod{tenantPod("old", "team-a", t0.Add(-2*time.Hour), nil), own, tenantPod("old", "team-b", t0.Add(-2*time.Hour), nil)}
	namespaces := map[string]*policy.Namespace{"team-a": {}, "team-b": {}}
	e := &policy.Evaluator{Tenants: tenants}
	r := buildPlan(e, pods, namespaces, t0)
	r.TenantPolicies = listed
	markTenantHeld(&r, e, pods, namespaces, t0)
	got := map[string]string{}
	for _, p := range r.Pods {
		got[p.Namespace+"/"+p.Pod] = p.HeldChange
	}
	if got["team-a/old"] != "0123456789ab" || got["team-a/own"] != "" {
		t.Errorf("held changes %v; want team-a/old held by the policy's change, team-a/own (its own ttl) not", got)
	}
	var out strings.Builder
	if err := printPlan(&out, r); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"HELD 0123456789ab", tenantcontroller.ApproveCommand("team-a", "cleanup", "0123456789ab")} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("plan lacks %q:\n%s", want, out.String())
		}
	}
}

// TestSecondTenantChangeJoinsTheHold: while p's change is held, q's in
// the same namespace is measured against the policies acted on (with p's
// wave in it): one held change of both, under an ID of its own, which both
// policies' status shows; an approval of it on q releases the pods.
func TestSecondTenantChangeJoinsTheHold(t *testing.T) {
	f, pods := tenantWaveFixture(t, 12)
	policies := f.pj.PodjanitorV1alpha1().PodLifetimePolicies("team-a")
	if _, err := policies.Create(f.ctx, lifetimePolicy("team-a", "cleanup", maxAgeRule), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitQueued(len(pods))
	f.drain()
	first, _, _ := tenantsOf(f.c).Holds().Held("team-a")
	q := lifetimePolicy("team-a", "later", v1alpha1.PodLifetimeRule{Name: "none", Match: v1alpha1.PodLifetimeMatch{LabelSelector: "app=none"}, Clock: "created", After: "30d"})
	q.UID = "uid-policy-later"
	if _, err := policies.Create(f.ctx, q, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var second wave.Hold
	var object string
	if err := wait.PollUntilContextTimeout(f.ctx, time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		second, object, _ = tenantsOf(f.c).Holds().Held("team-a")
		return object == "team-a/later", nil
	}); err != nil {
		t.Fatalf("hold by %q, want team-a/later", object)
	}
	f.waitQueued(len(pods)) // the namespace's pass after the second change
	f.drain()
	if second.ID == first.ID || second.Pods != 12 {
		t.Errorf("second hold %+v (first %+v); want its own ID over the 12 pods", second, first)
	}
	f.clock.Step(tenantStatusInterval)
	if err := wait.PollUntilContextTimeout(f.ctx, time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		var cleanup, later *metav1.Condition
		for _, w := range f.statusWrites() {
			c := meta.FindStatusCondition(w.Status.Conditions, v1alpha1.ConditionReady)
			if c == nil || c.Reason != wave.ReasonRemovalsHeld {
				continue
			}
			if strings.Contains(c.Message, "team-a cleanup --overwrite podjanitor.io/approve-wave="+second.ID) {
				cleanup = c
			}
			if strings.Contains(c.Message, "team-a later --overwrite podjanitor.io/approve-wave="+second.ID) {
				later = c
			}
		}
		return cleanup != nil && later != nil, nil
	}); err != nil {
		t.Error("no status writes of cleanup and later RemovalsHeld with the second ID")
	}
	f.annotatePolicy("team-a", "later", second.ID)
	if err := wait.PollUntilContextTimeout(f.ctx, time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		_, _, held := tenantsOf(f.c).Holds().Held("team-a")
		return !held, nil
	}); err != nil {
		t.Fatal("the approval on the second policy was not taken")
	}
	f.waitQueued(len(pods))
	f.drain()
	if n := len(f.podWrites()); n != 12 {
		t.Errorf("%d pods removed after the approval on the second policy, want 12", n)
	}
}

// TestTenantPolicyDeletedWhilePendingStaysDeleted: a policy created and
// deleted before its namespace's pass (its change waiting, to be measured
// there) is not put back by that pass.
func TestTenantPolicyDeletedWhilePendingStaysDeleted(t *testing.T) {
	f, _ := tenantWaveFixture(t, 12)
	// No pass runs on its own: the change waits until the test's.
	f.c.redecide = redecide.New(f.clock, time.Hour, func(string) []string { return nil }, func(string) {}, func() bool { return false })
	policies := f.pj.PodjanitorV1alpha1().PodLifetimePolicies("team-a")
	if _, err := policies.Create(f.ctx, lifetimePolicy("team-a", "cleanup", maxAgeRule), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitCached("team-a/cleanup", func(p *v1alpha1.PodLifetimePolicy) bool { return p != nil })
	waited := len(tenantsOf(f.c).Store().For("team-a")) == 0 && f.c.redecide.Pending() == 1
	if err := policies.Delete(f.ctx, "cleanup", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitCached("team-a/cleanup", func(p *v1alpha1.PodLifetimePolicy) bool { return p == nil })
	tenantsOf(f.c).Sync("team-a") // the pass
	if got := tenantsOf(f.c).Store().For("team-a"); len(got) != 0 || !waited {
		t.Errorf("store %v after the deletion (the creation waited for the pass: %v); want the policy gone", got, waited)
	}
}

// waitCached waits until the tenant policy cache's policy of key (nil:
// none) is as ok wants.
func (f *tenantFixture) waitCached(key string, ok func(*v1alpha1.PodLifetimePolicy) bool) {
	f.t.Helper()
	if err := wait.PollUntilContextTimeout(f.ctx, time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		obj, _, _ := f.policies.GetByKey(key)
		p, _ := obj.(*v1alpha1.PodLifetimePolicy)
		return ok(p), nil
	}); err != nil {
		f.t.Fatalf("the tenant policy cache's %s never came as wanted", key)
	}
}

// TestPendingTenantChangesKeepOnePerPolicy: a replica whose passes wait (a
// follower) makes none of 50 writes of a policy until its pass, which
// takes the last.
func TestPendingTenantChangesKeepOnePerPolicy(t *testing.T) {
	f, _ := tenantWaveFixture(t, 1)
	f.c.redecide = redecide.New(f.clock, time.Hour, func(string) []string { return nil }, func(string) {}, func() bool { return false })
	policies := f.pj.PodjanitorV1alpha1().PodLifetimePolicies("team-a")
	p, err := policies.Create(f.ctx, lifetimePolicy("team-a", "cleanup", maxAgeRule), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for g := 2; g <= 50; g++ {
		p = p.DeepCopy()
		p.Generation = int64(g)
		if p, err = policies.Update(f.ctx, p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	f.waitCached("team-a/cleanup", func(p *v1alpha1.PodLifetimePolicy) bool { return p != nil && p.Generation == 50 })
	if got := tenantsOf(f.c).Store().For("team-a"); len(got) != 0 || f.c.redecide.Pending() != 1 {
		t.Errorf("store %v and %d namespace(s) pending after 50 writes of one policy; want none made before the pass, 1 pending", got, f.c.redecide.Pending())
	}
	tenantsOf(f.c).Sync("team-a")
	if got := tenantsOf(f.c).Store().For("team-a"); len(got) != 1 || got[0].Generation != 50 {
		t.Errorf("store %v, want the policy's generation 50", got)
	}
}

// TestUnlockedTenantPolicyIsHeld: a namespace may use one policy; its
// second (by name) is refused for the limit. The first, which matches no
// pod, is deleted: the second is used from then on, and that is measured as
// its creation — the 12 pods it makes due are held on it, none removed.
func TestUnlockedTenantPolicyIsHeld(t *testing.T) {
	f, _ := tenantWaveFixture(t, 12)
	tenantsOf(f.c).SetLimits(tenant.Limits{Policies: 1})
	policies := f.pj.PodjanitorV1alpha1().PodLifetimePolicies("team-a")
	first := lifetimePolicy("team-a", "a-first", v1alpha1.PodLifetimeRule{Name: "none", Clock: "created", After: "1h",
		Match: v1alpha1.PodLifetimeMatch{LabelSelector: "app=none"}})
	if _, err := policies.Create(f.ctx, first, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := policies.Create(f.ctx, lifetimePolicy("team-a", "b-second", maxAgeRule), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(f.ctx, time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		s, ok := tenantsOf(f.c).Policy("team-a/b-second")
		return ok && s.Err != nil && s.Err.Reason == tenant.TooManyPolicies, nil
	}); err != nil {
		t.Fatal("b-second is not refused for the namespace's limit")
	}
	f.drain()
	if err := policies.Delete(f.ctx, "a-first", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// The namespace's pass measures the change (a hold) or makes it (its
	// pods decided again and removed); keys of an earlier pass may still
	// come meanwhile.
	if err := wait.PollUntilContextTimeout(f.ctx, time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		f.drain()
		_, _, held := tenantsOf(f.c).Holds().Held("team-a")
		return held || len(f.podWrites()) > 0, nil
	}); err != nil {
		t.Fatal("the deletion changed nothing")
	}
	f.drain()
	if n := len(f.podWrites()); n != 0 {
		t.Fatalf("%d pods removed by the policy the deletion let in, want none before an approval", n)
	}
	h, object, ok := tenantsOf(f.c).Holds().Held("team-a")
	if !ok || h.Pods != 12 || object != "team-a/b-second" {
		t.Fatalf("held %+v by %q, %v; want 12 pods held by team-a/b-second", h, object, ok)
	}
	f.annotatePolicy("team-a", "b-second", h.ID)
	// The approval decides the held pods again (a pass of the namespace may
	// queue them too, before it): they go.
	if err := wait.PollUntilContextTimeout(f.ctx, time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		f.drain()
		return len(f.podWrites()) >= 12, nil
	}); err != nil {
		t.Errorf("%d pods removed after the approval, want 12", len(f.podWrites()))
	}
}

// tenantStartFixture is tenantWaveFixture with the policies already in the
// API server when podjanitor starts.
func tenantStartFixture(t *testing.T, n int, policies ...*v1alpha1.PodLifetimePolicy) (*tenantFixture, []*corev1.Pod) {
	t.Helper()
	return tenantStartFixtureWith(t, Options{}, n, policies...)
}

// tenantStartFixtureWith is tenantStartFixture with opts (its Evaluator,
// its Scope) besides the waves.
func tenantStartFixtureWith(t *testing.T, opts Options, n int, policies ...*v1alpha1.PodLifetimePolicy) (*tenantFixture, []*corev1.Pod) {
	t.Helper()
	var pods []*corev1.Pod
	for i := range n {
		pods = append(pods, tenantPod(fmt.Sprintf("p%03d", i), "team-a", t0.Add(-2*time.Hour), nil))
	}
	opts.Waves = &wave.Options{Threshold: wave.Threshold{Pods: 10, Percent: 50, MinPods: 10}, Window: time.Minute,
		Record: wave.Record{Namespace: "podjanitor", Name: "podjanitor"}}
	f := newTenantFixtureWith(t, opts, policy.Restrictions{}, nil, pods, func(pj *pjfake.Clientset) {
		for _, p := range policies {
			if err := pj.Tracker().Add(p); err != nil {
				t.Fatal(err)
			}
		}
	})
	f.c.opts.Waves.Record.Client = f.client
	return f, pods
}

// heldAtStart waits for team-a's change (what) to be held at the start,
// then decides its pods and checks that none is removed.
func (f *tenantFixture) heldAtStart(pods []*corev1.Pod, what string) {
	f.t.Helper()
	if err := wait.PollUntilContextTimeout(f.ctx, time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		_, _, held := tenantsOf(f.c).Holds().Held("team-a")
		return held, nil
	}); err != nil {
		f.t.Fatalf("%s is not held at its start", what)
	}
	for _, p := range pods {
		f.process(keyOf(p))
	}
	f.drain()
	if n := len(f.podWrites()); n != 0 {
		f.t.Fatalf("%d pods removed, want none before an approval", n)
	}
}

// TestTenantPolicyCreatedWhileDownIsHeld: a policy created while no
// podjanitor ran (no status) that makes the namespace's 12 pods due is
// held at the start, none removed, and so is one whose status says it was
// not used (a start with higher limits); the same policy with a status of
// its generation saying it was used (acted on before the restart) is not.
func TestTenantPolicyCreatedWhileDownIsHeld(t *testing.T) {
	t.Run("created while down", func(t *testing.T) {
		f, pods := tenantStartFixture(t, 12, lifetimePolicy("team-a", "cleanup", maxAgeRule))
		f.heldAtStart(pods, "a policy created while podjanitor was down")
		h, object, _ := tenantsOf(f.c).Holds().Held("team-a")
		if h.Pods != 12 || object != "team-a/cleanup" {
			t.Errorf("held %+v by %q, want 12 pods by team-a/cleanup", h, object)
		}
	})
	// Refused before (its status says so: over the limits of the last
	// leader), used by this start (other limits): measured as a creation.
	t.Run("not used before", func(t *testing.T) {
		p := lifetimePolicy("team-a", "cleanup", maxAgeRule)
		p.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: "TooManyPolicies", ObservedGeneration: p.Generation}}
		f, pods := tenantStartFixture(t, 12, p)
		f.heldAtStart(pods, "a policy not used before the start and used now")
	})
	t.Run("acted on before", func(t *testing.T) {
		p := lifetimePolicy("team-a", "cleanup", maxAgeRule)
		p.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: "Ready", ObservedGeneration: p.Generation}}
		f, pods := tenantStartFixture(t, 12, p)
		for _, p := range pods {
			f.process(keyOf(p))
		}
		f.drain()
		if _, _, held := tenantsOf(f.c).Holds().Held("team-a"); held {
			t.Error("a policy acted on before the restart is held")
		}
		if n := len(f.podWrites()); n != 12 {
			t.Errorf("%d pods removed, want 12", n)
		}
	})
}

// TestTenantApprovalIsUsedOnce: an approval covers one occurrence of its
// change. Once taken, it comes off the policy, so the same change made
// again (reverted, then applied again) is held again with the same ID and
// waits for an approval of its own.
func TestTenantApprovalIsUsedOnce(t *testing.T) {
	f, pods := tenantWaveFixture(t, 12)
	policies := f.pj.PodjanitorV1alpha1().PodLifetimePolicies("team-a")
	week := v1alpha1.PodLifetimeRule{Name: "max-age", Clock: "created", After: "7d"}
	if _, err := policies.Create(f.ctx, lifetimePolicy("team-a", "cleanup", week), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitQueued(len(pods))
	f.drain()
	edit := func(rule v1alpha1.PodLifetimeRule, generation int64) { t.Helper(); f.editCleanup(rule, generation) }
	heldID := func(want bool) string {
		t.Helper()
		var h wave.Hold
		if err := wait.PollUntilContextTimeout(f.ctx, time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
			var ok bool
			h, _, ok = tenantsOf(f.c).Holds().Held("team-a")
			return ok == want, nil
		}); err != nil {
			t.Fatalf("held %+v, want held %v", h, want)
		}
		return h.ID
	}
	edit(maxAgeRule, 2)
	id := heldID(true)
	f.waitQueued(len(pods))
	f.drain()
	f.annotatePolicy("team-a", "cleanup", id)
	f.waitQueued(len(pods))
	f.drain()
	if n := len(f.podWrites()); n != 12 {
		t.Fatalf("%d pods removed after the approval, want 12", n)
	}
	// The status writer takes the used approval off.
	if err := wait.PollUntilContextTimeout(f.ctx, time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		f.clock.Step(tenantStatusInterval)
		p, err := policies.Get(f.ctx, "cleanup", metav1.GetOptions{})
		return err == nil && p.Annotations[wave.AnnotationApprove] == "", err
	}); err != nil {
		t.Fatalf("the used approval is still on the policy: %v", err)
	}
	f.waitEvent("Normal RemovalsApproved Approve Change " + id + " approved: its 12 held pod(s) go")

	// Reverted and applied again: the same change, held again.
	edit(week, 3)
	heldID(false)
	f.waitQueued(len(pods))
	f.drain()
	removed := len(f.podWrites())
	edit(maxAgeRule, 4)
	if again := heldID(true); again != id {
		t.Errorf("the change applied again is held as %s, want its ID %s", again, id)
	}
	f.waitQueued(len(pods))
	f.drain()
	if n := len(f.podWrites()); n != removed {
		t.Errorf("%d pod writes after the change was applied again, want none before its approval", n-removed)
	}
}

// TestUsedTenantApprovalUnderAPIErrors: the used approval's removal is
// retried by the status writer while the API server answers 500, and comes
// off once it answers; refused (403: RBAC without patch), it stays on the
// policy and is not tried again. Either way the approval took effect: the
// held pods went.
func TestUsedTenantApprovalUnderAPIErrors(t *testing.T) {
	for name, tc := range map[string]struct {
		status   int32
		failures int // answers with status before the API server takes the patch
		off      bool
	}{
		"500 twice": {status: http.StatusInternalServerError, failures: 2, off: true},
		"403":       {status: http.StatusForbidden, failures: 1000, off: false},
	} {
		t.Run(name, func(t *testing.T) {
			f, pods := tenantWaveFixture(t, 12)
			var mu sync.Mutex
			tries := 0
			f.pj.PrependReactor("patch", "podlifetimepolicies", func(a core.Action) (bool, runtime.Object, error) {
				if p, ok := a.(core.PatchAction); !ok || p.GetPatchType() != types.JSONPatchType {
					return false, nil, nil
				}
				mu.Lock()
				defer mu.Unlock()
				if tries++; tries <= tc.failures {
					return true, nil, &apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure, Code: tc.status,
						Reason: metav1.StatusReason(http.StatusText(int(tc.status)))}}
				}
				return false, nil, nil
			})
			policies := f.pj.PodjanitorV1alpha1().PodLifetimePolicies("team-a")
			if _, err := policies.Create(f.ctx, lifetimePolicy("team-a", "cleanup", v1alpha1.PodLifetimeRule{Name: "max-age", Clock: "created", After: "7d"}), metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			f.waitQueued(len(pods))
			f.drain()
			f.editCleanup(maxAgeRule, 2)
			var h wave.Hold
			if err := wait.PollUntilContextTimeout(f.ctx, time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
				var ok bool
				h, _, ok = tenantsOf(f.c).Holds().Held("team-a")
				return ok, nil
			}); err != nil {
				t.Fatal("the change to 1h is not held")
			}
			f.waitQueued(len(pods))
			f.drain()
			f.annotatePolicy("team-a", "cleanup", h.ID)
			f.waitQueued(len(pods))
			f.drain()
			if n := len(f.podWrites()); n != 12 {
				t.Fatalf("%d pods removed after the approval, want 12", n)
			}
			approval := func() string {
				p, err := policies.Get(f.ctx, "cleanup", metav1.GetOptions{})
				if err != nil {
					t.Fatal(err)
				}
				return p.Annotations[wave.AnnotationApprove]
			}
			patches := func() int {
				mu.Lock()
				defer mu.Unlock()
				return tries
			}
			// The status writer's tries, an interval apart: until the
			// approval is off (500s), or the API server refused it (403).
			if err := wait.PollUntilContextTimeout(f.ctx, time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
				f.clock.Step(tenantStatusInterval)
				if tc.off {
					return approval() == "", nil
				}
				return patches() > 0, nil
			}); err != nil {
				t.Fatalf("after %d JSON patches: approval %q on the policy", patches(), approval())
			}
			if !tc.off { // and not tried again
				for range 5 {
					f.clock.Step(tenantStatusInterval)
					time.Sleep(20 * time.Millisecond)
				}
			}
			n := patches()
			if off := approval() == ""; off != tc.off {
				t.Errorf("approval taken off %v after %d JSON patches, want %v", off, n, tc.off)
			}
			if !tc.off && n != 1 {
				t.Errorf("%d JSON patches refused with 403, want 1 (not retried)", n)
			}
		})
	}
}

// TestTenantChangeHeldAcrossNamespacesIsNotActedOn: one policy created in 4
// namespaces of 5 pods each: no namespace holds its own (5 pods), the
// Spread holds the 20 together. Each policy's status says so
// (RemovalsHeldAcrossNamespaces, with the Lease's approval command), which
// a restart reads as not acted on, and measures again; approved, it is
// True. Before, the status said True while held, and a restart acted on
// the policies at once.
func TestTenantChangeHeldAcrossNamespacesIsNotActedOn(t *testing.T) {
	f := policyInFourNamespaces(t)
	if n := len(f.podWrites()); n != 0 {
		t.Fatalf("%d pod removals, want none while the 4 namespaces' changes are held", n)
	}
	h, scopes, held := f.c.spread.Held()
	if !held || len(scopes) != 4 {
		t.Fatalf("spread held %+v over %v, %v; want the 4 namespaces' changes held", h, scopes, held)
	}
	tc := f.c.tenants.(*tenantcontroller.Controller)
	status := func(ns string) (*v1alpha1.PodLifetimePolicy, *metav1.Condition) {
		p, err := f.pj.PodjanitorV1alpha1().PodLifetimePolicies(ns).Get(f.ctx, "cleanup", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		p.Status = tc.Status(p, tenantPolicy(f.c, ns+"/cleanup"))
		return p, meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionReady)
	}
	for i := range 4 {
		p, cond := status(fmt.Sprintf("team-%d", i))
		if cond.Status != metav1.ConditionFalse || cond.Reason != wave.ReasonRemovalsHeldAcrossNamespaces ||
			!strings.Contains(cond.Message, "kubectl annotate lease -n podjanitor podjanitor --overwrite podjanitor.io/approve-wave="+h.ID) {
			t.Errorf("Ready %+v, want False, %s, with the Lease's approval command", cond, wave.ReasonRemovalsHeldAcrossNamespaces)
		}
		if tenantcontroller.ActedOn(p) {
			t.Errorf("policy %s/%s: its status says acted on while its change is held", p.Namespace, p.Name)
		}
	}
	if _, ok := f.c.spread.Approve(h.ID); !ok {
		t.Fatal("approving the spread's hold")
	}
	if p, cond := status("team-0"); cond.Status != metav1.ConditionTrue || !tenantcontroller.ActedOn(p) {
		t.Errorf("Ready %+v after the approval, want True", cond)
	}
}

// TestChangedTenantWaveHeldAcrossARestartHoldsRuleDuePods: a policy's
// second generation (a change of its rules, `after: 1h`) is held when
// podjanitor restarts; the cluster's rule (`after: 1m`) makes the 12 pods
// due too. Their earlier rules (a 30-day keep, say) are not known after
// the restart: none of the 12 goes until the change is approved. Before,
// the hold was against the namespace without the policy, under which the
// 12 were due, and all 12 went at the restart.
func TestChangedTenantWaveHeldAcrossARestartHoldsRuleDuePods(t *testing.T) {
	p := heldPolicy("0123456789ab")
	p.Generation = 2
	p.Status.Conditions[0].ObservedGeneration = 2
	f, pods := restartedTenantFixtureWith(t, p, evaluatorWithAfter(t, "1m"))
	if n := len(f.podWrites()); n != 0 {
		t.Fatalf("%d pods removed after a restart of a held change of a policy's rules, want none", n)
	}
	f.annotatePolicy("team-a", "cleanup", "0123456789ab")
	f.waitQueued(len(pods))
	f.drain()
	if n := len(f.podWrites()); n != 12 {
		t.Errorf("%d pods removed after the approval, want 12", n)
	}
}

// TestCreatedTenantWaveHeldAcrossARestartLetsRuleDuePodsGo: the same for
// the policy's first generation (its creation): before it, the namespace
// had no policy, and the cluster's rule made the 12 due; they go.
func TestCreatedTenantWaveHeldAcrossARestartLetsRuleDuePodsGo(t *testing.T) {
	p := heldPolicy("0123456789ab")
	f, _ := restartedTenantFixtureWith(t, p, evaluatorWithAfter(t, "1m"))
	if _, _, ok := tenantsOf(f.c).Holds().Held("team-a"); !ok {
		t.Fatal("the creation is not held after the restart")
	}
	if n := len(f.podWrites()); n != 12 {
		t.Errorf("%d pods removed, want the 12 the cluster's rule made due before the creation", n)
	}
}

// TestPlanMarksAChangedTenantPolicysRuleDuePods: for a held change of a
// policy's rules (its second generation), plan marks HELD what the daemon
// holds after a restart: the pods of its namespace that a rule makes due,
// the cluster's included; not a pod due by its own ttl, nor another
// namespace's pod.
func TestPlanMarksAChangedTenantPolicysRuleDuePods(t *testing.T) {
	held := heldPolicy("0123456789ab")
	held.Generation = 2
	held.Status.Conditions[0].ObservedGeneration = 2
	pj := pjfake.NewSimpleClientset(held)
	tenants, listed, err := listTenantPolicies(context.Background(), pj, scopeFlags{}, policy.Restrictions{})
	if err != nil {
		t.Fatal(err)
	}
	own := tenantPod("own", "team-a", t0.Add(-2*time.Hour), nil)
	own.Annotations = map[string]string{"podjanitor.io/ttl": "1m"}
	pods := []*corev1.Pod{tenantPod("old", "team-a", t0.Add(-2*time.Hour), nil), own, tenantPod("old", "team-b", t0.Add(-2*time.Hour), nil)}
	namespaces := map[string]*policy.Namespace{"team-a": {}, "team-b": {}}
	e := evaluatorWithAfter(t, "1m")
	e.Tenants = tenants
	r := buildPlan(e, pods, namespaces, t0)
	r.TenantPolicies = listed
	markTenantHeld(&r, e, pods, namespaces, t0)
	got := map[string]string{}
	for _, p := range r.Pods {
		got[p.Namespace+"/"+p.Pod] = p.HeldChange
	}
	if got["team-a/old"] != "0123456789ab" || got["team-a/own"] != "" || got["team-b/old"] != "" {
		t.Errorf("held changes %v; want team-a/old held, team-a/own (its own ttl) and team-b/old not", got)
	}
}

// TestDeletingAnotherPolicyOfAHeldChangeKeepsItHeld: cleanup's creation
// (12 pods due) is held; a second policy created after it, matching no pod,
// joins the namespace's held change. Deleting that second policy brings
// nothing forward: the namespace is measured again against what was acted
// on before both, and cleanup's 12 pods stay held. cleanup's status says
// so, and an approval on cleanup of the hold as it stands releases them.
func TestDeletingAnotherPolicyOfAHeldChangeKeepsItHeld(t *testing.T) {
	f, pods := tenantWaveFixture(t, 12)
	policies := f.pj.PodjanitorV1alpha1().PodLifetimePolicies("team-a")
	if _, err := policies.Create(f.ctx, lifetimePolicy("team-a", "cleanup", maxAgeRule), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitQueued(len(pods))
	f.drain()
	q := lifetimePolicy("team-a", "extra", v1alpha1.PodLifetimeRule{Name: "none", Match: v1alpha1.PodLifetimeMatch{LabelSelector: "app=none"}, Clock: "created", After: "30d"})
	q.UID = "uid-policy-extra"
	if _, err := policies.Create(f.ctx, q, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(f.ctx, time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		return len(tenantsOf(f.c).Store().For("team-a")) == 2, nil
	}); err != nil {
		t.Fatal("the second policy was not measured")
	}
	f.waitQueued(len(pods))
	f.drain()
	if err := policies.Delete(f.ctx, "extra", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(f.ctx, time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		return len(tenantsOf(f.c).Store().For("team-a")) == 1, nil
	}); err != nil {
		t.Fatal("the deletion of the second policy was not seen")
	}
	f.waitQueued(len(pods))
	f.drain()
	if n := len(f.podWrites()); n != 0 {
		t.Fatalf("%d pods removed after a policy that brought nothing forward was deleted, want 0", n)
	}
	h, _, ok := tenantsOf(f.c).Holds().Held("team-a")
	if !ok || h.Pods != 12 {
		t.Fatalf("held %+v, %v; want cleanup's 12 pods held", h, ok)
	}
	f.clock.Step(tenantStatusInterval)
	if err := wait.PollUntilContextTimeout(f.ctx, time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		for _, w := range f.statusWrites() {
			c := meta.FindStatusCondition(w.Status.Conditions, v1alpha1.ConditionReady)
			if c != nil && c.Reason == wave.ReasonRemovalsHeld && strings.Contains(c.Message, "team-a cleanup --overwrite podjanitor.io/approve-wave="+h.ID) {
				return true, nil
			}
		}
		return false, nil
	}); err != nil {
		t.Error("no status write of cleanup RemovalsHeld with the hold's ID")
	}
	f.annotatePolicy("team-a", "cleanup", h.ID)
	f.waitQueued(len(pods))
	f.drain()
	if n := len(f.podWrites()); n != 12 {
		t.Errorf("%d pods removed after the approval on cleanup, want 12", n)
	}
}

// TestLeavingDryRunHoldsTenantDuePods: the last leader ran with --dry-run
// and removed nothing; its tenant policy's 12 due pods were never removed.
// A start without --dry-run is measured as a first install: the pods the
// tenant policy makes due are held with the rules', on the Lease.
func TestLeavingDryRunHoldsTenantDuePods(t *testing.T) {
	p := lifetimePolicy("team-a", "cleanup", maxAgeRule)
	p.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: "Ready", ObservedGeneration: p.Generation}}
	scope := decisionScope{TenantPolicies: true}
	f, pods := tenantStartFixtureWith(t, Options{Scope: scope}, 12, p)
	recorded := scope
	recorded.DryRun = true
	f.startHeldAgainst(recorded, pods, "leaving --dry-run")
}

// startHeldAgainst starts f against a record of its rules acted on in the
// scope recorded (on the Lease, as an earlier version wrote it), and checks
// that the start holds every one of pods and removes none (what: the
// change the start is).
func (f *tenantFixture) startHeldAgainst(recorded decisionScope, pods []*corev1.Pod, what string) {
	f.t.Helper()
	b := recordJSON(f.c.evaluator.Load(), recorded)
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "podjanitor", Name: "podjanitor",
		Annotations: map[string]string{wave.AnnotationBaseline: string(b), wave.AnnotationBaselineHash: wave.BaselineHash(b)}}}
	if _, err := f.client.CoordinationV1().Leases("podjanitor").Create(f.ctx, lease, metav1.CreateOptions{}); err != nil {
		f.t.Fatal(err)
	}
	f.start(pods)
	f.drain()
	if h, held := f.c.waves.Held(); !held || h.Pods != len(pods) {
		f.t.Fatalf("%s: held %+v, %v; want the %d pods it makes due", what, h, held, len(pods))
	}
	if n := len(f.podWrites()); n != 0 {
		f.t.Errorf("%s: %d pods removed, want none before an approval", what, n)
	}
}

// TestTenantPolicyChangedWhileDownIsMeasuredAgainstOwnAnnotations: a policy
// acted on at generation 1 (its status says so) was changed while no
// podjanitor ran; generation 2 makes the namespace's 12 pods due at 1h, as
// the cluster's rule does. Its earlier rules are not known (they may have
// kept the pods for 30 days): the change is measured against the pods' own
// annotations alone, and held. Measured against the namespace without the
// policy (the cluster's rule), it was nothing, and the 12 went at once.
func TestTenantPolicyChangedWhileDownIsMeasuredAgainstOwnAnnotations(t *testing.T) {
	p := lifetimePolicy("team-a", "cleanup", maxAgeRule)
	p.Generation = 2
	p.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: "Ready", ObservedGeneration: 1}}
	f, pods := tenantStartFixtureWith(t, Options{Evaluator: evaluatorWithAfter(t, "1h")}, 12, p)
	f.heldAtStart(pods, "a policy changed while podjanitor was down")
}

// TestStaleTenantApprovalApprovesNoRepeat: an approval left on a policy
// (a podjanitor stopped before it took it off) names a change that is made
// again later, under the same ID: it approves nothing, comes off the policy,
// and the pods stay held until an approval of the hold as published.
func TestStaleTenantApprovalApprovesNoRepeat(t *testing.T) {
	f, pods := tenantWaveFixture(t, 12)
	policies := f.pj.PodjanitorV1alpha1().PodLifetimePolicies("team-a")
	if _, err := policies.Create(f.ctx, lifetimePolicy("team-a", "cleanup", maxAgeRule), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitQueued(len(pods))
	f.drain()
	h, _, ok := tenantsOf(f.c).Holds().Held("team-a")
	if !ok {
		t.Fatal("the creation is not held")
	}
	if err := policies.Delete(f.ctx, "cleanup", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(f.ctx, time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		_, _, held := tenantsOf(f.c).Holds().Held("team-a")
		return !held, nil
	}); err != nil {
		t.Fatal("the deleted policy's creation is still held")
	}
	again := lifetimePolicy("team-a", "cleanup", maxAgeRule)
	again.Annotations = map[string]string{wave.AnnotationApprove: h.ID}
	if _, err := policies.Create(f.ctx, again, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(f.ctx, time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		f.drain()
		got, _, held := tenantsOf(f.c).Holds().Held("team-a")
		return held && got.ID == h.ID, nil
	}); err != nil {
		t.Fatal("the same creation made again is not held")
	}
	if err := wait.PollUntilContextTimeout(f.ctx, time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		f.clock.Step(tenantStatusInterval)
		p, err := policies.Get(f.ctx, "cleanup", metav1.GetOptions{})
		return err == nil && p.Annotations[wave.AnnotationApprove] == "", err
	}); err != nil {
		t.Error("the stale approval is still on the policy")
	}
	f.drain()
	if n := len(f.podWrites()); n != 0 {
		t.Fatalf("%d pods removed by a stale approval, want 0", n)
	}
	f.annotatePolicy("team-a", "cleanup", h.ID)
	f.waitQueued(len(pods))
	f.drain()
	if n := len(f.podWrites()); n != 12 {
		t.Errorf("%d pods removed after the approval, want 12", n)
	}
}

// TestTenantChangesHeldAcrossNamespacesRevertedEndTheHold: the policy
// created in 4 namespaces of 5 pods is held across them (the Spread); the
// 4 policies deleted again (with no finalizer: too few pods) are a revert,
// and the hold ends with none of the 20 removed.
func TestTenantChangesHeldAcrossNamespacesRevertedEndTheHold(t *testing.T) {
	f := policyInFourNamespaces(t)
	if _, _, held := f.c.spread.Held(); !held {
		t.Fatal("the 4 namespaces' changes are not held")
	}
	for i := range 4 {
		if err := f.pj.PodjanitorV1alpha1().PodLifetimePolicies(fmt.Sprintf("team-%d", i)).Delete(f.ctx, "cleanup", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := wait.PollUntilContextTimeout(f.ctx, time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		_, _, held := f.c.spread.Held()
		return !held, nil
	}); err != nil {
		t.Fatal("the hold of the 4 reverted changes lasts")
	}
	f.drain()
	if n := len(f.podWrites()); n != 0 {
		t.Errorf("%d pods removed, want none", n)
	}
}

// TestHeldStatusWithoutHeldChangeIsMeasuredAgain: a status that says
// RemovalsHeld without status.heldChange (written before podjanitor wrote
// it) is taken as not acted on: the policy is measured again at the start,
// as a creation, and held.
func TestHeldStatusWithoutHeldChangeIsMeasuredAgain(t *testing.T) {
	p := heldPolicy("0123456789ab")
	p.Status.HeldChange = nil
	f, pods := tenantStartFixture(t, 12, p)
	f.heldAtStart(pods, "a policy whose status says held without its held change")
}

// policyInFourNamespaces is a fixture of 4 namespaces of 5 pods each, none
// held on its own (at most 10), with the same policy created in each, one
// after another: the Spread holds the 20 together.
func policyInFourNamespaces(t *testing.T) *tenantFixture {
	t.Helper()
	var pods []*corev1.Pod
	for i := range 4 {
		for j := range 5 {
			pods = append(pods, tenantPod(fmt.Sprintf("p%d", j), fmt.Sprintf("team-%d", i), t0.Add(-2*time.Hour), nil))
		}
	}
	opts := Options{Waves: &wave.Options{Threshold: wave.Threshold{Pods: 10, Percent: 50, MinPods: 10}, Window: time.Minute,
		Record: wave.Record{Namespace: "podjanitor", Name: "podjanitor"}}}
	f := newTenantFixtureWith(t, opts, policy.Restrictions{}, nil, pods)
	f.c.opts.Waves.Record.Client = f.client
	for i := range 4 {
		ns := fmt.Sprintf("team-%d", i)
		if _, err := f.pj.PodjanitorV1alpha1().PodLifetimePolicies(ns).Create(f.ctx, lifetimePolicy(ns, "cleanup", maxAgeRule), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		f.waitQueued(5)
		f.drain()
	}
	return f
}

// TestStartProtectingAPriorityClassIsHeld: a namespace's policy kept its 12
// pods of priority class batch for 30 days, under a cluster rule of 1h; the
// next start protects batch from tenant policies
// (--tenant-protected-priority-classes), which takes the policy off those
// pods with no change of its status: the cluster's rule makes all 12 due.
// The restrictions acted on are recorded with the scope, so the start is
// measured against them and held. Before, they were not recorded: the same
// rules in the same scope held nothing, and all 12 went.
func TestStartProtectingAPriorityClassIsHeld(t *testing.T) {
	p := lifetimePolicy("team-a", "keep", v1alpha1.PodLifetimeRule{Name: "keep", Clock: "created", After: "720h"})
	p.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: "Ready", ObservedGeneration: p.Generation}}
	var pods []*corev1.Pod
	for i := range 12 {
		pod := tenantPod(fmt.Sprintf("p%03d", i), "team-a", t0.Add(-2*time.Hour), nil)
		pod.Spec.PriorityClassName = "batch"
		pods = append(pods, pod)
	}
	protecting := policy.Restrictions{ProtectedPriorityClasses: []string{"batch"}}
	opts := Options{Evaluator: evaluatorWithAfter(t, "1h"),
		Scope: decisionScope{TenantPolicies: true, Tenant: newTenantScope(protecting, tenant.Limits{})}}
	opts.Waves = &wave.Options{Threshold: wave.Threshold{Pods: 10, Percent: 50, MinPods: 10}, Window: time.Minute,
		Record: wave.Record{Namespace: "podjanitor", Name: "podjanitor"}}
	f := newTenantFixtureWith(t, opts, protecting, nil, pods, func(pj *pjfake.Clientset) {
		if err := pj.Tracker().Add(p); err != nil {
			t.Fatal(err)
		}
	})
	f.c.opts.Waves.Record.Client = f.client
	f.startHeldAgainst(decisionScope{TenantPolicies: true, Tenant: newTenantScope(policy.Restrictions{}, tenant.Limits{})}, pods,
		"protecting the pods' priority class")
}

// TestStartUnderTheSameRestrictionsHoldsNothing: the restrictions recorded
// are the ones the start runs with (given in another order): nothing held,
// and a record written before restrictions were recorded is taken as the
// current ones (an upgrade holds nothing).
func TestStartUnderTheSameRestrictionsHoldsNothing(t *testing.T) {
	for name, recorded := range map[string]*tenantScope{
		"same, other order": newTenantScope(policy.Restrictions{ProtectedPriorityClasses: []string{"batch", "alpha"}}, tenant.Limits{}),
		"not recorded":      nil,
	} {
		t.Run(name, func(t *testing.T) {
			current := decisionScope{TenantPolicies: true, Tenant: newTenantScope(policy.Restrictions{ProtectedPriorityClasses: []string{"alpha", "batch"}}, tenant.Limits{})}
			b, _ := json.Marshal(recordedPolicy{Rules: evaluatorWithAfter(t, "1h").Policy.Rules, Scope: &decisionScope{TenantPolicies: true, Tenant: recorded}})
			rules, s, ok := parseRecord(b, current)
			if !ok || rules == nil || !reflect.DeepEqual(s, current) {
				t.Errorf("recorded %s parses as %+v (tenant %+v), %v; want the current scope", b, s, s.Tenant, ok)
			}
			e := evaluatorWithAfter(t, "1h")
			if same := string(recordJSON(e, current)) == string(recordJSON(e, decisionScope{TenantPolicies: true, Tenant: recorded})); same != (recorded != nil) {
				t.Errorf("the record is the same bytes as the start's: %v, want %v", same, recorded != nil)
			}
		})
	}
}
