package main

import (
	"context"
	"fmt"
	"maps"
	"math"
	goruntime "runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	core "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/podjanitor/podjanitor/internal/apitest"
	"github.com/podjanitor/podjanitor/internal/metrics"
	"github.com/podjanitor/podjanitor/internal/namespacecontroller"
	"github.com/podjanitor/podjanitor/internal/podcache"
	"github.com/podjanitor/podjanitor/internal/tenantcontroller"
	"github.com/podjanitor/podjanitor/policy"
)

var (
	t0          = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	alwaysReady = func() bool { return true }
)

type fixture struct {
	t        *testing.T
	ctx      context.Context
	client   *fake.Clientset
	recorder *events.FakeRecorder
	clock    *testingclock.FakeClock
	c        *Controller
	metrics  *metrics.Metrics
}

// newFixture builds a controller over a fake clientset whose informer cache is
// preloaded with pods, with a fake clock at t0 driving the queue. The pods'
// namespaces exist, without labels or annotations.
func newFixture(t *testing.T, opts Options, pods ...*corev1.Pod) *fixture {
	t.Helper()
	return newFixtureWithNamespaces(t, opts, nil, pods...)
}

// newFixtureWithNamespaces is newFixture with exactly the namespaces given;
// nil means the pods' namespaces. The namespace informer runs on
// the fake clientset, so that namespace changes reach the controller.
func newFixtureWithNamespaces(t *testing.T, opts Options, namespaces []*corev1.Namespace, pods ...*corev1.Pod) *fixture {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	objs := make([]runtime.Object, 0, len(pods)+len(namespaces))
	for _, p := range pods {
		objs = append(objs, p)
	}
	seen := map[string]bool{}
	for _, ns := range namespaces {
		objs = append(objs, ns)
		seen[ns.Name] = true
	}
	for _, p := range pods {
		if namespaces == nil && !seen[p.Namespace] {
			objs = append(objs, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: p.Namespace}})
			seen[p.Namespace] = true
		}
	}
	f := &fixture{
		t:        t,
		ctx:      ctx,
		client:   fake.NewClientset(objs...),
		recorder: &events.FakeRecorder{Events: make(chan string, 100), Verbose: true}, // "type reason action note"
		clock:    testingclock.NewFakeClock(t0),
		metrics:  metrics.New(controllerName, "test", "test"),
	}
	if opts.Evaluator == nil {
		opts.Evaluator = &policy.Evaluator{}
	}
	opts.Metrics = f.metrics
	podInformer := cachedPodInformer(t, f.client, opts.Evaluator, pods)
	if indexers := podInformer.Informer().GetIndexer().GetIndexers(); len(indexers) != 1 || indexers[cache.NamespaceIndex] == nil {
		t.Fatalf("the pod cache keeps indexes %v, want the namespace index alone", slices.Collect(maps.Keys(indexers)))
	}
	nsFactory := informers.NewSharedInformerFactory(f.client, 0)
	namespaceInformer := nsFactory.Core().V1().Namespaces().Informer()
	c, err := NewController(ctx, podInformer, namespaceInformer, f.client, f.recorder, f.clock, opts)
	if err != nil {
		t.Fatal(err)
	}
	c.podsSynced = alwaysReady
	runCtx, cancel := context.WithCancel(ctx)
	nsFactory.Start(runCtx.Done())
	t.Cleanup(nsFactory.Shutdown)
	if !cache.WaitForCacheSync(runCtx.Done(), namespaceInformer.HasSynced) {
		t.Fatal("namespace cache did not sync")
	}
	done, redecided := make(chan struct{}), make(chan struct{})
	go func() { defer close(done); c.state.run(runCtx, c.feed.Add) }()
	rd := c.redecide // read here: a test may put its own in c.redecide (tenantwaves_test.go)
	go func() { defer close(redecided); rd.Run(runCtx) }()
	t.Cleanup(func() { cancel(); <-done; <-redecided; c.queue.ShutDown() })
	f.c = c
	f.client.ClearActions()
	return f
}

// cachedPodInformer is the pod informer of ev's annotation prefix, not
// started, with pods in its cache as its transform stores them.
func cachedPodInformer(tb testing.TB, client kubernetes.Interface, ev *policy.Evaluator, pods []*corev1.Pod) coreinformers.PodInformer {
	tb.Helper()
	prefix := strings.TrimSuffix(ev.AnnotationKey(""), "/")
	podInformer := informerFactory(client, scopeFlags{annotationPrefix: prefix}, nil).Core().V1().Pods()
	transform := podcache.PodTransform(prefix)
	for _, p := range pods {
		obj, err := transform(p.DeepCopy())
		if err != nil {
			tb.Fatal(err)
		}
		if err := podInformer.Informer().GetIndexer().Add(obj); err != nil {
			tb.Fatal(err)
		}
	}
	return podInformer
}

