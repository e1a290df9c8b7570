package policy

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
)

func tenant(t *testing.T, namespace, name string, rules ...Rule) *TenantPolicy {
	t.Helper()
	p, err := NewTenantPolicy(namespace, name, rules, Restrictions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func tenantDecision(policy string, rule string, clock Clock, action Action, deadline time.Time) Decision {
	d := ruleDecision(rule, clock, action, deadline)
	_, name, _ := strings.Cut(policy, "/")
	d.Source = TenantSourcePrefix + name + "/rule/" + rule
	d.Policy = policy
	return d
}

// TestDecideTenantPrecedence proves the order of decision: the pod's
// annotations (keep included) first, then the namespace's tenant policies by
// name (the first policy with a rule that applies), then the policy file's
// rules; and that a tenant policy reaches the pods of its own namespace only.
func TestDecideTenantPrecedence(t *testing.T) {
	at := func(minutes int) time.Time { return created.Add(time.Duration(minutes) * time.Minute) }
	cluster, err := NewPolicy(Rule{Name: "cluster-max-age", Clock: ClockCreated, After: 3 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	tenants := NewStaticTenants(
		// Listed out of order: "a-..." is tried before "b-...".
		tenant(t, "team-a", "b-web", Rule{Name: "web", Match: Match{LabelSelector: "app=web"}, Clock: ClockCreated, After: 2 * time.Hour}),
		tenant(t, "team-a", "a-web", Rule{Name: "web", Match: Match{LabelSelector: "app=web"}, Clock: ClockCreated, After: time.Hour}),
		tenant(t, "team-a", "c-finished", Rule{Name: "done", Clock: ClockFinished, After: 10 * time.Minute}),
	)
	e := &Evaluator{Policy: cluster, Tenants: tenants}
	web := labelled("app", "web")
	tests := []struct {
		name string
		pod  *corev1.Pod
		want Decision
	}{
		{"the pod's ttl beats the tenant's rule", newPod(inNamespace("team-a"), web, annotated("podjanitor.io/ttl", "30m")),
			Decision{Deadline: at(30), Action: ActionDelete, Source: "podjanitor.io/ttl", Reason: ReasonTTL}},
		{"the pod's keep beats the tenant's rule", newPod(inNamespace("team-a"), web, annotated("podjanitor.io/keep", "true")),
			Decision{Kept: true}},
		{"the first policy by name decides", newPod(inNamespace("team-a"), web),
			tenantDecision("team-a/a-web", "web", ClockCreated, ActionDelete, at(60))},
		{"a policy without an applying rule falls through to the next", newPod(inNamespace("team-a"), inPhase(corev1.PodSucceeded)),
			tenantDecision("team-a/c-finished", "done", ClockFinished, ActionDelete, at(10))},
		{"no tenant rule applies: the cluster's rules decide", newPod(inNamespace("team-a")),
			ruleDecision("cluster-max-age", ClockCreated, ActionDelete, at(180))},
		{"another namespace's pods are not the tenant's", newPod(inNamespace("team-b"), web),
			ruleDecision("cluster-max-age", ClockCreated, ActionDelete, at(180))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := e.Decide(tt.pod, anyNamespace, now)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Decide() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

// wrongTenants gives every namespace's policies to every namespace, as a
// broken index would: Decide must still keep each to its own namespace.
type wrongTenants []*TenantPolicy

func (w wrongTenants) For(string) []*TenantPolicy { return w }

// TestDecideTenantCannotRemoveProtected proves that no tenant policy can
// take away a cluster protection: mirror and terminating pods, the pod's and
// the namespace's keep, kube-system, the critical priority classes, the
// namespaces and priority classes the cluster admin protects, and pods of
// other namespaces.
func TestDecideTenantCannotRemoveProtected(t *testing.T) {
	everything := Rule{Name: "everything", Clock: ClockCreated, After: 0}
	// Built without NewTenantPolicy, which refuses these: Decide must hold on its own.
	raw := func(namespace string, rule Rule) *TenantPolicy {
		p, err := NewPolicy(rule)
		if err != nil {
			t.Fatal(err)
		}
		return &TenantPolicy{Namespace: namespace, Name: "all", Policy: p}
	}
	protectedBy := func(p *TenantPolicy, by protection) *TenantPolicy { p.protected = by; return p }
	critical := everything
	critical.Match.PriorityClassNames.Include = []string{"system-node-critical", "system-cluster-critical"}
	systemNS := everything
	systemNS.Match.Namespaces.Include = []string{"kube-system"}
	tests := []struct {
		name    string
		tenants Tenants
		pod     *corev1.Pod
		ns      *Namespace
		want    Decision
	}{
		{"mirror pod", NewStaticTenants(raw("team-a", everything)), newPod(inNamespace("team-a"), mirror()), anyNamespace, Decision{Skipped: SkippedMirrorPod}},
		{"terminating pod", NewStaticTenants(raw("team-a", everything)), newPod(inNamespace("team-a"), terminating()), anyNamespace, Decision{Skipped: SkippedTerminating}},
		{"pod keep", NewStaticTenants(raw("team-a", everything)), newPod(inNamespace("team-a"), annotated("podjanitor.io/keep", "true")), anyNamespace, Decision{Kept: true}},
		{"namespace keep", NewStaticTenants(raw("team-a", everything)), newPod(inNamespace("team-a")),
			namespaceWith(nil, map[string]string{"podjanitor.io/keep": "true"}), Decision{Kept: true}},
		{"unknown namespace", NewStaticTenants(raw("team-a", everything)), newPod(inNamespace("team-a")), nil, Decision{Skipped: SkippedNamespaceUnknown}},
		{"kube-system", NewStaticTenants(raw("kube-system", systemNS)), newPod(inNamespace("kube-system")), anyNamespace, Decision{}},
		{"system-node-critical", NewStaticTenants(raw("team-a", critical)), newPod(inNamespace("team-a"), withPriorityClass("system-node-critical")), anyNamespace, Decision{}},
		{"system-cluster-critical", NewStaticTenants(raw("team-a", critical)), newPod(inNamespace("team-a"), withPriorityClass("system-cluster-critical")), anyNamespace, Decision{}},
		{"another namespace's policy handed over by a broken index", wrongTenants{raw("team-a", everything)}, newPod(inNamespace("team-b")), anyNamespace, Decision{}},
		{"a protected priority class", NewStaticTenants(protectedBy(raw("team-a", everything), protection{classes: []string{"tier-1"}})),
			newPod(inNamespace("team-a"), withPriorityClass("tier-1")), anyNamespace, Decision{}},
		{"a protected namespace", NewStaticTenants(protectedBy(raw("platform", everything), protection{namespaces: []string{"platform"}})),
			newPod(inNamespace("platform")), anyNamespace, Decision{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := &Evaluator{Tenants: tt.tenants}
			got, err := e.Decide(tt.pod, tt.ns, now)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Decide() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

// TestProtectionIsFromTenantPoliciesOnly: the namespaces and priority
// classes the cluster admin protects (Restrictions.ProtectedNamespaces,
// ProtectedPriorityClasses) are out of every tenant policy's reach, and only
// of theirs: the policy file's rules and a pod's own annotations decide them
// as before, and the policy still decides the pods of other classes.
func TestProtectionIsFromTenantPoliciesOnly(t *testing.T) {
	at := func(minutes int) time.Time { return created.Add(time.Duration(minutes) * time.Minute) }
	cluster, err := NewPolicy(Rule{Name: "cluster-max-age", Clock: ClockCreated, After: 3 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	p, err := NewTenantPolicy("team-a", "all", []Rule{{Name: "max-age", Clock: ClockCreated, After: time.Hour}},
		Restrictions{ProtectedNamespaces: []string{"platform"}, ProtectedPriorityClasses: []string{"tier-1"}})
	if err != nil {
		t.Fatal(err)
	}
	e := &Evaluator{Policy: cluster, Tenants: NewStaticTenants(p)}
	tier1 := withPriorityClass("tier-1")
	tests := []struct {
		name string
		pod  *corev1.Pod
		want Decision
	}{
		{"another class: the tenant's rule", newPod(inNamespace("team-a"), withPriorityClass("low")),
			tenantDecision("team-a/all", "max-age", ClockCreated, ActionDelete, at(60))},
		{"the protected class: the policy file's rule", newPod(inNamespace("team-a"), tier1),
			Decision{Deadline: at(180), Action: ActionDelete, Source: "rule/cluster-max-age", Reason: string(ClockCreated), Rule: "cluster-max-age"}},
		{"the protected class: its own ttl", newPod(inNamespace("team-a"), tier1, annotated("podjanitor.io/ttl", "30m")),
			Decision{Deadline: at(30), Action: ActionDelete, Source: "podjanitor.io/ttl", Reason: ReasonTTL}},
		{"the protected namespace: the policy file's rule", newPod(inNamespace("platform")),
			Decision{Deadline: at(180), Action: ActionDelete, Source: "rule/cluster-max-age", Reason: string(ClockCreated), Rule: "cluster-max-age"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := e.Decide(tt.pod, anyNamespace, at(10))
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Decide() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

// TestNewTenantPolicyRefuses proves that a tenant policy is refused, with a
// reason and a message, when its rules reach outside its namespace or at
// protected pods, do not validate, or do what the cluster admin forbids; and
// that what the restrictions allow passes.
func TestNewTenantPolicyRefuses(t *testing.T) {
	maxAge := Rule{Name: "max-age", Clock: ClockCreated, After: time.Hour}
	with := func(r Rule, f func(*Rule)) Rule { f(&r); return r }
	finishedOnly := Rule{Name: "done", Clock: ClockFinished, After: time.Hour}
	pendingEvict := Rule{Name: "stuck", Clock: ClockPending, After: time.Hour, Action: ActionEvict}
	tests := []struct {
		name       string
		namespace  string
		rules      []Rule
		r          Restrictions
		wantReason string
		wantMsg    string
	}{
		{"allowed", "team-a", []Rule{maxAge}, Restrictions{}, "", ""},
		{"kube-system", "kube-system", []Rule{maxAge}, Restrictions{}, TenantReasonProtected, "the pods of kube-system are never removed"},
		{"namespace include", "team-a", []Rule{with(maxAge, func(r *Rule) { r.Match.Namespaces.Include = []string{"team-b"} })}, Restrictions{},
			TenantReasonInvalid, `rule "max-age" (rules[0]): match.namespaces: a PodLifetimePolicy applies to the pods of its own namespace only`},
		{"namespace selector", "team-a", []Rule{with(maxAge, func(r *Rule) { r.Match.NamespaceSelector = "team=b" })}, Restrictions{},
			TenantReasonInvalid, "match.namespaceSelector"},
		{"critical class", "team-a", []Rule{with(maxAge, func(r *Rule) { r.Match.PriorityClassNames.Include = []string{"system-node-critical"} })}, Restrictions{},
			TenantReasonInvalid, "pods of system-node-critical are never removed"},
		{"no rules", "team-a", nil, Restrictions{}, TenantReasonInvalid, "rules: at least one rule is required"},
		{"bad selector", "team-a", []Rule{with(maxAge, func(r *Rule) { r.Match.LabelSelector = "a in (" })}, Restrictions{}, TenantReasonInvalid, "match.labelSelector"},
		{"duplicate names", "team-a", []Rule{maxAge, maxAge}, Restrictions{}, TenantReasonInvalid, "duplicate of rules[0]"},
		{"forbidden clock", "team-a", []Rule{maxAge}, Restrictions{ForbiddenClocks: []Clock{ClockCreated}},
			TenantReasonForbidden, `rule "max-age" (rules[0]): clock: the cluster admin forbids clock "created"`},
		{"other clock allowed", "team-a", []Rule{finishedOnly}, Restrictions{ForbiddenClocks: []Clock{ClockCreated}}, "", ""},
		{"after below minimum", "team-a", []Rule{maxAge}, Restrictions{MinAfter: 2 * time.Hour},
			TenantReasonForbidden, "after: 1h is less than the 2h"},
		{"after at minimum", "team-a", []Rule{maxAge}, Restrictions{MinAfter: time.Hour}, "", ""},
		{"after above maximum", "team-a", []Rule{with(finishedOnly, func(r *Rule) { r.After = 10 * time.Minute }), maxAge}, Restrictions{MaxAfter: 30 * time.Minute},
			TenantReasonForbidden, `rule "max-age" (rules[1]): after: 1h is more than the 30m`},
		{"after at maximum", "team-a", []Rule{maxAge}, Restrictions{MaxAfter: time.Hour}, "", ""},
		{"running pods forbidden: created clock", "team-a", []Rule{maxAge}, Restrictions{NoRunningPods: true},
			TenantReasonForbidden, "forbids removing Running pods"},
		{"running pods forbidden: crashLooping clock", "team-a", []Rule{{Name: "cl", Clock: ClockCrashLooping, After: time.Hour}}, Restrictions{NoRunningPods: true},
			TenantReasonForbidden, "forbids removing Running pods"},
		{"running pods forbidden: created clock with phases", "team-a", []Rule{with(maxAge, func(r *Rule) { r.Match.Phases = []corev1.PodPhase{corev1.PodPending, corev1.PodFailed} })},
			Restrictions{NoRunningPods: true}, "", ""},
		{"running pods forbidden: finished clock", "team-a", []Rule{finishedOnly}, Restrictions{NoRunningPods: true}, "", ""},
		{"evict forbidden: default action of Running pods", "team-a", []Rule{maxAge}, Restrictions{ForbiddenActions: []Action{ActionEvict}},
			TenantReasonForbidden, `action: the cluster admin forbids action "evict", the default for the Running pods`},
		{"evict forbidden: explicit", "team-a", []Rule{pendingEvict}, Restrictions{ForbiddenActions: []Action{ActionEvict}},
			TenantReasonForbidden, `action: the cluster admin forbids action "evict"`},
		{"evict forbidden: finished pods are deleted", "team-a", []Rule{finishedOnly}, Restrictions{ForbiddenActions: []Action{ActionEvict}}, "", ""},
		{"delete forbidden: finished pods", "team-a", []Rule{finishedOnly}, Restrictions{ForbiddenActions: []Action{ActionDelete}},
			TenantReasonForbidden, `forbids action "delete", the default for the non-Running pods`},
		{"second rule forbidden", "team-a", []Rule{finishedOnly, maxAge}, Restrictions{ForbiddenClocks: []Clock{ClockCreated}},
			TenantReasonForbidden, `rule "max-age" (rules[1])`},
		{"protected namespace", "platform", []Rule{finishedOnly}, Restrictions{ProtectedNamespaces: []string{"monitoring", "platform"}},
			TenantReasonProtected, "the cluster admin protects namespace platform"},
		{"other namespace than the protected ones", "team-a", []Rule{finishedOnly}, Restrictions{ProtectedNamespaces: []string{"platform"}}, "", ""},
		{"protected class included", "team-a", []Rule{with(maxAge, func(r *Rule) { r.Match.PriorityClassNames.Include = []string{"low", "tier-1"} })},
			Restrictions{ProtectedPriorityClasses: []string{"tier-1"}}, TenantReasonForbidden,
			`rule "max-age" (rules[0]): match.priorityClassNames.include[1]: the cluster admin protects the pods of priority class tier-1`},
		{"unprotected class included", "team-a", []Rule{with(maxAge, func(r *Rule) { r.Match.PriorityClassNames.Include = []string{"low"} })},
			Restrictions{ProtectedPriorityClasses: []string{"tier-1"}}, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := NewTenantPolicy(tt.namespace, "p", tt.rules, tt.r)
			if tt.wantReason == "" {
				if err != nil {
					t.Fatalf("NewTenantPolicy() = %v, want no error", err)
				}
				if p.Namespace != tt.namespace || p.Name != "p" || len(p.Policy.Rules) != len(tt.rules) {
					t.Errorf("NewTenantPolicy() = %+v", p)
				}
				return
			}
			var te *TenantError
			if !errors.As(err, &te) {
				t.Fatalf("NewTenantPolicy() = %v, want a *TenantError", err)
			}
			if te.Reason != tt.wantReason || !strings.Contains(te.Message, tt.wantMsg) {
				t.Errorf("NewTenantPolicy() = %s: %s, want %s containing %q", te.Reason, te.Message, tt.wantReason, tt.wantMsg)
			}
		})
	}
}
