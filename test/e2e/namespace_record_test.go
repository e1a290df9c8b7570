//go:build e2e

package e2e

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
)

// TestNamespaceChangedWhileDownIsHeld: podjanitor records what it acted on
// of each namespace. While it is stopped, the keep annotation comes off a
// namespace of 150 due pods, and off another of 10. At the next start the
// first is measured as a change made while it ran: held (the log line and
// a RemovalsHeld Event on the Namespace name the approval command), none
// of its 150 removed, until a cluster admin approves the change on the
// Namespace; then all go. The small change goes without a hold. Before,
// the start took the namespaces as it found them and removed all 160.
// The approval is used once: the same change made again later over 150 new
// pods is held again and needs an approval of its own.
func TestNamespaceChangedWhileDownIsHeld(t *testing.T) {
	t.Parallel()
	big, small, home := newNamespace(t), newNamespace(t), newNamespace(t)
	for _, ns := range []string{big, small} {
		patchNamespace(t, ns, map[string]any{"annotations": map[string]any{prefix + "keep": "true"}})
	}
	rb, rs := watchRemovalsDurably(t, big), watchRemovalsDurably(t, small)
	run := fmt.Sprintf("r%06d", rand.IntN(1000000)) // only this test's pods: other tests share the cluster
	bigPods, smallPods := wavePods(t, big, run, 150), wavePods(t, small, run, 10)
	cfg := writePolicy(t, "", fmt.Sprintf(`
  - name: wave
    match: {labelSelector: "wave=%s"}
    clock: created
    after: 1s
`, run))
	args := []string{"--label-selector", "wave=" + run, "--config", cfg, "--leader-elect-resource-namespace", home}
	first := startDaemon(t, args...)
	// The record: both namespaces kept, as acted on.
	if err := wait.PollUntilContextTimeout(ctxFor(t), 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		acted := recordedNamespaces(ctx, t, home)
		return strings.Contains(acted[big], prefix+"keep") && strings.Contains(acted[small], prefix+"keep"), nil
	}); err != nil {
		t.Fatalf("the namespaces acted on are not recorded in configmap %s/podjanitor-namespaces", home)
	}
	time.Sleep(2 * time.Second) // past every pod's 1s: kept
	noneRemoved(t, rb.removals, bigPods)
	noneRemoved(t, rs.removals, smallPods)
	first.kill()

	for _, ns := range []string{big, small} {
		patchNamespace(t, ns, map[string]any{"annotations": map[string]any{prefix + "keep": nil}})
	}
	second := startDaemon(t, args...)
	for _, p := range smallPods {
		rs.waitRemoved(t, p, time.Minute)
	}
	var id string
	heldLine := regexp.MustCompile(`Holding the removals of a namespace's change.* namespace="` + big + `".* change="([^"]+)"`)
	if err := wait.PollUntilContextTimeout(ctxFor(t), 200*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		if m := heldLine.FindStringSubmatch(second.log()); m != nil {
			id = m[1]
		}
		return id != "", nil
	}); err != nil {
		t.Fatal("the change made while podjanitor was down is not held")
	}
	namespaceRemovalsHeldEvent(t, big, "kubectl annotate namespace "+big+" --overwrite "+approveWave+"="+id)
	time.Sleep(3 * time.Second)
	noneRemoved(t, rb.removals, bigPods)

	patchNamespace(t, big, map[string]any{"annotations": map[string]any{approveWave: id}})
	for _, p := range bigPods {
		rb.waitRemoved(t, p, 2*time.Minute)
	}

	// The approval is used once: the keep put back over 150 new pods and
	// taken off again (the same change, made again) is held again, under
	// another ID, with the old approval still on the Namespace.
	patchNamespace(t, big, map[string]any{"annotations": map[string]any{prefix + "keep": "true"}})
	morePods := createPods(t, 150, func(i int) *corev1.Pod { return pod(big, fmt.Sprintf("again-%04d", i), label("wave", run)) })
	time.Sleep(2 * time.Second) // past every pod's 1s: kept
	patchNamespace(t, big, map[string]any{"annotations": map[string]any{prefix + "keep": nil}})
	var again string
	if err := wait.PollUntilContextTimeout(ctxFor(t), 200*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		for _, m := range heldLine.FindAllStringSubmatch(second.log(), -1) {
			if m[1] != id {
				again = m[1]
			}
		}
		return again != "", nil
	}); err != nil {
		t.Fatal("the same change made again is not held under a new ID")
	}
	time.Sleep(3 * time.Second)
	noneRemoved(t, rb.removals, morePods)
	patchNamespace(t, big, map[string]any{"annotations": map[string]any{approveWave: again}})
	for _, p := range morePods {
		rb.waitRemoved(t, p, 2*time.Minute)
	}
}

// recordedNamespaces reads the record ConfigMap of the Lease podjanitor in
// ns: each namespace's state as acted on (its JSON), none when unreadable
// or not written yet.
func recordedNamespaces(ctx context.Context, t *testing.T, ns string) map[string]string {
	t.Helper()
	cm, err := client.CoreV1().ConfigMaps(ns).Get(ctx, "podjanitor-namespaces", metav1.GetOptions{})
	if err != nil || len(cm.BinaryData["namespaces.json.gz"]) == 0 {
		return nil // not written yet: the policy's keys may come first
	}
	z, err := gzip.NewReader(bytes.NewReader(cm.BinaryData["namespaces.json.gz"]))
	if err != nil {
		t.Fatalf("configmap %s/podjanitor-namespaces: %v", ns, err)
	}
	b, err := io.ReadAll(z)
	if err != nil {
		t.Fatal(err)
	}
	var acted map[string]struct {
		State json.RawMessage `json:"state"`
	}
	if err := json.Unmarshal(b, &acted); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for name, a := range acted {
		out[name] = string(a.State)
	}
	return out
}

// namespaceRemovalsHeldEvent waits for a RemovalsHeld Warning about the
// Namespace ns naming command (a cluster-scoped object's Events are in
// the default namespace).
func namespaceRemovalsHeldEvent(t *testing.T, ns, command string) {
	t.Helper()
	err := wait.PollUntilContextTimeout(ctxFor(t), 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := client.EventsV1().Events(metav1.NamespaceAll).List(ctx, metav1.ListOptions{FieldSelector: "reason=RemovalsHeld"})
		if err != nil {
			return false, nil
		}
		for _, e := range list.Items {
			if e.Regarding.Kind == "Namespace" && e.Regarding.Name == ns && strings.Contains(e.Note, command) {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Errorf("no RemovalsHeld Warning on Namespace %s naming %q", ns, command)
	}
}
