//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
)

// TestStandbyStaysSmall: a leader and a standby on one Lease; 6,000 pods
// created and deleted (a Job-heavy cluster's afternoon). Afterwards both
// replicas' workqueue_depth is at most the live pods (none left), and their
// heaps, each read right after a garbage collection (the heap profile with
// gc=1), are within 20 % of each other. A standby used to keep a key for
// every pod it had seen: 6,020 keys and twice the leader's heap.
func TestStandbyStaysSmall(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	ns := newNamespace(t)
	args := []string{"--namespace", ns, "--metrics-bind-address", "127.0.0.1:0", "--profiling",
		"--leader-elect", "--leader-elect-resource-namespace", ns, "--leader-elect-resource-name", "standby"}
	leader := startDaemon(t, args...)
	standby := startDaemonWaiting(t, "Serving metrics endpoint", args...)
	const n = 6000
	createPods(t, n, func(i int) *corev1.Pod { return pod(ns, fmt.Sprintf("job-%05d", i)) })
	zero := int64(0)
	if err := client.CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		return err == nil && len(list.Items) == 0, nil
	}); err != nil {
		t.Fatal("the pods are not all deleted")
	}
	time.Sleep(5 * time.Second) // the deletions reach both replicas' caches
	heap := func(d *daemon) float64 {
		t.Helper()
		resp, err := http.Get("http://" + d.endpoints()["metrics"] + "/debug/pprof/heap?gc=1")
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return d.scrape(t).sum("go_memstats_heap_alloc_bytes")
	}
	for _, r := range []struct {
		name string
		d    *daemon
	}{{"leader", leader}, {"standby", standby}} {
		if depth := r.d.scrape(t).sum("workqueue_depth", `name="podjanitor"`); depth > 0 {
			t.Errorf("the %s's workqueue_depth is %v with no pod left", r.name, depth)
		}
	}
	l, s := heap(leader), heap(standby)
	t.Logf("heaps after a GC, %d pods created and deleted: leader %.1f MiB, standby %.1f MiB", n, l/(1<<20), s/(1<<20))
	if diff := l - s; diff > 0.2*max(l, s) || -diff > 0.2*max(l, s) {
		t.Errorf("leader's heap %.1f MiB and standby's %.1f MiB differ by more than 20 %%", l/(1<<20), s/(1<<20))
	}
}
