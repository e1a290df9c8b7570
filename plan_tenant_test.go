package main

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	core "k8s.io/client-go/testing"

	v1alpha1 "github.com/podjanitor/podjanitor/pkg/apis/podjanitor/v1alpha1"
	pjfake "github.com/podjanitor/podjanitor/pkg/generated/clientset/versioned/fake"
	"github.com/podjanitor/podjanitor/policy"
)

// TestPlanShowsTenantPolicies: plan reads the tenant policies as the daemon
// does (under the restrictions), names the policy and rule that gave each
// deadline, and lists the policies it does not use with the reason.
func TestPlanShowsTenantPolicies(t *testing.T) {
	used := lifetimePolicy("team-a", "cleanup", maxAgeRule)
	refused := lifetimePolicy("team-a", "stuck", v1alpha1.PodLifetimeRule{Name: "stuck", Clock: "pending", After: "1m"})
	refused.UID = "uid-stuck"
	pj := pjfake.NewSimpleClientset(used, refused)
	tenants, listed, err := listTenantPolicies(context.Background(), pj, scopeFlags{}, policy.Restrictions{ForbiddenClocks: []policy.Clock{policy.ClockPending}})
	if err != nil {
		t.Fatal(err)
	}
	pods := []*corev1.Pod{tenantPod("old", "team-a", t0.Add(-2*time.Hour), nil), tenantPod("old", "team-b", t0.Add(-2*time.Hour), nil)}
	r := buildPlan(&policy.Evaluator{Tenants: tenants}, pods, map[string]*policy.Namespace{"team-a": {}, "team-b": {}}, t0)
	r.TenantPolicies = listed
	if len(r.Pods) != 1 || r.Pods[0].Namespace != "team-a" || r.Pods[0].Source != "podlifetimepolicy/cleanup/rule/max-age" || r.Pods[0].Policy != "team-a/cleanup" {
		t.Fatalf("plan entries %+v, want team-a/old by podlifetimepolicy/cleanup/rule/max-age", r.Pods)
	}
	var out bytes.Buffer
	if err := printPlan(&out, r); err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{"podlifetimepolicy/cleanup/rule/max-age", "2 tenant policy(ies) read, 1 used.",
		`not used: team-a/stuck (ForbiddenByClusterAdmin): rule "stuck" (rules[0]): clock: the cluster admin forbids clock "pending"`} {
		if !strings.Contains(out.String(), line) {
			t.Errorf("plan output lacks %q:\n%s", line, out.String())
		}
	}
}

// TestTenantFlags: the restriction flags parse into policy.Restrictions and
// bad values are usage errors.
func TestTenantFlags(t *testing.T) {
	o, err := parseFlags(daemonCommand, []string{"--tenant-policies", "--tenant-forbidden-clocks=created, crashLooping",
		"--tenant-forbidden-actions=evict", "--tenant-running-pods=false", "--tenant-min-after=1d", "--tenant-max-after=1w",
		"--tenant-protected-namespaces=platform, monitoring", "--tenant-protected-priority-classes=tier-1"})
	if err != nil {
		t.Fatal(err)
	}
	r := o.tenants.restrictions
	if !o.tenants.enabled || len(r.ForbiddenClocks) != 2 || r.ForbiddenClocks[1] != policy.ClockCrashLooping ||
		len(r.ForbiddenActions) != 1 || !r.NoRunningPods || r.MinAfter != 24*time.Hour || r.MaxAfter != 7*24*time.Hour ||
		!slices.Equal(r.ProtectedNamespaces, []string{"platform", "monitoring"}) || !slices.Equal(r.ProtectedPriorityClasses, []string{"tier-1"}) {
		t.Errorf("tenant flags %+v", o.tenants)
	}
	if o, err := parseFlags(daemonCommand, nil); err != nil || o.tenants.enabled {
		t.Errorf("by default tenant policies are honoured (%v, %v), want off", o.tenants.enabled, err)
	}
	for _, bad := range [][]string{{"--tenant-forbidden-clocks=sometime"}, {"--tenant-forbidden-actions=kill"}, {"--tenant-min-after=1x"},
		{"--tenant-max-after=1x"}, {"--tenant-min-after=2d", "--tenant-max-after=1d"}, {"--tenant-crd-check-interval=500ms"}, {"--tenant-crd-check-interval=0s"},
		{"--tenant-protected-namespaces=Platform"}, {"--tenant-protected-namespaces=ok,a_b"}, {"--tenant-protected-priority-classes=Tier 1"}} {
		var usage usageError
		if _, err := parseFlags(daemonCommand, bad); err == nil || !errors.As(err, &usage) {
			t.Errorf("%q: %v, want a usage error", bad, err)
		}
	}
}

// TestTenantPoliciesWithoutListRightFailFast: --tenant-policies without the
// right to list the resource is an error at start-up, not a controller that
// waits for ever for a cache that cannot sync. (Without the CRD it runs
// without them: TestTenantPoliciesWaitForTheirCRD.)
func TestTenantPoliciesWithoutListRightFailFast(t *testing.T) {
	pj := pjfake.NewSimpleClientset()
	forbidden := apierrors.NewForbidden(v1alpha1.Resource("podlifetimepolicies"), "", errors.New("RBAC"))
	pj.PrependReactor("list", "podlifetimepolicies", func(core.Action) (bool, runtime.Object, error) { return true, nil, forbidden })
	o := &flagValues{tenants: tenantFlags{enabled: true, crdCheckInterval: time.Second}}
	if _, err := startTenantPolicies(context.Background(), nil, &clients{podjanitor: pj}, o); err == nil || !strings.Contains(err.Error(), "--tenant-policies") {
		t.Errorf("startTenantPolicies = %v, want an error about --tenant-policies", err)
	}
}
