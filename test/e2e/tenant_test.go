//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/podjanitor/podjanitor/pkg/apis/podjanitor/v1alpha1"
	"github.com/podjanitor/podjanitor/pkg/generated/clientset/versioned"
)

// The acceptance of tenant policies (issue 22) against the real API server:
// a namespace's editor writes a PodLifetimePolicy and podjanitor honours it
// in that namespace only. The API server's validation and RBAC delegation
// are tenantapi_test.go's and rbac_test.go's.

const tenantRunLabel = "e2e.podjanitor.io/tenant-run"

// tenantClient is a podjanitor.io client with the admin kubeconfig, or
// impersonating user when it is set.
func tenantClient(t *testing.T, user string) versioned.Interface {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	if user != "" {
		cfg.Impersonate = rest.ImpersonationConfig{UserName: user}
	}
	return versioned.NewForConfigOrDie(cfg)
}

// editorOf binds the built-in edit ClusterRole to a new user in ns (a
// RoleBinding: nowhere else), and waits until the edit role, through its
// aggregation, lets the user create PodLifetimePolicies there.
func editorOf(t *testing.T, ns string) (user string, c versioned.Interface) {
	t.Helper()
	ctx := ctxFor(t)
	user = fmt.Sprintf("e2e-tenant-%04d", rand.IntN(10000))
	ensureEditAggregation(t)
	_, err := client.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "tenant-edit"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "edit"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c = tenantClient(t, user)
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := c.PodjanitorV1alpha1().PodLifetimePolicies(ns).List(ctx, metav1.ListOptions{})
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("user %s with edit in %s cannot list PodLifetimePolicies there: the edit role's aggregation is missing", user, ns)
	}
	return user, c
}

// ensureEditAggregation makes sure some ClusterRole aggregated into edit
// grants PodLifetimePolicies (the one the deployment installs), creating a
// test one, removed at the end, when the cluster has none yet.
func ensureEditAggregation(t *testing.T) {
	t.Helper()
	ctx := ctxFor(t)
	roles, err := client.RbacV1().ClusterRoles().List(ctx, metav1.ListOptions{LabelSelector: "rbac.authorization.k8s.io/aggregate-to-edit=true"})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range roles.Items {
		for _, rule := range r.Rules {
			if slicesContain(rule.APIGroups, v1alpha1.GroupName) && slicesContain(rule.Resources, "podlifetimepolicies") && slicesContain(rule.Verbs, "create") {
				return
			}
		}
	}
	name := fmt.Sprintf("e2e-tenant-policies-edit-%04d", rand.IntN(10000))
	_, err = client.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"rbac.authorization.k8s.io/aggregate-to-edit": "true"}},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{v1alpha1.GroupName}, Resources: []string{"podlifetimepolicies"},
			Verbs: []string{"create", "delete", "get", "list", "patch", "update", "watch"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.RbacV1().ClusterRoles().Delete(context.Background(), name, metav1.DeleteOptions{}) })
}

func slicesContain(list []string, v string) bool {
	for _, s := range list {
		if s == v {
			return true
		}
	}
	return false
}

func lifetimePolicy(name string, rules ...v1alpha1.PodLifetimeRule) *v1alpha1.PodLifetimePolicy {
	return &v1alpha1.PodLifetimePolicy{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1alpha1.PodLifetimePolicySpec{Rules: rules}}
}

// waitReady waits until podjanitor has written the policy's Ready condition
// for its current generation, with status, and returns the policy.
func waitReady(t *testing.T, c versioned.Interface, ns, name string, status metav1.ConditionStatus, timeout time.Duration) *v1alpha1.PodLifetimePolicy {
	t.Helper()
	var got *v1alpha1.PodLifetimePolicy
	err := wait.PollUntilContextTimeout(ctxFor(t), 200*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		p, err := c.PodjanitorV1alpha1().PodLifetimePolicies(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		got = p
		ready := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionReady)
		return p.Status.ObservedGeneration == p.Generation && ready != nil && ready.Status == status, nil
	})
	if err != nil {
		t.Fatalf("policy %s/%s: Ready never %s for its generation; status %+v", ns, name, status, got.Status)
	}
	return got
}

