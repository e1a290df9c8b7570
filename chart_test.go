package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"

	"github.com/podjanitor/podjanitor/internal/apitest"
	"github.com/podjanitor/podjanitor/internal/events"
	"github.com/podjanitor/podjanitor/internal/secureserving"
	"github.com/podjanitor/podjanitor/internal/wave"
	"github.com/podjanitor/podjanitor/policy"
)

// These tests render charts/podjanitor with helm (built by
// hack/build-devtools.sh into _output/bin, or $HELM) and check the objects as
// deploy_test.go checks artifacts/deploy: the same RBAC, flags that parse,
// probes, ports, security context. artifacts/monitoring and
// artifacts/admission are the chart's templates rendered; TestChartArtifacts
// keeps them so. test/e2e/chart_test.go installs the chart into a cluster.

const chartDir = "charts/podjanitor"

var updateArtifacts = flag.Bool("update-artifacts", false, "rewrite artifacts/monitoring and artifacts/admission from the chart")

// devtool finds a tool that hack/build-devtools.sh builds into _output/bin
// (or the one $ENV names). Without it the test skips, unless
// PODJANITOR_REQUIRE_DEVTOOLS is set: make unit sets it, and builds the tools first.
func devtool(t *testing.T, name, env string) string {
	t.Helper()
	if p := os.Getenv(env); p != "" {
		return p
	}
	p, err := filepath.Abs("_output/bin/" + name)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); err != nil {
		if os.Getenv("PODJANITOR_REQUIRE_DEVTOOLS") != "" {
			t.Fatalf("%s is required: %v (hack/build-devtools.sh %s builds it)", name, err, name)
		}
		t.Skipf("no %s at %s; `make unit` builds it (hack/build-devtools.sh %s)", name, p, name)
	}
	return p
}

func helmBinary(t *testing.T) string { return devtool(t, "helm", "HELM") }

// runHelm runs helm with its own cache and config directories.
func runHelm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(helmBinary(t), args...)
	home := t.TempDir()
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+home, "HELM_CONFIG_HOME="+home, "HELM_DATA_HOME="+home)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("helm %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String(), nil
}

// chartRender is what `helm template` produced: typed objects for the kinds
// client-go knows, the rest (prometheus-operator's) as unstructured.
type chartRender struct {
	deployObjects
	others []*unstructured.Unstructured
}

func (r *chartRender) other(kind string) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, u := range r.others {
		if u.GetKind() == kind {
			out = append(out, u)
		}
	}
	return out
}

// renderChart renders the chart as release "podjanitor" in namespace
// "podjanitor" with the given --set values.
func renderChart(t *testing.T, set ...string) *chartRender {
	t.Helper()
	out, err := helmTemplate(t, set...)
	if err != nil {
		t.Fatal(err)
	}
	return decodeRender(t, out)
}

// setFlags turns values into --set flags; "json:k=v" into --set-json.
func setFlags(set []string) []string {
	var out []string
	for _, s := range set {
		if v, ok := strings.CutPrefix(s, "json:"); ok {
			out = append(out, "--set-json", v)
		} else {
			out = append(out, "--set", s)
		}
	}
	return out
}

func helmTemplate(t *testing.T, set ...string) (string, error) {
	t.Helper()
	return helmTemplateRelease(t, "podjanitor", set...)
}

// helmTemplateRelease renders the chart as release in namespace "podjanitor".
func helmTemplateRelease(t *testing.T, release string, set ...string) (string, error) {
	t.Helper()
	args := []string{"template", release, chartDir, "--namespace", deployNamespace}
	return runHelm(t, append(args, setFlags(set)...)...)
}

func decodeRender(t *testing.T, manifest string) *chartRender {
	t.Helper()
	r := &chartRender{}
	for i, doc := range strings.Split(manifest, "\n---") {
		j, err := yaml.YAMLToJSON([]byte(doc))
		if err != nil {
			t.Fatalf("document %d: %v", i, err)
		}
		if s := string(bytes.TrimSpace(j)); s == "null" || s == "" {
			continue
		}
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(j); err != nil {
			t.Fatalf("document %d: %v\n%s", i, err, doc)
		}
		if g := u.GroupVersionKind().Group; g == "monitoring.coreos.com" || g == "cert-manager.io" || g == "apiextensions.k8s.io" {
			r.others = append(r.others, u)
			continue
		}
		objs, err := decodeManifests([]byte(doc))
		if err != nil {
			t.Fatalf("document %d (%s): %v", i, u.GetKind(), err)
		}
		for _, obj := range objs {
			if !r.add(obj) {
				r.others = append(r.others, u)
			}
		}
	}
	return r
}

// policyConfigMap is the ConfigMap the Deployment mounts, or nil.
func (r *chartRender) policyConfigMap() *corev1.ConfigMap {
	for _, cm := range r.configMaps {
		if strings.HasSuffix(cm.Name, "-policy") {
			return cm
		}
	}
	return nil
}

// crdFile is the PodLifetimePolicy CRD (hack/crdgen writes it, and the
// same bytes into the chart's files/, which templates/crd.yaml renders).
const crdFile = "artifacts/crd/podjanitor.io_podlifetimepolicies.yaml"

// keepPolicy is the annotation that keeps the chart's CRD on helm uninstall.
const keepPolicy = "helm.sh/resource-policy"

// checkCRD: r has exactly the CRD of artifacts/crd, but for the annotations
// it returns.
func checkCRD(t *testing.T, what string, r *chartRender) map[string]string {
	t.Helper()
	data, err := os.ReadFile(crdFile)
	if err != nil {
		t.Fatal(err)
	}
	want := decodeRender(t, string(data)).other("CustomResourceDefinition")[0]
	crds := r.other("CustomResourceDefinition")
	if len(crds) != 1 {
		t.Fatalf("%s: %d CustomResourceDefinitions, want the one of %s", what, len(crds), crdFile)
	}
	got := crds[0].DeepCopy()
	annotations := got.GetAnnotations()
	got.SetAnnotations(nil)
	if !reflect.DeepEqual(got.Object, want.Object) {
		t.Errorf("%s: the CRD %s is not the one of %s", what, got.GetName(), crdFile)
	}
	return annotations
}

// TestChartInstallsTheCRD: the chart renders artifacts/crd's CRD from its
// templates (helm installs crds/ on a fresh install only, never on an
// upgrade, so an upgrade from v0.1.0 would lack it; test/e2e
// TestHelmUpgradeFromV010 upgrades), kept on uninstall; crds.install=false
// renders none; crds/ is empty (a CRD there and in templates/ would make a
// fresh install fail on an object that exists); kustomize builds the same
// CRD from artifacts/crd.
func TestChartInstallsTheCRD(t *testing.T) {
	want, err := os.ReadFile(crdFile)
	if err != nil {
		t.Fatal(err)
	}
	chartCopy := filepath.Join(chartDir, "files", filepath.Base(crdFile))
	if got, err := os.ReadFile(chartCopy); err != nil || !bytes.Equal(got, want) {
		t.Errorf("%s differs from %s (err %v): run hack/update-codegen.sh", chartCopy, crdFile, err)
	}
	if entries, err := os.ReadDir(filepath.Join(chartDir, "crds")); err == nil && len(entries) > 0 {
		t.Errorf("%s/crds has %d files, want none: the CRD is a template", chartDir, len(entries))
	}
	annotations := checkCRD(t, "helm template", renderChart(t))
	if !reflect.DeepEqual(annotations, map[string]string{keepPolicy: "keep"}) {
		t.Errorf("the chart's CRD has annotations %v, want %s: keep alone", annotations, keepPolicy)
	}
	out, err := runHelm(t, "template", "podjanitor", chartDir, "--namespace", deployNamespace, "--include-crds")
	if err != nil {
		t.Fatal(err)
	}
	checkCRD(t, "helm template --include-crds", decodeRender(t, out))
	if r := renderChart(t, "crds.install=false"); len(r.other("CustomResourceDefinition")) != 0 {
		t.Error("crds.install=false still renders the CRD")
	}
	if _, err := helmTemplate(t, "crds.install=yes"); err == nil {
		t.Error("helm template --set crds.install=yes succeeded, want values.schema.json to refuse it")
	}
	if annotations := checkCRD(t, "kustomize build artifacts/crd", kustomizeBuild(t, "artifacts/crd")); len(annotations) != 0 {
		t.Errorf("artifacts/crd's CRD has annotations %v, want none", annotations)
	}
}

func TestHelmLint(t *testing.T) {
	for _, set := range [][]string{
		nil,
		{"scope=namespace", "replicas=2", "podMonitor.enabled=true", "serviceMonitor.enabled=true",
			"prometheusRule.enabled=true", "grafanaDashboard.enabled=true", "admissionPolicy.enabled=true",
			"metrics.certManager.enabled=true", "metrics.certManager.issuerRef.name=ca"},
	} {
		args := []string{"lint", "--strict", chartDir}
		for _, s := range set {
			args = append(args, "--set", s)
		}
		if out, err := runHelm(t, args...); err != nil {
			t.Errorf("%v\n%s", err, out)
		}
	}
}

