package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/podjanitor/podjanitor/internal/apitest"
	"github.com/podjanitor/podjanitor/internal/wave"
)

// A start is measured against the scope the last leader acted in, not only
// its rules (decisionScope): the pods a wider scope makes due are a wave.

// leaseRecording is the record Lease of a leader that acted on `after:
// after` in scope s.
func leaseRecording(t *testing.T, after string, s decisionScope) *coordinationv1.Lease {
	b := recordJSON(evaluatorWithAfter(t, after), s)
	return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "podjanitor", Name: "podjanitor",
		Annotations: map[string]string{wave.AnnotationBaseline: string(b), wave.AnnotationBaselineHash: wave.BaselineHash(b)}}}
}

// addPod puts a pod in the fixture's cache.
func addPod(t *testing.T, f *fixture, p *corev1.Pod) *corev1.Pod {
	t.Helper()
	if err := f.c.pods.Add(p); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestStartInAWiderScopeIsHeld: the last leader acted on the pods labelled
// team=a; this one, with the same rules, on every pod. The 12 overdue pods
// without the label are a wave and held; the one with it was due before
// and goes.
func TestStartInAWiderScopeIsHeld(t *testing.T) {
	recorded := decisionScope{LabelSelector: "team=a"}
	f, pods := startFixture(t, "1m", time.Hour, 12, leaseRecording(t, "1m", recorded))
	teamA := apitest.Pod("team-a", t0.Add(-time.Hour), corev1.PodSucceeded, nil)
	teamA.Labels = map[string]string{"team": "a"}
	addPod(t, f, teamA)
	f.start(append(pods, teamA))
	h, held := f.c.waves.Held()
	want := wave.ChangeID(recordJSON(evaluatorWithAfter(t, "1m"), recorded), policyJSON(evaluatorWithAfter(t, "1m")))
	if !held || h.Source != wave.SourceStartup || h.Pods != 12 || h.ID != want {
		t.Fatalf("held %+v, %v; want the start's wider scope holding 12 pods", h, held)
	}
	if n := f.deletes(); n != 1 {
		t.Errorf("%d pods removed, want 1 (the pod in the recorded scope)", n)
	}
}

// TestStartInANarrowerScopeHoldsNothing: the last leader acted on every
// pod, this one on team=a's: no pod is due that was not before.
func TestStartInANarrowerScopeHoldsNothing(t *testing.T) {
	f, pods := startFixtureWith(t, Options{Scope: decisionScope{LabelSelector: "team = a"}}, "1m", time.Hour, 12, leaseRecording(t, "1m", decisionScope{}))
	for _, p := range pods {
		p.Labels = map[string]string{"team": "a"}
	}
	f.start(pods)
	if h, held := f.c.waves.Held(); held {
		t.Fatalf("a narrower scope is held: %+v", h)
	}
	if n := f.deletes(); n != 12 {
		t.Errorf("%d pods removed, want 12", n)
	}
	if got := f.c.waves.scope.LabelSelector; got != "team=a" {
		t.Errorf("recorded label selector %q, want it as it prints once parsed: team=a", got)
	}
}

// TestStartInAnotherNamespaceIsHeld: the last leader watched namespace
// team-a; this one watches every namespace.
func TestStartInAnotherNamespaceIsHeld(t *testing.T) {
	f, pods := startFixture(t, "1m", time.Hour, 12, leaseRecording(t, "1m", decisionScope{Namespace: "team-a"}))
	f.start(pods) // the fixture's pods are in "default"
	if h, held := f.c.waves.Held(); !held || h.Pods != 12 {
		t.Fatalf("held %+v, %v; want the 12 pods outside team-a", h, held)
	}
	if n := f.deletes(); n != 0 {
		t.Errorf("%d pods removed, want 0", n)
	}
}

// TestLeavingDryRunIsMeasuredAsAFirstInstall: the last leader ran with
// --dry-run and removed nothing; this one removes. The pods its rules make
// due are the wave, as at a first install; a pod due by its own ttl is not.
func TestLeavingDryRunIsMeasuredAsAFirstInstall(t *testing.T) {
	f, pods := startFixture(t, "1m", time.Hour, 12, leaseRecording(t, "1m", decisionScope{DryRun: true}))
	own := addPod(t, f, apitest.Pod("own", t0.Add(-time.Hour), corev1.PodSucceeded, map[string]string{"podjanitor.io/ttl": "1m"}))
	f.start(append(pods, own))
	if h, held := f.c.waves.Held(); !held || h.Pods != 12 {
		t.Fatalf("held %+v, %v; want the 12 pods of the rules", h, held)
	}
	if n := f.deletes(); n != 1 {
		t.Errorf("%d pods removed, want 1: the pod due by its own ttl", n)
	}
}

// TestStartWithAnotherAnnotationPrefixIsHeld: the last leader read
// team.io/ annotations; this one reads podjanitor.io/ and its cache keeps
// no others, so it cannot tell which pods a team.io/keep kept: the 12 pods
// the rules make due are a wave. The 3 due by their own podjanitor.io/ttl
// are not (a pod's own deadline is never held).
func TestStartWithAnotherAnnotationPrefixIsHeld(t *testing.T) {
	f, pods := startFixture(t, "1m", time.Hour, 12, leaseRecording(t, "1m", decisionScope{AnnotationPrefix: "team.io"}))
	var own []*corev1.Pod
	for _, name := range []string{"a", "b", "c"} {
		own = append(own, addPod(t, f, apitest.Pod("ttl-"+name, t0.Add(-time.Hour), corev1.PodSucceeded, map[string]string{"podjanitor.io/ttl": "1m"})))
	}
	f.start(append(pods, own...))
	if h, held := f.c.waves.Held(); !held || h.Pods != 12 {
		t.Fatalf("held %+v, %v; want the 12 pods of the rules", h, held)
	}
	if got := f.deletedNames(); len(got) != 3 || !strings.HasPrefix(got[0], "ttl-") {
		t.Errorf("removed %v, want the 3 pods due by their own ttl", got)
	}
}

// TestRecordWithoutAScopeHasTheCurrentOne: a record written before scopes
// were recorded (the rules alone) is taken to be in the current scope:
// the same rules hold nothing, and the scope is recorded from then on.
func TestRecordWithoutAScopeHasTheCurrentOne(t *testing.T) {
	b, err := json.Marshal(evaluatorWithAfter(t, "1m").Policy)
	if err != nil {
		t.Fatal(err)
	}
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "podjanitor", Name: "podjanitor",
		Annotations: map[string]string{wave.AnnotationBaseline: string(b), wave.AnnotationBaselineHash: wave.BaselineHash(b)}}}
	f, pods := startFixtureWith(t, Options{Scope: decisionScope{Namespace: "default"}}, "1m", time.Hour, 12, lease)
	f.start(pods)
	if h, held := f.c.waves.Held(); held {
		t.Fatalf("an upgrade's record is held: %+v", h)
	}
	if n := f.deletes(); n != 12 {
		t.Errorf("%d pods removed, want 12", n)
	}
}