// process adds key to the queue and handles it once.
func (f *fixture) process(key cache.ObjectName) {
	f.t.Helper()
	f.c.queue.Add(key)
	f.next()
}

// next handles the key at the head of the queue.
func (f *fixture) next() {
	f.t.Helper()
	if f.c.queue.Len() == 0 {
		f.t.Fatal("queue is empty")
	}
	if !f.c.processNextWorkItem(f.ctx, f.ctx) {
		f.t.Fatal("processNextWorkItem stopped")
	}
}

// stepUntilWritten steps the fake clock a second at a time and handles the
// keys that come back, until n writes are made (at most limit seconds);
// check, when not nil, sees each second's end.
func (f *fixture) stepUntilWritten(n, limit int, check func(second int)) {
	f.t.Helper()
	for second := 1; len(f.writes()) < n; second++ {
		if second > limit {
			f.t.Fatalf("only %d of %d pods removed after %ds", len(f.writes()), n, limit)
		}
		if !f.stepAndWaitReady(time.Second) {
			f.t.Fatalf("second %d: no key came back after the reservation delay", second)
		}
		for f.c.queue.Len() > 0 {
			f.next()
		}
		if check != nil {
			check(second)
		}
	}
}

// waitReady steps the fake clock by d and says whether a key became ready.
// stepAndCheckReady steps the fake clock by d and reports whether a key is
// ready within 200 ms: for checks that nothing comes back.
func (f *fixture) stepAndCheckReady(d time.Duration) bool {
	f.t.Helper()
	return f.stepAndPoll(d, 200*time.Millisecond)
}

// stepAndWaitReady steps the fake clock by d and reports whether a key is
// ready within 5 s: for checks that one comes back, on a machine busy
// enough to leave the workqueue's goroutine unscheduled for a while.
func (f *fixture) stepAndWaitReady(d time.Duration) bool {
	f.t.Helper()
	return f.stepAndPoll(d, 5*time.Second)
}

func (f *fixture) stepAndPoll(d, within time.Duration) bool {
	f.t.Helper()
	// Step only once the parked keys' timer is armed: a step taken while it
	// is being armed would delay it by d.
	if err := wait.PollUntilContextTimeout(f.ctx, time.Millisecond, 5*time.Second, true,
		func(context.Context) (bool, error) { return f.c.state.settled(), nil }); err != nil {
		f.t.Fatal("the parked keys' timer was never armed")
	}
	// And once the workqueue's delaying loop has armed its own for the keys
	// just added with a backoff (AddRateLimited): it reads the clock, then
	// arms a timer for the head's readyAt from that reading, and a step in
	// between would leave the timer d past the key's time. Its timer is a
	// waiter of the fake clock; wait until their number holds still (which
	// narrows that window to the loop descheduled inside it for 3 ms).
	f.waitClockWaitersSettle()
	f.clock.Step(d)
	err := wait.PollUntilContextTimeout(f.ctx, time.Millisecond, within, true,
		func(context.Context) (bool, error) { return f.c.queue.Len() > 0, nil })
	return err == nil
}

// waitClockWaitersSettle waits until the fake clock's number of waiters
// has not changed over three polls a millisecond apart (at most a second).
func (f *fixture) waitClockWaitersSettle() {
	last, same := -1, 0
	for deadline := time.Now().Add(time.Second); same < 3 && time.Now().Before(deadline); {
		n := f.clock.Waiters()
		if n == last {
			same++
		} else {
			last, same = n, 0
		}
		time.Sleep(time.Millisecond)
	}
}

// writes returns the client's actions other than list, watch and reads of
// namespaces (namespaceReader): the writes, and the reads of pods before an
// eviction.
func (f *fixture) writes() []core.Action {
	var out []core.Action
	for _, a := range f.client.Actions() {
		namespaceRead := a.GetVerb() == "get" && a.GetResource().Resource == "namespaces"
		if !namespaceRead && a.GetVerb() != "list" && a.GetVerb() != "watch" {
			out = append(out, a)
		}
	}
	return out
}

