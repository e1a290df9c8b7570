//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// writePolicy writes a policy file with the given rules (YAML list items).
func writePolicy(t *testing.T, path, rules string) string {
	t.Helper()
	if path == "" {
		path = filepath.Join(t.TempDir(), "policy.yaml")
	}
	content := "apiVersion: podjanitor.io/v1alpha1\nkind: PodJanitorPolicy\nrules:\n" + rules
	// Write and rename, as a ConfigMap volume update does, so a reader never sees half a file.
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestPolicyRules(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	r := watchRemovals(t, ns)
	cfg := writePolicy(t, "", `
  - name: evicted
    match: {phases: [Failed], reasons: [Evicted]}
    clock: finished
    after: 4s
  - name: crash-looping
    match: {reasons: [CrashLoopBackOff]}
    clock: crashLooping
    minRestarts: 3
    after: 3s
  - name: stuck-pending
    match: {labelSelector: "stuck=yes"}
    clock: pending
    after: 5s
`)
	startDaemon(t, "--namespace", ns, "--config", cfg)

	evicted := createPod(t, ns, "evicted", fate("evict", time.Second))
	completed := createPod(t, ns, "completed", fate("complete", 0))
	failed := createPod(t, ns, "failed", fate("fail", 0))
	crashing := createPod(t, ns, "crashing", fate("crashloop", time.Second))
	pending := createPod(t, ns, "never-scheduled", label("stuck", "yes"))
	pendingOther := createPod(t, ns, "pending-unlabelled")
	annotated := createPod(t, ns, "annotated-evicted", fate("evict", 0), annotate(prefix+"ttl-after-finished", "1h"))

	e := waitPod(t, evicted, "evicted", func(p *corev1.Pod) bool { return condition(p, corev1.DisruptionTarget) != nil })
	r.checkOnTime(t, evicted, condition(e, corev1.DisruptionTarget).LastTransitionTime.Add(4*time.Second))
	c := waitPod(t, crashing, "crash-looping", func(p *corev1.Pod) bool {
		return len(p.Status.ContainerStatuses) > 0 && p.Status.ContainerStatuses[0].State.Waiting != nil
	})
	r.checkOnTime(t, crashing, condition(c, corev1.PodReady).LastTransitionTime.Add(3*time.Second))
	waitRemovalEvent(t, crashing, "Evict") // Running pods are evicted by default
	r.checkOnTime(t, pending, created(pending).Add(5*time.Second))

	time.Sleep(2 * time.Second)
	for _, p := range []*corev1.Pod{completed, failed, pendingOther, annotated} {
		r.checkNotRemoved(t, p)
	}
}

func TestPodDisruptionBudgetBlocksEviction(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	r := watchRemovals(t, ns)
	ctx := ctxFor(t)
	pdb := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: "guard", Namespace: ns},
		Spec: policyv1.PodDisruptionBudgetSpec{
			MinAvailable: ptrTo(intstr.FromInt32(1)),
			Selector:     &metav1.LabelSelector{MatchLabels: map[string]string{"app": "guarded"}},
		},
	}
	pdb, err := client.PolicyV1().PodDisruptionBudgets(ns).Create(ctx, pdb, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := writePolicy(t, "", `
  - name: max-age
    match: {labelSelector: "app=guarded"}
    clock: created
    after: 2s
`)
	pod := createPod(t, ns, "guarded", onNode, label("app", "guarded"))
	waitPod(t, pod, "Running", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
	startDaemon(t, "--namespace", ns, "--config", cfg)

	waitEvent(t, pod, "EvictionBlocked", 20*time.Second)
	time.Sleep(5 * time.Second) // several retries
	r.checkNotRemoved(t, pod)
	if n := countEvents(t, pod, "EvictionBlocked"); n != 1 {
		t.Errorf("EvictionBlocked events = %d, want exactly 1 (not one per retry)", n)
	}

	pdb, err = client.PolicyV1().PodDisruptionBudgets(ns).Get(ctx, pdb.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pdb.Spec.MinAvailable = ptrTo(intstr.FromInt32(0))
	if _, err := client.PolicyV1().PodDisruptionBudgets(ns).Update(ctx, pdb, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	raised := time.Now()
	at := r.waitRemoved(t, pod, 60*time.Second)
	t.Logf("evicted %v after the budget was raised", at.Sub(raised))
	waitRemovalEvent(t, pod, "Evict")
}

func TestKubeSystemIsExcludedUnlessNamed(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	run := fmt.Sprintf("ks-%04d", rand.IntN(10000))
	r, rSystem := watchRemovals(t, ns), watchRemovals(t, metav1.NamespaceSystem)
	cfg := writePolicy(t, "", `
  - name: everything-old
    match: {namespaces: {include: ["*"]}}
    clock: created
    after: 2s
`)
	// Scoped by label to this test's pods, but across all namespaces.
	startDaemon(t, "--label-selector", "e2e-run="+run, "--config", cfg)
	inNS := createPod(t, ns, "ordinary", label("e2e-run", run))
	system := createPod(t, metav1.NamespaceSystem, "system-"+run, label("e2e-run", run))
	t.Cleanup(func() {
		_ = client.CoreV1().Pods(metav1.NamespaceSystem).Delete(context.Background(), system.Name, metav1.DeleteOptions{})
	})
	r.checkOnTime(t, inNS, created(inNS).Add(2*time.Second))
	time.Sleep(3 * time.Second)
	rSystem.checkNotRemoved(t, system)
}

func TestPlanMatchesWhatTheDaemonDoes(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	r := watchRemovals(t, ns)
	cfg := writePolicy(t, "", `
  - name: failed
    match: {phases: [Failed]}
    clock: finished
    after: 5s
`)
	pods := []*corev1.Pod{
		createPod(t, ns, "ttl", ttl(8*time.Second)),
		createPod(t, ns, "expires", annotate(prefix+"expires-at", time.Now().Add(10*time.Second).UTC().Format(time.RFC3339))),
		createPod(t, ns, "failed", fate("fail", 0)),
		createPod(t, ns, "far", ttl(time.Hour)),
	}
	untouched := []*corev1.Pod{
		createPod(t, ns, "plain"),
		createPod(t, ns, "kept", ttl(time.Second), annotate(prefix+"keep", "true")),
		createPod(t, ns, "invalid", annotate(prefix+"ttl", "soon")),
	}
	waitPod(t, pods[2], "Failed", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodFailed })

	out, err := exec.Command(binary, "plan", "--kubeconfig", kubeconfig, "--namespace", ns, "--config", cfg, "-o", "json").Output()
	if err != nil {
		t.Fatalf("podjanitor plan: %v", err)
	}
	var plan struct {
		Pods []struct {
			Pod, Source, Action string
			Deadline            time.Time
		}
		Totals  map[string]int
		Invalid []struct{ Pod, Error string }
	}
	if err := json.Unmarshal(out, &plan); err != nil {
		t.Fatalf("plan -o json: %v\n%s", err, out)
	}
	t.Logf("plan: %s", out)
	wantOrder := []string{"failed", "ttl", "expires", "far"}
	if len(plan.Pods) != len(wantOrder) {
		t.Fatalf("plan lists %d pods, want %d: %+v", len(plan.Pods), len(wantOrder), plan.Pods)
	}
	deadlines := map[string]time.Time{}
	for i, e := range plan.Pods {
		if e.Pod != wantOrder[i] {
			t.Errorf("plan entry %d is %s, want %s (sorted by deadline)", i, e.Pod, wantOrder[i])
		}
		deadlines[e.Pod] = e.Deadline
	}
	if plan.Totals["rule/failed"] != 1 || plan.Totals[prefix+"ttl"] != 2 || plan.Totals[prefix+"expires-at"] != 1 {
		t.Errorf("plan totals = %v", plan.Totals)
	}
	if len(plan.Invalid) != 1 || plan.Invalid[0].Pod != "invalid" {
		t.Errorf("plan invalid = %+v, want the pod with ttl=soon", plan.Invalid)
	}

	startDaemon(t, "--namespace", ns, "--config", cfg)
	for _, p := range pods[:3] {
		r.checkOnTime(t, p, deadlines[p.Name])
	}
	time.Sleep(2 * time.Second)
	for _, p := range append(untouched, pods[3]) {
		r.checkNotRemoved(t, p)
	}
}

func TestPolicyReload(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	r := watchRemovals(t, ns)
	cfg := writePolicy(t, "", `
  - name: nothing-yet
    match: {labelSelector: "reload=later"}
    clock: finished
    after: 1h
`)
	d := startDaemon(t, "--namespace", ns, "--config", cfg)
	pod := createPod(t, ns, "finished", fate("complete", 0), label("reload", "now"))
	waitPod(t, pod, "Succeeded", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodSucceeded })
	time.Sleep(time.Second)

	if err := os.WriteFile(cfg, []byte("apiVersion: podjanitor.io/v1alpha1\nkind: PodJanitorPolicy\nrules: []\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	d.waitLog("Rejected the changed policy file", 15*time.Second)
	r.checkNotRemoved(t, pod)

	writePolicy(t, cfg, `
  - name: finished-now
    match: {labelSelector: "reload=now"}
    clock: finished
    after: 1s
`)
	changed := time.Now()
	d.waitLog("Reloaded the policy file", 15*time.Second)
	at := r.waitRemoved(t, pod, 20*time.Second)
	t.Logf("removed %v after the policy file changed", at.Sub(changed))
}

func ptrTo[T any](v T) *T { return &v }
