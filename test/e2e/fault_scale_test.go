//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// The fault tests at scale are not parallel either: they load the API server
// and measure podjanitor's memory, which other tests would disturb.

var removedLine = regexp.MustCompile(`"Removed pod" pod="([^"]+)"`)

// TestFaultShutdownDuringBacklog: 5,000 pods are overdue when two replicas
// with --leader-elect start. The leader reaches the API server through a
// proxy that, once the drain is under way, turns slow (every removal held
// 30 s), and then it gets SIGTERM. Asserted: it exits 0 within
// --shutdown-timeout plus 7 s (of which flushing events may take 5 s) and
// releases the lease; the other replica takes the lease within 3 s and
// removes the rest; every pod is removed exactly once (one "Removed pod" line
// in the two logs, reported once by an event of its own or in a summary),
// none before its deadline; kept and far pods stay.
func TestFaultShutdownDuringBacklog(t *testing.T) {
	const (
		backlog         = 5000
		later           = 50 // due while the lease changes hands
		shutdownTimeout = 5 * time.Second
		margin          = 7 * time.Second
	)
	ns := newNamespace(t)
	r := watchRemovalsDurably(t, ns) // a plain watch falls behind 5,000 pods and is closed
	t0 := time.Now()
	deadline := func(i int) time.Time {
		if i < backlog {
			return t0.Add(-time.Hour)
		}
		return t0.Add(60*time.Second + time.Duration(i-backlog)*time.Second)
	}
	pods := createPods(t, backlog+later+20, func(i int) *corev1.Pod {
		switch {
		case i < backlog+later:
			return pod(ns, fmt.Sprintf("pod-%05d", i), expiresAt(deadline(i)))
		case i%2 == 0:
			return pod(ns, fmt.Sprintf("kept-%05d", i), keep, expiresAt(t0))
		default:
			return pod(ns, fmt.Sprintf("far-%05d", i), expiresAt(t0.Add(time.Hour)))
		}
	})
	due, stays := pods[:backlog+later], pods[backlog+later:]

	proxy := newFaultProxy(t)
	args := []string{"--namespace", ns, "--workers", "16", "--max-deletions-per-second", "0",
		"--kube-api-qps", "500", "--kube-api-burst", "500", "--shutdown-timeout", shutdownTimeout.String(),
		"--leader-elect", "--leader-elect-resource-namespace", ns, "--leader-elect-lease-duration", "6s",
		"--leader-elect-renew-deadline", "4s", "--leader-elect-retry-period", "500ms"}
	leader := startDaemon(t, append(args, "--kubeconfig", proxy.kubeconfig(t))...)
	follower := startDaemonWaiting(t, "Waiting to become the leader", args...)

	for drain := time.Now().Add(time.Minute); r.count() < 500; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(drain) {
			t.Fatalf("the leader removed only %d pods in a minute", r.count())
		}
	}
	proxy.inject(&fault{Method: "DELETE", Namespace: ns, Delay: 30 * time.Second})
	time.Sleep(time.Second) // removals pile up at the proxy
	sigterm := time.Now()
	code := leader.stop(shutdownTimeout + margin + 5*time.Second)
	exited := time.Since(sigterm)
	t.Logf("the leader exited %v after SIGTERM, with status %d, having removed %d pods", exited.Round(time.Millisecond), code,
		len(removedLine.FindAllString(leader.log(), -1)))
	if code != 0 || exited > shutdownTimeout+margin {
		t.Errorf("the leader exited with status %d after %v; want 0 within --shutdown-timeout (%v) + %v", code, exited, shutdownTimeout, margin)
	}
	if !leader.logContains("Released the leader lease") {
		t.Error("the leader did not release its lease")
	}
	follower.waitLog("Became the leader", 3*time.Second)
	t.Logf("the follower took the lease %v after SIGTERM", time.Since(sigterm).Round(time.Millisecond))

	for drained := time.Now().Add(3 * time.Minute); r.count() < len(due) && time.Now().Before(drained); {
		time.Sleep(200 * time.Millisecond)
	}
	var missing []string
	for i, p := range due {
		at, ok := r.get(p.UID)
		switch {
		case !ok:
			missing = append(missing, p.Name)
		case at.Before(deadline(i)):
			t.Errorf("pod %s removed at %s, before its deadline %s", p.Name, stamp(at), stamp(deadline(i)))
		}
	}
	if len(missing) > 0 {
		left, err := client.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Fatalf("%d pods were not seen removed within 3 minutes (e.g. %s); the namespace still has %d pods, %d of them kept or far",
			len(missing), strings.Join(missing[:min(5, len(missing))], ", "), len(left.Items), len(stays))
	}
	t.Logf("the follower finished the drain %v after SIGTERM", time.Since(sigterm).Round(time.Second))
	for _, p := range stays {
		r.checkNotRemoved(t, p)
	}
	lines := map[string]int{}
	for _, m := range removedLine.FindAllStringSubmatch(leader.log()+follower.log(), -1) {
		lines[m[1]]++
	}
	for _, p := range due {
		if n := lines[ns+"/"+p.Name]; n != 1 {
			t.Errorf("pod %s: %d \"Removed pod\" lines in the two logs, want 1", p.Name, n)
		}
	}
	checkRemovalsReportedOnce(t, ns, due, stays)
}

