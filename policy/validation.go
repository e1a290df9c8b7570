package policy

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path"
	"regexp"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// policyFile and ruleFile are the file's shape before validation.
type policyFile struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Rules      []json.RawMessage `json:"rules"`
}

type ruleFile struct {
	Name               string  `json:"name"`
	Match              Match   `json:"match"`
	Clock              Clock   `json:"clock"`
	After              *string `json:"after"`
	MinRestarts        *int32  `json:"minRestarts"`
	Action             Action  `json:"action"`
	GracePeriodSeconds *int64  `json:"gracePeriodSeconds"`
	countFile
}

// LoadFile reads and parses a policy file; errors start with the path.
func LoadFile(filename string) (*Policy, error) {
	data, err := os.ReadFile(filename)
	if err != nil {
		return nil, err
	}
	p, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", filename, err)
	}
	return p, nil
}

// Parse parses and validates a policy file. It is strict: unknown or
// duplicate fields, fields in the wrong case and values of the wrong type are
// errors. Errors name the rule and the field:
// `rule "evicted" (rules[0]): after: unknown unit "x"`.
func Parse(data []byte) (*Policy, error) {
	js, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return nil, yamlError(err)
	}
	switch top := strings.TrimSpace(string(js)); {
	case top == "null":
		return nil, fmt.Errorf("empty policy: want apiVersion %q, kind %q and rules", PolicyAPIVersion, PolicyKind)
	case !strings.HasPrefix(top, "{"):
		return nil, errors.New("the policy must be a mapping with apiVersion, kind and rules")
	}
	var file policyFile
	if err := decodeStrict(js, &file); err != nil {
		return nil, err
	}
	switch {
	case file.APIVersion != PolicyAPIVersion:
		return nil, fmt.Errorf("apiVersion: want %q, got %q", PolicyAPIVersion, file.APIVersion)
	case file.Kind != PolicyKind:
		return nil, fmt.Errorf("kind: want %q, got %q", PolicyKind, file.Kind)
	case len(file.Rules) == 0:
		return nil, errors.New("rules: at least one rule is required")
	}
	p := &Policy{seq: nextSeq()}
	for i, raw := range file.Rules {
		rule, err := decodeRule(raw)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", ruleLabel(i, ruleName(raw)), err)
		}
		if err := p.add(rule); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// NewPolicy validates rules as Parse does and builds a Policy from them.
func NewPolicy(rules ...Rule) (*Policy, error) {
	if len(rules) == 0 {
		return nil, errors.New("rules: at least one rule is required")
	}
	p := &Policy{seq: nextSeq()}
	for _, rule := range rules {
		if err := p.add(rule); err != nil {
			return nil, err
		}
	}
	return p, nil
}

func decodeRule(raw json.RawMessage) (Rule, error) {
	var file ruleFile
	if err := decodeStrict(raw, &file); err != nil {
		return Rule{}, err
	}
	rule := Rule{
		Name:               file.Name,
		Match:              file.Match,
		Clock:              file.Clock,
		Action:             file.Action,
		GracePeriodSeconds: file.GracePeriodSeconds,
	}
	if file.After == nil {
		return Rule{}, errors.New(`after: required (use "0s" to remove at once)`)
	}
	after, err := ParseDuration(*file.After)
	if err != nil {
		return Rule{}, fmt.Errorf("after: %w", err)
	}
	rule.After = after
	if file.MinRestarts != nil {
		if file.Clock != ClockCrashLooping {
			return Rule{}, fmt.Errorf("minRestarts: only allowed with clock %q, not %q", ClockCrashLooping, file.Clock)
		}
		rule.MinRestarts = *file.MinRestarts
	}
	if err := setCount(&rule, file.KeepNewest, file.GroupBy, file.MaxPods, file.RemovalNotice); err != nil {
		return Rule{}, err
	}
	return rule, nil
}

// add validates rule as the next rule of p.
func (p *Policy) add(rule Rule) error {
	i := len(p.Rules)
	label := ruleLabel(i, rule.Name)
	if err := validateRule(rule); err != nil {
		return fmt.Errorf("%s: %w", label, err)
	}
	for j, earlier := range p.Rules {
		if earlier.Name == rule.Name {
			return fmt.Errorf("%s: name: duplicate of rules[%d]", label, j)
		}
	}
	selector, err := labels.Parse(rule.Match.LabelSelector)
	if err != nil {
		return fmt.Errorf("%s: match.labelSelector: %w", label, err)
	}
	nsSelector, err := labels.Parse(rule.Match.NamespaceSelector)
	if err != nil {
		return fmt.Errorf("%s: match.namespaceSelector: %w", label, err)
	}
	p.Rules = append(p.Rules, rule)
	p.selectors = append(p.selectors, selector)
	p.nsSelectors = append(p.nsSelectors, nsSelector)
	p.counts = p.counts || rule.counts()
	return nil
}

