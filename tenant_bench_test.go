package main

import (
	"context"
	"fmt"
	"syscall"
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

	"github.com/podjanitor/podjanitor/internal/podcache"
	v1alpha1 "github.com/podjanitor/podjanitor/pkg/apis/podjanitor/v1alpha1"
	pjfake "github.com/podjanitor/podjanitor/pkg/generated/clientset/versioned/fake"
	"github.com/podjanitor/podjanitor/policy"
)

// BenchmarkTenantPolicyChange measures what a change of a PodLifetimePolicy
// costs in a namespace of 10,000 pods: the policy converted, every pod of
// the namespace queued and decided again (each parked for its new deadline),
// one op each. Besides ns/op it reports the process's CPU time per change
// (user + system, all goroutines) and the pods decided per second. 10,000
// pods of other namespaces sit in the cache too: they are looked at (keys)
// but not decided. Run it with
//
//	go test -run '^$' -bench TenantPolicyChange -benchtime 20x .
func BenchmarkTenantPolicyChange(b *testing.B) {
	klog.SetLogger(klog.Background().V(10)) // quiet: nothing logs at V(10)
	const n = 10000
	start := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	clk := testingclock.NewFakeClock(start)
	client := fake.NewClientset(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "bench"}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "other"}})
	factory := informerFactory(client, scopeFlags{annotationPrefix: policy.DefaultAnnotationPrefix})
	podInformer := factory.Core().V1().Pods()
	transform := podcache.PodTransform(policy.DefaultAnnotationPrefix)
	for _, ns := range []string{"bench", "other"} {
		for i := range n {
			p := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("pod-%05d", i), UID: types.UID(fmt.Sprintf("%s-%d", ns, i)),
					ResourceVersion: "1", CreationTimestamp: metav1.NewTime(start.Add(-time.Duration(i) * 100 * time.Millisecond)), Labels: map[string]string{"app": "batch"}},
				Status: corev1.PodStatus{Phase: corev1.PodPending},
			}
			obj, err := transform(p)
			if err != nil {
				b.Fatal(err)
			}
			if err := podInformer.Informer().GetIndexer().Add(obj); err != nil {
				b.Fatal(err)
			}
		}
	}
	nsFactory := informers.NewSharedInformerFactory(client, 0)
	nsInformer := nsFactory.Core().V1().Namespaces().Informer()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c, err := NewController(ctx, podInformer, nsInformer, client, &clientevents.FakeRecorder{}, clk, Options{Evaluator: &policy.Evaluator{}})
	if err != nil {
		b.Fatal(err)
	}
	pj := pjfake.NewSimpleClientset()
	if err := c.SetTenantPolicies(ctx, newTenantInformer(pj, scopeFlags{}), pj, policy.Restrictions{}, time.Hour); err != nil {
		b.Fatal(err)
	}
	nsFactory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), nsInformer.HasSynced) {
		b.Fatal("namespace cache did not sync")
	}
	p := &v1alpha1.PodLifetimePolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "bench", Name: "max-age", UID: "uid-max-age"},
		Spec: v1alpha1.PodLifetimePolicySpec{Rules: []v1alpha1.PodLifetimeRule{
			{Name: "max-age", Match: v1alpha1.PodLifetimeMatch{LabelSelector: "app=batch"}, Clock: "created"}}},
	}
	var cpu time.Duration
	decided := 0
	for i := 0; b.Loop(); i++ {
		p = p.DeepCopy()
		p.Generation = int64(i + 1)
		p.Spec.Rules[0].After = fmt.Sprintf("%dh", 1+i%2) // a real change: every deadline moves
		before := cpuTime()
		c.tenantPolicyChanged(p, true)
		for c.queue.Len() > 0 {
			c.processNextWorkItem(ctx, ctx)
			decided++
		}
		cpu += cpuTime() - before
	}
	if got := c.state.len(); got != n {
		b.Fatalf("%d pods parked, want %d", got, n)
	}
	b.ReportMetric(float64(cpu.Milliseconds())/float64(b.N), "cpu-ms/op")
	b.ReportMetric(float64(decided)/b.Elapsed().Seconds(), "pods/s")
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
