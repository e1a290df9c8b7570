package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	core "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/yaml"

	"github.com/podjanitor/podjanitor/internal/apitest"
	"github.com/podjanitor/podjanitor/internal/tenant"
	"github.com/podjanitor/podjanitor/internal/tenantcontroller"
	v1alpha1 "github.com/podjanitor/podjanitor/pkg/apis/podjanitor/v1alpha1"
	pjfake "github.com/podjanitor/podjanitor/pkg/generated/clientset/versioned/fake"
	"github.com/podjanitor/podjanitor/policy"
)

// withTenants makes f's controller honour the tenant policies of a fake
// podjanitor.io clientset whose informer does not run: the tests write its
// cache and do its handler's work themselves (policyCache). It returns that
// clientset and cache.
func (f *fixture) withTenants(l tenant.Limits) (*pjfake.Clientset, policyCache) {
	f.t.Helper()
	pj := pjfake.NewSimpleClientset()
	informer := newTenantInformer(pj, scopeFlags{}, l.Bytes)
	if _, err := f.c.SetTenantPolicies(f.ctx, informer, pj, policy.Restrictions{}, time.Hour); err != nil {
		f.t.Fatal(err)
	}
	tenantsOf(f.c).SetLimits(l)
	return pj, policyCache{f: f, Indexer: informer.GetIndexer()}
}

// policyCache is the cache of a tenant policy informer that does not run.
type policyCache struct {
	f *fixture
	cache.Indexer
}

// set puts p in the cache and marks its namespace for its pass, as the
// informer's handler does.
func (pc policyCache) set(p *v1alpha1.PodLifetimePolicy) {
	pc.f.t.Helper()
	if err := pc.Update(p); err != nil {
		pc.f.t.Fatal(err)
	}
	pc.f.c.enqueueNamespace(p.Namespace)
}

// remove takes p out of the cache and marks its namespace for its pass.
func (pc policyCache) remove(p *v1alpha1.PodLifetimePolicy) {
	pc.f.t.Helper()
	if err := pc.Delete(p); err != nil {
		pc.f.t.Fatal(err)
	}
	pc.f.c.enqueueNamespace(p.Namespace)
}

// redecided waits until the namespaces to decide again have been fed to
// the queue, then handles every queued key and says how many.
func (f *fixture) redecided() int {
	f.t.Helper()
	if err := wait.PollUntilContextTimeout(f.ctx, time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		f.c.redecide.Wake() // after a step of the fake clock
		return f.c.redecide.Idle(), nil
	}); err != nil {
		f.t.Fatal("the namespaces to decide again were never fed")
	}
	n := 0
	for ; f.c.queue.Len() > 0; n++ {
		f.next()
	}
	return n
}

// TestPolicyWritesCoalesce: 1,000 writes of a namespace's policy, each
// followed by a drain of the queue, decide its 10 pods again at most once
// per --namespace-redecision-interval, not once per write, and the last
// write is the one their deadlines follow.
func TestPolicyWritesCoalesce(t *testing.T) {
	var pods []*corev1.Pod
	for i := range 10 {
		pods = append(pods, tenantPod(fmt.Sprintf("pod-%d", i), "team-a", t0.Add(-30*time.Minute), nil))
	}
	f := newFixture(t, Options{RedecisionInterval: time.Second}, pods...)
	_, cached := f.withTenants(tenant.Limits{})
	decided := 0
	for i := range 1000 {
		p := lifetimePolicy("team-a", "max-age", v1alpha1.PodLifetimeRule{Name: "max-age", Clock: "created", After: fmt.Sprintf("%dh", 1+i%2)})
		p.Generation = int64(i + 1)
		cached.set(p)
		decided += f.redecided()
	}
	f.clock.Step(time.Second)
	decided += f.redecided()
	if decided != 2*len(pods) {
		t.Errorf("pods decided %d times in all, want %d (two passes over the namespace: the first write's, then one for the 999 others)", decided, 2*len(pods))
	}
	if n, next := tenantsOf(f.c).Summary("team-a/max-age"); n != len(pods) || !next.Equal(t0.Add(-30*time.Minute+2*time.Hour)) {
		t.Errorf("policy gives %d pods a deadline, the next at %v; want %d at %v (the last write's after: 2h)", n, next, len(pods), t0.Add(90*time.Minute))
	}
	if got := f.c.redecide.Passes(); got != 2 {
		t.Errorf("%d passes over the namespace, want 2", got)
	}
}

