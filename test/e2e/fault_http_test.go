//go:build e2e

package e2e

import (
	"net/http"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// TestFaultHTTPErrorsOnRemoval breaks podjanitor's DELETE and eviction
// requests at the proxy: 500s, 503s with Retry-After, 429s with and without
// Retry-After (neither from a PodDisruptionBudget), 2 s of latency on every
// attempt, one 404 for a pod that still exists, and one call that hangs for a
// minute (podjanitor runs with --write-timeout=3s). Each fault hits a pod that
// is deleted and a Running pod that is evicted. Asserted: every pod is removed
// within 15 s of its deadline and not before, the 404 and hung pods included;
// the hung calls are counted as timeouts; no EvictionBlocked event (no budget
// refused anything); a kept pod stays; one removal event per pod.
func TestFaultHTTPErrorsOnRemoval(t *testing.T) {
	t.Parallel()
	const bound = 15 * time.Second
	ns := newNamespace(t)
	w := watchRemovalsDurably(t, ns)
	proxy := newFaultProxy(t)
	faults := []struct {
		name string
		f    fault
	}{
		{"err-500", fault{Status: http.StatusInternalServerError, Times: 3}},
		{"err-503-retry-after", fault{Status: http.StatusServiceUnavailable, RetryAfter: 1, Times: 2}},
		{"err-429-retry-after", fault{Status: http.StatusTooManyRequests, RetryAfter: 1, Times: 2}},
		{"err-429", fault{Status: http.StatusTooManyRequests, Times: 3}},
		{"slow-2s", fault{Delay: 2 * time.Second}},
		{"phantom-404", fault{Status: http.StatusNotFound, Times: 1}},
		{"hang", fault{Delay: time.Minute, Times: 1}},
	}
	d := startDaemon(t, "--namespace", ns, "--kubeconfig", proxy.kubeconfig(t), "--write-timeout", "3s",
		"--metrics-bind-address", "127.0.0.1:0")
	due := time.Now().Add(12 * time.Second) // time for the Running pods to start
	var pods []*corev1.Pod
	for _, f := range faults {
		del, evict := f.f, f.f
		del.Method, del.Namespace, del.Pod = "DELETE", ns, f.name+"-delete"
		evict.Method, evict.Namespace, evict.Pod, evict.Subresource = "POST", ns, f.name+"-evict", "eviction"
		proxy.inject(&del)
		proxy.inject(&evict)
		pods = append(pods, createPod(t, ns, del.Pod, unscheduled, expiresAt(due)), createPod(t, ns, evict.Pod, onNode, expiresAt(due)))
	}
	kept := createPod(t, ns, "kept", onNode, keep, expiresAt(due))
	for _, p := range pods {
		if p.Spec.NodeName != "" {
			waitPod(t, p, "Running", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
		}
	}
	waitCached(t, d.log, pods)
	if time.Now().After(due) {
		t.Fatal("the pods were not ready before their deadline")
	}

	for _, p := range pods {
		w.checkRemovedInTime(t, p, due, due.Add(bound))
	}
	served := proxy.served(ns)
	for _, p := range pods {
		faulted := false
		for _, r := range served {
			faulted = faulted || (r.Pod == p.Name && r.Faulted)
		}
		if !faulted {
			t.Errorf("pod %s: no request of podjanitor's met its fault; the test did not test it", p.Name)
		}
	}
	if n := d.scrape(t).sum("podjanitor_removal_errors_total", `error="timeout"`); n < 2 {
		t.Errorf("podjanitor_removal_errors_total{error=\"timeout\"} = %v, want at least the 2 calls that hung", n)
	}
	w.checkNotRemoved(t, kept)
	if blocked := eventsByPod(t, ns, "EvictionBlocked"); len(blocked) > 0 {
		t.Errorf("%d pod(s) got an EvictionBlocked event, but no PodDisruptionBudget refused an eviction", len(blocked))
	}
	checkOneRemovalEventEach(t, ns, pods, []*corev1.Pod{kept})
}

// TestFaultStaleCache delays the events of podjanitor's watch by 3 s at the
// proxy. One second before each pod's deadline the test adds keep, removes
// the ttl, or drops the label podjanitor selects pods by. podjanitor, deciding
// on its stale cache, tries to remove the pods: the resourceVersion
// precondition refuses a delete (409), and an eviction is not even tried, as
// the read of the pod before it shows the change; it decides again once its
// cache has caught up. Asserted: none of the changed pods is removed, and
// podjanitor tried each of them at least once (the race did happen);
// unchanged pods go on time.
func TestFaultStaleCache(t *testing.T) {
	t.Parallel()
	const ttlFor = 12 * time.Second
	ns := newNamespace(t)
	w := watchRemovalsDurably(t, ns)
	proxy := newFaultProxy(t)
	proxy.delayWatches(3 * time.Second)
	d := startDaemon(t, "--namespace", ns, "--label-selector", "race=yes", "--kubeconfig", proxy.kubeconfig(t))

	changes := map[string]string{ // JSON merge patches
		"add-keep":   `{"metadata":{"annotations":{"podjanitor.io/keep":"true"}}}`,
		"drop-ttl":   `{"metadata":{"annotations":{"podjanitor.io/ttl":null}}}`,
		"drop-label": `{"metadata":{"labels":{"race":null}}}`,
	}
	var changed, unchanged []*corev1.Pod
	patchOf := map[*corev1.Pod]string{}
	for _, running := range []bool{false, true} {
		opts := []podOpt{label("race", "yes"), ttl(ttlFor), unscheduled}
		suffix := "-pending" // deleted
		if running {
			opts, suffix = append(opts, onNode), "-running" // evicted
		}
		for name, patch := range changes {
			p := createPod(t, ns, name+suffix, opts...)
			changed, patchOf[p] = append(changed, p), patch
		}
		unchanged = append(unchanged, createPod(t, ns, "unchanged"+suffix, opts...))
	}
	waitCached(t, d.log, append(changed, unchanged...))

	var wg sync.WaitGroup
	for _, p := range changed {
		deadline, patch := created(p).Add(ttlFor), patchOf[p]
		wg.Go(func() {
			time.Sleep(time.Until(deadline.Add(-time.Second)))
			_, err := client.CoreV1().Pods(ns).Patch(ctxFor(t), p.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
			if err != nil {
				t.Errorf("patching %s: %v", p.Name, err)
			}
			if time.Now().After(deadline) {
				t.Errorf("pod %s was changed only after its deadline; the test did not test the race", p.Name)
			}
		})
	}
	for _, p := range unchanged {
		w.checkOnTime(t, p, created(p).Add(ttlFor))
	}
	wg.Wait()
	time.Sleep(time.Until(created(changed[len(changed)-1]).Add(ttlFor + 8*time.Second)))
	served := proxy.served(ns)
	for _, p := range changed {
		w.checkNotRemoved(t, p)
		verb, status := "DELETE", http.StatusConflict
		if p.Spec.NodeName != "" {
			verb, status = "GET", http.StatusOK // the read before an eviction
		}
		refused := false
		for _, r := range served {
			refused = refused || (r.Pod == p.Name && r.Method == verb && r.Sub == "" && r.Status == status)
		}
		if !refused {
			t.Errorf("pod %s: podjanitor never tried to remove it from its stale cache; the test did not test the race", p.Name)
		}
	}
	checkOneRemovalEventEach(t, ns, unchanged, changed)
}
