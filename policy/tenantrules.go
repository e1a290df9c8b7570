package policy

import (
	"fmt"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	utilptr "k8s.io/utils/ptr"
)

// TenantRuleSpec is a PodLifetimePolicy's rule as its typed resource holds
// it (podjanitor.io/v1alpha1 PodLifetimeRule), for ParseTenantRules.
type TenantRuleSpec struct {
	Name               string
	LabelSelector      string
	OwnerKinds         IncludeExclude
	PriorityClassNames IncludeExclude
	Phases             []corev1.PodPhase
	Reasons            []string
	Clock              string
	After              string
	MinRestarts        *int32
	Action             string
	GracePeriodSeconds *int64
	KeepNewest         *int32
	GroupBy            *string
	MaxPods            *int32
	RemovalNotice      *string
}

// ParseTenantRules is ParseRules on rules already decoded: the same checks,
// in the same order, with the same errors, without encoding them first. The
// rules' strings and lists are shared, not copied.
func ParseTenantRules(rules []TenantRuleSpec) (*Policy, error) {
	if len(rules) == 0 {
		return nil, listError("at least one rule is required")
	}
	if err := checkTenantBounds(rules); err != nil {
		return nil, err
	}
	p := &Policy{seq: nextSeq()}
	for i, spec := range rules {
		rule, err := spec.rule()
		if err == nil {
			err = p.checkTenantRule(rule)
		}
		if err != nil {
			return nil, ruleError(i, spec.Name, err)
		}
		selector, _ := labels.Parse(rule.Match.LabelSelector) // checked
		p.Rules = append(p.Rules, rule)
		p.selectors = append(p.selectors, selector)
		p.nsSelectors = append(p.nsSelectors, labels.Everything())
		p.counts = p.counts || rule.counts()
	}
	return p, nil
}

// rule is decodeRule's Rule of s.
func (s TenantRuleSpec) rule() (Rule, error) {
	rule := Rule{
		Name: s.Name,
		Match: Match{LabelSelector: s.LabelSelector, PriorityClassNames: s.PriorityClassNames, OwnerKinds: s.OwnerKinds,
			Phases: s.Phases, Reasons: s.Reasons},
		Clock:              Clock(s.Clock),
		Action:             Action(s.Action),
		GracePeriodSeconds: s.GracePeriodSeconds,
	}
	after, err := ParseDuration(s.After)
	if err != nil {
		return Rule{}, fmt.Errorf("after: %w", err)
	}
	rule.After = after
	if s.MinRestarts != nil {
		if rule.Clock != ClockCrashLooping {
			return Rule{}, fmt.Errorf("minRestarts: only allowed with clock %q, not %q", ClockCrashLooping, s.Clock)
		}
		rule.MinRestarts = *s.MinRestarts
	}
	if err := setCount(&rule, s.KeepNewest, s.GroupBy, s.MaxPods, s.RemovalNotice); err != nil {
		return Rule{}, err
	}
	return rule, nil
}

// checkTenantBounds is checkBounds on typed rules: the same bounds, visited
// in the same order (a rule's fields as their JSON names sort; empty ones,
// which the resource omits, have nothing to check).
func checkTenantBounds(rules []TenantRuleSpec) *RulesError {
	if len(rules) > TenantMaxItems["rules"] {
		return boundsError("rules", fmt.Sprintf("at most %d items", TenantMaxItems["rules"]))
	}
	str := func(path, pattern, v string) *RulesError {
		if max, ok := TenantMaxLength[pattern]; ok && utf8.RuneCountInString(v) > max {
			return boundsError(path, fmt.Sprintf("at most %d characters", max))
		}
		return nil
	}
	list := func(path, pattern string, v []string) *RulesError {
		if max, ok := TenantMaxItems[pattern]; ok && len(v) > max {
			return boundsError(path, fmt.Sprintf("at most %d items", max))
		}
		for i, item := range v {
			if err := str(fmt.Sprintf("%s[%d]", path, i), pattern+"[]", item); err != nil {
				return err
			}
		}
		return nil
	}
	for i, r := range rules {
		at := fmt.Sprintf("rules[%d]", i)
		phases := make([]string, len(r.Phases))
		for j, ph := range r.Phases {
			phases[j] = string(ph)
		}
		for _, err := range []func() *RulesError{
			func() *RulesError { return str(at+".action", "rules[].action", r.Action) },
			func() *RulesError { return str(at+".after", "rules[].after", r.After) },
			func() *RulesError { return str(at+".clock", "rules[].clock", r.Clock) },
			func() *RulesError { return str(at+".groupBy", "rules[].groupBy", utilptr.Deref(r.GroupBy, "")) },
			func() *RulesError {
				return str(at+".match.labelSelector", "rules[].match.labelSelector", r.LabelSelector)
			},
			func() *RulesError {
				return list(at+".match.ownerKinds.exclude", "rules[].match.ownerKinds.exclude", r.OwnerKinds.Exclude)
			},
			func() *RulesError {
				return list(at+".match.ownerKinds.include", "rules[].match.ownerKinds.include", r.OwnerKinds.Include)
			},
			func() *RulesError { return list(at+".match.phases", "rules[].match.phases", phases) },
			func() *RulesError {
				return list(at+".match.priorityClassNames.exclude", "rules[].match.priorityClassNames.exclude", r.PriorityClassNames.Exclude)
			},
			func() *RulesError {
				return list(at+".match.priorityClassNames.include", "rules[].match.priorityClassNames.include", r.PriorityClassNames.Include)
			},
			func() *RulesError { return list(at+".match.reasons", "rules[].match.reasons", r.Reasons) },
			func() *RulesError { return str(at+".name", "rules[].name", r.Name) },
			func() *RulesError {
				return str(at+".removalNotice", "rules[].removalNotice", utilptr.Deref(r.RemovalNotice, ""))
			},
		} {
			if err := err(); err != nil {
				return err
			}
		}
	}
	return nil
}

// TenantRulesSize is what rules hold in memory, counted as the bytes of
// their strings (names, selectors, kinds, classes, phases, reasons, clock,
// after, action) plus 64 per rule and 16 per list item: the measure of
// --tenant-max-bytes-per-namespace.
func TenantRulesSize(rules []TenantRuleSpec) int {
	n := 0
	strs := func(v []string) {
		for _, s := range v {
			n += 16 + len(s)
		}
	}
	for _, r := range rules {
		n += 64 + len(r.Name) + len(r.LabelSelector) + len(r.Clock) + len(r.After) + len(r.Action) + len(utilptr.Deref(r.GroupBy, "")) + len(utilptr.Deref(r.RemovalNotice, ""))
		strs(r.OwnerKinds.Include)
		strs(r.OwnerKinds.Exclude)
		strs(r.PriorityClassNames.Include)
		strs(r.PriorityClassNames.Exclude)
		strs(r.Reasons)
		for _, ph := range r.Phases {
			n += 16 + len(ph)
		}
	}
	return n
}
