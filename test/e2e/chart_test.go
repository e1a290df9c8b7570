//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/podjanitor/podjanitor/policy"
)

const chartPath = "../../charts/podjanitor"

// helm runs the helm binary of HELM_BIN against the test cluster.
func helm(t *testing.T, args ...string) string {
	t.Helper()
	bin := os.Getenv("HELM_BIN")
	if bin == "" {
		t.Fatal("set HELM_BIN (hack/e2e.sh does)")
	}
	home := t.TempDir()
	cmd := exec.Command(bin, append(args, "--kubeconfig", kubeconfig)...)
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+home, "HELM_CONFIG_HOME="+home, "HELM_DATA_HOME="+home)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out.String())
	}
	return out.String()
}

// impersonate is a client acting as the user and groups of a ServiceAccount.
func impersonate(t *testing.T, ns, sa string) kubernetes.Interface {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Impersonate = rest.ImpersonationConfig{
		UserName: "system:serviceaccount:" + ns + ":" + sa,
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
	}
	return kubernetes.NewForConfigOrDie(cfg)
}

// TestHelmInstallClusterScope installs the chart with its defaults and
// checks the objects and, acting as its ServiceAccount, every permission
// podjanitor uses, in any namespace; then uninstalls and checks that the
// cluster-wide objects are gone.
func TestHelmInstallClusterScope(t *testing.T) {
	t.Parallel()
	// The CRD exists before the release: parallel installs would each render
	// it (templates/crd.yaml) and all but one fail on an object that exists.
	installCRD(t)
	ctx := ctxFor(t)
	ns := newNamespace(t)
	other := newNamespace(t)
	release := fmt.Sprintf("pj-%04d", rand.IntN(10000))
	fullname := release + "-podjanitor"
	helm(t, "install", release, chartPath, "--namespace", ns, "--set", "replicas=2")
	uninstalled := false
	t.Cleanup(func() {
		if !uninstalled {
			helm(t, "uninstall", release, "--namespace", ns)
		}
	})

	dep, err := client.AppsV1().Deployments(ns).Get(ctx, fullname, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the chart's Deployment: %v", err)
	}
	args := dep.Spec.Template.Spec.Containers[0].Args
	if *dep.Spec.Replicas != 2 || !containsArg(args, "--leader-elect=true") || dep.Spec.Template.Spec.ServiceAccountName != fullname {
		t.Errorf("Deployment: replicas %d, args %q, ServiceAccount %q", *dep.Spec.Replicas, args, dep.Spec.Template.Spec.ServiceAccountName)
	}
	checkChartPolicy(t, ctx, ns, fullname)
	for _, get := range []func() error{
		func() error {
			_, err := client.CoreV1().ServiceAccounts(ns).Get(ctx, fullname, metav1.GetOptions{})
			return err
		},
		func() error {
			_, err := client.CoreV1().Services(ns).Get(ctx, fullname+"-metrics", metav1.GetOptions{})
			return err
		},
		func() error {
			_, err := client.RbacV1().ClusterRoles().Get(ctx, fullname, metav1.GetOptions{})
			return err
		},
		func() error {
			_, err := client.RbacV1().ClusterRoleBindings().Get(ctx, fullname, metav1.GetOptions{})
			return err
		},
		func() error {
			_, err := client.RbacV1().Roles(ns).Get(ctx, fullname+"-leader-election", metav1.GetOptions{})
			return err
		},
	} {
		if err := get(); err != nil {
			t.Error(err)
		}
	}

	sa := impersonate(t, ns, fullname)
	waitForRBAC(t, ctx, sa, other)
	checkPodPermissions(t, ctx, sa, other, true)
	checkLeasePermissions(t, ctx, sa, ns, other, leaseArg(t, args))

	helm(t, "uninstall", release, "--namespace", ns)
	uninstalled = true
	if _, err := client.RbacV1().ClusterRoles().Get(ctx, fullname, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("ClusterRole %s after uninstall: err = %v, want NotFound", fullname, err)
	}
	if _, err := client.RbacV1().ClusterRoleBindings().Get(ctx, fullname, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("ClusterRoleBinding %s after uninstall: err = %v, want NotFound", fullname, err)
	}
	if _, err := client.AppsV1().Deployments(ns).Get(ctx, fullname, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("Deployment %s after uninstall: err = %v, want NotFound", fullname, err)
	}
}

