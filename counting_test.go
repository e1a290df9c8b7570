package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	metadatafake "k8s.io/client-go/metadata/fake"
	core "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2/ktesting"

	"github.com/podjanitor/podjanitor/internal/apitest"
	"github.com/podjanitor/podjanitor/internal/wave"
	"github.com/podjanitor/podjanitor/policy"
)

// keepTwoFailed keeps the two newest failed pods of each owner, and
// removes the others at once.
func keepTwoFailed(t *testing.T) *policy.Evaluator {
	t.Helper()
	p, err := policy.Parse([]byte(`apiVersion: podjanitor.io/v1alpha1
kind: PodJanitorPolicy
rules:
  - name: failed
    match: {phases: [Failed]}
    clock: finished
    after: 0s
    keepNewest: 2
`))
	if err != nil {
		t.Fatal(err)
	}
	return &policy.Evaluator{Policy: p}
}

// jobPod is a Failed pod of Job "nightly" that finished (as its creation
// tells: no container status) ago before t0.
func jobPod(name string, ago time.Duration) *corev1.Pod {
	pod := apitest.Pod(name, t0.Add(-ago), corev1.PodFailed, nil)
	pod.OwnerReferences = []metav1.OwnerReference{{Kind: "Job", Name: "nightly", UID: types.UID("uid-nightly"), Controller: new(true)}}
	return pod
}

// drain handles the keys in the queue until it is empty (at most limit).
func (f *fixture) drain(limit int) {
	f.t.Helper()
	for i := 0; f.c.queue.Len() > 0; i++ {
		if i == limit {
			f.t.Fatalf("the queue still holds %d keys after %d", f.c.queue.Len(), limit)
		}
		f.next()
	}
}