var ruleNamePattern = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`)

var podPhases = []corev1.PodPhase{corev1.PodPending, corev1.PodRunning, corev1.PodSucceeded, corev1.PodFailed, corev1.PodUnknown}

// clockPhases are the only phases a clock applies to; absent means any.
var clockPhases = map[Clock][]corev1.PodPhase{
	ClockFinished:     {corev1.PodSucceeded, corev1.PodFailed},
	ClockPending:      {corev1.PodPending},
	ClockCrashLooping: {corev1.PodPending, corev1.PodRunning},
}

func validateRule(rule Rule) error {
	switch {
	case rule.Name == "":
		return errors.New("name: required")
	case !ruleNamePattern.MatchString(rule.Name):
		return fmt.Errorf("name: %q must start and end with a letter or digit and contain only letters, digits, '-', '_' and '.'", rule.Name)
	}
	if err := validateMatch(rule.Match); err != nil {
		return err
	}
	if _, ok := clockReasons[rule.Clock]; !ok {
		if rule.Clock == "" {
			return fmt.Errorf("clock: required, one of %s", QuotedClocks())
		}
		return fmt.Errorf("clock: unknown clock %q, want one of %s", rule.Clock, QuotedClocks())
	}
	if allowed, ok := clockPhases[rule.Clock]; ok {
		for i, phase := range rule.Match.Phases {
			if !slices.Contains(allowed, phase) {
				return fmt.Errorf("match.phases[%d]: clock %q never applies to %s pods", i, rule.Clock, phase)
			}
		}
	}
	if rule.After < 0 {
		return fmt.Errorf("after: %s is negative", rule.After)
	}
	if rule.MinRestarts < 0 {
		return fmt.Errorf("minRestarts: %d is negative", rule.MinRestarts)
	}
	if err := validateCount(rule); err != nil {
		return err
	}
	if rule.MinRestarts > 0 && rule.Clock != ClockCrashLooping {
		return fmt.Errorf("minRestarts: only allowed with clock %q, not %q", ClockCrashLooping, rule.Clock)
	}
	switch rule.Action {
	case "", ActionDelete, ActionEvict:
	default:
		return fmt.Errorf("action: unknown action %q, want %q or %q", rule.Action, ActionDelete, ActionEvict)
	}
	if g := rule.GracePeriodSeconds; g != nil {
		switch {
		case *g < 0:
			return fmt.Errorf("gracePeriodSeconds: %d is negative", *g)
		case *g == 0:
			return errors.New("gracePeriodSeconds: 0 would force-delete the pod while its containers may still run; use at least 1, or leave it out for the pod's own grace period")
		}
	}
	return nil
}

func validateMatch(m Match) error {
	for _, err := range []error{
		validateNamespacePatterns("match.namespaces.include", m.Namespaces.Include),
		validateNamespacePatterns("match.namespaces.exclude", m.Namespaces.Exclude),
		validateOwnerKinds("match.ownerKinds.include", m.OwnerKinds.Include),
		validateOwnerKinds("match.ownerKinds.exclude", m.OwnerKinds.Exclude),
		validatePriorityClassNames("match.priorityClassNames.include", m.PriorityClassNames.Include),
		validatePriorityClassNames("match.priorityClassNames.exclude", m.PriorityClassNames.Exclude),
	} {
		if err != nil {
			return err
		}
	}
	for i, phase := range m.Phases {
		if !slices.Contains(podPhases, phase) {
			return fmt.Errorf("match.phases[%d]: unknown phase %q, want one of %s", i, phase, quotedList(podPhases))
		}
	}
	for i, reason := range m.Reasons {
		if reason == "" {
			return fmt.Errorf("match.reasons[%d]: empty reason", i)
		}
	}
	return nil
}

func validateNamespacePatterns(field string, patterns []string) error {
	for i, pattern := range patterns {
		if pattern == "" {
			return fmt.Errorf("%s[%d]: empty namespace", field, i)
		}
		if _, err := path.Match(pattern, ""); err != nil {
			return fmt.Errorf("%s[%d]: bad pattern %q", field, i, pattern)
		}
	}
	return nil
}

func validateOwnerKinds(field string, kinds []string) error {
	for i, kind := range kinds {
		if kind == "" || strings.ContainsAny(kind, " \t\n/") {
			return fmt.Errorf("%s[%d]: %q is not a kind (like %q, or %q for bare pods)", field, i, kind, "ReplicaSet", NoOwner)
		}
	}
	return nil
}

func validatePriorityClassNames(field string, names []string) error {
	for i, name := range names {
		if len(validation.IsDNS1123Subdomain(name)) > 0 {
			return fmt.Errorf("%s[%d]: %q is not a priority class name (lowercase letters, digits, '-' and '.', like %q)", field, i, name, CriticalPriorityClasses[0])
		}
	}
	return nil
}

// Clocks are the clocks a rule may count from, in the order errors list
// them; the CRD's validation (hack/crdgen) lists them from here too.
func Clocks() []Clock { return clockNames() }

func clockNames() []Clock {
	return []Clock{ClockFinished, ClockPending, ClockCrashLooping, ClockCreated}
}

// QuotedClocks are Clocks as errors list them: "finished", "pending", ….
func QuotedClocks() string { return quotedList(clockNames()) }

func quotedList[S ~string](values []S) string {
	quoted := make([]string, len(values))
	for i, v := range values {
		quoted[i] = fmt.Sprintf("%q", v)
	}
	return strings.Join(quoted, ", ")
}

func ruleLabel(index int, name string) string {
	if name == "" {
		return fmt.Sprintf("rules[%d]", index)
	}
	return fmt.Sprintf("rule %q (rules[%d])", name, index)
}

// ruleName is a rule's name as far as it can be read, for error messages.
func ruleName(raw json.RawMessage) string {
	var named struct {
		Name string `json:"name"`
	}
	_ = sigsjson.UnmarshalCaseSensitivePreserveInts(raw, &named)
	return named.Name
}
