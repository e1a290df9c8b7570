package main

import (
	"bufio"
	"bytes"
	"cmp"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/yaml"

	"github.com/podjanitor/podjanitor/policy"
)

// These tests check artifacts/deploy against the code: the flags in the
// Deployment exist and agree with its ports, probes and volumes, the RBAC is
// exactly what podjanitor uses, and the policy ConfigMap is the conservative
// artifacts/policy-default.yaml.
// test/e2e/rbac_test.go proves on a real API server that the RBAC suffices.

const (
	deployDir       = "artifacts/deploy"
	deployNamespace = "podjanitor"
	deployName      = "podjanitor"
)

var updateDeploy = flag.Bool("update-deploy", false, "rewrite artifacts/deploy/configmap.yaml from artifacts/policy-default.yaml")

// defaultPolicyFile is the policy artifacts/deploy ships; artifacts/policy.yaml
// is the full example, which nobody gets without choosing it.
const defaultPolicyFile = "artifacts/policy-default.yaml"

// deployObjects are the objects of the kustomization's resources, by kind.
type deployObjects struct {
	all                 []runtime.Object
	namespaces          []*corev1.Namespace
	serviceAccounts     []*corev1.ServiceAccount
	configMaps          []*corev1.ConfigMap
	services            []*corev1.Service
	deployments         []*appsv1.Deployment
	clusterRoles        []*rbacv1.ClusterRole
	clusterRoleBindings []*rbacv1.ClusterRoleBinding
	roles               []*rbacv1.Role
	roleBindings        []*rbacv1.RoleBinding
}

// kustomization is the part of kustomization.yaml these tests read.
type kustomization struct {
	Namespace string           `json:"namespace"`
	Resources []string         `json:"resources"`
	Images    []kustomizeImage `json:"images"`
}

type kustomizeImage struct {
	Name    string `json:"name"`
	NewName string `json:"newName"`
	NewTag  string `json:"newTag"`
}

func readKustomization(t *testing.T) kustomization {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(deployDir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var k kustomization
	if err := yaml.Unmarshal(data, &k); err != nil {
		t.Fatalf("kustomization.yaml: %v", err)
	}
	return k
}

// decodeManifests decodes every document of a multi-document YAML file
// strictly (unknown or duplicate fields are errors) into typed objects.
func decodeManifests(data []byte) ([]runtime.Object, error) {
	decoder := serializer.NewCodecFactory(scheme.Scheme, serializer.EnableStrict).UniversalDeserializer()
	reader := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var objs []runtime.Object
	for i := 1; ; i++ {
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			return objs, nil
		}
		if err != nil {
			return nil, err
		}
		if j, err := yaml.YAMLToJSON(doc); err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		} else if string(bytes.TrimSpace(j)) == "null" {
			continue // only comments
		}
		obj, _, err := decoder.Decode(doc, nil, nil)
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		objs = append(objs, obj)
	}
}

func loadDeployObjects(t *testing.T) *deployObjects {
	t.Helper()
	k := readKustomization(t)
	d := &deployObjects{}
	for _, res := range k.Resources {
		data, err := os.ReadFile(filepath.Join(deployDir, res))
		if err != nil {
			t.Fatalf("kustomization.yaml resource %s: %v", res, err)
		}
		objs, err := decodeManifests(data)
		if err != nil {
			t.Fatalf("%s: %v", res, err)
		}
		for _, obj := range objs {
			if !d.add(obj) {
				t.Errorf("%s: unexpected kind %T", res, obj)
			}
		}
	}
	return d
}

// add files obj under its kind; false for a kind podjanitor's manifests do not have.
func (d *deployObjects) add(obj runtime.Object) bool {
	switch o := obj.(type) {
	case *corev1.Namespace:
		d.namespaces = append(d.namespaces, o)
	case *corev1.ServiceAccount:
		d.serviceAccounts = append(d.serviceAccounts, o)
	case *corev1.ConfigMap:
		d.configMaps = append(d.configMaps, o)
	case *corev1.Service:
		d.services = append(d.services, o)
	case *appsv1.Deployment:
		d.deployments = append(d.deployments, o)
	case *rbacv1.ClusterRole:
		d.clusterRoles = append(d.clusterRoles, o)
	case *rbacv1.ClusterRoleBinding:
		d.clusterRoleBindings = append(d.clusterRoleBindings, o)
	case *rbacv1.Role:
		d.roles = append(d.roles, o)
	case *rbacv1.RoleBinding:
		d.roleBindings = append(d.roleBindings, o)
	default:
		return false
	}
	d.all = append(d.all, obj)
	return true
}