// checkRoleBinding: binding names role, for the chart's ServiceAccount.
func checkRoleBinding(t *testing.T, what string, ref rbacv1.RoleRef, subjects []rbacv1.Subject, kind, role string, sa *corev1.ServiceAccount) {
	t.Helper()
	if ref != (rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: kind, Name: role}) {
		t.Errorf("%s roleRef = %+v, want %s %s", what, ref, kind, role)
	}
	want := []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa.Name, Namespace: sa.Namespace}}
	if !slices.Equal(subjects, want) {
		t.Errorf("%s subjects = %+v, want %+v", what, subjects, want)
	}
}

// podjanitorClusterRole returns the ClusterRole name among the rendered ones,
// and checks that the others are the metrics reader's alone.
func podjanitorClusterRole(t *testing.T, r *chartRender, name string) *rbacv1.ClusterRole {
	t.Helper()
	var found *rbacv1.ClusterRole
	for _, cr := range r.clusterRoles {
		switch cr.Name {
		case name:
			found = cr
		case "podjanitor-metrics-reader":
			checkMetricsReaderRole(t, cr)
		default:
			if _, tenant := splitTenantRoles([]*rbacv1.ClusterRole{cr}); len(tenant) == 0 {
				t.Errorf("unexpected ClusterRole %s", cr.Name)
			}
		}
	}
	if found == nil {
		t.Fatalf("no ClusterRole %s among %d", name, len(r.clusterRoles))
	}
	return found
}

// checkMetricsReaderRole: the scrapers' ClusterRole grants get on /metrics,
// what podjanitor's SubjectAccessReview asks, and nothing else.
func checkMetricsReaderRole(t *testing.T, cr *rbacv1.ClusterRole) {
	t.Helper()
	want := []rbacv1.PolicyRule{{NonResourceURLs: []string{"/metrics"}, Verbs: []string{"get"}}}
	if !reflect.DeepEqual(cr.Rules, want) || cr.AggregationRule != nil {
		t.Errorf("ClusterRole %s grants %+v, want exactly %+v", cr.Name, cr.Rules, want)
	}
}

// TestChartDefaults: the default install is artifacts/deploy's: cluster-wide
// RBAC of exactly podjanitor's calls, a Lease Role, a Deployment whose args
// parse and agree with its ports, probes and policy volume, locked down.
func TestChartDefaults(t *testing.T) {
	r := renderChart(t)
	sa := one(t, "ServiceAccount", r.serviceAccounts)
	if sa.Name != "podjanitor" || sa.Namespace != deployNamespace {
		t.Errorf("ServiceAccount %s/%s, want %s/podjanitor", sa.Namespace, sa.Name, deployNamespace)
	}
	_, tenant := splitTenantRoles(r.clusterRoles)
	checkTenantRoles(t, tenant)
	cr := podjanitorClusterRole(t, r, "podjanitor")
	if want := clusterPermissions(); !slices.Equal(permissions(t, "ClusterRole", cr.Rules), want) {
		t.Errorf("ClusterRole grants %q, want exactly %q", permissions(t, "ClusterRole", cr.Rules), want)
	}
	crb := one(t, "ClusterRoleBinding", r.clusterRoleBindings)
	checkRoleBinding(t, "ClusterRoleBinding", crb.RoleRef, crb.Subjects, "ClusterRole", cr.Name, sa)
	role := one(t, "Role", r.roles)
	dep := one(t, "Deployment", r.deployments)
	if lease := leaseFlag(t, dep); lease != "podjanitor" {
		t.Errorf("--leader-elect-resource-name=%s, want podjanitor (the release's fullname)", lease)
	}
	checkLeaseRole(t, role, deployNamespace, "podjanitor", true)
	rb := one(t, "RoleBinding", r.roleBindings)
	checkRoleBinding(t, "RoleBinding", rb.RoleRef, rb.Subjects, "Role", role.Name, sa)

	if dep.Spec.Template.Spec.ServiceAccountName != sa.Name {
		t.Errorf("Deployment runs as %q, want the ServiceAccount %q", dep.Spec.Template.Spec.ServiceAccountName, sa.Name)
	}
	if dep.Spec.Replicas == nil || *dep.Spec.Replicas != 1 {
		t.Errorf("replicas = %v, want 1", dep.Spec.Replicas)
	}
	o := checkDeployment(t, dep, r.policyConfigMap())
	if !o.leaderElect || o.dryRun || o.scope.namespace != "" || o.configFile == "" {
		t.Errorf("args %q: want leader election, no dry run, all namespaces, a policy file", dep.Spec.Template.Spec.Containers[0].Args)
	}
	if img := dep.Spec.Template.Spec.Containers[0].Image; img != "podjanitor:v0.1.0" {
		t.Errorf("image %q, want podjanitor:v0.1.0 (the chart's appVersion)", img)
	}
	for _, kind := range []string{"PodMonitor", "ServiceMonitor", "PrometheusRule", "ValidatingAdmissionPolicy"} {
		if len(r.other(kind)) > 0 {
			t.Errorf("the default install renders a %s; it must be opt-in", kind)
		}
	}
	svc := one(t, "Service", r.services)
	if sel := labels.SelectorFromSet(svc.Spec.Selector); svc.Spec.Selector == nil || !sel.Matches(labels.Set(dep.Spec.Template.Labels)) {
		t.Errorf("Service selector %v does not select the pods %v", svc.Spec.Selector, dep.Spec.Template.Labels)
	}
	for _, obj := range r.all {
		m, _ := metaOf(obj)
		if m.GetLabels()["app.kubernetes.io/name"] != "podjanitor" {
			t.Errorf("%T %s lacks app.kubernetes.io/name=podjanitor", obj, m.GetName())
		}
	}
}

// TestChartDefaultPolicyIsConservative: the policy a user gets without
// reading must never remove a healthy pod: every rule is on the finished clock
// (terminal pods only) with a generous delay, and running, pending or
// crash-looping pods of any owner get no deadline.
func TestChartDefaultPolicyIsConservative(t *testing.T) {
	cm := renderChart(t).policyConfigMap()
	if cm == nil {
		t.Fatal("no policy ConfigMap")
	}
	p, err := policy.Parse([]byte(cm.Data["policy.yaml"]))
	if err != nil {
		t.Fatalf("the chart's default policy does not validate: %v", err)
	}
	var raw struct {
		Rules []struct {
			Name  string `json:"name"`
			Clock string `json:"clock"`
			After string `json:"after"`
			Match struct {
				Phases []corev1.PodPhase `json:"phases"`
			} `json:"match"`
		} `json:"rules"`
	}
	if err := yaml.Unmarshal([]byte(cm.Data["policy.yaml"]), &raw); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, rule := range raw.Rules {
		names = append(names, rule.Name)
		after, err := policy.ParseDuration(rule.After)
		switch {
		case rule.Clock != "finished":
			t.Errorf("rule %s: clock %s, want finished (terminal pods only)", rule.Name, rule.Clock)
		case err != nil || after < time.Hour:
			t.Errorf("rule %s: after %s, want at least 1h (time to read a finished pod's logs)", rule.Name, rule.After)
		case len(rule.Match.Phases) == 0 || slices.ContainsFunc(rule.Match.Phases, func(ph corev1.PodPhase) bool {
			return ph != corev1.PodSucceeded && ph != corev1.PodFailed
		}):
			t.Errorf("rule %s: phases %v, want Succeeded or Failed only", rule.Name, rule.Match.Phases)
		}
	}
	if !slices.Equal(names, []string{"evicted", "finished-bare-pods"}) {
		t.Errorf("default rules %q, want evicted and finished-bare-pods", names)
	}

	e := &policy.Evaluator{Policy: p}
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	old := now.Add(-365 * 24 * time.Hour)
	owned := func(kind string) func(*corev1.Pod) {
		return func(p *corev1.Pod) {
			p.OwnerReferences = []metav1.OwnerReference{{Kind: kind, Name: "owner", APIVersion: "apps/v1", UID: "u"}}
		}
	}
	crashLooping := func(p *corev1.Pod) {
		p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "main", RestartCount: 100,
			State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}}}}
	}
	unschedulable := func(p *corev1.Pod) {
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: "Unschedulable"}}
	}
	for _, phase := range []corev1.PodPhase{corev1.PodRunning, corev1.PodPending} {
		for _, shape := range []struct {
			name string
			opts []func(*corev1.Pod)
		}{
			{"bare", nil}, {"ReplicaSet", []func(*corev1.Pod){owned("ReplicaSet")}},
			{"DaemonSet", []func(*corev1.Pod){owned("DaemonSet")}}, {"Job", []func(*corev1.Pod){owned("Job")}},
			{"bare crash-looping", []func(*corev1.Pod){crashLooping}},
			{"ReplicaSet crash-looping", []func(*corev1.Pod){owned("ReplicaSet"), crashLooping}},
			{"bare unschedulable", []func(*corev1.Pod){unschedulable}},
		} {
			pod := apitest.Pod("healthy", old, phase, nil)
			pod.Status.StartTime = &metav1.Time{Time: old}
			for _, o := range shape.opts {
				o(pod)
			}
			d, err := e.Decide(pod, &policy.Namespace{}, now)
			if err != nil || d.HasDeadline() {
				t.Errorf("%s %s pod a year old: decision %+v, err %v; the default policy must leave it alone", phase, shape.name, d, err)
			}
		}
	}
	// What it is for: an evicted pod and a finished bare pod do go.
	evicted := apitest.Pod("evicted", old, corev1.PodFailed, nil)
	evicted.Status.Reason = "Evicted"
	owned("ReplicaSet")(evicted)
	for _, pod := range []*corev1.Pod{evicted, apitest.Pod("done", old, corev1.PodSucceeded, nil)} {
		if d, err := e.Decide(pod, &policy.Namespace{}, now); err != nil || !d.HasDeadline() {
			t.Errorf("%s pod: decision %+v, err %v; want a deadline", pod.Name, d, err)
		}
	}
}

