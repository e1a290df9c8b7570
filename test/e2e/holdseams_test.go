//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	v1alpha1 "github.com/podjanitor/podjanitor/pkg/apis/podjanitor/v1alpha1"
)

// TestTwoPoliciesOfOneHeldChange: two PodLifetimePolicies applied
// together in a namespace of 150 pods, a-short (every pod, `after: 1s`)
// and z-extra (no pod): one held change of the namespace, shown on both.
// Deleting z-extra, which brought nothing forward, leaves a-short's 150
// held; an approval on a-short of the hold as it stands releases them.
func TestTwoPoliciesOfOneHeldChange(t *testing.T) {
	t.Parallel()
	installCRD(t)
	ctx := ctxFor(t)
	ns := newNamespace(t)
	_, tenant := editorOf(t, ns)
	r := watchRemovalsDurably(t, ns)
	pods := wavePods(t, ns, "yes", 150)
	startDaemon(t, "--tenant-policies", "--namespace", ns)
	policies := tenant.PodjanitorV1alpha1().PodLifetimePolicies(ns)
	short := lifetimePolicy("a-short", v1alpha1.PodLifetimeRule{Name: "all", Clock: "created", After: "1s"})
	extra := lifetimePolicy("z-extra", v1alpha1.PodLifetimeRule{Name: "none", Match: v1alpha1.PodLifetimeMatch{LabelSelector: "app=none"}, Clock: "created", After: "1s"})
	for _, p := range []*v1alpha1.PodLifetimePolicy{short, extra} {
		if _, err := policies.Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// heldID waits for the policy name to show a hold of 150 pods other
	// than not, and returns its ID.
	heldID := func(name, not string) string {
		t.Helper()
		var cond *metav1.Condition
		var held *v1alpha1.HeldChange
		if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			p, err := policies.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			cond, held = meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionReady), p.Status.HeldChange
			return cond != nil && cond.Reason == "RemovalsHeld" && held != nil && held.Pods == 150 && held.ID != not && held.Since != nil, nil
		}); err != nil {
			t.Fatalf("%s: Ready %+v, heldChange %+v; want RemovalsHeld with 150 pods since a time, not by change %q", name, cond, held, not)
		}
		return held.ID
	}
	both := heldID("z-extra", "")
	heldID("a-short", "")
	time.Sleep(3 * time.Second)
	noneRemoved(t, r.removals, pods)

	if err := policies.Delete(ctx, "z-extra", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := policies.Get(ctx, "z-extra", metav1.GetOptions{})
		return err != nil, nil
	}); err != nil {
		t.Fatal("z-extra is not deleted")
	}
	time.Sleep(10 * time.Second)
	noneRemoved(t, r.removals, pods)
	id := heldID("a-short", both)
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, approveWave, id)
	if _, err := policies.Patch(ctx, "a-short", types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, p := range pods {
		r.waitRemoved(t, p, 2*time.Minute)
	}
}

