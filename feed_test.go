package main

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	core "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/podjanitor/podjanitor/internal/apitest"
	"github.com/podjanitor/podjanitor/internal/metrics"
)

func feedKey(i int) cache.ObjectName {
	return cache.ObjectName{Namespace: "ns", Name: fmt.Sprintf("pod-%04d", i)}
}

// TestQueueFeedHoldsABurstInOrder: past its limit the feed holds keys, each
// once, and hands them to the queue in order as keys are taken; once empty
// it keeps nothing of the burst.
func TestQueueFeedHoldsABurstInOrder(t *testing.T) {
	q := workqueue.NewTyped[cache.ObjectName]()
	defer q.ShutDown()
	f := &queueFeed{queue: q, limit: 10}
	const n = 1000
	for i := range n {
		f.Add(feedKey(i))
	}
	f.Add(feedKey(500)) // held already: held once
	f.Add(feedKey(3))   // in the queue already: held behind the others
	if q.Len() != 10 || f.Len() != n-10+1 {
		t.Fatalf("queue %d, held %d; want 10 and %d", q.Len(), f.Len(), n-10+1)
	}
	var got []cache.ObjectName
	for q.Len() > 0 {
		key, _ := q.Get()
		f.drain()
		got = append(got, key)
		q.Done(key)
		if q.Len() > 10 {
			t.Fatalf("queue holds %d keys, limit 10", q.Len())
		}
	}
	var want []cache.ObjectName
	for i := range n {
		want = append(want, feedKey(i))
	}
	want = append(want, feedKey(3))
	if !slices.Equal(got, want) {
		t.Fatalf("keys taken: %d, want %d in the order added (first differs at %d)", len(got), len(want), firstDiff(got, want))
	}
	if f.held != nil || f.order != nil {
		t.Errorf("an empty feed keeps %d held and %d in order, want nothing", len(f.held), cap(f.order))
	}
	f.Add(feedKey(1))
	if q.Len() != 1 || f.Len() != 0 {
		t.Errorf("after the burst a key goes straight to the queue: queue %d, held %d", q.Len(), f.Len())
	}
}

// TestQueueFeedThatNeverEmptiesStaysBounded: under a stream of keys that
// never lets the feed empty, what it keeps follows what it holds.
func TestQueueFeedThatNeverEmptiesStaysBounded(t *testing.T) {
	q := workqueue.NewTyped[cache.ObjectName]()
	defer q.ShutDown()
	f := &queueFeed{queue: q, limit: 4}
	for i := range 100000 {
		f.Add(feedKey(i % 5000))
		f.Add(feedKey((i + 2500) % 5000))
		if key, _ := q.Get(); true {
			f.drain()
			q.Done(key)
		}
		if f.Len() > 5000 || cap(f.order) > 4*5000 {
			t.Fatalf("after %d keys: %d held, order's capacity %d; want at most the 5,000 pods and 4 times that", i, f.Len(), cap(f.order))
		}
	}
}

