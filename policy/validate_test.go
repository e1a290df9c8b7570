package policy

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

// TestParseRulesAgreesWithParse: a rule list without namespace matchers gives
// ParseRules the error Parse gives the same rules in a policy file.
func TestParseRulesAgreesWithParse(t *testing.T) {
	for _, tc := range []struct {
		rules      string
		field, msg string // of the *RulesError; "" when the rules are valid
		notInAFile bool   // a policy file accepts these rules
	}{
		{rules: `[{name: a, clock: finished, after: 1h}]`},
		{rules: `[{name: a, clock: crashLooping, after: 10m, minRestarts: 3, action: delete, gracePeriodSeconds: 5,
		  match: {labelSelector: "app=web", ownerKinds: {include: [Job]}, priorityClassNames: {exclude: [high]}, phases: [Running], reasons: [Error]}}]`},
		{rules: `[]`, field: "rules", msg: "at least one rule is required"},
		{rules: `[{name: a, clock: finished, after: 3x}]`, field: "rules[0].after", msg: `unknown unit "x"`},
		{rules: `[{name: a, clock: finished}]`, field: "rules[0].after", msg: `required (use "0s" to remove at once)`},
		{rules: `[{name: a, clock: finished, after: 1h}, {name: b, clock: created, after: 1d}, {name: a, clock: pending, after: 1h}]`,
			field: "rules[2].name", msg: "duplicate of rules[0]"},
		{rules: `[{name: a, clock: sometime, after: 1h}]`, field: "rules[0].clock",
			msg: `unknown clock "sometime", want one of "finished", "pending", "crashLooping", "created"`},
		{rules: `[{name: a, clock: finished, after: 1h, gracePeriodSeconds: 0}]`, field: "rules[0].gracePeriodSeconds",
			msg: "0 would force-delete the pod while its containers may still run; use at least 1, or leave it out for the pod's own grace period"},
		{rules: `[{name: a, clock: finished, after: 1h, match: {labelSelector: "a b"}}]`, field: "rules[0].match.labelSelector"},
		{rules: `[{name: a, clock: finished, after: 1h, match: {phases: [Running]}}]`, field: "rules[0].match.phases[0]",
			msg: `clock "finished" never applies to Running pods`},
		{rules: `[{name: a, clock: finished, after: 1h, match: {namespaces: {include: [x]}}}]`, field: "rules[0]",
			msg: `unknown field "match.namespaces"`, notInAFile: true},
		{rules: `[{name: a, clock: finished, after: 1h, match: {namespaceSelector: "a=b"}}]`, field: "rules[0]",
			msg: `unknown field "match.namespaceSelector"`, notInAFile: true},
		{rules: `[{name: a, clock: finished, after: 1h, extra: 1}]`, field: "rules[0]", msg: `unknown field "extra"`},
		{rules: `[{name: a, clock: finished, after: 1h, match: {phases: Running}}]`, field: "rules[0].match.phases", msg: "want a list, got string"},
		// The resource's bounds (the CRD's maxItems and maxLength); a file has none.
		{rules: manyRules(33), field: "rules", msg: "at most 32 items", notInAFile: true},
		{rules: manyRules(32)},
		{rules: `[{name: a, clock: finished, after: "` + strings.Repeat("1h", 33) + `"}]`, field: "rules[0].after", msg: "at most 64 characters", notInAFile: true},
		{rules: `[{name: a, clock: finished, after: 1h, match: {reasons: [a, "` + strings.Repeat("é", 257) + `"]}}]`,
			field: "rules[0].match.reasons[1]", msg: "at most 256 characters", notInAFile: true},
	} {
		p, err := ParseRules([]byte(tc.rules))
		_, fileErr := Parse([]byte("apiVersion: podjanitor.io/v1alpha1\nkind: PodJanitorPolicy\nrules: " + tc.rules))
		if tc.field == "" {
			if err != nil || fileErr != nil {
				t.Errorf("%s: ParseRules: %v, Parse: %v; want both to accept it", tc.rules, err, fileErr)
			} else if len(p.Rules) == 0 || p.Rules[0].After <= 0 && p.Rules[0].Clock != ClockFinished {
				t.Errorf("%s: parsed %+v", tc.rules, p.Rules)
			}
			continue
		}
		var rerr *RulesError
		if !errors.As(err, &rerr) {
			t.Errorf("%s: ParseRules: %v, want a *RulesError", tc.rules, err)
			continue
		}
		if rerr.Field != tc.field || tc.msg != "" && rerr.Message != tc.msg {
			t.Errorf("%s: field %q, message %q; want %q, %q", tc.rules, rerr.Field, rerr.Message, tc.field, tc.msg)
		}
		switch {
		case tc.notInAFile && fileErr != nil:
			t.Errorf("%s: a policy file refuses it: %v", tc.rules, fileErr)
		case !tc.notInAFile && (fileErr == nil || fileErr.Error() != err.Error()):
			t.Errorf("%s:\n ParseRules: %v\n Parse:      %v", tc.rules, err, fileErr)
		}
	}
}

// TestParseRulesDecides: the rules ParseRules builds decide like a file's.
func TestParseRulesDecides(t *testing.T) {
	p, err := ParseRules([]byte(`[{name: web, clock: created, after: 2h, match: {labelSelector: "app=web"}}]`))
	if err != nil {
		t.Fatal(err)
	}
	now := created.Add(time.Hour)
	if d := (&Evaluator{Policy: p}).decideByRules(newPod(labelled("app", "web")), nil, now); d.Rule != "web" || !d.Deadline.Equal(created.Add(2*time.Hour)) {
		t.Errorf("web pod: %+v", d)
	}
	if d := (&Evaluator{Policy: p}).decideByRules(newPod(labelled("app", "db")), nil, now); d.Rule != "" {
		t.Errorf("db pod matched: %+v", d)
	}
}

// TestParseRulesDocsExample: the PodLifetimePolicy of docs/policy.md is valid.
func TestParseRulesDocsExample(t *testing.T) {
	data, err := os.ReadFile("../docs/policy.md")
	if err != nil {
		t.Fatal(err)
	}
	found := 0
	for _, block := range strings.Split(string(data), "```yaml\n")[1:] {
		block, _, _ = strings.Cut(block, "```")
		if !strings.Contains(block, "kind: PodLifetimePolicy") {
			continue
		}
		found++
		var obj struct {
			Spec struct {
				Rules json.RawMessage `json:"rules"`
			} `json:"spec"`
		}
		if err := yaml.Unmarshal([]byte(block), &obj); err != nil {
			t.Fatal(err)
		}
		if _, err := ParseRules(obj.Spec.Rules); err != nil {
			t.Errorf("docs/policy.md: the PodLifetimePolicy example: %v", err)
		}
	}
	if found == 0 {
		t.Error("docs/policy.md has no PodLifetimePolicy example")
	}
}

// manyRules is a list of n valid rules.
func manyRules(n int) string {
	var b strings.Builder
	b.WriteString("[")
	for i := range n {
		fmt.Fprintf(&b, "{name: r%d, clock: finished, after: 1h},", i)
	}
	return b.String() + "]"
}
