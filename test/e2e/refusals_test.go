//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
)

// createBudget creates a PodDisruptionBudget over the pods labelled app=app.
func createBudget(t *testing.T, ns, name, app string, spec policyv1.PodDisruptionBudgetSpec) {
	t.Helper()
	spec.Selector = &metav1.LabelSelector{MatchLabels: map[string]string{"app": app}}
	pdb := &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: spec}
	if _, err := client.PolicyV1().PodDisruptionBudgets(ns).Create(ctxFor(t), pdb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// denyDeletes makes a ValidatingAdmissionPolicy deny the DELETE of the pods
// of ns labelled deny=yes, and waits until it does. It is removed before
// the namespace, whose deletion must delete the pods.
func denyDeletes(t *testing.T, ns string) {
	t.Helper()
	ctx := ctxFor(t)
	name := "e2e-deny-delete-" + ns
	policies := client.AdmissionregistrationV1().ValidatingAdmissionPolicies()
	bindings := client.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings()
	_, err := policies.Create(ctx, &admissionv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: ptrTo(admissionv1.Fail),
			MatchConstraints: &admissionv1.MatchResources{ResourceRules: []admissionv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionv1.RuleWithOperations{
					Operations: []admissionv1.OperationType{admissionv1.Delete},
					Rule:       admissionv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}},
				},
			}}},
			Validations: []admissionv1.Validation{{Expression: "request.operation != 'DELETE'", Message: "pods labelled deny=yes are kept for audit"}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = policies.Delete(context.Background(), name, metav1.DeleteOptions{}) })
	_, err = bindings.Create(ctx, &admissionv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName:        name,
			ValidationActions: []admissionv1.ValidationAction{admissionv1.Deny},
			MatchResources: &admissionv1.MatchResources{
				NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": ns}},
				ObjectSelector:    &metav1.LabelSelector{MatchLabels: map[string]string{"deny": "yes"}},
			},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = bindings.Delete(context.Background(), name, metav1.DeleteOptions{}) })

	probe := createPod(t, ns, "deny-probe", unscheduled, label("deny", "yes"))
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		err := client.CoreV1().Pods(ns).Delete(ctx, probe.Name, metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
		return err != nil && strings.Contains(err.Error(), "denied request"), nil
	})
	if err != nil {
		t.Fatal("the admission policy never denied a delete")
	}
}

