package policy

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
)

const policyHeader = "apiVersion: podjanitor.io/v1alpha1\nkind: PodJanitorPolicy\n"

func TestParse(t *testing.T) {
	p, err := Parse([]byte(policyHeader + `
rules:
- name: everything
  match:
    namespaces:
      include: [kube-system, "team-*"]
      exclude: [team-prod]
    labelSelector: app in (web, api)
    ownerKinds:
      include: [ReplicaSet, "<none>"]
      exclude: [DaemonSet]
    phases: [Running, Pending]
    reasons: [CrashLoopBackOff]
  clock: crashLooping
  minRestarts: 3
  after: 1w1d
  action: delete
  gracePeriodSeconds: 1
- name: defaults
  clock: created
  after: "0"
`))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	want := []Rule{
		{
			Name: "everything",
			Match: Match{
				Namespaces:    IncludeExclude{Include: []string{"kube-system", "team-*"}, Exclude: []string{"team-prod"}},
				LabelSelector: "app in (web, api)",
				OwnerKinds:    IncludeExclude{Include: []string{"ReplicaSet", NoOwner}, Exclude: []string{"DaemonSet"}},
				Phases:        []corev1.PodPhase{corev1.PodRunning, corev1.PodPending},
				Reasons:       []string{"CrashLoopBackOff"},
			},
			Clock:              ClockCrashLooping,
			MinRestarts:        3,
			After:              8 * 24 * time.Hour,
			Action:             ActionDelete,
			GracePeriodSeconds: ptr[int64](1),
		},
		{Name: "defaults", Clock: ClockCreated},
	}
	if diff := cmp.Diff(want, p.Rules); diff != "" {
		t.Errorf("Parse() rules (-want,+got):\n%s", diff)
	}
}