// TestDueKeyGoesBeforeNamespaceBacklog: while a namespace of 1,000 pods
// is decided again, a pod of another namespace that comes due is handled
// after at most the keys the queue had room for (one per worker), not
// after the whole namespace.
func TestDueKeyGoesBeforeNamespaceBacklog(t *testing.T) {
	var pods []*corev1.Pod
	for i := range 1000 {
		p := apitest.Pod(fmt.Sprintf("pod-%04d", i), t0.Add(-30*time.Minute), corev1.PodSucceeded, map[string]string{"podjanitor.io/ttl": "1h"})
		p.Namespace = "busy"
		pods = append(pods, p)
	}
	due := apitest.Pod("due", t0.Add(-2*time.Hour), corev1.PodSucceeded, map[string]string{"podjanitor.io/ttl": "1h"})
	due.Namespace = "quiet"
	f := newFixture(t, Options{}, append(pods, due)...)
	f.c.room.Store(2) // two workers
	f.c.enqueueNamespace("busy")
	if err := wait.PollUntilContextTimeout(f.ctx, time.Millisecond, 10*time.Second, true,
		func(context.Context) (bool, error) { return f.c.queue.Len() >= 2, nil }); err != nil {
		t.Fatal("the namespace's pods were never queued")
	}
	f.c.queue.Add(keyOf(due)) // as podStates hands back a key at its deadline
	for handled := 1; ; handled++ {
		f.next()
		if len(f.writes()) > 0 {
			checkActions(t, []core.Action{deleteAction(due)}, f.writes())
			if handled > 3 {
				t.Errorf("the due pod was handled %d keys in, want at most 3 (2 of the namespace's, then it)", handled)
			}
			return
		}
		if handled > 1001 {
			t.Fatal("the due pod was never removed")
		}
	}
}

// TestTenantPolicyLimits: of 17 policies in a namespace, written in
// reverse name order, the 16 first by name are used and decide pods; the
// 17th is not (TooManyPolicies: its Ready condition and the metric say
// so) and removes nothing; once one of the 16 is deleted, it takes its place.
func TestTenantPolicyLimits(t *testing.T) {
	used := tenantPod("used", "team-a", t0.Add(-2*time.Hour), map[string]string{"app": "p00"})
	past := tenantPod("past", "team-a", t0.Add(-2*time.Hour), map[string]string{"app": "p16"})
	f := newFixture(t, Options{}, used, past)
	pj, cached := f.withTenants(tenant.Limits{Policies: 16})
	var policies []*v1alpha1.PodLifetimePolicy
	for i := range 17 {
		name := fmt.Sprintf("p%02d", i)
		p := lifetimePolicy("team-a", name, v1alpha1.PodLifetimeRule{Name: "r", Clock: "created", After: "1h",
			Match: v1alpha1.PodLifetimeMatch{LabelSelector: "app=" + name}})
		if err := pj.Tracker().Add(p); err != nil {
			t.Fatal(err)
		}
		policies = append(policies, p)
	}
	for i := 16; i >= 0; i-- {
		cached.set(policies[i])
	}
	f.redecided() // the namespace's pass takes them, then decides its pods
	var names []string
	for _, p := range tenantsOf(f.c).Store().For("team-a") {
		names = append(names, p.Name)
	}
	if want := []string{"p00", "p01", "p02", "p03", "p04", "p05", "p06", "p07", "p08", "p09", "p10", "p11", "p12", "p13", "p14", "p15"}; !cmp.Equal(want, names) {
		t.Errorf("policies used %v, want %v", names, want)
	}
	seen := tenantPolicy(f.c, "team-a/p16")
	if seen.Err == nil || seen.Err.Reason != tenant.TooManyPolicies {
		t.Fatalf("p16: %+v, want not used, reason %s", seen.Err, tenant.TooManyPolicies)
	}
	status := tenantsOf(f.c).Status(policies[16], seen)
	if c := readyCondition(status); c.Status != metav1.ConditionFalse || c.Reason != tenant.TooManyPolicies || !strings.Contains(c.Message, "16") {
		t.Errorf("p16's Ready condition %+v, want False, %s", c, tenant.TooManyPolicies)
	}
	for _, m := range []struct {
		name, label, value string
		want               float64
	}{
		{"podjanitor_tenant_policies_over_limit", "reason", tenant.TooManyPolicies, 1},
		{"podjanitor_tenant_policies_over_limit", "reason", tenant.TooManyRules, 0},
		{"podjanitor_tenant_policies", "ready", "true", 16},
		{"podjanitor_tenant_policies", "ready", "false", 1},
	} {
		if got := metricValue(f.metrics, m.name, m.label, m.value); got != m.want {
			t.Errorf("%s{%s=%q} = %v, want %v", m.name, m.label, m.value, got, m.want)
		}
	}
	checkActions(t, []core.Action{deleteAction(used)}, f.podActions())

	f.client.ClearActions()
	cached.remove(policies[3])
	f.redecided()
	seen = tenantPolicy(f.c, "team-a/p16")
	if seen.Err != nil {
		t.Errorf("p16 after p03 is deleted: %+v, want used", seen.Err)
	}
	checkActions(t, []core.Action{deleteAction(past)}, f.podActions())
}