func (f *fixture) events() []string {
	var out []string
	for {
		select {
		case e := <-f.recorder.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

// waitEvents returns the events recorded until n have come (or 5 s have
// passed), for events recorded after the write a test waits for.
func (f *fixture) waitEvents(n int) []string {
	out := f.events()
	timeout := time.After(5 * time.Second)
	for len(out) < n {
		select {
		case e := <-f.recorder.Events:
			out = append(out, e)
		case <-timeout:
			return out
		}
	}
	return append(out, f.events()...)
}

func keyOf(p *corev1.Pod) cache.ObjectName { return cache.MetaObjectToName(p) }

func deleteAction(p *corev1.Pod) core.Action {
	uid, rv := p.UID, p.ResourceVersion
	return core.NewDeleteActionWithOptions(schema.GroupVersionResource{Version: "v1", Resource: "pods"}, p.Namespace, p.Name,
		metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &rv}})
}

func checkActions(t *testing.T, want []core.Action, got []core.Action) {
	t.Helper()
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("unexpected client actions (-want,+got):\n%s", diff)
	}
}

func TestTTLPodIsParkedUntilDeadlineThenDeleted(t *testing.T) {
	pod := apitest.Pod("web", t0.Add(-10*time.Minute), corev1.PodPending, map[string]string{"podjanitor.io/ttl": "1h"})
	f := newFixture(t, Options{}, pod)

	res, err := f.c.syncHandler(f.ctx, keyOf(pod))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(Result{RequeueAfter: 50 * time.Minute, parking: untilDeadline}, res, cmp.AllowUnexported(Result{})); diff != "" {
		t.Errorf("result (-want,+got):\n%s", diff)
	}

	f.process(keyOf(pod))
	checkActions(t, nil, f.writes())
	if got := f.c.queue.Len(); got != 0 {
		t.Fatalf("queue length = %d, want 0 while the pod waits", got)
	}
	if got := metricValue(f.metrics, "podjanitor_pods_scheduled"); got != 1 {
		t.Errorf("pods_scheduled = %v, want 1", got)
	}
	if f.stepAndCheckReady(50*time.Minute - time.Millisecond) {
		t.Fatal("pod became ready before its deadline")
	}
	if !f.stepAndWaitReady(time.Millisecond) {
		t.Fatal("pod did not become ready at its deadline")
	}
	f.next()
	checkActions(t, []core.Action{deleteAction(pod)}, f.writes())
	// An event that was in flight when the pod was removed finds the stale pod in
	// the cache: no second API call.
	f.process(keyOf(pod))
	checkActions(t, []core.Action{deleteAction(pod)}, f.writes())
	if got := f.events(); len(got) != 1 || !strings.HasPrefix(got[0], "Normal LifetimeExpired Delete ") {
		t.Errorf("events = %q, want one Normal LifetimeExpired, action Delete", got)
	}
	if got := metricValue(f.metrics, "podjanitor_pods_scheduled"); got != 0 {
		t.Errorf("pods_scheduled = %v, want 0 after removal", got)
	}
	if got := metricValue(f.metrics, "podjanitor_pods_removed_total", "action", "delete", "reason", "ttl", "dry_run", "false"); got != 1 {
		t.Errorf("pods_removed_total = %v, want 1", got)
	}
}

func TestPodsThatMustNotBeRemoved(t *testing.T) {
	old := t0.Add(-24 * time.Hour)
	terminating := apitest.Pod("terminating", old, corev1.PodSucceeded, map[string]string{"podjanitor.io/ttl": "1s"})
	terminating.DeletionTimestamp = &metav1.Time{Time: t0}
	mirror := apitest.Pod("mirror", old, corev1.PodRunning, map[string]string{"podjanitor.io/ttl": "1s", corev1.MirrorPodAnnotationKey: "x"})
	tests := map[string]*corev1.Pod{
		"keep vetoes a due ttl":            apitest.Pod("kept", old, corev1.PodSucceeded, map[string]string{"podjanitor.io/ttl": "1s", "podjanitor.io/keep": "true"}),
		"no annotation, no policy":         apitest.Pod("plain", old, corev1.PodFailed, nil),
		"other prefix is not ours":         apitest.Pod("other", old, corev1.PodFailed, map[string]string{"example.com/ttl": "1s"}),
		"ttl-after-finished while running": apitest.Pod("running", old, corev1.PodRunning, map[string]string{"podjanitor.io/ttl-after-finished": "1s"}),
		"terminating":                      terminating,
		"mirror pod":                       mirror,
	}
	for name, pod := range tests {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t, Options{}, pod)
			f.process(keyOf(pod))
			checkActions(t, nil, f.writes())
			if f.c.queue.Len() != 0 || f.stepAndCheckReady(365*24*time.Hour) {
				t.Error("key was requeued, want it forgotten")
			}
		})
	}
}

