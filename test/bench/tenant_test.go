package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/podjanitor/podjanitor/internal/workload"
	v1alpha1 "github.com/podjanitor/podjanitor/pkg/apis/podjanitor/v1alpha1"
	"github.com/podjanitor/podjanitor/policy"
)

// benchTenantPolicies are tenantPolicySpecs(n) in ns as podjanitor uses
// them: through the loader the API server agrees with, then as tenant
// policies without restrictions.
func benchTenantPolicies(t *testing.T, ns string, n int) policy.StaticTenants {
	t.Helper()
	specs := tenantPolicySpecs(n)
	if len(specs) != n {
		t.Fatalf("tenantPolicySpecs(%d): %d policies", n, len(specs))
	}
	names := map[string]bool{}
	var tps []*policy.TenantPolicy
	for _, s := range specs {
		if names[s.Name] {
			t.Fatalf("two policies named %s", s.Name)
		}
		names[s.Name] = true
		data, err := json.Marshal(s.Spec.Rules)
		if err != nil {
			t.Fatal(err)
		}
		p, err := policy.ParseRules(data)
		if err != nil {
			t.Fatalf("%s: the loader refuses its rules: %v", s.Name, err)
		}
		tp, err := policy.NewTenantPolicy(ns, s.Name, p.Rules, policy.Restrictions{})
		if err != nil {
			t.Fatalf("%s: not usable as a tenant policy: %v", s.Name, err)
		}
		tps = append(tps, tp)
	}
	return policy.NewStaticTenants(tps...)
}

// The bench pods keep the deadline of their annotation, and none would get
// one from the tenant policies without it (idle: bound and Running; steady:
// unbound, Pending); a finished Job's pod with the label is theirs.
func TestTenantPolicySpecsGiveBenchPodsNoDeadline(t *testing.T) {
	const ns = "bench-steady-1m"
	now := time.Now()
	e := &policy.Evaluator{Tenants: benchTenantPolicies(t, ns, 5)}
	expires := now.Add(time.Hour).Truncate(time.Second)

	pending := workload.Pod(ns, "steady-000001", "steady", 1, expires, "")
	running := workload.Pod(ns, "idle-000001", "idle", 1, expires, "bench-node-1")
	running.Status = corev1.PodStatus{Phase: corev1.PodRunning, StartTime: &metav1.Time{Time: now.Add(-time.Hour)}}
	for _, pod := range []*corev1.Pod{pending, running} {
		d, err := e.Decide(pod, &policy.Namespace{}, now)
		if err != nil {
			t.Fatalf("%s: %v", pod.Name, err)
		}
		if !d.Deadline.Equal(expires) || strings.HasPrefix(d.Source, policy.TenantSourcePrefix) {
			t.Errorf("%s (%s): deadline %v from %q, want its annotation's %v", pod.Name, pod.Status.Phase, d.Deadline, d.Source, expires)
		}
		bare := pod.DeepCopy()
		delete(bare.Annotations, workload.AnnotationExpiresAt)
		if d, err := e.Decide(bare, &policy.Namespace{}, now); err != nil || d.HasDeadline() {
			t.Errorf("%s (%s) without its annotation: deadline %v from %q (%v), want none", pod.Name, pod.Status.Phase, d.Deadline, d.Source, err)
		}
	}

	// The rules are live: a finished Job's pod with the label goes an hour
	// after it finished, by the first policy (by name).
	job := pending.DeepCopy()
	delete(job.Annotations, workload.AnnotationExpiresAt)
	job.Labels[tenantNeverLabel] = "bench-tenant-01"
	job.OwnerReferences = []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: "j", UID: "u"}}
	job.Status = corev1.PodStatus{Phase: corev1.PodSucceeded, StartTime: &metav1.Time{Time: now.Add(-2 * time.Hour).Truncate(time.Second)}}
	d, err := e.Decide(job, &policy.Namespace{}, now)
	if err != nil || !d.HasDeadline() || d.Policy != ns+"/bench-tenant-01" {
		t.Errorf("a finished Job's pod with %s=bench-tenant-01: deadline %v by %q (%v), want one by %s/bench-tenant-01", tenantNeverLabel, d.Deadline, d.Policy, err, ns)
	}
}

func TestTenantPolicySpecsNone(t *testing.T) {
	if got := tenantPolicySpecs(0); len(got) != 0 {
		t.Errorf("tenantPolicySpecs(0) = %d policies, want none", len(got))
	}
}

func TestReadyOf(t *testing.T) {
	policyWith := func(generation, observed int64, conds ...metav1.Condition) *v1alpha1.PodLifetimePolicy {
		return &v1alpha1.PodLifetimePolicy{
			ObjectMeta: metav1.ObjectMeta{Generation: generation},
			Status:     v1alpha1.PodLifetimePolicyStatus{ObservedGeneration: observed, Conditions: conds},
		}
	}
	ready := func(s metav1.ConditionStatus, gen int64) metav1.Condition {
		return metav1.Condition{Type: v1alpha1.ConditionReady, Status: s, ObservedGeneration: gen, Reason: "R", Message: "m"}
	}
	for _, tc := range []struct {
		name string
		p    *v1alpha1.PodLifetimePolicy
		want bool
		why  string
	}{
		{"ready", policyWith(2, 2, ready(metav1.ConditionTrue, 2)), true, ""},
		{"no status", policyWith(1, 0), false, "no Ready condition"},
		{"not ready", policyWith(1, 1, ready(metav1.ConditionFalse, 1)), false, "Ready=False R: m"},
		{"old generation", policyWith(2, 1, ready(metav1.ConditionTrue, 1)), false, "generation 1, not 2"},
	} {
		got, why := readyOf(tc.p)
		if got != tc.want || !strings.Contains(why, tc.why) {
			t.Errorf("%s: readyOf = %v, %q; want %v, %q", tc.name, got, why, tc.want, tc.why)
		}
	}
}
