//go:build e2e

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/yaml"
)

// The RBAC of artifacts/deploy, applied to the test cluster: podjanitor runs
// with its ServiceAccount's token instead of the admin's.
const (
	rbacDeployDir = "../../artifacts/deploy"
	rbacNS        = "podjanitor"
	rbacSA        = "podjanitor"
	rbacSAUser    = "system:serviceaccount:" + rbacNS + ":" + rbacSA
	rbacRunLabel  = "e2e.podjanitor.io/rbac-run"
)

// TestRBACIsSufficient runs podjanitor as the ServiceAccount of
// artifacts/deploy, across all namespaces (as the Deployment does) and with
// leader election in the podjanitor namespace, and exercises every permission
// it has: the pod and namespace caches (list/watch), deletion by annotation and by rule,
// eviction, events, and the Lease (get, create, update on renew and release).
func TestRBACIsSufficient(t *testing.T) {
	t.Parallel()
	saKubeconfig, _ := setupDeployRBAC(t)
	ns := newNamespace(t)
	r := watchRemovals(t, ns)
	run := fmt.Sprintf("%04d", rand.IntN(10000))
	// The Lease the Deployment names, the only one its Role may get and update.
	lease := deployLeaseName(t)
	t.Cleanup(func() { deleteReleasedLease(rbacNS, lease) })
	cfg := writePolicy(t, "", `
  - name: finished
    match: {labelSelector: "rbac-rule=finished"}
    clock: finished
    after: 2s
`)
	// Scoped to this test's pods by label, but cluster-wide, which needs the
	// ClusterRole (a namespaced Role would not do).
	d := startDaemonAs(t, saKubeconfig, "Started workers",
		"--label-selector", rbacRunLabel+"="+run, "--config", cfg,
		"--leader-elect", "--leader-elect-resource-namespace", rbacNS, "--leader-elect-resource-name", lease)

	// Leases: created with this daemon as the holder.
	identity := leaderIdentity(t, d)
	ctx := ctxFor(t)
	l, err := client.CoordinationV1().Leases(rbacNS).Get(ctx, lease, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("Lease %s/%s: %v", rbacNS, lease, err)
	}
	if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != identity {
		t.Errorf("Lease %s/%s holder = %v, want the daemon's identity %q", rbacNS, lease, rbacDeref(l.Spec.HolderIdentity), identity)
	}

	ttlPod := createPod(t, ns, "ttl", label(rbacRunLabel, run), ttl(4*time.Second))
	finished := createPod(t, ns, "finished", label(rbacRunLabel, run, "rbac-rule", "finished"), fate("complete", 0))
	const runningTTL = 10 * time.Second
	running := createPod(t, ns, "running", label(rbacRunLabel, run), onNode, ttl(runningTTL))
	bystander := createPod(t, ns, "other-run", label(rbacRunLabel, run+"x"), ttl(time.Second))

	// Annotations: a Pending pod past its ttl is deleted.
	r.checkOnTime(t, ttlPod, created(ttlPod).Add(4*time.Second))
	checkReportedEvent(t, ttlPod, "Delete", prefix+"ttl")

	// Rules: a finished pod is deleted by the policy file's rule.
	r.waitRemoved(t, finished, 30*time.Second)
	checkReportedEvent(t, finished, "Delete", "rule/finished")

	// Eviction: a Running pod past its ttl is evicted (pods/eviction create).
	waitPod(t, running, "Running", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
	if time.Now().After(created(running).Add(runningTTL)) {
		t.Fatalf("pod %s became Running only after its deadline; eviction is not exercised", running.Name)
	}
	r.checkOnTime(t, running, created(running).Add(runningTTL))
	checkReportedEvent(t, running, "Evict", prefix+"ttl")

	r.checkNotRemoved(t, bystander)
	for _, msg := range []string{"forbidden", "Forbidden"} {
		if d.logContains(msg) {
			d.dumpLog()
			t.Errorf("the daemon's log mentions %q: a permission is missing", msg)
		}
	}

	// Leases: renewed (update) while leading...
	l, err = client.CoordinationV1().Leases(rbacNS).Get(ctx, lease, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if l.Spec.RenewTime == nil || l.Spec.AcquireTime == nil || !l.Spec.RenewTime.After(l.Spec.AcquireTime.Time) {
		t.Errorf("Lease %s/%s was never renewed: acquired %v, renewed %v", rbacNS, lease, l.Spec.AcquireTime, l.Spec.RenewTime)
	}
	// ...and released (update) on SIGTERM.
	if code := d.stop(30 * time.Second); code != 0 {
		t.Errorf("podjanitor exited %d on SIGTERM, want 0", code)
	}
	l, err = client.CoordinationV1().Leases(rbacNS).Get(ctx, lease, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if h := rbacDeref(l.Spec.HolderIdentity); h != "" && h != "<nil>" {
		t.Errorf("Lease %s/%s still held by %s after a clean shutdown; want it released", rbacNS, lease, h)
	}
}

// TestRBACIsLeastPrivilege checks that the ServiceAccount can do what
// podjanitor needs and little else: it cannot create or change pods, read
// Secrets, or take a Lease outside its own namespace.
func TestRBACIsLeastPrivilege(t *testing.T) {
	t.Parallel()
	saKubeconfig, sa := setupDeployRBAC(t)
	ns := newNamespace(t)
	ctx := ctxFor(t)

	type check struct {
		group, resource, subresource, verb, namespace string
	}
	allowed := []check{
		{"", "pods", "", "list", ""},
		{"", "pods", "", "watch", ""},
		{"", "pods", "", "get", ns},
		{"", "pods", "", "delete", ns},
		{"", "pods", "eviction", "create", ns},
		{"", "namespaces", "", "get", ""},
		{"", "namespaces", "", "list", ""},
		{"", "namespaces", "", "watch", ""},
		{"events.k8s.io", "events", "", "create", ns},
		{"events.k8s.io", "events", "", "patch", ns},
		{"coordination.k8s.io", "leases", "", "create", rbacNS}, // RBAC cannot restrict create by name
		{"", "configmaps", "", "create", rbacNS},                // its record of the namespaces (--hold-waves); unnamed, as create is
		// --metrics-secure: the callers of /metrics, their token and their access.
		{"authentication.k8s.io", "tokenreviews", "", "create", ""},
		{"authorization.k8s.io", "subjectaccessreviews", "", "create", ""},
	}
	denied := []check{
		{"", "pods", "", "create", ns},
		{"", "pods", "", "update", ns},
		{"", "pods", "", "patch", ns},
		{"", "pods", "status", "update", ns},
		{"", "pods", "exec", "create", ns},
		{"", "namespaces", "", "update", ""},
		{"", "namespaces", "", "patch", ""},
		{"", "namespaces", "", "delete", ""},
		{"", "secrets", "", "get", ns},
		{"", "secrets", "", "list", ""},
		{"", "configmaps", "", "get", rbacNS}, // only its own record, by name (below)
		{"", "configmaps", "", "list", rbacNS},
		{"", "configmaps", "", "create", metav1.NamespaceSystem},
		{"", "events", "", "create", ns}, // podjanitor writes events.k8s.io/v1 only
		{"", "nodes", "", "list", ""},
		{"", "serviceaccounts", "token", "create", rbacNS},
		{"apps", "deployments", "", "delete", ns},
		{"coordination.k8s.io", "leases", "", "get", metav1.NamespaceSystem},
		{"coordination.k8s.io", "leases", "", "create", metav1.NamespaceSystem},
		{"coordination.k8s.io", "leases", "", "get", rbacNS}, // only its own Lease, by name (below)
		{"coordination.k8s.io", "leases", "", "update", rbacNS},
		{"coordination.k8s.io", "leases", "", "list", rbacNS},
		{"rbac.authorization.k8s.io", "clusterroles", "", "escalate", ""},
		{"authorization.k8s.io", "localsubjectaccessreviews", "", "create", ns},
		{"certificates.k8s.io", "certificatesigningrequests", "", "create", ""},
	}
	for _, c := range append(allowed, denied...) {
		want := rbacContains(allowed, c)
		got := saCan(t, ctx, sa, c.group, c.resource, c.subresource, c.verb, c.namespace)
		if got != want {
			t.Errorf("ServiceAccount can %s %s/%s (subresource %q) in namespace %q: %v, want %v",
				c.verb, c.group, c.resource, c.subresource, c.namespace, got, want)
		}
	}
	// Leases by name: get and update the Deployment's own, nothing more on it,
	// and not another component's Lease beside it, nor its own elsewhere.
	lease := deployLeaseName(t)
	for _, c := range []struct {
		verb, namespace, name string
		want                  bool
	}{
		{"get", rbacNS, lease, true},
		{"update", rbacNS, lease, true},
		{"patch", rbacNS, lease, false},
		{"delete", rbacNS, lease, false},
		{"get", rbacNS, "kube-controller-manager", false},
		{"update", rbacNS, "kube-controller-manager", false},
		{"get", metav1.NamespaceSystem, lease, false},
		{"update", metav1.NamespaceSystem, lease, false},
	} {
		if got := saCanName(t, ctx, sa, "coordination.k8s.io", "leases", "", c.verb, c.namespace, c.name); got != c.want {
			t.Errorf("ServiceAccount can %s Lease %s/%s: %v, want %v", c.verb, c.namespace, c.name, got, c.want)
		}
	}
	// ConfigMaps by name: get and update its record of the namespaces acted on
	// (--hold-waves), named after the Lease, nothing more on it, and no other
	// ConfigMap beside it, nor its record elsewhere.
	record := lease + "-namespaces"
	for _, c := range []struct {
		verb, namespace, name string
		want                  bool
	}{
		{"get", rbacNS, record, true},
		{"update", rbacNS, record, true},
		{"patch", rbacNS, record, false},
		{"delete", rbacNS, record, false},
		{"get", rbacNS, "kube-root-ca.crt", false},
		{"update", rbacNS, "kube-root-ca.crt", false},
		{"get", rbacNS, "podjanitor-policy", false},
		{"get", metav1.NamespaceSystem, record, false},
		{"update", metav1.NamespaceSystem, record, false},
	} {
		if got := saCanName(t, ctx, sa, "", "configmaps", "", c.verb, c.namespace, c.name); got != c.want {
			t.Errorf("ServiceAccount can %s ConfigMap %s/%s: %v, want %v", c.verb, c.namespace, c.name, got, c.want)
		}
	}

	// An actual request, not only the authorizer's opinion.
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "forbidden", Namespace: ns},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "fake-image"}}},
	}
	if _, err := sa.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("creating a pod as the ServiceAccount: err = %v, want Forbidden", err)
	}

	// The daemon really runs with the token: a Lease outside its namespace is
	// refused, and it never becomes the leader.
	d := startDaemonAs(t, saKubeconfig, "is forbidden: User",
		"--label-selector", rbacRunLabel+"=none", "--leader-elect",
		"--leader-elect-resource-namespace", metav1.NamespaceSystem,
		"--leader-elect-resource-name", fmt.Sprintf("podjanitor-e2e-rbac-%04d", rand.IntN(10000)))
	if !d.logContains(rbacSAUser) || !d.logContains("forbidden") {
		d.dumpLog()
		t.Errorf("want the Lease in %s refused to %s", metav1.NamespaceSystem, rbacSAUser)
	}
	if d.logContains("Became the leader") {
		t.Errorf("the daemon became the leader on a Lease in %s it has no rights to", metav1.NamespaceSystem)
	}
}

