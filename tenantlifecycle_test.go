package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	core "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"

	"github.com/podjanitor/podjanitor/internal/tenant"
	"github.com/podjanitor/podjanitor/internal/tenantcontroller"
	v1alpha1 "github.com/podjanitor/podjanitor/pkg/apis/podjanitor/v1alpha1"
	pjfake "github.com/podjanitor/podjanitor/pkg/generated/clientset/versioned/fake"
	"github.com/podjanitor/podjanitor/policy"
)

// slowHandlerInformer is a real informer whose handlers take their initial
// list only once gate is closed: a handler slow to catch up at start.
type slowHandlerInformer struct {
	cache.SharedIndexInformer
	gate chan struct{}
}

func (s *slowHandlerInformer) AddEventHandlerWithOptions(h cache.ResourceEventHandler, o cache.HandlerOptions) (cache.ResourceEventHandlerRegistration, error) {
	return s.SharedIndexInformer.AddEventHandlerWithOptions(cache.ResourceEventHandlerDetailedFuncs{
		AddFunc: func(obj interface{}, isInInitialList bool) {
			if isInInitialList {
				<-s.gate
			}
			h.OnAdd(obj, isInInitialList)
		},
		UpdateFunc: h.OnUpdate,
		DeleteFunc: h.OnDelete,
	}, o)
}