// TestFaultBadInputAtScale: 2,000 pods whose podjanitor annotations do not
// parse (50 of them over 100 KiB) are each updated twice with the same bad
// value and once with another; then the policy file is changed (every pod is
// decided again) and deleted. Asserted: each pod gets one InvalidAnnotation
// event per bad value, no more, the huge ones too; none is removed;
// podjanitor's goroutines and heap stay bounded; its log stays bounded (no
// line over 16 KiB: a value is not echoed in full) and the missing file is
// reported at most once per 2 s poll; the running policy stays in force
// after its file is deleted.
func TestFaultBadInputAtScale(t *testing.T) {
	const (
		n    = 2000
		huge = 50
	)
	ns := newNamespace(t)
	r := watchRemovalsDurably(t, ns)
	cfg := writePolicy(t, "", `
  - name: labelled
    match: {labelSelector: "policy=now"}
    clock: created
    after: 1h
`)
	d := startDaemon(t, "--namespace", ns, "--config", cfg, "--metrics-bind-address", "127.0.0.1:0", "-v=2")
	base := d.scrape(t)

	kinds := []struct{ key, value string }{
		{"ttl", "3x"}, {"expires-at", "next tuesday"}, {"keep", "yes"}, {"ttl-after-finished", "soon"},
	}
	badValue := func(i int) (string, string) {
		k := kinds[i%len(kinds)]
		if i < huge {
			return prefix + "ttl", strings.Repeat("9", 110<<10) + "x"
		}
		return prefix + k.key, k.value
	}
	start := time.Now()
	pods := createPods(t, n, func(i int) *corev1.Pod {
		key, value := badValue(i)
		return pod(ns, fmt.Sprintf("bad-%04d", i), annotate(key, value))
	})
	patch := func(round int, body func(i int) string) {
		t.Helper()
		inParallel(t, n, func(i int) error {
			_, err := client.CoreV1().Pods(ns).Patch(context.Background(), pods[i].Name, types.MergePatchType, []byte(body(i)), metav1.PatchOptions{})
			return err
		})
		t.Logf("round %d: updated %d pods", round, n)
	}
	for round := 1; round <= 2; round++ {
		patch(round, func(int) string { return fmt.Sprintf(`{"metadata":{"labels":{"round":"%d"}}}`, round) })
	}
	patch(3, func(i int) string {
		key, value := badValue(i)
		return fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, key, value+"-2")
	})

	writePolicy(t, cfg, `
  - name: labelled
    match: {labelSelector: "policy=now"}
    clock: created
    after: 3s
`)
	d.waitLog("Reloaded the policy file", 15*time.Second)
	reloaded := createPod(t, ns, "policy-after-reload", unscheduled, label("policy", "now"))
	r.checkOnTime(t, reloaded, created(reloaded).Add(3*time.Second))

	if err := os.Remove(cfg); err != nil {
		t.Fatal(err)
	}
	removed := time.Now()
	kept := createPod(t, ns, "policy-after-delete", unscheduled, label("policy", "now"))
	r.checkOnTime(t, kept, created(kept).Add(3*time.Second))
	time.Sleep(time.Until(removed.Add(10 * time.Second)))
	window := time.Since(removed)
	if got, most := strings.Count(d.log(), "Cannot read the policy file"), int(window/(2*time.Second))+1; got > most {
		t.Errorf("the missing policy file was reported %d times in %v, want at most once per 2 s poll (%d)", got, window.Round(time.Second), most)
	}
	t.Logf("scenario ran %v", time.Since(start).Round(time.Second))

	for _, p := range pods {
		if at, ok := r.get(p.UID); ok {
			t.Errorf("pod %s with an invalid annotation was removed at %s", p.Name, stamp(at))
		}
	}
	events := eventsByPod(t, ns, "InvalidAnnotation")
	wrong := map[string][]string{} // "huge"/"small" and the count → pods
	for i, p := range pods {
		if got := events[p.UID]; got < 1 || got > 2 {
			size := "small"
			if i < huge {
				size = "over 100 KiB"
			}
			k := fmt.Sprintf("%d InvalidAnnotation event(s) on a pod whose bad values are %s", got, size)
			wrong[k] = append(wrong[k], p.Name)
		}
	}
	for k, names := range wrong {
		t.Errorf("%s, want one per bad value (2): %d pods, e.g. %s", k, len(names), strings.Join(names[:min(3, len(names))], ", "))
	}

	// A burst of warnings queues in client-go's events library, one goroutine
	// per event waiting for the events API, which takes them at the client's
	// QPS: goroutines must come back down once the warnings are written (no
	// leak), however many pods are bad.
	end := d.scrape(t)
	peak := end.sum("go_goroutines")
	for settle := time.Now().Add(2 * time.Minute); end.sum("go_goroutines") > base.sum("go_goroutines")+200 && time.Now().Before(settle); {
		time.Sleep(2 * time.Second)
		end = d.scrape(t)
	}
	goroutines, heap := end.sum("go_goroutines"), end.sum("go_memstats_heap_inuse_bytes")
	t.Logf("goroutines %v -> %v at the end of the scenario -> %v once settled, heap in use %.1f -> %.1f MiB", base.sum("go_goroutines"), peak, goroutines,
		base.sum("go_memstats_heap_inuse_bytes")/(1<<20), heap/(1<<20))
	if goroutines > base.sum("go_goroutines")+200 {
		t.Errorf("podjanitor runs %v goroutines two minutes after the scenario, %v at the start: want at most 200 more, however many pods are bad", goroutines, base.sum("go_goroutines"))
	}
	if heap > 64<<20 {
		t.Errorf("podjanitor's heap in use is %.1f MiB with %d pods (%d of them over 100 KiB): want at most 64 MiB", heap/(1<<20), n, huge)
	}
	log := d.log()
	longest := 0
	for _, line := range strings.Split(log, "\n") {
		longest = max(longest, len(line))
	}
	t.Logf("podjanitor logged %d lines, %.1f MiB, %d error lines; longest line %d bytes",
		strings.Count(log, "\n"), float64(len(log))/(1<<20), countErrorLines(log), longest)
	if longest > 16<<10 {
		t.Errorf("podjanitor logged a line of %d bytes: a value must not be echoed in full", longest)
	}
}

