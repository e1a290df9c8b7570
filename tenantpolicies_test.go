package main

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	core "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"

	"github.com/podjanitor/podjanitor/internal/apitest"
	v1alpha1 "github.com/podjanitor/podjanitor/pkg/apis/podjanitor/v1alpha1"
	pjfake "github.com/podjanitor/podjanitor/pkg/generated/clientset/versioned/fake"
	"github.com/podjanitor/podjanitor/policy"
)

// tenantFixture is a fixture whose controller honours the tenant policies
// of a fake podjanitor.io clientset.
type tenantFixture struct {
	*fixture
	pj *pjfake.Clientset
	// policies is the tenant policy informer's cache.
	policies cache.Indexer
}

const tenantStatusInterval = 10 * time.Second

func newTenantFixture(t *testing.T, r policy.Restrictions, namespaces []*corev1.Namespace, pods []*corev1.Pod, setup ...func(*pjfake.Clientset)) *tenantFixture {
	t.Helper()
	return newTenantFixtureWith(t, Options{}, r, namespaces, pods, setup...)
}

// newTenantFixtureWith is newTenantFixture with the controller's opts.
func newTenantFixtureWith(t *testing.T, opts Options, r policy.Restrictions, namespaces []*corev1.Namespace, pods []*corev1.Pod, setup ...func(*pjfake.Clientset)) *tenantFixture {
	t.Helper()
	pj := pjfake.NewSimpleClientset()
	for _, s := range setup {
		s(pj)
	}
	return newTenantFixtureOn(t, opts, r, namespaces, pods, pj)
}

// newTenantFixtureOn is newTenantFixtureWith on the podjanitor.io clientset
// pj, which another fixture may share (two podjanitors in one cluster).
func newTenantFixtureOn(t *testing.T, opts Options, r policy.Restrictions, namespaces []*corev1.Namespace, pods []*corev1.Pod, pj *pjfake.Clientset) *tenantFixture {
	t.Helper()
	f := newFixtureWithNamespaces(t, opts, namespaces, pods...)
	informer := newTenantInformer(pj, scopeFlags{}, 0)
	if _, err := f.c.SetTenantPolicies(f.ctx, informer, pj, r, tenantStatusInterval); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(f.ctx)
	go informer.RunWithContext(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), informer.HasSynced) {
		t.Fatal("tenant policy cache did not sync")
	}
	done := make(chan struct{})
	go func() { defer close(done); tenantsOf(f.c).RunStatus(ctx, nil) }()
	t.Cleanup(func() { cancel(); <-done })
	return &tenantFixture{fixture: f, pj: pj, policies: informer.GetIndexer()}
}

func tenantPod(name, namespace string, created time.Time, labels map[string]string) *corev1.Pod {
	p := apitest.Pod(name, created, corev1.PodPending, nil)
	p.Namespace, p.Labels, p.UID = namespace, labels, types.UID("uid-"+namespace+"-"+name)
	return p
}

func lifetimePolicy(namespace, name string, rules ...v1alpha1.PodLifetimeRule) *v1alpha1.PodLifetimePolicy {
	return &v1alpha1.PodLifetimePolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, UID: types.UID("uid-policy-" + name), Generation: 1},
		Spec:       v1alpha1.PodLifetimePolicySpec{Rules: rules},
	}
}

var maxAgeRule = v1alpha1.PodLifetimeRule{Name: "max-age", Clock: "created", After: "1h"}

// waitQueued waits until n pod keys are queued (generously, in real time).
func (f *tenantFixture) waitQueued(n int) {
	f.t.Helper()
	if err := wait.PollUntilContextTimeout(f.ctx, time.Millisecond, 10*time.Second, true,
		func(context.Context) (bool, error) { return f.c.queue.Len() >= n, nil }); err != nil {
		f.t.Fatalf("%d pod key(s) queued, want %d", f.c.queue.Len(), n)
	}
}

// drain handles every queued key.
func (f *tenantFixture) drain() {
	f.t.Helper()
	for f.c.queue.Len() > 0 {
		f.next()
	}
}