func rbacContains[T comparable](list []T, v T) bool {
	for _, x := range list {
		if x == v {
			return true
		}
	}
	return false
}

// saCan asks the API server whether the ServiceAccount may do verb.
func saCan(t *testing.T, ctx context.Context, sa kubernetes.Interface, group, resource, subresource, verb, namespace string) bool {
	t.Helper()
	return saCanName(t, ctx, sa, group, resource, subresource, verb, namespace, "")
}

// saCanName is saCan on the object name ("" for any).
func saCanName(t *testing.T, ctx context.Context, sa kubernetes.Interface, group, resource, subresource, verb, namespace, name string) bool {
	t.Helper()
	review, err := sa.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{
		Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{
			Group: group, Resource: resource, Subresource: subresource, Verb: verb, Namespace: namespace, Name: name,
		}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("SelfSubjectAccessReview: %v", err)
	}
	return review.Status.Allowed
}

// deployLeaseName is the Lease artifacts/deploy's Deployment names
// (--leader-elect-resource-name), which its Role lets it get and update.
func deployLeaseName(t *testing.T) string {
	t.Helper()
	docs, err := deployDocuments(filepath.Join(rbacDeployDir, "deployment.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range docs {
		var dep appsv1.Deployment
		if err := json.Unmarshal(doc, &dep); err != nil || dep.Kind != "Deployment" {
			continue
		}
		for _, a := range dep.Spec.Template.Spec.Containers[0].Args {
			if name, ok := strings.CutPrefix(a, "--leader-elect-resource-name="); ok {
				return name
			}
		}
	}
	t.Fatalf("%s/deployment.yaml sets no --leader-elect-resource-name", rbacDeployDir)
	return ""
}

// deleteReleasedLease deletes the Lease unless a process holds it (a test
// daemon releases it on SIGTERM): one that another run holds is left alone.
func deleteReleasedLease(ns, name string) {
	ctx := context.Background()
	l, err := client.CoordinationV1().Leases(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil || (l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != "") {
		return
	}
	_ = client.CoordinationV1().Leases(ns).Delete(ctx, name, metav1.DeleteOptions{
		Preconditions: &metav1.Preconditions{ResourceVersion: &l.ResourceVersion}})
}

// startDaemonAs runs podjanitor with another kubeconfig: the flag package keeps
// the last --kubeconfig, so this one wins over the admin's that startDaemon
// puts first.
func startDaemonAs(t *testing.T, kubeconfigPath, waitFor string, args ...string) *daemon {
	t.Helper()
	return startDaemonWaiting(t, waitFor, append(args, "--kubeconfig", kubeconfigPath)...)
}

var leaderIdentityRE = regexp.MustCompile(`"Became the leader".* identity="([^"]+)"`)

// leaderIdentity is the identity the daemon logged on becoming the leader.
func leaderIdentity(t *testing.T, d *daemon) string {
	t.Helper()
	d.waitLog("Became the leader", 30*time.Second)
	b, err := os.ReadFile(d.logPath)
	if err != nil {
		t.Fatal(err)
	}
	m := leaderIdentityRE.FindSubmatch(b)
	if m == nil {
		d.dumpLog()
		t.Fatal("no identity in the daemon's \"Became the leader\" line")
	}
	return string(m[1])
}

// checkReportedEvent waits for the event and checks that podjanitor reported
// it, naming the annotation or rule that decided.
func checkReportedEvent(t *testing.T, pod *corev1.Pod, action, source string) {
	t.Helper()
	ev := waitRemovalEvent(t, pod, action)
	if ev.ReportingController != "podjanitor" {
		t.Errorf("%s event on %s reported by %q, want podjanitor", ev.Reason, pod.Name, ev.ReportingController)
	}
	if !strings.Contains(ev.Note, "("+source+")") {
		t.Errorf("%s event on %s: %q, want it to name %s", ev.Reason, pod.Name, ev.Note, source)
	}
}

func rbacDeref(p *string) string {
	if p == nil {
		return "<nil>"
	}
	return *p
}

// setupDeployRBAC applies the Namespace, ServiceAccount and RBAC objects of
// artifacts/deploy (create, or update what exists), waits until the RBAC is
// in force, and returns a kubeconfig and a client that use a fresh token of
// the ServiceAccount. The objects stay: they are the same for every run.
func setupDeployRBAC(t *testing.T) (string, kubernetes.Interface) {
	t.Helper()
	ctx := ctxFor(t)
	applyDeployRBAC(t, ctx)

	tr, err := client.CoreV1().ServiceAccounts(rbacNS).CreateToken(ctx, rbacSA, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptrTo(int64(3600))},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("TokenRequest for %s/%s: %v", rbacNS, rbacSA, err)
	}
	path := writeTokenKubeconfig(t, tr.Status.Token)
	restCfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		t.Fatal(err)
	}
	sa := kubernetes.NewForConfigOrDie(restCfg)

	review, err := sa.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("SelfSubjectReview with the ServiceAccount's kubeconfig: %v", err)
	}
	if u := review.Status.UserInfo.Username; u != rbacSAUser {
		t.Fatalf("the ServiceAccount's kubeconfig authenticates as %q, want %q", u, rbacSAUser)
	}
	// The RBAC authorizer sees new bindings through an informer: wait for them.
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		return saCan(t, ctx, sa, "", "pods", "", "watch", "") &&
			saCan(t, ctx, sa, "", "namespaces", "", "watch", "") &&
			saCan(t, ctx, sa, "coordination.k8s.io", "leases", "", "create", rbacNS), nil
	})
	if err != nil {
		t.Fatalf("the RBAC of %s never took effect: %v", rbacDeployDir, err)
	}
	return path, sa
}

