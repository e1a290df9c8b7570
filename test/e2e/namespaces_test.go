//go:build e2e

package e2e

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

const nsRunLabel = "e2e.podjanitor.io/ns-run"

// patchNamespace merge-patches a namespace's metadata (labels, annotations);
// a null value removes the key.
func patchNamespace(t *testing.T, ns string, metadata map[string]any) {
	t.Helper()
	patch, err := json.Marshal(map[string]any{"metadata": metadata})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().Namespaces().Patch(ctxFor(t), ns, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatalf("patching namespace %s: %v", ns, err)
	}
}

// planPods runs `podjanitor plan` and returns the names of the pods it lists.
func planPods(t *testing.T, args ...string) []string {
	t.Helper()
	out, err := exec.Command(binary, append([]string{"plan", "--kubeconfig", kubeconfig, "-o", "json"}, args...)...).Output()
	if err != nil {
		t.Fatalf("podjanitor plan: %v", err)
	}
	var plan struct {
		Pods []struct{ Namespace, Pod string }
	}
	if err := json.Unmarshal(out, &plan); err != nil {
		t.Fatalf("podjanitor plan output: %v\n%s", err, out)
	}
	var names []string
	for _, p := range plan.Pods {
		names = append(names, p.Namespace+"/"+p.Pod)
	}
	return names
}

// TestNamespaceKeep proves that podjanitor.io/keep: "true" on a namespace
// holds back its due pods, by annotation and by rule, and that removing the
// annotation lets them go with no event of the pods themselves. The daemon
// watches the one namespace (--namespace), as a namespaced install does.
func TestNamespaceKeep(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	patchNamespace(t, ns, map[string]any{"annotations": map[string]any{prefix + "keep": "true"}})
	r := watchRemovals(t, ns)
	cfg := writePolicy(t, "", `
  - name: max-age
    match: {labelSelector: "by=rule"}
    clock: created
    after: 2s
`)
	byTTL := createPod(t, ns, "ttl", ttl(2*time.Second))
	byRule := createPod(t, ns, "rule", label("by", "rule"))
	startDaemon(t, "--namespace", ns, "--config", cfg)

	time.Sleep(time.Until(created(byRule).Add(2*time.Second + latenessOK)))
	r.checkNotRemoved(t, byTTL)
	r.checkNotRemoved(t, byRule)
	if got := planPods(t, "--namespace", ns, "--config", cfg); len(got) != 0 {
		t.Errorf("plan lists %q in a kept namespace, want none", got)
	}

	released := time.Now()
	patchNamespace(t, ns, map[string]any{"annotations": map[string]any{prefix + "keep": nil}})
	for _, pod := range []*corev1.Pod{byTTL, byRule} {
		if at := r.waitRemoved(t, pod, latenessOK+10*time.Second); at.Sub(released) > latenessOK {
			t.Errorf("pod %s removed %v after its namespace's keep annotation was removed, want within %v", pod.Name, at.Sub(released), latenessOK)
		}
	}
}

// TestNamespaceSelector proves that a rule with a namespaceSelector removes
// pods only in the namespaces whose labels it selects, and that labelling a
// namespace makes its pods due without any pod event. The daemon watches
// every namespace, limited to this test's pods by a label selector.
func TestNamespaceSelector(t *testing.T) {
	t.Parallel()
	run := fmt.Sprintf("%04d", rand.IntN(10000))
	selected, other := newNamespace(t), newNamespace(t)
	cleanup := "e2e.podjanitor.io/cleanup-" + run
	patchNamespace(t, selected, map[string]any{"labels": map[string]any{cleanup: "true"}})
	rSelected, rOther := watchRemovals(t, selected), watchRemovals(t, other)
	cfg := writePolicy(t, "", fmt.Sprintf(`
  - name: cleanup
    match: {namespaceSelector: "%s=true"}
    clock: created
    after: 3s
`, cleanup))
	inSelected := createPod(t, selected, "selected", label(nsRunLabel, run))
	inOther := createPod(t, other, "other", label(nsRunLabel, run))
	startDaemon(t, "--label-selector", nsRunLabel+"="+run, "--config", cfg)

	rSelected.checkOnTime(t, inSelected, created(inSelected).Add(3*time.Second))
	time.Sleep(time.Until(created(inOther).Add(3*time.Second + latenessOK)))
	rOther.checkNotRemoved(t, inOther)
	if got := planPods(t, "--label-selector", nsRunLabel+"="+run, "--config", cfg); len(got) != 0 {
		t.Errorf("plan lists %q, want none: the remaining pod's namespace is not selected", got)
	}

	labelled := time.Now()
	patchNamespace(t, other, map[string]any{"labels": map[string]any{cleanup: "true"}})
	if at := rOther.waitRemoved(t, inOther, latenessOK+10*time.Second); at.Sub(labelled) > latenessOK {
		t.Errorf("pod %s removed %v after its namespace was labelled, want within %v", inOther.Name, at.Sub(labelled), latenessOK)
	}
}

// TestCriticalPodsNeedNaming proves that a rule leaves a pod of priority
// class system-cluster-critical alone while it removes an ordinary pod it
// matches, and removes the critical one once a rule names its class.
func TestCriticalPodsNeedNaming(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	r := watchRemovals(t, ns)
	cfg := writePolicy(t, "", `
  - name: max-age
    match: {labelSelector: "app=batch"}
    clock: created
    after: 2s
`)
	critical := createPod(t, ns, "critical", label("app", "batch"), func(p *corev1.Pod) {
		p.Spec.PriorityClassName = "system-cluster-critical"
	})
	ordinary := createPod(t, ns, "ordinary", label("app", "batch"))
	d := startDaemon(t, "--namespace", ns, "--config", cfg)

	r.checkOnTime(t, ordinary, created(ordinary).Add(2*time.Second))
	time.Sleep(time.Until(created(critical).Add(2*time.Second + latenessOK)))
	r.checkNotRemoved(t, critical)

	// Named explicitly, the critical pod goes: the exclusion is the rule's default, not a blind spot.
	d.kill()
	named := writePolicy(t, "", `
  - name: max-age
    match:
      labelSelector: "app=batch"
      priorityClassNames: {include: [system-cluster-critical]}
    clock: created
    after: 2s
`)
	startDaemon(t, "--namespace", ns, "--config", named)
	r.waitRemoved(t, critical, latenessOK+10*time.Second)
}
