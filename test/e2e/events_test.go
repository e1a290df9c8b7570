//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
)

// reasonRemoved is the reason of removal events; their action says Delete or Evict.
const reasonRemoved = "LifetimeExpired"

// waitRemovalEvent waits for the pod's removal event and checks its action.
func waitRemovalEvent(t *testing.T, pod *corev1.Pod, action string) eventsv1.Event {
	t.Helper()
	e := waitEvent(t, pod, reasonRemoved, 10*time.Second)
	if e.Action != action || e.Type != corev1.EventTypeNormal {
		t.Errorf("%s event on %s: type %s, action %q; want Normal, %q", reasonRemoved, pod.Name, e.Type, e.Action, action)
	}
	return e
}

// The events API refuses notes over 1 KiB: the Warning about a long value
// must be cut to fit, or it is never stored.
func TestLongInvalidValueWarningIsStored(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	r := watchRemovals(t, ns)
	startDaemon(t, "--namespace", ns)

	pods := map[string]*corev1.Pod{
		prefix + "ttl":        createPod(t, ns, "ttl-5kb", annotate(prefix+"ttl", "3"+strings.Repeat("h", 5<<10))),
		prefix + "expires-at": createPod(t, ns, "expires-at-100kb", annotate(prefix+"expires-at", strings.Repeat("2026-12-01", 10<<10))),
	}
	for key, p := range pods {
		e := waitEvent(t, p, "InvalidAnnotation", 20*time.Second)
		if e.Type != corev1.EventTypeWarning || len(e.Note) > 1024 || !utf8.ValidString(e.Note) {
			t.Errorf("pod %s: %s event with a note of %d bytes (valid UTF-8: %v), want a Warning of at most 1024",
				p.Name, e.Type, len(e.Note), utf8.ValidString(e.Note))
		}
		if !strings.Contains(e.Note, "annotation "+key+"=") {
			t.Errorf("pod %s: note %q does not name the annotation %s", p.Name, e.Note, key)
		}
		t.Logf("pod %s: %s", p.Name, e.Note)
	}
	for _, p := range pods {
		r.checkNotRemoved(t, p)
	}
}

// An invalid pod is warned about once per bad value: not again when the pod
// changes otherwise or the policy is reloaded, again when the value changes.
func TestInvalidAnnotationWarnsOncePerValue(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	r := watchRemovals(t, ns)
	cfg := writePolicy(t, "", `
  - name: never-matches
    match: {labelSelector: "no-such-label=x"}
    clock: created
    after: 1h
`)
	d := startDaemon(t, "--namespace", ns, "--config", cfg)

	pod := createPod(t, ns, "bad-ttl", annotate(prefix+"ttl", "3x"))
	waitEvent(t, pod, "InvalidAnnotation", 15*time.Second)
	for i := range 3 {
		patchPod(t, pod, fmt.Sprintf(`{"metadata":{"labels":{"touched":"%d"}}}`, i))
	}
	writePolicy(t, cfg, `
  - name: still-never-matches
    match: {labelSelector: "no-such-label=y"}
    clock: created
    after: 1h
`)
	d.waitLog("Reloaded the policy file", 30*time.Second)
	time.Sleep(3 * time.Second)
	if n := countEvents(t, pod, "InvalidAnnotation"); n != 1 {
		t.Errorf("InvalidAnnotation events after 3 updates and a policy reload = %d, want 1", n)
	}

	patchPod(t, pod, fmt.Sprintf(`{"metadata":{"annotations":{%q:"3y"}}}`, prefix+"ttl"))
	err := wait.PollUntilContextTimeout(ctxFor(t), 200*time.Millisecond, 15*time.Second, true, func(context.Context) (bool, error) {
		return countEvents(t, pod, "InvalidAnnotation") == 2, nil
	})
	if err != nil {
		t.Errorf("InvalidAnnotation events after the value changed = %d, want 2", countEvents(t, pod, "InvalidAnnotation"))
	}
	r.checkNotRemoved(t, pod)
}

func patchPod(t *testing.T, pod *corev1.Pod, patch string) {
	t.Helper()
	_, err := client.CoreV1().Pods(pod.Namespace).Patch(ctxFor(t), pod.Name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{})
	if err != nil {
		t.Fatalf("patching pod %s/%s: %v", pod.Namespace, pod.Name, err)
	}
}

var summaryCount = regexp.MustCompile(`^Deleted (\d+) pods? at `)

