package main

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	clientevents "k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/podjanitor/podjanitor/internal/tenant"
	"github.com/podjanitor/podjanitor/internal/wave"
	v1alpha1 "github.com/podjanitor/podjanitor/pkg/apis/podjanitor/v1alpha1"
	pjfake "github.com/podjanitor/podjanitor/pkg/generated/clientset/versioned/fake"
	"github.com/podjanitor/podjanitor/policy"
)

// BenchmarkTenantPolicyChange measures what a change of a PodLifetimePolicy
// costs in a namespace of 10,000 pods: the policy converted, every pod of
// the namespace queued (by the namespace index) and decided again (each
// parked for its new deadline), one op each. Besides ns/op it reports the
// process's CPU time per change (user + system, all goroutines) and the
// pods decided per second. 10,000 pods of other namespaces sit in the cache
// too (before the namespace index, their keys were looked at). writes=1 is
// one write per --namespace-redecision-interval, a pass each; writes=40 is
// 40 writes within one interval (a tenant rewriting its policy 40 times a
// second), which coalesce into one pass: cpu-ms/op is then per write. Run
// it with
//
//	go test -run '^$' -bench TenantPolicyChange -benchtime 20x .
func BenchmarkTenantPolicyChange(b *testing.B) {
	for _, writes := range []int{1, 40} {
		b.Run(fmt.Sprintf("writes=%d", writes), func(b *testing.B) { benchmarkTenantPolicyChange(b, writes, false) })
	}
	// With --hold-waves: each write's wave measured over the namespace.
	for _, writes := range []int{1, 40} {
		b.Run(fmt.Sprintf("writes=%d/holdWaves", writes), func(b *testing.B) { benchmarkTenantPolicyChange(b, writes, true) })
	}
}