// TestHelmInstallNamespaceScope installs the chart with scope namespace,
// checks that its ServiceAccount can act on pods in the watched namespace
// only, runs podjanitor with the installed Deployment's own args and a token
// of that ServiceAccount, and uninstalls.
func TestHelmInstallNamespaceScope(t *testing.T) {
	t.Parallel()
	// The CRD exists before the release: parallel installs would each render
	// it (templates/crd.yaml) and all but one fail on an object that exists.
	installCRD(t)
	ctx := ctxFor(t)
	ns := newNamespace(t)
	apps := newNamespace(t)
	other := newNamespace(t)
	release := fmt.Sprintf("pj-%04d", rand.IntN(10000))
	fullname := release + "-podjanitor"
	helm(t, "install", release, chartPath, "--namespace", ns, "--set", "scope=namespace", "--set", "watchNamespace="+apps)
	uninstalled := false
	t.Cleanup(func() {
		if !uninstalled {
			helm(t, "uninstall", release, "--namespace", ns)
		}
	})

	if _, err := client.RbacV1().ClusterRoles().Get(ctx, fullname, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("scope namespace created ClusterRole %s (err %v)", fullname, err)
	}
	if _, err := client.RbacV1().Roles(apps).Get(ctx, fullname, metav1.GetOptions{}); err != nil {
		t.Errorf("the Role in the watched namespace: %v", err)
	}
	cfgPath := checkChartPolicy(t, ctx, ns, fullname)

	sa := impersonate(t, ns, fullname)
	waitForRBAC(t, ctx, sa, apps)
	checkPodPermissions(t, ctx, sa, apps, true)
	checkPodPermissions(t, ctx, sa, other, false)

	// podjanitor as installed: the Deployment's args, the ServiceAccount's token.
	dep, err := client.AppsV1().Deployments(ns).Get(ctx, fullname, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	args := dep.Spec.Template.Spec.Containers[0].Args
	if !containsArg(args, "--namespace="+apps) {
		t.Errorf("args %q lack --namespace=%s", args, apps)
	}
	checkLeasePermissions(t, ctx, sa, ns, other, leaseArg(t, args))

	r := watchRemovals(t, apps)
	d := startInstalled(t, ctx, ns, fullname, cfgPath, "Started workers")
	due := createPod(t, apps, "due", ttl(3*time.Second))
	elsewhere := createPod(t, other, "elsewhere", ttl(time.Second))
	r.checkOnTime(t, due, created(due).Add(3*time.Second))
	time.Sleep(2 * time.Second)
	if _, err := client.CoreV1().Pods(other).Get(ctx, elsewhere.Name, metav1.GetOptions{}); err != nil {
		t.Errorf("a pod outside the watched namespace: %v; it must stay", err)
	}
	if d.logContains("forbidden") {
		d.dumpLog()
		t.Error("podjanitor's log mentions forbidden: the chart's RBAC lacks a permission")
	}
	if code := d.stop(30 * time.Second); code != 0 {
		t.Errorf("podjanitor exited %d, want 0", code)
	}

	helm(t, "uninstall", release, "--namespace", ns)
	uninstalled = true
	if _, err := client.RbacV1().Roles(apps).Get(ctx, fullname, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("Role %s/%s after uninstall: err = %v, want NotFound", apps, fullname, err)
	}
}

func containsArg(args []string, want string) bool {
	for _, a := range args {
		if a == want {
			return true
		}
	}
	return false
}

// checkChartPolicy checks that the installed policy ConfigMap validates and
// writes it to a file for a local daemon.
func checkChartPolicy(t *testing.T, ctx context.Context, ns, fullname string) string {
	t.Helper()
	cm, err := client.CoreV1().ConfigMaps(ns).Get(ctx, fullname+"-policy", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the policy ConfigMap: %v", err)
	}
	if _, err := policy.Parse([]byte(cm.Data["policy.yaml"])); err != nil {
		t.Fatalf("the installed policy does not validate: %v", err)
	}
	path := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(path, []byte(cm.Data["policy.yaml"]), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// waitForRBAC waits until the authorizer has seen the chart's bindings.
func waitForRBAC(t *testing.T, ctx context.Context, sa kubernetes.Interface, ns string) {
	t.Helper()
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		return saCan(t, ctx, sa, "", "pods", "", "watch", ns), nil
	})
	if err != nil {
		t.Fatalf("the chart's RBAC never took effect: %v", err)
	}
}

// checkPodPermissions makes, as the ServiceAccount, the calls podjanitor
// makes on pods in ns: list, watch, delete, evict, an event. allowed says
// whether they must succeed or be forbidden. It cannot create pods anywhere.
func checkPodPermissions(t *testing.T, ctx context.Context, sa kubernetes.Interface, ns string, allowed bool) {
	t.Helper()
	check := func(what string, err error) {
		t.Helper()
		switch {
		case allowed && err != nil:
			t.Errorf("as the chart's ServiceAccount, %s in %s: %v", what, ns, err)
		case !allowed && !apierrors.IsForbidden(err):
			t.Errorf("as the chart's ServiceAccount, %s in %s: err = %v, want Forbidden", what, ns, err)
		}
	}
	_, err := sa.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	check("list pods", err)
	w, err := sa.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{})
	if err == nil {
		w.Stop()
	}
	check("watch pods", err)
	victim := createPod(t, ns, fmt.Sprintf("delete-me-%04d", rand.IntN(10000)))
	check("delete a pod", sa.CoreV1().Pods(ns).Delete(ctx, victim.Name, metav1.DeleteOptions{}))
	evictee := createPod(t, ns, fmt.Sprintf("evict-me-%04d", rand.IntN(10000)))
	check("evict a pod", sa.CoreV1().Pods(ns).EvictV1(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: evictee.Name, Namespace: ns}}))
	_, err = sa.EventsV1().Events(ns).Create(ctx, &eventsv1.Event{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "podjanitor-", Namespace: ns}, EventTime: metav1.NowMicro(),
		ReportingController: "podjanitor", ReportingInstance: "e2e", Action: "Delete", Reason: "Expired", Type: corev1.EventTypeNormal,
		Regarding: corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: evictee.Name, UID: evictee.UID},
	}, metav1.CreateOptions{})
	check("create an event", err)

	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{GenerateName: "forbidden-", Namespace: ns},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "fake-image"}}}}
	if _, err := sa.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("as the chart's ServiceAccount, create a pod in %s: err = %v, want Forbidden", ns, err)
	}
	review, err := sa.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{
		Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{
			Resource: "secrets", Verb: "get", Namespace: ns}},
	}, metav1.CreateOptions{})
	if err != nil || review.Status.Allowed {
		t.Errorf("the chart's ServiceAccount may read Secrets in %s (err %v)", ns, err)
	}
}

