package policy

import (
	"path"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// match is the first rule of p whose match and clock apply to pod, and
// when its clock started.
func (p *Policy) match(pod *corev1.Pod, ns *Namespace) (i int, start time.Time, ok bool) {
	for i := range p.Rules {
		rule := &p.Rules[i]
		if !rule.matches(pod, ns, p.selector(i), p.nsSelector(i)) {
			continue
		}
		if start, ok := rule.clockStart(pod); ok {
			return i, start, true
		}
	}
	return 0, time.Time{}, false
}

// decision is the decision of rule i of p for pod, whose clock started at
// start.
func (p *Policy) decision(i int, start time.Time, pod *corev1.Pod, now time.Time) Decision {
	rule := &p.Rules[i]
	var skewed bool
	if rule.Clock != ClockCreated {
		start, skewed = fromNode(pod, start, now)
	}
	action := rule.Action
	if action == "" {
		action = DefaultAction(pod)
	}
	return Decision{
		Deadline:           start.Add(rule.After),
		Action:             action,
		Source:             "rule/" + rule.Name,
		Reason:             clockReasons[rule.Clock],
		Rule:               rule.Name,
		GracePeriodSeconds: gracePeriod(rule.GracePeriodSeconds),
		ClockSkew:          skewed,
		RemovalNotice:      rule.RemovalNotice,
	}
}

// ruleOf is the rule that decides pod by the rules, its own annotations
// aside: the first whose match and clock apply, in the namespace's tenant
// policies (by name) and then in the policy file. kube-system, the
// critical priority classes and what a tenant policy was made to protect
// are out of the tenant policies' reach whatever their rules say.
func (e *Evaluator) ruleOf(pod *corev1.Pod, ns *Namespace) (ruleRef, bool) {
	if e.Tenants != nil && pod.Namespace != metav1.NamespaceSystem && !slices.Contains(CriticalPriorityClasses, pod.Spec.PriorityClassName) {
		for _, t := range e.Tenants.For(pod.Namespace) {
			if t == nil || t.Policy == nil || t.Namespace != pod.Namespace || t.protected.covers(pod) {
				continue
			}
			if i, start, ok := t.Policy.match(pod, ns); ok {
				return ruleRef{t: t, p: t.Policy, i: i, start: start}, true
			}
		}
	}
	if e.Policy != nil {
		if i, start, ok := e.Policy.match(pod, ns); ok {
			return ruleRef{p: e.Policy, i: i, start: start}, true
		}
	}
	return ruleRef{}, false
}

// decideByRules is the decision of the rule that decides pod (ruleOf);
// the zero Decision when none does.
func (e *Evaluator) decideByRules(pod *corev1.Pod, ns *Namespace, now time.Time) Decision {
	ref, ok := e.ruleOf(pod, ns)
	if !ok {
		return Decision{}
	}
	d := ref.p.decision(ref.i, ref.start, pod, now)
	if t := ref.t; t != nil {
		d.Policy, d.PolicyUID, d.PolicyGeneration = t.Key(), t.UID, t.Generation
		d.Source = TenantSourcePrefix + t.Name + "/" + d.Source
	}
	if ref.rule().counts() {
		e.count(&d, ref, pod, ns, pod.Namespace+"/"+pod.Name)
	}
	return d
}

// gracePeriod passes a rule's grace period on only when it is at least one
// second: 0 would force-delete the pod while its containers may still run.
// Validation refuses such rules; a Policy built without it gets the pod's own
// grace period (nil) instead.
func gracePeriod(seconds *int64) *int64 {
	if seconds == nil || *seconds < 1 {
		return nil
	}
	return seconds
}

// selector and nsSelector are rule i's parsed label and namespace selectors.
func (p *Policy) selector(i int) labels.Selector {
	return parsedSelector(p.selectors, i, p.Rules[i].Match.LabelSelector)
}

func (p *Policy) nsSelector(i int) labels.Selector {
	return parsedSelector(p.nsSelectors, i, p.Rules[i].Match.NamespaceSelector)
}

// parsedSelector is parsed[i]; a Policy built without NewPolicy or Parse has
// none, and gets selector parsed here: a bad one matches nothing.
func parsedSelector(parsed []labels.Selector, i int, selector string) labels.Selector {
	if i < len(parsed) {
		return parsed[i]
	}
	s, err := labels.Parse(selector)
	if err != nil {
		return labels.Nothing()
	}
	return s
}

// matches reports whether the rule's match applies to pod in ns; a rule with
// a namespace selector never matches a pod whose namespace is not known.
func (r *Rule) matches(pod *corev1.Pod, ns *Namespace, selector, nsSelector labels.Selector) bool {
	m := &r.Match
	return namespaceMatches(m.Namespaces, pod.Namespace) &&
		(nsSelector.Empty() || ns != nil && nsSelector.Matches(labels.Set(ns.Labels))) &&
		priorityClassMatches(m.PriorityClassNames, pod.Spec.PriorityClassName) &&
		selector.Matches(labels.Set(pod.Labels)) &&
		ownersMatch(m.OwnerKinds, ownerKinds(pod)) &&
		(len(m.Phases) == 0 || slices.Contains(m.Phases, pod.Status.Phase)) &&
		(len(m.Reasons) == 0 || containsAny(m.Reasons, podReasons(pod)))
}

// clockStart is when the rule's clock started for pod; ok is false when the
// clock does not apply (a finished clock on a running pod).
func (r *Rule) clockStart(pod *corev1.Pod) (start time.Time, ok bool) {
	switch r.Clock {
	case ClockFinished:
		return FinishTime(pod)
	case ClockPending:
		return pendingSince(pod)
	case ClockCrashLooping:
		return crashLoopingSince(pod, r.MinRestarts)
	case ClockCreated:
		return createdAt(pod)
	}
	return time.Time{}, false
}

// namespaceMatches applies include/exclude patterns; kube-system only matches
// when Include names it exactly.
func namespaceMatches(namespaces IncludeExclude, namespace string) bool {
	if namespace == metav1.NamespaceSystem && !slices.Contains(namespaces.Include, namespace) {
		return false
	}
	if matchesAnyPattern(namespaces.Exclude, namespace) {
		return false
	}
	return len(namespaces.Include) == 0 || matchesAnyPattern(namespaces.Include, namespace)
}

// CriticalPriorityClasses are the built-in priority classes of pods a cluster
// cannot do without (kube-dns, CNI and CSI node agents, ...). A rule matches
// their pods only when its priorityClassNames.include names the class exactly.
var CriticalPriorityClasses = []string{"system-cluster-critical", "system-node-critical"}

// priorityClassMatches applies include/exclude names; the critical classes
// only match when Include names them exactly.
func priorityClassMatches(names IncludeExclude, class string) bool {
	if slices.Contains(CriticalPriorityClasses, class) && !slices.Contains(names.Include, class) {
		return false
	}
	if slices.Contains(names.Exclude, class) {
		return false
	}
	return len(names.Include) == 0 || slices.Contains(names.Include, class)
}

func matchesAnyPattern(patterns []string, name string) bool {
	for _, pattern := range patterns {
		if ok, _ := path.Match(pattern, name); ok {
			return true
		}
	}
	return false
}

// ownersMatch includes a pod if any owner kind is included and excludes it if
// any is excluded.
func ownersMatch(owners IncludeExclude, kinds []string) bool {
	if containsAny(owners.Exclude, kinds) {
		return false
	}
	return len(owners.Include) == 0 || containsAny(owners.Include, kinds)
}

func containsAny(set, values []string) bool {
	for _, v := range values {
		if slices.Contains(set, v) {
			return true
		}
	}
	return false
}
