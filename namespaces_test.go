package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	metadatafake "k8s.io/client-go/metadata/fake"
	core "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/clock"

	"github.com/podjanitor/podjanitor/internal/apitest"
	"github.com/podjanitor/podjanitor/internal/metrics"
	"github.com/podjanitor/podjanitor/internal/namespacecontroller"
	"github.com/podjanitor/podjanitor/internal/podcache"
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
	pod := apitest.Pod("job", t0.Add(-2*time.Hour), corev1.PodSucceeded, map[string]string{"podjanitor.io/ttl": "1h"})
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
	inCI := apitest.Pod("ci-pod", t0.Add(-2*time.Hour), corev1.PodSucceeded, nil)
	inCI.Namespace = "ci"
	plain := apitest.Pod("web", t0.Add(-2*time.Hour), corev1.PodSucceeded, nil)
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
	pod := apitest.Pod("job", t0.Add(-2*time.Hour), corev1.PodSucceeded, map[string]string{"podjanitor.io/ttl": "1h"})
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
	critical := apitest.Pod("dns", t0.Add(-2*time.Hour), corev1.PodSucceeded, nil)
	critical.Spec.PriorityClassName = "system-cluster-critical"
	plain := apitest.Pod("plain", t0.Add(-2*time.Hour), corev1.PodSucceeded, nil)
	f := newFixture(t, Options{Evaluator: &policy.Evaluator{Policy: p}}, critical, plain)

	f.process(keyOf(critical))
	checkActions(t, nil, f.writes())
	f.process(keyOf(plain))
	checkActions(t, []core.Action{deleteAction(plain)}, f.writes())
}

// TestNamespaceInfoOfAnUncachedNamespaceIsNil proves that a namespace the
// cache does not hold is "not known" (nil) to the policy.
func TestNamespaceInfoOfAnUncachedNamespaceIsNil(t *testing.T) {
	if info := podcache.NamespaceInfo(cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{}), "ci"); info != nil {
		t.Errorf("namespaceInfo of a namespace not cached = %+v, want nil", info)
	}
}

// staleNamespaces makes the controller's namespace cache hold namespaces
// that no longer change: its watch has stopped delivering, with or without an
// error. The API server (the fake clientset) has them as they are now.
func (f *fixture) staleNamespaces(namespaces ...*corev1.Namespace) {
	f.t.Helper()
	stale := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	for _, ns := range namespaces {
		if err := stale.Add(ns); err != nil {
			f.t.Fatal(err)
		}
	}
	f.c.namespaces = staleNamespaces{namespaces: f.c.namespaces, stale: stale}
}

// staleNamespaces is the namespace controller with a namespace cache that
// no longer changes.
type staleNamespaces struct {
	namespaces
	stale cache.Indexer
}

func (s staleNamespaces) Info(name string) *policy.Namespace {
	return podcache.NamespaceInfo(s.stale, name)
}

// namespaceGets counts the client's GETs of namespaces.
func (f *fixture) namespaceGets() int {
	n := 0
	for _, a := range f.client.Actions() {
		if a.GetVerb() == "get" && a.GetResource().Resource == "namespaces" {
			n++
		}
	}
	return n
}