// TestRestartInTheSameScopeHoldsNothing: rules and scope as recorded.
func TestRestartInTheSameScopeHoldsNothing(t *testing.T) {
	s := decisionScope{Namespace: "default", LabelSelector: "team!=b", TenantPolicies: true}
	f, pods := startFixtureWith(t, Options{Scope: s}, "1m", time.Hour, 12, leaseRecording(t, "1m", s))
	f.start(pods)
	if h, held := f.c.waves.Held(); held {
		t.Fatalf("a restart with nothing changed is held: %+v", h)
	}
	if n := f.deletes(); n != 12 {
		t.Errorf("%d pods removed, want 12", n)
	}
}

// TestStartInAWiderScopeNeverHoldsPodsOwnDeadlines: the last leader acted
// on team=a's pods; this one on every pod. The 12 pods outside team=a that
// its rules make due are a wave and held; the 12 whose own expires-at or
// ttl is past are not (a pod's own deadline is never held), nor is one
// created after the start with its own expires-at.
func TestStartInAWiderScopeNeverHoldsPodsOwnDeadlines(t *testing.T) {
	f, pods := startFixture(t, "1m", time.Hour, 12, leaseRecording(t, "1m", decisionScope{LabelSelector: "team=a"}))
	var own []*corev1.Pod
	for i := range 12 {
		a := map[string]string{"podjanitor.io/expires-at": t0.Add(-time.Minute).Format(time.RFC3339)}
		if i%2 == 1 {
			a = map[string]string{"podjanitor.io/ttl": "1m"}
		}
		p := apitest.Pod(fmt.Sprintf("own-%02d", i), t0.Add(-time.Hour), corev1.PodSucceeded, a)
		own = append(own, addPod(t, f, p))
	}
	f.start(append(pods, own...))
	if h, held := f.c.waves.Held(); !held || h.Pods != 12 {
		t.Fatalf("held %+v, %v; want the 12 pods of the rules", h, held)
	}
	later := addPod(t, f, apitest.Pod("later", t0, corev1.PodSucceeded,
		map[string]string{"podjanitor.io/expires-at": t0.Format(time.RFC3339)}))
	f.process(keyOf(later))
	removed := map[string]bool{}
	for _, name := range f.deletedNames() {
		removed[name] = true
	}
	for _, p := range append(own, later) {
		if !removed[p.Name] {
			t.Errorf("pod %s, due by its own annotation, was not removed", p.Name)
		}
	}
	for _, p := range pods {
		if removed[p.Name] {
			t.Errorf("pod %s of the held wave was removed", p.Name)
		}
	}
}

// TestStartWithTenantPoliciesTurnedOffIsHeld: the last leader read the
// namespaces' PodLifetimePolicies, which may have kept pods longer than the
// cluster's rules; this start does not read them, so cannot tell: the 12
// pods the rules make due are held, not taken as a narrowing.
func TestStartWithTenantPoliciesTurnedOffIsHeld(t *testing.T) {
	f, pods := startFixture(t, "1m", time.Hour, 12, leaseRecording(t, "1m", decisionScope{TenantPolicies: true}))
	f.start(pods)
	if h, held := f.c.waves.Held(); !held || h.Pods != 12 {
		t.Fatalf("held %+v, %v; want the 12 pods of the rules", h, held)
	}
	if n := f.deletes(); n != 0 {
		t.Errorf("%d pods removed, want 0", n)
	}
}
