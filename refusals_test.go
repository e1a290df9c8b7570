package main

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	core "k8s.io/client-go/testing"

	"github.com/podjanitor/podjanitor/internal/apitest"
	"github.com/podjanitor/podjanitor/internal/removalerrors"
	"github.com/podjanitor/podjanitor/policy"
)

// getAction is the read of a pod from the API server before its eviction.
func getAction(p *corev1.Pod) core.Action {
	return core.NewGetAction(schema.GroupVersionResource{Version: "v1", Resource: "pods"}, p.Namespace, p.Name)
}

// evictAction is an eviction guarded by the pod's UID and resourceVersion.
func evictAction(p *corev1.Pod) core.Action {
	uid, rv := p.UID, p.ResourceVersion
	return core.CreateActionImpl{
		ActionImpl: core.ActionImpl{Namespace: p.Namespace, Verb: "create", Subresource: "eviction",
			Resource: schema.GroupVersionResource{Version: "v1", Resource: "pods"}},
		Object: &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace},
			DeleteOptions: &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &rv}}},
	}
}

// refusingEvictions makes every eviction answer err, and counts them.
func refusingEvictions(f *fixture, err func() error) *int {
	n := new(int)
	f.client.PrependReactor("create", "pods", func(a core.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "eviction" {
			return false, nil, nil
		}
		*n++
		return true, nil, err()
	})
	return n
}

// A pod under two PodDisruptionBudgets can never be evicted: its refusal
// backs off slowly (not the transient 10 s cap), is reported once by a
// Warning, is counted as multiple_budgets, and is never turned into a delete.
func TestMultipleBudgetsRefusalBacksOffSlowlyAndWarnsOnce(t *testing.T) {
	pod := apitest.Pod("two-budgets", t0.Add(-time.Hour), corev1.PodRunning, map[string]string{"podjanitor.io/ttl": "1m"})
	f := newFixture(t, Options{}, pod)
	evictions := refusingEvictions(f, apitest.MultipleBudgetsRefusal)
	f.process(keyOf(pod))
	for _, wait := range []time.Duration{5 * time.Second, 10 * time.Second, 20 * time.Second, 40 * time.Second} {
		if f.stepAndCheckReady(wait - time.Millisecond) {
			t.Fatalf("retried before %v: a pod under two budgets is not a transient failure", wait)
		}
		if !f.stepAndWaitReady(time.Millisecond) {
			t.Fatalf("not retried after %v", wait)
		}
		f.next()
	}
	if *evictions != 5 {
		t.Errorf("evictions = %d, want 5", *evictions)
	}
	for _, a := range f.writes() {
		if a.GetVerb() == "delete" {
			t.Fatalf("the pod was deleted instead of evicted: %v", a)
		}
	}
	got := f.events()
	if len(got) != 1 || !strings.HasPrefix(got[0], "Warning EvictionBlocked Evict ") || !strings.Contains(got[0], "more than one PodDisruptionBudget") {
		t.Errorf("events = %q, want one Warning EvictionBlocked naming the two budgets", got)
	}
	if got := testutilValue(f.metrics, "evict", removalerrors.MultipleBudgets); got != 5 {
		t.Errorf(`removal_errors_total{error="multiple_budgets"} = %v, want 5`, got)
	}
}

// One event per pod and kind of refusal: a pod first refused by admission,
// then by a PodDisruptionBudget, gets one event for each.
func TestRefusalsAreReportedOncePerKind(t *testing.T) {
	pod := apitest.Pod("guarded", t0.Add(-time.Hour), corev1.PodRunning, map[string]string{"podjanitor.io/ttl": "1m"})
	f := newFixture(t, Options{}, pod)
	answers := []func() error{apitest.WebhookDenial, apitest.WebhookDenial, apitest.DisruptionBudgetRefusal, apitest.DisruptionBudgetRefusal, apitest.WebhookDenial}
	refusingEvictions(f, func() error { e := answers[0]; answers = answers[1:]; return e() })
	f.process(keyOf(pod))
	for len(answers) > 0 {
		if !f.stepAndWaitReady(refusalBackoffMax) {
			t.Fatal("refused pod was not retried")
		}
		f.next()
	}
	got := f.events()
	if len(got) != 2 || !strings.HasPrefix(got[0], "Warning RemovalRefused Evict ") || !strings.Contains(got[0], "deny-delete.example.com") ||
		!strings.HasPrefix(got[1], "Normal EvictionBlocked Evict ") {
		t.Errorf("events = %q, want one Warning RemovalRefused, then one Normal EvictionBlocked", got)
	}
	if got := testutilValue(f.metrics, "evict", removalerrors.AdmissionDenied); got != 3 {
		t.Errorf(`removal_errors_total{error="admission_denied"} = %v, want 3`, got)
	}
}

