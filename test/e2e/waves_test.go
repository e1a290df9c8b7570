//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/podjanitor/podjanitor/pkg/apis/podjanitor/v1alpha1"
)

// The acceptance of held waves (issue 32) against the real API server: a
// change that makes many pods due at once removes none of them until a
// person approves it, or reverts it.

const (
	approveWave = "podjanitor.io/approve-wave"
	heldWave    = "podjanitor.io/held-wave"
)

// wavePods creates n Pending pods labelled wave=value in ns.
func wavePods(t *testing.T, ns, value string, n int) []*corev1.Pod {
	t.Helper()
	return createPods(t, n, func(i int) *corev1.Pod { return pod(ns, fmt.Sprintf("wave-%04d", i), label("wave", value)) })
}

// impersonating is a client of the admin kubeconfig impersonating user.
func impersonating(t *testing.T, user string) kubernetes.Interface {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user}
	return kubernetes.NewForConfigOrDie(cfg)
}

const waveRule = `
  - name: wave
    match: {labelSelector: "wave=yes"}
    clock: created
    after: %s
`

// heldOnLease waits until the Lease ns/name records a held change and
// returns its ID.
func heldOnLease(t *testing.T, ns, name string) string {
	t.Helper()
	var id string
	err := wait.PollUntilContextTimeout(ctxFor(t), 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		l, err := client.CoordinationV1().Leases(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		id = l.Annotations[heldWave]
		return id != "", nil
	})
	if err != nil {
		t.Fatalf("no held change recorded on lease %s/%s", ns, name)
	}
	return id
}

// approveOnLease approves the held change id on podjanitor's Lease in ns,
// as docs/policy.md's command does.
func approveOnLease(t *testing.T, ns, id string) {
	t.Helper()
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, approveWave, id)
	if _, err := client.CoordinationV1().Leases(ns).Patch(ctxFor(t), "podjanitor", types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// noneRemoved asserts that none of pods has been removed.
func noneRemoved(t *testing.T, r *removals, pods []*corev1.Pod) {
	t.Helper()
	n := 0
	for _, p := range pods {
		if _, ok := r.get(p.UID); ok {
			n++
		}
	}
	if n > 0 {
		t.Fatalf("%d of %d held pods removed", n, len(pods))
	}
}

// removalsHeldEvent waits for a RemovalsHeld Warning in ns naming command.
func removalsHeldEvent(t *testing.T, ns, command string) {
	t.Helper()
	err := wait.PollUntilContextTimeout(ctxFor(t), 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := client.EventsV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "reason=RemovalsHeld"})
		if err != nil {
			return false, nil
		}
		for _, e := range list.Items {
			if e.Type == corev1.EventTypeWarning && strings.Contains(e.Note, command) {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Errorf("no RemovalsHeld Warning in %s naming %q", ns, command)
	}
}

// TestReloadWaveIsHeld: 400 pods under `after: 168h`; the policy file is
// reloaded with `after: 1s`: none is removed for two minutes while the
// change is held (the Lease records it, a Warning there has the command,
// `podjanitor plan` shows the 400 HELD with the command); approved, all go
// at the cap, none before its deadline. Reverted instead (a second
// namespace), none goes and plan gives them their 168h deadlines again.
// PodJanitorRemovalsHeld firing on it: TestPrometheusAlerts.
func TestReloadWaveIsHeld(t *testing.T) {
	t.Parallel()
	const n = 400
	for _, approve := range []bool{true, false} {
		t.Run(fmt.Sprintf("approve=%v", approve), func(t *testing.T) {
			t.Parallel()
			ns := newNamespace(t)
			r := watchRemovalsDurably(t, ns)
			pods := wavePods(t, ns, "yes", n)
			cfg := writePolicy(t, "", fmt.Sprintf(waveRule, "168h"))
			d := startDaemon(t, "--namespace", ns, "--config", cfg, "--leader-elect-resource-namespace", ns)
			writePolicy(t, cfg, fmt.Sprintf(waveRule, "1s"))
			d.waitLog("Holding the removals of the reloaded policy", 30*time.Second)
			id := heldOnLease(t, ns, "podjanitor")
			command := "kubectl annotate lease -n " + ns + " podjanitor --overwrite " + approveWave + "=" + id
			removalsHeldEvent(t, ns, command)
			plan := runWavePlan(t, ns, cfg)
			if plan.Hold == nil || plan.Hold.Change != id || plan.Hold.Approve != command || plan.Held != n {
				t.Errorf("plan: hold %+v and %d pod(s) held, want change %s, %d held, approve %q", plan.Hold, plan.Held, id, n, command)
			}
			time.Sleep(2 * time.Minute)
			noneRemoved(t, r.removals, pods)
			if !approve {
				writePolicy(t, cfg, fmt.Sprintf(waveRule, "168h"))
				if err := wait.PollUntilContextTimeout(ctxFor(t), 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
					l, err := client.CoordinationV1().Leases(ns).Get(ctx, "podjanitor", metav1.GetOptions{})
					return err == nil && l.Annotations[heldWave] == "", nil
				}); err != nil {
					t.Fatal("the revert did not end the hold")
				}
				time.Sleep(10 * time.Second)
				noneRemoved(t, r.removals, pods)
				plan := runWavePlan(t, ns, cfg)
				if plan.Hold != nil || plan.Held != 0 || plan.Overdue != 0 || plan.Scanned < n || plan.MinIn < 167*time.Hour {
					t.Errorf("plan after the revert: hold %+v, %d held, %d overdue, %d scanned, soonest in %v; want no hold and every deadline ~168h away",
						plan.Hold, plan.Held, plan.Overdue, plan.Scanned, plan.MinIn)
				}
				return
			}
			approved := time.Now()
			approveOnLease(t, ns, id)
			var last time.Time
			for _, p := range pods {
				at := r.waitRemoved(t, p, 2*time.Minute)
				if at.Before(created(p).Add(time.Second)) {
					t.Errorf("pod %s removed before its deadline", p.Name)
				}
				if at.After(last) {
					last = at
				}
			}
			// The cap (50/s, burst 100): 400 pods take ~6 s; the approval is
			// read within 2 s.
			t.Logf("approved: %d pods removed within %v of the approval", n, last.Sub(approved).Round(100*time.Millisecond))
		})
	}
}

