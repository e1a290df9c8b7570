package main

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	testingclock "k8s.io/utils/clock/testing"
)

// gaugeOf keeps what podWatchHealth tells its metric.
type gaugeOf struct{ healthy atomic.Bool }

func (g *gaugeOf) set(healthy bool) { g.healthy.Store(healthy) }

// TestPodWatchHealth: the pod watch fails once its requests have failed for
// podWatchGrace, none succeeding, on the metric and in check, until one
// succeeds; a success within the grace starts it again; a request cancelled
// at shutdown is no failure.
func TestPodWatchHealth(t *testing.T) {
	clk := testingclock.NewFakeClock(time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC))
	var gauge gaugeOf
	h := newPodWatchHealth(klog.Background(), clk, gauge.set)
	healthy := func(when string, want bool) {
		t.Helper()
		if err := h.check(); (err == nil) != want || gauge.healthy.Load() != want {
			t.Errorf("%s: check %v, gauge healthy %v; want healthy %v", when, err, gauge.healthy.Load(), want)
		}
	}
	healthy("new", true)
	forbidden := apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "", errors.New("RBAC"))
	h.observe(forbidden)
	clk.Step(podWatchGrace - time.Second)
	h.observe(context.Canceled)
	healthy("failing for less than the grace", true)
	h.observe(nil)
	clk.Step(time.Minute)
	h.observe(errors.New("connection refused"))
	clk.Step(podWatchGrace - time.Second)
	healthy("failing again, for less than the grace since the success", true)
	clk.Step(time.Second)
	err := h.check()
	if err == nil || !strings.Contains(err.Error(), "since 2026-12-07T12:02:59Z") || !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("failing for the grace: check = %v, want the time of the first failure in a row and the last error", err)
	}
	if gauge.healthy.Load() {
		t.Error("failing for the grace: gauge healthy, want 0")
	}
	h.observe(forbidden)
	healthy("failing on", false)
	h.observe(nil)
	healthy("recovered", true)
	var none *podWatchHealth
	none.observe(forbidden)
	if none.check() != nil {
		t.Error("a nil podWatchHealth must report healthy")
	}
}

// TestPodWatchRevoked: the pod informer, synced, whose watch ends and whose
// list and watch are then forbidden (RBAC revoked), fails the check and the
// metric once the grace has passed, and recovers when they are allowed again.
func TestPodWatchRevoked(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	client := fake.NewClientset(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web-1"}})
	var revoked atomic.Bool
	forbidden := apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "", errors.New(`User "system:serviceaccount:podjanitor:podjanitor" cannot list resource "pods"`))
	var mu sync.Mutex
	var watches []*watch.FakeWatcher
	var failures atomic.Int64
	client.PrependReactor("list", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		if revoked.Load() {
			failures.Add(1)
			return true, nil, forbidden
		}
		return false, nil, nil
	})
	client.PrependWatchReactor("pods", func(k8stesting.Action) (bool, watch.Interface, error) {
		if revoked.Load() {
			failures.Add(1)
			return true, nil, forbidden
		}
		w := watch.NewFake()
		mu.Lock()
		watches = append(watches, w)
		mu.Unlock()
		return true, w, nil
	})
	clk := testingclock.NewFakeClock(time.Now())
	var gauge gaugeOf
	health := newPodWatchHealth(klog.FromContext(ctx), clk, gauge.set)
	factory := informerFactory(client, scopeFlags{}, health)
	informer := factory.Core().V1().Pods().Informer()
	factory.Start(ctx.Done())
	t.Cleanup(func() { cancel(); factory.Shutdown() })
	if !cache.WaitForCacheSync(ctx.Done(), informer.HasSynced) {
		t.Fatal("the pod informer did not sync")
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		if err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) { return cond(), nil }); err != nil {
			t.Fatalf("%s: not within 30 s", what)
		}
	}
	waitFor("the first watch", func() bool { mu.Lock(); defer mu.Unlock(); return len(watches) == 1 })
	if err := health.check(); err != nil || !gauge.healthy.Load() {
		t.Fatalf("synced: check %v, gauge healthy %v; want healthy", err, gauge.healthy.Load())
	}
	revoked.Store(true)
	mu.Lock()
	watches[0].Stop() // the watch ends; the next requests are forbidden
	mu.Unlock()
	waitFor("a forbidden request", func() bool { return failures.Load() > 0 })
	if err := health.check(); err != nil || !gauge.healthy.Load() {
		t.Errorf("forbidden within the grace: check %v, gauge healthy %v; want healthy", err, gauge.healthy.Load())
	}
	clk.Step(podWatchGrace)
	if err := health.check(); err == nil || !strings.Contains(err.Error(), "pod watch failing") || !strings.Contains(err.Error(), "forbidden") {
		t.Errorf("forbidden for the grace: check = %v, want the pod watch failing, forbidden", err)
	}
	if gauge.healthy.Load() {
		t.Error("forbidden for the grace: gauge healthy, want 0")
	}
	revoked.Store(false)
	waitFor("the pod watch healthy again", func() bool { return health.check() == nil && gauge.healthy.Load() })
}