// countErrorLines counts klog's error lines ("E1130 ...").
func countErrorLines(log string) int {
	n := 0
	for _, line := range strings.Split(log, "\n") {
		if strings.HasPrefix(line, "E") {
			n++
		}
	}
	return n
}

// TestFaultChurn creates and deletes pods far faster than the policy's 7-day
// `created` rule would remove them: 6,000 pods go through (after 1,000 to warm
// up), at most 400 live at a time. Asserted: podjanitor's live heap after a
// forced GC grows by less than 512 bytes, and by less than 0.5 heap objects, per pod
// that went through: it follows the live pods, not the pods seen.
func TestFaultChurn(t *testing.T) {
	const (
		warmup, churn = 1000, 6000
		batch         = 200
	)
	ns := newNamespace(t)
	cfg := writePolicy(t, "", `
  - name: a-week
    match: {namespaces: {include: ["`+ns+`"]}}
    clock: created
    after: 168h
`)
	d := startDaemon(t, "--namespace", ns, "--config", cfg, "--metrics-bind-address", "127.0.0.1:0", "--profiling", "-v=0")

	seen := 0
	through := func(count int) {
		t.Helper()
		for done := 0; done < count; done += batch {
			b := seen / batch
			inParallel(t, batch, func(i int) error {
				p := pod(ns, fmt.Sprintf("churn-%06d", seen+i), label("batch", fmt.Sprint(b)))
				p.Spec.Containers = []corev1.Container{{Name: "main", Image: "fake-image"}}
				_, err := client.CoreV1().Pods(ns).Create(context.Background(), p, metav1.CreateOptions{})
				if apierrors.IsAlreadyExists(err) {
					return nil
				}
				return err
			})
			seen += batch
			if b > 0 {
				deleteBatch(t, ns, b-1)
			}
		}
		deleteBatch(t, ns, seen/batch-1)
	}
	through(warmup)
	// Each side is the least of three measurements: a scrape after the forced
	// GC also counts what the heap profile and the scrape just allocated (up
	// to ~0.8 MiB in a few hundred objects, either way: 142 B and -131 B per
	// pod in two runs of the same binary, at 0.03–0.05 objects per pod).
	least := func() (bytes, objects float64) {
		bytes, objects = math.Inf(1), math.Inf(1)
		for range 3 {
			h := heapAfterGC(t, d, 0)
			bytes, objects = min(bytes, h.sum("go_memstats_heap_alloc_bytes")), min(objects, h.sum("go_memstats_heap_objects"))
		}
		return bytes, objects
	}
	beforeBytes, beforeObjects := least()
	start := time.Now()
	through(churn)
	t.Logf("%d pods created and deleted in %v", churn, time.Since(start).Round(time.Second))
	afterBytes, afterObjects := least()

	// The live heap (go_memstats_heap_alloc_bytes: the bytes of reachable
	// objects after the forced GC), not the heap in use, which counts whole
	// spans.
	grew, objects := (afterBytes-beforeBytes)/churn, (afterObjects-beforeObjects)/churn
	t.Logf("live heap after GC: %.2f MiB after %d pods, %.2f MiB after %d more; %.0f B and %.2f objects per pod that went through",
		beforeBytes/(1<<20), warmup, afterBytes/(1<<20), churn, grew, objects)
	// A pod kept after it went costs objects (its key, its cache entry) and
	// hundreds of bytes (a lean cached pod is ~480 B): 0.5 objects and 512 B
	// per pod. The bytes bound is above the noise: a few large objects that
	// come and go with the informers' buffers move the live heap by up to
	// ~1.3 MiB with no object retained (219 B per pod over 6,000 at 0.08
	// objects per pod, -20 B in the next run of the same binary).
	if grew > 512 || objects > 0.5 {
		t.Errorf("podjanitor's heap grew by %.0f bytes and %.2f objects per pod that came and went; want under 512 bytes and 0.5 objects: it must follow the live pods", grew, objects)
	}
}

// deleteBatch deletes the pods of a batch at once.
func deleteBatch(t *testing.T, ns string, b int) {
	t.Helper()
	err := client.CoreV1().Pods(ns).DeleteCollection(context.Background(), metav1.DeleteOptions{},
		metav1.ListOptions{LabelSelector: fmt.Sprintf("batch=%d", b)})
	if err != nil {
		t.Fatal(err)
	}
}

// heapAfterGC waits until podjanitor has caught up with the deletions (live
// pods parked: podjanitor_pods_scheduled), forces a GC through the pprof
// endpoint, and scrapes /metrics.
func heapAfterGC(t *testing.T, d *daemon, live float64) promSeries {
	t.Helper()
	for deadline := time.Now().Add(60 * time.Second); d.scrape(t).sum("podjanitor_pods_scheduled") != live; {
		if time.Now().After(deadline) {
			t.Fatalf("podjanitor still has %v pods scheduled, want %v", d.scrape(t).sum("podjanitor_pods_scheduled"), live)
		}
		time.Sleep(200 * time.Millisecond)
	}
	resp, err := http.Get("http://" + d.endpoints()["metrics"] + "/debug/pprof/heap?gc=1")
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return d.scrape(t)
}