// wavePlan is what TestReloadWaveIsHeld reads of `podjanitor plan -o json`.
type wavePlan struct {
	Hold *struct {
		Change, Approve string
		Pods            int
	}
	Scanned, Held, Overdue int
	MinIn                  time.Duration // the soonest deadline's distance
}

func runWavePlan(t *testing.T, ns, cfg string) wavePlan {
	t.Helper()
	out, err := exec.Command(binary, "plan", "--kubeconfig", kubeconfig, "--namespace", ns, "--config", cfg,
		"--leader-elect-resource-namespace", ns, "-o", "json").Output()
	if err != nil {
		t.Fatalf("podjanitor plan: %v", err)
	}
	var raw struct {
		Pods []struct {
			Deadline time.Time
			Overdue  bool
			Held     bool
		}
		Scanned int
		Hold    *struct {
			Change, Approve string
			Pods            int
		}
	}
	if err := json.Unmarshal(out, &raw); err != nil {
		t.Fatalf("plan -o json: %v\n%s", err, out)
	}
	p := wavePlan{Hold: raw.Hold, Scanned: raw.Scanned, MinIn: time.Duration(1<<63 - 1)}
	for _, e := range raw.Pods {
		if e.Held {
			p.Held++
		}
		if e.Overdue {
			p.Overdue++
		}
		p.MinIn = min(p.MinIn, time.Until(e.Deadline))
	}
	return p
}