func TestInvalidAnnotationWarnsAndIsNotRetried(t *testing.T) {
	pod := apitest.Pod("bad", t0.Add(-time.Hour), corev1.PodSucceeded, map[string]string{"podjanitor.io/ttl": "3x"})
	f := newFixture(t, Options{}, pod)
	f.process(keyOf(pod))

	checkActions(t, nil, f.writes())
	got := f.events()
	if len(got) != 1 || !strings.HasPrefix(got[0], "Warning InvalidAnnotation") || !strings.Contains(got[0], `podjanitor.io/ttl="3x"`) {
		t.Errorf("events = %q, want one Warning InvalidAnnotation naming the annotation and value", got)
	}
	if n := f.c.queue.NumRequeues(keyOf(pod)); n != 0 {
		t.Errorf("NumRequeues = %d, want 0 (terminal)", n)
	}
	if f.stepAndCheckReady(time.Hour) {
		t.Error("invalid pod was requeued")
	}
	if got := metricValue(f.metrics, "controller_runtime_terminal_reconcile_errors_total"); got != 1 {
		t.Errorf("terminal errors = %v, want 1", got)
	}
}

func TestConflictRequeuesAndDeletesNothingElse(t *testing.T) {
	pod := apitest.Pod("changed", t0.Add(-time.Hour), corev1.PodSucceeded, map[string]string{"podjanitor.io/ttl": "1m"})
	other := apitest.Pod("bystander", t0.Add(-time.Hour), corev1.PodSucceeded, nil)
	f := newFixture(t, Options{}, pod, other)
	f.client.PrependReactor("delete", "pods", func(core.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewConflict(schema.GroupResource{Resource: "pods"}, pod.Name, nil)
	})
	f.process(keyOf(pod))

	checkActions(t, []core.Action{deleteAction(pod)}, f.writes())
	if n := f.c.queue.NumRequeues(keyOf(pod)); n != 1 {
		t.Errorf("NumRequeues = %d, want 1 (requeued with backoff)", n)
	}
	if got := f.events(); len(got) != 0 {
		t.Errorf("events = %q, want none: nothing was removed", got)
	}
}

func TestDryRunRemovesNothing(t *testing.T) {
	pod := apitest.Pod("dry", t0.Add(-time.Hour), corev1.PodSucceeded, map[string]string{"podjanitor.io/ttl": "1m"})
	running := apitest.Pod("dry-running", t0.Add(-time.Hour), corev1.PodRunning, map[string]string{"podjanitor.io/ttl": "1m"})
	f := newFixture(t, Options{DryRun: true}, pod, running)
	f.process(keyOf(pod))
	f.process(keyOf(running))
	f.process(keyOf(pod)) // reported once per pod, not once per event

	checkActions(t, nil, f.writes())
	got := f.events()
	if len(got) != 2 || !strings.HasPrefix(got[0], "Normal WouldRemove") || !strings.HasPrefix(got[1], "Normal WouldRemove") {
		t.Errorf("events = %q, want two Normal WouldRemove", got)
	}
	if got := metricValue(f.metrics, "podjanitor_pods_removed_total", "action", "delete", "reason", "ttl", "dry_run", "true"); got != 1 {
		t.Errorf(`pods_removed_total{dry_run="true"} = %v, want 1`, got)
	}
}

func TestNoRemovalEventsKeepsWarnings(t *testing.T) {
	due := apitest.Pod("due", t0.Add(-time.Hour), corev1.PodSucceeded, map[string]string{"podjanitor.io/ttl": "1m"})
	bad := apitest.Pod("bad", t0.Add(-time.Hour), corev1.PodSucceeded, map[string]string{"podjanitor.io/ttl": "3x"})
	f := newFixture(t, Options{NoRemovalEvents: true}, due, bad)
	f.process(keyOf(due))
	f.process(keyOf(bad))

	checkActions(t, []core.Action{deleteAction(due)}, f.writes())
	got := f.events()
	if len(got) != 1 || !strings.HasPrefix(got[0], "Warning InvalidAnnotation") {
		t.Errorf("events = %q, want only the Warning InvalidAnnotation", got)
	}
	if got := metricValue(f.metrics, "podjanitor_pods_removed_total", "action", "delete", "reason", "ttl", "dry_run", "false"); got != 1 {
		t.Errorf("pods_removed_total = %v, want 1", got)
	}
}

func TestAPIErrorRetriesWithGrowingBackoff(t *testing.T) {
	pod := apitest.Pod("flaky", t0.Add(-time.Hour), corev1.PodFailed, map[string]string{"podjanitor.io/ttl": "1m"})
	f := newFixture(t, Options{}, pod)
	f.client.PrependReactor("delete", "pods", func(core.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewInternalError(context.DeadlineExceeded)
	})
	f.process(keyOf(pod))
	for attempt, delay := 1, 10*time.Millisecond; attempt <= 4; attempt, delay = attempt+1, delay*2 {
		if n := f.c.queue.NumRequeues(keyOf(pod)); n != attempt {
			t.Fatalf("NumRequeues = %d, want %d", n, attempt)
		}
		if f.stepAndCheckReady(delay - time.Millisecond) {
			t.Fatalf("attempt %d: retried before its backoff of %v", attempt, delay)
		}
		if !f.stepAndWaitReady(time.Millisecond) {
			t.Fatalf("attempt %d: not retried after its backoff of %v", attempt, delay)
		}
		f.next()
	}
	if got := len(f.writes()); got != 5 {
		t.Errorf("delete calls = %d, want 5", got)
	}
	if got := testutilValue(f.metrics, "delete", "unavailable"); got != 5 {
		t.Errorf("removal errors = %v, want 5", got)
	}
}