// TestKeepNewestRemovesWhatANewPodPushesOut: the workers place each pod as
// they decide it, whatever the order; the pod a newer one pushes out of the
// newest two is decided again and removed, and the newest two stay. A pod
// that comes later pushes the next one out.
func TestKeepNewestRemovesWhatANewPodPushesOut(t *testing.T) {
	pods := []*corev1.Pod{jobPod("run-1", 3*time.Minute), jobPod("run-2", 2*time.Minute), jobPod("run-3", time.Minute)}
	f := newFixture(t, Options{Evaluator: keepTwoFailed(t)}, pods...)
	for _, p := range pods { // oldest first: each is among the newest when decided
		f.c.queue.Add(keyOf(p))
	}
	f.drain(10)
	if got := f.deletedNames(); !slices.Equal(got, []string{"run-1"}) {
		t.Fatalf("deleted %v, want run-1 alone (pushed out by run-3)", got)
	}

	newest := jobPod("run-4", 0)
	if _, err := f.client.CoreV1().Pods("default").Create(f.ctx, newest, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.setPod(newest)
	f.process(keyOf(newest))
	f.drain(10)
	if got := f.deletedNames(); !slices.Equal(got, []string{"run-1", "run-2"}) {
		t.Fatalf("deleted %v, want run-1 then run-2 (pushed out by run-4)", got)
	}
}

// TestKeepNewestPodGoneLetsTheNextIn: a newer pod deleted (by someone
// else) before the pod it pushed out is removed brings that pod back among
// the newest: it is decided again and stays.
func TestKeepNewestPodGoneLetsTheNextIn(t *testing.T) {
	pods := []*corev1.Pod{jobPod("run-1", 3*time.Minute), jobPod("run-2", 2*time.Minute), jobPod("run-3", time.Minute)}
	f := newFixture(t, Options{Evaluator: keepTwoFailed(t)}, pods...)
	for _, p := range pods[1:] {
		f.process(keyOf(p))
	}
	f.process(keyOf(pods[0])) // run-1 is placed third: past the newest two
	if got := f.deletedNames(); !slices.Equal(got, []string{"run-1"}) {
		t.Fatalf("deleted %v, want run-1", got)
	}

	// Five pods; the newest is deleted by its owner between the decisions.
	more := []*corev1.Pod{jobPod("a-1", 9*time.Minute), jobPod("a-2", 8*time.Minute)}
	for _, p := range more {
		p.OwnerReferences[0].UID = "uid-other"
		if _, err := f.client.CoreV1().Pods("default").Create(f.ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		f.setPod(p)
	}
	third := jobPod("a-3", 7*time.Minute)
	third.OwnerReferences[0].UID = "uid-other"
	f.setPod(third)
	for _, p := range append(more, third) {
		f.process(keyOf(p))
	}
	// a-1 was pushed out by a-3 and waits in the queue; a-3 goes away.
	obj, _, _ := f.c.pods.GetByKey("default/a-3")
	if err := f.c.pods.Delete(obj); err != nil {
		t.Fatal(err)
	}
	f.c.unplace(obj)
	f.drain(10)
	if got := f.deletedNames(); slices.Contains(got, "a-1") || slices.Contains(got, "a-2") {
		t.Errorf("deleted %v: a-1 and a-2 are the newest two once a-3 is gone", got)
	}
}

// TestNoCountingRulesNoPlaces: without a rule that counts, no pod takes a
// place (the cost of a decision is one load more).
func TestNoCountingRulesNoPlaces(t *testing.T) {
	var pods []*corev1.Pod
	for i := range 5 {
		pods = append(pods, jobPod(fmt.Sprintf("p-%d", i), time.Duration(i)*time.Minute))
	}
	f := newFixture(t, Options{Evaluator: &policy.Evaluator{}}, pods...)
	for _, p := range pods {
		f.process(keyOf(p))
	}
	if !f.c.groups.Empty() {
		t.Error("pods took places without a rule that counts")
	}
}

// keepNewestEvaluator keeps the n newest failed pods of each owner, the
// others go at once.
func keepNewestEvaluator(t *testing.T, n int) *policy.Evaluator {
	t.Helper()
	e, err := policyEvaluator("podjanitor.io")([]byte(fmt.Sprintf(`apiVersion: podjanitor.io/v1alpha1
kind: PodJanitorPolicy
rules:
  - name: failed
    match: {phases: [Failed]}
    clock: finished
    after: 0s
    keepNewest: %d
`, n)))
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// TestLoweredKeepNewestIsHeld: a reload that lowers keepNewest from 100 to
// 3 over a Job of 30 failed pods drops 27 out of the newest at once: a
// wave, held; none goes until it is approved. Lowering it to 25 drops 5:
// no hold, they go.
func TestLoweredKeepNewestIsHeld(t *testing.T) {
	var pods []*corev1.Pod
	for i := range 30 {
		pods = append(pods, jobPod(fmt.Sprintf("run-%02d", i), time.Hour-time.Duration(i)*time.Minute))
	}
	f := newFixture(t, Options{
		Evaluator: keepNewestEvaluator(t, 100),
		Waves: &wave.Options{Threshold: wave.Threshold{Pods: 10}, Window: time.Minute,
			Record: wave.Record{Namespace: "podjanitor", Name: "podjanitor"}},
	}, pods...)
	f.c.opts.Waves.Record.Client = f.client
	for _, p := range pods {
		f.process(keyOf(p))
	}
	if n := f.deletes(); n != 0 {
		t.Fatalf("%d removed under keepNewest 100", n)
	}
	if err := f.c.SetEvaluator(keepNewestEvaluator(t, 3)); err != nil {
		t.Fatal(err)
	}
	h, ok := f.c.waves.Held()
	if !ok || h.Pods != 27 {
		t.Fatalf("held %+v, %v; want a hold of the 27 pods out of the newest 3", h, ok)
	}
	f.drain(100)
	if n := f.deletes(); n != 0 {
		t.Fatalf("%d pods removed of a held wave", n)
	}
}

// TestSmallKeepNewestChangeGoes: lowering keepNewest from 30 to 25 drops
// 5 pods out of the newest: under the threshold, no hold; those 5 go, the
// newest 25 stay.
func TestSmallKeepNewestChangeGoes(t *testing.T) {
	var pods []*corev1.Pod
	for i := range 30 {
		pods = append(pods, jobPod(fmt.Sprintf("run-%02d", i), time.Hour-time.Duration(i)*time.Minute))
	}
	f := newFixture(t, Options{
		Evaluator: keepNewestEvaluator(t, 30),
		Waves: &wave.Options{Threshold: wave.Threshold{Pods: 10}, Window: time.Minute,
			Record: wave.Record{Namespace: "podjanitor", Name: "podjanitor"}},
	}, pods...)
	f.c.opts.Waves.Record.Client = f.client
	for _, p := range pods {
		f.process(keyOf(p))
	}
	if err := f.c.SetEvaluator(keepNewestEvaluator(t, 25)); err != nil {
		t.Fatal(err)
	}
	if h, ok := f.c.waves.Held(); ok {
		t.Fatalf("held %+v: 5 pods are under the threshold", h)
	}
	f.drain(100)
	got := f.deletedNames()
	slices.Sort(got)
	if want := []string{"run-00", "run-01", "run-02", "run-03", "run-04"}; !slices.Equal(got, want) {
		t.Errorf("deleted %v, want the 5 oldest %v", got, want)
	}
}

// TestKeepNewestThroughCronJobs: with the Job metadata cache, a CronJob's
// runs (one Job and one failed pod each) count together: of 4 runs, the
// 2 oldest runs' pods go under keepNewest 2. A Job whose UID is not the
// cached one's (a Job created again) counts alone.
func TestKeepNewestThroughCronJobs(t *testing.T) {
	jobs := cache.NewSharedIndexInformer(&cache.ListWatch{}, &metav1.PartialObjectMetadata{}, 0, cache.Indexers{})
	cron := metav1.OwnerReference{APIVersion: "batch/v1", Kind: "CronJob", Name: "nightly", UID: "uid-cron", Controller: new(true)}
	var pods []*corev1.Pod
	for i := range 5 {
		name := fmt.Sprintf("nightly-%d", i)
		job := &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("uid-" + name),
			OwnerReferences: []metav1.OwnerReference{cron}}}
		if err := jobs.GetIndexer().Add(job); err != nil {
			t.Fatal(err)
		}
		pod := jobPod(name+"-pod", time.Duration(10-i)*time.Minute)
		pod.OwnerReferences[0].Name, pod.OwnerReferences[0].UID = name, job.UID
		pods = append(pods, pod)
	}
	pods[0].OwnerReferences[0].UID = "uid-recreated" // the oldest: its Job is not the cached one
	f := newFixture(t, Options{Evaluator: keepTwoFailed(t), Jobs: jobs}, pods...)
	for _, p := range pods {
		f.c.queue.Add(keyOf(p))
	}
	f.drain(20)
	got := f.deletedNames()
	slices.Sort(got)
	if want := []string{"nightly-1-pod", "nightly-2-pod"}; !slices.Equal(got, want) {
		t.Errorf("deleted %v, want %v: the CronJob's runs past the newest 2, not the pod whose Job is another", got, want)
	}
}

// TestJobReadsRefused: the Job reads are optional. A refused list (RBAC of
// an earlier release, an API server error) leaves plan without CronJobs:
// each Job's pods count alone (more kept, never fewer). The daemon's Job
// informer, refused, holds no Job (so jobController answers nil), and
// takes the Jobs once the list is allowed again.
func TestJobReadsRefused(t *testing.T) {
	for _, refusal := range []error{
		apierrors.NewForbidden(schema.GroupResource{Group: "batch", Resource: "jobs"}, "", errors.New("RBAC: access denied")),
		apierrors.NewServiceUnavailable("the API server is restarting"),
		apierrors.NewTooManyRequests("slow down", 1),
	} {
		cron := metav1.OwnerReference{APIVersion: "batch/v1", Kind: "CronJob", Name: "nightly", UID: "uid-cron", Controller: new(true)}
		job := &metav1.PartialObjectMetadata{TypeMeta: metav1.TypeMeta{APIVersion: "batch/v1", Kind: "Job"},
			ObjectMeta: metav1.ObjectMeta{Name: "nightly-1", Namespace: "default", UID: "uid-job", OwnerReferences: []metav1.OwnerReference{cron}}}
		scheme := metadatafake.NewTestScheme()
		scheme.AddKnownTypeWithName(schema.GroupVersionKind{Group: "batch", Version: "v1", Kind: "Job"}, &metav1.PartialObjectMetadata{})
		scheme.AddKnownTypeWithName(schema.GroupVersionKind{Group: "batch", Version: "v1", Kind: "JobList"}, &metav1.PartialObjectMetadataList{})
		client := metadatafake.NewSimpleMetadataClient(scheme, job)
		var refuse atomic.Bool
		refuse.Store(true)
		client.PrependReactor("list", "jobs", func(core.Action) (bool, runtime.Object, error) {
			if refuse.Load() {
				return true, nil, refusal
			}
			return false, nil, nil // the tracker's Jobs
		})
		_, ctx := ktesting.NewTestContext(t)
		ref := &metav1.OwnerReference{Kind: "Job", Name: "nightly-1", UID: "uid-job"}
		if controllers := listJobControllers(ctx, client, scopeFlags{}); controllers != nil {
			t.Errorf("%v: plan's Job list refused, yet it has controllers", refusal)
		}

		informer, err := newJobInformer(ctx, client, scopeFlags{})
		if err != nil {
			t.Fatal(err)
		}
		c := &Controller{jobs: informer.GetIndexer()}
		runCtx, cancel := context.WithCancel(ctx)
		go informer.RunWithContext(runCtx)
		time.Sleep(100 * time.Millisecond)
		if up := c.jobController("default", ref); up != nil || informer.HasSynced() {
			t.Errorf("%v: refused, the Job cache answers %v (synced %v)", refusal, up, informer.HasSynced())
		}
		refuse.Store(false)
		if err := wait.PollUntilContextTimeout(runCtx, 10*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
			return c.jobController("default", ref) != nil, nil
		}); err != nil {
			t.Errorf("%v: the Job cache did not take the Job once allowed", refusal)
		}
		if up := c.jobController("default", ref); up != nil && up.UID != cron.UID {
			t.Errorf("%v: controller %+v, want the CronJob", refusal, up)
		}
		if controllers := listJobControllers(ctx, client, scopeFlags{}); controllers == nil || controllers("default", ref) == nil {
			t.Errorf("%v: plan's Job list allowed, yet no CronJob", refusal)
		}
		cancel()
	}
}
