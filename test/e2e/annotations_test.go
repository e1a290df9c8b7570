//go:build e2e

package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestTTLPodGoesAtItsDeadlineNotBefore(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	r := watchRemovals(t, ns)
	startDaemon(t, "--namespace", ns)

	pending := createPod(t, ns, "pending-ttl", ttl(6*time.Second))
	running := createPod(t, ns, "running-ttl", onNode, ttl(7*time.Second))
	keeper := createPod(t, ns, "long-ttl", ttl(time.Hour))

	r.checkOnTime(t, pending, created(pending).Add(6*time.Second))
	r.checkOnTime(t, running, created(running).Add(7*time.Second))
	waitRemovalEvent(t, pending, "Delete")
	waitRemovalEvent(t, running, "Evict") // a Running pod goes through the Eviction API
	r.checkNotRemoved(t, keeper)
}

func TestExpiresAt(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	r := watchRemovals(t, ns)
	startDaemon(t, "--namespace", ns)

	at := time.Now().Add(6 * time.Second).Truncate(time.Second)
	pod := createPod(t, ns, "expiring", annotate(prefix+"expires-at", at.Format(time.RFC3339)))
	later := createPod(t, ns, "expiring-tomorrow", annotate(prefix+"expires-at", time.Now().Add(48*time.Hour).Format("2006-01-02")))
	r.checkOnTime(t, pod, at)
	r.checkNotRemoved(t, later)
}

func TestTTLAfterFinishedCountsFromTheFinishTime(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	r := watchRemovals(t, ns)
	startDaemon(t, "--namespace", ns)

	const after = 4 * time.Second
	completed := createPod(t, ns, "completed", fate("complete", 3*time.Second), annotate(prefix+"ttl-after-finished", after.String()))
	failed := createPod(t, ns, "failed", fate("fail", 2*time.Second), annotate(prefix+"ttl-after-finished", after.String()))
	running := createPod(t, ns, "still-running", onNode, annotate(prefix+"ttl-after-finished", "1s"))

	for _, pod := range []*corev1.Pod{completed, failed} {
		done := waitPod(t, pod, "finished", func(p *corev1.Pod) bool {
			return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
		})
		ready := condition(done, corev1.PodReady)
		if ready == nil || (ready.Reason != "PodCompleted" && ready.Reason != "PodFailed") {
			t.Fatalf("pod %s: Ready condition %+v, want reason PodCompleted/PodFailed", pod.Name, ready)
		}
		finished := ready.LastTransitionTime.Time
		if !finished.After(created(pod)) {
			t.Fatalf("pod %s: finish time %v is not after creation %v", pod.Name, finished, created(pod))
		}
		r.checkOnTime(t, pod, finished.Add(after))
	}
	time.Sleep(2 * time.Second)
	r.checkNotRemoved(t, running)
}

func TestEvictedPodWithoutContainerStatuses(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	r := watchRemovals(t, ns)
	startDaemon(t, "--namespace", ns)

	pod := createPod(t, ns, "evicted", fate("evict", time.Second), annotate(prefix+"ttl-after-finished", "4s"))
	evicted := waitPod(t, pod, "evicted", func(p *corev1.Pod) bool { return p.Status.Reason == "Evicted" })
	if n := len(evicted.Status.ContainerStatuses); n != 0 {
		t.Fatalf("evicted pod has %d container statuses, want none (the case under test)", n)
	}
	dt := condition(evicted, corev1.DisruptionTarget)
	if dt == nil {
		t.Fatal("evicted pod has no DisruptionTarget condition")
	}
	r.checkOnTime(t, pod, dt.LastTransitionTime.Add(4*time.Second))
}

func TestKeepVetoes(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	r := watchRemovals(t, ns)
	startDaemon(t, "--namespace", ns)

	kept := createPod(t, ns, "kept", ttl(time.Second), annotate(prefix+"keep", "true"))
	keptDone := createPod(t, ns, "kept-finished", fate("complete", 0), annotate(prefix+"ttl-after-finished", "1s", prefix+"keep", "true"))
	control := createPod(t, ns, "control", ttl(time.Second))
	r.checkOnTime(t, control, created(control).Add(time.Second))
	time.Sleep(3 * time.Second)
	r.checkNotRemoved(t, kept)
	r.checkNotRemoved(t, keptDone)
}

func TestDryRunDeletesNothing(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	r := watchRemovals(t, ns)
	startDaemon(t, "--namespace", ns, "--dry-run")

	pending := createPod(t, ns, "dry-pending", ttl(2*time.Second))
	running := createPod(t, ns, "dry-running", onNode, ttl(2*time.Second))
	for _, p := range []*corev1.Pod{pending, running} {
		e := waitEvent(t, p, "WouldRemove", 15*time.Second)
		if e.Type != corev1.EventTypeNormal {
			t.Errorf("WouldRemove event type %q, want Normal", e.Type)
		}
	}
	time.Sleep(2 * time.Second)
	r.checkNotRemoved(t, pending)
	r.checkNotRemoved(t, running)
}