// one returns the only element of objs, failing the test otherwise.
func one[T any](t *testing.T, kind string, objs []T) T {
	t.Helper()
	if len(objs) != 1 {
		t.Fatalf("artifacts/deploy has %d %s objects, want exactly 1", len(objs), kind)
	}
	return objs[0]
}

func TestDeployManifestsAreComplete(t *testing.T) {
	k := readKustomization(t)
	files, err := filepath.Glob(filepath.Join(deployDir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if base := filepath.Base(f); base != "kustomization.yaml" && !slices.Contains(k.Resources, base) {
			t.Errorf("%s is not listed in kustomization.yaml's resources", f)
		}
	}
	if k.Namespace != "" && k.Namespace != deployNamespace {
		t.Errorf("kustomization.yaml namespace = %q; the tests and docs expect %q", k.Namespace, deployNamespace)
	}

	d := loadDeployObjects(t)
	if ns := one(t, "Namespace", d.namespaces); ns.Name != deployNamespace {
		t.Errorf("Namespace is %q, want %q", ns.Name, deployNamespace)
	}
	one(t, "ServiceAccount", d.serviceAccounts)
	own, _ := splitTenantRoles(d.clusterRoles)
	one(t, "ClusterRole", own)
	one(t, "ClusterRoleBinding", d.clusterRoleBindings)
	one(t, "Role", d.roles)
	one(t, "RoleBinding", d.roleBindings)
	one(t, "ConfigMap", d.configMaps)
	one(t, "Deployment", d.deployments)

	seen := map[string]bool{}
	for _, obj := range d.all {
		m, err := metaOf(obj)
		if err != nil {
			t.Fatal(err)
		}
		kind := obj.GetObjectKind().GroupVersionKind().Kind
		id := kind + " " + m.GetNamespace() + "/" + m.GetName()
		if seen[id] {
			t.Errorf("duplicate object %s", id)
		}
		seen[id] = true
		if m.GetLabels()["app.kubernetes.io/name"] != deployName {
			t.Errorf("%s lacks the label app.kubernetes.io/name=%s", id, deployName)
		}
		clusterScoped := kind == "Namespace" || kind == "ClusterRole" || kind == "ClusterRoleBinding"
		switch {
		case clusterScoped && m.GetNamespace() != "":
			t.Errorf("%s is cluster-scoped but sets a namespace", id)
		case !clusterScoped && m.GetNamespace() != deployNamespace:
			t.Errorf("%s: namespace %q, want %q", id, m.GetNamespace(), deployNamespace)
		}
	}
}

func metaOf(obj runtime.Object) (metav1.Object, error) {
	m, ok := obj.(metav1.Object)
	if !ok {
		return nil, fmt.Errorf("%T has no ObjectMeta", obj)
	}
	return m, nil
}

// permissions flattens RBAC rules to "group/resource verb" strings.
func permissions(t *testing.T, what string, rules []rbacv1.PolicyRule) []string {
	t.Helper()
	var out []string
	for _, r := range rules {
		if len(r.ResourceNames) > 0 || len(r.NonResourceURLs) > 0 {
			t.Errorf("%s: unexpected resourceNames or nonResourceURLs in %+v", what, r)
		}
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				for _, v := range r.Verbs {
					if g == "*" || res == "*" || v == "*" {
						t.Errorf("%s: wildcard in %+v", what, r)
					}
					out = append(out, g+"/"+res+" "+v)
				}
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// The permissions podjanitor uses, as permissions() flattens them: on pods
// (a ClusterRole, or a Role in the watched namespace) and on its Lease.
var (
	// namespacePermissions are cluster-scoped: the namespace informer.
	namespacePermissions = []string{"/namespaces get", "/namespaces list", "/namespaces watch"}
	podPermissions       = []string{
		"/pods delete", "/pods get", "/pods list", "/pods watch",
		"/pods/eviction create",
		"batch/jobs list", "batch/jobs watch", // the Job metadata cache: a Job's CronJob
		"events.k8s.io/events create", "events.k8s.io/events patch",
		"podjanitor.io/podlifetimepolicies get", "podjanitor.io/podlifetimepolicies list", "podjanitor.io/podlifetimepolicies patch", "podjanitor.io/podlifetimepolicies watch",
		"podjanitor.io/podlifetimepolicies/status patch", "podjanitor.io/podlifetimepolicies/status update",
	}
	// reviewPermissions are cluster-scoped too: --metrics-secure's
	// TokenReviews and SubjectAccessReviews of the callers of /metrics.
	reviewPermissions = []string{"authentication.k8s.io/tokenreviews create", "authorization.k8s.io/subjectaccessreviews create"}
)

// aggregateLabel is the label prefix of ClusterRoles aggregated into the
// built-in admin, edit and view roles.
const aggregateLabel = "rbac.authorization.k8s.io/aggregate-to-"

// splitTenantRoles separates podjanitor's own ClusterRoles from the ones
// that delegate PodLifetimePolicy to namespace owners (aggregated).
func splitTenantRoles(roles []*rbacv1.ClusterRole) (own, tenant []*rbacv1.ClusterRole) {
	for _, r := range roles {
		aggregated := false
		for k := range r.Labels {
			aggregated = aggregated || strings.HasPrefix(k, aggregateLabel)
		}
		if aggregated {
			tenant = append(tenant, r)
		} else {
			own = append(own, r)
		}
	}
	return own, tenant
}

// checkTenantRoles: one ClusterRole aggregated into admin and edit with every
// verb on podlifetimepolicies (not their status), one into view with get,
// list and watch; nothing else.
func checkTenantRoles(t *testing.T, roles []*rbacv1.ClusterRole) {
	t.Helper()
	const res = "podjanitor.io/podlifetimepolicies "
	want := map[string][]string{
		"admin,edit": {res + "create", res + "delete", res + "deletecollection", res + "get", res + "list", res + "patch", res + "update", res + "watch"},
		"view":       {res + "get", res + "list", res + "watch"},
	}
	got := map[string][]string{}
	for _, r := range roles {
		var to []string
		for k, v := range r.Labels {
			if role, ok := strings.CutPrefix(k, aggregateLabel); ok {
				if v != "true" {
					t.Errorf("ClusterRole %s: label %s=%q, want \"true\"", r.Name, k, v)
				}
				to = append(to, role)
			}
		}
		slices.Sort(to)
		key := strings.Join(to, ",")
		if _, dup := got[key]; dup {
			t.Errorf("two ClusterRoles aggregate into %s", key)
		}
		got[key] = permissions(t, "ClusterRole "+r.Name, r.Rules)
	}
	for key, perms := range want {
		if !slices.Equal(got[key], perms) {
			t.Errorf("the ClusterRole aggregated into %s grants\n  %q\nwant exactly\n  %q", key, got[key], perms)
		}
	}
	if len(got) != len(want) {
		t.Errorf("ClusterRoles aggregated into %v, want %v", slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(want)))
	}
}

// clusterPermissions is what podjanitor's ClusterRole grants with scope cluster.
func clusterPermissions() []string {
	out := slices.Concat(namespacePermissions, podPermissions, reviewPermissions)
	slices.Sort(out)
	return out
}

// checkLeaseRole: role grants create on Leases (which RBAC cannot restrict by
// name) and get and update on the Lease lease alone (resourceNames), the
// calls of client-go's LeaseLock, in namespace ns; with holdWaves
// (--hold-waves) the same on ConfigMaps, get and update on lease-namespaces
// alone (the record of the namespaces acted on); nothing else.
func checkLeaseRole(t *testing.T, role *rbacv1.Role, ns, lease string, holdWaves bool) {
	t.Helper()
	var got []string
	for _, r := range role.Rules {
		if len(r.NonResourceURLs) > 0 {
			t.Errorf("Role %s: unexpected nonResourceURLs in %+v", role.Name, r)
		}
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				for _, v := range r.Verbs {
					if len(r.ResourceNames) == 0 {
						got = append(got, g+"/"+res+" "+v)
					}
					for _, name := range r.ResourceNames {
						got = append(got, g+"/"+res+" "+v+" "+name)
					}
				}
			}
		}
	}
	slices.Sort(got)
	want := []string{"coordination.k8s.io/leases create", "coordination.k8s.io/leases get " + lease, "coordination.k8s.io/leases update " + lease}
	if holdWaves {
		record := lease + "-namespaces"
		want = append([]string{"/configmaps create", "/configmaps get " + record, "/configmaps update " + record}, want...)
	}
	if !slices.Equal(got, want) || role.Namespace != ns {
		t.Errorf("Role %s/%s grants\n  %q\nwant exactly\n  %q in %s", role.Namespace, role.Name, got, want, ns)
	}
}