// TestChartScopeNamespace: scope namespace is a Role in the watched
// namespace and --namespace; the only cluster-wide grant is reading that one
// namespace (namespaces are cluster-scoped: a Role cannot grant them).
func TestChartScopeNamespace(t *testing.T) {
	r := renderChart(t, "scope=namespace", "watchNamespace=apps")
	own, tenant := splitTenantRoles(r.clusterRoles)
	checkTenantRoles(t, tenant)
	if len(own) != 2 || len(r.clusterRoleBindings) != 1 {
		t.Fatalf("scope namespace renders %d ClusterRoles of its own and %d ClusterRoleBindings, want two (the watched namespace, the metrics reader) and one", len(own), len(r.clusterRoleBindings))
	}
	if cr := podjanitorClusterRole(t, r, "podjanitor-namespace"); len(cr.Rules) != 3 || !slices.Equal(cr.Rules[0].Resources, []string{"namespaces"}) ||
		!slices.Equal(cr.Rules[0].APIGroups, []string{""}) || !slices.Equal(cr.Rules[0].Verbs, []string{"get", "list", "watch"}) ||
		!slices.Equal(cr.Rules[0].ResourceNames, []string{"apps"}) ||
		!slices.Equal(permissions(t, "ClusterRole", cr.Rules[1:]), reviewPermissions) {
		t.Errorf("ClusterRole %s grants %+v, want namespaces get, list, watch on apps alone, and %q", cr.Name, cr.Rules, reviewPermissions)
	}
	sa := one(t, "ServiceAccount", r.serviceAccounts)
	roles := map[string]*rbacv1.Role{}
	for _, role := range r.roles {
		roles[role.Namespace] = role
	}
	if pods := roles["apps"]; pods == nil {
		t.Errorf("no Role in the watched namespace apps: %v", r.roles)
	} else if got := permissions(t, "Role", pods.Rules); !slices.Equal(got, podPermissions) {
		t.Errorf("Role apps/%s grants %q, want exactly %q", pods.Name, got, podPermissions)
	}
	if lease := roles[deployNamespace]; lease == nil {
		t.Errorf("no leader-election Role in %s", deployNamespace)
	} else {
		checkLeaseRole(t, lease, deployNamespace, leaseFlag(t, one(t, "Deployment", r.deployments)), true)
	}
	for _, rb := range r.roleBindings {
		role := roles[rb.Namespace]
		if role == nil {
			t.Errorf("RoleBinding %s/%s in a namespace without a Role", rb.Namespace, rb.Name)
			continue
		}
		checkRoleBinding(t, "RoleBinding "+rb.Namespace+"/"+rb.Name, rb.RoleRef, rb.Subjects, "Role", role.Name, sa)
	}
	o := checkDeployment(t, one(t, "Deployment", r.deployments), r.policyConfigMap())
	if o.scope.namespace != "apps" {
		t.Errorf("--namespace=%q, want apps", o.scope.namespace)
	}
	// watchNamespace defaults to the release's namespace.
	r = renderChart(t, "scope=namespace")
	o = checkDeployment(t, one(t, "Deployment", r.deployments), r.policyConfigMap())
	if o.scope.namespace != deployNamespace {
		t.Errorf("scope namespace without watchNamespace: --namespace=%q, want %s", o.scope.namespace, deployNamespace)
	}
}

// TestChartLeaderElection: more than one replica always elects a leader; a
// single replica without election is never rolled with two pods at once.
func TestChartLeaderElection(t *testing.T) {
	for _, tc := range []struct {
		set            []string
		wantElect      bool
		wantRecreate   bool
		wantLeaseRoles int
	}{
		{set: []string{"replicas=2"}, wantElect: true, wantLeaseRoles: 1},
		{set: []string{"replicas=2", "leaderElection.enabled=false"}, wantElect: true, wantLeaseRoles: 1},
		// Held waves and their approvals live on the Lease: its Role stays.
		{set: []string{"replicas=1", "leaderElection.enabled=false"}, wantElect: false, wantRecreate: true, wantLeaseRoles: 1},
		{set: []string{"replicas=1", "leaderElection.enabled=false", "holdWaves.enabled=false"}, wantElect: false, wantRecreate: true},
	} {
		t.Run(strings.Join(tc.set, ","), func(t *testing.T) {
			r := renderChart(t, tc.set...)
			dep := one(t, "Deployment", r.deployments)
			o := checkDeployment(t, dep, r.policyConfigMap())
			if o.leaderElect != tc.wantElect {
				t.Errorf("%v: --leader-elect=%v, want %v", tc.set, o.leaderElect, tc.wantElect)
			}
			if got := dep.Spec.Strategy.Type == appsv1.RecreateDeploymentStrategyType; got != tc.wantRecreate {
				t.Errorf("%v: strategy %q, want Recreate: %v", tc.set, dep.Spec.Strategy.Type, tc.wantRecreate)
			}
			if len(r.roles) != tc.wantLeaseRoles {
				t.Errorf("%v: %d lease Roles, want %d", tc.set, len(r.roles), tc.wantLeaseRoles)
			}
		})
	}
}

// TestChartReleasesElectApart: releases in one namespace — a dryRun canary
// beside the live release, per-team scope namespace releases — each elect on
// a Lease of their own, the release's fullname (or leaderElection.leaseName),
// and each Role may get and update that Lease alone.
func TestChartReleasesElectApart(t *testing.T) {
	leases := map[string]string{} // Lease -> release
	for _, tc := range []struct {
		release   string
		set       []string
		wantLease string
	}{
		{release: "podjanitor", wantLease: "podjanitor"},
		{release: "canary", set: []string{"dryRun=true"}, wantLease: "canary-podjanitor"},
		{release: "team-a", set: []string{"scope=namespace", "watchNamespace=team-a"}, wantLease: "team-a-podjanitor"},
		{release: "team-b", set: []string{"scope=namespace", "watchNamespace=team-b", "replicas=2"}, wantLease: "team-b-podjanitor"},
		{release: "janitor-c", set: []string{"fullnameOverride=janitor-c"}, wantLease: "janitor-c"},
	} {
		out, err := helmTemplateRelease(t, tc.release, tc.set...)
		if err != nil {
			t.Fatal(err)
		}
		r := decodeRender(t, out)
		dep := one(t, "Deployment", r.deployments)
		o := checkDeployment(t, dep, r.policyConfigMap())
		lease := leaseFlag(t, dep)
		if !o.leaderElect || lease != tc.wantLease {
			t.Errorf("release %s: --leader-elect=%v --leader-elect-resource-name=%s, want true and %s", tc.release, o.leaderElect, lease, tc.wantLease)
		}
		if other, ok := leases[lease]; ok {
			t.Errorf("releases %s and %s elect on the same Lease %s", other, tc.release, lease)
		}
		leases[lease] = tc.release
		var leaseRole *rbacv1.Role
		for _, role := range r.roles {
			if strings.HasSuffix(role.Name, "-leader-election") {
				leaseRole = role
			}
		}
		if leaseRole == nil {
			t.Fatalf("release %s: no leader-election Role", tc.release)
		}
		checkLeaseRole(t, leaseRole, deployNamespace, lease, true)
	}

	// leaderElection.leaseName names the Lease instead (the upgrade of a
	// release that must keep the Lease podjanitor of earlier chart versions).
	out, err := helmTemplateRelease(t, "team-a", "leaderElection.leaseName=podjanitor")
	if err != nil {
		t.Fatal(err)
	}
	r := decodeRender(t, out)
	if lease := leaseFlag(t, one(t, "Deployment", r.deployments)); lease != "podjanitor" {
		t.Errorf("leaderElection.leaseName=podjanitor: --leader-elect-resource-name=%s", lease)
	}
	checkLeaseRole(t, one(t, "Role", r.roles), deployNamespace, "podjanitor", true)

	// Without leader election and held waves there is no Lease, no flag and no Role for it.
	r = renderChart(t, "leaderElection.enabled=false", "holdWaves.enabled=false")
	if args := one(t, "Deployment", r.deployments).Spec.Template.Spec.Containers[0].Args; slices.ContainsFunc(args, func(a string) bool {
		return strings.HasPrefix(a, "--leader-elect-resource-name")
	}) || len(r.roles) != 0 {
		t.Errorf("leader election off: args %q and %d Roles, want neither a Lease name nor a Lease Role", args, len(r.roles))
	}
}