// The retries of refused removals take no removal token that due pods need:
// under a cap of 1/s, a refused pod retried just before due pods come does
// not make them wait, and a retry that finds the tokens reserved by waiting
// pods does not queue behind them, ahead of pods yet to come. Once its
// removal passes, it pays for a token like any removal.
func TestRefusedRetriesTakeNoRemovalTokens(t *testing.T) {
	const ttl = "podjanitor.io/ttl"
	due := func(name string, at time.Duration) *corev1.Pod { // deleted at t0+at
		return apitest.Pod(name, t0.Add(-time.Hour+at), corev1.PodSucceeded, map[string]string{ttl: "1h"})
	}
	refused := apitest.Pod("refused", t0.Add(-time.Hour), corev1.PodRunning, map[string]string{ttl: "1m"})
	a, b := due("a", 6*time.Second), due("b", 6*time.Second) // creation times are whole seconds
	d, e := due("d", 15*time.Second), due("e", 15*time.Second)
	g := due("g", 16*time.Second)
	f := newFixture(t, Options{MaxRemovalsPerSecond: 1, RemovalBurst: 1, NoRemovalEvents: true}, refused, a, b, d, e, g)
	refusing, evictions := true, 0
	f.client.PrependReactor("create", "pods", func(act core.Action) (bool, runtime.Object, error) {
		if act.GetSubresource() != "eviction" {
			return false, nil, nil
		}
		evictions++
		if refusing {
			return true, nil, apitest.MultipleBudgetsRefusal()
		}
		return true, nil, nil
	})
	deleted := func() (n int) {
		for _, act := range f.writes() {
			if act.GetVerb() == "delete" {
				n++
			}
		}
		return n
	}
	step := func(to time.Duration, wantDeleted, wantEvictions int, why string) {
		t.Helper()
		f.stepAndCheckReady(to - f.clock.Since(t0))
		for f.c.queue.Len() > 0 {
			f.next()
		}
		if got := deleted(); got != wantDeleted {
			t.Fatalf("t0+%v: %d pods deleted, want %d: %s", f.clock.Since(t0), got, wantDeleted, why)
		}
		if evictions != wantEvictions {
			t.Fatalf("t0+%v: %d evictions tried, want %d", f.clock.Since(t0), evictions, wantEvictions)
		}
	}

	for _, p := range []*corev1.Pod{a, b, d, e, g} {
		f.process(keyOf(p)) // parked until their deadlines
	}
	// t0+0.5s: the refused pod's first attempt takes the token (podjanitor
	// cannot know it will be refused), and waits 5 s.
	f.clock.Step(500 * time.Millisecond)
	f.process(keyOf(refused))
	step(500*time.Millisecond, 0, 1, "")
	step(5500*time.Millisecond, 0, 2, "")                                     // refused again, with the token that came back; waits 10 s
	step(6*time.Second, 1, 2, "a waits for the token the refused retry took") // a goes, b waits for t0+7s
	step(7*time.Second, 2, 2, "b did not go at its slot")
	step(15*time.Second, 3, 2, "d did not take the full bucket") // d goes, e waits for t0+16s
	step(15500*time.Millisecond, 3, 2, "")                       // the retry finds the bucket owed to e: waits, reserves nothing
	step(16*time.Second, 4, 2, "e did not go at its slot")       // e goes, g waits for t0+17s
	step(17*time.Second, 5, 2, "g waits behind the refused pod's retry")

	// The budgets are fixed: the next retry passes, and pays for its token.
	refusing = false
	for i := 0; !f.c.state.wasRemoved(keyOf(refused), refused.UID); i++ {
		if i > 10 {
			t.Fatal("the refused pod was not evicted once its eviction could pass")
		}
		f.stepAndCheckReady(time.Second)
		for f.c.queue.Len() > 0 {
			f.next()
		}
	}
	if tokens := f.c.limiter.TokensAt(f.clock.Now()); tokens > 0.001 {
		t.Errorf("tokens left = %v right after the eviction passed, want 0: it did not pay for its token", tokens)
	}
}

