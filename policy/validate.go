package policy

import (
	"encoding/json"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"

	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"
)

// tenantRuleFile is a PodLifetimePolicy's rule before validation: the policy
// file's rule without namespace matchers (the resource's namespace is its scope).
type tenantRuleFile struct {
	Name               string      `json:"name"`
	Match              tenantMatch `json:"match"`
	Clock              Clock       `json:"clock"`
	After              *string     `json:"after"`
	MinRestarts        *int32      `json:"minRestarts"`
	Action             Action      `json:"action"`
	GracePeriodSeconds *int64      `json:"gracePeriodSeconds"`
	countFile
}

type tenantMatch struct {
	LabelSelector      string            `json:"labelSelector"`
	PriorityClassNames IncludeExclude    `json:"priorityClassNames"`
	OwnerKinds         IncludeExclude    `json:"ownerKinds"`
	Phases             []corev1.PodPhase `json:"phases"`
	Reasons            []string          `json:"reasons"`
}

// TenantMaxItems and TenantMaxLength bound a PodLifetimePolicy, by path in
// its rule list ("rules[]" is a rule): at most this many items in a list,
// characters in a string. The CRD has the same bounds (maxItems, maxLength):
// the API server bounds the cost of its validation rules by them.
var (
	TenantMaxItems = map[string]int{
		"rules":                                    32,
		"rules[].match.ownerKinds.include":         32,
		"rules[].match.ownerKinds.exclude":         32,
		"rules[].match.priorityClassNames.include": 32,
		"rules[].match.priorityClassNames.exclude": 32,
		"rules[].match.phases":                     16,
		"rules[].match.reasons":                    32,
	}
	TenantMaxLength = map[string]int{
		"rules[].name":                               253,
		"rules[].clock":                              64,
		"rules[].after":                              64,
		"rules[].action":                             64,
		"rules[].groupBy":                            330,
		"rules[].removalNotice":                      64,
		"rules[].match.labelSelector":                1024,
		"rules[].match.ownerKinds.include[]":         253,
		"rules[].match.ownerKinds.exclude[]":         253,
		"rules[].match.priorityClassNames.include[]": 253,
		"rules[].match.priorityClassNames.exclude[]": 253,
		"rules[].match.phases[]":                     64,
		"rules[].match.reasons[]":                    256,
	}
)

// checkBounds checks v, the JSON value at path (pattern: the same path with
// "[]" for indexes), against the tenant bounds.
func checkBounds(v any, path, pattern string) *RulesError {
	switch v := v.(type) {
	case map[string]any:
		for _, k := range slices.Sorted(maps.Keys(v)) {
			if err := checkBounds(v[k], path+"."+k, pattern+"."+k); err != nil {
				return err
			}
		}
	case []any:
		if max, ok := TenantMaxItems[pattern]; ok && len(v) > max {
			return boundsError(path, fmt.Sprintf("at most %d items", max))
		}
		for i, item := range v {
			if err := checkBounds(item, fmt.Sprintf("%s[%d]", path, i), pattern+"[]"); err != nil {
				return err
			}
		}
	case string:
		if max, ok := TenantMaxLength[pattern]; ok && utf8.RuneCountInString(v) > max {
			return boundsError(path, fmt.Sprintf("at most %d characters", max))
		}
	}
	return nil
}

func boundsError(path, msg string) *RulesError {
	return &RulesError{Field: path, Message: msg, whole: path + ": " + msg}
}

// RulesError is an error of ParseRules: the field it is about, as a path in
// the rule list ("rules", "rules[2].after", "rules[0].match.phases[1]"),
// and the message for that field. Error is the loader's whole message:
// `rule "evicted" (rules[2]): after: unknown unit "x"`.
type RulesError struct {
	Field   string
	Message string
	whole   string
}

func (e *RulesError) Error() string { return e.whole }

// ParseRules parses and validates the rules of a PodLifetimePolicy (its
// spec.rules, JSON or YAML) with the checks and messages Parse applies to the
// rules of a policy file; namespace matchers (match.namespaces,
// match.namespaceSelector) are unknown fields. Errors are *RulesError. The
// CRD's validation (artifacts/crd) refuses the same rules at the API server.
func ParseRules(data []byte) (*Policy, error) {
	js, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return nil, listError(yamlError(err).Error())
	}
	var raws []json.RawMessage
	if err := decodeStrict(js, &raws); err != nil {
		return nil, listError(err.Error())
	}
	if len(raws) == 0 {
		return nil, listError("at least one rule is required")
	}
	var value any
	if err := json.Unmarshal(js, &value); err != nil {
		return nil, listError(err.Error())
	}
	if err := checkBounds(value, "rules", "rules"); err != nil {
		return nil, err
	}
	p := &Policy{seq: nextSeq()}
	for i, raw := range raws {
		rule, err := decodeTenantRule(raw)
		if err == nil {
			err = p.checkTenantRule(rule)
		}
		if err != nil {
			return nil, ruleError(i, ruleName(raw), err)
		}
		selector, _ := labels.Parse(rule.Match.LabelSelector) // checked
		p.Rules = append(p.Rules, rule)
		p.selectors = append(p.selectors, selector)
		p.nsSelectors = append(p.nsSelectors, labels.Everything())
		p.counts = p.counts || rule.counts()
	}
	return p, nil
}

// decodeTenantRule refuses what a policy file's rule has and a tenant's
// does not, then decodes raw as a policy file's rule.
func decodeTenantRule(raw json.RawMessage) (Rule, error) {
	var file tenantRuleFile
	if err := decodeStrict(raw, &file); err != nil {
		return Rule{}, err
	}
	return decodeRule(raw)
}

// checkTenantRule is add's validation of rule as the next rule of p.
func (p *Policy) checkTenantRule(rule Rule) error {
	if err := validateRule(rule); err != nil {
		return err
	}
	for j, earlier := range p.Rules {
		if earlier.Name == rule.Name {
			return fmt.Errorf("name: duplicate of rules[%d]", j)
		}
	}
	if _, err := labels.Parse(rule.Match.LabelSelector); err != nil {
		return fmt.Errorf("match.labelSelector: %w", err)
	}
	return nil
}

var fieldPathPattern = regexp.MustCompile(`^[A-Za-z]+(\[[0-9]+\])?(\.[A-Za-z]+(\[[0-9]+\])?)*$`)

// ruleError is err of rules[i], named name, as a *RulesError: err's message
// starts with the field when it is about one ("after: ...").
func ruleError(i int, name string, err error) *RulesError {
	label := ruleLabel(i, name)
	e := &RulesError{Field: fmt.Sprintf("rules[%d]", i), Message: err.Error(), whole: label + ": " + err.Error()}
	if field, msg, ok := strings.Cut(err.Error(), ": "); ok && fieldPathPattern.MatchString(field) {
		e.Field += "." + field
		e.Message = msg
	}
	return e
}

func listError(msg string) *RulesError {
	return &RulesError{Field: "rules", Message: msg, whole: "rules: " + msg}
}