// leaseFlag is the Deployment's --leader-elect-resource-name, which it must
// set explicitly: the Role names that Lease, and the flag's default is no
// promise.
func leaseFlag(t *testing.T, dep *appsv1.Deployment) string {
	t.Helper()
	args := dep.Spec.Template.Spec.Containers[0].Args
	o, err := parseFlags(daemonCommand, args)
	if err != nil {
		t.Fatalf("args %q: %v", args, err)
	}
	if !slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--leader-elect-resource-name=") }) {
		t.Errorf("Deployment %s: args %q do not set --leader-elect-resource-name; its Role names the Lease", dep.Name, args)
	}
	return o.lease.name
}

// holdWavesFlag is the Deployment's --hold-waves (default on).
func holdWavesFlag(t *testing.T, dep *appsv1.Deployment) bool {
	t.Helper()
	args := dep.Spec.Template.Spec.Containers[0].Args
	o, err := parseFlags(daemonCommand, args)
	if err != nil {
		t.Fatalf("args %q: %v", args, err)
	}
	return o.waves.hold
}

// TestDeployRBACIsLeastPrivilege pins the RBAC to exactly the calls podjanitor
// makes (see rbac.yaml for why each is needed); a new API call needs a new
// rule here and there, and the e2e test in test/e2e/rbac_test.go.
func TestDeployRBACIsLeastPrivilege(t *testing.T) {
	d := loadDeployObjects(t)
	sa := one(t, "ServiceAccount", d.serviceAccounts)

	own, tenant := splitTenantRoles(d.clusterRoles)
	checkTenantRoles(t, tenant)
	cr := one(t, "ClusterRole", own)
	want := clusterPermissions()
	if got := permissions(t, "ClusterRole", cr.Rules); !slices.Equal(got, want) {
		t.Errorf("ClusterRole %s grants\n  %q\nwant exactly\n  %q", cr.Name, got, want)
	}
	role := one(t, "Role", d.roles)
	lease := leaseFlag(t, one(t, "Deployment", d.deployments))
	if lease != deployName {
		t.Errorf("--leader-elect-resource-name=%s, want %s", lease, deployName)
	}
	// --hold-waves is on (the default), so the Role grants its record too.
	if !holdWavesFlag(t, one(t, "Deployment", d.deployments)) {
		t.Error("the Deployment runs with --hold-waves=false; its Role grants the record of the namespaces acted on, which is then spare")
	}
	checkLeaseRole(t, role, deployNamespace, lease, true)

	wantSubject := []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa.Name, Namespace: sa.Namespace}}
	crb := one(t, "ClusterRoleBinding", d.clusterRoleBindings)
	if crb.RoleRef != (rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: cr.Name}) {
		t.Errorf("ClusterRoleBinding roleRef = %+v, want the ClusterRole %s", crb.RoleRef, cr.Name)
	}
	if !slices.Equal(crb.Subjects, wantSubject) {
		t.Errorf("ClusterRoleBinding subjects = %+v, want %+v", crb.Subjects, wantSubject)
	}
	rb := one(t, "RoleBinding", d.roleBindings)
	if rb.RoleRef != (rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name}) {
		t.Errorf("RoleBinding roleRef = %+v, want the Role %s", rb.RoleRef, role.Name)
	}
	if !slices.Equal(rb.Subjects, wantSubject) {
		t.Errorf("RoleBinding subjects = %+v, want %+v", rb.Subjects, wantSubject)
	}
	if dep := one(t, "Deployment", d.deployments); dep.Spec.Template.Spec.ServiceAccountName != sa.Name {
		t.Errorf("Deployment runs as ServiceAccount %q, want %q", dep.Spec.Template.Spec.ServiceAccountName, sa.Name)
	}
}

