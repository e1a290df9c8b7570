package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
	clientevents "k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/podjanitor/podjanitor/internal/wave"
	"github.com/podjanitor/podjanitor/policy"
)

// newBenchController is a controller over client with pods in its cache (as
// the informer's transform stores them) and its namespace cache synced;
// before is called before the namespace informer starts (nil: nothing).
func newBenchController(b *testing.B, ctx context.Context, clk *testingclock.FakeClock, client *fake.Clientset,
	pods []*corev1.Pod, opts Options, before func(*Controller)) *Controller {
	b.Helper()
	podInformer := cachedPodInformer(b, client, opts.Evaluator, pods)
	nsFactory := informers.NewSharedInformerFactory(client, 0)
	nsInformer := nsFactory.Core().V1().Namespaces().Informer()
	c, err := NewController(ctx, podInformer, nsInformer, client, &clientevents.FakeRecorder{}, clk, opts)
	if err != nil {
		b.Fatal(err)
	}
	if before != nil {
		before(c)
	}
	nsFactory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), nsInformer.HasSynced) {
		b.Fatal("namespace cache did not sync")
	}
	return c
}

// BenchmarkPolicyReload measures a policy file reload at 10,000 pods, with
// and without the wave guard (--hold-waves): SetEvaluator (with the guard:
// the wave computed, every pod decided by the old and the new rules) and
// every pod decided again by the workers, one op each; set-ms/op is
// SetEvaluator's share (with the guard: the wave's computation). The reloads switch
// between `after: 7d` and `after: 8d`, so no wave is held and every pod is
// parked again. Run it with
//
//	go test -run '^$' -bench PolicyReload -benchtime 20x -count 6 .
func BenchmarkPolicyReload(b *testing.B) {
	klog.SetLogger(klog.Background().V(10)) // quiet: nothing logs at V(10)
	for _, hold := range []bool{false, true} {
		b.Run(fmt.Sprintf("holdWaves=%v", hold), func(b *testing.B) {
			const n = 10000
			start := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
			clk := testingclock.NewFakeClock(start)
			client := fake.NewClientset(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "bench"}})
			pods := benchPods(n, start)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			evaluators := []*policy.Evaluator{benchEvaluator(b, "7d"), benchEvaluator(b, "8d")}
			opts := Options{Evaluator: evaluators[0]}
			if hold {
				opts.Waves = &wave.Options{Threshold: wave.Threshold{Pods: 100, Percent: 10, MinPods: 10}, Window: 5 * time.Minute}
			}
			c := newBenchController(b, ctx, clk, client, pods, opts, nil)
			b.ReportAllocs()
			b.ResetTimer()
			var set time.Duration
			for i := range b.N {
				start := time.Now()
				if err := c.SetEvaluator(evaluators[(i+1)%2]); err != nil {
					b.Fatal(err)
				}
				set += time.Since(start)
				for range n {
					c.processNextWorkItem(ctx, ctx)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(set.Microseconds())/1000/float64(b.N), "set-ms/op")
			if _, held := heldChange(c); held {
				b.Fatal("a reload between 7d and 8d was held")
			}
		})
	}
}

func benchEvaluator(b *testing.B, after string) *policy.Evaluator {
	b.Helper()
	e, err := policyEvaluator(policy.DefaultAnnotationPrefix)(policyWithAfter(after))
	if err != nil {
		b.Fatal(err)
	}
	return e
}

func heldChange(c *Controller) (wave.Hold, bool) {
	if c.waves == nil {
		return wave.Hold{}, false
	}
	return c.waves.Held()
}

// BenchmarkGuard measures the wave guard alone (--hold-waves) at 10,000 and
// 150,000 Running pods in one namespace: a reload of the policy file (every
// cached pod decided by the old and the new rules: policyWaves.reload), and
// one namespace's change of labels (its pods decided with the namespace as
// it was and as it is: the namespace controller's Measure, which the
// informer's update calls before the namespace's pods are decided again).
// The reloads switch between `after: 7d` and `after: 8d` and the labels
// between tier=a and tier=b, so nothing is held and each op measures every
// pod. Run it with
//
//	go test -run '^$' -bench Guard -benchtime 10x -count 6 .
func BenchmarkGuard(b *testing.B) {
	klog.SetLogger(klog.Background().V(10)) // quiet: nothing logs at V(10)
	for _, n := range []int{10000, 150000} {
		start := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
		clk := testingclock.NewFakeClock(start)
		client := fake.NewClientset(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "bench", Labels: map[string]string{"tier": "a"}}})
		pods := benchPods(n, start)
		ctx, cancel := context.WithCancel(context.Background())
		evaluators := []*policy.Evaluator{benchEvaluator(b, "7d"), benchEvaluator(b, "8d")}
		opts := Options{Evaluator: evaluators[0],
			Waves: &wave.Options{Threshold: wave.Threshold{Pods: 100, Percent: 10, MinPods: 10}, Window: 5 * time.Minute}}
		c := newBenchController(b, ctx, clk, client, pods, opts, nil)
		b.Run(fmt.Sprintf("reload/pods=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				c.waves.reload(evaluators[(i+1)%2])
			}
			if _, held := heldChange(c); held {
				b.Fatal("a reload between 7d and 8d was held")
			}
		})
		b.Run(fmt.Sprintf("namespace/pods=%d", n), func(b *testing.B) {
			tiers := []*metav1.ObjectMeta{
				{Name: "bench", Labels: map[string]string{"tier": "a"}},
				{Name: "bench", Labels: map[string]string{"tier": "b"}},
			}
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				namespacesOf(c).Measure(tiers[i%2], tiers[(i+1)%2])
			}
			if _, _, held := namespacesOf(c).Holds().Held("bench"); held {
				b.Fatal("a label that decides nothing was held")
			}
		})
		cancel()
	}
}

// benchPods are n Running pods of namespace bench, created a second apart
// before start.
func benchPods(n int, start time.Time) []*corev1.Pod {
	pods := make([]*corev1.Pod, 0, n)
	for i := range n {
		pods = append(pods, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "bench", Name: fmt.Sprintf("pod-%06d", i), UID: types.UID(fmt.Sprint(i)),
				ResourceVersion: "1", CreationTimestamp: metav1.NewTime(start.Add(-time.Duration(i) * time.Second))},
			Status: corev1.PodStatus{Phase: corev1.PodRunning},
		})
	}
	return pods
}