func (f *tenantFixture) podWrites() []core.Action {
	var out []core.Action
	for _, a := range f.writes() {
		if a.GetResource().Resource == "pods" {
			out = append(out, a)
		}
	}
	return out
}

// statusWrites are the fake podjanitor.io clientset's writes of status:
// merge patches of the status subresource, each as the status it writes.
func (f *tenantFixture) statusWrites() []*v1alpha1.PodLifetimePolicy {
	var out []*v1alpha1.PodLifetimePolicy
	for _, a := range f.pj.Actions() {
		if a.GetSubresource() != "status" {
			continue
		}
		p, ok := a.(core.PatchAction)
		if !ok || p.GetPatchType() != types.MergePatchType {
			f.t.Fatalf("status written by %T, want a merge patch", a)
		}
		var written v1alpha1.PodLifetimePolicy
		if err := json.Unmarshal(p.GetPatch(), &written); err != nil {
			f.t.Fatal(err)
		}
		out = append(out, &written)
	}
	return out
}

func (f *tenantFixture) waitStatusWrites(n int) []*v1alpha1.PodLifetimePolicy {
	f.t.Helper()
	if err := wait.PollUntilContextTimeout(f.ctx, time.Millisecond, 10*time.Second, true,
		func(context.Context) (bool, error) { return len(f.statusWrites()) >= n, nil }); err != nil {
		f.t.Fatalf("%d status write(s), want %d", len(f.statusWrites()), n)
	}
	return f.statusWrites()
}