// TestDueRemovalReadsNamespaceFresh proves that a pod due by a stale
// namespace cache is not removed when its namespace, read from the API
// server, carries keep; that the read is shared by the namespace's removals
// for a second; and that the pod goes once a fresh read no longer keeps it.
func TestDueRemovalReadsNamespaceFresh(t *testing.T) {
	a := apitest.Pod("a", t0.Add(-2*time.Hour), corev1.PodSucceeded, map[string]string{"podjanitor.io/ttl": "1h"})
	b := apitest.Pod("b", t0.Add(-2*time.Hour), corev1.PodSucceeded, map[string]string{"podjanitor.io/ttl": "1h"})
	ns := namespace("default", nil, map[string]string{"podjanitor.io/keep": "true"})
	f := newFixtureWithNamespaces(t, Options{}, []*corev1.Namespace{ns}, a, b)
	f.staleNamespaces(namespace("default", nil, nil)) // keep was added after the watch stalled

	for _, p := range []*corev1.Pod{a, b} {
		res, err := f.c.syncHandler(f.ctx, keyOf(p))
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(Result{Requeue: true}, res, cmp.AllowUnexported(Result{})); diff != "" {
			t.Errorf("pod %s: result (-want,+got):\n%s", p.Name, diff)
		}
	}
	checkActions(t, nil, f.writes())
	if got := f.namespaceGets(); got != 1 {
		t.Errorf("%d GETs of the namespace for two removals within a second, want 1", got)
	}

	ns.Annotations = nil
	if _, err := f.client.CoreV1().Namespaces().Update(f.ctx, ns, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.client.ClearActions()
	if _, err := f.c.syncHandler(f.ctx, keyOf(a)); err != nil {
		t.Fatal(err)
	}
	checkActions(t, nil, f.writes()) // the read of a moment ago still stands
	f.clock.Step(namespacecontroller.Freshness)
	if _, err := f.c.syncHandler(f.ctx, keyOf(a)); err != nil {
		t.Fatal(err)
	}
	checkActions(t, []core.Action{deleteAction(a)}, f.writes())
}

// TestDueRemovalWaitsWhileNamespaceCannotBeRead proves that a due pod is
// held, not forgotten, while its namespace cannot be read (a 403 after an
// RBAC change), one GET a second however many pods wait, and removed once
// the namespace can be read again.
func TestDueRemovalWaitsWhileNamespaceCannotBeRead(t *testing.T) {
	a := apitest.Pod("a", t0.Add(-2*time.Hour), corev1.PodSucceeded, map[string]string{"podjanitor.io/ttl": "1h"})
	b := apitest.Pod("b", t0.Add(-2*time.Hour), corev1.PodSucceeded, map[string]string{"podjanitor.io/ttl": "1h"})
	f := newFixture(t, Options{}, a, b)
	var refuse atomic.Bool
	refuse.Store(true)
	f.client.PrependReactor("get", "namespaces", func(core.Action) (bool, runtime.Object, error) {
		if refuse.Load() {
			return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "namespaces"}, "default", errors.New("RBAC: access denied"))
		}
		return false, nil, nil
	})

	for _, p := range []*corev1.Pod{a, b} {
		f.process(keyOf(p))
		if got := f.c.queue.NumRequeues(keyOf(p)); got != 1 {
			t.Errorf("pod %s: %d retries after a failed read of its namespace, want 1 (held with backoff)", p.Name, got)
		}
	}
	checkActions(t, nil, f.writes())
	if got := f.namespaceGets(); got != 1 {
		t.Errorf("%d GETs of the namespace within a second, want 1", got)
	}
	if _, err := f.c.syncHandler(f.ctx, keyOf(a)); err == nil || !apierrors.IsForbidden(err) {
		t.Errorf("syncHandler with the namespace unreadable: err = %v, want the 403", err)
	}

	refuse.Store(false)
	f.clock.Step(namespacecontroller.Freshness)
	if err := wait.PollUntilContextTimeout(f.ctx, time.Millisecond, 5*time.Second, true,
		func(context.Context) (bool, error) { return f.c.queue.Len() == 2, nil }); err != nil {
		t.Fatalf("the held pods did not come back from their backoff: %d queued", f.c.queue.Len())
	}
	f.next()
	f.next()
	checkActions(t, []core.Action{deleteAction(a), deleteAction(b)}, sortedByName(f.writes()))
}

func sortedByName(actions []core.Action) []core.Action {
	slices.SortFunc(actions, func(x, y core.Action) int {
		return strings.Compare(x.(core.DeleteActionImpl).Name, y.(core.DeleteActionImpl).Name)
	})
	return actions
}

// TestFreshNamespaceLabelsDecide proves that the decision acted on is the
// one on the namespace as read: a rule that matches only by the cache's
// stale labels does not remove the pod, which is parked for the deadline of
// the rule that matches now.
func TestFreshNamespaceLabelsDecide(t *testing.T) {
	p, err := policy.Parse([]byte(`apiVersion: podjanitor.io/v1alpha1
kind: PodJanitorPolicy
rules:
- name: fast
  match: {namespaceSelector: "cleanup=fast"}
  clock: created
  after: 1h
- name: slow
  clock: created
  after: 3h
`))
	if err != nil {
		t.Fatal(err)
	}
	pod := apitest.Pod("job", t0.Add(-2*time.Hour), corev1.PodSucceeded, nil)
	f := newFixtureWithNamespaces(t, Options{Evaluator: &policy.Evaluator{Policy: p}}, []*corev1.Namespace{namespace("default", nil, nil)}, pod)
	f.staleNamespaces(namespace("default", map[string]string{"cleanup": "fast"}, nil))

	res, err := f.c.syncHandler(f.ctx, keyOf(pod))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(Result{RequeueAfter: time.Hour, parking: untilDeadline}, res, cmp.AllowUnexported(Result{})); diff != "" {
		t.Errorf("result (-want,+got):\n%s", diff)
	}
	checkActions(t, nil, f.writes())
}