// TestStartWaitsForTheTenantHandler proves that the workers start only once
// the tenant policy handler has taken the initial list, not when the
// informer has synced: a pod that the cluster rule (1h) makes due and a
// tenant rule (3h) keeps longer is not removed while the handler is slow,
// and is parked until the tenant rule's deadline once it is done.
func TestStartWaitsForTheTenantHandler(t *testing.T) {
	cluster, err := policy.NewPolicy(policy.Rule{Name: "cluster-max-age", Clock: policy.ClockCreated, After: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	pod := tenantPod("old", "team-a", t0.Add(-2*time.Hour), nil)
	pj := pjfake.NewSimpleClientset(lifetimePolicy("team-a", "keep-longer", v1alpha1.PodLifetimeRule{Name: "max-age", Clock: "created", After: "3h"}))
	f := &tenantFixture{fixture: newFixtureWithNamespaces(t, Options{Evaluator: &policy.Evaluator{Policy: cluster}}, nil, pod), pj: pj}
	informer := &slowHandlerInformer{SharedIndexInformer: newTenantInformer(pj, scopeFlags{}, 0), gate: make(chan struct{})}
	if _, err := f.c.SetTenantPolicies(f.ctx, informer, pj, policy.Restrictions{}, tenantStatusInterval); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(f.ctx)
	ran := make(chan struct{})
	t.Cleanup(func() { cancel(); <-ran })
	go informer.RunWithContext(ctx)
	f.c.queue.Add(keyOf(pod)) // as the pod handler's initial list does
	go func() { defer close(ran); _ = f.c.Run(ctx, 2) }()

	if !cache.WaitForCacheSync(ctx.Done(), informer.HasSynced) {
		t.Fatal("tenant policy informer did not sync")
	}
	time.Sleep(300 * time.Millisecond) // room for a removal that must not happen
	if got := f.podWrites(); len(got) != 0 {
		t.Fatalf("pod writes %v while the tenant handler was still taking the initial list, want none", got)
	}
	close(informer.gate)
	if err := wait.PollUntilContextTimeout(ctx, time.Millisecond, 10*time.Second, true,
		func(context.Context) (bool, error) {
			return metricValue(f.metrics, "podjanitor_pods_scheduled") == 1, nil
		}); err != nil {
		t.Fatalf("pods_scheduled = %v, want 1: parked until the tenant rule's deadline", metricValue(f.metrics, "podjanitor_pods_scheduled"))
	}
	if got := f.podWrites(); len(got) != 0 {
		t.Errorf("pod writes %v, want none: the tenant rule keeps the pod until %v", got, t0.Add(time.Hour))
	}
}

// TestTenantPolicyBeingDeletedRemovesNothing proves that a policy with a
// deletion timestamp (a finalizer holds it) gives no deadline: the pod it
// made due is not removed, whether the API server bumped the generation
// with the deletion or not, and whether the watch has brought the deletion
// yet or only the fresh read before the removal sees it.
func TestTenantPolicyBeingDeletedRemovesNothing(t *testing.T) {
	for name, tc := range map[string]struct {
		generation int64
		watchSeen  bool
	}{
		"watch seen, generation bumped": {generation: 2, watchSeen: true},
		"watch seen, same generation":   {generation: 1, watchSeen: true},
		"only the fresh read sees it":   {generation: 1},
	} {
		t.Run(name, func(t *testing.T) {
			pod := tenantPod("old", "team-a", t0.Add(-2*time.Hour), nil)
			held := lifetimePolicy("team-a", "cleanup", maxAgeRule)
			held.Finalizers = []string{"example.com/gitops"}
			deleting := held.DeepCopy()
			now := metav1.NewTime(t0)
			deleting.DeletionTimestamp, deleting.Generation = &now, tc.generation
			var lagging atomic.Bool
			f := newTenantFixture(t, policy.Restrictions{}, nil, []*corev1.Pod{pod}, func(pj *pjfake.Clientset) {
				pj.PrependReactor("get", "podlifetimepolicies", func(core.Action) (bool, runtime.Object, error) {
					if lagging.Load() {
						return true, deleting.DeepCopy(), nil
					}
					return false, nil, nil
				})
			})
			policies := f.pj.PodjanitorV1alpha1().PodLifetimePolicies("team-a")
			if _, err := policies.Create(f.ctx, held, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			f.waitQueued(1)
			if tc.watchSeen {
				if _, err := policies.Update(f.ctx, deleting, metav1.UpdateOptions{}); err != nil {
					t.Fatal(err)
				}
				if err := wait.PollUntilContextTimeout(f.ctx, time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
					return len(tenantsOf(f.c).Store().For("team-a")) == 0, nil
				}); err != nil {
					t.Error("the policy being deleted is still in the store")
				}
			} else {
				lagging.Store(true)
			}
			f.drain()
			checkActions(t, nil, f.podWrites())
			if got := metricValue(f.metrics, "podjanitor_pods_scheduled"); got != 0 {
				t.Errorf("pods_scheduled = %v, want 0: a policy being deleted gives no deadline", got)
			}
			if got := f.events(); len(got) != 0 {
				t.Errorf("events = %q, want none (no Warning for a policy being deleted)", got)
			}
		})
	}
}

// policyGets counts the fresh reads of tenant policies; while block is
// open, each waits until it is closed.
type policyGets struct {
	n     atomic.Int32
	block chan struct{}
	fault error
}

func (g *policyGets) reactor(pj *pjfake.Clientset) {
	pj.PrependReactor("get", "podlifetimepolicies", func(core.Action) (bool, runtime.Object, error) {
		g.n.Add(1)
		if g.block != nil {
			<-g.block
		}
		if g.fault != nil {
			return true, nil, g.fault
		}
		return false, nil, nil
	})
}

func oldPods(n int) []*corev1.Pod {
	var pods []*corev1.Pod
	for i := range n {
		pods = append(pods, tenantPod(fmt.Sprintf("old-%02d", i), "team-a", t0.Add(-2*time.Hour), nil))
	}
	return pods
}

// TestConcurrentRemovalsShareOneTenantPolicyRead proves that 50 workers
// removing 50 pods of one policy at once make one fresh read of it, not
// one each.
func TestConcurrentRemovalsShareOneTenantPolicyRead(t *testing.T) {
	pods := oldPods(50)
	gets := &policyGets{block: make(chan struct{})}
	f := newTenantFixture(t, policy.Restrictions{}, nil, pods, gets.reactor)
	if _, err := f.pj.PodjanitorV1alpha1().PodLifetimePolicies("team-a").Create(f.ctx, lifetimePolicy("team-a", "cleanup", maxAgeRule), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitQueued(len(pods))
	var workers sync.WaitGroup
	for range pods {
		workers.Go(func() { f.c.processNextWorkItem(f.ctx, f.ctx) })
	}
	if err := wait.PollUntilContextTimeout(f.ctx, time.Millisecond, 10*time.Second, true,
		func(context.Context) (bool, error) { return gets.n.Load() > 0, nil }); err != nil {
		t.Fatal("no fresh read of the policy")
	}
	time.Sleep(500 * time.Millisecond) // room for the reads that must not happen
	close(gets.block)
	workers.Wait()
	if got := gets.n.Load(); got != 1 {
		t.Errorf("%d fresh reads of the policy for 50 concurrent removals, want 1", got)
	}
	if got := len(f.podWrites()); got != len(pods) {
		t.Errorf("%d pods removed, want %d", got, len(pods))
	}
}

// TestFailingTenantPolicyReadIsShared proves that a failed fresh read is
// shared by the removals of the next tenant.Freshness, as a good one is: 5
// due pods while the API server answers 503 cost one read, not 5, and
// remove nothing; after tenant.Freshness the policy is read again.
func TestFailingTenantPolicyReadIsShared(t *testing.T) {
	pods := oldPods(5)
	gets := &policyGets{}
	f := newTenantFixture(t, policy.Restrictions{}, nil, pods, gets.reactor)
	if _, err := f.pj.PodjanitorV1alpha1().PodLifetimePolicies("team-a").Create(f.ctx, lifetimePolicy("team-a", "cleanup", maxAgeRule), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitQueued(len(pods))
	gets.fault = apierrors.NewServiceUnavailable("the API server is shutting down")
	f.drain()
	if got := gets.n.Load(); got != 1 {
		t.Errorf("%d fresh reads of the policy for %d removals within %v while reads fail, want 1", got, len(pods), tenant.Freshness)
	}
	checkActions(t, nil, f.podWrites())
	if !f.stepAndWaitReady(tenant.Freshness) {
		t.Fatal("no pod retried after the backoff")
	}
	f.drain()
	if got := gets.n.Load(); got != 2 {
		t.Errorf("%d fresh reads of the policy after %v, want 2", got, tenant.Freshness)
	}
	checkActions(t, nil, f.podWrites())
}

// TestTenantPolicyChangedSinceTheDecisionRemovesNothing proves that a
// policy changed (keeping the pod longer) between the decision and the
// removal, with the watch bringing the change while the fresh read is on its
// way, removes nothing (TestTenantConfirmComparesTheDecisionsGeneration has
// the change before the fresh read).
func TestTenantPolicyChangedSinceTheDecisionRemovesNothing(t *testing.T) {
	pod := tenantPod("old", "team-a", t0.Add(-2*time.Hour), nil)
	longer := lifetimePolicy("team-a", "cleanup", v1alpha1.PodLifetimeRule{Name: "max-age", Clock: "created", After: "3h"})
	longer.Generation = 2
	var f *tenantFixture
	var changed atomic.Bool
	f = newTenantFixture(t, policy.Restrictions{}, nil, []*corev1.Pod{pod}, func(pj *pjfake.Clientset) {
		pj.PrependReactor("get", "podlifetimepolicies", func(core.Action) (bool, runtime.Object, error) {
			if changed.Swap(true) {
				return false, nil, nil
			}
			// The tenant's change, written and watched while the read is on its way.
			if err := pj.Tracker().Update(v1alpha1.SchemeGroupVersion.WithResource("podlifetimepolicies"), longer.DeepCopy(), "team-a"); err != nil {
				return true, nil, err
			}
			err := wait.PollUntilContextTimeout(context.Background(), time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
				return tenantPolicy(f.c, "team-a/cleanup").Generation == 2, nil
			})
			return err != nil, nil, err
		})
	})
	if _, err := f.pj.PodjanitorV1alpha1().PodLifetimePolicies("team-a").Create(f.ctx, lifetimePolicy("team-a", "cleanup", maxAgeRule), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitQueued(1)
	f.next()
	if !changed.Load() {
		t.Fatal("the policy was not read before the removal")
	}
	checkActions(t, nil, f.podWrites())
}

// TestEvictionConfirmsItsTenantPolicy proves that the eviction path's fresh
// decision confirms its tenant policy too: a running pod due by policy
// "a" on the cache, whose fresh read shows labels that policy "b" decides,
// is not evicted when "b" is gone from the API server (its deletion not yet
// watched).
func TestEvictionConfirmsItsTenantPolicy(t *testing.T) {
	pod := tenantPod("web", "team-a", t0.Add(-2*time.Hour), map[string]string{"app": "x"})
	pod.Status.Phase = corev1.PodRunning
	f := newTenantFixture(t, policy.Restrictions{}, nil, []*corev1.Pod{pod}, func(pj *pjfake.Clientset) {
		pj.PrependReactor("get", "podlifetimepolicies", func(a core.Action) (bool, runtime.Object, error) {
			if a.(core.GetAction).GetName() == "b" {
				return true, nil, apierrors.NewNotFound(v1alpha1.Resource("podlifetimepolicies"), "b")
			}
			return false, nil, nil
		})
	})
	relabelled := pod.DeepCopy()
	relabelled.Labels = map[string]string{"app": "y"}
	f.client.PrependReactor("get", "pods", func(core.Action) (bool, runtime.Object, error) { return true, relabelled.DeepCopy(), nil })
	for name, app := range map[string]string{"a": "x", "b": "y"} {
		rule := maxAgeRule
		rule.Match.LabelSelector = "app=" + app
		if _, err := f.pj.PodjanitorV1alpha1().PodLifetimePolicies("team-a").Create(f.ctx, lifetimePolicy("team-a", name, rule), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := wait.PollUntilContextTimeout(f.ctx, time.Millisecond, 10*time.Second, true,
		func(context.Context) (bool, error) { return len(tenantsOf(f.c).Store().For("team-a")) == 2, nil }); err != nil {
		t.Fatal("the two policies are not in the store")
	}
	f.waitQueued(1)
	f.drain()
	for _, a := range f.podWrites() {
		if a.GetVerb() == "create" && a.GetSubresource() == "eviction" {
			t.Errorf("pod evicted on the word of policy b, gone from the API server: %v", a)
		}
	}
}

// TestTenantConfirmComparesTheDecisionsGeneration proves that confirm
// compares the fresh read with the generation the decision was made with,
// not the cache's: a decision of generation 1, confirmed once the cache (and
// the API server) hold generation 2, is not confirmed.
func TestTenantConfirmComparesTheDecisionsGeneration(t *testing.T) {
	pod := tenantPod("old", "team-a", t0.Add(-2*time.Hour), nil)
	f := newTenantFixture(t, policy.Restrictions{}, nil, []*corev1.Pod{pod})
	policies := f.pj.PodjanitorV1alpha1().PodLifetimePolicies("team-a")
	created, err := policies.Create(f.ctx, lifetimePolicy("team-a", "cleanup", maxAgeRule), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	f.waitQueued(1)
	d, err := f.c.evaluator.Load().Decide(pod, &policy.Namespace{}, t0)
	if err != nil || d.Policy != "team-a/cleanup" || d.PolicyGeneration != 1 {
		t.Fatalf("decision %+v, %v; want one of team-a/cleanup at generation 1", d, err)
	}
	if err := tenantsOf(f.c).Confirm(f.ctx, d); err != nil {
		t.Fatalf("confirm of the current generation: %v, want nil", err)
	}
	changed := created.DeepCopy()
	changed.Generation, changed.Spec.Rules[0].After = 2, "3h"
	if _, err := policies.Update(f.ctx, changed, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(f.ctx, time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return tenantPolicy(f.c, "team-a/cleanup").Generation == 2, nil
	}); err != nil {
		t.Fatal("the cache never took generation 2")
	}
	if err := tenantsOf(f.c).Confirm(f.ctx, d); !errors.Is(err, tenantcontroller.ErrChanged) {
		t.Errorf("confirm of a decision of generation 1 with generation 2 cached and read: %v, want tenantcontroller.ErrChanged", err)
	}
}

// TestTenantStatusPatchSurvivesMetadataChurn proves that the status is
// written by a patch of the status subresource, so that a tenant writing
// the policy's metadata between podjanitor's read and its write (every
// time, here) cannot make the write conflict: an update carrying the
// resourceVersion read is refused, as the API server refuses it.
func TestTenantStatusPatchSurvivesMetadataChurn(t *testing.T) {
	gvr := v1alpha1.SchemeGroupVersion.WithResource("podlifetimepolicies")
	var churns atomic.Int32
	f := newTenantFixture(t, policy.Restrictions{}, nil, nil, func(pj *pjfake.Clientset) {
		churn := func(a core.Action) (*v1alpha1.PodLifetimePolicy, error) {
			obj, err := pj.Tracker().Get(gvr, a.GetNamespace(), "cleanup")
			if err != nil {
				return nil, err
			}
			touched := obj.(*v1alpha1.PodLifetimePolicy).DeepCopy()
			n := churns.Add(1)
			touched.Labels = map[string]string{"touched": fmt.Sprint(n)}
			touched.ResourceVersion = fmt.Sprint(100 + n)
			return touched, pj.Tracker().Update(gvr, touched, a.GetNamespace())
		}
		for _, verb := range []string{"update", "patch"} {
			pj.PrependReactor(verb, "podlifetimepolicies", func(a core.Action) (bool, runtime.Object, error) {
				if a.GetSubresource() != "status" {
					return false, nil, nil
				}
				touched, err := churn(a)
				if err != nil {
					return true, nil, err
				}
				if u, ok := a.(core.UpdateAction); ok && u.GetObject().(*v1alpha1.PodLifetimePolicy).ResourceVersion != touched.ResourceVersion {
					return true, nil, apierrors.NewConflict(v1alpha1.Resource("podlifetimepolicies"), "cleanup", errors.New("the object has been modified"))
				}
				return false, nil, nil
			})
		}
	})
	if _, err := f.pj.PodjanitorV1alpha1().PodLifetimePolicies("team-a").Create(f.ctx, lifetimePolicy("team-a", "cleanup", maxAgeRule), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(f.ctx, time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		obj, err := f.pj.Tracker().Get(gvr, "team-a", "cleanup")
		if err != nil {
			return false, err
		}
		p := obj.(*v1alpha1.PodLifetimePolicy)
		return p.Status.ObservedGeneration == 1 && meta.IsStatusConditionTrue(p.Status.Conditions, v1alpha1.ConditionReady), nil
	}); err != nil {
		t.Errorf("no status written while the tenant touches the metadata (%d writes tried)", churns.Load())
	}
}

// TestTenantStatusForgetsDeletedPolicies proves that the status writer
// keeps no entry for a deleted policy, though the deletion decides the
// policy's pods again (which marks it), and that a standby (whose writer
// never runs) keeps none either.
func TestTenantStatusForgetsDeletedPolicies(t *testing.T) {
	pods := oldPods(3)
	for _, p := range pods {
		p.CreationTimestamp = metav1.NewTime(t0.Add(-10 * time.Minute))
	}
	f := newTenantFixture(t, policy.Restrictions{}, nil, pods)
	policies := f.pj.PodjanitorV1alpha1().PodLifetimePolicies("team-a")
	for i := range 20 {
		name := fmt.Sprintf("cleanup-%02d", i)
		if _, err := policies.Create(f.ctx, lifetimePolicy("team-a", name, maxAgeRule), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		f.waitQueued(len(pods))
		f.drain()
		if err := policies.Delete(f.ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		f.waitQueued(len(pods))
		f.drain()
	}
	if n := tenantsOf(f.c).StatusPending(); n != 0 {
		t.Errorf("the status writer keeps state for %d policies after 20 created and deleted, want 0", n)
	}
}

// TestFirstTenantStatusHasTheRealFigures proves that the first status
// written after a start (or a failover) counts the pods the policy gives a
// deadline, not 0 before the workers have decided them.
func TestFirstTenantStatusHasTheRealFigures(t *testing.T) {
	var pods []*corev1.Pod
	for i := range 200 {
		pods = append(pods, tenantPod(fmt.Sprintf("young-%03d", i), "team-a", t0.Add(-time.Duration(i)*time.Second), nil))
	}
	pj := pjfake.NewSimpleClientset(lifetimePolicy("team-a", "cleanup", maxAgeRule))
	f := &tenantFixture{fixture: newFixtureWithNamespaces(t, Options{}, nil, pods...), pj: pj}
	informer := newTenantInformer(pj, scopeFlags{}, 0)
	if _, err := f.c.SetTenantPolicies(f.ctx, informer, pj, policy.Restrictions{}, tenantStatusInterval); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(f.ctx)
	ran := make(chan struct{})
	t.Cleanup(func() { cancel(); <-ran })
	go informer.RunWithContext(ctx)
	for _, p := range pods { // as the pod handler's initial list does
		f.c.queue.Add(keyOf(p))
	}
	go func() { defer close(ran); _ = f.c.Run(ctx, 1) }()
	first := f.waitStatusWrites(1)[0].Status
	if first.PodsWithDeadline != int32(len(pods)) {
		t.Errorf("first status after the start: podsWithDeadline %d, want %d", first.PodsWithDeadline, len(pods))
	}
}

// TestTenantPolicyRefHasNoResourceVersion: the Warnings' regarding
// reference carries no resourceVersion, so that the events library merges a
// policy's Warnings into a series instead of one event per write.
func TestTenantPolicyRefHasNoResourceVersion(t *testing.T) {
	p := lifetimePolicy("team-a", "cleanup", maxAgeRule)
	p.ResourceVersion = "42"
	if ref := tenantcontroller.PolicyRef(p); ref.ResourceVersion != "" || ref.Name != "cleanup" || ref.UID != p.UID {
		t.Errorf("reference %+v, want the policy's name and UID without resourceVersion", ref)
	}
}