func firstDiff(a, b []cache.ObjectName) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// TestInitialListDoesNotGrowTheWorkqueue: the initial list queues every
// cached pod at once. The workqueue holds at most the feed's limit of them,
// so that its maps (which never shrink) stay small; workqueue_depth still
// counts them all. Every pod is decided: the due ones removed, once, and
// the others parked, none removed.
func TestInitialListDoesNotGrowTheWorkqueue(t *testing.T) {
	const n, due = 3 * queueFeedLimit, 7
	var pods []*corev1.Pod
	for i := range n {
		ttl := "1h" // created 10 minutes ago: parked
		if i%(n/due) == 0 && i/(n/due) < due {
			ttl = "1m" // overdue
		}
		pods = append(pods, apitest.Pod(fmt.Sprintf("pod-%04d", i), t0.Add(-10*time.Minute), corev1.PodSucceeded, map[string]string{"podjanitor.io/ttl": ttl}))
	}
	f := newFixture(t, Options{}, pods...)
	for _, p := range pods {
		f.c.enqueue(p) // as the pod handler's initial list does
	}
	if got := f.c.queue.Len(); got != queueFeedLimit {
		t.Fatalf("the workqueue holds %d keys after the initial list of %d, want the feed's limit %d", got, n, queueFeedLimit)
	}
	if got := f.c.Pending(); got != n {
		t.Errorf("Pending = %d, want %d", got, n)
	}
	if got := metricValue(f.metrics, "workqueue_depth", "name", controllerName); got != n {
		t.Errorf("workqueue_depth = %v, want %d: held keys count", got, n)
	}
	for f.c.Pending() > 0 {
		f.next()
		if got := f.c.queue.Len(); got > queueFeedLimit {
			t.Fatalf("the workqueue holds %d keys, want at most %d", got, queueFeedLimit)
		}
	}
	var want []core.Action
	for i, p := range pods {
		if i%(n/due) == 0 && i/(n/due) < due {
			want = append(want, deleteAction(p))
		}
	}
	checkActions(t, want, f.writes())
	if got := metricValue(f.metrics, "podjanitor_pods_scheduled"); got != n-due {
		t.Errorf("pods_scheduled = %v, want %d", got, n-due)
	}
	if got := metricValue(f.metrics, "workqueue_depth", "name", controllerName); got != 0 {
		t.Errorf("workqueue_depth = %v after the pass, want 0", got)
	}
}

// TestStandbyKeepsNoKey: a replica waiting for the lease keeps no key of the
// pods it hears of, however many come and go (a Job-heavy afternoon): its
// queue and feed stay empty. When it leads, Run decides the cache's live
// pods, and only those: the due one goes, the one with a later deadline is
// parked, and none of the deleted pods' keys is taken.
func TestStandbyKeepsNoKey(t *testing.T) {
	due := apitest.Pod("due", t0.Add(-time.Hour), corev1.PodSucceeded, map[string]string{"podjanitor.io/ttl": "1m"})
	later := apitest.Pod("later", t0.Add(-time.Hour), corev1.PodSucceeded, map[string]string{"podjanitor.io/ttl": "2h"})
	f := newFixture(t, Options{}, due, later)
	f.c.Standby()
	for i := range 1000 {
		gone := apitest.Pod(fmt.Sprintf("job-%04d", i), t0, corev1.PodSucceeded, nil)
		f.c.enqueue(gone)                                                                   // created
		f.c.enqueue(cache.DeletedFinalStateUnknown{Key: "default/" + gone.Name, Obj: gone}) // and deleted
	}
	f.c.enqueue(due) // the live pods' events too
	f.c.enqueue(later)
	if n := f.c.Pending(); n != 0 {
		t.Fatalf("a standby holds %d keys, want none", n)
	}
	if d := metricValue(f.metrics, "workqueue_depth", "name", controllerName); d != 0 {
		t.Errorf("a standby's workqueue_depth = %v, want 0", d)
	}

	ctx, cancel := context.WithCancel(f.ctx)
	ran := make(chan struct{})
	t.Cleanup(func() { cancel(); <-ran })
	go func() { defer close(ran); _ = f.c.Run(ctx, 1) }()
	if err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return f.deletes() == 1 && metricValue(f.metrics, "podjanitor_pods_scheduled") == 1, nil
	}); err != nil {
		t.Fatalf("after the takeover: %d pods removed and %v parked until their deadline, want the due pod removed and the other parked",
			f.deletes(), metricValue(f.metrics, "podjanitor_pods_scheduled"))
	}
	reconciled := 0.0
	for _, result := range []string{metrics.ResultSuccess, metrics.ResultRequeueAfter, metrics.ResultRequeue, metrics.ResultError} {
		reconciled += metricValue(f.metrics, "controller_runtime_reconcile_total", "result", result)
	}
	if reconciled != 2 {
		t.Errorf("the takeover decided %v keys, want the 2 live pods", reconciled)
	}
}