func readyCondition(s v1alpha1.PodLifetimePolicyStatus) metav1.Condition {
	for _, c := range s.Conditions {
		if c.Type == v1alpha1.ConditionReady {
			return c
		}
	}
	return metav1.Condition{}
}

func (f *fixture) podActions() []core.Action {
	var out []core.Action
	for _, a := range f.writes() {
		if a.GetResource().Resource == "pods" {
			out = append(out, a)
		}
	}
	return out
}

// TestTenantInformerKeepsLittle: the tenant policy cache holds no
// managedFields, labels or annotations (kubectl's last-applied copy of the
// whole object), and no rules of a policy too large on its own, which is
// then not used (TooLarge).
func TestTenantInformerKeepsLittle(t *testing.T) {
	p := lifetimePolicy("team-a", "cleanup", maxAgeRule)
	p.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubectl", Operation: metav1.ManagedFieldsOperationUpdate}}
	p.Annotations = map[string]string{"kubectl.kubernetes.io/last-applied-configuration": strings.Repeat("x", 4096)}
	p.Labels = map[string]string{"team": "a"}
	big := lifetimePolicy("team-a", "big", v1alpha1.PodLifetimeRule{Name: "r", Clock: "created", After: "1h",
		Match: v1alpha1.PodLifetimeMatch{LabelSelector: selector(0)}})
	big.UID = "uid-big"
	pj := pjfake.NewSimpleClientset(p, big)
	informer := newTenantInformer(pj, scopeFlags{}, 512)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go informer.RunWithContext(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), informer.HasSynced) {
		t.Fatal("tenant policy cache did not sync")
	}
	obj, _, _ := informer.GetIndexer().GetByKey("team-a/cleanup")
	cached := obj.(*v1alpha1.PodLifetimePolicy)
	if len(cached.ManagedFields) > 0 || len(cached.Labels) > 0 || cached.Annotations["kubectl.kubernetes.io/last-applied-configuration"] != "" {
		t.Errorf("cached policy keeps %d managedFields, labels %v, %d annotations", len(cached.ManagedFields), cached.Labels, len(cached.Annotations))
	}
	if diff := cmp.Diff(p.Spec, cached.Spec); diff != "" {
		t.Errorf("cached rules (-want,+got):\n%s", diff)
	}
	obj, _, _ = informer.GetIndexer().GetByKey("team-a/big")
	cachedBig := obj.(*v1alpha1.PodLifetimePolicy)
	if len(cachedBig.Spec.Rules) != 0 {
		t.Errorf("the rules of a policy of more than 512 bytes are cached")
	}

	f := newFixture(t, Options{})
	_, policies := f.withTenants(tenant.Limits{Bytes: 512})
	policies.set(cachedBig)
	policies.set(cached)
	f.redecided()
	seenBig, seenSmall := tenantPolicy(f.c, "team-a/big"), tenantPolicy(f.c, "team-a/cleanup")
	if seenBig.Err == nil || seenBig.Err.Reason != tenant.TooLarge || seenSmall.Err != nil {
		t.Errorf("big: %+v, cleanup: %+v; want big not used (%s), cleanup used", seenBig.Err, seenSmall.Err, tenant.TooLarge)
	}
}

