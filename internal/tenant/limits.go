package tenant

import "fmt"

// Ready condition reasons of the policies past a namespace's Limits.
const (
	TooManyPolicies = "TooManyPolicies"
	TooManyRules    = "TooManyRules"
	TooLarge        = "TooLarge"
)

// Limits bound what the usable policies of one namespace hold: how many
// policies, rules in all and bytes of rules in all (0: no bound). They keep
// one namespace's policies from slowing every decision of its pods and from
// holding the controller's memory.
type Limits struct {
	Policies, Rules, Bytes int
}

// Message says why a policy refused with reason is not used.
func (l Limits) Message(reason string) string {
	switch reason {
	case TooManyPolicies:
		return fmt.Sprintf("the namespace's policies before it by name already number %d, the most podjanitor uses in one namespace (--tenant-max-policies-per-namespace)", l.Policies)
	case TooManyRules:
		return fmt.Sprintf("with its rules, the rules of the namespace's policies used before it by name would pass %d, the most podjanitor uses in one namespace (--tenant-max-rules-per-namespace)", l.Rules)
	case TooLarge:
		return fmt.Sprintf("with its rules, the namespace's policies used before it by name would hold more than %d bytes, the most podjanitor keeps for one namespace (--tenant-max-bytes-per-namespace)", l.Bytes)
	}
	return reason
}

// Candidate is a policy of the namespace that could be used: its name, its
// rule count and the bytes of its rules (policy.TenantRulesSize).
type Candidate struct {
	Name         string
	Rules, Bytes int
}

// Admit says which of a namespace's candidates, in name order (sorted by
// the caller), are used: the first ones within every limit, in name order, so
// the result does not depend on the order they were written in. A policy
// past a limit is refused with its reason; those after it may still fit
// the rule and byte limits, never the policy limit. reasons[i] is "" for a
// used candidate.
func (l Limits) Admit(candidates []Candidate) (reasons []string) {
	reasons = make([]string, len(candidates))
	policies, rules, bytes := 0, 0, 0
	for i, c := range candidates {
		switch {
		case l.Policies > 0 && policies+1 > l.Policies:
			reasons[i] = TooManyPolicies
		case l.Rules > 0 && rules+c.Rules > l.Rules:
			reasons[i] = TooManyRules
		case l.Bytes > 0 && bytes+c.Bytes > l.Bytes:
			reasons[i] = TooLarge
		default:
			policies, rules, bytes = policies+1, rules+c.Rules, bytes+c.Bytes
		}
	}
	return reasons
}