// TestTenantPolicies is issue 22's acceptance: an identity with only the
// built-in edit role in namespace A creates a PodLifetimePolicy there; A's
// matching pods go at their deadlines, A's other pods and B's matching pods
// stay; the identity cannot create one in B; a policy the cluster admin's
// restrictions refuse reports Ready=False with a Warning event; deleting a
// policy before its deadline keeps the pod; a namespace keep vetoes them.
func TestTenantPolicies(t *testing.T) {
	t.Parallel()
	installCRD(t)
	ctx := ctxFor(t)
	a, b, kept := newNamespace(t), newNamespace(t), newNamespace(t)
	if _, err := client.CoreV1().Namespaces().Patch(ctx, kept, "application/merge-patch+json",
		[]byte(`{"metadata":{"annotations":{"podjanitor.io/keep":"true"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	user, tenant := editorOf(t, a)
	admin := tenantClient(t, "")
	run := fmt.Sprintf("r%06d", rand.IntN(1000000))
	ra, rb, rk := watchRemovals(t, a), watchRemovals(t, b), watchRemovals(t, kept)
	// Only this test's pods: other tests share the cluster.
	startDaemon(t, "--tenant-policies", "--label-selector", tenantRunLabel+"="+run, "--tenant-forbidden-clocks=pending")

	batch := v1alpha1.PodLifetimeRule{Name: "batch-max-age", Match: v1alpha1.PodLifetimeMatch{LabelSelector: "app=batch"}, Clock: "created", After: "25s"}
	if _, err := tenant.PodjanitorV1alpha1().PodLifetimePolicies(a).Create(ctx, lifetimePolicy("batch", batch), metav1.CreateOptions{}); err != nil {
		t.Fatalf("%s, with edit in %s, creating a PodLifetimePolicy there: %v", user, a, err)
	}
	_, err := tenant.PodjanitorV1alpha1().PodLifetimePolicies(b).Create(ctx, lifetimePolicy("batch", batch), metav1.CreateOptions{})
	if !apierrors.IsForbidden(err) {
		t.Errorf("%s, with edit in %s only, creating a PodLifetimePolicy in %s: %v, want Forbidden", user, a, b, err)
	}
	// The same policy in the kept namespace, by the admin; none in B.
	if _, err := admin.PodjanitorV1alpha1().PodLifetimePolicies(kept).Create(ctx, lifetimePolicy("batch", batch), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	later := v1alpha1.PodLifetimeRule{Name: "later", Match: v1alpha1.PodLifetimeMatch{LabelSelector: "app=later"}, Clock: "created", After: "40s"}
	if _, err := tenant.PodjanitorV1alpha1().PodLifetimePolicies(a).Create(ctx, lifetimePolicy("later", later), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	stuck := v1alpha1.PodLifetimeRule{Name: "stuck", Clock: "pending", After: "1s"}
	if _, err := tenant.PodjanitorV1alpha1().PodLifetimePolicies(a).Create(ctx, lifetimePolicy("stuck", stuck), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitReady(t, admin, a, "batch", metav1.ConditionTrue, time.Minute)
	waitReady(t, admin, a, "later", metav1.ConditionTrue, time.Minute)

	runLabel := label(tenantRunLabel, run)
	aBatch := createPod(t, a, "batch", runLabel, label("app", "batch"))
	aOther := createPod(t, a, "other", runLabel, label("app", "web")) // pending, but "stuck" is refused
	aLater := createPod(t, a, "later", runLabel, label("app", "later"))
	bBatch := createPod(t, b, "batch", runLabel, label("app", "batch")) // matches, but A's policy is A's
	keptBatch := createPod(t, kept, "batch", runLabel, label("app", "batch"))

	// The refused policy: Ready=False with the reason, and a Warning event.
	refused := waitReady(t, admin, a, "stuck", metav1.ConditionFalse, time.Minute)
	if c := meta.FindStatusCondition(refused.Status.Conditions, v1alpha1.ConditionReady); c.Reason != "ForbiddenByClusterAdmin" || !strings.Contains(c.Message, `clock "pending"`) {
		t.Errorf("refused policy's Ready = %+v, want reason ForbiddenByClusterAdmin naming clock \"pending\"", c)
	}
	waitPolicyEvent(t, a, "stuck", "PolicyNotUsed", time.Minute)

	// The status counts the pod the policy gives a deadline.
	err = wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := admin.PodjanitorV1alpha1().PodLifetimePolicies(a).Get(ctx, "batch", metav1.GetOptions{})
		return err == nil && p.Status.PodsWithDeadline == 1 && p.Status.NextDeadline != nil, nil
	})
	if err != nil {
		t.Errorf("policy batch never reported podsWithDeadline 1 and a nextDeadline: %v", err)
	}

	// Delete "later" well before its pod's deadline: the pod stays.
	if err := tenant.PodjanitorV1alpha1().PodLifetimePolicies(a).Delete(ctx, "later", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}

	ra.checkOnTime(t, aBatch, created(aBatch).Add(25*time.Second))
	checkReportedEvent(t, aBatch, "Delete", "podlifetimepolicy/batch/rule/batch-max-age")
	// Past later's deadline, with room for a removal that should not happen.
	time.Sleep(time.Until(created(aLater).Add(40*time.Second + latenessOK)))
	ra.checkNotRemoved(t, aOther)
	ra.checkNotRemoved(t, aLater)
	rb.checkNotRemoved(t, bBatch)
	rk.checkNotRemoved(t, keptBatch)
}

// TestTenantPoliciesOff proves that without --tenant-policies podjanitor
// ignores them: a matching pod stays past the policy's deadline, and the
// policy's status is not written. Not parallel: the daemon of
// TestTenantPolicies reads every namespace's policies.
func TestTenantPoliciesOff(t *testing.T) {
	installCRD(t)
	ctx := ctxFor(t)
	ns := newNamespace(t)
	r := watchRemovals(t, ns)
	run := fmt.Sprintf("r%06d", rand.IntN(1000000))
	startDaemon(t, "--namespace", ns, "--label-selector", tenantRunLabel+"="+run)
	rule := v1alpha1.PodLifetimeRule{Name: "max-age", Clock: "created", After: "3s"}
	if _, err := tenantClient(t, "").PodjanitorV1alpha1().PodLifetimePolicies(ns).Create(ctx, lifetimePolicy("all", rule), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := createPod(t, ns, "pod", label(tenantRunLabel, run))
	time.Sleep(time.Until(created(pod).Add(3*time.Second + latenessOK + 5*time.Second)))
	r.checkNotRemoved(t, pod)
	p, err := tenantClient(t, "").PodjanitorV1alpha1().PodLifetimePolicies(ns).Get(ctx, "all", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Status.Conditions) != 0 {
		t.Errorf("status %+v written without --tenant-policies", p.Status)
	}
}

// waitPolicyEvent waits for an event with reason about the policy ns/name.
func waitPolicyEvent(t *testing.T, ns, name, reason string, timeout time.Duration) {
	t.Helper()
	err := wait.PollUntilContextTimeout(ctxFor(t), 500*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		list, err := client.EventsV1().Events(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		for _, e := range list.Items {
			if e.Reason == reason && e.Regarding.Kind == "PodLifetimePolicy" && e.Regarding.Name == name && e.Type == corev1.EventTypeWarning {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Errorf("no Warning %s event on PodLifetimePolicy %s/%s", reason, ns, name)
	}
}