// TestDeploymentMatchesFlags parses the Deployment's args with the daemon's
// own flag parser and checks that ports, probes, volumes and the grace period
// agree with them, and that the pod runs locked down.
func TestDeploymentMatchesFlags(t *testing.T) {
	d := loadDeployObjects(t)
	dep := one(t, "Deployment", d.deployments)
	if dep.Spec.Replicas == nil || *dep.Spec.Replicas != 1 {
		t.Errorf("replicas = %v, want 1", dep.Spec.Replicas)
	}
	o := checkDeployment(t, dep, one(t, "ConfigMap", d.configMaps))
	if !o.leaderElect {
		t.Error("the Deployment must run with --leader-elect=true")
	}
	if o.dryRun {
		t.Error("artifacts/deploy must not run with --dry-run")
	}

	// The image is the one kustomize retags.
	k := readKustomization(t)
	name, _, _ := strings.Cut(dep.Spec.Template.Spec.Containers[0].Image, ":")
	if !slices.ContainsFunc(k.Images, func(i kustomizeImage) bool { return i.Name == name }) {
		t.Errorf("image %q is not in kustomization.yaml's images, so overlays cannot retag it", name)
	}
}

// checkDeployment parses a podjanitor Deployment's args with the daemon's own
// flag parser and checks that ports, probes, the policy volume (cm, nil when
// the Deployment runs without --config) and the grace period agree with them,
// and that the pod runs locked down. It returns the parsed flags.
func checkDeployment(t *testing.T, dep *appsv1.Deployment, cm *corev1.ConfigMap) *flagValues {
	t.Helper()
	spec := dep.Spec.Template.Spec
	if len(spec.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(spec.Containers))
	}
	c := spec.Containers[0]
	if len(c.Command) > 0 {
		t.Errorf("command %q overrides the image's entrypoint; set args only", c.Command)
	}

	o, err := parseFlags(daemonCommand, c.Args)
	if err != nil {
		t.Fatalf("the Deployment's args %q do not parse: %v", c.Args, err)
	}
	if o.cluster.kubeconfig != "" || o.cluster.master != "" {
		t.Errorf("args %q: want in-cluster configuration", c.Args)
	}
	if o.lease.namespace != "" {
		t.Errorf("--leader-elect-resource-namespace=%s: leave it to POD_NAMESPACE, where the Role is", o.lease.namespace)
	}
	if !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool {
		return e.Name == "POD_NAMESPACE" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.namespace"
	}) {
		t.Error("env POD_NAMESPACE must come from the downward API (metadata.namespace)")
	}

	// Ports and probes agree with the bind addresses.
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	checkPort := func(flagName, addr, portName string) {
		t.Helper()
		_, port, err := net.SplitHostPort(addr)
		if err != nil {
			t.Errorf("--%s=%q: %v", flagName, addr, err)
			return
		}
		if n, _ := strconv.Atoi(port); ports[portName] == 0 || int(ports[portName]) != n {
			t.Errorf("--%s=%s, but the container port named %q is %d", flagName, addr, portName, ports[portName])
		}
	}
	checkPort("metrics-bind-address", o.endpoints.metricsAddr, "metrics")
	if !o.endpoints.metricsSecure {
		t.Errorf("args %q: want --metrics-secure=true (HTTPS, authorized callers only)", c.Args)
	}
	checkPort("health-probe-bind-address", o.endpoints.healthAddr, "health")
	checkProbe := func(what string, p *corev1.Probe, path string) {
		t.Helper()
		switch {
		case p == nil || p.HTTPGet == nil:
			t.Errorf("%s: want an HTTP GET probe on %s", what, path)
		case p.HTTPGet.Path != path:
			t.Errorf("%s path = %q, want %q", what, p.HTTPGet.Path, path)
		case p.HTTPGet.Port.StrVal != "health" && p.HTTPGet.Port.IntVal != ports["health"]:
			t.Errorf("%s port = %s, want the health port", what, p.HTTPGet.Port.String())
		}
	}
	checkProbe("startupProbe", c.StartupProbe, "/healthz")
	checkProbe("livenessProbe", c.LivenessProbe, "/healthz")
	checkProbe("readinessProbe", c.ReadinessProbe, "/readyz")
	checkProbeBudgets(t, c)

	// The policy file is the ConfigMap's key, mounted as a directory (not
	// subPath, which would never see an update).
	checkPolicyMount(t, spec, o, cm)

	// Shutdown: the kubelet's SIGKILL must come after --shutdown-timeout.
	if g := spec.TerminationGracePeriodSeconds; g == nil || *g <= int64(o.shutdownTimeout.Seconds()) {
		t.Errorf("terminationGracePeriodSeconds = %s, want more than --shutdown-timeout (%v)", fmtPtr(g), o.shutdownTimeout)
	}
	checkLockedDown(t, spec)
	return o
}

