package tenant

import (
	"k8s.io/apimachinery/pkg/util/validation"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/podjanitor/podjanitor/pkg/apis/podjanitor/v1alpha1"
	"github.com/podjanitor/podjanitor/policy"
)

func TestLimitsAdmit(t *testing.T) {
	c := func(name string, rules, bytes int) Candidate {
		return Candidate{Name: name, Rules: rules, Bytes: bytes}
	}
	for _, tc := range []struct {
		name       string
		limits     Limits
		candidates []Candidate
		want       []string
	}{
		{"no bounds", Limits{}, []Candidate{c("a", 32, 1e6), c("b", 32, 1e6)}, []string{"", ""}},
		{"policies", Limits{Policies: 2}, []Candidate{c("a", 1, 1), c("b", 1, 1), c("c", 1, 1)}, []string{"", "", TooManyPolicies}},
		{"rules: a later, smaller policy still fits", Limits{Rules: 4}, []Candidate{c("a", 3, 1), c("b", 2, 1), c("c", 1, 1)},
			[]string{"", TooManyRules, ""}},
		{"rules: exactly at the limit", Limits{Rules: 4}, []Candidate{c("a", 2, 1), c("b", 2, 1)}, []string{"", ""}},
		{"bytes", Limits{Bytes: 100}, []Candidate{c("a", 1, 60), c("b", 1, 41), c("c", 1, 40)}, []string{"", TooLarge, ""}},
		{"a refused policy counts toward nothing", Limits{Policies: 2, Rules: 4}, []Candidate{c("a", 4, 1), c("b", 1, 1), c("c", 0, 1)},
			[]string{"", TooManyRules, ""}},
	} {
		if diff := cmp.Diff(tc.want, tc.limits.Admit(tc.candidates)); diff != "" {
			t.Errorf("%s (-want,+got):\n%s", tc.name, diff)
		}
	}
}

func TestTransformKeepsWhatIsRead(t *testing.T) {
	now := metav1.Now()
	p := &v1alpha1.PodLifetimePolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "p", UID: "u", Generation: 3, ResourceVersion: "9", DeletionTimestamp: &now,
			Labels: map[string]string{"a": "b"}, Annotations: map[string]string{"kubectl.kubernetes.io/last-applied-configuration": "{}", rulesBytesAnnotation: "1"},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl"}}, Finalizers: []string{"x", FinalizerFor("podjanitor", "podjanitor"), "y"},
			OwnerReferences: []metav1.OwnerReference{{Kind: "Application"}}},
		Spec:   v1alpha1.PodLifetimePolicySpec{Rules: []v1alpha1.PodLifetimeRule{{Name: "r", Clock: "created", After: "1h"}}},
		Status: v1alpha1.PodLifetimePolicyStatus{ObservedGeneration: 2, PodsWithDeadline: 4},
	}
	size := policy.TenantRulesSize(RuleSpecs(p))
	obj, err := Transform(0)(p.DeepCopy())
	if err != nil {
		t.Fatal(err)
	}
	want := p.DeepCopy()
	want.Labels, want.ManagedFields, want.Finalizers, want.OwnerReferences = nil, nil, []string{FinalizerFor("podjanitor", "podjanitor")}, nil
	want.Annotations = map[string]string{rulesBytesAnnotation: "74"}
	if diff := cmp.Diff(want, obj); diff != "" {
		t.Errorf("transformed (-want,+got):\n%s", diff)
	}
	foreign := p.DeepCopy()
	foreign.Finalizers = []string{"x"}
	if obj, _ := Transform(0)(foreign); obj.(*v1alpha1.PodLifetimePolicy).Finalizers != nil {
		t.Errorf("a policy with another finalizer only: cached with %v", obj.(*v1alpha1.PodLifetimePolicy).Finalizers)
	}
	if got, dropped := RulesBytes(obj.(*v1alpha1.PodLifetimePolicy)); got != size || size != 74 || dropped {
		t.Errorf("RulesBytes = %d, %v; want %d, false", got, dropped, size)
	}

	big := p.DeepCopy()
	big.Spec.Rules[0].Match.LabelSelector = strings.Repeat("a", 100)
	obj, _ = Transform(100)(big)
	if got, dropped := RulesBytes(obj.(*v1alpha1.PodLifetimePolicy)); !dropped || got != 174 || len(obj.(*v1alpha1.PodLifetimePolicy).Spec.Rules) != 0 {
		t.Errorf("a policy past the bound: RulesBytes = %d, %v, rules %v; want 174, dropped", got, dropped, obj.(*v1alpha1.PodLifetimePolicy).Spec.Rules)
	}
	for _, lease := range [][2]string{{"podjanitor", "podjanitor"}, {"platform", "team-a-podjanitor"}, {"a-namespace-of-sixty-three-characters-aaaaaaaaaaaaaaaaaaaaaaaa", "podjanitor"}} {
		f := FinalizerFor(lease[0], lease[1])
		if errs := validation.IsQualifiedName(f); len(errs) > 0 || !strings.HasPrefix(f, FinalizerPrefix+".") {
			t.Errorf("FinalizerFor(%q, %q) = %q: %v", lease[0], lease[1], f, errs)
		}
	}
	if a, b := FinalizerFor("podjanitor", "live"), FinalizerFor("podjanitor", "canary"); a == b {
		t.Errorf("two Leases, one finalizer %q", a) // a namespace has no dot: namespace.name is one Lease's
	}
	if tomb, _ := Transform(0)("tombstone"); tomb != "tombstone" {
		t.Error("a tombstone is changed")
	}
}