// TestTenantPolicyRemovesOnlyItsNamespacesPods proves that a policy in
// team-a, once created, decides team-a's pods again (and only them) and
// removes the due one, naming itself in the event, after a fresh read of
// the policy; team-b's pod of the same age and labels stays.
func TestTenantPolicyRemovesOnlyItsNamespacesPods(t *testing.T) {
	a := tenantPod("old", "team-a", t0.Add(-2*time.Hour), nil)
	b := tenantPod("old", "team-b", t0.Add(-2*time.Hour), nil)
	f := newTenantFixture(t, policy.Restrictions{}, nil, []*corev1.Pod{a, b})

	if _, err := f.pj.PodjanitorV1alpha1().PodLifetimePolicies("team-a").Create(f.ctx, lifetimePolicy("team-a", "cleanup", maxAgeRule), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitQueued(1)
	if got := f.c.queue.Len(); got != 1 {
		t.Fatalf("%d pod keys queued by the policy of team-a, want 1 (team-a's pod only)", got)
	}
	f.drain()
	f.process(keyOf(b))
	checkActions(t, []core.Action{deleteAction(a)}, f.podWrites())
	if got := f.events(); len(got) != 1 || !strings.Contains(got[0], "(podlifetimepolicy/cleanup/rule/max-age)") {
		t.Errorf("events = %q, want one LifetimeExpired naming podlifetimepolicy/cleanup/rule/max-age", got)
	}
	gets := 0
	for _, act := range f.pj.Actions() {
		if act.GetVerb() == "get" && act.GetResource().Resource == "podlifetimepolicies" {
			gets++
		}
	}
	if gets != 1 {
		t.Errorf("%d reads of the policy from the API server before the removal, want 1", gets)
	}
}

// TestDeletingTenantPolicyCancelsItsDeadlines proves that deleting a policy
// cancels the deadline it gave a pod: the pod is never removed.
func TestDeletingTenantPolicyCancelsItsDeadlines(t *testing.T) {
	pod := tenantPod("young", "team-a", t0.Add(-10*time.Minute), nil)
	f := newTenantFixture(t, policy.Restrictions{}, nil, []*corev1.Pod{pod})
	policies := f.pj.PodjanitorV1alpha1().PodLifetimePolicies("team-a")
	if _, err := policies.Create(f.ctx, lifetimePolicy("team-a", "cleanup", maxAgeRule), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitQueued(1)
	f.drain()
	if got := metricValue(f.metrics, "podjanitor_pods_scheduled"); got != 1 {
		t.Fatalf("pods_scheduled = %v, want 1: parked until the policy's deadline", got)
	}
	if err := policies.Delete(f.ctx, "cleanup", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitQueued(1)
	f.drain()
	if got := metricValue(f.metrics, "podjanitor_pods_scheduled"); got != 0 {
		t.Errorf("pods_scheduled = %v, want 0 once the policy is deleted", got)
	}
	if f.stepAndCheckReady(2 * time.Hour) {
		f.drain()
	}
	checkActions(t, nil, f.podWrites())
}

// TestTenantPoliciesWaitForTheirCRD: with --tenant-policies and the CRD not
// installed (a `helm upgrade` from a chart without it), podjanitor starts
// without tenant policies: its caches count as synced at once,
// podjanitor_tenant_policies_available is 0, and it asks the API server
// again every --tenant-crd-check-interval. Once the resource is served it
// starts the informer and decides every pod again with the policies it finds:
// the pod team-a's policy makes due is removed, team-b's pod of the same age
// stays.
func TestTenantPoliciesWaitForTheirCRD(t *testing.T) {
	a := tenantPod("old", "team-a", t0.Add(-2*time.Hour), nil)
	b := tenantPod("old", "team-b", t0.Add(-2*time.Hour), nil)
	f := &tenantFixture{fixture: newFixtureWithNamespaces(t, Options{}, nil, a, b)}
	ctx, cancel := context.WithCancel(f.ctx)
	t.Cleanup(cancel)
	pj := pjfake.NewSimpleClientset(lifetimePolicy("team-a", "cleanup", maxAgeRule))
	f.pj = pj
	var absent atomic.Bool
	var lists atomic.Int32
	absent.Store(true)
	pj.PrependReactor("list", "podlifetimepolicies", func(core.Action) (bool, runtime.Object, error) {
		lists.Add(1)
		if absent.Load() {
			return true, nil, apierrors.NewNotFound(v1alpha1.Resource("podlifetimepolicies"), "")
		}
		return false, nil, nil
	})
	const interval = 30 * time.Second
	o := &flagValues{tenants: tenantFlags{enabled: true, crdCheckInterval: interval}}
	synced, err := startTenantPolicies(ctx, f.fixture.c, &clients{podjanitor: pj}, o)
	if err != nil {
		t.Fatalf("startTenantPolicies without the CRD: %v, want podjanitor to run without tenant policies", err)
	}
	if !synced() || !tenantsOf(f.c).HasSynced() {
		t.Fatal("/readyz or the controller's start waits for tenant policies that the API server does not serve")
	}
	available := func() float64 { return metricValue(f.metrics, "podjanitor_tenant_policies_available") }
	if got := available(); got != 0 {
		t.Errorf("podjanitor_tenant_policies_available = %v without the CRD, want 0", got)
	}
	// probeAfterInterval steps the clock by the interval until the next probe.
	probeAfterInterval := func() {
		t.Helper()
		n := lists.Load()
		if err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
			if lists.Load() > n {
				return true, nil
			}
			f.clock.Step(interval)
			return false, nil
		}); err != nil {
			t.Fatalf("no probe of the API server in 10s of clock steps of %v", interval)
		}
	}
	probeAfterInterval()
	time.Sleep(50 * time.Millisecond)
	if got := f.c.queue.Len(); got != 0 {
		t.Fatalf("%d keys queued while the CRD is still absent, want none", got)
	}

	absent.Store(false)
	probeAfterInterval()
	f.waitQueued(2)
	if err := wait.PollUntilContextTimeout(ctx, time.Millisecond, 10*time.Second, true,
		func(context.Context) (bool, error) { return available() == 1, nil }); err != nil {
		t.Errorf("podjanitor_tenant_policies_available = %v once the CRD is served, want 1", available())
	}
	f.drain()
	checkActions(t, []core.Action{deleteAction(a)}, f.podWrites())
}

// dueWithFreshReadFailing runs a pod due by a cached policy while the fresh
// read of that policy before the removal answers fault, and checks that
// nothing is removed and the pod is decided again with backoff; it returns
// the fixture for further checks.
func dueWithFreshReadFailing(t *testing.T, fault error) *tenantFixture {
	t.Helper()
	pod := tenantPod("old", "team-a", t0.Add(-2*time.Hour), nil)
	var failing atomic.Bool
	f := newTenantFixture(t, policy.Restrictions{}, nil, []*corev1.Pod{pod}, func(pj *pjfake.Clientset) {
		pj.PrependReactor("get", "podlifetimepolicies", func(core.Action) (bool, runtime.Object, error) {
			if !failing.Load() {
				return false, nil, nil
			}
			return true, nil, fault
		})
	})
	if _, err := f.pj.PodjanitorV1alpha1().PodLifetimePolicies("team-a").Create(f.ctx, lifetimePolicy("team-a", "cleanup", maxAgeRule), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitQueued(1)
	failing.Store(true)
	f.drain()
	checkActions(t, nil, f.podWrites())
	if got := f.c.queue.NumRequeues(keyOf(pod)); got != 1 {
		t.Errorf("pod requeued %d times, want 1 (decided again with backoff)", got)
	}
	return f
}

// TestTenantPolicyGoneFromTheAPIServerRemovesNothing proves that a pod due
// by a cached policy is not removed when the API server no longer has the
// policy (its deletion not yet seen by the watch).
func TestTenantPolicyGoneFromTheAPIServerRemovesNothing(t *testing.T) {
	f := dueWithFreshReadFailing(t, apierrors.NewNotFound(v1alpha1.Resource("podlifetimepolicies"), "cleanup"))
	if got := metricValue(f.metrics, "controller_runtime_reconcile_errors_total"); got != 0 {
		t.Errorf("reconcile errors = %v, want 0: a policy gone is a disagreement, not an error", got)
	}
}

// TestTenantPolicyReadFailingRemovesNothing: when the fresh read of the
// policy before a removal fails (the API server unavailable, throttling,
// slow), the pod is not removed on the cache's word; it is decided again with
// backoff.
func TestTenantPolicyReadFailingRemovesNothing(t *testing.T) {
	gr := v1alpha1.Resource("podlifetimepolicies")
	for name, fault := range map[string]error{
		"500":     apierrors.NewInternalError(errors.New("etcd leader changed")),
		"503":     apierrors.NewServiceUnavailable("the API server is shutting down"),
		"429":     apierrors.NewTooManyRequests("slow down", 1),
		"timeout": apierrors.NewTimeoutError("the read took too long", 1),
		"409":     apierrors.NewConflict(gr, "cleanup", errors.New("conflict")),
	} {
		t.Run(name, func(t *testing.T) {
			f := dueWithFreshReadFailing(t, fault)
			// An error, as a failed namespace read: counted, and logged as
			// what it is, not as the policy having changed.
			if got := metricValue(f.metrics, "controller_runtime_reconcile_errors_total"); got != 1 {
				t.Errorf("reconcile errors = %v, want 1: a failed read is an error", got)
			}
		})
	}
}

// TestRefusedTenantPolicyIsNotReady proves that a policy the restrictions
// refuse gives no deadline, reports Ready=False with the reason and the
// message, and gets one Warning event.
func TestRefusedTenantPolicyIsNotReady(t *testing.T) {
	pod := tenantPod("old", "team-a", t0.Add(-2*time.Hour), nil)
	f := newTenantFixture(t, policy.Restrictions{ForbiddenClocks: []policy.Clock{policy.ClockCreated}}, nil, []*corev1.Pod{pod})
	if _, err := f.pj.PodjanitorV1alpha1().PodLifetimePolicies("team-a").Create(f.ctx, lifetimePolicy("team-a", "cleanup", maxAgeRule), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitQueued(1)
	f.drain()
	checkActions(t, nil, f.podWrites())
	writes := f.waitStatusWrites(1)
	status := writes[0].Status
	ready := meta.FindStatusCondition(status.Conditions, v1alpha1.ConditionReady)
	if ready == nil || ready.Status != metav1.ConditionFalse || ready.Reason != policy.TenantReasonForbidden ||
		!strings.Contains(ready.Message, `clock "created"`) || status.ObservedGeneration != 1 {
		t.Errorf("status = %+v, want observedGeneration 1 and Ready=False %s about clock \"created\"", status, policy.TenantReasonForbidden)
	}
	// The Warning follows the status write.
	if got := f.waitEvents(1); len(got) != 1 || !strings.HasPrefix(got[0], "Warning PolicyNotUsed Validate") {
		t.Errorf("events = %q, want one Warning PolicyNotUsed", got)
	}
	if got := metricValue(f.metrics, "podjanitor_tenant_policies", "ready", "false"); got != 1 {
		t.Errorf("tenant_policies{ready=false} = %v, want 1", got)
	}
}

// TestTenantStatusWritesAreBounded proves that the status of a policy that
// gives many pods deadlines is written once when it is read and once at the
// end of the interval with the count and the next deadline, not once per pod.
func TestTenantStatusWritesAreBounded(t *testing.T) {
	var pods []*corev1.Pod
	for i := range 50 {
		pods = append(pods, tenantPod("p"+string(rune('a'+i%26))+string(rune('a'+i/26)), "team-a", t0.Add(-time.Duration(i)*time.Minute), nil))
	}
	f := newTenantFixture(t, policy.Restrictions{}, nil, pods)
	if _, err := f.pj.PodjanitorV1alpha1().PodLifetimePolicies("team-a").Create(f.ctx, lifetimePolicy("team-a", "cleanup", maxAgeRule), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitQueued(len(pods))
	f.drain()
	for range 3 { // more events of the same pods: nothing new to write
		for _, p := range pods {
			f.process(keyOf(p))
		}
	}
	first := f.waitStatusWrites(1)
	time.Sleep(200 * time.Millisecond) // room for writes that must not happen
	if n := len(f.statusWrites()); n != 1 {
		t.Fatalf("%d status writes within the interval for 200 pod syncs, want 1", n)
	}
	if ready := meta.FindStatusCondition(first[0].Status.Conditions, v1alpha1.ConditionReady); ready == nil || ready.Status != metav1.ConditionTrue {
		t.Errorf("first status %+v, want Ready=True", first[0].Status)
	}
	// At the end of the interval the status has every pod. The first write
	// may have had them all already (the writer took the mark after the
	// syncs): then there is nothing more to write.
	f.clock.Step(tenantStatusInterval)
	want := metav1.NewTime(t0.Add(-49*time.Minute + time.Hour))
	complete := func(w []*v1alpha1.PodLifetimePolicy) bool {
		last := w[len(w)-1].Status
		return last.PodsWithDeadline == 50 && last.NextDeadline != nil && last.NextDeadline.Equal(&want)
	}
	if err := wait.PollUntilContextTimeout(f.ctx, time.Millisecond, 10*time.Second, true,
		func(context.Context) (bool, error) { return complete(f.statusWrites()), nil }); err != nil {
		last := f.statusWrites()[len(f.statusWrites())-1].Status
		t.Errorf("status after the interval: podsWithDeadline %d, nextDeadline %v; want 50, %v", last.PodsWithDeadline, last.NextDeadline, want)
	}
	time.Sleep(200 * time.Millisecond)
	if n := len(f.statusWrites()); n > 2 {
		t.Errorf("%d status writes, want at most 2 (one per interval)", n)
	}
}

// TestTenantPolicyStaysAcrossPolicyReload proves that without SetTenantPolicies
// (--tenant-policies=false) the evaluator has no tenant policies, and that
// a policy reload keeps them when they are on.
func TestTenantPolicyStaysAcrossPolicyReload(t *testing.T) {
	pod := tenantPod("old", "team-a", t0.Add(-2*time.Hour), nil)
	f := newTenantFixture(t, policy.Restrictions{}, nil, []*corev1.Pod{pod})
	if err := f.c.SetEvaluator(&policy.Evaluator{}); err != nil {
		t.Fatal(err)
	}
	if f.c.evaluator.Load().Tenants == nil {
		t.Fatal("a policy reload dropped the tenant policies")
	}
	plain := newFixture(t, Options{}, pod)
	if plain.c.evaluator.Load().Tenants != nil {
		t.Fatal("tenant policies honoured without SetTenantPolicies")
	}
}
