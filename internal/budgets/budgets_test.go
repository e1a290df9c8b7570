package budgets

import (
	"context"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
)

func pdb(ns, name string, sel *metav1.LabelSelector) *policyv1.PodDisruptionBudget {
	return &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       policyv1.PodDisruptionBudgetSpec{Selector: sel},
	}
}

func pod(ns, name string, l map[string]string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: l}}
}

func app(v string) *metav1.LabelSelector { return &metav1.LabelSelector{MatchLabels: map[string]string{"app": v}} }

func TestCovering(t *testing.T) {
	pdbs := []*policyv1.PodDisruptionBudget{
		pdb("a", "web-2", app("web")),
		pdb("a", "web-1", app("web")),
		pdb("b", "web", app("web")),                // another namespace
		pdb("a", "db", app("db")),                  // another app
		pdb("a", "nil", nil),                       // matches nothing
		pdb("a", "empty", &metav1.LabelSelector{}), // matches nothing at the eviction API
		pdb("a", "bad", &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: "Nope"}}}),
		pdb("a", "tier", &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "tier", Operator: metav1.LabelSelectorOpExists}}}),
	}
	for _, c := range []struct {
		pod  *corev1.Pod
		want []string
	}{
		{pod("a", "p", map[string]string{"app": "web"}), []string{"a/web-1", "a/web-2"}},
		{pod("a", "p", map[string]string{"app": "web", "tier": "x"}), []string{"a/tier", "a/web-1", "a/web-2"}},
		{pod("a", "p", map[string]string{"app": "db"}), []string{"a/db"}},
		{pod("a", "p", nil), nil},
		{pod("c", "p", map[string]string{"app": "web"}), nil},
	} {
		if got := Covering(pdbs, c.pod); !slices.Equal(got, c.want) {
			t.Errorf("Covering(%s labels %v) = %q, want %q", c.pod.Namespace, c.pod.Labels, got, c.want)
		}
	}
}

func gate(t *testing.T, perBudget int, pdbs ...*policyv1.PodDisruptionBudget) *Gate {
	t.Helper()
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	for _, p := range pdbs {
		obj, _ := Transform(p)
		if err := idx.Add(obj); err != nil {
			t.Fatal(err)
		}
	}
	return NewGate(idx, perBudget)
}

// acquireAsync reports on the channel once Acquire returns.
func acquireAsync(ctx context.Context, g *Gate, p *corev1.Pod) chan func() {
	got := make(chan func(), 1)
	go func() {
		release, err := g.Acquire(ctx, p)
		if err != nil {
			close(got)
			return
		}
		got <- release
	}()
	return got
}

func TestGateOneEvictionPerBudget(t *testing.T) {
	ctx := context.Background()
	g := gate(t, 1, pdb("a", "web", app("web")), pdb("a", "db", app("db")))
	web := map[string]string{"app": "web"}
	first, err := g.Acquire(ctx, pod("a", "w1", web))
	if err != nil {
		t.Fatal(err)
	}
	second := acquireAsync(ctx, g, pod("a", "w2", web))
	select {
	case <-second:
		t.Fatal("a second eviction under the same budget was let in while the first was in flight")
	case <-time.After(100 * time.Millisecond):
	}
	if n := g.Waiting(); n != 1 {
		t.Errorf("Waiting() = %d, want 1", n)
	}
	// Another budget's pod, a pod under none, another namespace's: not held.
	for _, p := range []*corev1.Pod{pod("a", "d1", map[string]string{"app": "db"}), pod("a", "x", nil), pod("b", "w", web)} {
		release, err := g.Acquire(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		release()
	}
	first()
	select {
	case release := <-second:
		release()
	case <-time.After(5 * time.Second):
		t.Fatal("the second eviction was not let in after the first released its turn")
	}
	if len(g.slots) != 0 {
		t.Errorf("slots left after every release: %v", g.slots)
	}
}

func TestGatePerBudgetAndCancel(t *testing.T) {
	g := gate(t, 2, pdb("a", "web", app("web")))
	web := map[string]string{"app": "web"}
	ctx := context.Background()
	r1, _ := g.Acquire(ctx, pod("a", "w1", web))
	r2, _ := g.Acquire(ctx, pod("a", "w2", web)) // two at a time
	cctx, cancel := context.WithCancel(ctx)
	third := acquireAsync(cctx, g, pod("a", "w3", web))
	time.Sleep(50 * time.Millisecond)
	cancel()
	select {
	case r, ok := <-third:
		if ok {
			r()
			t.Fatal("a third eviction was let in with two in flight")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Acquire did not return when its context ended")
	}
	r1()
	r2()
	if len(g.slots) != 0 {
		t.Errorf("slots left: %v", g.slots)
	}
}

// A pod under two budgets holds both; one under the second only waits.
func TestGateTwoBudgets(t *testing.T) {
	g := gate(t, 1, pdb("a", "web", app("web")),
		pdb("a", "all", &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: metav1.LabelSelectorOpExists}}}))
	ctx := context.Background()
	both, _ := g.Acquire(ctx, pod("a", "w", map[string]string{"app": "web"}))
	other := acquireAsync(ctx, g, pod("a", "d", map[string]string{"app": "db"}))
	select {
	case <-other:
		t.Fatal("a pod under the budget \"all\" was let in while another of its pods was in flight")
	case <-time.After(100 * time.Millisecond):
	}
	both()
	(<-other)()
}

func TestNilGate(t *testing.T) {
	var g *Gate
	release, err := g.Acquire(context.Background(), pod("a", "p", nil))
	if err != nil || release == nil {
		t.Fatalf("nil Gate: release nil %v, err %v", release == nil, err)
	}
	release()
	if g.Waiting() != 0 {
		t.Error("nil Gate waits")
	}
}