// TestChartValuesReachTheFlags: dryRun, logging, the annotation prefix,
// extraArgs, scheduling values, and an empty policy.
func TestChartValuesReachTheFlags(t *testing.T) {
	r := renderChart(t, "dryRun=true", "logging.format=json", "logging.verbosity=4", "annotationPrefix=janitor.example.com",
		"extraArgs={--max-deletions-per-second=20,--workers=8}", "priorityClassName=system-cluster-critical",
		"tolerations[0].operator=Exists", "nodeSelector.pool=infra", "image.tag=v9.9.9", "podAnnotations.team=platform")
	dep := one(t, "Deployment", r.deployments)
	o := checkDeployment(t, dep, r.policyConfigMap())
	if !o.dryRun || o.loggingFormat != loggingJSON || o.verbosity != 4 || o.scope.annotationPrefix != "janitor.example.com" ||
		o.maxRemovalsPerSecond != 20 || o.workers != 8 {
		t.Errorf("args %q did not carry the values", dep.Spec.Template.Spec.Containers[0].Args)
	}
	spec := dep.Spec.Template.Spec
	if spec.PriorityClassName != "system-cluster-critical" || len(spec.Tolerations) != 1 || spec.NodeSelector["pool"] != "infra" ||
		spec.Containers[0].Image != "podjanitor:v9.9.9" || dep.Spec.Template.Annotations["team"] != "platform" {
		t.Errorf("pod spec did not carry the values: %+v", spec)
	}

	r = renderChart(t, "json:policy.rules=[]")
	if r.policyConfigMap() != nil {
		t.Error("policy.rules=[] still renders a policy ConfigMap")
	}
	checkDeployment(t, one(t, "Deployment", r.deployments), nil)
}

// TestChartHoldWaves: the holdWaves values reach the flags, and with leader
// election off the Lease still has its name and Role (holds and approvals
// live there); the Role grants the ConfigMap <Lease>-namespaces (the
// namespaces acted on) with holdWaves on, and no ConfigMap with it off.
func TestChartHoldWaves(t *testing.T) {
	r := renderChart(t)
	o := checkDeployment(t, one(t, "Deployment", r.deployments), r.policyConfigMap())
	if !o.waves.hold || o.waves.threshold != (wave.Threshold{Pods: 100, Percent: 10, MinPods: 10, Horizon: 24 * time.Hour}) || o.waves.window != 5*time.Minute {
		t.Errorf("defaults: waves %+v, want held above 100 pods or 10 %% (more than 10), window 5m, horizon 24h", o.waves)
	}
	// A decimal percent as a number (--set-json) and as --set gives it: a string.
	for _, percent := range []string{"json:holdWaves.percent=2.5", "holdWaves.percent=2.5"} {
		r = renderChart(t, "holdWaves.pods=500", percent, "holdWaves.minPods=50", "holdWaves.window=90s", "holdWaves.horizon=2h", "leaderElection.enabled=false")
		o = checkDeployment(t, one(t, "Deployment", r.deployments), r.policyConfigMap())
		if o.waves.threshold != (wave.Threshold{Pods: 500, Percent: 2.5, MinPods: 50, Horizon: 2 * time.Hour}) || o.waves.window != 90*time.Second {
			t.Errorf("%s: waves %+v did not carry the values", percent, o.waves)
		}
	}
	// Values of an older chart (helm upgrade --reuse-values) have no horizon.
	old := renderChart(t, "holdWaves.horizon=null")
	if o := checkDeployment(t, one(t, "Deployment", old.deployments), old.policyConfigMap()); o.waves.threshold.Horizon != 24*time.Hour {
		t.Errorf("holdWaves without a horizon: --wave-horizon %v, want 24h", o.waves.threshold.Horizon)
	}
	dep := one(t, "Deployment", r.deployments)
	checkLeaseRole(t, one(t, "Role", r.roles), deployNamespace, leaseFlag(t, dep), true)
	// Without held waves there is no record of the namespaces acted on: the
	// Lease's Role (leader election) grants no ConfigMap.
	r = renderChart(t, "holdWaves.enabled=false")
	dep = one(t, "Deployment", r.deployments)
	if o := checkDeployment(t, dep, r.policyConfigMap()); o.waves.hold {
		t.Error("holdWaves.enabled=false: --hold-waves is on")
	}
	checkLeaseRole(t, one(t, "Role", r.roles), deployNamespace, leaseFlag(t, dep), false)
	// The record is named after the Lease: leaderElection.leaseName too.
	r = renderChart(t, "leaderElection.leaseName=janitor-lease", "leaderElection.enabled=false")
	checkLeaseRole(t, one(t, "Role", r.roles), deployNamespace, "janitor-lease", true)
}

// TestChartSchemaRejectsBadValues: values.schema.json catches typos and
// values podjanitor would refuse, at install time.
func TestChartSchemaRejectsBadValues(t *testing.T) {
	for _, set := range []string{
		"scope=cluster-wide", "replicas=0", "logging.format=yaml", "replica=2", "dryRun=yes",
		"policy.rules[0].name=x", "policy.rules[0].clock=sometime", "extraArgs={dry-run}",
		"admissionPolicy.validationActions={Block}", "podMonitor.interval=often", "annotationPrefix=Not/A/Prefix",
		// The Role names the chart's Lease: another name would leave podjanitor without one.
		"extraArgs={--leader-elect-resource-name=other}", "extraArgs={--leader-elect-resource-namespace,kube-system}",
		"leaderElection.leaseName=Not_A_Name",
		// The record ConfigMap <leaseName>-namespaces must be a valid name too (253).
		"leaderElection.leaseName=" + strings.Repeat("a", 243),
		// cert-manager needs an issuer; a reader needs a kind and a name.
		"metrics.certManager.enabled=true", "metrics.secure=yes", "metrics.readers[0].name=prometheus",
		"holdWaves.pods=-1", "holdWaves.percent=101", "holdWaves.percent=100.5", "holdWaves.percent=-1", "holdWaves.percent=ten",
		"json:holdWaves.percent=101", "holdWaves.window=1d", "holdWaves.minPods=-1", "holdWaves.enabled=yes",
	} {
		if _, err := helmTemplate(t, set); err == nil {
			t.Errorf("helm template --set %s succeeded, want values.schema.json to refuse it", set)
		}
	}
}

