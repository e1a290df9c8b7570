package policy

import (
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// TenantKind is the kind of the namespaced resource that holds a namespace
// owner's rules (a tenant policy). It is not PolicyKind: the cluster's
// policy file keeps its own kind, and applying it to the API server can never
// make it a tenant policy.
const TenantKind = "PodLifetimePolicy"

// TenantSourcePrefix starts the Decision.Source of a tenant policy's rule:
// "podlifetimepolicy/<name>/rule/<rule>".
const TenantSourcePrefix = "podlifetimepolicy/"

// TenantPolicy is the rules of one tenant policy, for the pods of its own
// namespace only. Build it with NewTenantPolicy.
type TenantPolicy struct {
	Namespace, Name string
	Policy          *Policy
	// protected are the Restrictions' protected namespaces and priority
	// classes it was made under, which Decide holds on its own too.
	protected protection
	// UID and Generation say which object and which generation of its
	// rules Policy holds (Decision.PolicyUID, PolicyGeneration); zero when
	// not known.
	UID        types.UID
	Generation int64
}

// protection is what the cluster admin protects from tenant policies,
// besides kube-system and CriticalPriorityClasses.
type protection struct{ namespaces, classes []string }

// covers says whether pod is out of reach.
func (p protection) covers(pod *corev1.Pod) bool {
	return slices.Contains(p.namespaces, pod.Namespace) || slices.Contains(p.classes, pod.Spec.PriorityClassName)
}

// ProtectedAs is t as if made under the protected namespaces and priority
// classes of r: a start measures by it what a change of them brings
// forward.
func (t *TenantPolicy) ProtectedAs(r Restrictions) *TenantPolicy {
	c := *t
	c.protected = protection{namespaces: r.ProtectedNamespaces, classes: r.ProtectedPriorityClasses}
	return &c
}

// Key is "<namespace>/<name>", as Decision.Policy names it.
func (t *TenantPolicy) Key() string { return t.Namespace + "/" + t.Name }

// Tenants gives the tenant policies of a namespace in the order they are
// tried: by name. The first of them with a rule whose match and clock apply
// decides.
type Tenants interface {
	For(namespace string) []*TenantPolicy
}

// Reasons a tenant policy is not used (TenantError.Reason): the Ready
// condition's reason.
const (
	TenantReasonInvalid   = "InvalidRules"
	TenantReasonForbidden = "ForbiddenByClusterAdmin"
	TenantReasonProtected = "ProtectedNamespace"
)

// TenantError says why a tenant policy is not used.
type TenantError struct {
	Reason  string // one of the TenantReason* constants
	Message string
}

func (e *TenantError) Error() string { return e.Message }

// Restrictions are what the cluster admin forbids tenant policies; a policy
// with a rule that could do what is forbidden is not used at all.
type Restrictions struct {
	// ForbiddenClocks may not be any rule's clock.
	ForbiddenClocks []Clock
	// ForbiddenActions may not be the action of any rule, nor the default
	// action of the pods a rule without one may match (evict for Running
	// pods, delete for the others).
	ForbiddenActions []Action
	// NoRunningPods forbids rules that may match Running pods: their phases
	// (or their clock's) must leave Running out.
	NoRunningPods bool
	// MinAfter is the least after any rule may have.
	MinAfter time.Duration
	// MaxAfter, when not zero, is the most after any rule may have: tenant
	// rules come before the cluster's, so without it a tenant rule could
	// keep pods longer than a cluster rule would.
	MaxAfter time.Duration
	// ProtectedNamespaces are namespaces (exact names) whose pods no tenant
	// policy removes, besides kube-system: a policy in one is not used
	// (TenantReasonProtected).
	ProtectedNamespaces []string
	// ProtectedPriorityClasses are priority classes whose pods no tenant
	// policy removes, besides CriticalPriorityClasses: a rule that includes
	// one is forbidden, and Decide passes their pods by whatever the rules say.
	// Neither list changes what the policy file's rules or a pod's own
	// annotations do.
	ProtectedPriorityClasses []string
}

// NewTenantPolicy validates rules as the policy file's are, and then as a
// tenant policy's: no namespace matchers (its namespace is its scope), no
// critical or protected priority class, nothing the restrictions forbid;
// and never in kube-system or a protected namespace. The error is a
// *TenantError.
func NewTenantPolicy(namespace, name string, rules []Rule, r Restrictions) (*TenantPolicy, error) {
	if namespace == metav1.NamespaceSystem {
		return nil, &TenantError{Reason: TenantReasonProtected,
			Message: fmt.Sprintf("the pods of %s are never removed by a %s", metav1.NamespaceSystem, TenantKind)}
	}
	if slices.Contains(r.ProtectedNamespaces, namespace) {
		return nil, &TenantError{Reason: TenantReasonProtected,
			Message: fmt.Sprintf("the cluster admin protects namespace %s: its pods are never removed by a %s", namespace, TenantKind)}
	}
	for i, rule := range rules {
		label := ruleLabel(i, rule.Name)
		m := rule.Match
		switch {
		case len(m.Namespaces.Include) > 0 || len(m.Namespaces.Exclude) > 0:
			return nil, invalidTenant("%s: match.namespaces: a %s applies to the pods of its own namespace only", label, TenantKind)
		case m.NamespaceSelector != "":
			return nil, invalidTenant("%s: match.namespaceSelector: a %s applies to the pods of its own namespace only", label, TenantKind)
		}
		for j, class := range m.PriorityClassNames.Include {
			if slices.Contains(CriticalPriorityClasses, class) {
				return nil, invalidTenant("%s: match.priorityClassNames.include[%d]: pods of %s are never removed by a %s", label, j, class, TenantKind)
			}
		}
	}
	p, err := NewPolicy(rules...)
	if err != nil {
		return nil, invalidTenant("%v", err)
	}
	for i, rule := range p.Rules {
		if err := r.check(rule); err != nil {
			return nil, &TenantError{Reason: TenantReasonForbidden, Message: fmt.Sprintf("%s: %v", ruleLabel(i, rule.Name), err)}
		}
	}
	return &TenantPolicy{Namespace: namespace, Name: name, Policy: p,
		protected: protection{namespaces: slices.Clone(r.ProtectedNamespaces), classes: slices.Clone(r.ProtectedPriorityClasses)}}, nil
}

func invalidTenant(format string, args ...any) error {
	return &TenantError{Reason: TenantReasonInvalid, Message: fmt.Sprintf(format, args...)}
}

// check says what of rule the restrictions forbid.
func (r Restrictions) check(rule Rule) error {
	if slices.Contains(r.ForbiddenClocks, rule.Clock) {
		return fmt.Errorf("clock: the cluster admin forbids clock %q in a %s", rule.Clock, TenantKind)
	}
	for i, class := range rule.Match.PriorityClassNames.Include {
		if slices.Contains(r.ProtectedPriorityClasses, class) {
			return fmt.Errorf("match.priorityClassNames.include[%d]: the cluster admin protects the pods of priority class %s from every %s", i, class, TenantKind)
		}
	}
	if rule.After < r.MinAfter {
		return fmt.Errorf("after: %s is less than the %s the cluster admin allows at least", FormatDuration(rule.After), FormatDuration(r.MinAfter))
	}
	if r.MaxAfter > 0 && rule.After > r.MaxAfter {
		return fmt.Errorf("after: %s is more than the %s the cluster admin allows at most", FormatDuration(rule.After), FormatDuration(r.MaxAfter))
	}
	if r.MinAfter > 0 && rule.MaxPods > 0 {
		return fmt.Errorf("maxPods: the pods past it go at once, sooner than the %s the cluster admin allows at least", FormatDuration(r.MinAfter))
	}
	if r.MaxAfter > 0 && rule.KeepNewest > 0 {
		return fmt.Errorf("keepNewest: the newest pods have no deadline, longer than the %s the cluster admin allows at most", FormatDuration(r.MaxAfter))
	}
	running := mayMatchPhase(rule, corev1.PodRunning)
	if r.NoRunningPods && running {
		return fmt.Errorf("match.phases: the cluster admin forbids removing Running pods; the rule may match them (list phases without Running, or use the finished or pending clock)")
	}
	for _, action := range ruleActions(rule, running) {
		if slices.Contains(r.ForbiddenActions, action) {
			if rule.Action == "" {
				return fmt.Errorf("action: the cluster admin forbids action %q, the default for the %s pods the rule may match", action, actionPhases(action))
			}
			return fmt.Errorf("action: the cluster admin forbids action %q", action)
		}
	}
	return nil
}

// ruleActions are the actions rule may remove pods with: its own, or the
// defaults of the pods it may match.
func ruleActions(rule Rule, running bool) []Action {
	if rule.Action != "" {
		return []Action{rule.Action}
	}
	var actions []Action
	if running {
		actions = append(actions, ActionEvict)
	}
	for _, phase := range podPhases {
		if phase != corev1.PodRunning && mayMatchPhase(rule, phase) {
			return append(actions, ActionDelete)
		}
	}
	return actions
}

func actionPhases(a Action) string {
	if a == ActionEvict {
		return "Running"
	}
	return "non-Running"
}

// mayMatchPhase reports whether rule may apply to a pod in phase: both its
// phases and its clock's allow it.
func mayMatchPhase(rule Rule, phase corev1.PodPhase) bool {
	if len(rule.Match.Phases) > 0 && !slices.Contains(rule.Match.Phases, phase) {
		return false
	}
	allowed, ok := clockPhases[rule.Clock]
	return !ok || slices.Contains(allowed, phase)
}

// TenantPolicyOf is the namespace and name of the tenant policy that
// Decision.Policy names; ok is false for other decisions.
func TenantPolicyOf(d Decision) (namespace, name string, ok bool) {
	namespace, name, ok = strings.Cut(d.Policy, "/")
	return namespace, name, ok
}

// StaticTenants is a fixed set of tenant policies (plan's, tests'), by namespace.
type StaticTenants map[string][]*TenantPolicy

// NewStaticTenants sorts policies into namespaces, each by name.
func NewStaticTenants(policies ...*TenantPolicy) StaticTenants {
	s := StaticTenants{}
	for _, t := range policies {
		s[t.Namespace] = append(s[t.Namespace], t)
	}
	for _, list := range s {
		slices.SortFunc(list, func(a, b *TenantPolicy) int { return strings.Compare(a.Name, b.Name) })
	}
	return s
}

func (s StaticTenants) For(namespace string) []*TenantPolicy { return s[namespace] }