// probeBudget is how long a probe may fail before the kubelet acts: a
// startup or liveness probe's restart, a readiness probe's not-ready.
func probeBudget(p *corev1.Probe) time.Duration {
	if p == nil {
		return 0
	}
	period, failures := cmp.Or(p.PeriodSeconds, 10), cmp.Or(p.FailureThreshold, 3)
	return time.Duration(p.InitialDelaySeconds+period*failures) * time.Second
}

// checkProbeBudgets: the start has a budget of its own, minutes, in a startup
// probe (the kubelet runs no liveness probe before it passes), so that a slow
// start on a busy node is not restarted; the liveness probe stays tight.
func checkProbeBudgets(t *testing.T, c corev1.Container) {
	t.Helper()
	if b := probeBudget(c.StartupProbe); b < 2*time.Minute {
		t.Errorf("startupProbe %+v: the start's budget is %v, want at least 2m0s", c.StartupProbe, b)
	}
	if b := probeBudget(c.LivenessProbe); b == 0 || b > 30*time.Second || c.LivenessProbe.InitialDelaySeconds != 0 {
		t.Errorf("livenessProbe %+v: a budget of %v, want at most 30s and no initial delay (the startup probe covers the start)", c.LivenessProbe, b)
	}
}

// checkPolicyMount: --config names a key of cm mounted as a read-only directory.
func checkPolicyMount(t *testing.T, spec corev1.PodSpec, o *flagValues, cm *corev1.ConfigMap) {
	t.Helper()
	c := spec.Containers[0]
	if cm == nil {
		if o.configFile != "" || len(c.VolumeMounts) > 0 {
			t.Errorf("--config=%q and volumeMounts %+v without a policy ConfigMap", o.configFile, c.VolumeMounts)
		}
		return
	}
	dir, file := filepath.Split(o.configFile)
	var mount *corev1.VolumeMount
	for i := range c.VolumeMounts {
		if filepath.Clean(c.VolumeMounts[i].MountPath) == filepath.Clean(dir) {
			mount = &c.VolumeMounts[i]
		}
	}
	if mount == nil {
		t.Fatalf("--config=%s: no volume is mounted at %s", o.configFile, dir)
	}
	if mount.SubPath != "" || !mount.ReadOnly {
		t.Errorf("volumeMount %+v: want read-only and no subPath (reloads need the whole directory)", *mount)
	}
	vi := slices.IndexFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == mount.Name })
	if vi < 0 || spec.Volumes[vi].ConfigMap == nil || spec.Volumes[vi].ConfigMap.Name != cm.Name {
		t.Errorf("the volume at %s must be the ConfigMap %s", dir, cm.Name)
	}
	if _, ok := cm.Data[file]; !ok {
		t.Errorf("--config=%s, but the ConfigMap %s has no key %q", o.configFile, cm.Name, file)
	}
}