// TestRevertedChangeInManyNamespacesEndsItsHold: a policy pushed into 12
// namespaces of 10 pods is held as one wave on the Lease; deleted again
// from all 12 (reverted), the hold ends and none of the 120 goes; a later
// change of 5 pods in another namespace goes as it comes, as if the hold
// had never been. Not parallel: its podjanitor writes the status of every
// PodLifetimePolicy in the cluster.
func TestRevertedChangeInManyNamespacesEndsItsHold(t *testing.T) {
	installCRD(t)
	ctx := ctxFor(t)
	home := newNamespace(t)
	run := fmt.Sprintf("r%06d", rand.IntN(1000000))
	admin := tenantClient(t, "")
	startDaemon(t, "--tenant-policies", "--label-selector", "wave="+run, "--leader-elect-resource-namespace", home)
	all := v1alpha1.PodLifetimeRule{Name: "all", Clock: "created", After: "1s"}
	var namespaces []string
	var pods []*corev1.Pod
	watches := map[string]*durableWatch{}
	for range 12 {
		ns := newNamespace(t)
		watches[ns] = watchRemovalsDurably(t, ns)
		namespaces = append(namespaces, ns)
		pods = append(pods, wavePods(t, ns, run, 10)...)
	}
	time.Sleep(2 * time.Second) // created long enough ago for `after: 1s`
	for _, ns := range namespaces {
		if _, err := admin.PodjanitorV1alpha1().PodLifetimePolicies(ns).Create(ctx, lifetimePolicy("all", all), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	heldSpreadOnLease(t, home, "", "120")
	for _, ns := range namespaces {
		if err := admin.PodjanitorV1alpha1().PodLifetimePolicies(ns).Delete(ctx, "all", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		l, err := client.CoordinationV1().Leases(home).Get(ctx, "podjanitor", metav1.GetOptions{})
		return err == nil && l.Annotations["podjanitor.io/held-spread"] == "", nil
	}); err != nil {
		t.Fatal("the hold of reverted changes is still recorded on the Lease")
	}
	later := newNamespace(t)
	rl := watchRemovalsDurably(t, later)
	laterPods := wavePods(t, later, run, 5)
	time.Sleep(2 * time.Second)
	if _, err := admin.PodjanitorV1alpha1().PodLifetimePolicies(later).Create(ctx, lifetimePolicy("all", all), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, p := range laterPods {
		rl.waitRemoved(t, p, 30*time.Second)
	}
	for _, ns := range namespaces {
		noneRemoved(t, watches[ns].removals, podsOf(pods, ns))
	}
}

// TestRecordThatDoesNotParseStartsAsAFirstInstall: the record Lease carries
// a held-namespaces record that does not parse (a hand edit, a bad
// restore), over 150 pods that the rules make due. podjanitor starts as if
// nothing was acted on: it keeps running, holds the 150 on the Lease as a
// first install (visible there, approved there), removes a pod due by its
// own expires-at, and writes the record anew. Before, every start exited 1
// on it: a crash loop.
func TestRecordThatDoesNotParseStartsAsAFirstInstall(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	r := watchRemovalsDurably(t, ns)
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "podjanitor", Namespace: ns,
		Annotations: map[string]string{heldNamespacesAnnotation: "{not json"}}}
	if _, err := client.CoordinationV1().Leases(ns).Create(ctxFor(t), lease, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pods := wavePods(t, ns, "yes", 150)
	own := createPod(t, ns, "own", unscheduled, expiresAt(time.Now()))
	time.Sleep(2 * time.Second)
	cfg := writePolicy(t, "", fmt.Sprintf(waveRule, "1s"))
	d := startDaemon(t, "--namespace", ns, "--config", cfg, "--leader-elect", "--leader-elect-resource-namespace", ns)
	d.waitLog("does not parse: starting as if nothing was acted on", 30*time.Second)
	id := heldOnLease(t, ns, "podjanitor")
	r.waitRemoved(t, own, 30*time.Second)
	if err := wait.PollUntilContextTimeout(ctxFor(t), 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		l, err := client.CoordinationV1().Leases(ns).Get(ctx, "podjanitor", metav1.GetOptions{})
		return err == nil && l.Annotations[heldNamespacesAnnotation] != "{not json", nil
	}); err != nil {
		t.Error("the record that does not parse is still on the Lease")
	}
	time.Sleep(3 * time.Second)
	noneRemoved(t, r.removals, pods)
	select {
	case <-d.exited:
		t.Fatal("podjanitor exited")
	default:
	}
	approveOnLease(t, ns, id)
	for _, p := range pods {
		r.waitRemoved(t, p, time.Minute)
	}
}

// TestApprovedWaveDrainsAcrossATakeover: two replicas; the policy file
// changed from `after: 168h` to `after: 1s` over 150 pods is held on the
// Lease (the standby measures the reload too, in its memory) and approved
// there; the wave drains at 2 removals a second. The leader is SIGKILLed
// after 20 removals: the standby takes over and goes on removing the
// approved wave, without holding it again.
func TestApprovedWaveDrainsAcrossATakeover(t *testing.T) {
	t.Parallel()
	const n = 150
	ns := newNamespace(t)
	r := watchRemovalsDurably(t, ns)
	wavePods(t, ns, "yes", n)
	cfg := writePolicy(t, "", fmt.Sprintf(waveRule, "168h"))
	args := []string{"--namespace", ns, "--config", cfg, "--leader-elect", "--leader-elect-resource-namespace", ns,
		"--leader-elect-lease-duration", "6s", "--leader-elect-renew-deadline", "4s", "--leader-elect-retry-period", "500ms",
		"--max-deletions-per-second", "2", "--deletion-burst", "2"}
	a := startDaemonWaiting(t, "Waiting to become the leader", args...)
	b := startDaemonWaiting(t, "Waiting to become the leader", args...)
	var leader, standby *daemon
	if err := wait.PollUntilContextTimeout(ctxFor(t), 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		switch {
		case a.logContains("Started workers"):
			leader, standby = a, b
		case b.logContains("Started workers"):
			leader, standby = b, a
		}
		return leader != nil, nil
	}); err != nil {
		t.Fatal("no replica became the leader")
	}
	writePolicy(t, cfg, fmt.Sprintf(waveRule, "1s"))
	id := heldOnLease(t, ns, "podjanitor")
	standby.waitLog("Holding the removals of the reloaded policy", 30*time.Second)
	approveOnLease(t, ns, id)
	if err := wait.PollUntilContextTimeout(ctxFor(t), 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		return r.removals.count() >= 20, nil
	}); err != nil {
		t.Fatalf("%d pods removed after the approval, want 20", r.removals.count())
	}
	leader.kill()
	killed, before := time.Now(), r.removals.count()
	standby.waitLog("Became the leader", 30*time.Second)
	// At 2 a second, 40 more within 20 s of the takeover, and none held.
	if err := wait.PollUntilContextTimeout(ctxFor(t), 200*time.Millisecond, 45*time.Second, true, func(context.Context) (bool, error) {
		return r.removals.count() >= before+40, nil
	}); err != nil {
		t.Fatalf("%d pods removed in %v after the leader was killed, want 40 more: the approved wave is held again after the takeover",
			r.removals.count()-before, time.Since(killed).Round(time.Second))
	}
	if l, err := client.CoordinationV1().Leases(ns).Get(ctxFor(t), "podjanitor", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	} else if held := l.Annotations[heldWave]; held != "" {
		t.Errorf("the Lease records a held change %q after the takeover, want none", held)
	}
}