// TestRestartWithTheSamePolicyHoldsNothing: podjanitor records the policy it
// acts on; restarted with it, 50 pods that came due while it was down go at
// once (a first install would hold them: 50 of 50 pods).
func TestRestartWithTheSamePolicyHoldsNothing(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	r := watchRemovalsDurably(t, ns)
	cfg := writePolicy(t, "", fmt.Sprintf(waveRule, "1s"))
	first := startDaemon(t, "--namespace", ns, "--config", cfg, "--leader-elect-resource-namespace", ns)
	if err := wait.PollUntilContextTimeout(ctxFor(t), 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		return recorded(ctx, ns, "policy.sha256") != "", nil
	}); err != nil {
		t.Fatal("the policy acted on is not recorded")
	}
	first.kill()
	pods := wavePods(t, ns, "yes", 50)
	time.Sleep(2 * time.Second) // due while podjanitor is down
	d := startDaemon(t, "--namespace", ns, "--config", cfg, "--leader-elect-resource-namespace", ns)
	for _, p := range pods {
		r.waitRemoved(t, p, time.Minute)
	}
	if d.logContains("Holding the removals") {
		t.Error("a restart with the same policy held a wave")
	}
}

// TestLeaseRenewalsCarryNoRecord: the leader of a policy of 200 rules
// (about 30 KiB of JSON) records it in the ConfigMap beside its Lease, not
// on the Lease: each renewal of the Lease (a whole object every retry
// period) stays small, and writes no record. Before, the policy was an
// annotation of the Lease, sent again with every renewal.
func TestLeaseRenewalsCarryNoRecord(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	var rules strings.Builder
	for i := range 200 {
		fmt.Fprintf(&rules, "  - name: rule-%03d-with-a-name-long-enough-to-count\n    match: {labelSelector: \"wave=r%03d\"}\n    clock: created\n    after: %dh\n", i, i, i+1)
	}
	cfg := writePolicy(t, "", rules.String())
	startDaemon(t, "--namespace", ns, "--config", cfg, "--leader-elect", "--leader-elect-resource-namespace", ns,
		"--leader-elect-lease-duration", "4s", "--leader-elect-renew-deadline", "3s", "--leader-elect-retry-period", "500ms")
	// The leader's first writes: the policy and the namespaces acted on.
	if err := wait.PollUntilContextTimeout(ctxFor(t), 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		cm, err := client.CoreV1().ConfigMaps(ns).Get(ctx, "podjanitor-namespaces", metav1.GetOptions{})
		return err == nil && len(cm.Data["policy.json"]) >= 20<<10 && len(cm.BinaryData["namespaces.json.gz"]) > 0, nil
	}); err != nil {
		t.Fatal("the policy and the namespaces acted on are not recorded in the ConfigMap")
	}
	time.Sleep(time.Second)
	cm, err := client.CoreV1().ConfigMaps(ns).Get(ctxFor(t), "podjanitor-namespaces", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cmVersion := cm.ResourceVersion
	renewals := map[string]bool{}
	for range 12 {
		l, err := client.CoordinationV1().Leases(ns).Get(ctxFor(t), "podjanitor", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		renewals[l.ResourceVersion] = true
		b, _ := json.Marshal(l)
		if len(b) > 2<<10 {
			t.Fatalf("the Lease is %d bytes (annotations %v), want under 2 KiB: a renewal carries a record", len(b), slices.Collect(maps.Keys(l.Annotations)))
		}
		time.Sleep(500 * time.Millisecond)
	}
	if len(renewals) < 4 {
		t.Errorf("%d versions of the Lease seen in 6 s at a 500 ms retry period, want renewals", len(renewals))
	}
	cm, err = client.CoreV1().ConfigMaps(ns).Get(ctxFor(t), "podjanitor-namespaces", metav1.GetOptions{})
	if err != nil || cm.ResourceVersion != cmVersion {
		t.Errorf("the record was written during %d renewals with nothing changed (version %s, then %s): %v", len(renewals), cmVersion, cm.ResourceVersion, err)
	}
}

// TestTenantWaveIsHeld: a namespace editor's PodLifetimePolicy with no
// selector and `after: 10s` over 300 pods is held (Ready=False,
// RemovalsHeld) and approved by the editor on the policy; the editor cannot
// annotate podjanitor's Lease (another namespace); a policy that makes 10
// pods due goes without a hold.
func TestTenantWaveIsHeld(t *testing.T) {
	t.Parallel()
	installCRD(t)
	ctx := ctxFor(t)
	big, small, home := newNamespace(t), newNamespace(t), newNamespace(t)
	user, tenant := editorOf(t, big)
	_, smallTenant := editorOf(t, small)
	rb, rs := watchRemovalsDurably(t, big), watchRemovalsDurably(t, small)
	run := fmt.Sprintf("r%06d", rand.IntN(1000000)) // only this test's pods: other tests share the cluster
	bigPods, smallPods := wavePods(t, big, run, 300), wavePods(t, small, run, 10)
	startDaemon(t, "--tenant-policies", "--label-selector", "wave="+run, "--leader-elect-resource-namespace", home)
	rule := v1alpha1.PodLifetimeRule{Name: "all", Clock: "created", After: "10s"}
	if _, err := tenant.PodjanitorV1alpha1().PodLifetimePolicies(big).Create(ctx, lifetimePolicy("all", rule), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := smallTenant.PodjanitorV1alpha1().PodLifetimePolicies(small).Create(ctx, lifetimePolicy("all", rule), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, p := range smallPods {
		rs.waitRemoved(t, p, time.Minute)
	}
	p := waitReady(t, tenant, big, "all", metav1.ConditionFalse, time.Minute)
	cond := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionReady)
	if cond.Reason != "RemovalsHeld" || !strings.Contains(cond.Message, "holds 300 pod removal(s)") {
		t.Fatalf("Ready %+v, want RemovalsHeld with 300 pods", cond)
	}
	id, _, _ := strings.Cut(strings.TrimPrefix(cond.Message, "change "), " ")
	removalsHeldEvent(t, big, approveWave+"="+id)
	time.Sleep(15 * time.Second) // past every pod's 10s
	noneRemoved(t, rb.removals, bigPods)

	// The editor of big cannot write podjanitor's Lease in home.
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, approveWave, id)
	editor := impersonating(t, user)
	if _, err := editor.CoordinationV1().Leases(home).Patch(ctx, "podjanitor", types.MergePatchType, []byte(patch), metav1.PatchOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("%s annotating podjanitor's Lease: %v, want Forbidden", user, err)
	}
	if _, err := tenant.PodjanitorV1alpha1().PodLifetimePolicies(big).Patch(ctx, "all", types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, p := range bigPods {
		rb.waitRemoved(t, p, 2*time.Minute)
	}
}

// TestNamespaceHoldOutlastsARestart: the keep annotation taken off a
// namespace of 50 due pods is held (50 of its 50 pods); podjanitor is
// killed and started again with the namespace as changed: it holds the
// change again, by the ID recorded on its Lease, and removes none of the 50
// until a cluster admin approves the change on the Namespace. Before, the
// restart took the changed namespace as the one acted on and removed all 50.
func TestNamespaceHoldOutlastsARestart(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	patchNamespace(t, ns, map[string]any{"annotations": map[string]any{prefix + "keep": "true"}})
	r := watchRemovalsDurably(t, ns)
	cfg := writePolicy(t, "", fmt.Sprintf(waveRule, "1s"))
	pods := wavePods(t, ns, "yes", 50)
	args := []string{"--namespace", ns, "--config", cfg, "--leader-elect-resource-namespace", ns}
	first := startDaemon(t, args...)
	patchNamespace(t, ns, map[string]any{"annotations": map[string]any{prefix + "keep": nil}})
	var id string
	heldLine := regexp.MustCompile(`Holding the removals of a namespace's change.* change="([^"]+)"`)
	if err := wait.PollUntilContextTimeout(ctxFor(t), 200*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		if m := heldLine.FindStringSubmatch(first.log()); m != nil {
			id = m[1]
		}
		return id != "", nil
	}); err != nil {
		t.Fatal("the namespace's change is not held")
	}
	// Recorded as the hold starts.
	if err := wait.PollUntilContextTimeout(ctxFor(t), 200*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		return strings.Contains(recorded(ctx, ns, "held-namespaces.json"), id), nil
	}); err != nil {
		t.Errorf("the namespace's held change %s is not recorded", id)
	}
	time.Sleep(2 * time.Second) // past every pod's 1s, held
	noneRemoved(t, r.removals, pods)
	first.kill()

	second := startDaemon(t, args...)
	time.Sleep(5 * time.Second)
	noneRemoved(t, r.removals, pods)
	if !second.logContains("Measuring again a namespace change the last leader held") || !second.logContains(id) {
		t.Errorf("the restarted podjanitor does not say it holds the change %s again", id)
	}
	patchNamespace(t, ns, map[string]any{"annotations": map[string]any{approveWave: id}})
	for _, p := range pods {
		r.waitRemoved(t, p, time.Minute)
	}
}

