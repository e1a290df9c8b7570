package main

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	core "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"

	"github.com/podjanitor/podjanitor/policy"
)

func namespace(name string, labels, annotations map[string]string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels, Annotations: annotations}}
}

// updateNamespace writes ns through the fake clientset, so that the
// controller hears of it from its namespace informer, and waits until a pod
// key is queued (want) or a moment has passed without one (!want).
func (f *fixture) updateNamespace(ns *corev1.Namespace, create, wantQueued bool) {
	f.t.Helper()
	var err error
	if create {
		_, err = f.client.CoreV1().Namespaces().Create(f.ctx, ns, metav1.CreateOptions{})
	} else {
		_, err = f.client.CoreV1().Namespaces().Update(f.ctx, ns, metav1.UpdateOptions{})
	}
	if err != nil {
		f.t.Fatal(err)
	}
	queued := wait.PollUntilContextTimeout(f.ctx, time.Millisecond, 300*time.Millisecond, true,
		func(context.Context) (bool, error) { return f.c.queue.Len() > 0, nil }) == nil
	if queued != wantQueued {
		f.t.Fatalf("namespace %s written: pod queued = %v, want %v", ns.Name, queued, wantQueued)
	}
	f.client.ClearActions()
}

// TestNamespaceKeepHoldsPodsUntilRemoved proves that a due pod of a namespace
// annotated keep stays, and goes once the annotation is removed, without
// any event of the pod itself.
func TestNamespaceKeepHoldsPodsUntilRemoved(t *testing.T) {
	pod := newPod("job", t0.Add(-2*time.Hour), corev1.PodSucceeded, map[string]string{"podjanitor.io/ttl": "1h"})
	ns := namespace("default", nil, map[string]string{"podjanitor.io/keep": "true"})
	f := newFixtureWithNamespaces(t, Options{}, []*corev1.Namespace{ns}, pod)

	f.process(keyOf(pod))
	checkActions(t, nil, f.writes())

	ns.Labels = map[string]string{"unrelated": "change"} // not read by any rule here, still decided again
	f.updateNamespace(ns, false, true)
	f.next()
	checkActions(t, nil, f.writes())

	ns.ResourceVersion = "" // the fake tracker does not check it
	ns.Annotations = nil
	f.updateNamespace(ns, false, true)
	f.next()
	checkActions(t, []core.Action{deleteAction(pod)}, f.writes())
}

// TestNamespaceSelectorFollowsRelabelling proves that a rule with a
// namespaceSelector removes pods only in namespaces it selects, and that
// labelling a namespace makes its pods due without any pod event.
func TestNamespaceSelectorFollowsRelabelling(t *testing.T) {
	p, err := policy.Parse([]byte(`apiVersion: podjanitor.io/v1alpha1
kind: PodJanitorPolicy
rules:
- name: ci-max-age
  match: {namespaceSelector: "podjanitor.io/cleanup=true"}
  clock: created
  after: 1h
`))
	if err != nil {
		t.Fatal(err)
	}
	inCI := newPod("ci-pod", t0.Add(-2*time.Hour), corev1.PodSucceeded, nil)
	inCI.Namespace = "ci"
	plain := newPod("web", t0.Add(-2*time.Hour), corev1.PodSucceeded, nil)
	ci := namespace("ci", map[string]string{"podjanitor.io/cleanup": "true"}, nil)
	web := namespace("default", nil, nil)
	f := newFixtureWithNamespaces(t, Options{Evaluator: &policy.Evaluator{Policy: p}}, []*corev1.Namespace{ci, web}, inCI, plain)

	f.process(keyOf(plain))
	checkActions(t, nil, f.writes())
	f.process(keyOf(inCI))
	checkActions(t, []core.Action{deleteAction(inCI)}, f.writes())
	f.client.ClearActions()

	web.Labels = map[string]string{"podjanitor.io/cleanup": "true"}
	f.updateNamespace(web, false, true)
	f.next()
	checkActions(t, []core.Action{deleteAction(plain)}, f.writes())
}

// TestPodOfUnknownNamespaceWaitsForIt proves that a pod whose namespace the
// cache has not seen is left alone, and decided when the namespace arrives.
func TestPodOfUnknownNamespaceWaitsForIt(t *testing.T) {
	pod := newPod("job", t0.Add(-2*time.Hour), corev1.PodSucceeded, map[string]string{"podjanitor.io/ttl": "1h"})
	f := newFixtureWithNamespaces(t, Options{}, []*corev1.Namespace{}, pod)

	f.process(keyOf(pod))
	checkActions(t, nil, f.writes())
	if f.stepAndCheckReady(time.Hour) {
		t.Fatal("a pod of an unknown namespace was parked for a deadline")
	}

	f.updateNamespace(namespace("default", nil, nil), true, true)
	f.next()
	checkActions(t, []core.Action{deleteAction(pod)}, f.writes())
}

// TestCriticalPodIsNotRemovedByRule proves that the pod cache keeps the
// priority class: of two pods a rule matches, the system-cluster-critical
// one stays and the ordinary one goes.
func TestCriticalPodIsNotRemovedByRule(t *testing.T) {
	p, err := policy.NewPolicy(policy.Rule{Name: "finished", Clock: policy.ClockCreated, After: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	critical := newPod("dns", t0.Add(-2*time.Hour), corev1.PodSucceeded, nil)
	critical.Spec.PriorityClassName = "system-cluster-critical"
	plain := newPod("plain", t0.Add(-2*time.Hour), corev1.PodSucceeded, nil)
	f := newFixture(t, Options{Evaluator: &policy.Evaluator{Policy: p}}, critical, plain)

	f.process(keyOf(critical))
	checkActions(t, nil, f.writes())
	f.process(keyOf(plain))
	checkActions(t, []core.Action{deleteAction(plain)}, f.writes())
}

// TestNamespaceTransformKeepsLabelsAndKeep proves that the namespace cache
// holds labels and the keep annotation under the configured prefix, nothing else.
func TestNamespaceTransformKeepsLabelsAndKeep(t *testing.T) {
	full := &metav1.PartialObjectMetadata{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Namespace"},
		ObjectMeta: metav1.ObjectMeta{Name: "ci", UID: "u", ResourceVersion: "5", Labels: map[string]string{"team": "ci"},
			Annotations: map[string]string{"janitor.example.com/keep": "true", "podjanitor.io/keep": "true", "other": "x"},
			Finalizers:  []string{"kubernetes"}, ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl"}}},
	}
	got, err := namespaceTransform("janitor.example.com/keep")(full)
	if err != nil {
		t.Fatal(err)
	}
	want := &metav1.PartialObjectMetadata{
		TypeMeta: full.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{Name: "ci", UID: "u", ResourceVersion: "5", Labels: map[string]string{"team": "ci"},
			Annotations: map[string]string{"janitor.example.com/keep": "true"}},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("transformed namespace (-want,+got):\n%s", diff)
	}
	if info := namespaceInfo(cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{}), "ci"); info != nil {
		t.Errorf("namespaceInfo of a namespace not cached = %+v, want nil", info)
	}
}