func TestPanicIsRecoveredAndRetried(t *testing.T) {
	pod := apitest.Pod("boom", t0.Add(-time.Hour), corev1.PodFailed, map[string]string{"podjanitor.io/ttl": "1m"})
	f := newFixture(t, Options{}, pod)
	f.client.PrependReactor("delete", "pods", func(core.Action) (bool, runtime.Object, error) { panic("boom") })
	f.process(keyOf(pod))

	if n := f.c.queue.NumRequeues(keyOf(pod)); n != 1 {
		t.Errorf("NumRequeues = %d, want 1", n)
	}
	if got := metricValue(f.metrics, "controller_runtime_reconcile_panics_total"); got != 1 {
		t.Errorf("panics = %v, want 1", got)
	}
}

func TestGonePodIsNoOp(t *testing.T) {
	gone := apitest.Pod("gone", t0.Add(-time.Hour), corev1.PodFailed, map[string]string{"podjanitor.io/ttl": "1m"})
	f := newFixture(t, Options{})
	f.c.enqueue(cache.DeletedFinalStateUnknown{Key: "default/gone", Obj: gone})
	if got := f.c.queue.Len(); got != 1 {
		t.Fatalf("queue length after tombstone = %d, want 1", got)
	}
	f.next()
	f.process(cache.ObjectName{Namespace: "default", Name: "never-existed"})
	checkActions(t, nil, f.writes())
	if f.c.queue.Len() != 0 || f.stepAndCheckReady(time.Hour) {
		t.Error("gone pod was requeued")
	}
}

func TestRunningPodIsEvicted(t *testing.T) {
	pod := apitest.Pod("svc", t0.Add(-time.Hour), corev1.PodRunning, map[string]string{"podjanitor.io/ttl": "1m"})
	f := newFixture(t, Options{}, pod)
	blocked := 0
	f.client.PrependReactor("create", "pods", func(a core.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "eviction" {
			return false, nil, nil
		}
		if blocked < 2 {
			blocked++
			return true, nil, apitest.DisruptionBudgetRefusal()
		}
		return true, nil, nil
	})
	f.process(keyOf(pod))
	for range 2 {
		if !f.stepAndWaitReady(time.Minute) {
			t.Fatal("blocked eviction was not retried")
		}
		f.next()
	}

	uid, rv := pod.UID, pod.ResourceVersion
	evict := core.CreateActionImpl{
		ActionImpl: core.ActionImpl{Namespace: "default", Verb: "create", Subresource: "eviction",
			Resource: schema.GroupVersionResource{Version: "v1", Resource: "pods"}},
		Object: &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: "default"},
			DeleteOptions: &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &rv}}},
	}
	get := getAction(pod)
	checkActions(t, []core.Action{get, evict, get, evict, get, evict}, f.writes())
	got := f.events()
	if len(got) != 2 || !strings.HasPrefix(got[0], "Normal EvictionBlocked") || !strings.HasPrefix(got[1], "Normal LifetimeExpired Evict ") {
		t.Errorf("events = %q, want one EvictionBlocked (not one per retry), then LifetimeExpired with action Evict", got)
	}
}