// TestChartMonitoring: the PodMonitor selects the pods' metrics port, the
// ServiceMonitor the Service's, and the rules and dashboard are the chart's files.
func TestChartMonitoring(t *testing.T) {
	r := renderChart(t, "podMonitor.enabled=true", "serviceMonitor.enabled=true", "prometheusRule.enabled=true",
		"grafanaDashboard.enabled=true", "podMonitor.labels.release=prom")
	dep := one(t, "Deployment", r.deployments)
	svc := one(t, "Service", r.services)

	pm := one(t, "PodMonitor", r.other("PodMonitor"))
	sel, _, _ := unstructured.NestedStringMap(pm.Object, "spec", "selector", "matchLabels")
	if len(sel) == 0 || !labels.SelectorFromSet(sel).Matches(labels.Set(dep.Spec.Template.Labels)) {
		t.Errorf("PodMonitor selector %v does not select the pods %v", sel, dep.Spec.Template.Labels)
	}
	if pm.GetLabels()["release"] != "prom" {
		t.Errorf("PodMonitor labels %v lack podMonitor.labels", pm.GetLabels())
	}
	eps, _, _ := unstructured.NestedSlice(pm.Object, "spec", "podMetricsEndpoints")
	if len(eps) != 1 || eps[0].(map[string]any)["port"] != "metrics" ||
		!slices.ContainsFunc(dep.Spec.Template.Spec.Containers[0].Ports, func(p corev1.ContainerPort) bool { return p.Name == "metrics" }) {
		t.Errorf("PodMonitor endpoints %v: want the container port metrics", eps)
	}
	checkMonitorAuth(t, r, "PodMonitor", pm, eps[0].(map[string]any), "", "")

	sm := one(t, "ServiceMonitor", r.other("ServiceMonitor"))
	sel, _, _ = unstructured.NestedStringMap(sm.Object, "spec", "selector", "matchLabels")
	if len(sel) == 0 || !labels.SelectorFromSet(sel).Matches(labels.Set(svc.Labels)) {
		t.Errorf("ServiceMonitor selector %v does not select the Service %v", sel, svc.Labels)
	}
	eps, _, _ = unstructured.NestedSlice(sm.Object, "spec", "endpoints")
	if len(eps) != 1 || eps[0].(map[string]any)["port"] != svc.Spec.Ports[0].Name {
		t.Errorf("ServiceMonitor endpoints %v: want the Service port %s", eps, svc.Spec.Ports[0].Name)
	}
	checkMonitorAuth(t, r, "ServiceMonitor", sm, eps[0].(map[string]any), "", "")

	rule := one(t, "PrometheusRule", r.other("PrometheusRule"))
	var wantSpec map[string]any
	readYAML(t, filepath.Join(chartDir, "files/prometheus-rules.yaml"), &wantSpec)
	if !reflect.DeepEqual(rule.Object["spec"], wantSpec) {
		t.Errorf("PrometheusRule spec differs from files/prometheus-rules.yaml")
	}
	var dashboard *corev1.ConfigMap
	for _, cm := range r.configMaps {
		if strings.HasSuffix(cm.Name, "-dashboard") {
			dashboard = cm
		}
	}
	want, err := os.ReadFile(filepath.Join(chartDir, "files/podjanitor-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	if dashboard == nil || dashboard.Labels["grafana_dashboard"] != "1" ||
		strings.TrimSpace(dashboard.Data["podjanitor-dashboard.json"]) != strings.TrimSpace(string(want)) {
		t.Errorf("dashboard ConfigMap %v: want files/podjanitor-dashboard.json, labelled grafana_dashboard=1", dashboard)
	}
}

// checkMonitorAuth: a monitor endpoint scrapes over HTTPS with the token of
// a ServiceAccount bound to the metrics reader ClusterRole, from a token
// Secret rendered beside it in the monitor's namespace, and either verifies
// the certificate against caSecret's ca.crt for serverName or (caSecret "")
// skips verifying the self-signed one.
func checkMonitorAuth(t *testing.T, r *chartRender, what string, monitor *unstructured.Unstructured, endpoint map[string]any, caSecret, serverName string) {
	t.Helper()
	if endpoint["scheme"] != "https" {
		t.Errorf("%s scheme %v, want https", what, endpoint["scheme"])
	}
	typ, _, _ := unstructured.NestedString(endpoint, "authorization", "type")
	secretName, _, _ := unstructured.NestedString(endpoint, "authorization", "credentials", "name")
	key, _, _ := unstructured.NestedString(endpoint, "authorization", "credentials", "key")
	if typ != "Bearer" || key != "token" {
		t.Errorf("%s authorization %v, want a Bearer token from a Secret's key token", what, endpoint["authorization"])
	}
	var sa string
	for _, u := range r.other("Secret") {
		if u.GetName() == secretName && u.GetNamespace() == monitor.GetNamespace() {
			if typ, _, _ := unstructured.NestedString(u.Object, "type"); typ == string(corev1.SecretTypeServiceAccountToken) {
				sa = u.GetAnnotations()[corev1.ServiceAccountNameKey]
			}
		}
	}
	if sa == "" {
		t.Fatalf("%s: no ServiceAccount token Secret %s/%s rendered", what, monitor.GetNamespace(), secretName)
	}
	if !slices.ContainsFunc(r.serviceAccounts, func(a *corev1.ServiceAccount) bool { return a.Name == sa && a.Namespace == monitor.GetNamespace() }) {
		t.Errorf("%s: the token Secret's ServiceAccount %s is not rendered", what, sa)
	}
	bound := false
	for _, crb := range r.clusterRoleBindings {
		for _, cr := range r.clusterRoles {
			if crb.RoleRef.Kind == "ClusterRole" && crb.RoleRef.Name == cr.Name && slices.Contains(crb.Subjects,
				rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: sa, Namespace: monitor.GetNamespace()}) {
				checkMetricsReaderRole(t, cr)
				bound = true
			}
		}
	}
	if !bound {
		t.Errorf("%s: the ServiceAccount %s is bound to no ClusterRole", what, sa)
	}
	tls, _, _ := unstructured.NestedMap(endpoint, "tlsConfig")
	if caSecret == "" {
		if tls["insecureSkipVerify"] != true || tls["ca"] != nil {
			t.Errorf("%s tlsConfig %v, want insecureSkipVerify (a self-signed certificate)", what, tls)
		}
		return
	}
	ca, _, _ := unstructured.NestedString(tls, "ca", "secret", "name")
	caKey, _, _ := unstructured.NestedString(tls, "ca", "secret", "key")
	if ca != caSecret || caKey != "ca.crt" || tls["serverName"] != serverName || tls["insecureSkipVerify"] == true {
		t.Errorf("%s tlsConfig %v, want the CA of Secret %s (ca.crt) for %s", what, tls, caSecret, serverName)
	}
}

// TestChartSecureMetrics: metrics.secure (the default) is --metrics-secure,
// the two review permissions and a reader ClusterRole; cert-manager's
// certificate is mounted at --metrics-cert-dir and verified by the monitors;
// metrics.secure=false takes all of it away.
func TestChartSecureMetrics(t *testing.T) {
	r := renderChart(t, "serviceMonitor.enabled=true", "podMonitor.enabled=true", "metrics.certManager.enabled=true",
		"metrics.certManager.issuerRef.name=cluster-ca", "metrics.certManager.issuerRef.kind=ClusterIssuer",
		"json:metrics.readers=[{\"kind\":\"ServiceAccount\",\"name\":\"prometheus\",\"namespace\":\"monitoring\"}]")
	dep := one(t, "Deployment", r.deployments)
	o := checkDeployment(t, dep, r.policyConfigMap())
	cert := one(t, "Certificate", r.other("Certificate"))
	secretName, _, _ := unstructured.NestedString(cert.Object, "spec", "secretName")
	dnsNames, _, _ := unstructured.NestedStringSlice(cert.Object, "spec", "dnsNames")
	issuer, _, _ := unstructured.NestedStringMap(cert.Object, "spec", "issuerRef")
	svc := one(t, "Service", r.services)
	if want := svc.Name + "." + svc.Namespace + ".svc"; !slices.Contains(dnsNames, want) {
		t.Errorf("Certificate dnsNames %q lack the Service's %s", dnsNames, want)
	}
	if issuer["name"] != "cluster-ca" || issuer["kind"] != "ClusterIssuer" {
		t.Errorf("Certificate issuerRef %v, want metrics.certManager.issuerRef", issuer)
	}
	spec := dep.Spec.Template.Spec
	var mounted bool
	for _, m := range spec.Containers[0].VolumeMounts {
		for _, v := range spec.Volumes {
			if v.Name == m.Name && v.Secret != nil && v.Secret.SecretName == secretName && filepath.Clean(m.MountPath) == filepath.Clean(o.endpoints.metricsCertDir) && m.ReadOnly {
				mounted = true
			}
		}
	}
	if o.endpoints.metricsCertDir == "" || !mounted {
		t.Errorf("--metrics-cert-dir=%q: want the Certificate's Secret %s mounted there, read-only", o.endpoints.metricsCertDir, secretName)
	}
	pm := one(t, "PodMonitor", r.other("PodMonitor"))
	eps, _, _ := unstructured.NestedSlice(pm.Object, "spec", "podMetricsEndpoints")
	checkMonitorAuth(t, r, "PodMonitor", pm, eps[0].(map[string]any), secretName, dnsNames[0])
	sm := one(t, "ServiceMonitor", r.other("ServiceMonitor"))
	eps, _, _ = unstructured.NestedSlice(sm.Object, "spec", "endpoints")
	checkMonitorAuth(t, r, "ServiceMonitor", sm, eps[0].(map[string]any), secretName, dnsNames[0])
	prometheus := rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: "prometheus", Namespace: "monitoring"}
	if !slices.ContainsFunc(r.clusterRoleBindings, func(b *rbacv1.ClusterRoleBinding) bool {
		return b.RoleRef.Name == "podjanitor-metrics-reader" && slices.Contains(b.Subjects, prometheus)
	}) {
		t.Errorf("metrics.readers: %+v is not bound to podjanitor-metrics-reader", prometheus)
	}

	// Plain HTTP: no review permissions, no reader role, monitors over http.
	r = renderChart(t, "metrics.secure=false", "podMonitor.enabled=true", "metrics.certManager.enabled=true", "metrics.certManager.issuerRef.name=x")
	dep = one(t, "Deployment", r.deployments)
	if o, err := parseFlags(daemonCommand, dep.Spec.Template.Spec.Containers[0].Args); err != nil || o.endpoints.metricsSecure || o.endpoints.metricsCertDir != "" {
		t.Errorf("metrics.secure=false: args %q (%v), want --metrics-secure=false without a certificate", dep.Spec.Template.Spec.Containers[0].Args, err)
	}
	own, _ := splitTenantRoles(r.clusterRoles)
	cr := one(t, "ClusterRole", own)
	if got, want := permissions(t, "ClusterRole", cr.Rules), append(slices.Clone(namespacePermissions), podPermissions...); !slices.Equal(got, want) {
		t.Errorf("metrics.secure=false: ClusterRole grants %q, want exactly %q", got, want)
	}
	if n := len(r.other("Certificate")) + len(r.other("Secret")); n > 0 {
		t.Errorf("metrics.secure=false renders %d Certificates and Secrets", n)
	}
	pm = one(t, "PodMonitor", r.other("PodMonitor"))
	eps, _, _ = unstructured.NestedSlice(pm.Object, "spec", "podMetricsEndpoints")
	if ep := eps[0].(map[string]any); ep["scheme"] != "http" || ep["authorization"] != nil || ep["tlsConfig"] != nil {
		t.Errorf("metrics.secure=false: PodMonitor endpoint %v, want plain http", ep)
	}
}