func benchmarkTenantPolicyChange(b *testing.B, writes int, holdWaves bool) {
	klog.SetLogger(klog.Background().V(10)) // quiet: nothing logs at V(10)
	const n = 10000
	start := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	clk := testingclock.NewFakeClock(start)
	client := fake.NewClientset(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "bench"}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "other"}})
	var pods []*corev1.Pod
	for _, ns := range []string{"bench", "other"} {
		for i := range n {
			pods = append(pods, &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("pod-%05d", i), UID: types.UID(fmt.Sprintf("%s-%d", ns, i)),
					ResourceVersion: "1", CreationTimestamp: metav1.NewTime(start.Add(-time.Duration(i) * 100 * time.Millisecond)), Labels: map[string]string{"app": "batch"}},
				Status: corev1.PodStatus{Phase: corev1.PodPending},
			})
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	opts := Options{Evaluator: &policy.Evaluator{}, RedecisionInterval: time.Second}
	if holdWaves {
		opts.Waves = &wave.Options{Threshold: wave.Threshold{Pods: 100, Percent: 10, MinPods: 10}, Window: 5 * time.Minute}
	}
	pj := pjfake.NewSimpleClientset()
	informer := newTenantInformer(pj, scopeFlags{}, 0)
	c := newBenchController(b, ctx, clk, client, pods, opts, func(c *Controller) {
		if _, err := c.SetTenantPolicies(ctx, informer, pj, policy.Restrictions{}, time.Hour); err != nil {
			b.Fatal(err)
		}
	})
	p := &v1alpha1.PodLifetimePolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "bench", Name: "max-age", UID: "uid-max-age"},
		Spec: v1alpha1.PodLifetimePolicySpec{Rules: []v1alpha1.PodLifetimeRule{
			{Name: "max-age", Match: v1alpha1.PodLifetimeMatch{LabelSelector: "app=batch"}, Clock: "created"}}},
	}
	go c.redecide.Run(ctx)
	var cpu time.Duration
	decided := 0
	generation := 0
	for b.Loop() {
		before := cpuTime()
		for range writes {
			generation++
			p = p.DeepCopy()
			p.Generation = int64(generation)
			p.Spec.Rules[0].After = fmt.Sprintf("%dh", 1+generation%2) // a real change: every deadline moves
			// As the informer's cache has it, and its handler does.
			if err := informer.GetIndexer().Update(p); err != nil {
				b.Fatal(err)
			}
			c.enqueueNamespace(p.Namespace)
		}
		for !c.redecide.Idle() { // the namespace fed to the queue
			time.Sleep(100 * time.Microsecond)
		}
		for c.queue.Len() > 0 {
			c.processNextWorkItem(ctx, ctx)
			decided++
		}
		cpu += cpuTime() - before
		clk.Step(time.Second) // the next interval
		c.redecide.Wake()
	}
	if got := c.state.len(); got != n {
		b.Fatalf("%d pods parked, want %d", got, n)
	}
	if tenantsOf(c).Holds() != nil {
		if _, _, held := tenantsOf(c).Holds().Held("bench"); held {
			b.Fatal("a change between 1h and 2h was held")
		}
	}
	b.ReportMetric(float64(cpu.Microseconds())/1000/float64(b.N*writes), "cpu-ms/op")
	b.ReportMetric(float64(decided)/b.Elapsed().Seconds(), "pods/s")
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// maximalPolicy is a PodLifetimePolicy at the CRD's limits (with rules: 32),
// each rule with every list at its most items and every string at its most
// characters (distinct strings, as a real object's are after decoding).
func maximalPolicy(namespace, name string, rules int) *v1alpha1.PodLifetimePolicy {
	str := func(n int, tag string) string { return (tag + strings.Repeat("x", n))[:n] }
	list := func(items, n int, tag string) []string {
		out := make([]string, items)
		for i := range out {
			out[i] = str(n, fmt.Sprintf("%s-%s-%d-", name, tag, i))
		}
		return out
	}
	p := &v1alpha1.PodLifetimePolicy{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, UID: types.UID(namespace + "-" + name), Generation: 1,
		ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl", Operation: metav1.ManagedFieldsOperationUpdate}}}}
	for i := range rules {
		p.Spec.Rules = append(p.Spec.Rules, v1alpha1.PodLifetimeRule{
			Name: str(253, fmt.Sprintf("r%d-", i)), Clock: "finished", After: "1h",
			Match: v1alpha1.PodLifetimeMatch{
				LabelSelector:      selector(i),
				OwnerKinds:         v1alpha1.IncludeExclude{Include: list(32, 253, fmt.Sprintf("ki%d", i)), Exclude: list(32, 253, fmt.Sprintf("ke%d", i))},
				PriorityClassNames: v1alpha1.IncludeExclude{Include: list(32, 253, fmt.Sprintf("pi%d", i)), Exclude: list(32, 253, fmt.Sprintf("pe%d", i))},
				Phases:             []corev1.PodPhase{corev1.PodSucceeded, corev1.PodFailed},
				Reasons:            list(32, 256, fmt.Sprintf("re%d", i)),
			},
		})
	}
	return p
}

// selector is a label selector of 1,024 characters, the most the CRD allows.
func selector(rule int) string {
	var b strings.Builder
	for i := 0; b.Len() < 1024-30; i++ {
		fmt.Fprintf(&b, "k%d-%03d=%s,", rule, i, strings.Repeat("v", 20))
	}
	s := strings.TrimSuffix(b.String(), ",")
	return s + "," + ("z=" + strings.Repeat("w", 63))[:1024-len(s)-1]
}

// BenchmarkTenantPolicyMemory measures what the tenant policies of 500
// namespaces hold once read: the informer's cached copy (tenant.Transform)
// and the converted policy in the store, one maximal policy per namespace
// (maximalPolicy, at the CRD's limits), reported as heap bytes per policy
// (the live heap after a GC, less the heap before) and the process's max
// RSS. limit=default is --tenant-max-bytes-per-namespace's default, which
// keeps no rules of such a policy; limit=none keeps them all (20 policies
// then: 500 would take the machine's memory); atlimit is 500 policies of 5
// maximal rules (~220 KiB of rules each), each the most the default limit
// lets one namespace hold. Run it with
//
//	go test -run '^$' -bench TenantPolicyMemory -benchtime 1x .
func BenchmarkTenantPolicyMemory(b *testing.B) {
	klog.SetLogger(klog.Background().V(10))
	for _, bc := range []struct {
		name     string
		n, rules int
		bytes    int
	}{
		{"limit=default", 500, 32, 256 << 10},
		{"limit=none", 20, 32, 0},
		{"atlimit", 500, 5, 256 << 10},
	} {
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				client := fake.NewClientset()
				podInformer := informerFactory(client, scopeFlags{annotationPrefix: policy.DefaultAnnotationPrefix}, nil).Core().V1().Pods()
				nsInformer := informers.NewSharedInformerFactory(client, 0).Core().V1().Namespaces().Informer()
				ctx := context.Background()
				c, err := NewController(ctx, podInformer, nsInformer, client, &clientevents.FakeRecorder{}, testingclock.NewFakeClock(time.Now()), Options{Evaluator: &policy.Evaluator{}})
				if err != nil {
					b.Fatal(err)
				}
				pj := pjfake.NewSimpleClientset()
				informer := newTenantInformer(pj, scopeFlags{}, bc.bytes)
				if _, err := c.SetTenantPolicies(ctx, informer, pj, policy.Restrictions{}, time.Hour); err != nil {
					b.Fatal(err)
				}
				tenantsOf(c).SetLimits(tenant.Limits{Policies: 16, Rules: 64, Bytes: bc.bytes})
				transform := tenant.Transform(bc.bytes)
				before := liveHeap()
				for i := range bc.n {
					p := maximalPolicy(fmt.Sprintf("team-%03d", i), "max", bc.rules)
					obj, err := transform(p) // as the informer stores it
					if err != nil {
						b.Fatal(err)
					}
					if err := informer.GetIndexer().Add(obj); err != nil {
						b.Fatal(err)
					}
					tenantsOf(c).Sync(obj.(*v1alpha1.PodLifetimePolicy).Namespace) // as a namespace's pass does
				}
				after := liveHeap()
				used := len(tenantsOf(c).Store().For("team-000"))
				b.ReportMetric(float64(after-before)/float64(bc.n), "heap-B/policy")
				b.ReportMetric(float64(used), "used-in-team-000")
				b.ReportMetric(float64(maxRSS())/(1<<20), "maxrss-MiB")
				runtime.KeepAlive(c)
				runtime.KeepAlive(informer)
			}
		})
	}
}

// liveHeap is the live heap after a GC.
func liveHeap() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// maxRSS is the process's max resident set size in bytes.
func maxRSS() int64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return ru.Maxrss << 10
}