// TestBulkRemovalsAreReportedWithinTheBudget drains a backlog of 300 due
// pods, 200 of one owner and 100 without, with the default flags: the
// removals beyond the budget are reported by summaries on the owner and the
// namespace that name their count; every removal is reported exactly once,
// the last ones by the flush on shutdown; and the log has every removal.
func TestBulkRemovalsAreReportedWithinTheBudget(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	// A watch that resumes where it broke off: a busy API server may close
	// one that falls behind 300 creations and removals.
	r := watchRemovalsDurably(t, ns)
	ctx := ctxFor(t)
	owner, err := client.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "batch"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ownerRef := metav1.OwnerReference{APIVersion: "v1", Kind: "ConfigMap", Name: owner.Name, UID: owner.UID}
	const owned, bare = 200, 100
	pods := make([]*corev1.Pod, owned+bare)
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < len(pods); i += 8 {
				opts := []podOpt{ttl(time.Second)}
				name := fmt.Sprintf("bare-%03d", i)
				if i < owned {
					name = fmt.Sprintf("owned-%03d", i)
					opts = append(opts, func(p *corev1.Pod) { p.OwnerReferences = []metav1.OwnerReference{ownerRef} })
				}
				pods[i] = createPod(t, ns, name, opts...)
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	time.Sleep(2 * time.Second) // every ttl has passed: a backlog

	started := time.Now()
	d := startDaemon(t, "--namespace", ns)
	for _, p := range pods {
		r.waitRemoved(t, p, 90*time.Second)
	}
	drained := time.Since(started)
	if code := d.stop(30 * time.Second); code != 0 {
		t.Errorf("podjanitor exited %d on SIGTERM, want 0", code)
	}
	if n := strings.Count(d.log(), `"Removed pod"`); n != len(pods) {
		t.Errorf("the log has %d removals, want %d", n, len(pods))
	}

	// podjanitor has exited, so what is stored now is all it reported.
	var perPod, summaries []eventsv1.Event
	summarised := map[string]int{}
	list, err := client.EventsV1().Events(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range list.Items {
		if e.Reason != reasonRemoved || e.ReportingController != "podjanitor" {
			continue
		}
		if e.Regarding.Kind == "Pod" {
			perPod = append(perPod, e)
			continue
		}
		summaries = append(summaries, e)
		m := summaryCount.FindStringSubmatch(e.Note)
		if m == nil || e.Action != "Delete" {
			t.Errorf("summary on %s %s, action %s: %q; want action Delete and a note that names the count", e.Regarding.Kind, e.Regarding.Name, e.Action, e.Note)
			continue
		}
		n, _ := strconv.Atoi(m[1])
		summarised[e.Regarding.Kind+"/"+e.Regarding.Name] += n
		if e.Regarding.Kind == "ConfigMap" && e.Regarding.UID != owner.UID {
			t.Errorf("summary regards ConfigMap %s with UID %s, want the owner's %s", e.Regarding.Name, e.Regarding.UID, owner.UID)
		}
		t.Logf("summary on %s %s: %s", e.Regarding.Kind, e.Regarding.Name, e.Note)
	}
	seen := map[string]bool{}
	for _, e := range perPod {
		if seen[e.Regarding.Name] {
			t.Errorf("pod %s has two removal events", e.Regarding.Name)
		}
		seen[e.Regarding.Name] = true
	}
	total := len(perPod)
	for _, n := range summarised {
		total += n
	}
	t.Logf("%d removals in %v: %d events on pods, %d summaries %v", len(pods), drained.Round(time.Millisecond), len(perPod), len(summaries), summarised)
	if total != len(pods) {
		t.Errorf("events report %d removals, want every one of the %d, once", total, len(pods))
	}
	secs := int(drained.Seconds()) + 1
	if budget := 50 + 5*secs; len(perPod) > budget || len(perPod) >= len(pods) {
		t.Errorf("%d events on pods, want at most the budget's %d (50 + 5/s over %ds)", len(perPod), budget, secs)
	}
	if most := 2 * (secs/10 + 2); len(summaries) > most || summarised["ConfigMap/batch"] == 0 || summarised["Namespace/"+ns] == 0 {
		t.Errorf("summaries %v (%d events), want some on ConfigMap/batch and Namespace/%s, at most one per owner and 10 s (%d)",
			summarised, len(summaries), ns, most)
	}
}