// TestInvalidNamespaceKeepWarnsOncePerNamespace proves that a namespace keep
// value that does not parse is reported by one Warning on the Namespace, not
// one per pod it holds back; a new value is reported again.
func TestInvalidNamespaceKeepWarnsOncePerNamespace(t *testing.T) {
	var pods []*corev1.Pod
	for _, name := range []string{"a", "b", "c"} {
		pods = append(pods, apitest.Pod(name, t0.Add(-2*time.Hour), corev1.PodSucceeded, map[string]string{"podjanitor.io/ttl": "1h"}))
	}
	ns := namespace("default", nil, map[string]string{"podjanitor.io/keep": "maybe"})
	f := newFixtureWithNamespaces(t, Options{}, []*corev1.Namespace{ns}, pods...)

	warning := func(value string) string {
		return `Warning InvalidAnnotation Validate Not removing pods: namespace default: annotation podjanitor.io/keep="` + value +
			`": want "true" or "false" {kind=Namespace,apiVersion=v1}`
	}
	for _, p := range pods {
		f.process(keyOf(p))
		f.process(keyOf(p)) // decided again: still nothing new
	}
	if diff := cmp.Diff([]string{warning("maybe")}, f.events()); diff != "" {
		t.Errorf("events (-want,+got):\n%s", diff)
	}

	ns.Annotations["podjanitor.io/keep"] = "perhaps"
	f.updateNamespace(ns, false, true)
	for range pods {
		f.next()
	}
	if diff := cmp.Diff([]string{warning("perhaps")}, f.events()); diff != "" {
		t.Errorf("events after a new value (-want,+got):\n%s", diff)
	}
	checkActions(t, nil, f.writes())
}

// TestNamespaceInformerReportsItsRequests proves that the namespace
// informer's requests reach its watchHealth: a refused list makes it fail
// until a list succeeds.
func TestNamespaceInformerReportsItsRequests(t *testing.T) {
	client := metadatafake.NewSimpleMetadataClient(metadatafake.NewTestScheme())
	var refuse atomic.Bool
	refuse.Store(true)
	client.PrependReactor("list", "namespaces", func(core.Action) (bool, runtime.Object, error) {
		if refuse.Load() {
			return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "namespaces"}, "", errors.New("RBAC: access denied"))
		}
		return true, &metav1.List{ListMeta: metav1.ListMeta{ResourceVersion: "1"}}, nil
	})
	m := metrics.New(controllerName, "test", "test")
	_, ctx := ktesting.NewTestContext(t)
	h := namespacecontroller.NewWatchHealth(klog.FromContext(ctx), clock.RealClock{}, m.SetNamespaceWatchHealthy)
	informer, err := newNamespaceInformer(client, scopeFlags{}, h)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go informer.RunWithContext(ctx)
	if err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 10*time.Second, true,
		func(context.Context) (bool, error) { return h.Check() != nil, nil }); err != nil {
		t.Fatal("a refused list of namespaces did not make the namespace watch fail")
	}
	if got := metricValue(m, "podjanitor_namespace_watch_healthy"); got != 0 {
		t.Errorf("gauge = %v while the list is refused, want 0", got)
	}
	refuse.Store(false)
	if err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 20*time.Second, true,
		func(context.Context) (bool, error) { return informer.HasSynced() && h.Check() == nil, nil }); err != nil {
		t.Fatalf("the namespace watch did not recover once the list succeeded: %v", h.Check())
	}
}

// TestReadyzFollowsTheNamespaceWatch proves that /readyz fails, naming why,
// while the namespace watch fails.
func TestReadyzFollowsTheNamespaceWatch(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	var failing atomic.Bool
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	watchErr := func() error {
		if failing.Load() {
			return errors.New("namespace watch failing since 2026-11-29T12:00:00Z: forbidden")
		}
		return nil
	}
	if err := serveEndpoints(ctx, endpointsConfig{metricsAddr: "0", healthAddr: addr}, metrics.New(controllerName, "test", "test"), nil,
		func() bool { return true }, watchErr, make(chan error, 2)); err != nil {
		t.Fatal(err)
	}
	get := func() (int, string) {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	if code, body := get(); code != http.StatusOK {
		t.Errorf("/readyz = %d %q, want 200", code, body)
	}
	failing.Store(true)
	if code, body := get(); code != http.StatusServiceUnavailable || !strings.Contains(body, "namespace watch failing since") {
		t.Errorf("/readyz while the namespace watch fails = %d %q, want 503 saying why", code, body)
	}
}

// TestBacklogReadsEachNamespaceOncePerRemoval proves that a backlog over
// many namespaces reads each pod's namespace once, when its removal slot
// comes, not once when it is found due and again when its slot comes: the
// reads follow the removal cap (docs/operations.md, "Request budget").
func TestBacklogReadsEachNamespaceOncePerRemoval(t *testing.T) {
	var pods []*corev1.Pod
	for i := range 6 {
		p := apitest.Pod(fmt.Sprintf("p%d", i), t0.Add(-time.Hour), corev1.PodSucceeded, map[string]string{"podjanitor.io/ttl": "1m"})
		p.Namespace = fmt.Sprintf("ns-%d", i)
		pods = append(pods, p)
	}
	f := newFixtureWithNamespaces(t, Options{MaxRemovalsPerSecond: 1, RemovalBurst: 1}, nil, pods...)
	for _, p := range pods {
		f.process(keyOf(p))
	}
	f.stepUntilWritten(len(pods), 20, nil)
	if got := f.namespaceGets(); got != len(pods) {
		t.Errorf("%d namespace reads for %d removals in %d namespaces, want one each", got, len(pods), len(pods))
	}
}