// TestTenantPolicyDeletionIsHeld: a namespace's owner deletes the policy
// that keeps 50 pods 30 days where the cluster's rule removes them after a
// second. Its deletion makes all 50 due at once: podjanitor's finalizer
// keeps the policy, its Ready condition says RemovalsHeld with the approval
// command, and none of the 50 is removed, across a restart of podjanitor
// too; the owner's approval on the policy lets the policy go and the 50
// with it. Before, the API server deleted the policy at once and the 50
// went.
func TestTenantPolicyDeletionIsHeld(t *testing.T) {
	t.Parallel()
	installCRD(t)
	ctx := ctxFor(t)
	ns, home := newNamespace(t), newNamespace(t)
	_, tenant := editorOf(t, ns)
	r := watchRemovalsDurably(t, ns)
	run := fmt.Sprintf("r%06d", rand.IntN(1000000))
	cfg := writePolicy(t, "", fmt.Sprintf(`
  - name: max-age
    match: {labelSelector: "wave=%s"}
    clock: created
    after: 1s
`, run))
	args := []string{"--tenant-policies", "--namespace", ns, "--label-selector", "wave=" + run, "--config", cfg, "--leader-elect-resource-namespace", home}
	first := startDaemon(t, args...)
	policies := tenant.PodjanitorV1alpha1().PodLifetimePolicies(ns)
	keep := v1alpha1.PodLifetimeRule{Name: "keep", Clock: "created", After: "720h"}
	if _, err := policies.Create(ctx, lifetimePolicy("keep", keep), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // the namespace's deletion is not to wait for a podjanitor that is gone
		_, _ = tenant.PodjanitorV1alpha1().PodLifetimePolicies(ns).Patch(context.Background(), "keep", types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
	})
	waitReady(t, tenant, ns, "keep", metav1.ConditionTrue, time.Minute)
	pods := wavePods(t, ns, run, 50)
	// With more than 10 pods to keep, its deletion could be held: the
	// finalizer, at the policy's next status write (10 s at most).
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		p, err := policies.Get(ctx, "keep", metav1.GetOptions{})
		return err == nil && slices.Contains(p.Finalizers, "podjanitor.io/wave-guard."+home+".podjanitor"), nil
	}); err != nil {
		t.Error("the policy that keeps 50 pods never got podjanitor's finalizer")
	}
	noneRemoved(t, r.removals, pods) // past the cluster rule's 1s: the policy keeps them

	if err := policies.Delete(ctx, "keep", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	var cond *metav1.Condition
	gone := false
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := policies.Get(ctx, "keep", metav1.GetOptions{})
		if gone = apierrors.IsNotFound(err); gone || err != nil {
			return gone, nil
		}
		cond = meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionReady)
		return p.DeletionTimestamp != nil && cond != nil && cond.Reason == "RemovalsHeld", nil
	}); err != nil || gone {
		if gone {
			time.Sleep(3 * time.Second)
			noneRemoved(t, r.removals, pods)
			t.Fatal("the policy was deleted at once: its deletion was not held")
		}
		t.Fatalf("the deleted policy: Ready %+v, want RemovalsHeld", cond)
	}
	if !strings.Contains(cond.Message, "holds 50 pod removal(s)") || !strings.Contains(cond.Message, "deletion") {
		t.Errorf("Ready %+v, want the deletion holding 50 pods", cond)
	}
	id, _, _ := strings.Cut(strings.TrimPrefix(cond.Message, "change "), " ")
	removalsHeldEvent(t, ns, approveWave+"="+id)
	time.Sleep(3 * time.Second)
	noneRemoved(t, r.removals, pods)

	first.kill()
	second := startDaemon(t, args...)
	time.Sleep(5 * time.Second)
	noneRemoved(t, r.removals, pods)
	if !second.logContains("Holding the deletion of a tenant policy") || !second.logContains(id) {
		t.Errorf("the restarted podjanitor does not say it holds the deletion %s again", id)
	}

	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, approveWave, id)
	if _, err := policies.Patch(ctx, "keep", types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, p := range pods {
		r.waitRemoved(t, p, 2*time.Minute)
	}
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := policies.Get(ctx, "keep", metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	}); err != nil {
		t.Error("the policy whose deletion was approved is still there")
	}
}

