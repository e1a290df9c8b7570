//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/podjanitor/podjanitor/pkg/apis/podjanitor/v1alpha1"
)

// chartV010 is the chart as released in v0.1.0 (testdata/chart-v0.1.0/README.md).
const chartV010 = "testdata/chart-v0.1.0/podjanitor"

const crdName = "podlifetimepolicies.podjanitor.io"

// TestHelmUpgradeFromV010 installs the v0.1.0 chart (no CRD; tenant policies
// did not exist) with its pod on the real node, and upgrades the release to
// this chart, which turns tenant policies on: helm upgrade installs the CRD
// (from templates/; crds/ is installed on a fresh install only), the new pod
// becomes Ready, a PodLifetimePolicy is used (Ready=True) and removes the pod
// it matches while a pod it does not match stays; helm uninstall keeps the
// CRD. The release watches one namespace (scope namespace), with leader
// election off (strategy Recreate: the worst case, where an exiting
// new pod leaves nothing removing pods). About 1-2 minutes.
//
// Not parallel: it must find the cluster without the CRD, which the tenant
// tests install; it runs before them (Go runs every sequential test first).
func TestHelmUpgradeFromV010(t *testing.T) {
	clusterDir, kustomize := os.Getenv("E2E_CLUSTER_DIR"), os.Getenv("KUSTOMIZE_BIN")
	if clusterDir == "" || kustomize == "" {
		t.Fatal("set E2E_CLUSTER_DIR and KUSTOMIZE_BIN: hack/e2e.sh runs a cluster with a real node, loads the image and sets them")
	}
	ctx := ctxFor(t)
	dc := dynamicClient(t)
	_, err := dc.Resource(crdGVR).Get(ctx, crdName, metav1.GetOptions{})
	crdBefore := err == nil
	if crdBefore {
		t.Logf("the CRD %s exists already (a reused cluster): the upgrade must leave it as it is", crdName)
	} else if !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	ns, apps := newNamespace(t), newNamespace(t)
	release := fmt.Sprintf("pj-upg-%04d", rand.IntN(10000))
	postRenderer := localClusterPostRenderer(t, clusterDir, kustomize)
	set := []string{"--namespace", ns, "--post-renderer", postRenderer,
		"--set", "scope=namespace", "--set", "watchNamespace=" + apps, "--set", "leaderElection.enabled=false",
		"--set", "image.repository=local/podjanitor", "--set", "image.tag=dev"}
	// The v0.1.0 release runs this build's image (no v0.1.0 image offline),
	// which reads namespaces and records the policy it acts on on its Lease
	// (held waves); v0.1.0's binary did neither, and its chart, with
	// leader election off, grants no right to either. The test grants them
	// to the release's ServiceAccount while v0.1.0 runs, and takes them back
	// before the upgrade, whose pod has the new chart's RBAC alone.
	grant := grantNamespaceReads(t, ns, release+"-podjanitor")
	helm(t, append([]string{"install", release, chartV010}, set...)...)
	installed := true
	t.Cleanup(func() {
		if installed {
			helm(t, "uninstall", release, "--namespace", ns)
		}
	})

	selector := "app.kubernetes.io/instance=" + release
	old := waitReadyPod(t, ns, selector, "", 2*time.Minute)
	t.Logf("v0.1.0 chart: pod %s Ready", old.Name)
	r := watchRemovals(t, apps)
	due := createPod(t, apps, "due-v010", ttl(3*time.Second))
	r.checkOnTime(t, due, created(due).Add(3*time.Second))

	grant()
	helm(t, append([]string{"upgrade", release, chartPath}, set...)...)
	pod := waitReadyPod(t, ns, selector, old.Name, 2*time.Minute)
	t.Logf("upgraded: pod %s Ready", pod.Name)
	if c := runningContainerOf(pod); c == nil || c.RestartCount != 0 {
		t.Errorf("the upgraded pod's container restarted (exited at start-up?): %+v", pod.Status.ContainerStatuses)
	}
	crd, err := dc.Resource(crdGVR).Get(ctx, crdName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the CRD after helm upgrade: %v", err)
	}
	if owner := crd.GetAnnotations()["meta.helm.sh/release-name"]; !crdBefore && owner != release {
		t.Errorf("the CRD after helm upgrade belongs to release %q, want %s: the upgrade installed it", owner, release)
	}

	admin := tenantClient(t, "")
	batch := v1alpha1.PodLifetimeRule{Name: "batch-max-age", Match: v1alpha1.PodLifetimeMatch{LabelSelector: "app=batch"}, Clock: "created", After: "10s"}
	err = wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := admin.PodjanitorV1alpha1().PodLifetimePolicies(apps).Create(ctx, lifetimePolicy("batch", batch), metav1.CreateOptions{})
		return err == nil, nil // until the API server serves the new CRD
	})
	if err != nil {
		t.Fatalf("creating a PodLifetimePolicy after the upgrade: %v", err)
	}
	waitReady(t, admin, apps, "batch", metav1.ConditionTrue, time.Minute)
	matched := createPod(t, apps, "batch", label("app", "batch"))
	other := createPod(t, apps, "web", label("app", "web"))
	r.checkOnTime(t, matched, created(matched).Add(10*time.Second))
	time.Sleep(latenessOK)
	r.checkNotRemoved(t, other)

	helm(t, "uninstall", release, "--namespace", ns)
	installed = false
	if _, err := dc.Resource(crdGVR).Get(ctx, crdName, metav1.GetOptions{}); err != nil {
		t.Errorf("the CRD after helm uninstall: %v, want it kept (helm.sh/resource-policy: keep)", err)
	}
}

