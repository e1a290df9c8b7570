package main

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
)

// networkPolicyOf is the one NetworkPolicy of r.
func networkPolicyOf(t *testing.T, r *chartRender) *networkingv1.NetworkPolicy {
	t.Helper()
	u := one(t, "NetworkPolicy", r.other("NetworkPolicy"))
	np := &networkingv1.NetworkPolicy{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, np); err != nil {
		t.Fatal(err)
	}
	return np
}

// checkNetworkPolicy: np, beside dep, selects its pods, isolates their
// ingress alone, and admits port metrics from metricsFrom and port health
// from healthFrom (a nil one: no rule), the ports named as dep's container
// names them.
func checkNetworkPolicy(t *testing.T, what string, np *networkingv1.NetworkPolicy, dep *appsv1.Deployment, metricsFrom, healthFrom []networkingv1.NetworkPolicyPeer) {
	t.Helper()
	sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
	if err != nil || np.Namespace != dep.Namespace || sel.Empty() || !sel.Matches(labels.Set(dep.Spec.Template.Labels)) {
		t.Errorf("%s: NetworkPolicy %s/%s selects %v, not the Deployment's pods %v in %s", what, np.Namespace, np.Name, sel, dep.Spec.Template.Labels, dep.Namespace)
	}
	if diff := cmp.Diff([]networkingv1.PolicyType{networkingv1.PolicyTypeIngress}, np.Spec.PolicyTypes); diff != "" {
		t.Errorf("%s: policyTypes (-want,+got):\n%s", what, diff)
	}
	ports := map[string]bool{}
	for _, p := range dep.Spec.Template.Spec.Containers[0].Ports {
		ports[p.Name] = true
	}
	got := map[string][]networkingv1.NetworkPolicyPeer{}
	for _, rule := range np.Spec.Ingress {
		if len(rule.Ports) != 1 || rule.Ports[0].Port == nil || !ports[rule.Ports[0].Port.String()] || len(rule.From) == 0 {
			t.Errorf("%s: an ingress rule %+v: want one port of the container's by name, and peers", what, rule)
			continue
		}
		got[rule.Ports[0].Port.String()] = rule.From
	}
	want := map[string][]networkingv1.NetworkPolicyPeer{}
	if metricsFrom != nil {
		want["metrics"] = metricsFrom
	}
	if healthFrom != nil {
		want["health"] = healthFrom
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("%s: the peers each port admits (-want,+got):\n%s", what, diff)
	}
}

// monitoringNamespace is the chart's default networkPolicy.metricsFrom.
var monitoringNamespace = []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{
	MatchLabels: map[string]string{"kubernetes.io/metadata.name": "monitoring"}}}}

// TestChartNetworkPolicy: off by default; on, port metrics admits the
// namespace monitoring (or metricsFrom), port health no one but the node
// (or healthFrom), nothing else; values that are no NetworkPolicy peers are
// refused.
func TestChartNetworkPolicy(t *testing.T) {
	if nps := renderChart(t).other("NetworkPolicy"); len(nps) != 0 {
		t.Errorf("by default: %d NetworkPolicies, want none", len(nps))
	}
	r := renderChart(t, "networkPolicy.enabled=true")
	dep := one(t, "Deployment", r.deployments)
	checkNetworkPolicy(t, "enabled", networkPolicyOf(t, r), dep, monitoringNamespace, nil)

	r = renderChart(t, "networkPolicy.enabled=true",
		`json:networkPolicy.metricsFrom=[{"namespaceSelector":{"matchLabels":{"team":"observability"}},"podSelector":{"matchLabels":{"app":"prometheus"}}}]`,
		`json:networkPolicy.healthFrom=[{"ipBlock":{"cidr":"10.0.0.0/16"}}]`)
	checkNetworkPolicy(t, "with metricsFrom and healthFrom", networkPolicyOf(t, r), one(t, "Deployment", r.deployments),
		[]networkingv1.NetworkPolicyPeer{{
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "observability"}},
			PodSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"app": "prometheus"}},
		}},
		[]networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.0/16"}}})

	r = renderChart(t, "networkPolicy.enabled=true", "json:networkPolicy.metricsFrom=[]")
	np := networkPolicyOf(t, r)
	if len(np.Spec.Ingress) != 0 {
		t.Errorf("metricsFrom []: ingress %+v, want none (only the node's probes)", np.Spec.Ingress)
	}

	for _, set := range []string{
		"networkPolicy.enabled=yes",
		`json:networkPolicy.healthFrom=[{"ipBlock":{"except":["10.0.0.1/32"]}}]`,
		`json:networkPolicy.metricsFrom=[{"namespace":"monitoring"}]`,
		`json:networkPolicy.metricsFrom=[{}]`,
		"networkPolicy.ports=8080",
	} {
		if _, err := helmTemplate(t, "networkPolicy.enabled=true", set); err == nil {
			t.Errorf("helm template --set %s succeeded, want values.schema.json to refuse it", set)
		}
	}
}

// TestKustomizeNetworkPolicy: artifacts/deploy with the
// artifacts/networkpolicy component has the chart's NetworkPolicy, selecting
// the Deployment's pods; without it, none.
func TestKustomizeNetworkPolicy(t *testing.T) {
	if nps := kustomizeBuild(t, deployDir).other("NetworkPolicy"); len(nps) != 0 {
		t.Errorf("artifacts/deploy alone: %d NetworkPolicies, want none", len(nps))
	}
	r := kustomizeBuild(t, overlayOf(t, "artifacts/networkpolicy", ""))
	checkNetworkPolicy(t, "artifacts/networkpolicy", networkPolicyOf(t, r), one(t, "Deployment", r.deployments), monitoringNamespace, nil)
}