// TestRestartInAWiderScopeIsHeld: podjanitor records the scope it acts in
// with the rules. Restarted with the same rules in a wider scope (its
// label selector dropped), or out of --dry-run, the 200 pods that are due
// only in the new start's eyes are held, not removed, until the change is
// approved; then they go at the cap. The pods due in the old scope go at
// once (TestRestartWithTheSamePolicyHoldsNothing: nothing changed, nothing held),
// and so do the pods due by their own expires-at, there at the start or
// created after it: a pod's own deadline is never held.
func TestRestartInAWiderScopeIsHeld(t *testing.T) {
	t.Parallel()
	const n = 200
	for _, c := range []struct {
		name        string
		first, then []string
	}{
		{"label selector dropped", []string{"--label-selector", "team=a"}, nil},
		{"out of dry run", []string{"--dry-run"}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ns := newNamespace(t)
			r := watchRemovalsDurably(t, ns)
			cfg := writePolicy(t, "", fmt.Sprintf(waveRule, "1s"))
			args := []string{"--namespace", ns, "--config", cfg, "--leader-elect-resource-namespace", ns}
			first := startDaemon(t, append(args, c.first...)...)
			if err := wait.PollUntilContextTimeout(ctxFor(t), 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
				return strings.Contains(recorded(ctx, ns, "policy.json"), `"scope"`), nil
			}); err != nil {
				t.Fatal("the scope acted in is not recorded")
			}
			first.kill()
			pods := createPods(t, n, func(i int) *corev1.Pod {
				return pod(ns, fmt.Sprintf("wave-%04d", i), label("wave", "yes"), label("team", "b"))
			})
			teamA := createPods(t, 5, func(i int) *corev1.Pod {
				return pod(ns, fmt.Sprintf("team-a-%d", i), label("wave", "yes"), label("team", "a"))
			})
			// Pods due by their own expires-at are never held, whatever
			// changed: those there at the start, and one created after it.
			own := createPods(t, 20, func(i int) *corev1.Pod {
				return pod(ns, fmt.Sprintf("own-%d", i), label("wave", "yes"), label("team", "b"), expiresAt(time.Now()))
			})
			time.Sleep(2 * time.Second) // due while podjanitor is down
			d := startDaemon(t, append(args, c.then...)...)
			d.waitLog("Holding the removals of the start", 30*time.Second)
			id := heldOnLease(t, ns, "podjanitor")
			if c.first[0] == "--label-selector" {
				// team=a's pods were due in the recorded scope: they go.
				for _, p := range teamA {
					r.waitRemoved(t, p, 30*time.Second)
				}
			}
			later := createPods(t, 1, func(int) *corev1.Pod {
				return pod(ns, "own-later", label("wave", "yes"), label("team", "b"), expiresAt(time.Now().Add(2*time.Second)))
			})
			for _, p := range append(own, later...) {
				r.waitRemoved(t, p, 30*time.Second)
			}
			time.Sleep(10 * time.Second)
			noneRemoved(t, r.removals, pods)
			approveOnLease(t, ns, id)
			for _, p := range pods {
				r.waitRemoved(t, p, time.Minute)
			}
		})
	}
}

