package main

import (
	"bytes"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/podjanitor/podjanitor/internal/apitest"
	"github.com/podjanitor/podjanitor/policy"
)

func TestBuildPlanSortsByDeadlineAndCounts(t *testing.T) {
	pods := []*corev1.Pod{
		apitest.Pod("later", t0, corev1.PodRunning, map[string]string{"podjanitor.io/ttl": "2h"}),
		apitest.Pod("overdue", t0.Add(-2*time.Hour), corev1.PodSucceeded, map[string]string{"podjanitor.io/ttl": "1h"}),
		apitest.Pod("soon", t0, corev1.PodPending, map[string]string{"podjanitor.io/expires-at": "2026-11-29T12:30:00Z"}),
		apitest.Pod("plain", t0, corev1.PodRunning, nil),
		apitest.Pod("kept", t0, corev1.PodRunning, map[string]string{"podjanitor.io/ttl": "1s", "podjanitor.io/keep": "true"}),
		apitest.Pod("typo", t0, corev1.PodRunning, map[string]string{"podjanitor.io/ttl": "3x"}),
	}
	r := buildPlan(&policy.Evaluator{}, pods, map[string]*policy.Namespace{"default": {}}, t0)

	var got []string
	for _, e := range r.Pods {
		got = append(got, e.Pod+" "+e.Action+" "+e.In)
	}
	want := []string{"overdue delete overdue", "soon delete in 30m", "later evict in 2h"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("plan entries (-want,+got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string]int{"podjanitor.io/ttl": 2, "podjanitor.io/expires-at": 1}, r.Totals); diff != "" {
		t.Errorf("totals (-want,+got):\n%s", diff)
	}
	if len(r.Invalid) != 1 || r.Invalid[0].Pod != "typo" {
		t.Errorf("invalid = %+v, want the typo pod", r.Invalid)
	}

	var out bytes.Buffer
	if err := printPlan(&out, r); err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{"3 of 6 pod(s) have a deadline.", "default/typo: annotation podjanitor.io/ttl=\"3x\""} {
		if !strings.Contains(out.String(), line) {
			t.Errorf("table output lacks %q:\n%s", line, out.String())
		}
	}
}

// TestPlanListsUnknownKeys: a key under the prefix that podjanitor does not
// know is listed with the invalid annotations, and the pod has no deadline.
func TestPlanListsUnknownKeys(t *testing.T) {
	pods := []*corev1.Pod{apitest.Pod("typo", t0, corev1.PodRunning, map[string]string{"podjanitor.io/ttl": "1s", "podjanitor.io/keeps": "true"})}
	r := buildPlan(&policy.Evaluator{}, pods, map[string]*policy.Namespace{"default": {}}, t0)
	if len(r.Pods) != 0 || len(r.Invalid) != 1 {
		t.Fatalf("plan %+v: want the pod invalid, without a deadline", r)
	}
	var out bytes.Buffer
	if err := printPlan(&out, r); err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{"1 pod(s) have an annotation that does not parse or that podjanitor does not know",
		`default/typo: annotation podjanitor.io/keeps="true": unknown annotation: did you mean podjanitor.io/keep?`} {
		if !strings.Contains(out.String(), line) {
			t.Errorf("table output lacks %q:\n%s", line, out.String())
		}
	}
}

// TestBuildPlanReadsNamespaces proves that plan answers as the daemon does
// about namespaces: a kept namespace's pods have no deadline, a rule's
// namespaceSelector reads the namespace's labels, and a pod whose namespace
// was not listed is left alone.
func TestBuildPlanReadsNamespaces(t *testing.T) {
	p, err := policy.Parse([]byte(`apiVersion: podjanitor.io/v1alpha1
kind: PodJanitorPolicy
rules:
- name: ci
  match: {namespaceSelector: team=ci}
  clock: created
  after: 1h
`))
	if err != nil {
		t.Fatal(err)
	}
	inNamespace := func(ns, name string, annotations map[string]string) *corev1.Pod {
		pod := apitest.Pod(name, t0.Add(-2*time.Hour), corev1.PodRunning, annotations)
		pod.Namespace = ns
		return pod
	}
	pods := []*corev1.Pod{
		inNamespace("ci", "by-rule", nil),
		inNamespace("web", "not-selected", nil),
		inNamespace("web", "by-ttl", map[string]string{"podjanitor.io/ttl": "1h"}),
		inNamespace("kept", "kept-ttl", map[string]string{"podjanitor.io/ttl": "1h"}),
		inNamespace("kept-ci", "kept-rule", nil),
		inNamespace("new", "unknown-ns", map[string]string{"podjanitor.io/ttl": "1h"}),
	}
	keep := map[string]string{"podjanitor.io/keep": "true"}
	namespaces := map[string]*policy.Namespace{
		"ci":      {Labels: map[string]string{"team": "ci"}},
		"web":     {Labels: map[string]string{"team": "web"}},
		"kept":    {Annotations: keep},
		"kept-ci": {Labels: map[string]string{"team": "ci"}, Annotations: keep},
	}
	r := buildPlan(&policy.Evaluator{Policy: p}, pods, namespaces, t0)
	var got []string
	for _, e := range r.Pods {
		got = append(got, e.Namespace+"/"+e.Pod+" "+e.Source)
	}
	want := []string{"ci/by-rule rule/ci", "web/by-ttl podjanitor.io/ttl"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("plan entries (-want,+got):\n%s", diff)
	}
}

func TestPlanSaysWhenInWords(t *testing.T) {
	for d, want := range map[time.Duration]string{
		-time.Second:                 "overdue",
		0:                            "overdue",
		90 * time.Second:             "in 1m30s",
		farFuture - time.Second:      "in 5214w1d23h59m59s",
		farFuture:                    "in over 100 years",
		time.Duration(math.MaxInt64): "in over 100 years", // expires-at 9999-12-31: Sub saturates
	} {
		if got := relative(d); got != want {
			t.Errorf("relative(%v) = %q, want %q", d, got, want)
		}
	}
}

// TestPlanShowsRank: a rule that keeps the newest pods of each Job shows
// each pod's place: those past the newest with their deadline, the others
// kept for their rank.
func TestPlanShowsRank(t *testing.T) {
	p, err := policy.Parse([]byte(`apiVersion: podjanitor.io/v1alpha1
kind: PodJanitorPolicy
rules:
  - name: failed-job-pods
    match: {phases: [Failed]}
    clock: created
    after: 0s
    keepNewest: 2
`))
	if err != nil {
		t.Fatal(err)
	}
	var pods []*corev1.Pod
	for i, name := range []string{"run-0", "run-1", "run-2", "run-3"} {
		pod := apitest.Pod(name, t0.Add(time.Duration(i)*time.Minute), corev1.PodFailed, nil)
		pod.OwnerReferences = []metav1.OwnerReference{{Kind: "Job", Name: "nightly", UID: "uid-nightly", Controller: new(true)}}
		pods = append(pods, pod)
	}
	r := buildPlan(&policy.Evaluator{Policy: p}, pods, map[string]*policy.Namespace{"default": {}}, t0.Add(time.Hour))
	var due, kept []string
	for _, e := range r.Pods {
		due = append(due, e.Pod+" "+e.Rank.String())
	}
	for _, e := range r.KeptForRank {
		kept = append(kept, e.Pod+" "+e.Rank.String())
	}
	if diff := cmp.Diff([]string{"run-0 4/4 owner Job/nightly, keeps 2", "run-1 3/4 owner Job/nightly, keeps 2"}, due); diff != "" {
		t.Errorf("due (-want,+got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"run-3 1/4 owner Job/nightly, keeps 2", "run-2 2/4 owner Job/nightly, keeps 2"}, kept); diff != "" {
		t.Errorf("kept (-want,+got):\n%s", diff)
	}
	var out bytes.Buffer
	if err := printPlan(&out, r); err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{"RANK", "2 pod(s) kept for their rank", "run-3", "1/4 owner Job/nightly, keeps 2"} {
		if !strings.Contains(out.String(), line) {
			t.Errorf("table output lacks %q:\n%s", line, out.String())
		}
	}
}
