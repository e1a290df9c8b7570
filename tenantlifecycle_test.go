package main

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	core "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"

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
	informer := &slowHandlerInformer{SharedIndexInformer: newTenantInformer(pj, scopeFlags{}), gate: make(chan struct{})}
	if err := f.c.SetTenantPolicies(f.ctx, informer, pj, policy.Restrictions{}, tenantStatusInterval); err != nil {
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
					return len(f.c.tenants.store.For("team-a")) == 0, nil
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