// An eviction is decided again on the pod read from the API server: the
// Eviction API drops the resourceVersion precondition of a pod that is not
// Ready, so a keep added since the cache was filled must be seen before.
func TestEvictionDecidesAgainOnTheFreshPod(t *testing.T) {
	const ttl, keepKey = "podjanitor.io/ttl", "podjanitor.io/keep"
	tests := map[string]struct {
		change  func(*corev1.Pod) // what the API server has that the cache does not
		evicted bool
		parked  time.Duration // > 0: parked for this long
	}{
		"keep added":       {change: func(p *corev1.Pod) { p.Annotations[keepKey] = "true" }},
		"ttl removed":      {change: func(p *corev1.Pod) { delete(p.Annotations, ttl) }},
		"ttl raised":       {change: func(p *corev1.Pod) { p.Annotations[ttl] = "2h" }, parked: time.Hour},
		"invalid ttl":      {change: func(p *corev1.Pod) { p.Annotations[ttl] = "soon" }},
		"terminating":      {change: func(p *corev1.Pod) { p.DeletionTimestamp = &metav1.Time{Time: t0} }},
		"status changed":   {change: func(p *corev1.Pod) { p.Status.Reason = "whatever" }, evicted: true},
		"replaced":         {change: func(p *corev1.Pod) { p.UID = "uid-other" }},
		"other annotation": {change: func(p *corev1.Pod) { p.Annotations["example.com/x"] = "y" }, evicted: true},
		"label dropped":    {change: func(p *corev1.Pod) { delete(p.Labels, "race") }}, // --label-selector race=yes
		"other label":      {change: func(p *corev1.Pod) { p.Labels["x"] = "y" }, evicted: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			cached := apitest.Pod("web", t0.Add(-time.Hour), corev1.PodRunning, map[string]string{ttl: "1m"})
			cached.Labels = map[string]string{"race": "yes"}
			f := newFixture(t, Options{PodSelector: labels.SelectorFromSet(labels.Set{"race": "yes"})}, cached)
			fresh := cached.DeepCopy()
			tc.change(fresh)
			fresh.ResourceVersion = "8"
			if err := f.client.Tracker().Update(schema.GroupVersionResource{Version: "v1", Resource: "pods"}, fresh, fresh.Namespace); err != nil {
				t.Fatal(err)
			}
			f.process(keyOf(cached))
			want := []core.Action{getAction(cached)}
			if tc.evicted {
				want = append(want, evictAction(fresh)) // guarded by what was read
			}
			checkActions(t, want, f.writes())
			if removed := f.c.state.wasRemoved(keyOf(cached), cached.UID); removed != tc.evicted {
				t.Errorf("removed = %v, want %v", removed, tc.evicted)
			}
			if tc.parked > 0 {
				if f.stepAndCheckReady(tc.parked - time.Millisecond) {
					t.Error("woke before the fresh deadline")
				}
				if !f.stepAndWaitReady(time.Millisecond) {
					t.Error("not parked until the fresh deadline")
				}
			} else if !tc.evicted && f.stepAndCheckReady(refusalBackoffMax) {
				t.Error("retried: the informer brings the change, and decides the pod again")
			}
		})
	}
}

