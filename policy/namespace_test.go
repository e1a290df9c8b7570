package policy

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
)

func withPriorityClass(name string) podOption {
	return func(p *corev1.Pod) { p.Spec.PriorityClassName = name }
}

// namespaceWith is a known namespace with labels and annotations from key, value pairs.
func namespaceWith(labels, annotations map[string]string) *Namespace {
	return &Namespace{Labels: labels, Annotations: annotations}
}

// TestDecideNamespaceKeep proves that the keep annotation of a pod's
// namespace vetoes every deadline, of rules and of the pod's own
// annotations, and that a pod whose namespace is not known is left alone.
func TestDecideNamespaceKeep(t *testing.T) {
	maxAge, err := NewPolicy(Rule{Name: "max-age", Clock: ClockCreated, After: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	kept := map[string]string{"podjanitor.io/keep": "true"}
	ttlPod := newPod(annotated("podjanitor.io/ttl", "1h"))
	tests := []struct {
		name      string
		evaluator Evaluator
		pod       *corev1.Pod
		ns        *Namespace
		want      Decision
		wantErr   string
	}{
		{"kept namespace vetoes a rule", Evaluator{Policy: maxAge}, newPod(), namespaceWith(nil, kept), Decision{Kept: true}, ""},
		{"kept namespace vetoes the pod's ttl", Evaluator{}, ttlPod, namespaceWith(nil, kept), Decision{Kept: true}, ""},
		{"kept namespace vetoes a pod's keep=false", Evaluator{Policy: maxAge}, newPod(annotated("podjanitor.io/keep", "false")), namespaceWith(nil, kept), Decision{Kept: true}, ""},
		{"keep=false on the namespace does not keep", Evaluator{Policy: maxAge}, newPod(), namespaceWith(nil, map[string]string{"podjanitor.io/keep": "false"}),
			ruleDecision("max-age", ClockCreated, ActionDelete, created.Add(time.Hour)), ""},
		{"keep under another prefix does not keep", Evaluator{Policy: maxAge, Prefix: "janitor.example.com"}, newPod(), namespaceWith(nil, kept),
			ruleDecision("max-age", ClockCreated, ActionDelete, created.Add(time.Hour)), ""},
		{"keep under the configured prefix keeps", Evaluator{Policy: maxAge, Prefix: "janitor.example.com"}, newPod(),
			namespaceWith(nil, map[string]string{"janitor.example.com/keep": "true"}), Decision{Kept: true}, ""},
		{"labels alone do not keep", Evaluator{Policy: maxAge}, newPod(), namespaceWith(map[string]string{"podjanitor.io/keep": "true"}, nil),
			ruleDecision("max-age", ClockCreated, ActionDelete, created.Add(time.Hour)), ""},
		{"unknown namespace: no rule applies", Evaluator{Policy: maxAge}, newPod(), nil, Decision{Skipped: SkippedNamespaceUnknown}, ""},
		{"unknown namespace: no annotation applies", Evaluator{}, ttlPod, nil, Decision{Skipped: SkippedNamespaceUnknown}, ""},
		{"unknown namespace: the pod's own keep still reads", Evaluator{}, newPod(annotated("podjanitor.io/keep", "true")), nil, Decision{Kept: true}, ""},
		{"bad keep on the namespace holds back a pod with a deadline", Evaluator{Policy: maxAge}, newPod(),
			namespaceWith(nil, map[string]string{"podjanitor.io/keep": "yes"}), Decision{},
			`namespace default: annotation podjanitor.io/keep="yes": want "true" or "false"`},
		{"bad keep on the namespace does not concern a pod without a deadline", Evaluator{}, newPod(),
			namespaceWith(nil, map[string]string{"podjanitor.io/keep": "yes"}), Decision{}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.evaluator.Decide(tt.pod, tt.ns, now)
			if tt.wantErr != "" {
				var invalid *AnnotationError
				if err == nil || err.Error() != tt.wantErr || !errors.As(err, &invalid) {
					t.Fatalf("Decide() error = %v, want *AnnotationError %s", err, tt.wantErr)
				}
			} else if err != nil {
				t.Fatalf("Decide() error: %v", err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Decide() (-want,+got):\n%s", diff)
			}
		})
	}
}

// TestRuleNamespaceSelector proves that a rule's namespaceSelector matches
// the labels of the pod's namespace, not the pod's, and that a rule that
// does not match leaves the pod to the next rule.
func TestRuleNamespaceSelector(t *testing.T) {
	p, err := Parse([]byte(policyHeader + `
rules:
- name: ci
  match: {namespaceSelector: "team=ci,env!=prod"}
  clock: created
  after: 1h
- name: everyone-else
  match: {namespaceSelector: "!team"}
  clock: created
  after: 2h
`))
	if err != nil {
		t.Fatal(err)
	}
	e := Evaluator{Policy: p}
	tests := []struct {
		name string
		pod  *corev1.Pod
		ns   *Namespace
		want Decision
	}{
		{"labelled namespace", newPod(), namespaceWith(map[string]string{"team": "ci"}, nil),
			ruleDecision("ci", ClockCreated, ActionDelete, created.Add(time.Hour))},
		{"excluded by a second requirement", newPod(), namespaceWith(map[string]string{"team": "ci", "env": "prod"}, nil), Decision{}},
		{"other team", newPod(), namespaceWith(map[string]string{"team": "web"}, nil), Decision{}},
		{"the pod's labels do not count", newPod(labelled("team", "ci")), namespaceWith(map[string]string{"team": "web"}, nil), Decision{}},
		{"unlabelled namespace falls through to the next rule", newPod(), anyNamespace,
			ruleDecision("everyone-else", ClockCreated, ActionDelete, created.Add(2*time.Hour))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := e.Decide(tt.pod, tt.ns, now)
			if err != nil {
				t.Fatalf("Decide() error: %v", err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Decide() (-want,+got):\n%s", diff)
			}
		})
	}
}

// TestRuleCriticalPriorityClasses proves that pods of system-cluster-critical
// and system-node-critical are matched by no rule unless its
// priorityClassNames.include names the class exactly, that their own
// annotations still apply, and how include and exclude select other classes.
func TestRuleCriticalPriorityClasses(t *testing.T) {
	rule := func(names IncludeExclude) Rule {
		return Rule{Name: "max-age", Match: Match{PriorityClassNames: names}, Clock: ClockCreated, After: time.Hour}
	}
	due := ruleDecision("max-age", ClockCreated, ActionDelete, created.Add(time.Hour))
	tests := []struct {
		name  string
		names IncludeExclude
		pod   *corev1.Pod
		want  Decision
	}{
		{"cluster-critical pod, rule without priority classes", IncludeExclude{}, newPod(withPriorityClass("system-cluster-critical")), Decision{}},
		{"node-critical pod, rule without priority classes", IncludeExclude{}, newPod(withPriorityClass("system-node-critical")), Decision{}},
		{"critical pod in kube-system, rule naming kube-system", IncludeExclude{},
			newPod(withPriorityClass("system-node-critical"), inNamespace("kube-system")), Decision{}},
		{"critical pod, rule excluding another class", IncludeExclude{Exclude: []string{"batch"}}, newPod(withPriorityClass("system-cluster-critical")), Decision{}},
		{"critical pod, rule including the other critical class", IncludeExclude{Include: []string{"system-node-critical"}},
			newPod(withPriorityClass("system-cluster-critical")), Decision{}},
		{"critical pod, rule naming its class", IncludeExclude{Include: []string{"system-cluster-critical"}},
			newPod(withPriorityClass("system-cluster-critical")), due},
		{"ordinary pod, rule without priority classes", IncludeExclude{}, newPod(), due},
		{"ordinary class, rule without priority classes", IncludeExclude{}, newPod(withPriorityClass("batch")), due},
		{"excluded class", IncludeExclude{Exclude: []string{"batch"}}, newPod(withPriorityClass("batch")), Decision{}},
		{"class not included", IncludeExclude{Include: []string{"batch"}}, newPod(withPriorityClass("web")), Decision{}},
		{"no class, include set", IncludeExclude{Include: []string{"batch"}}, newPod(), Decision{}},
		{"included class", IncludeExclude{Include: []string{"batch"}}, newPod(withPriorityClass("batch")), due},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := rule(tt.names)
			if tt.pod.Namespace == "kube-system" {
				r.Match.Namespaces.Include = []string{"kube-system"}
			}
			p, err := NewPolicy(r)
			if err != nil {
				t.Fatal(err)
			}
			got, err := (&Evaluator{Policy: p}).Decide(tt.pod, anyNamespace, now)
			if err != nil {
				t.Fatalf("Decide() error: %v", err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Decide() (-want,+got):\n%s", diff)
			}
		})
	}

	// The pod's own annotations still apply: its owner asked.
	pod := newPod(withPriorityClass("system-cluster-critical"), annotated("podjanitor.io/ttl", "1h"))
	got, err := (&Evaluator{}).Decide(pod, anyNamespace, now)
	if err != nil || !got.HasDeadline() || got.Source != "podjanitor.io/ttl" {
		t.Errorf("critical pod with a ttl annotation: Decide() = %+v, %v; want the annotation's deadline", got, err)
	}
}
