package main

import (
	"slices"
	"testing"
	"time"

	"github.com/podjanitor/podjanitor/internal/tenant"
	"github.com/podjanitor/podjanitor/policy"
)

// TestChartTenantPolicies: the chart honours tenant policies by default,
// its restriction values reach the flags, tenantPolicies.enabled=false turns
// them off, and the schema refuses values the flags would.
func TestChartTenantPolicies(t *testing.T) {
	r := renderChart(t)
	o := checkDeployment(t, one(t, "Deployment", r.deployments), r.policyConfigMap())
	if !o.tenants.enabled || len(o.tenants.restrictions.ForbiddenClocks) > 0 || len(o.tenants.restrictions.ForbiddenActions) > 0 ||
		o.tenants.restrictions.NoRunningPods || o.tenants.restrictions.MinAfter != 0 || o.tenants.restrictions.MaxAfter != 0 || o.tenants.crdCheckInterval != 30*time.Second ||
		len(o.tenants.restrictions.ProtectedNamespaces) > 0 || len(o.tenants.restrictions.ProtectedPriorityClasses) > 0 {
		t.Errorf("default tenant flags %+v, want tenant policies on without restrictions", o.tenants)
	}
	r = renderChart(t, "tenantPolicies.forbiddenClocks={created,crashLooping}", "tenantPolicies.forbiddenActions={evict}",
		"tenantPolicies.runningPods=false", "tenantPolicies.minAfter=1h", "tenantPolicies.maxAfter=7d", "tenantPolicies.crdCheckInterval=5s",
		"tenantPolicies.protectedNamespaces={platform,monitoring}", "tenantPolicies.protectedPriorityClasses={tier-1}")
	o = checkDeployment(t, one(t, "Deployment", r.deployments), r.policyConfigMap())
	got := o.tenants.restrictions
	if !o.tenants.enabled || !slices.Equal(got.ForbiddenClocks, []policy.Clock{policy.ClockCreated, policy.ClockCrashLooping}) ||
		!slices.Equal(got.ForbiddenActions, []policy.Action{policy.ActionEvict}) || !got.NoRunningPods || got.MinAfter != time.Hour || got.MaxAfter != 7*24*time.Hour || o.tenants.crdCheckInterval != 5*time.Second ||
		!slices.Equal(got.ProtectedNamespaces, []string{"platform", "monitoring"}) || !slices.Equal(got.ProtectedPriorityClasses, []string{"tier-1"}) {
		t.Errorf("restrictions %+v (CRD check every %v) did not carry the values", got, o.tenants.crdCheckInterval)
	}
	if want := (tenant.Limits{Policies: 16, Rules: 64, Bytes: 256 << 10}); o.tenants.limits != want || o.redecisionInterval != time.Second {
		t.Errorf("default limits %+v, interval %v; want %+v, 1s", o.tenants.limits, o.redecisionInterval, want)
	}
	r = renderChart(t, "tenantPolicies.maxPoliciesPerNamespace=4", "tenantPolicies.maxRulesPerNamespace=0",
		"tenantPolicies.maxBytesPerNamespace=1Mi", "namespaceRedecisionInterval=250ms")
	o = checkDeployment(t, one(t, "Deployment", r.deployments), r.policyConfigMap())
	if want := (tenant.Limits{Policies: 4, Rules: 0, Bytes: 1 << 20}); o.tenants.limits != want || o.redecisionInterval != 250*time.Millisecond {
		t.Errorf("limits %+v, interval %v; want %+v, 250ms", o.tenants.limits, o.redecisionInterval, want)
	}
	r = renderChart(t, "tenantPolicies.enabled=false")
	if o := checkDeployment(t, one(t, "Deployment", r.deployments), r.policyConfigMap()); o.tenants.enabled {
		t.Error("tenantPolicies.enabled=false still renders --tenant-policies")
	}
	for _, set := range []string{"tenantPolicies.forbiddenClocks={sometime}", "tenantPolicies.forbiddenActions={kill}",
		"tenantPolicies.minAfter=1x", "tenantPolicies.maxAfter=7 days", "tenantPolicies.enabled=yes", "tenantPolicies.minimumAfter=1h", "tenantPolicies.crdCheckInterval=1d",
		"tenantPolicies.protectedNamespaces={Platform}", "tenantPolicies.protectedPriorityClasses={tier_1}",
		"tenantPolicies.maxPoliciesPerNamespace=-1", "tenantPolicies.maxRulesPerNamespace=many", "tenantPolicies.maxBytesPerNamespace=1MB",
		"namespaceRedecisionInterval=1d"} {
		if _, err := helmTemplate(t, set); err == nil {
			t.Errorf("helm template --set %s succeeded, want values.schema.json to refuse it", set)
		}
	}
}