// TestChartMetricsEndpointBounds: HTTP/2, the tokens' audiences and the
// endpoints' timeouts reach the flags; HTTP/2 stays off and the timeouts are
// the daemon's defaults unless set.
func TestChartMetricsEndpointBounds(t *testing.T) {
	r := renderChart(t)
	o := checkDeployment(t, one(t, "Deployment", r.deployments), r.policyConfigMap())
	if o.endpoints.metricsHTTP2 || o.endpoints.tokenAudiences != "" ||
		o.endpoints.readTimeout != secureserving.DefaultReadTimeout || o.endpoints.idleTimeout != secureserving.DefaultIdleTimeout ||
		o.endpoints.maxConnections != secureserving.DefaultMaxConnections {
		t.Errorf("defaults: HTTP/2 %v, audiences %q, timeouts %v %v; want off, none, %v %v", o.endpoints.metricsHTTP2, o.endpoints.tokenAudiences,
			o.endpoints.readTimeout, o.endpoints.idleTimeout, secureserving.DefaultReadTimeout, secureserving.DefaultIdleTimeout)
	}
	r = renderChart(t, "metrics.enableHTTP2=true", "metrics.tokenAudiences={podjanitor,https://kubernetes.default.svc}",
		"http.readTimeout=20s", "http.idleTimeout=2m", "http.maxConnections=200")
	o = checkDeployment(t, one(t, "Deployment", r.deployments), r.policyConfigMap())
	if !o.endpoints.metricsHTTP2 || o.endpoints.tokenAudiences != "podjanitor,https://kubernetes.default.svc" ||
		o.endpoints.readTimeout != 20*time.Second || o.endpoints.idleTimeout != 2*time.Minute || o.endpoints.maxConnections != 200 {
		t.Errorf("set: HTTP/2 %v, audiences %q, timeouts %v %v", o.endpoints.metricsHTTP2, o.endpoints.tokenAudiences, o.endpoints.readTimeout, o.endpoints.idleTimeout)
	}
	// Plain HTTP has neither (the daemon would refuse them).
	r = renderChart(t, "metrics.secure=false", "metrics.enableHTTP2=true", "metrics.tokenAudiences={podjanitor}")
	for _, arg := range one(t, "Deployment", r.deployments).Spec.Template.Spec.Containers[0].Args {
		if strings.HasPrefix(arg, "--metrics-enable-http2") || strings.HasPrefix(arg, "--metrics-token-audiences") {
			t.Errorf("metrics.secure=false renders %s; want neither HTTP/2 nor audiences", arg)
		}
	}
	for _, set := range []string{"metrics.enableHTTP2=yes", "http.idleTimeout=soon", "http.readTimeout=1d", "http.maxConnections=0", "metrics.tokenAudiences={a\\,b}"} {
		if _, err := helmTemplate(t, set); err == nil {
			t.Errorf("helm template --set %s succeeded, want values.schema.json to refuse it", set)
		}
	}
}

// TestChartAdmissionPolicy: opt-in, bound, and following annotationPrefix.
func TestChartAdmissionPolicy(t *testing.T) {
	r := renderChart(t, "admissionPolicy.enabled=true", "annotationPrefix=janitor.example.com")
	vap := one(t, "ValidatingAdmissionPolicy", r.other("ValidatingAdmissionPolicy"))
	binding := one(t, "ValidatingAdmissionPolicyBinding", r.other("ValidatingAdmissionPolicyBinding"))
	if name, _, _ := unstructured.NestedString(binding.Object, "spec", "policyName"); name != vap.GetName() {
		t.Errorf("binding names policy %q, want %q", name, vap.GetName())
	}
	if actions, _, _ := unstructured.NestedStringSlice(binding.Object, "spec", "validationActions"); !slices.Equal(actions, []string{"Deny"}) {
		t.Errorf("validationActions %q, want [Deny]", actions)
	}
	j, err := json.Marshal(vap.Object["spec"])
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(j, []byte("podjanitor.io")) || !bytes.Contains(j, []byte("janitor.example.com/ttl-after-finished")) {
		t.Errorf("the policy does not follow annotationPrefix janitor.example.com:\n%s", j)
	}
}

func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// Labels that only a Helm release has; the kustomize artifacts go without them
// (artifacts/deploy's pods carry app.kubernetes.io/name alone).
var helmOnlyLabels = []string{"app.kubernetes.io/instance", "app.kubernetes.io/version", "app.kubernetes.io/managed-by", "helm.sh/chart"}

// artifactFromChart renders one template of the chart as the kustomize
// artifacts have it: release and namespace podjanitor, without Helm's labels
// (in metadata and selectors) and without helm's "# Source:" lines.
func artifactFromChart(t *testing.T, template string, set ...string) string {
	t.Helper()
	args := []string{"template", "podjanitor", chartDir, "--namespace", deployNamespace, "--show-only", "templates/" + template}
	out, err := runHelm(t, append(args, setFlags(set)...)...)
	if err != nil {
		t.Fatal(err)
	}
	var kept []string
	for _, line := range strings.Split(strings.TrimPrefix(out, "---\n"), "\n") {
		key, _, _ := strings.Cut(strings.TrimSpace(line), ":")
		if slices.Contains(helmOnlyLabels, key) || strings.HasPrefix(line, "# Source: ") {
			continue
		}
		kept = append(kept, line)
	}
	return strings.Join(kept, "\n")
}