// refusalEvents returns the EvictionBlocked and RemovalRefused events of ns by pod UID.
func refusalEvents(t *testing.T, ns string) map[types.UID][]string {
	t.Helper()
	list, err := client.EventsV1().Events(ns).List(ctxFor(t), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[types.UID][]string{}
	for _, e := range list.Items {
		if e.Reason != "EvictionBlocked" && e.Reason != "RemovalRefused" {
			continue
		}
		n := 1
		if e.Series != nil {
			n = int(e.Series.Count)
		}
		for range n {
			out[e.Regarding.UID] = append(out[e.Regarding.UID], e.Type+" "+e.Reason+" "+e.Action)
		}
	}
	return out
}

// TestRefusalsDoNotStarveDuePods runs podjanitor under a removal cap of 2/s
// (the default burst) beside 20 pods it can never remove: 10 Running pods
// that two PodDisruptionBudgets select (every eviction answers 500 "more than
// one PodDisruptionBudget") and 10 Pending pods whose DELETE an admission
// policy denies. 40 ordinary pods come due at 2/s, from 30 s after the
// refused pods. Asserted: every ordinary pod goes within 3 s of its deadline
// (their retries took the removal tokens: 6.5 s and more late before); the
// refused pods stay, neither evicted nor deleted; each has exactly one
// Warning (EvictionBlocked, RemovalRefused) and is retried with the slow
// backoff (at most 6 tries in the minute); the refusals are counted as
// multiple_budgets and admission_denied.
func TestRefusalsDoNotStarveDuePods(t *testing.T) {
	t.Parallel()
	const (
		bound    = 3 * time.Second
		ordinary = 40
		spacing  = 500 * time.Millisecond // 2/s: the cap's rate
	)
	ns := newNamespace(t)
	w := watchRemovalsDurably(t, ns)
	createBudget(t, ns, "budget-a", "two-budgets", policyv1.PodDisruptionBudgetSpec{MaxUnavailable: ptrTo(intstr.FromString("100%"))})
	createBudget(t, ns, "budget-b", "two-budgets", policyv1.PodDisruptionBudgetSpec{MaxUnavailable: ptrTo(intstr.FromString("100%"))})
	denyDeletes(t, ns)

	due := time.Now().Add(25 * time.Second) // time for the pods to run and podjanitor to start
	twoBudgets := createPods(t, 10, func(i int) *corev1.Pod {
		return pod(ns, fmt.Sprintf("two-budgets-%d", i), onNode, label("app", "two-budgets"), expiresAt(due))
	})
	denied := createPods(t, 10, func(i int) *corev1.Pod {
		return pod(ns, fmt.Sprintf("denied-%d", i), label("deny", "yes"), expiresAt(due))
	})
	deadline := func(i int) time.Time { return due.Add(30*time.Second + time.Duration(i)*spacing) }
	ordinaries := createPods(t, ordinary, func(i int) *corev1.Pod {
		return pod(ns, fmt.Sprintf("ordinary-%d", i), expiresAt(deadline(i)))
	})
	for _, p := range twoBudgets {
		waitPod(t, p, "Running", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
	}
	d := startDaemon(t, "--namespace", ns, "--max-deletions-per-second", "2", "--metrics-bind-address", "127.0.0.1:0")
	refused := append(append([]*corev1.Pod{}, twoBudgets...), denied...)
	waitCached(t, d.log, append(append([]*corev1.Pod{}, refused...), ordinaries...))
	if time.Now().After(due) {
		t.Fatal("the pods were not ready before their deadline")
	}

	for i, p := range ordinaries {
		w.checkRemovedInTime(t, p, deadline(i), deadline(i).Add(bound))
	}
	for _, p := range refused {
		w.checkNotRemoved(t, p)
	}
	elapsed := time.Since(due)
	m := d.scrape(t)
	for _, c := range []struct {
		kind string
		pods []*corev1.Pod
	}{{"multiple_budgets", twoBudgets}, {"admission_denied", denied}} {
		n := m.sum("podjanitor_removal_errors_total", fmt.Sprintf(`error=%q`, c.kind))
		t.Logf("%s: %v refusals in %v", c.kind, n, elapsed.Round(time.Second))
		if n < float64(len(c.pods)) || n > float64(6*len(c.pods)) {
			t.Errorf(`podjanitor_removal_errors_total{error=%q} = %v in %v, want one to 6 tries per pod (%d pods; backoff 5 s, 10 s, 20 s, ...)`,
				c.kind, n, elapsed.Round(time.Second), len(c.pods))
		}
	}
	time.Sleep(2 * time.Second) // events are written after the fact
	events := refusalEvents(t, ns)
	for _, p := range twoBudgets {
		if got := events[p.UID]; len(got) != 1 || got[0] != "Warning EvictionBlocked Evict" {
			t.Errorf("pod %s: events %q, want one Warning EvictionBlocked Evict", p.Name, got)
		}
	}
	for _, p := range denied {
		if got := events[p.UID]; len(got) != 1 || got[0] != "Warning RemovalRefused Delete" {
			t.Errorf("pod %s: events %q, want one Warning RemovalRefused Delete", p.Name, got)
		}
	}
}

// TestEvictionHonoursKeepAddedOnAStaleCache: a PodDisruptionBudget of
// minAvailable 1 covers a Ready pod and two Running pods that are not Ready
// (crash-looping). For those, the Eviction API drops the client's
// resourceVersion precondition and uses the one it reads itself. The proxy
// delays podjanitor's watch by 3 s, and one second before the pods' ttl
// ends the test adds keep to one of them. Asserted: that pod stays, and
// podjanitor read it from the API server after its cache had told it the pod
// was due (the race did happen); the other goes on time.
func TestEvictionHonoursKeepAddedOnAStaleCache(t *testing.T) {
	t.Parallel()
	const ttlFor = 20 * time.Second
	ns := newNamespace(t)
	ctx := ctxFor(t)
	w := watchRemovalsDurably(t, ns)
	createBudget(t, ns, "guard", "guarded", policyv1.PodDisruptionBudgetSpec{MinAvailable: ptrTo(intstr.FromInt32(1))})
	anchor := createPod(t, ns, "anchor", onNode, label("app", "guarded"))
	kept := createPod(t, ns, "kept", label("app", "guarded"), fate("crashloop", 0), ttl(ttlFor))
	evicted := createPod(t, ns, "evicted", label("app", "guarded"), fate("crashloop", 0), ttl(ttlFor))
	isReady := func(p *corev1.Pod) bool {
		c := condition(p, corev1.PodReady)
		return c != nil && c.Status == corev1.ConditionTrue
	}
	waitPod(t, anchor, "Ready", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning && isReady(p) })
	for _, p := range []*corev1.Pod{kept, evicted} {
		waitPod(t, p, "Running and not Ready", func(p *corev1.Pod) bool {
			c := condition(p, corev1.PodReady)
			return p.Status.Phase == corev1.PodRunning && c != nil && c.Status == corev1.ConditionFalse
		})
	}
	// The budget's status must allow the unhealthy-pod path: 1 healthy of 1 desired.
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		pdb, err := client.PolicyV1().PodDisruptionBudgets(ns).Get(ctx, "guard", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		s := pdb.Status
		return s.ObservedGeneration >= pdb.Generation && s.ExpectedPods == 3 && s.CurrentHealthy == 1 && s.DesiredHealthy == 1, nil
	})
	if err != nil {
		t.Fatalf("the budget's status never showed 1 healthy pod of 1 desired, of 3: %v", err)
	}

	proxy := newFaultProxy(t)
	proxy.delayWatches(3 * time.Second)
	d := startDaemon(t, "--namespace", ns, "--kubeconfig", proxy.kubeconfig(t))
	waitCached(t, d.log, []*corev1.Pod{anchor, kept, evicted})
	deadline := created(kept).Add(ttlFor)
	time.Sleep(time.Until(deadline.Add(-time.Second)))
	if _, err := client.CoreV1().Pods(ns).Patch(ctx, kept.Name, types.MergePatchType,
		[]byte(`{"metadata":{"annotations":{"podjanitor.io/keep":"true"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	if time.Now().After(deadline) {
		t.Fatal("keep was added only after the deadline; the test did not test the race")
	}

	w.checkRemovedInTime(t, evicted, created(evicted).Add(ttlFor), created(evicted).Add(ttlFor+10*time.Second))
	time.Sleep(time.Until(deadline.Add(8 * time.Second)))
	w.checkNotRemoved(t, kept)
	w.checkNotRemoved(t, anchor)
	read := false
	for _, r := range proxy.served(ns) {
		read = read || (r.Method == http.MethodGet && r.Pod == kept.Name && r.Sub == "" && !r.At.Before(deadline))
	}
	if !read {
		t.Error("podjanitor never read the kept pod afresh at its deadline; the test did not test the race")
	}
}