// TestApprovalIsUsedOnce: 150 pods under `after: 168h`, the file changed
// to `after: 1s`: held, approved, removed, and the approval comes off the
// Lease. The file reverted, 150 new pods, the same change made again: held
// again under the same ID, none of the new pods removed until it is
// approved anew.
func TestApprovalIsUsedOnce(t *testing.T) {
	t.Parallel()
	const n = 150
	ns := newNamespace(t)
	r := watchRemovalsDurably(t, ns)
	first := wavePods(t, ns, "yes", n)
	cfg := writePolicy(t, "", fmt.Sprintf(waveRule, "168h"))
	startDaemon(t, "--namespace", ns, "--config", cfg, "--leader-elect-resource-namespace", ns)
	writePolicy(t, cfg, fmt.Sprintf(waveRule, "1s"))
	id := heldOnLease(t, ns, "podjanitor")
	approveOnLease(t, ns, id)
	for _, p := range first {
		r.waitRemoved(t, p, time.Minute)
	}
	if err := wait.PollUntilContextTimeout(ctxFor(t), 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		l, err := client.CoordinationV1().Leases(ns).Get(ctx, "podjanitor", metav1.GetOptions{})
		_, approval := l.Annotations[approveWave]
		return err == nil && !approval && l.Annotations[heldWave] == "", nil
	}); err != nil {
		t.Fatal("the approval carried out is still on the Lease")
	}

	writePolicy(t, cfg, fmt.Sprintf(waveRule, "168h"))
	// The revert is acted on once the record has it (168h in ns).
	if err := wait.PollUntilContextTimeout(ctxFor(t), 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		return strings.Contains(recorded(ctx, ns, "policy.json"), `"After":604800000000000`), nil
	}); err != nil {
		t.Fatal("the reverted policy is not recorded")
	}
	second := createPods(t, n, func(i int) *corev1.Pod { return pod(ns, fmt.Sprintf("again-%04d", i), label("wave", "yes")) })
	writePolicy(t, cfg, fmt.Sprintf(waveRule, "1s"))
	if again := heldOnLease(t, ns, "podjanitor"); again != id {
		t.Fatalf("the same change held again as %s, want %s", again, id)
	}
	time.Sleep(10 * time.Second)
	noneRemoved(t, r.removals, second)
	approveOnLease(t, ns, id)
	for _, p := range second {
		r.waitRemoved(t, p, time.Minute)
	}
}