func TestInvalidAnnotationWarnsAndDeletesNothing(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	r := watchRemovals(t, ns)
	startDaemon(t, "--namespace", ns)

	bad := createPod(t, ns, "bad-ttl", annotate(prefix+"ttl", "3x"))
	badDate := createPod(t, ns, "bad-date", annotate(prefix+"expires-at", "yesterday"))
	// Keys under the prefix that podjanitor does not know (typos of keep)
	// make the annotations invalid too: the ttl beside them does not apply.
	keeps := createPod(t, ns, "typo-keeps", ttl(2*time.Second), annotate(prefix+"keeps", "true"))
	capital := createPod(t, ns, "typo-capital-keep", onNode, ttl(2*time.Second), annotate(prefix+"Keep", "true"))
	control := createPod(t, ns, "control", ttl(2*time.Second))
	for _, p := range []*corev1.Pod{bad, badDate, keeps, capital} {
		e := waitEvent(t, p, "InvalidAnnotation", 15*time.Second)
		if e.Type != corev1.EventTypeWarning {
			t.Errorf("InvalidAnnotation event type %q, want Warning", e.Type)
		}
		t.Logf("event: %s", e.Note)
	}
	for p, want := range map[*corev1.Pod]string{
		keeps:   `annotation podjanitor.io/keeps="true": unknown annotation: did you mean podjanitor.io/keep?`,
		capital: `annotation podjanitor.io/Keep="true": unknown annotation: did you mean podjanitor.io/keep?`,
	} {
		if e := waitEvent(t, p, "InvalidAnnotation", 15*time.Second); !strings.Contains(e.Note, want) {
			t.Errorf("pod %s: InvalidAnnotation note %q, want it to say %s", p.Name, e.Note, want)
		}
	}
	r.checkOnTime(t, control, created(control).Add(2*time.Second))
	time.Sleep(3 * time.Second)
	r.checkNotRemoved(t, bad)
	r.checkNotRemoved(t, badDate)
	r.checkNotRemoved(t, keeps)
	r.checkNotRemoved(t, capital)
}

func TestNamespaceAndLabelSelectorScoping(t *testing.T) {
	t.Parallel()
	ns, other := newNamespace(t), newNamespace(t)
	r, rOther := watchRemovals(t, ns), watchRemovals(t, other)
	startDaemon(t, "--namespace", ns, "--label-selector", "janitor=yes")

	in := createPod(t, ns, "in-scope", label("janitor", "yes"), ttl(2*time.Second))
	noLabel := createPod(t, ns, "no-label", ttl(time.Second))
	wrongLabel := createPod(t, ns, "wrong-label", label("janitor", "no"), ttl(time.Second))
	otherNS := createPod(t, other, "other-namespace", label("janitor", "yes"), ttl(time.Second))

	r.checkOnTime(t, in, created(in).Add(2*time.Second))
	time.Sleep(3 * time.Second)
	r.checkNotRemoved(t, noLabel)
	r.checkNotRemoved(t, wrongLabel)
	rOther.checkNotRemoved(t, otherNS)
}

func TestRecreatedPodIsNotDeletedByTheOldDecision(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	r := watchRemovals(t, ns)
	startDaemon(t, "--namespace", ns)

	old := createPod(t, ns, "same-name", ttl(6*time.Second))
	time.Sleep(2 * time.Second)
	zero := int64(0)
	if err := client.CoreV1().Pods(ns).Delete(context.Background(), old.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	waitGone(t, old)
	replacement := createPod(t, ns, "same-name", ttl(time.Hour))
	time.Sleep(time.Until(created(old).Add(6*time.Second)) + 3*time.Second)
	r.checkNotRemoved(t, replacement)
}

func waitGone(t *testing.T, pod *corev1.Pod) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		p, err := client.CoreV1().Pods(pod.Namespace).Get(context.Background(), pod.Name, metav1.GetOptions{})
		if err != nil || p.UID != pod.UID {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("pod %s/%s still exists", pod.Namespace, pod.Name)
}

// TestCrashSafety kills podjanitor while pods wait, lets some deadlines pass
// while it is down, and restarts it: every due pod goes promptly, none early,
// none missed.
func TestCrashSafety(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	r := watchRemovals(t, ns)
	first := startDaemon(t, "--namespace", ns)

	ttls := []time.Duration{5 * time.Second, 7 * time.Second, 16 * time.Second, 18 * time.Second}
	var pods []*corev1.Pod
	for i, d := range ttls {
		pods = append(pods, createPod(t, ns, "wait-"+string(rune('a'+i)), ttl(d)))
	}
	keeper := createPod(t, ns, "far-future", ttl(time.Hour))
	time.Sleep(time.Second)
	first.kill()

	// The first two deadlines pass while podjanitor is down.
	time.Sleep(time.Until(created(pods[1]).Add(ttls[1])) + 2*time.Second)
	for _, p := range pods {
		if at, ok := r.get(p.UID); ok {
			t.Fatalf("pod %s removed at %v while podjanitor was down", p.Name, at)
		}
	}
	restarted := time.Now()
	startDaemon(t, "--namespace", ns)
	for _, p := range pods[:2] {
		at := r.waitRemoved(t, p, latenessOK+10*time.Second)
		t.Logf("overdue pod %s removed %v after the restart", p.Name, at.Sub(restarted))
		if at.Sub(restarted) > latenessOK {
			t.Errorf("overdue pod %s removed %v after restart, want within %v", p.Name, at.Sub(restarted), latenessOK)
		}
	}
	for i, p := range pods[2:] {
		r.checkOnTime(t, p, created(p).Add(ttls[i+2]))
	}
	r.checkNotRemoved(t, keeper)
}