// grantNamespaceReads lets the ServiceAccount get, list and watch
// namespaces, and use Leases in its namespace, until the returned func takes
// the rights back.
func grantNamespaceReads(t *testing.T, ns, serviceAccount string) (revoke func()) {
	t.Helper()
	ctx := ctxFor(t)
	name := "e2e-" + ns + "-namespace-reads"
	rbac := client.RbacV1()
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"namespaces"}, Verbs: []string{"get", "list", "watch"}}}}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: serviceAccount, Namespace: ns}}}
	if _, err := rbac.ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := rbac.ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	leases := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"},
			Verbs: []string{"get", "list", "watch", "create", "update", "patch"}}}}
	leasesBinding := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name},
		Subjects: binding.Subjects}
	if _, err := rbac.Roles(ns).Create(ctx, leases, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := rbac.RoleBindings(ns).Create(ctx, leasesBinding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	revoke = func() {
		_ = rbac.ClusterRoleBindings().Delete(context.Background(), name, metav1.DeleteOptions{})
		_ = rbac.ClusterRoles().Delete(context.Background(), name, metav1.DeleteOptions{})
		_ = rbac.RoleBindings(ns).Delete(context.Background(), name, metav1.DeleteOptions{})
		_ = rbac.Roles(ns).Delete(context.Background(), name, metav1.DeleteOptions{})
	}
	t.Cleanup(revoke)
	return revoke
}

// localClusterPostRenderer writes a helm post-renderer that applies the
// local cluster's patch of the Deployment (hack/local-cluster.sh writes it
// for artifacts/deploy: the API server's address, there being no kube-proxy,
// and a toleration of the real node's taint) to the chart's Deployment.
func localClusterPostRenderer(t *testing.T, clusterDir, kustomize string) string {
	t.Helper()
	dir := t.TempDir()
	patch, err := os.ReadFile(filepath.Join(clusterDir, "deploy", "local-cluster.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		"local-cluster.yaml": string(patch),
		"kustomization.yaml": "resources: [all.yaml]\npatches:\n  - path: local-cluster.yaml\n    target: {kind: Deployment}\n",
		"render.sh":          fmt.Sprintf("#!/bin/sh\nset -e\ncat >%q\nexec %q build %q\n", filepath.Join(dir, "all.yaml"), kustomize, dir),
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return filepath.Join(dir, "render.sh")
}

// waitReadyPod waits for the one pod of selector in ns, not named notName,
// that is Ready and not terminating.
func waitReadyPod(t *testing.T, ns, selector, notName string, timeout time.Duration) *corev1.Pod {
	t.Helper()
	var last []corev1.Pod
	var ready *corev1.Pod
	err := wait.PollUntilContextTimeout(ctxFor(t), 500*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		list, err := client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return false, nil
		}
		last = list.Items
		for i := range list.Items {
			p := &list.Items[i]
			if c := condition(p, corev1.PodReady); p.Name != notName && p.DeletionTimestamp == nil && c != nil && c.Status == corev1.ConditionTrue {
				ready = p
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		for _, p := range last {
			t.Logf("pod %s: phase %s, conditions %+v, containers %+v", p.Name, p.Status.Phase, p.Status.Conditions, p.Status.ContainerStatuses)
			if l, err := client.CoreV1().Pods(ns).GetLogs(p.Name, &corev1.PodLogOptions{Container: "podjanitor"}).DoRaw(context.Background()); err == nil {
				t.Logf("log of %s:\n%s", p.Name, l)
			}
		}
		t.Fatalf("no Ready pod %s in %s (other than %q) within %v", selector, ns, notName, timeout)
	}
	return ready
}

// runningContainerOf is the status of the pod's podjanitor container.
func runningContainerOf(p *corev1.Pod) *corev1.ContainerStatus {
	for i := range p.Status.ContainerStatuses {
		if p.Status.ContainerStatuses[i].Name == "podjanitor" {
			return &p.Status.ContainerStatuses[i]
		}
	}
	return nil
}
