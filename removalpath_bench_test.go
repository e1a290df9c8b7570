package main

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	clientscheme "k8s.io/client-go/kubernetes/scheme"
	core "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"

	"github.com/podjanitor/podjanitor/internal/apiclock"
	"github.com/podjanitor/podjanitor/internal/apitest"
	"github.com/podjanitor/podjanitor/internal/metrics"
	"github.com/podjanitor/podjanitor/policy"
)

// BenchmarkRemovalPath measures podjanitor's own part of a removal's
// lateness, without the API server and with the clock offset 0: from a pod's
// deadline to its DELETE reaching the client (a fake clientset), split at the
// moment the parking heap hands the key to the workqueue. The first part is
// the heap's timer waking up; the second the workqueue, a worker, the
// decision (with the namespace read, from the fake clientset here), the
// removal token and the request's setup. The real (steady) clock, 16
// workers, n pods coming due at 33/s (the steady bench's rate), podjanitor's default removal cap and
// events, and a leader's removal gate (removalGate), open. It reports the p50 and p99 of both parts and of the whole in µs
// (go test -run '^$' -bench RemovalPath -benchtime 1x .); nothing is asserted
// about them.
func BenchmarkRemovalPath(b *testing.B) {
	const n, perSecond = 660, 33
	logger := klog.Background()
	for b.Loop() {
		ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), logger))
		clk, err := apiclock.ProcessClock(logger)
		if err != nil {
			b.Fatal(err)
		}
		// The first deadline 2 s ahead: the first pass over the 660 keys
		// must park them all before any is due, on a busy machine too.
		start := clk.Now().Add(2 * time.Second)
		deadline := func(i int) time.Time { return start.Add(time.Duration(i) * time.Second / perSecond) }
		objs := []runtime.Object{&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "default"}}}
		var pods []*corev1.Pod
		for i := range n {
			p := apitest.Pod(fmt.Sprintf("p-%05d", i), start.Add(-time.Hour), corev1.PodPending,
				map[string]string{"podjanitor.io/expires-at": deadline(i).UTC().Format(time.RFC3339Nano)})
			pods = append(pods, p)
			objs = append(objs, p)
		}
		client := fake.NewClientset(objs...)
		var mu sync.Mutex
		deleted := map[string]time.Time{}
		client.PrependReactor("delete", "pods", func(a core.Action) (bool, runtime.Object, error) {
			at := clk.Now()
			mu.Lock()
			deleted[a.(core.DeleteAction).GetName()] = at
			mu.Unlock()
			return true, nil, nil
		})
		ev := &policy.Evaluator{}
		podInformer := cachedPodInformer(b, client, ev, pods)
		nsFactory := informers.NewSharedInformerFactory(client, 0)
		nsInformer := nsFactory.Core().V1().Namespaces().Informer()
		broadcaster := events.NewBroadcaster(&events.EventSinkImpl{Interface: client.EventsV1()})
		broadcaster.StartRecordingToSinkWithContext(ctx)
		recorder := broadcaster.NewRecorder(clientscheme.Scheme, controllerName)
		// A leader's gate (--leader-elect), open for the whole run.
		gate := newRemovalGate(clk, leaseConfig{duration: 2 * time.Hour, renewDeadline: time.Hour})
		gate.renewed(clk.Now(), clk.Now())
		c, err := NewController(ctx, podInformer, nsInformer, client, recorder, clk, Options{
			Evaluator: ev, Metrics: metrics.New(controllerName, "bench", "bench"),
			MaxRemovalsPerSecond: 50, RemovalBurst: 100, // the defaults' cap
			MayRemove: gate.mayRemove,
		})
		if err != nil {
			b.Fatal(err)
		}
		c.podsSynced = alwaysReady
		nsFactory.Start(ctx.Done())
		if !cache.WaitForCacheSync(ctx.Done(), nsInformer.HasSynced) {
			b.Fatal("namespace cache did not sync")
		}
		ready := map[string]time.Time{}
		var wg sync.WaitGroup
		wg.Go(func() {
			c.state.run(ctx, func(key cache.ObjectName) {
				at := clk.Now()
				mu.Lock()
				if _, ok := ready[key.Name]; !ok {
					ready[key.Name] = at
				}
				mu.Unlock()
				c.queue.Add(key)
			})
		})
		for range 16 {
			wg.Go(func() {
				for c.processNextWorkItem(ctx, ctx) {
				}
			})
		}
		for _, p := range pods {
			c.queue.Add(keyOf(p))
		}
		for clk.Now().Before(deadline(n - 1).Add(2 * time.Second)) {
			time.Sleep(100 * time.Millisecond)
		}
		cancel()
		c.queue.ShutDown()
		wg.Wait()
		broadcaster.Shutdown()
		nsFactory.Shutdown()

		var wake, handoff, total []time.Duration
		for i, p := range pods {
			r, okR := ready[p.Name]
			d, okD := deleted[p.Name]
			if !okR || !okD {
				b.Fatalf("pod %s: handed to the workqueue %v, deleted %v", p.Name, okR, okD)
			}
			if d.Before(deadline(i)) {
				b.Fatalf("pod %s deleted %v before its deadline", p.Name, deadline(i).Sub(d))
			}
			wake, handoff, total = append(wake, r.Sub(deadline(i))), append(handoff, d.Sub(r)), append(total, d.Sub(deadline(i)))
		}
		for _, s := range []struct {
			name string
			ds   []time.Duration
		}{{"wake", wake}, {"handoff", handoff}, {"total", total}} {
			slices.Sort(s.ds)
			b.ReportMetric(float64(s.ds[len(s.ds)/2].Microseconds()), s.name+"-p50-µs")
			b.ReportMetric(float64(s.ds[len(s.ds)*99/100].Microseconds()), s.name+"-p99-µs")
		}
	}
}