func TestRemovalRateLimitDelaysButNeverDrops(t *testing.T) {
	var pods []*corev1.Pod
	for _, name := range []string{"a", "b", "c", "d"} {
		pods = append(pods, apitest.Pod(name, t0.Add(-time.Hour), corev1.PodSucceeded, map[string]string{"podjanitor.io/ttl": "1m"}))
	}
	f := newFixture(t, Options{MaxRemovalsPerSecond: 1, RemovalBurst: 1}, pods...)
	for _, p := range pods {
		f.process(keyOf(p))
	}
	if got := len(f.writes()); got != 1 {
		t.Fatalf("deletes in the first instant = %d, want 1 (burst 1)", got)
	}
	// The three others wait for their slots: the backlog, 3 s at the cap.
	if w, s := metricValue(f.metrics, "podjanitor_pods_waiting_for_removal"), metricValue(f.metrics, "podjanitor_removal_backlog_seconds"); w != 3 || s != 3 {
		t.Errorf("waiting for removal %v, backlog %v s; want 3 and 3", w, s)
	}
	f.stepUntilWritten(len(pods), 10, func(second int) {
		if got := len(f.writes()); got > second+1 {
			t.Fatalf("after %ds: %d deletes, limit allows %d", second, got, second+1)
		}
	})
	var want []core.Action
	for _, p := range pods {
		want = append(want, deleteAction(p))
	}
	got := f.writes()
	if diff := cmp.Diff(len(want), len(got)); diff != "" {
		t.Errorf("deletes (-want,+got):\n%s", diff)
	}
	if w, s := metricValue(f.metrics, "podjanitor_pods_waiting_for_removal"), metricValue(f.metrics, "podjanitor_removal_backlog_seconds"); w != 0 || s != 0 {
		t.Errorf("after the backlog: waiting for removal %v, backlog %v s; want 0", w, s)
	}
}