// writeTokenKubeconfig writes a kubeconfig for the admin kubeconfig's cluster
// (server and CA) that authenticates with token alone.
func writeTokenKubeconfig(t *testing.T, token string) string {
	t.Helper()
	admin, err := clientcmd.LoadFromFile(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	if err := clientcmd.ResolveLocalPaths(admin); err != nil { // a relative CA file
		t.Fatal(err)
	}
	current, ok := admin.Contexts[admin.CurrentContext]
	if !ok {
		t.Fatalf("%s: no current context", kubeconfig)
	}
	cluster, ok := admin.Clusters[current.Cluster]
	if !ok {
		t.Fatalf("%s: no cluster %q", kubeconfig, current.Cluster)
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["e2e"] = cluster
	cfg.AuthInfos[rbacSAUser] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["podjanitor"] = &clientcmdapi.Context{Cluster: "e2e", AuthInfo: rbacSAUser}
	cfg.CurrentContext = "podjanitor"
	path := filepath.Join(t.TempDir(), "podjanitor-sa.kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// applyDeployRBAC creates or updates the Namespace, ServiceAccount and RBAC
// objects among the kustomization's resources; the rest (ConfigMap,
// Deployment, Service) are not needed to run the binary here.
func applyDeployRBAC(t *testing.T, ctx context.Context) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(rbacDeployDir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var k struct {
		Resources []string `json:"resources"`
	}
	if err := yaml.Unmarshal(data, &k); err != nil {
		t.Fatalf("kustomization.yaml: %v", err)
	}
	// A namespace left Terminating (say by `make undeploy`) takes no new objects.
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		ns, err := client.CoreV1().Namespaces().Get(ctx, rbacNS, metav1.GetOptions{})
		return apierrors.IsNotFound(err) || (err == nil && ns.DeletionTimestamp == nil), nil
	})
	if err != nil {
		t.Fatalf("namespace %s is still terminating: %v", rbacNS, err)
	}
	kinds := map[string]int{}
	for _, res := range k.Resources {
		docs, err := deployDocuments(filepath.Join(rbacDeployDir, res))
		if err != nil {
			t.Fatal(err)
		}
		for _, doc := range docs {
			var tm metav1.TypeMeta
			if err := json.Unmarshal(doc, &tm); err != nil {
				t.Fatalf("%s: %v", res, err)
			}
			if err := applyDeployDoc(ctx, tm.Kind, doc); err != nil {
				t.Fatalf("%s: %s: %v", res, tm.Kind, err)
			}
			kinds[tm.Kind]++
		}
	}
	for _, kind := range []string{"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"} {
		if kinds[kind] == 0 {
			t.Fatalf("%s has no %s", rbacDeployDir, kind)
		}
	}
}

// deployDocuments returns each non-empty document of a YAML file, as JSON.
func deployDocuments(path string) ([][]byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	reader := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var docs [][]byte
	for {
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		j, err := yaml.YAMLToJSON(doc)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if s := string(bytes.TrimSpace(j)); s != "null" && s != "" {
			docs = append(docs, j)
		}
	}
}

func applyDeployDoc(ctx context.Context, kind string, doc []byte) error {
	switch kind {
	case "Namespace":
		c := client.CoreV1().Namespaces()
		return upsertObject[corev1.Namespace](ctx, doc, c.Create, c.Get, c.Update)
	case "ServiceAccount":
		var o corev1.ServiceAccount
		if err := rbacStrictJSON(doc, &o); err != nil {
			return err
		}
		c := client.CoreV1().ServiceAccounts(o.Namespace)
		return upsertObject[corev1.ServiceAccount](ctx, doc, c.Create, c.Get, c.Update)
	case "ClusterRole":
		c := client.RbacV1().ClusterRoles()
		return upsertObject[rbacv1.ClusterRole](ctx, doc, c.Create, c.Get, c.Update)
	case "ClusterRoleBinding":
		c := client.RbacV1().ClusterRoleBindings()
		return upsertObject[rbacv1.ClusterRoleBinding](ctx, doc, c.Create, c.Get, c.Update)
	case "Role":
		var o rbacv1.Role
		if err := rbacStrictJSON(doc, &o); err != nil {
			return err
		}
		c := client.RbacV1().Roles(o.Namespace)
		return upsertObject[rbacv1.Role](ctx, doc, c.Create, c.Get, c.Update)
	case "RoleBinding":
		var o rbacv1.RoleBinding
		if err := rbacStrictJSON(doc, &o); err != nil {
			return err
		}
		c := client.RbacV1().RoleBindings(o.Namespace)
		return upsertObject[rbacv1.RoleBinding](ctx, doc, c.Create, c.Get, c.Update)
	default: // ConfigMap, Deployment, Service: not needed to run the binary here
		return nil
	}
}

func rbacStrictJSON(doc []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}

// upsertObject decodes doc into a T and creates it, or updates the existing object.
func upsertObject[T any, PT interface {
	*T
	metav1.Object
}](ctx context.Context, doc []byte,
	create func(context.Context, PT, metav1.CreateOptions) (PT, error),
	get func(context.Context, string, metav1.GetOptions) (PT, error),
	update func(context.Context, PT, metav1.UpdateOptions) (PT, error),
) error {
	return wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		obj := PT(new(T))
		if err := rbacStrictJSON(doc, obj); err != nil {
			return false, err
		}
		_, err := create(ctx, obj, metav1.CreateOptions{})
		if !apierrors.IsAlreadyExists(err) {
			return err == nil, err
		}
		existing, err := get(ctx, obj.GetName(), metav1.GetOptions{})
		if err != nil {
			return false, nil // deleted meanwhile: create again
		}
		obj.SetResourceVersion(existing.GetResourceVersion())
		_, err = update(ctx, obj, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			return false, nil // changed meanwhile: again
		}
		return err == nil, err
	})
}
