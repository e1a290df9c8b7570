//go:build e2e

package e2e

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// TestRemovalNoticeComesBeforeTheRemoval: with --removal-notice 3s a pod of
// ttl 6s is told (RemovalScheduled) before it is removed, and a pod kept in
// between is neither told nor removed.
func TestRemovalNoticeComesBeforeTheRemoval(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	r := watchRemovals(t, ns)
	startDaemon(t, "--namespace", ns, "--removal-notice", "3s")

	told := createPod(t, ns, "told", ttl(6*time.Second))
	kept := createPod(t, ns, "kept-in-between", ttl(6*time.Second))
	time.Sleep(time.Second)
	patchPodAnnotation(t, kept, prefix+"keep", "true")

	e := waitEvent(t, told, "RemovalScheduled", 10*time.Second)
	removed := r.waitRemoved(t, told, 15*time.Second)
	if e.Type != corev1.EventTypeNormal || e.Action != "Schedule" {
		t.Errorf("RemovalScheduled event: type %s, action %q; want Normal, Schedule", e.Type, e.Action)
	}
	if !e.EventTime.Time.Before(removed) {
		t.Errorf("RemovalScheduled event at %v, not before the removal seen at %v", e.EventTime.Time, removed)
	}
	deadline := created(told).Add(6 * time.Second)
	if early := deadline.Add(-3*time.Second - time.Second); e.EventTime.Time.Before(early) {
		t.Errorf("RemovalScheduled event at %v, more than the notice before the deadline %v", e.EventTime.Time, deadline)
	}
	for _, want := range []string{
		"at " + deadline.UTC().Format(time.RFC3339) + " ", "by " + prefix + "ttl;",
		"kubectl annotate pod told -n " + ns + " --overwrite " + prefix + "ttl=", prefix + "keep=true",
	} {
		if !strings.Contains(e.Note, want) {
			t.Errorf("RemovalScheduled note %q does not contain %q", e.Note, want)
		}
	}
	r.checkOnTime(t, told, deadline)
	t.Logf("notice %s before the removal: %s", removed.Sub(e.EventTime.Time).Round(time.Millisecond), e.Note)

	time.Sleep(time.Until(created(kept).Add(8 * time.Second)))
	if n := countEvents(t, kept, "RemovalScheduled"); n != 0 {
		t.Errorf("%d RemovalScheduled events on the pod kept before its notice, want 0", n)
	}
	r.checkNotRemoved(t, kept)
}