// convertByJSON is how convertTenantPolicy converted before it read the
// typed rules: their JSON through policy.ParseRules.
func convertByJSON(obj *v1alpha1.PodLifetimePolicy, r policy.Restrictions) (*policy.TenantPolicy, error) {
	data, err := json.Marshal(obj.Spec.Rules)
	if err != nil {
		return nil, err
	}
	parsed, err := policy.ParseRules(data)
	if err != nil {
		return nil, &policy.TenantError{Reason: policy.TenantReasonInvalid, Message: err.Error()}
	}
	return policy.NewTenantPolicy(obj.Namespace, obj.Name, parsed.Rules, r)
}

// TestTypedConversionAgreesWithJSON: convertTenantPolicy gives the rules,
// or the error, the JSON path through policy.ParseRules gives, on the
// rule lists of policy's ParseRules tests that the typed resource can hold.
func TestTypedConversionAgreesWithJSON(t *testing.T) {
	many := func(n int) string {
		var b strings.Builder
		b.WriteString("[")
		for i := range n {
			fmt.Fprintf(&b, "{name: r%d, clock: finished, after: 1h},", i)
		}
		return b.String() + "]"
	}
	long := strings.Repeat("a", 254)
	for _, rules := range []string{
		`[{name: a, clock: finished, after: 1h}]`,
		`[{name: a, clock: crashLooping, after: 10m, minRestarts: 3, action: delete, gracePeriodSeconds: 5,
		  match: {labelSelector: "app=web", ownerKinds: {include: [Job]}, priorityClassNames: {exclude: [high]}, phases: [Running], reasons: [Error]}}]`,
		`[]`,
		`[{name: a, clock: finished, after: 3x}]`,
		`[{name: a, clock: finished}]`,
		`[{name: a, clock: finished, after: 1h}, {name: b, clock: created, after: 1d}, {name: a, clock: pending, after: 1h}]`,
		`[{name: a, clock: sometime, after: 1h}]`,
		`[{name: a, clock: finished, after: 1h, gracePeriodSeconds: 0}]`,
		`[{name: a, clock: finished, after: 1h, match: {labelSelector: "a b"}}]`,
		`[{name: a, clock: finished, after: 1h, match: {phases: [Running]}}]`,
		`[{name: a, clock: finished, after: 1h, minRestarts: 2}]`,
		`[{name: a, clock: finished, after: 1h, action: kill}]`,
		`[{clock: finished, after: 1h}]`,
		many(33), many(32),
		`[{name: a, clock: finished, after: "` + strings.Repeat("1h", 33) + `"}]`,
		`[{name: a, clock: finished, after: 1h, match: {reasons: [a, "` + strings.Repeat("é", 257) + `"]}}]`,
		`[{name: a, clock: finished, after: 1h, match: {ownerKinds: {include: [Job], exclude: [` + long + `]}, priorityClassNames: {include: [` + long + `]}}}]`,
		`[{name: ` + long + `, clock: finished, after: 1h, action: "` + strings.Repeat("d", 65) + `"}]`,
		`[{name: a, clock: finished, after: 1h, match: {phases: [Failed, Failed, Failed, Failed, Failed, Failed, Failed, Failed, Failed, Failed, Failed, Failed, Failed, Failed, Failed, Failed, Failed]}}]`,
		`[{name: a, clock: created, after: 1h, match: {priorityClassNames: {include: [system-node-critical]}}}]`,
	} {
		obj := &v1alpha1.PodLifetimePolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "p"}}
		if err := yaml.Unmarshal([]byte(rules), &obj.Spec.Rules); err != nil {
			t.Fatalf("%s: %v", rules, err)
		}
		for _, r := range []policy.Restrictions{{}, {ForbiddenClocks: []policy.Clock{policy.ClockCreated}, MaxAfter: 2 * time.Hour}} {
			want, wantErr := convertByJSON(obj, r)
			got, err := tenantcontroller.Convert(obj, r)
			if fmt.Sprint(wantErr) != fmt.Sprint(err) {
				t.Errorf("%s: error\n %v\nwant\n %v", rules, err, wantErr)
				continue
			}
			if want == nil {
				continue
			}
			if diff := cmp.Diff(want.Policy.Rules, got.Policy.Rules, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("%s: rules (-want,+got):\n%s", rules, diff)
			}
		}
	}
}