// TestUnlockedTenantPolicyIsHeld: with one policy allowed a namespace, the
// second (by name) is refused; the first, which matches no pod, is deleted.
// The second is then used, measured as its creation: its 150 pods are held
// on it (Ready=False, RemovalsHeld), none removed, until approved there.
func TestUnlockedTenantPolicyIsHeld(t *testing.T) {
	t.Parallel()
	installCRD(t)
	ctx := ctxFor(t)
	ns, home := newNamespace(t), newNamespace(t)
	_, tenant := editorOf(t, ns)
	r := watchRemovalsDurably(t, ns)
	run := fmt.Sprintf("r%06d", rand.IntN(1000000))
	pods := wavePods(t, ns, run, 150)
	startDaemon(t, "--tenant-policies", "--tenant-max-policies-per-namespace", "1", "--label-selector", "wave="+run,
		"--leader-elect-resource-namespace", home)
	policies := tenant.PodjanitorV1alpha1().PodLifetimePolicies(ns)
	none := v1alpha1.PodLifetimeRule{Name: "none", Clock: "created", After: "1s", Match: v1alpha1.PodLifetimeMatch{LabelSelector: "app=none"}}
	if _, err := policies.Create(ctx, lifetimePolicy("a-first", none), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitReady(t, tenant, ns, "a-first", metav1.ConditionTrue, time.Minute)
	all := v1alpha1.PodLifetimeRule{Name: "all", Clock: "created", After: "1s"}
	if _, err := policies.Create(ctx, lifetimePolicy("b-second", all), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	p := waitReady(t, tenant, ns, "b-second", metav1.ConditionFalse, time.Minute)
	if c := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionReady); c.Reason != "TooManyPolicies" {
		t.Fatalf("b-second's Ready %+v, want TooManyPolicies", c)
	}
	if err := policies.Delete(ctx, "a-first", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	var id string
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := policies.Get(ctx, "b-second", metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		c := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionReady)
		if c == nil || c.Reason != "RemovalsHeld" {
			return false, nil
		}
		id, _, _ = strings.Cut(strings.TrimPrefix(c.Message, "change "), " ")
		return true, nil
	}); err != nil {
		t.Fatal("b-second, let in by a-first's deletion, is not held")
	}
	time.Sleep(5 * time.Second)
	noneRemoved(t, r.removals, pods)
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, approveWave, id)
	if _, err := policies.Patch(ctx, "b-second", types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, p := range pods {
		r.waitRemoved(t, p, 2*time.Minute)
	}
}

