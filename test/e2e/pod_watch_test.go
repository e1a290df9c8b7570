//go:build e2e

package e2e

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/podjanitor/podjanitor/test/framework"
)

// TestPodWatchRevoked: a podjanitor whose ServiceAccount loses list and
// watch on pods after its start (its binding deleted, the API server
// restarted so that its open watch ends) shows it: podjanitor_pod_watch_healthy
// turns 0 and /readyz fails naming the pod watch within the 2 minutes' grace
// and a minute, and both recover once the binding is back. About 4 minutes.
func TestPodWatchRevoked(t *testing.T) {
	ctx := framework.Ctx(t, 10*time.Minute)
	applyDeployRBAC(t, ctx)
	ns := newNamespace(t)
	token := serviceAccountToken(t, ctx, ns, "janitor")
	deployRole, err := client.RbacV1().ClusterRoles().Get(ctx, "podjanitor", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Two roles: the deploy's rules on pods, and all its others.
	var podRules, otherRules []rbacv1.PolicyRule
	for _, r := range deployRole.Rules {
		if slices.Contains(r.Resources, "pods") {
			podRules = append(podRules, r)
		} else {
			otherRules = append(otherRules, r)
		}
	}
	bind := func(name string, rules []rbacv1.PolicyRule) {
		t.Helper()
		role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: ns + "-" + name}, Rules: rules}
		if _, err := client.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: role.Name},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: "janitor"}}}
		if _, err := client.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			client.RbacV1().ClusterRoleBindings().Delete(context.Background(), role.Name, metav1.DeleteOptions{})
			client.RbacV1().ClusterRoles().Delete(context.Background(), role.Name, metav1.DeleteOptions{})
		})
	}
	bind("others", otherRules)
	bind("pods", podRules)

	// The RBAC authorizer sees new bindings through an informer: the
	// daemon waits for its workers, which wait for the pods' list.
	d := startDaemonAs(t, writeTokenKubeconfig(t, token), "Started workers", "--namespace", ns, "--hold-waves=false",
		"--metrics-bind-address", "127.0.0.1:0", "--health-probe-bind-address", "127.0.0.1:0")
	health := "http://" + d.endpoints()["health"]
	watchHealthy := func() float64 { return d.scrape(t).sum("podjanitor_pod_watch_healthy") }
	if code, body := httpGet(t, health+"/readyz"); code != http.StatusOK || watchHealthy() != 1 {
		t.Fatalf("started: /readyz %d %q, podjanitor_pod_watch_healthy %v; want 200 and 1", code, body, watchHealthy())
	}

	if err := client.RbacV1().ClusterRoleBindings().Delete(ctx, ns+"-pods", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	revoked := time.Now()
	restartAPIServer(t) // ends the open watch, which a revoked rule does not
	err = wait.PollUntilContextTimeout(ctx, time.Second, 4*time.Minute, true, func(context.Context) (bool, error) {
		code, body := httpGet(t, health+"/readyz")
		return code == http.StatusServiceUnavailable && strings.Contains(body, "pod watch failing") && strings.Contains(body, "forbidden") &&
			watchHealthy() == 0, nil
	})
	if err != nil {
		code, body := httpGet(t, health+"/readyz")
		t.Fatalf("%v after the pods' rules were revoked: /readyz %d %q, podjanitor_pod_watch_healthy %v; want 503 naming the pod watch, and 0",
			time.Since(revoked).Round(time.Second), code, body, watchHealthy())
	}
	t.Logf("the pod watch failing shown %v after the pods' rules were revoked", time.Since(revoked).Round(time.Second))
	if !d.logContains("Pod watch failing") {
		t.Error("the log has no \"Pod watch failing\" line")
	}

	client.RbacV1().ClusterRoles().Delete(ctx, ns+"-pods", metav1.DeleteOptions{})
	bind("pods", podRules)
	err = wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(context.Context) (bool, error) {
		code, _ := httpGet(t, health+"/readyz")
		return code == http.StatusOK && watchHealthy() == 1, nil
	})
	if err != nil {
		code, body := httpGet(t, health+"/readyz")
		t.Fatalf("the pods' rules back: /readyz %d %q, podjanitor_pod_watch_healthy %v; want 200 and 1", code, body, watchHealthy())
	}
}