func TestParseErrors(t *testing.T) {
	// rule wraps one rule's YAML (indented by two spaces) in a valid file.
	rule := func(lines ...string) string {
		return policyHeader + "rules:\n- " + strings.Join(lines, "\n  ") + "\n"
	}
	tests := []struct {
		name    string
		file    string
		wantErr string
	}{
		// The file.
		{"empty file", "", `empty policy: want apiVersion "podjanitor.io/v1alpha1", kind "PodJanitorPolicy" and rules`},
		{"not a mapping", "- name: a\n", "the policy must be a mapping with apiVersion, kind and rules"},
		{"bad YAML", "rules: [", "yaml: line 1: did not find expected node content"},
		{"duplicate key", policyHeader + "kind: Other\n", `yaml: unmarshal errors: line 3: key "kind" already set in map`},
		{"no apiVersion", "kind: PodJanitorPolicy\nrules: []\n", `apiVersion: want "podjanitor.io/v1alpha1", got ""`},
		{"wrong apiVersion", "apiVersion: podjanitor.io/v1\nkind: PodJanitorPolicy\n", `apiVersion: want "podjanitor.io/v1alpha1", got "podjanitor.io/v1"`},
		{"wrong kind", "apiVersion: podjanitor.io/v1alpha1\nkind: Policy\n", `kind: want "PodJanitorPolicy", got "Policy"`},
		{"unknown top-level field", policyHeader + "rule: []\n", `unknown field "rule"`},
		{"field in the wrong case", "apiversion: podjanitor.io/v1alpha1\nkind: PodJanitorPolicy\nrules: []\n", `unknown field "apiversion"`},
		{"no rules", policyHeader, "rules: at least one rule is required"},
		{"empty rules", policyHeader + "rules: []\n", "rules: at least one rule is required"},
		{"rules not a list", policyHeader + "rules: {name: a}\n", "rules: want a list, got object"},
		{"rule not a mapping", policyHeader + "rules: [evicted]\n", "rules[0]: want a mapping, got string"},

		// Fields of a rule.
		{"unknown rule field", rule("name: evicted", "clock: finished", "after: 1h", "afterr: 2h"), `rule "evicted" (rules[0]): unknown field "afterr"`},
		{"unknown match field", rule("name: evicted", "clock: finished", "after: 1h", "match: {namespace: [a]}"), `rule "evicted" (rules[0]): unknown field "match.namespace"`},
		{"unknown namespaces field", rule("name: evicted", "clock: finished", "after: 1h", "match: {namespaces: {includes: [a]}}"), `rule "evicted" (rules[0]): unknown field "match.namespaces.includes"`},
		{"rule field in the wrong case", rule("name: evicted", "Clock: finished", "after: 1h"), `rule "evicted" (rules[0]): unknown field "Clock"`},
		{"rule field in the wrong case with a wrong type", rule("nAme: a", "mAtCh: 0"), `rules[0]: unknown field "mAtCh"; unknown field "nAme"`},
		{"match not a mapping", rule("name: a", "clock: created", "after: 1h", "match: [a]"), `rule "a" (rules[0]): match: want a mapping, got array`},
		{"no name", rule("clock: finished", "after: 1h"), "rules[0]: name: required"},
		{"name not a string", rule("name: yes", "clock: finished", "after: 1h"), "rules[0]: name: want a string, got bool (quote the value)"},
		{"bad name", rule("name: evicted pods", "clock: finished", "after: 1h"), `rule "evicted pods" (rules[0]): name: "evicted pods" must start and end with a letter or digit and contain only letters, digits, '-', '_' and '.'`},
		{"duplicate name", policyHeader + "rules:\n- {name: a, clock: created, after: 1h}\n- {name: a, clock: created, after: 2h}\n", `rule "a" (rules[1]): name: duplicate of rules[0]`},
		{"no clock", rule("name: evicted", "after: 1h"), `rule "evicted" (rules[0]): clock: required, one of "finished", "pending", "crashLooping", "created"`},
		{"unknown clock", rule("name: evicted", "clock: Finished", "after: 1h"), `rule "evicted" (rules[0]): clock: unknown clock "Finished", want one of "finished", "pending", "crashLooping", "created"`},
		{"no after", rule("name: evicted", "clock: finished"), `rule "evicted" (rules[0]): after: required (use "0s" to remove at once)`},
		{"after with an unknown unit", rule("name: evicted", "clock: finished", "after: 3x"), `rule "evicted" (rules[0]): after: unknown unit "x"`},
		{"after negative", rule("name: evicted", "clock: finished", "after: -1h"), `rule "evicted" (rules[0]): after: negative duration`},
		{"after without unit", rule("name: evicted", "clock: finished", "after: 30"), `rule "evicted" (rules[0]): after: want a string, got number (quote the value)`},
		{"minRestarts on another clock", rule("name: evicted", "clock: finished", "after: 1h", "minRestarts: 3"), `rule "evicted" (rules[0]): minRestarts: only allowed with clock "crashLooping", not "finished"`},
		{"minRestarts negative", rule("name: crash", "clock: crashLooping", "after: 1h", "minRestarts: -1"), `rule "crash" (rules[0]): minRestarts: -1 is negative`},
		{"minRestarts not an integer", rule("name: crash", "clock: crashLooping", "after: 1h", "minRestarts: 1.5"), `rule "crash" (rules[0]): minRestarts: want an integer, got number 1.5`},
		{"unknown action", rule("name: evicted", "clock: finished", "after: 1h", "action: kill"), `rule "evicted" (rules[0]): action: unknown action "kill", want "delete" or "evict"`},
		{"negative grace period", rule("name: evicted", "clock: finished", "after: 1h", "gracePeriodSeconds: -5"), `rule "evicted" (rules[0]): gracePeriodSeconds: -5 is negative`},
		{"zero grace period", rule("name: evicted", "clock: finished", "after: 1h", "gracePeriodSeconds: 0"), `rule "evicted" (rules[0]): gracePeriodSeconds: 0 would force-delete the pod while its containers may still run; use at least 1, or leave it out for the pod's own grace period`},

		// Match.
		{"bad namespace glob", rule("name: ci", "clock: created", "after: 1h", "match: {namespaces: {include: ['ci-[']}}"), `rule "ci" (rules[0]): match.namespaces.include[0]: bad pattern "ci-["`},
		{"empty namespace", rule("name: ci", "clock: created", "after: 1h", "match: {namespaces: {exclude: [a, '']}}"), `rule "ci" (rules[0]): match.namespaces.exclude[1]: empty namespace`},
		{"bad label selector", rule("name: ci", "clock: created", "after: 1h", "match: {labelSelector: 'app in (web'}"), `rule "ci" (rules[0]): match.labelSelector: unable to parse requirement: found '', expected: ',' or ')'`},
		{"empty owner kind", rule("name: ci", "clock: created", "after: 1h", "match: {ownerKinds: {include: ['']}}"), `rule "ci" (rules[0]): match.ownerKinds.include[0]: "" is not a kind (like "ReplicaSet", or "<none>" for bare pods)`},
		{"unknown phase", rule("name: ci", "clock: created", "after: 1h", "match: {phases: [Running, Completed]}"), `rule "ci" (rules[0]): match.phases[1]: unknown phase "Completed", want one of "Pending", "Running", "Succeeded", "Failed", "Unknown"`},
		{"phases not a list", rule("name: ci", "clock: created", "after: 1h", "match: {phases: Running}"), `rule "ci" (rules[0]): match.phases: want a list, got string`},
		{"phase the clock never sees", rule("name: done", "clock: finished", "after: 1h", "match: {phases: [Running]}"), `rule "done" (rules[0]): match.phases[0]: clock "finished" never applies to Running pods`},
		{"bad namespace selector", rule("name: ci", "clock: created", "after: 1h", "match: {namespaceSelector: 'team in (ci'}"), `rule "ci" (rules[0]): match.namespaceSelector: unable to parse requirement: found '', expected: ',' or ')'`},
		{"namespace selector not a string", rule("name: ci", "clock: created", "after: 1h", "match: {namespaceSelector: {team: ci}}"), `rule "ci" (rules[0]): match.namespaceSelector: want a string, got object`},
		{"bad priority class name", rule("name: ci", "clock: created", "after: 1h", "match: {priorityClassNames: {include: [System-Critical]}}"), `rule "ci" (rules[0]): match.priorityClassNames.include[0]: "System-Critical" is not a priority class name (lowercase letters, digits, '-' and '.', like "system-cluster-critical")`},
		{"empty priority class name", rule("name: ci", "clock: created", "after: 1h", "match: {priorityClassNames: {exclude: ['']}}"), `rule "ci" (rules[0]): match.priorityClassNames.exclude[0]: "" is not a priority class name (lowercase letters, digits, '-' and '.', like "system-cluster-critical")`},
		{"empty reason", rule("name: ci", "clock: created", "after: 1h", "match: {reasons: ['']}"), `rule "ci" (rules[0]): match.reasons[0]: empty reason`},

		// The first bad rule is reported.
		{"second rule", policyHeader + "rules:\n- {name: a, clock: created, after: 1h}\n- {name: b, clock: created, after: 1x}\n", `rule "b" (rules[1]): after: unknown unit "x"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := Parse([]byte(tt.file))
			if err == nil {
				t.Fatalf("Parse() = %+v, want error %s", p.Rules, tt.wantErr)
			}
			if err.Error() != tt.wantErr {
				t.Errorf("Parse() error:\n got: %s\nwant: %s", err, tt.wantErr)
			}
			if !meaningfulPolicyError.MatchString(err.Error()) {
				t.Errorf("Parse() error %q does not pass FuzzParse's check", err)
			}
		})
	}
}

func TestNewPolicyErrors(t *testing.T) {
	tests := []struct {
		name    string
		rules   []Rule
		wantErr string
	}{
		{"no rules", nil, "rules: at least one rule is required"},
		{"negative after", []Rule{{Name: "a", Clock: ClockCreated, After: -time.Second}}, `rule "a" (rules[0]): after: -1s is negative`},
		{"minRestarts on another clock", []Rule{{Name: "a", Clock: ClockCreated, MinRestarts: 2}}, `rule "a" (rules[0]): minRestarts: only allowed with clock "crashLooping", not "created"`},
		{"bad selector", []Rule{{Name: "a", Clock: ClockCreated, Match: Match{LabelSelector: "!"}}}, `rule "a" (rules[0]): match.labelSelector: `},
		{"duplicate", []Rule{{Name: "a", Clock: ClockCreated}, {Name: "a", Clock: ClockPending}}, `rule "a" (rules[1]): name: duplicate of rules[0]`},
		{"zero grace period", []Rule{{Name: "a", Clock: ClockCreated}, {Name: "b", Clock: ClockCreated, GracePeriodSeconds: ptr[int64](0)}}, `rule "b" (rules[1]): gracePeriodSeconds: 0 would force-delete the pod`},
		{"negative grace period", []Rule{{Name: "a", Clock: ClockCreated, GracePeriodSeconds: ptr[int64](-1)}}, `rule "a" (rules[0]): gracePeriodSeconds: -1 is negative`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewPolicy(tt.rules...)
			if err == nil || !strings.HasPrefix(err.Error(), tt.wantErr) {
				t.Errorf("NewPolicy() error = %v, want %s", err, tt.wantErr)
			}
		})
	}
}

func TestLoadExamplePolicy(t *testing.T) {
	p, err := LoadFile("../artifacts/policy.yaml")
	if err != nil {
		t.Fatalf("LoadFile: %v", err)
	}
	want := []Rule{
		{
			Name:  "evicted",
			Match: Match{Phases: []corev1.PodPhase{corev1.PodFailed}, Reasons: []string{"Evicted"}},
			Clock: ClockFinished,
			After: time.Hour,
		},
		{
			Name:  "completed-bare-pods",
			Match: Match{Phases: []corev1.PodPhase{corev1.PodSucceeded}, OwnerKinds: IncludeExclude{Include: []string{NoOwner}}},
			Clock: ClockFinished,
			After: 24 * time.Hour,
		},
		{
			Name:  "stuck-pending",
			Match: Match{OwnerKinds: IncludeExclude{Exclude: []string{"DaemonSet"}}},
			Clock: ClockPending,
			After: 30 * time.Minute,
		},
		{
			Name: "crash-looping-deployments",
			Match: Match{
				Namespaces: IncludeExclude{Exclude: []string{"*-prod"}},
				OwnerKinds: IncludeExclude{Include: []string{"ReplicaSet"}},
				Reasons:    []string{"CrashLoopBackOff"},
			},
			Clock:              ClockCrashLooping,
			MinRestarts:        5,
			After:              20 * time.Minute,
			Action:             ActionEvict,
			GracePeriodSeconds: ptr[int64](30),
		},
		{
			Name:  "ci-max-age",
			Match: Match{Namespaces: IncludeExclude{Include: []string{"ci-*"}}, LabelSelector: "ci.example.com/pinned!=true"},
			Clock: ClockCreated,
			After: 7 * 24 * time.Hour,
		},
	}
	if diff := cmp.Diff(want, p.Rules); diff != "" {
		t.Fatalf("LoadFile(artifacts/policy.yaml) rules (-want,+got):\n%s", diff)
	}

	at := func(minutes int) time.Time { return created.Add(time.Duration(minutes) * time.Minute) }
	crashLooping := []podOption{inPhase(corev1.PodRunning), ownedBy("ReplicaSet"), withContainers(waitingContainer("CrashLoopBackOff", 6)),
		withCondition(corev1.PodReady, corev1.ConditionFalse, "ContainersNotReady", at(10))}
	decisions := []struct {
		name string
		pod  *corev1.Pod
		want Decision
	}{
		{"evicted", newPod(inPhase(corev1.PodFailed), withReason("Evicted"), startedAt(at(5))), ruleDecision("evicted", ClockFinished, ActionDelete, at(65))},
		{"evicted in kube-system", newPod(inNamespace("kube-system"), inPhase(corev1.PodFailed), withReason("Evicted")), Decision{}},
		{"completed bare pod", newPod(inPhase(corev1.PodSucceeded), startedAt(at(5))), ruleDecision("completed-bare-pods", ClockFinished, ActionDelete, at(5+24*60))},
		{"completed Job pod", newPod(inPhase(corev1.PodSucceeded), ownedBy("Job")), Decision{}},
		{"unschedulable", newPod(withCondition(corev1.PodScheduled, corev1.ConditionFalse, "Unschedulable", at(1))), ruleDecision("stuck-pending", ClockPending, ActionDelete, at(31))},
		{"scheduled Job pod whose init container still runs", newPod(ownedBy("Job"), withCondition(corev1.PodScheduled, corev1.ConditionTrue, "", at(1)),
			withInitContainers(runningContainer()), withContainers(waitingContainer("PodInitializing", 0))), Decision{}},
		{"crash-looping Deployment pod", newPod(crashLooping...), func() Decision {
			d := ruleDecision("crash-looping-deployments", ClockCrashLooping, ActionEvict, at(30))
			d.GracePeriodSeconds = ptr[int64](30)
			return d
		}()},
		{"crash-looping in production", newPod(append(crashLooping, inNamespace("shop-prod"))...), Decision{}},
		{"old CI pod", newPod(inNamespace("ci-42"), inPhase(corev1.PodRunning)), ruleDecision("ci-max-age", ClockCreated, ActionEvict, created.Add(7*24*time.Hour))},
		{"pinned CI pod", newPod(inNamespace("ci-42"), inPhase(corev1.PodRunning), labelled("ci.example.com/pinned", "true")), Decision{}},
		{"running pod elsewhere", newPod(inPhase(corev1.PodRunning)), Decision{}},
	}
	e := &Evaluator{Policy: p}
	for _, tt := range decisions {
		t.Run(tt.name, func(t *testing.T) {
			got, err := e.Decide(tt.pod, anyNamespace, now)
			if err != nil {
				t.Fatalf("Decide() error: %v", err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Decide() (-want,+got):\n%s", diff)
			}
		})
	}
}

// TestExampleStuckPendingRule follows the example policy's stuck-pending rule
// (30 minutes) through the life of a Job pod whose init container runs for 40
// minutes: it is not removed while the init container runs, and it counts only
// once it is stuck. An unschedulable pod and a pod in ImagePullBackOff from the
// start are removed at 30 minutes.
func TestExampleStuckPendingRule(t *testing.T) {
	p, err := LoadFile("../artifacts/policy.yaml")
	if err != nil {
		t.Fatalf("LoadFile: %v", err)
	}
	e := &Evaluator{Policy: p}
	at := func(minutes int) time.Time { return created.Add(time.Duration(minutes) * time.Minute) }
	scheduled := withCondition(corev1.PodScheduled, corev1.ConditionTrue, "", at(0))
	tests := []struct {
		name string
		pod  *corev1.Pod
		now  time.Time
		want Decision
	}{
		{"init container running for 30 minutes",
			newPod(ownedBy("Job"), scheduled, withInitContainers(runningContainer()), withContainers(waitingContainer("PodInitializing", 0))),
			at(30), Decision{}},
		{"init container running for 39 minutes",
			newPod(ownedBy("Job"), scheduled, withInitContainers(runningContainer()), withContainers(waitingContainer("PodInitializing", 0))),
			at(39), Decision{}},
		{"init container done after 40 minutes, main container being created",
			newPod(ownedBy("Job"), scheduled, withInitContainers(terminatedContainer("Completed", at(40))), withContainers(waitingContainer("PodInitializing", 0))),
			at(41), Decision{}},
		{"init container done after 40 minutes, main container in ImagePullBackOff",
			newPod(ownedBy("Job"), scheduled, withInitContainers(terminatedContainer("Completed", at(40))), withContainers(waitingContainer("ImagePullBackOff", 0))),
			at(41), ruleDecision("stuck-pending", ClockPending, ActionDelete, at(70))},
		{"ImagePullBackOff from the start",
			newPod(ownedBy("Job"), scheduled, withContainers(waitingContainer("ImagePullBackOff", 0))),
			at(30), ruleDecision("stuck-pending", ClockPending, ActionDelete, at(30))},
		{"unschedulable",
			newPod(ownedBy("Job"), withCondition(corev1.PodScheduled, corev1.ConditionFalse, "Unschedulable", at(0))),
			at(30), ruleDecision("stuck-pending", ClockPending, ActionDelete, at(30))},
		{"never scheduled",
			newPod(), at(30), ruleDecision("stuck-pending", ClockPending, ActionDelete, at(30))},
		{"unschedulable DaemonSet pod",
			newPod(ownedBy("DaemonSet"), withCondition(corev1.PodScheduled, corev1.ConditionFalse, "Unschedulable", at(0))),
			at(30), Decision{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := e.Decide(tt.pod, anyNamespace, tt.now)
			if err != nil {
				t.Fatalf("Decide() error: %v", err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Decide() (-want,+got):\n%s", diff)
			}
		})
	}
}

func TestLoadFileErrors(t *testing.T) {
	dir := t.TempDir()
	if _, err := LoadFile(filepath.Join(dir, "missing.yaml")); err == nil || !os.IsNotExist(err) {
		t.Errorf("LoadFile(missing) error = %v, want not-exist", err)
	}
	bad := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(bad, []byte(policyHeader+"rules: [{name: a, clock: created, after: 1x}]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	want := bad + `: rule "a" (rules[0]): after: unknown unit "x"`
	if _, err := LoadFile(bad); err == nil || err.Error() != want {
		t.Errorf("LoadFile(bad) error = %v, want %s", err, want)
	}
}

// meaningfulPolicyError says what a rejection must name: a field of the file,
// or what is wrong with the file as a whole.
var meaningfulPolicyError = regexp.MustCompile(`(?s)^(` +
	`yaml: .+|empty policy: .+|the policy must be a mapping.*|unknown field ".+|(apiVersion|kind|rules): .+|` +
	`(rules\[\d+\]|rule ".*" \(rules\[\d+\]\)): ` +
	`(want a mapping.*|unknown field ".+|(name|match(\.[A-Za-z.]+)?(\[\d+\])?|clock|after|minRestarts|action|gracePeriodSeconds): .+)` +
	`)$`)

func FuzzParse(f *testing.F) {
	example, err := os.ReadFile("../artifacts/policy.yaml")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(string(example))
	for _, seed := range []string{
		"",
		"{}",
		"[]",
		policyHeader,
		policyHeader + "rules: [{name: a, clock: created, after: 1h}]",
		policyHeader + "rules: [{name: a, clock: crashLooping, minRestarts: 2, after: 1h, match: {labelSelector: 'a in (b)'}}]",
		policyHeader + "rules: [{name: a, clock: finished, after: 1h, match: {namespaces: {include: ['[']}}}]",
		policyHeader + "rules:\n- name: a\n  clock: pending\n  after: 1d\n  match:\n    phases: [Pending]\n    ownerKinds: {exclude: ['<none>']}\n",
		"rules: &a [*a]",
	} {
		f.Add(seed)
	}
	pod := newPod(inPhase(corev1.PodFailed), withReason("Evicted"), ownedBy("ReplicaSet"), labelled("a", "b"))
	f.Fuzz(func(t *testing.T, file string) {
		p, err := Parse([]byte(file))
		if err != nil {
			if !meaningfulPolicyError.MatchString(err.Error()) {
				t.Fatalf("Parse(%q) error %q names no field and no top-level problem", file, err)
			}
			return
		}
		if len(p.Rules) == 0 {
			t.Fatalf("Parse(%q) accepted a policy without rules", file)
		}
		if _, err := (&Evaluator{Policy: p}).Decide(pod, anyNamespace, now); err != nil {
			t.Fatalf("Decide() with an accepted policy: %v", err)
		}
	})
}