// checkLeasePermissions: as the chart's ServiceAccount, the release's own
// Lease in its namespace (create, get, update: client-go's LeaseLock), no
// other component's Lease there (RBAC cannot restrict create by name, but get
// and update it can), and no Lease elsewhere. The Lease is deleted again, so
// that a podjanitor of the release can take it at once.
func checkLeasePermissions(t *testing.T, ctx context.Context, sa kubernetes.Interface, ns, other, name string) {
	t.Helper()
	lease, err := sa.CoordinationV1().Leases(ns).Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("as the chart's ServiceAccount, create its Lease %s/%s: %v", ns, name, err)
	}
	defer func() {
		_ = client.CoordinationV1().Leases(ns).Delete(context.Background(), name, metav1.DeleteOptions{})
	}()
	holder := "e2e"
	lease.Spec.HolderIdentity = &holder
	if _, err := sa.CoordinationV1().Leases(ns).Update(ctx, lease, metav1.UpdateOptions{}); err != nil {
		t.Errorf("as the chart's ServiceAccount, update its Lease: %v", err)
	}
	if _, err := sa.CoordinationV1().Leases(ns).Get(ctx, name, metav1.GetOptions{}); err != nil {
		t.Errorf("as the chart's ServiceAccount, get its Lease: %v", err)
	}

	// Another component's Lease beside it.
	foreign, err := client.CoordinationV1().Leases(ns).Create(ctx, &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("other-component-%04d", rand.IntN(10000))},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptrTo("other-component")},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = client.CoordinationV1().Leases(ns).Delete(context.Background(), foreign.Name, metav1.DeleteOptions{})
	}()
	if _, err := sa.CoordinationV1().Leases(ns).Get(ctx, foreign.Name, metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("as the chart's ServiceAccount, get another component's Lease %s: err = %v, want Forbidden", foreign.Name, err)
	}
	foreign.Spec.HolderIdentity = &holder
	if _, err := sa.CoordinationV1().Leases(ns).Update(ctx, foreign, metav1.UpdateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("as the chart's ServiceAccount, take over another component's Lease %s: err = %v, want Forbidden", foreign.Name, err)
	}

	if _, err := sa.CoordinationV1().Leases(other).Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("as the chart's ServiceAccount, create a Lease in %s: err = %v, want Forbidden", other, err)
	}
}

// leaseArg is the Deployment's --leader-elect-resource-name, which the chart
// must set (its Role names that Lease); without it, the flag's default.
func leaseArg(t *testing.T, args []string) string {
	t.Helper()
	for _, a := range args {
		if name, ok := strings.CutPrefix(a, "--leader-elect-resource-name="); ok {
			return name
		}
	}
	t.Errorf("args %q do not name the Lease (--leader-elect-resource-name)", args)
	return "podjanitor"
}