// A failed read before an eviction is sorted like a failed removal: a 404
// does not make podjanitor forget a pod its informer still has, and the
// pod is neither evicted nor deleted meanwhile.
func TestFreshReadFailureIsRetried(t *testing.T) {
	pod := apitest.Pod("web", t0.Add(-time.Hour), corev1.PodRunning, map[string]string{"podjanitor.io/ttl": "1m"})
	f := newFixture(t, Options{}, pod)
	failures := []error{
		apierrors.NewNotFound(schema.GroupResource{Resource: "pods"}, pod.Name),
		apierrors.NewServiceUnavailable("the API server is shutting down"),
	}
	f.client.PrependReactor("get", "pods", func(core.Action) (bool, runtime.Object, error) {
		if len(failures) == 0 {
			return false, nil, nil
		}
		err := failures[0]
		failures = failures[1:]
		return true, nil, err
	})
	f.process(keyOf(pod))
	for range 2 {
		if !f.stepAndWaitReady(transientBackoffMax) {
			t.Fatal("pod was not retried after a failed read")
		}
		f.next()
	}
	checkActions(t, []core.Action{getAction(pod), getAction(pod), getAction(pod), evictAction(pod)}, f.writes())
	if got := testutilValue(f.metrics, "evict", removalerrors.NotFound); got != 1 {
		t.Errorf(`removal_errors_total{error="not_found"} = %v, want 1`, got)
	}
	if !f.c.state.wasRemoved(keyOf(pod), pod.UID) {
		t.Error("pod not evicted once the read succeeded")
	}
}

// A crash-looping pod's status is written again at every restart while the
// times its clock counts from stay. The pod read afresh before its eviction
// keeps the status time of the cached version with the same clocks, as the
// informer's own transform does: counted from the latest write, it would
// never be due (the fresh decision parks it, the cache says due again, ...).
func TestFreshReadKeepsTheCachedStatusTime(t *testing.T) {
	rule, err := policy.NewPolicy(policy.Rule{Name: "crash", Clock: policy.ClockCrashLooping, After: 20 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	crashLooping := func(restarts int32, written time.Time) *corev1.Pod {
		p := apitest.Pod("web", t0.Add(-2*time.Hour), corev1.PodRunning, nil)
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionFalse,
			LastTransitionTime: metav1.NewTime(t0.Add(-time.Hour))}}
		p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "app", RestartCount: restarts,
			State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}}}}
		p.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubelet", Operation: metav1.ManagedFieldsOperationUpdate,
			Subresource: "status", Time: &metav1.Time{Time: written}}}
		return p
	}
	cached := crashLooping(5, t0.Add(-time.Hour))
	f := newFixture(t, Options{Evaluator: &policy.Evaluator{Policy: rule}}, cached)
	fresh := crashLooping(6, t0.Add(-time.Minute)) // restarted again a minute ago
	fresh.ResourceVersion = "8"
	// Replaced in the tracker rather than updated: an update would manage the fields anew.
	gvr := schema.GroupVersionResource{Version: "v1", Resource: "pods"}
	if err := f.client.Tracker().Delete(gvr, fresh.Namespace, fresh.Name); err != nil {
		t.Fatal(err)
	}
	if err := f.client.Tracker().Add(fresh); err != nil {
		t.Fatal(err)
	}
	if got, err := f.client.Tracker().Get(gvr, fresh.Namespace, fresh.Name); err != nil || len(got.(*corev1.Pod).ManagedFields) != 1 {
		t.Fatalf("the API server's pod has no status write time: %v, %v", got, err)
	}
	f.process(keyOf(cached))
	checkActions(t, []core.Action{getAction(cached), evictAction(fresh)}, f.writes())
	if !f.c.state.wasRemoved(keyOf(cached), cached.UID) {
		t.Error("crash-looping pod not evicted: the fresh read restarted its clock at the latest status write")
	}
}

// A removal call that hangs is cut off at the write timeout and retried.
func TestHungRemovalCallTimesOut(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(release)
	pod := apitest.Pod("hung", t0.Add(-time.Hour), corev1.PodFailed, map[string]string{"podjanitor.io/ttl": "1m"})
	f := newFixture(t, Options{WriteTimeout: 200 * time.Millisecond}, pod)
	f.c.client = kubernetes.NewForConfigOrDie(&rest.Config{Host: srv.URL})
	start := time.Now()
	d := policy.Decision{Deadline: t0, Action: policy.ActionDelete, Reason: policy.ReasonTTL}
	_, err := f.c.removePod(f.ctx, pod, d)
	if err == nil || removalerrors.KindOf(err) != removalerrors.Timeout {
		t.Fatalf("err = %v, want a timeout", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("the call took %v, want it cut off near the 200ms write timeout", took)
	}
	if got := testutilValue(f.metrics, "delete", removalerrors.Timeout); got != 1 {
		t.Errorf(`removal_errors_total{error="timeout"} = %v, want 1`, got)
	}
}