// checkLockedDown: the restricted Pod Security Standard, and sized resources.
func checkLockedDown(t *testing.T, spec corev1.PodSpec) {
	t.Helper()
	c := spec.Containers[0]
	psc, csc := spec.SecurityContext, c.SecurityContext
	if psc == nil || csc == nil {
		t.Fatal("want both a pod and a container securityContext")
	}
	if !isTrue(csc.RunAsNonRoot) && !isTrue(psc.RunAsNonRoot) {
		t.Error("runAsNonRoot must be true")
	}
	for _, uid := range []*int64{psc.RunAsUser, csc.RunAsUser} {
		if uid != nil && *uid != 65532 {
			t.Errorf("runAsUser = %d, want 65532 (the image's USER)", *uid)
		}
	}
	if psc.RunAsUser == nil && csc.RunAsUser == nil {
		t.Error("runAsUser must be set (65532)")
	}
	if !isTrue(csc.ReadOnlyRootFilesystem) {
		t.Error("readOnlyRootFilesystem must be true")
	}
	if csc.AllowPrivilegeEscalation == nil || *csc.AllowPrivilegeEscalation {
		t.Error("allowPrivilegeEscalation must be false")
	}
	if csc.Capabilities == nil || !slices.Equal(csc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(csc.Capabilities.Add) > 0 {
		t.Errorf("capabilities = %+v, want drop [ALL] and nothing added", csc.Capabilities)
	}
	seccomp := csc.SeccompProfile
	if seccomp == nil {
		seccomp = psc.SeccompProfile
	}
	if seccomp == nil || seccomp.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("seccompProfile = %+v, want RuntimeDefault", seccomp)
	}

	// Resources: requests for scheduling, a memory limit, limit above request.
	req, lim := c.Resources.Requests, c.Resources.Limits
	for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		if q, ok := req[r]; !ok || q.IsZero() {
			t.Errorf("resources.requests.%s must be set", r)
		}
	}
	if q, ok := lim[corev1.ResourceMemory]; !ok || q.Cmp(req[corev1.ResourceMemory]) < 0 {
		request := req[corev1.ResourceMemory]
		t.Errorf("resources.limits.memory = %v, want set and at least the request %v", q.String(), request.String())
	}
}