// startInstalled runs podjanitor as the release's Deployment in ns would:
// its args (with the policy file at cfgPath, no listeners: the tests run
// several daemons on one host), a token of its ServiceAccount, and
// POD_NAMESPACE from the downward API, which places the Lease.
func startInstalled(t *testing.T, ctx context.Context, ns, fullname, cfgPath, waitFor string) *daemon {
	t.Helper()
	dep, err := client.AppsV1().Deployments(ns).Get(ctx, fullname, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var args []string
	for _, a := range dep.Spec.Template.Spec.Containers[0].Args {
		switch {
		case strings.HasPrefix(a, "--config="):
			a = "--config=" + cfgPath
		case strings.HasPrefix(a, "--metrics-bind-address="), strings.HasPrefix(a, "--health-probe-bind-address="):
			continue // startDaemon turns them off
		}
		args = append(args, a)
	}
	tr, err := client.CoreV1().ServiceAccounts(ns).CreateToken(ctx, fullname, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptrTo(int64(3600))},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	args = append(args, "--kubeconfig", writeTokenKubeconfig(t, tr.Status.Token))
	return startDaemonEnv(t, []string{"POD_NAMESPACE=" + ns}, waitFor, args...)
}

// TestHelmTwoReleasesInOneNamespace installs two releases of the chart in one
// namespace, each for its own team's namespace (scope namespace), and runs
// both as installed: each elects on a Lease of its own and removes its pods.
// With one Lease for every release, one of them never became the leader and
// its pods stayed.
func TestHelmTwoReleasesInOneNamespace(t *testing.T) {
	t.Parallel()
	installCRD(t) // as in TestHelmInstallClusterScope
	ctx := ctxFor(t)
	ns := newNamespace(t)
	run := rand.IntN(10000)
	type release struct {
		name, fullname, apps, cfgPath, lease string
		d                                    *daemon
		r                                    *removals
	}
	var releases []*release
	for _, team := range []string{"a", "b"} {
		rel := &release{name: fmt.Sprintf("pj-%04d-%s", run, team), apps: newNamespace(t)}
		rel.fullname = rel.name + "-podjanitor"
		helm(t, "install", rel.name, chartPath, "--namespace", ns, "--set", "scope=namespace", "--set", "watchNamespace="+rel.apps)
		t.Cleanup(func() { helm(t, "uninstall", rel.name, "--namespace", ns) })
		rel.cfgPath = checkChartPolicy(t, ctx, ns, rel.fullname)
		releases = append(releases, rel)
	}
	for _, rel := range releases {
		dep, err := client.AppsV1().Deployments(ns).Get(ctx, rel.fullname, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		rel.lease = leaseArg(t, dep.Spec.Template.Spec.Containers[0].Args)
		sa := impersonate(t, ns, rel.fullname)
		waitForRBAC(t, ctx, sa, rel.apps)
		err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			return saCanName(t, ctx, sa, "coordination.k8s.io", "leases", "", "update", ns, rel.lease), nil
		})
		if err != nil {
			t.Fatalf("release %s: its Lease Role never took effect: %v", rel.name, err)
		}
	}
	if releases[0].lease == releases[1].lease {
		t.Errorf("releases %s and %s both elect on the Lease %s", releases[0].name, releases[1].name, releases[0].lease)
	}

	for _, rel := range releases {
		rel.r = watchRemovals(t, rel.apps)
		rel.d = startInstalled(t, ctx, ns, rel.fullname, rel.cfgPath, "Waiting to become the leader")
	}
	for _, rel := range releases {
		identity := leaderIdentity(t, rel.d)
		rel.d.waitLog("Started workers", 30*time.Second)
		l, err := client.CoordinationV1().Leases(ns).Get(ctx, rel.lease, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("release %s: Lease %s/%s: %v", rel.name, ns, rel.lease, err)
		}
		if h := l.Spec.HolderIdentity; h == nil || *h != identity {
			t.Errorf("release %s: Lease %s/%s held by %v, want its podjanitor %s", rel.name, ns, rel.lease, h, identity)
		}
	}

	var pods []*corev1.Pod
	for _, rel := range releases {
		pods = append(pods, createPod(t, rel.apps, "due", ttl(3*time.Second)))
	}
	for i, rel := range releases {
		rel.r.checkOnTime(t, pods[i], created(pods[i]).Add(3*time.Second))
	}
	for _, rel := range releases {
		for _, msg := range []string{"forbidden", "Forbidden"} {
			if rel.d.logContains(msg) {
				rel.d.dumpLog()
				t.Errorf("release %s: podjanitor's log mentions %q: the chart's RBAC lacks a permission", rel.name, msg)
			}
		}
		if code := rel.d.stop(30 * time.Second); code != 0 {
			t.Errorf("release %s: podjanitor exited %d, want 0", rel.name, code)
		}
	}
}
