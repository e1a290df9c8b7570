package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
)

// kustomizeBuild builds a kustomization as `kubectl apply -k` would
// (sigs.k8s.io/kustomize/api, hack/tools/kustomize).
func kustomizeBuild(t *testing.T, dir string) *chartRender {
	t.Helper()
	cmd := exec.Command(devtool(t, "kustomize", "KUSTOMIZE"), "build", dir)
	out, err := cmd.Output()
	if err != nil {
		stderr := ""
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("kustomize build %s: %v\n%s", dir, err, stderr)
	}
	return decodeRender(t, string(out))
}

// overlayOf writes an overlay as the README shows them: artifacts/deploy
// with the component, plus extra lines; it returns the overlay's directory.
func overlayOf(t *testing.T, component, extra string) string {
	t.Helper()
	overlay := t.TempDir()
	rel := func(dir string) string {
		abs, err := filepath.Abs(dir)
		if err != nil {
			t.Fatal(err)
		}
		r, err := filepath.Rel(overlay, abs)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	k := "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n" +
		"resources: [" + rel(deployDir) + "]\ncomponents: [" + rel(component) + "]\n" + extra
	if err := os.WriteFile(filepath.Join(overlay, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		t.Fatal(err)
	}
	return overlay
}

// TestKustomizeDeployWithMonitoring builds the overlay the README shows:
// artifacts/deploy with the artifacts/monitoring component.
func TestKustomizeDeployWithMonitoring(t *testing.T) {
	base := kustomizeBuild(t, deployDir)
	if got, want := len(base.all), len(loadDeployObjects(t).all); got != want {
		t.Errorf("kustomize build %s: %d objects, the files have %d", deployDir, got, want)
	}

	r := kustomizeBuild(t, overlayOf(t, "artifacts/monitoring",
		"images: [{name: podjanitor, newName: registry.example.com/podjanitor, newTag: v0.1.0}]\n"))
	dep := one(t, "Deployment", r.deployments)
	if img := dep.Spec.Template.Spec.Containers[0].Image; img != "registry.example.com/podjanitor:v0.1.0" {
		t.Errorf("image %q, want the overlay's", img)
	}
	pm := one(t, "PodMonitor", r.other("PodMonitor"))
	sel, _, _ := unstructured.NestedStringMap(pm.Object, "spec", "selector", "matchLabels")
	if pm.GetNamespace() != dep.Namespace || len(sel) == 0 || !labels.SelectorFromSet(sel).Matches(labels.Set(dep.Spec.Template.Labels)) {
		t.Errorf("PodMonitor %s/%s selects %v, not the Deployment's pods %v", pm.GetNamespace(), pm.GetName(), sel, dep.Spec.Template.Labels)
	}
	eps, _, _ := unstructured.NestedSlice(pm.Object, "spec", "podMetricsEndpoints")
	if len(eps) != 1 {
		t.Fatalf("PodMonitor endpoints %v, want one", eps)
	}
	checkMonitorAuth(t, r, "PodMonitor", pm, eps[0].(map[string]any), "", "")
	if rules := r.other("PrometheusRule"); len(rules) != 1 || rules[0].GetNamespace() != dep.Namespace {
		t.Errorf("want one PrometheusRule in %s, got %d", dep.Namespace, len(rules))
	}
	found := false
	for _, cm := range r.configMaps {
		if cm.Name == "podjanitor-dashboard" && cm.Namespace == dep.Namespace && cm.Labels["grafana_dashboard"] == "1" && len(cm.Data["podjanitor-dashboard.json"]) > 1000 {
			found = true
		}
	}
	if !found {
		t.Error("no podjanitor-dashboard ConfigMap with the dashboard, labelled grafana_dashboard=1")
	}
}

func TestKustomizeAdmission(t *testing.T) {
	r := kustomizeBuild(t, "artifacts/admission")
	vap := one(t, "ValidatingAdmissionPolicy", r.other("ValidatingAdmissionPolicy"))
	binding := one(t, "ValidatingAdmissionPolicyBinding", r.other("ValidatingAdmissionPolicyBinding"))
	if name, _, _ := unstructured.NestedString(binding.Object, "spec", "policyName"); name != vap.GetName() {
		t.Errorf("binding names %q, want %q", name, vap.GetName())
	}
}

// TestKustomizeTenantPolicies builds artifacts/deploy with the
// artifacts/tenant-policies component: the CRD comes with it, and the
// Deployment's args honour tenant policies; without the component they do not.
func TestKustomizeTenantPolicies(t *testing.T) {
	base := kustomizeBuild(t, deployDir)
	o, err := parseFlags(daemonCommand, one(t, "Deployment", base.deployments).Spec.Template.Spec.Containers[0].Args)
	if err != nil || o.tenants.enabled {
		t.Errorf("artifacts/deploy alone: tenant policies on (%v), want off: it has no CRD", err)
	}

	r := kustomizeBuild(t, overlayOf(t, "artifacts/tenant-policies", ""))
	o, err = parseFlags(daemonCommand, one(t, "Deployment", r.deployments).Spec.Template.Spec.Containers[0].Args)
	if err != nil || !o.tenants.enabled {
		t.Errorf("with artifacts/tenant-policies: args parse (%v) with tenant policies off, want on", err)
	}
	crds := r.other("CustomResourceDefinition")
	if len(crds) != 1 || crds[0].GetName() != "podlifetimepolicies.podjanitor.io" {
		t.Errorf("with artifacts/tenant-policies: %d CRDs, want the podlifetimepolicies.podjanitor.io CRD", len(crds))
	}
	if got, want := len(r.all), len(base.all); got != want {
		t.Errorf("with artifacts/tenant-policies: %d objects besides the CRD, want artifacts/deploy's %d", got, want)
	}
}