// TestTenantPolicyCreatedWhileDownIsHeld: a PodLifetimePolicy with no
// selector and `after: 1s` is created while podjanitor is stopped, over
// 150 pods. At the next start it is measured as a creation: held
// (Ready=False, RemovalsHeld), none of the 150 removed, until approved on it.
// Not parallel: another test's podjanitor with tenant policies on in every
// namespace would act on the policy (and write its status) while this
// test's is down.
func TestTenantPolicyCreatedWhileDownIsHeld(t *testing.T) {
	installCRD(t)
	ctx := ctxFor(t)
	ns, home := newNamespace(t), newNamespace(t)
	_, tenant := editorOf(t, ns)
	r := watchRemovalsDurably(t, ns)
	run := fmt.Sprintf("r%06d", rand.IntN(1000000))
	args := []string{"--tenant-policies", "--label-selector", "wave=" + run, "--leader-elect-resource-namespace", home}
	first := startDaemon(t, args...)
	first.kill()
	pods := wavePods(t, ns, run, 150)
	all := v1alpha1.PodLifetimeRule{Name: "all", Clock: "created", After: "1s"}
	if _, err := tenant.PodjanitorV1alpha1().PodLifetimePolicies(ns).Create(ctx, lifetimePolicy("all", all), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second) // every pod due while podjanitor is down
	startDaemon(t, args...)
	p := waitReady(t, tenant, ns, "all", metav1.ConditionFalse, time.Minute)
	cond := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionReady)
	if cond.Reason != "RemovalsHeld" || !strings.Contains(cond.Message, "holds 150 pod removal(s)") {
		t.Fatalf("Ready %+v, want RemovalsHeld with 150 pods", cond)
	}
	id, _, _ := strings.Cut(strings.TrimPrefix(cond.Message, "change "), " ")
	time.Sleep(5 * time.Second)
	noneRemoved(t, r.removals, pods)
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, approveWave, id)
	if _, err := tenant.PodjanitorV1alpha1().PodLifetimePolicies(ns).Patch(ctx, "all", types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, p := range pods {
		r.waitRemoved(t, p, 2*time.Minute)
	}
}

// TestWaveBeyondTheWindowIsHeld: 200 pods under `after: 168h`; the file is
// changed to `after: 40s` with a 10 s --wave-window: the pods are not due
// within the window, but all come due together 40 s after their creation,
// within the horizon. The change is held; at 45 s none has gone; approved,
// all go.
func TestWaveBeyondTheWindowIsHeld(t *testing.T) {
	t.Parallel()
	const n = 200
	ns := newNamespace(t)
	r := watchRemovalsDurably(t, ns)
	pods := wavePods(t, ns, "yes", n)
	cfg := writePolicy(t, "", fmt.Sprintf(waveRule, "168h"))
	d := startDaemon(t, "--namespace", ns, "--config", cfg, "--leader-elect-resource-namespace", ns, "--wave-window", "10s")
	writePolicy(t, cfg, fmt.Sprintf(waveRule, "40s"))
	d.waitLog("Holding the removals of the reloaded policy", 30*time.Second)
	id := heldOnLease(t, ns, "podjanitor")
	time.Sleep(time.Until(created(pods[n-1]).Add(45 * time.Second)))
	noneRemoved(t, r.removals, pods)
	approveOnLease(t, ns, id)
	for _, p := range pods {
		r.waitRemoved(t, p, time.Minute)
	}
}

// recorded is the key of the record ConfigMap beside the Lease podjanitor
// in ns ("" when it is not there).
func recorded(ctx context.Context, ns, key string) string {
	cm, err := client.CoreV1().ConfigMaps(ns).Get(ctx, "podjanitor-namespaces", metav1.GetOptions{})
	if err != nil {
		return ""
	}
	return cm.Data[key]
}
