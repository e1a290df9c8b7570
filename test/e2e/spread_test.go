//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	v1alpha1 "github.com/podjanitor/podjanitor/pkg/apis/podjanitor/v1alpha1"
)

// heldSpreadOnLease waits until the Lease ns/podjanitor records a held
// change of many namespaces other than not, of pods pods, and returns its ID.
func heldSpreadOnLease(t *testing.T, ns, not, want string) (id string) {
	t.Helper()
	var pods string
	err := wait.PollUntilContextTimeout(ctxFor(t), 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		l, err := client.CoordinationV1().Leases(ns).Get(ctx, "podjanitor", metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		id, pods = l.Annotations["podjanitor.io/held-spread"], l.Annotations["podjanitor.io/held-spread-pods"]
		return id != "" && id != not && pods == want, nil
	})
	if err != nil {
		t.Fatalf("lease %s/podjanitor records the held change %q of many namespaces with %q pods, want %s", ns, id, pods, want)
	}
	return id
}

// TestOneChangeInManyNamespacesIsHeld: one change made in 20 namespaces of
// 10 pods each, one namespace after another, is held as one wave of 200
// on the Lease, though no namespace's change is held on its own (10 pods
// or fewer never are): first the same PodLifetimePolicy created in each (a
// platform pushing it), then the keep annotation taken off each (`kubectl
// annotate ns --all podjanitor.io/keep-`). None is removed before the
// approval on the Lease, across a restart of podjanitor too; approved, all
// go. Not parallel: its podjanitor
// writes the status of every PodLifetimePolicy in the cluster.
func TestOneChangeInManyNamespacesIsHeld(t *testing.T) {
	installCRD(t)
	ctx := ctxFor(t)
	home := newNamespace(t)
	run := fmt.Sprintf("r%06d", rand.IntN(1000000))
	admin := tenantClient(t, "")
	// The cluster's rule removes the second phase's pods 1 s after their
	// creation, but for their namespaces' keep.
	cfg := writePolicy(t, "", `
  - name: kept-namespaces
    match: {labelSelector: "phase=keep"}
    clock: created
    after: 1s
`)
	args := []string{"--tenant-policies", "--config", cfg, "--label-selector", "wave=" + run, "--leader-elect-resource-namespace", home}
	d := startDaemon(t, args...)

	// phase makes n namespaces of 10 pods each (kept when keep), then
	// change in each, in turn, and checks the hold and its approval.
	previous := ""
	phase := func(name string, keep bool, change func(ns string), held func(namespaces []string)) {
		t.Helper()
		var namespaces []string
		var pods []*corev1.Pod
		watches := map[string]*durableWatch{}
		for range 20 {
			ns := newNamespace(t)
			if keep {
				patch := `{"metadata":{"annotations":{"podjanitor.io/keep":"true"}}}`
				if _, err := client.CoreV1().Namespaces().Patch(ctx, ns, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			watches[ns] = watchRemovalsDurably(t, ns)
			namespaces = append(namespaces, ns)
			pods = append(pods, createPods(t, 10, func(i int) *corev1.Pod {
				p := pod(ns, fmt.Sprintf("wave-%04d", i), label("wave", run))
				if keep {
					p.Labels["phase"] = "keep"
				}
				return p
			})...)
		}
		time.Sleep(3 * time.Second) // the pods cached, and created long enough ago for `after: 1s`
		start := time.Now()
		for _, ns := range namespaces {
			change(ns)
		}
		t.Logf("%s: changed 20 namespaces in %v", name, time.Since(start).Round(time.Millisecond))
		id := heldSpreadOnLease(t, home, previous, "200")
		previous = id
		held(namespaces)
		time.Sleep(5 * time.Second)
		for _, ns := range namespaces {
			noneRemoved(t, watches[ns].removals, podsOf(pods, ns))
		}
		// The hold outlasts a restart: the changes are measured again
		// (the namespaces' record, the policies' status), held again.
		d.kill()
		d = startDaemon(t, args...)
		heldLine := regexp.MustCompile(`Holding the removals of changes made in many namespaces together.* change="([^"]+)"`)
		if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
			return heldLine.MatchString(d.log()), nil
		}); err != nil {
			t.Fatalf("%s: the changes are not held again after a restart", name)
		}
		// The hold's ID names the changes in it: the one to approve is
		// the Lease's once all 20 namespaces' are measured again.
		id = heldSpreadOnLease(t, home, "", "200")
		time.Sleep(5 * time.Second)
		for _, ns := range namespaces {
			noneRemoved(t, watches[ns].removals, podsOf(pods, ns))
		}
		approveOnLease(t, home, id)
		for _, p := range pods {
			watches[p.Namespace].waitRemoved(t, p, 2*time.Minute)
		}
	}
	all := v1alpha1.PodLifetimeRule{Name: "all", Clock: "created", After: "1s"}
	phase("a policy pushed into 20 namespaces", false, func(ns string) {
		if _, err := admin.PodjanitorV1alpha1().PodLifetimePolicies(ns).Create(ctx, lifetimePolicy("all", all), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}, func(namespaces []string) {
		// Each policy says its change is held with the others', on the
		// Lease: not acted on, for a restart to measure again.
		for _, ns := range namespaces {
			p := waitReady(t, admin, ns, "all", metav1.ConditionFalse, time.Minute)
			if cond := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionReady); cond.Reason != "RemovalsHeldAcrossNamespaces" ||
				!strings.Contains(cond.Message, "kubectl annotate lease -n "+home) {
				t.Errorf("policy %s/all: Ready %+v, want RemovalsHeldAcrossNamespaces with the Lease's approval command", ns, cond)
			}
		}
	})
	phase("keep taken off 20 namespaces", true, func(ns string) {
		patch := `{"metadata":{"annotations":{"podjanitor.io/keep":null}}}`
		if _, err := client.CoreV1().Namespaces().Patch(ctx, ns, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}, func(namespaces []string) {
		// Recorded as kept, as acted on (within seconds of the hold): a
		// restart measures the keep taken off again.
		if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			acted := recordedNamespaces(ctx, t, home)
			for _, ns := range namespaces {
				if !strings.Contains(acted[ns], "podjanitor.io/keep") {
					return false, nil
				}
			}
			return true, nil
		}); err != nil {
			t.Fatal("the namespaces whose changes are held are not recorded as they were before them")
		}
	})
}

// podsOf are the pods of namespace ns.
func podsOf(pods []*corev1.Pod, ns string) []*corev1.Pod {
	var out []*corev1.Pod
	for _, p := range pods {
		if p.Namespace == ns {
			out = append(out, p)
		}
	}
	return out
}