func isTrue(b *bool) bool { return b != nil && *b }

func fmtPtr[T any](p *T) string {
	if p == nil {
		return "unset"
	}
	return fmt.Sprint(*p)
}

func TestDeployServiceSelectsTheMetricsPort(t *testing.T) {
	d := loadDeployObjects(t)
	if len(d.services) == 0 {
		t.Skip("no Service")
	}
	dep := one(t, "Deployment", d.deployments)
	svc := one(t, "Service", d.services)
	for k, v := range svc.Spec.Selector {
		if dep.Spec.Template.Labels[k] != v {
			t.Errorf("Service selector %s=%s does not match the pod labels %v", k, v, dep.Spec.Template.Labels)
		}
	}
	if len(svc.Spec.Selector) == 0 {
		t.Error("Service has no selector")
	}
	if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Name != "metrics" || svc.Spec.Ports[0].TargetPort.String() != "metrics" {
		t.Errorf("Service ports = %+v, want one named metrics targeting the container port metrics", svc.Spec.Ports)
	}
}

// TestDeployPolicyConfigMap checks that the ConfigMap carries
// artifacts/policy-default.yaml byte for byte, and that it validates.
// With -update-deploy it rewrites the ConfigMap's policy from that file.
func TestDeployPolicyConfigMap(t *testing.T) {
	want, err := os.ReadFile(defaultPolicyFile)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(deployDir, "configmap.yaml")
	if *updateDeploy {
		rewritePolicyConfigMap(t, path, want)
	}
	cm := one(t, "ConfigMap", loadDeployObjects(t).configMaps)
	if cm.Name != "podjanitor-policy" {
		t.Errorf("ConfigMap name %q, want podjanitor-policy", cm.Name)
	}
	got, ok := cm.Data["policy.yaml"]
	if !ok {
		t.Fatalf("ConfigMap %s has no key policy.yaml", cm.Name)
	}
	if got != string(want) {
		t.Errorf("%s's policy.yaml differs from %s; run\n  go test -run TestDeployPolicyConfigMap -update-deploy .", path, defaultPolicyFile)
	}
	if _, err := policy.Parse([]byte(got)); err != nil {
		t.Errorf("the ConfigMap's policy does not validate: %v", err)
	}
}