// A pod parked for a far deadline and then deleted leaves nothing behind:
// memory follows the pods that exist, not the pods seen.
func TestDeletedPodsLeaveNoParkedKeys(t *testing.T) {
	const n = 20000
	f := newFixture(t, Options{})
	f.ctx = klog.NewContext(f.ctx, klog.Background()) // the test logger would keep every line
	indexer := f.c.pods
	heapInUse := func() uint64 {
		var m goruntime.MemStats
		goruntime.GC()
		goruntime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	before := heapInUse()
	for i := range n {
		pod := apitest.Pod(fmt.Sprintf("churn-%d", i), t0, corev1.PodRunning, map[string]string{"podjanitor.io/ttl": "7d"})
		if err := indexer.Add(pod); err != nil {
			t.Fatal(err)
		}
		f.process(keyOf(pod))
		if err := indexer.Delete(pod); err != nil {
			t.Fatal(err)
		}
		f.c.enqueue(pod) // the informer's DeleteFunc
		f.next()
	}
	after := heapInUse()
	if got := metricValue(f.metrics, "podjanitor_pods_scheduled"); got != 0 {
		t.Errorf("pods_scheduled = %v, want 0 with no pods left", got)
	}
	// The workqueue's delaying queue kept ~300 B per parked key until its
	// deadline, whether the pod existed or not: ~6 MB here.
	if grown := int64(after) - int64(before); grown > n*50 {
		t.Errorf("heap grew by %d bytes (%d per deleted pod) after %d pods came and went, want no per-pod remains", grown, grown/n, n)
	}
	checkActions(t, nil, f.writes())
}

// After an outage, a due pod is retried within transientBackoffMax however
// often it failed, so that it goes within seconds of the API server's return.
func TestTransientErrorsRetryWithinTenSeconds(t *testing.T) {
	pod := apitest.Pod("outage", t0.Add(-time.Hour), corev1.PodFailed, map[string]string{"podjanitor.io/ttl": "1m"})
	f := newFixture(t, Options{}, pod)
	down := true
	f.client.PrependReactor("delete", "pods", func(core.Action) (bool, runtime.Object, error) {
		if down {
			return true, nil, apierrors.NewServiceUnavailable("the API server is shutting down")
		}
		return false, nil, nil
	})
	f.process(keyOf(pod))
	for range 30 { // an outage long enough that an uncapped backoff reaches minutes
		if !f.stepAndWaitReady(transientBackoffMax) {
			t.Fatalf("after %d failures the pod was not retried within %v", f.c.queue.NumRequeues(keyOf(pod)), transientBackoffMax)
		}
		f.next()
	}
	down = false
	if !f.stepAndWaitReady(transientBackoffMax) {
		t.Fatal("not retried after the API server came back")
	}
	f.next()
	if got := len(f.writes()); got != 32 {
		t.Errorf("delete calls = %d, want 32", got)
	}
	if !f.c.state.wasRemoved(keyOf(pod), pod.UID) {
		t.Error("pod not removed after recovery")
	}
}

// A 404 from a removal call does not make podjanitor forget a pod that its
// informer still has: the 404 may come from a proxy, not from the pod.
func TestNotFoundFromTheAPIIsRetriedWhileTheInformerHasThePod(t *testing.T) {
	pod := apitest.Pod("still-there", t0.Add(-time.Hour), corev1.PodFailed, map[string]string{"podjanitor.io/ttl": "1m"})
	f := newFixture(t, Options{}, pod)
	notFound := 1
	f.client.PrependReactor("delete", "pods", func(core.Action) (bool, runtime.Object, error) {
		if notFound > 0 {
			notFound--
			return true, nil, apierrors.NewNotFound(schema.GroupResource{Resource: "pods"}, pod.Name)
		}
		return false, nil, nil
	})
	f.process(keyOf(pod))
	if f.c.state.wasRemoved(keyOf(pod), pod.UID) {
		t.Fatal("a 404 counted as a removal")
	}
	if got := f.events(); len(got) != 0 {
		t.Errorf("events = %q, want none after a 404", got)
	}
	if !f.stepAndWaitReady(transientBackoffMax) {
		t.Fatal("pod was forgotten after a 404 while the informer still has it")
	}
	f.next()
	checkActions(t, []core.Action{deleteAction(pod), deleteAction(pod)}, f.writes())
	if !f.c.state.wasRemoved(keyOf(pod), pod.UID) {
		t.Error("pod not removed on the retry")
	}
	if got := testutilValue(f.metrics, "delete", "not_found"); got != 1 {
		t.Errorf(`removal_errors_total{error="not_found"} = %v, want 1`, got)
	}
}

// Evictions refused by a PodDisruptionBudget wait 5 s, then longer, up to
// 5 min: not the transient backoff, which would hammer the API server.
func TestDisruptionBudgetRefusalsBackOffSlowly(t *testing.T) {
	pod := apitest.Pod("guarded", t0.Add(-time.Hour), corev1.PodRunning, map[string]string{"podjanitor.io/ttl": "1m"})
	f := newFixture(t, Options{}, pod)
	f.client.PrependReactor("create", "pods", func(a core.Action) (bool, runtime.Object, error) {
		return a.GetSubresource() == "eviction", nil, apitest.DisruptionBudgetRefusal()
	})
	f.process(keyOf(pod))
	for _, wait := range []time.Duration{5 * time.Second, 10 * time.Second, 20 * time.Second, 40 * time.Second} {
		if f.stepAndCheckReady(wait - time.Millisecond) {
			t.Fatalf("retried before %v", wait)
		}
		if !f.stepAndWaitReady(time.Millisecond) {
			t.Fatalf("not retried after %v", wait)
		}
		f.next()
	}
	if got := f.events(); len(got) != 1 || !strings.HasPrefix(got[0], "Normal EvictionBlocked") {
		t.Errorf("events = %q, want one EvictionBlocked", got)
	}
	if got := testutilValue(f.metrics, "evict", "disruption_budget"); got != 5 {
		t.Errorf(`removal_errors_total{error="disruption_budget"} = %v, want 5`, got)
	}
}

// Keys over the removal cap wait for the slot reserved for them and wake once:
// draining a backlog costs work per removal, not per removal and waiting key.
func TestRemovalCapWakesEachKeyOnce(t *testing.T) {
	const n = 200
	var pods []*corev1.Pod
	for i := range n {
		pods = append(pods, apitest.Pod(fmt.Sprintf("backlog-%d", i), t0.Add(-time.Hour), corev1.PodSucceeded, map[string]string{"podjanitor.io/ttl": "1m"}))
	}
	f := newFixture(t, Options{MaxRemovalsPerSecond: 10, RemovalBurst: 1, NoRemovalEvents: true}, pods...)
	for _, p := range pods {
		f.process(keyOf(p))
	}
	syncs := n
	for len(f.writes()) < n {
		if !f.stepAndWaitReady(100 * time.Millisecond) {
			t.Fatalf("no key came back; %d of %d removed", len(f.writes()), n)
		}
		for f.c.queue.Len() > 0 {
			f.next()
			syncs++
		}
		if elapsed := f.clock.Since(t0); len(f.writes()) > int(elapsed.Seconds()*10)+1 {
			t.Fatalf("%d removals after %v exceed the cap", len(f.writes()), elapsed)
		}
	}
	if syncs > 2*n {
		t.Errorf("%d syncs to remove %d pods under the cap, want at most %d (each waiting key woken once)", syncs, n, 2*n)
	}
}

// A key waiting for a removal token gives it back when its pod no longer
// needs it, so the next pod in line does not wait for a slot nobody uses.
func TestUnusedRemovalTokenIsGivenBack(t *testing.T) {
	a := apitest.Pod("a", t0.Add(-time.Hour), corev1.PodSucceeded, map[string]string{"podjanitor.io/ttl": "1m"})
	b := apitest.Pod("b", t0.Add(-time.Hour), corev1.PodSucceeded, map[string]string{"podjanitor.io/ttl": "1m"})
	f := newFixture(t, Options{MaxRemovalsPerSecond: 1, RemovalBurst: 1}, a, b)
	f.process(keyOf(a)) // takes the burst
	f.process(keyOf(b)) // reserves the slot at +1s and waits
	kept := a.DeepCopy()
	kept.Name, kept.UID = "b", b.UID
	kept.Annotations = map[string]string{"podjanitor.io/ttl": "1m", "podjanitor.io/keep": "true"}
	if err := f.c.pods.Update(kept); err != nil {
		t.Fatal(err)
	}
	f.process(keyOf(b))                   // kept now: gives the slot back
	if got := f.c.state.len(); got != 1 { // a's removed mark
		t.Errorf("state entries = %d, want 1", got)
	}
	c := apitest.Pod("c", t0.Add(-time.Hour), corev1.PodSucceeded, map[string]string{"podjanitor.io/ttl": "1m"})
	if err := f.c.pods.Add(c); err != nil {
		t.Fatal(err)
	}
	f.clock.Step(time.Second)
	f.process(keyOf(c))
	checkActions(t, []core.Action{deleteAction(a), deleteAction(c)}, f.writes())
}

// Deadlines hold in the API server's time: with this machine's clock 30 s
// ahead, a pod whose ttl ends in 10 s of API-server time is not removed now.
func TestDeadlinesHoldInTheAPIServersTime(t *testing.T) {
	// t0 is this machine's time; the API server's is 30 s behind, so the pod,
	// created at t0-50s in the API server's time, is 20 s old.
	pod := apitest.Pod("skewed", t0.Add(-50*time.Second), corev1.PodFailed, map[string]string{"podjanitor.io/ttl": "1m"})
	f := newFixture(t, Options{ClockOffset: func() time.Duration { return -30 * time.Second }}, pod)
	f.process(keyOf(pod))
	checkActions(t, nil, f.writes())
	if f.stepAndCheckReady(40*time.Second - time.Millisecond) {
		t.Fatal("pod came due before its deadline in the API server's time")
	}
	if !f.stepAndWaitReady(time.Millisecond) {
		t.Fatal("pod did not come due at its deadline in the API server's time")
	}
	f.next()
	checkActions(t, []core.Action{deleteAction(pod)}, f.writes())
}

// testutilValue is podjanitor_removal_errors_total{action, error=kind}.
func testutilValue(m *metrics.Metrics, action, kind string) float64 {
	return metricValue(m, "podjanitor_removal_errors_total", "action", action, "error", kind)
}

// metricValue is the value of the series name in m's registry whose labels
// include labels (name, value, ...); NaN when there is none.
func metricValue(m *metrics.Metrics, name string, labels ...string) float64 {
	families, err := m.Registry.Gather()
	if err != nil {
		return math.NaN()
	}
	for _, family := range families {
		if family.GetName() != name {
			continue
		}
	series:
		for _, metric := range family.GetMetric() {
			have := map[string]string{}
			for _, l := range metric.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for i := 0; i+1 < len(labels); i += 2 {
				if have[labels[i]] != labels[i+1] {
					continue series
				}
			}
			switch {
			case metric.GetCounter() != nil:
				return metric.GetCounter().GetValue()
			case metric.GetGauge() != nil:
				return metric.GetGauge().GetValue()
			}
		}
	}
	return math.NaN()
}

// A parked pod wakes at its deadline in the API server's time as estimated
// now, not as estimated when it was parked: the first estimate of the offset
// can be up to a second below the truth until it is calibrated.
func TestParkedDeadlinesFollowTheClockOffset(t *testing.T) {
	var offset atomic.Int64
	pod := apitest.Pod("parked", t0, corev1.PodFailed, map[string]string{"podjanitor.io/ttl": "1m"})
	f := newFixture(t, Options{ClockOffset: func() time.Duration { return time.Duration(offset.Load()) }}, pod)
	f.process(keyOf(pod))
	offset.Store(int64(900 * time.Millisecond)) // the server's clock turns out to be 0.9 s ahead
	f.c.ClockOffsetChanged()
	if f.stepAndCheckReady(59*time.Second + 100*time.Millisecond - time.Millisecond) {
		t.Fatal("pod came due before its deadline in the API server's time")
	}
	if !f.stepAndWaitReady(time.Millisecond) {
		t.Fatal("pod did not come due at its deadline in the API server's time as now estimated")
	}
}

// tenantsOf is c's tenant policy controller (SetTenantPolicies); nil when
// c honours none.
func tenantsOf(c *Controller) *tenantcontroller.Controller {
	t, _ := c.tenants.(*tenantcontroller.Controller)
	return t
}

// namespacesOf is c's namespace controller.
func namespacesOf(c *Controller) *namespacecontroller.Controller {
	return c.namespaces.(*namespacecontroller.Controller)
}

// tenantPolicy is what c's tenant policy controller made of the policy of key.
func tenantPolicy(c *Controller, key string) tenantcontroller.Seen {
	s, _ := tenantsOf(c).Policy(key)
	return s
}