// TestChartArtifacts keeps artifacts/monitoring, artifacts/admission and
// artifacts/networkpolicy equal to the chart's templates; -update-artifacts rewrites them.
func TestChartArtifacts(t *testing.T) {
	const header = "# Generated from charts/podjanitor by\n#   go test -run TestChartArtifacts -update-artifacts .\n# Edit the chart, not this file.\n"
	files := map[string]string{
		"artifacts/monitoring/podmonitor.yaml":               artifactFromChart(t, "monitoring.yaml", "podMonitor.enabled=true"),
		"artifacts/monitoring/prometheusrule.yaml":           artifactFromChart(t, "monitoring.yaml", "prometheusRule.enabled=true"),
		"artifacts/monitoring/metrics-reader.yaml":           artifactFromChart(t, "metrics-reader.yaml", "podMonitor.enabled=true"),
		"artifacts/admission/validatingadmissionpolicy.yaml": artifactFromChart(t, "admission-policy.yaml", "admissionPolicy.enabled=true"),
		"artifacts/networkpolicy/networkpolicy.yaml":         artifactFromChart(t, "networkpolicy.yaml", "networkPolicy.enabled=true"),
	}
	dashboard, err := os.ReadFile(filepath.Join(chartDir, "files/podjanitor-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	for path, content := range files {
		want := header + content
		if *updateArtifacts {
			if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		got, err := os.ReadFile(path)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
		if string(got) != want {
			t.Errorf("%s differs from the chart; run\n  go test -run TestChartArtifacts -update-artifacts .", path)
		}
	}
	// Without Helm's instance label the PodMonitor selects artifacts/deploy's pods.
	var pm map[string]any
	readYAML(t, "artifacts/monitoring/podmonitor.yaml", &pm)
	sel, _, _ := unstructured.NestedStringMap(pm, "spec", "selector", "matchLabels")
	dep := one(t, "Deployment", loadDeployObjects(t).deployments)
	if len(sel) == 0 || !labels.SelectorFromSet(sel).Matches(labels.Set(dep.Spec.Template.Labels)) {
		t.Errorf("artifacts/monitoring's PodMonitor selects %v, not artifacts/deploy's pods %v", sel, dep.Spec.Template.Labels)
	}

	const dashboardCopy = "artifacts/monitoring/podjanitor-dashboard.json"
	if *updateArtifacts {
		if err := os.WriteFile(dashboardCopy, dashboard, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if got, _ := os.ReadFile(dashboardCopy); !bytes.Equal(got, dashboard) {
		t.Errorf("%s differs from %s/files/podjanitor-dashboard.json; run\n  go test -run TestChartArtifacts -update-artifacts .", dashboardCopy, chartDir)
	}
}

// TestReleaseVersionsAgree: the chart, the CHANGELOG and the kustomizations'
// remote references name the same release.
func TestReleaseVersionsAgree(t *testing.T) {
	var chart struct {
		Version    string `json:"version"`
		AppVersion string `json:"appVersion"`
	}
	readYAML(t, filepath.Join(chartDir, "Chart.yaml"), &chart)
	if "v"+chart.Version != chart.AppVersion {
		t.Errorf("Chart.yaml: version %s, appVersion %s; want them to name one release", chart.Version, chart.AppVersion)
	}
	for path, want := range map[string]string{
		"CHANGELOG.md":                        "\n## " + chart.AppVersion + "\n",
		"artifacts/deploy/kustomization.yaml": "?ref=" + chart.AppVersion,
		"README.md":                           "--branch " + chart.AppVersion,
	} {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(data), want) {
			t.Errorf("%s does not name the release %s (%q)", path, chart.AppVersion, want)
		}
	}
}

// TestMonitoringComponent: artifacts/monitoring is a kustomize Component
// whose every file exists and is listed.
func TestMonitoringComponent(t *testing.T) {
	var k struct {
		Kind               string   `json:"kind"`
		Resources          []string `json:"resources"`
		ConfigMapGenerator []struct {
			Name  string   `json:"name"`
			Files []string `json:"files"`
		} `json:"configMapGenerator"`
	}
	readYAML(t, "artifacts/monitoring/kustomization.yaml", &k)
	if k.Kind != "Component" {
		t.Errorf("artifacts/monitoring/kustomization.yaml: kind %q, want Component", k.Kind)
	}
	listed := slices.Clone(k.Resources)
	for _, g := range k.ConfigMapGenerator {
		listed = append(listed, g.Files...)
	}
	files, err := filepath.Glob("artifacts/monitoring/*.*")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if base := filepath.Base(f); base != "kustomization.yaml" && !slices.Contains(listed, base) {
			t.Errorf("%s is not in the component", f)
		}
	}
	for _, f := range listed {
		if _, err := os.Stat(filepath.Join("artifacts/monitoring", f)); err != nil {
			t.Error(err)
		}
	}
}

// TestChartSchemaAgreesWithThePolicyLoader: values.schema.json refuses a
// policy rule exactly when podjanitor's loader (policy.Parse, which refuses
// the file at start: the pod would crash-loop) does, except where JSON
// Schema cannot see the loader's reason (loaderOnly). What the schema lets
// through renders a ConfigMap that the loader accepts.
func TestChartSchemaAgreesWithThePolicyLoader(t *testing.T) {
	const base = `"name":"r","clock":"created","after":"1h"`
	for _, tc := range []struct {
		rules      string // the JSON of policy.rules
		valid      bool
		loaderOnly bool // refused by the loader alone
	}{
		{rules: `[{` + base + `}]`, valid: true},
		{rules: `[{"name":"a.b_c-1","clock":"created","after":"0"}]`, valid: true},
		{rules: `[{"name":"r","clock":"created","after":"0s"}]`, valid: true},
		{rules: `[{"name":"r","clock":"created","after":"+1h30m"}]`, valid: true},
		{rules: `[{"name":"r","clock":"created","after":"1.5d"}]`, valid: true},
		{rules: `[{"name":"r","clock":"created","after":".5s"}]`, valid: true},
		{rules: `[{"name":"r","clock":"created","after":"1.s"}]`, valid: true},
		{rules: `[{"name":"r","clock":"created","after":"2w1µs"}]`, valid: true},
		{rules: `[{` + base + `,"gracePeriodSeconds":1}]`, valid: true},
		{rules: `[{` + base + `,"action":"evict"}]`, valid: true},
		{rules: `[{"name":"r","clock":"crashLooping","after":"1h","minRestarts":0}]`, valid: true},
		{rules: `[{"name":"r","clock":"crashLooping","after":"1h","minRestarts":5,"match":{"phases":["Running","Pending"]}}]`, valid: true},
		{rules: `[{"name":"r","clock":"finished","after":"1h","match":{"phases":["Succeeded","Failed"]}}]`, valid: true},
		{rules: `[{"name":"r","clock":"pending","after":"1h","match":{"phases":["Pending"]}}]`, valid: true},
		{rules: `[{` + base + `,"match":{"namespaces":{"include":["ci-*"],"exclude":["ci-prod"]},"ownerKinds":{"include":["<none>","ReplicaSet"]},` +
			`"priorityClassNames":{"exclude":["system-cluster-critical"]},"reasons":["Evicted"],"labelSelector":"app=web","namespaceSelector":"team!=x","phases":["Running"]}}]`, valid: true},

		{rules: `[{` + base + `,"gracePeriodSeconds":0}]`},
		{rules: `[{` + base + `,"gracePeriodSeconds":-1}]`},
		{rules: `[{` + base + `,"gracePeriodSeconds":1.5}]`},
		{rules: `[{"name":"r","clock":"crashLooping","after":"1h","minRestarts":-1}]`},
		{rules: `[{"name":"r","clock":"crashLooping","after":"1h","minRestarts":2147483648}]`},
		{rules: `[{` + base + `,"minRestarts":1}]`},
		{rules: `[{` + base + `,"minRestarts":0}]`},
		{rules: `[{"name":"-r","clock":"created","after":"1h"}]`},
		{rules: `[{"name":"r s","clock":"created","after":"1h"}]`},
		{rules: `[{"name":"","clock":"created","after":"1h"}]`},
		{rules: `[{"name":"r","clock":"created"}]`},
		{rules: `[{"name":"r","clock":"created","after":""}]`},
		{rules: `[{"name":"r","clock":"created","after":"1x"}]`},
		{rules: `[{"name":"r","clock":"created","after":"-1h"}]`},
		{rules: `[{"name":"r","clock":"created","after":"1"}]`},
		{rules: `[{"name":"r","clock":"created","after":"1.5"}]`},
		{rules: `[{"name":"r","clock":"created","after":"h"}]`},
		{rules: `[{"name":"r","clock":"created","after":"+"}]`},
		{rules: `[{"name":"r","clock":"created","after":".s"}]`},
		{rules: `[{"name":"r","clock":"created","after":"1hs"}]`},
		{rules: `[{"name":"r","clock":"created","after":"1h 30m"}]`},
		{rules: `[{"name":"r","clock":"created","after":60}]`},
		{rules: `[{"name":"r","clock":"finished","after":"1h","match":{"phases":["Running"]}}]`},
		{rules: `[{"name":"r","clock":"pending","after":"1h","match":{"phases":["Running"]}}]`},
		{rules: `[{"name":"r","clock":"crashLooping","after":"1h","match":{"phases":["Succeeded"]}}]`},
		{rules: `[{` + base + `,"match":{"phases":["running"]}}]`},
		{rules: `[{` + base + `,"match":{"reasons":[""]}}]`},
		{rules: `[{` + base + `,"match":{"namespaces":{"include":[""]}}}]`},
		{rules: `[{` + base + `,"match":{"namespaces":{"include":"ci"}}}]`},
		{rules: `[{` + base + `,"match":{"ownerKinds":{"include":["apps/v1 ReplicaSet"]}}}]`},
		{rules: `[{` + base + `,"match":{"priorityClassNames":{"include":["High"]}}}]`},
		{rules: `[{` + base + `,"match":{"namespace":["ci"]}}]`},
		{rules: `[{` + base + `,"action":"kill"}]`},
		{rules: `[{` + base + `,"Clock":"created"}]`},

		{rules: `[{"name":"r","clock":"created","after":"15251w"}]`, loaderOnly: true},
		{rules: `[{` + base + `,"match":{"labelSelector":"a b"}}]`, loaderOnly: true},
		{rules: `[{` + base + `,"match":{"namespaces":{"include":["ci-["]}}}]`, loaderOnly: true},
		{rules: `[{` + base + `},{` + base + `}]`, loaderOnly: true},
	} {
		t.Run("", func(t *testing.T) {
			t.Parallel()
			out, schemaErr := helmTemplate(t, "json:policy.rules="+tc.rules)
			var loaderErr error
			if schemaErr == nil {
				cm := decodeRender(t, out).policyConfigMap()
				if cm == nil {
					t.Fatalf("policy.rules=%s: no policy ConfigMap", tc.rules)
				}
				_, loaderErr = policy.Parse([]byte(cm.Data["policy.yaml"]))
			} else {
				// The file podjanitor would get, as the ConfigMap template writes it.
				_, loaderErr = policy.Parse([]byte("apiVersion: podjanitor.io/v1alpha1\nkind: PodJanitorPolicy\nrules: " + tc.rules + "\n"))
			}
			switch {
			case (loaderErr == nil) != tc.valid:
				t.Errorf("policy.rules=%s: the loader says %v, the table valid=%v", tc.rules, loaderErr, tc.valid)
			case tc.loaderOnly && schemaErr != nil:
				t.Errorf("policy.rules=%s: the schema refuses it (%v); move it out of loaderOnly", tc.rules, schemaErr)
			case !tc.loaderOnly && (schemaErr == nil) != (loaderErr == nil):
				t.Errorf("policy.rules=%s: the schema says %v, the loader %v; want them to agree", tc.rules, schemaErr, loaderErr)
			}
		})
	}
}

// TestChartNotesNameRealEvents: the event reasons NOTES.txt tells users to
// select on are the reasons podjanitor records.
func TestChartNotesNameRealEvents(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(chartDir, "templates/NOTES.txt"))
	if err != nil {
		t.Fatal(err)
	}
	known := []string{events.ReasonLifetimeExpired, events.ReasonWouldRemove, events.ReasonInvalidAnnotation, events.ReasonEvictionBlocked}
	found := regexp.MustCompile(`reason=([A-Za-z]+)`).FindAllStringSubmatch(string(data), -1)
	if len(found) == 0 {
		t.Fatal("NOTES.txt selects no event reason")
	}
	for _, m := range found {
		if !slices.Contains(known, m[1]) {
			t.Errorf("NOTES.txt selects events with reason=%s; podjanitor's reasons are %q", m[1], known)
		}
	}
}

// renderNotes renders NOTES.txt with the given --set values: helm template
// does not render it, so a copy of the chart carries it as a ConfigMap.
func renderNotes(t *testing.T, set ...string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "podjanitor")
	if err := os.CopyFS(dir, os.DirFS(chartDir)); err != nil {
		t.Fatal(err)
	}
	notes, err := os.ReadFile(filepath.Join(chartDir, "templates/NOTES.txt"))
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		"templates/_notes_test.tpl": `{{- define "notes.test" -}}` + string(notes) + `{{- end }}`,
		"templates/notes-test.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes\ndata:\n  notes: {{ include \"notes.test\" . | toJson }}\n",
	}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	args := append([]string{"template", "podjanitor", dir, "--namespace", deployNamespace, "--show-only", "templates/notes-test.yaml"}, setFlags(set)...)
	out, err := runHelm(t, args...)
	if err != nil {
		t.Fatal(err)
	}
	var cm corev1.ConfigMap
	if err := yaml.Unmarshal([]byte(out), &cm); err != nil {
		t.Fatal(err)
	}
	return cm.Data["notes"]
}