// TestDefaultPolicyRemovesOnlyFinishedPods proves that what
// `kubectl apply -k artifacts/deploy` turns on never removes a pod that runs
// or waits to run: every rule of the default policy requires a finished
// phase and counts from the finish, and none reaches into kube-system or the
// critical priority classes. Its commented examples and the full example
// policy parse, so that turning them on works.
func TestDefaultPolicyRemovesOnlyFinishedPods(t *testing.T) {
	p, err := policy.LoadFile(defaultPolicyFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, rule := range p.Rules {
		if len(rule.Match.Phases) == 0 {
			t.Errorf("%s: rule %q matches pods in any phase; want only Succeeded or Failed", defaultPolicyFile, rule.Name)
		}
		for _, phase := range rule.Match.Phases {
			if phase != corev1.PodSucceeded && phase != corev1.PodFailed {
				t.Errorf("%s: rule %q matches %s pods; want only Succeeded or Failed", defaultPolicyFile, rule.Name, phase)
			}
		}
		if rule.Clock != policy.ClockFinished {
			t.Errorf("%s: rule %q has clock %q; want %q", defaultPolicyFile, rule.Name, rule.Clock, policy.ClockFinished)
		}
		if len(rule.Match.PriorityClassNames.Include) > 0 || slices.Contains(rule.Match.Namespaces.Include, metav1.NamespaceSystem) {
			t.Errorf("%s: rule %q names critical pods or kube-system", defaultPolicyFile, rule.Name)
		}
	}
	if len(p.Rules) == 0 {
		t.Errorf("%s has no rules", defaultPolicyFile)
	}

	data, err := os.ReadFile(defaultPolicyFile)
	if err != nil {
		t.Fatal(err)
	}
	uncommented := strings.NewReplacer("  # - ", "  - ", "  #   ", "    ").Replace(string(data))
	examples, err := policy.Parse([]byte(uncommented))
	if err != nil {
		t.Fatalf("%s with its examples uncommented: %v", defaultPolicyFile, err)
	}
	if len(examples.Rules) <= len(p.Rules) {
		t.Errorf("%s: uncommenting the examples gave %d rules, want more than the %d default ones", defaultPolicyFile, len(examples.Rules), len(p.Rules))
	}
	if _, err := policy.LoadFile("artifacts/policy.yaml"); err != nil {
		t.Error(err)
	}
}

// rewritePolicyConfigMap keeps the file up to the "policy.yaml: |" line and
// replaces the rest with the policy, indented.
func rewritePolicyConfigMap(t *testing.T, path string, policyYAML []byte) {
	t.Helper()
	old, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	const key = "\n  policy.yaml: |\n"
	head, _, ok := bytes.Cut(old, []byte(key))
	if !ok {
		t.Fatalf("%s: no %q line to rewrite after", path, strings.TrimSpace(key))
	}
	var b bytes.Buffer
	b.Write(head)
	b.WriteString(key)
	for _, line := range strings.SplitAfter(string(policyYAML), "\n") {
		if strings.TrimSpace(line) != "" {
			b.WriteString("    ")
		}
		b.WriteString(line)
	}
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("rewrote %s", path)
}

// TestDockerfileUserMatchesDeployment: the image's user is the one the pod runs as.
func TestDockerfileUserMatchesDeployment(t *testing.T) {
	data, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(data, []byte("\nUSER 65532:65532\n")) {
		t.Error("Dockerfile: want USER 65532:65532 (runAsUser in artifacts/deploy/deployment.yaml)")
	}
	if !bytes.Contains(data, []byte("CGO_ENABLED=0")) || !bytes.Contains(data, []byte("-X main.version=")) {
		t.Error("Dockerfile: want a static build (CGO_ENABLED=0) stamped with -X main.version")
	}
}
