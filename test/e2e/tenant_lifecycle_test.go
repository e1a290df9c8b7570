//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/podjanitor/podjanitor/pkg/apis/podjanitor/v1alpha1"
)

// TestTenantPolicyLifecycle is issue 31's acceptance for tenant policies
// at start and on delete, against the real API server: a policy held by a
// finalizer and deleted removes nothing after its deletion timestamp; a
// restart with many policies removes no pod early (a pod a tenant rule
// keeps longer than the cluster rule stays). About 60 s.
func TestTenantPolicyLifecycle(t *testing.T) {
	installCRD(t)
	ctx := ctxFor(t)
	ns := newNamespace(t)
	r := watchRemovals(t, ns)
	admin := tenantClient(t, "")
	policies := admin.PodjanitorV1alpha1().PodLifetimePolicies(ns)
	run := fmt.Sprintf("r%06d", rand.IntN(1000000))
	runLabel := label(tenantRunLabel, run)
	// The cluster rule removes the kept and plain pods at 15 s; the tenant
	// rule of "keep-longer" keeps app=kept pods until 10 min. The held pod
	// has no rule but the held policy's.
	cfg := writePolicy(t, "", `
  - name: cluster-max-age
    match: {labelSelector: "app in (kept,plain)"}
    clock: created
    after: 15s
`)
	args := []string{"--tenant-policies", "--namespace", ns, "--label-selector", tenantRunLabel + "=" + run, "--config", cfg}
	d := startDaemon(t, args...)

	held := lifetimePolicy("held", v1alpha1.PodLifetimeRule{Name: "max-age", Match: v1alpha1.PodLifetimeMatch{LabelSelector: "app=held"}, Clock: "created", After: "25s"})
	held.Finalizers = []string{"e2e.podjanitor.io/hold"}
	if _, err := policies.Create(ctx, held, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // let the held policy go
		_, _ = policies.Patch(context.Background(), "held", types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
	})
	for i := range 30 { // many policies, read again at the restart; "keep-longer" sorts first
		name := fmt.Sprintf("other-%02d", i)
		rule := v1alpha1.PodLifetimeRule{Name: "max-age", Match: v1alpha1.PodLifetimeMatch{LabelSelector: "app=" + name}, Clock: "created", After: "1h"}
		if _, err := policies.Create(ctx, lifetimePolicy(name, rule), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	keep := v1alpha1.PodLifetimeRule{Name: "keep-longer", Match: v1alpha1.PodLifetimeMatch{LabelSelector: "app=kept"}, Clock: "created", After: "10m"}
	if _, err := policies.Create(ctx, lifetimePolicy("keep-longer", keep), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitReady(t, admin, ns, "held", metav1.ConditionTrue, time.Minute)
	waitReady(t, admin, ns, "keep-longer", metav1.ConditionTrue, time.Minute)

	heldPod := createPod(t, ns, "held", runLabel, label("app", "held"))
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := policies.Get(ctx, "held", metav1.GetOptions{})
		return err == nil && p.Status.PodsWithDeadline == 1, nil
	})
	if err != nil {
		t.Fatal("policy held never counted its pod")
	}
	// Deleted, held by its finalizer: the object stays, with a deletion timestamp.
	if err := policies.Delete(ctx, "held", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	deleting := waitReady(t, admin, ns, "held", metav1.ConditionFalse, time.Minute)
	if deleting.DeletionTimestamp == nil {
		t.Fatal("the held policy has no deletion timestamp")
	}
	if c := meta.FindStatusCondition(deleting.Status.Conditions, v1alpha1.ConditionReady); c.Reason != "Deleting" {
		t.Errorf("held policy's Ready = %+v, want reason Deleting", c)
	}

	// A restart with the policies in place: the kept pod, past the cluster
	// rule's 15 s when the new daemon starts, stays.
	kept := createPod(t, ns, "kept", runLabel, label("app", "kept"))
	d.kill()
	time.Sleep(time.Until(created(kept).Add(16 * time.Second)))
	startDaemon(t, args...)
	plain := createPod(t, ns, "plain", runLabel, label("app", "plain")) // no tenant rule: the cluster's
	r.checkOnTime(t, plain, created(plain).Add(15*time.Second))
	// Past the held policy's deadline, with room for removals that must not happen.
	time.Sleep(time.Until(created(heldPod).Add(25*time.Second + latenessOK)))
	r.checkNotRemoved(t, heldPod)
	r.checkNotRemoved(t, kept)
}