// TestChartNotesSayHowToScrape: after an install, NOTES.txt says how the
// metrics are served and who may read them, and its commands name objects
// the same values render: the reader ClusterRole, the Service, and the
// ServiceAccount whose token reads /metrics.
func TestChartNotesSayHowToScrape(t *testing.T) {
	const reader = "podjanitor-metrics-reader"
	for _, tc := range []struct {
		name    string
		set     []string
		want    []string
		notWant []string
		tokenOf string // the ServiceAccount namespace/name whose token the curl reads with
	}{{
		name:    "secure, nobody bound",
		want:    []string{"HTTPS", "ClusterRole " + reader, "Nothing is bound to it yet", "https://127.0.0.1:8080/metrics", "<a ServiceAccount bound to " + reader + ">"},
		notWant: []string{"PodMonitor", "ServiceMonitor", "plain HTTP"},
	}, {
		name:    "PodMonitor",
		set:     []string{"podMonitor.enabled=true", "prometheusRule.enabled=true"},
		want:    []string{"The PodMonitor podjanitor scrapes with the token of ServiceAccount " + reader, "Alerts: PrometheusRule podjanitor"},
		notWant: []string{"Nothing is bound"},
		tokenOf: "podjanitor/" + reader,
	}, {
		name:    "readers",
		set:     []string{`json:metrics.readers=[{"kind":"User","name":"bob"},{"kind":"ServiceAccount","name":"prometheus","namespace":"monitoring"}]`},
		want:    []string{"Bound to it: User bob, ServiceAccount monitoring/prometheus."},
		notWant: []string{"Nothing is bound", "<a ServiceAccount"},
		tokenOf: "monitoring/prometheus",
	}, {
		name:    "plain HTTP",
		set:     []string{"metrics.secure=false"},
		want:    []string{"plain HTTP", "curl -s http://127.0.0.1:8080/metrics"},
		notWant: []string{"HTTPS", "token", reader},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			notes := renderNotes(t, tc.set...)
			for _, w := range tc.want {
				if !strings.Contains(notes, w) {
					t.Errorf("NOTES.txt does not say %q:\n%s", w, notes)
				}
			}
			for _, w := range tc.notWant {
				if strings.Contains(notes, w) {
					t.Errorf("NOTES.txt says %q:\n%s", w, notes)
				}
			}
			r := renderChart(t, tc.set...)
			for _, m := range regexp.MustCompile(`Service (\S+)\.`).FindAllStringSubmatch(notes, -1) {
				if !slices.ContainsFunc(r.services, func(s *corev1.Service) bool { return s.Name == m[1] }) {
					t.Errorf("NOTES.txt names Service %s, which the chart does not render", m[1])
				}
			}
			for _, m := range regexp.MustCompile(`ClusterRole (\S+)\.`).FindAllStringSubmatch(notes, -1) {
				if !slices.ContainsFunc(r.clusterRoles, func(c *rbacv1.ClusterRole) bool { return c.Name == m[1] }) {
					t.Errorf("NOTES.txt names ClusterRole %s, which the chart does not render", m[1])
				}
			}
			m := regexp.MustCompile(`kubectl -n (\S+) create token ([^)<\s]+)\)`).FindStringSubmatch(notes)
			switch {
			case tc.tokenOf == "" && m != nil:
				t.Errorf("NOTES.txt reads /metrics with the token of %s/%s, want a placeholder", m[1], m[2])
			case tc.tokenOf != "" && (m == nil || m[1]+"/"+m[2] != tc.tokenOf):
				t.Errorf("NOTES.txt's token command %q, want the token of %s", m, tc.tokenOf)
			case tc.tokenOf != "":
				// The ServiceAccount is bound to the reader role.
				bound := false
				for _, b := range r.clusterRoleBindings {
					for _, s := range b.Subjects {
						bound = bound || (b.RoleRef.Name == reader && s.Kind == "ServiceAccount" && s.Namespace+"/"+s.Name == tc.tokenOf)
					}
				}
				if !bound {
					t.Errorf("ServiceAccount %s, whose token NOTES.txt reads /metrics with, is not bound to %s", tc.tokenOf, reader)
				}
			}
		})
	}
}

// TestChartValuesHeaderMatchesTheDefaultRules: the comment at the top of
// values.yaml, which says what an install removes, gives the default rules'
// own delays.
func TestChartValuesHeaderMatchesTheDefaultRules(t *testing.T) {
	var values struct {
		Policy struct {
			Rules []struct {
				Name  string `json:"name"`
				After string `json:"after"`
			} `json:"rules"`
		} `json:"policy"`
	}
	readYAML(t, filepath.Join(chartDir, "values.yaml"), &values)
	data, err := os.ReadFile(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var header []string
	for _, line := range strings.Split(string(data), "\n") {
		if !strings.HasPrefix(line, "#") {
			break
		}
		header = append(header, strings.TrimSpace(strings.TrimPrefix(line, "#")))
	}
	text := strings.Join(header, " ")
	words := map[time.Duration]string{time.Hour: "an hour", 24 * time.Hour: "a day", 7 * 24 * time.Hour: "a week"}
	// What the header calls each default rule's pods.
	phrases := map[string]string{"evicted": "evicted pods %s after", "finished-bare-pods": "no controller owns %s after"}
	for _, rule := range values.Policy.Rules {
		after, err := policy.ParseDuration(rule.After)
		if err != nil {
			t.Fatal(err)
		}
		phrase, ok := phrases[rule.Name]
		if !ok || words[after] == "" {
			t.Errorf("rule %s (after %s): no phrase for it in this test", rule.Name, rule.After)
			continue
		}
		if want := fmt.Sprintf(phrase, words[after]); !strings.Contains(text, want) {
			t.Errorf("values.yaml's header does not say %q (rule %s, after %s):\n%s", want, rule.Name, rule.After, text)
		}
	}
}
