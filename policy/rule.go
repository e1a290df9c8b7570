package policy

import (
	"path"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// decide returns the decision of the first rule whose match and clock apply to pod.
func (p *Policy) decide(pod *corev1.Pod, ns *Namespace, now time.Time) Decision {
	for i := range p.Rules {
		rule := &p.Rules[i]
		if !rule.matches(pod, ns, p.selector(i), p.nsSelector(i)) {
			continue
		}
		start, ok := rule.clockStart(pod)
		if !ok {
			continue
		}
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
		}
	}
	return Decision{}
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
