package main

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	core "k8s.io/client-go/testing"

	"github.com/podjanitor/podjanitor/internal/apitest"
	"github.com/podjanitor/podjanitor/policy"
)

func TestNoticeWait(t *testing.T) {
	for _, tc := range []struct {
		wait, notice, want time.Duration
	}{
		{wait: time.Hour, notice: 0, want: 0},                               // no notice
		{wait: time.Hour, notice: 10 * time.Minute, want: 50 * time.Minute}, // parked until the notice
		{wait: 10 * time.Minute, notice: 10 * time.Minute, want: 0},         // due now
		{wait: time.Minute, notice: 10 * time.Minute, want: 0},              // late: told at once
	} {
		if got := noticeWait(tc.wait, tc.notice); got != tc.want {
			t.Errorf("noticeWait(%v, %v) = %v, want %v", tc.wait, tc.notice, got, tc.want)
		}
	}
}

// checkParked checks that syncing the pod parks it for want, until its deadline or its notice.
func (f *fixture) checkParked(pod *corev1.Pod, want time.Duration) {
	f.t.Helper()
	res, err := f.c.syncHandler(f.ctx, keyOf(pod))
	if err != nil {
		f.t.Fatal(err)
	}
	if diff := cmp.Diff(Result{RequeueAfter: want, parking: untilDeadline}, res, cmp.AllowUnexported(Result{})); diff != "" {
		f.t.Errorf("result (-want,+got):\n%s", diff)
	}
}

// The pod is told once, --removal-notice before its deadline, and goes at
// its deadline.
func TestRemovalNoticeOnceBeforeTheDeadline(t *testing.T) {
	pod := apitest.Pod("web", t0.Add(-10*time.Minute), corev1.PodPending, map[string]string{"podjanitor.io/ttl": "1h"})
	f := newFixture(t, Options{RemovalNotice: 10 * time.Minute}, pod)

	f.checkParked(pod, 40*time.Minute) // until the notice
	f.process(keyOf(pod))
	if got := f.events(); len(got) != 0 {
		t.Fatalf("events before the notice is due: %q", got)
	}
	if f.stepAndCheckReady(40*time.Minute - time.Millisecond) {
		t.Fatal("pod became ready before its notice")
	}
	if !f.stepAndWaitReady(time.Millisecond) {
		t.Fatal("pod did not become ready at its notice")
	}
	f.next()
	got := f.events()
	want := "Normal RemovalScheduled Schedule Removal (delete) scheduled at 2026-11-29T12:50:00Z (in 10m0s) by podjanitor.io/ttl; " +
		"to extend: kubectl annotate pod web -n default --overwrite podjanitor.io/ttl=<duration from creation>, or podjanitor.io/keep=true"
	if len(got) != 1 || got[0] != want {
		t.Fatalf("events at the notice = %q, want %q", got, want)
	}
	checkActions(t, nil, f.writes())

	// Once per deadline: a pod event in between tells nothing new.
	f.clock.Step(time.Minute)
	f.checkParked(pod, 9*time.Minute)
	f.process(keyOf(pod))
	if got := f.events(); len(got) != 0 {
		t.Errorf("events after the notice = %q, want none", got)
	}
	if f.stepAndCheckReady(9*time.Minute - time.Millisecond) {
		t.Fatal("pod became ready before its deadline")
	}
	if !f.stepAndWaitReady(time.Millisecond) {
		t.Fatal("pod did not become ready at its deadline")
	}
	f.next()
	checkActions(t, []core.Action{deleteAction(pod)}, f.writes())
	if got := f.events(); len(got) != 1 || !strings.HasPrefix(got[0], "Normal LifetimeExpired Delete ") {
		t.Errorf("events = %q, want one LifetimeExpired", got)
	}
	f.c.pods.Delete(pod)
	f.process(keyOf(pod))
	if n := f.c.state.len(); n != 0 {
		t.Errorf("%d pod entries after the pod is gone, want 0", n)
	}
}

// Without --removal-notice (nor a rule's), a pod is parked until its
// deadline and told nothing.
func TestNoRemovalNoticeByDefault(t *testing.T) {
	pod := apitest.Pod("web", t0.Add(-55*time.Minute), corev1.PodPending, map[string]string{"podjanitor.io/ttl": "1h"})
	f := newFixture(t, Options{}, pod)
	f.checkParked(pod, 5*time.Minute)
	f.process(keyOf(pod))
	if got := f.events(); len(got) != 0 {
		t.Errorf("events = %q, want none", got)
	}
	if n := f.c.state.len(); n != 1 {
		t.Errorf("%d pod entries, want 1 (parked, without marks)", n)
	}
}

// A rule's own notice overrides the flag's.
func TestRuleRemovalNoticeOverridesTheFlag(t *testing.T) {
	pod := apitest.Pod("web", t0.Add(-10*time.Minute), corev1.PodPending, nil)
	f := newFixture(t, Options{RemovalNotice: 10 * time.Minute}, pod)
	d := policy.Decision{Deadline: t0.Add(50 * time.Minute), Action: policy.ActionDelete, Source: "rule/pending", RemovalNotice: time.Hour}
	res := f.c.untilDue(pod, d, 50*time.Minute)
	if want := (Result{RequeueAfter: 50 * time.Minute, parking: untilDeadline}); res != want {
		t.Errorf("result = %+v, want %+v", res, want)
	}
	got := f.events()
	if len(got) != 1 || !strings.Contains(got[0], "(in 50m0s) by rule/pending; to extend: kubectl annotate pod web -n default --overwrite podjanitor.io/ttl=") {
		t.Errorf("events = %q, want the notice of rule/pending", got)
	}
}

// A pod first seen less than the notice before its deadline is told at
// once and still goes at its deadline; one already due is removed at once,
// untold.
func TestRemovalNoticeNeverDelaysTheRemoval(t *testing.T) {
	late := apitest.Pod("late", t0.Add(-58*time.Minute), corev1.PodPending, map[string]string{"podjanitor.io/ttl": "1h"})
	due := apitest.Pod("due", t0.Add(-2*time.Hour), corev1.PodPending, map[string]string{"podjanitor.io/ttl": "1h"})
	f := newFixture(t, Options{RemovalNotice: 10 * time.Minute}, late, due)

	f.checkParked(late, 2*time.Minute)
	if got := f.events(); len(got) != 1 || !strings.HasPrefix(got[0], "Normal RemovalScheduled Schedule Removal (delete) scheduled at 2026-11-29T12:02:00Z (in 2m0s)") {
		t.Errorf("events = %q, want the notice at once", got)
	}
	f.process(keyOf(due))
	checkActions(t, []core.Action{deleteAction(due)}, f.writes())
	if got := f.events(); len(got) != 1 || !strings.HasPrefix(got[0], "Normal LifetimeExpired") {
		t.Errorf("events = %q, want the removal's alone", got)
	}
}

// A pod kept after its notice is not removed nor told again; a pod whose
// deadline moves later is told again, of the new deadline.
func TestRemovalNoticeAfterAChange(t *testing.T) {
	pod := apitest.Pod("web", t0.Add(-55*time.Minute), corev1.PodPending, map[string]string{"podjanitor.io/ttl": "1h"})
	kept := apitest.Pod("kept", t0.Add(-55*time.Minute), corev1.PodPending, map[string]string{"podjanitor.io/ttl": "1h"})
	f := newFixture(t, Options{RemovalNotice: 10 * time.Minute}, pod, kept)
	f.process(keyOf(pod))
	f.process(keyOf(kept))
	if got := f.events(); len(got) != 2 {
		t.Fatalf("events = %q, want two notices", got)
	}

	keptNow := kept.DeepCopy()
	keptNow.Annotations["podjanitor.io/keep"] = "true"
	f.setPod(keptNow)
	f.process(keyOf(kept))

	longer := pod.DeepCopy()
	longer.Annotations["podjanitor.io/ttl"] = "2h"
	f.setPod(longer)
	f.checkParked(longer, 55*time.Minute) // until the new deadline's notice
	f.process(keyOf(longer))
	if got := f.events(); len(got) != 0 {
		t.Fatalf("events = %q, want none until the new deadline's notice", got)
	}
	if !f.stepAndWaitReady(55 * time.Minute) {
		t.Fatal("pod did not become ready at its new notice")
	}
	f.next()
	if got := f.events(); len(got) != 1 || !strings.HasPrefix(got[0], "Normal RemovalScheduled Schedule Removal (delete) scheduled at 2026-11-29T13:05:00Z (in 10m0s)") {
		t.Errorf("events = %q, want the new deadline's notice", got)
	}
	if !f.stepAndWaitReady(10 * time.Minute) {
		t.Fatal("pod did not become ready at its new deadline")
	}
	f.next()
	checkActions(t, []core.Action{deleteAction(longer)}, f.writes())
	if got := f.events(); len(got) != 1 || !strings.HasPrefix(got[0], "Normal LifetimeExpired") {
		t.Errorf("events = %q, want the removal's alone", got)
	}
}

// Notices take the removal events' budget: a wave of them over it is left
// out and counted, never waited for.
func TestRemovalNoticesOverTheBudgetAreDropped(t *testing.T) {
	var pods []*corev1.Pod
	for i := range 60 {
		pods = append(pods, apitest.Pod("p"+strings.Repeat("x", i), t0.Add(-55*time.Minute), corev1.PodPending, map[string]string{"podjanitor.io/ttl": "1h"}))
	}
	f := newFixture(t, Options{RemovalNotice: 10 * time.Minute}, pods...)
	for _, p := range pods {
		f.checkParked(p, 5*time.Minute)
	}
	if got := len(f.events()); got != 50 {
		t.Errorf("%d notices, want 50 (the burst of the removal events' budget)", got)
	}
	if got := metricValue(f.metrics, "podjanitor_warnings_dropped_total", "reason", "RemovalScheduled"); got != 10 {
		t.Errorf("warnings_dropped_total{reason=RemovalScheduled} = %v, want 10", got)
	}
}

// A dry run words the notice as what would happen.
func TestRemovalNoticeInADryRun(t *testing.T) {
	pod := apitest.Pod("web", t0.Add(-55*time.Minute), corev1.PodPending, map[string]string{"podjanitor.io/expires-at": "2026-11-29T12:05:00Z"})
	f := newFixture(t, Options{RemovalNotice: 10 * time.Minute, DryRun: true}, pod)
	f.checkParked(pod, 5*time.Minute)
	want := "Normal RemovalScheduled Schedule Dry run: would delete pod at 2026-11-29T12:05:00Z (in 5m0s) by podjanitor.io/expires-at; " +
		"to extend: kubectl annotate pod web -n default --overwrite podjanitor.io/expires-at=<RFC 3339 time>, or podjanitor.io/keep=true"
	if got := f.events(); len(got) != 1 || got[0] != want {
		t.Errorf("events = %q, want %q", got, want)
	}
}

// --removal-events=false leaves out the removals' events, not the notices.
func TestRemovalNoticeWithoutRemovalEvents(t *testing.T) {
	pod := apitest.Pod("web", t0.Add(-55*time.Minute), corev1.PodPending, map[string]string{"podjanitor.io/ttl": "1h"})
	f := newFixture(t, Options{RemovalNotice: 10 * time.Minute, NoRemovalEvents: true}, pod)
	f.checkParked(pod, 5*time.Minute)
	if got := f.events(); len(got) != 1 || !strings.HasPrefix(got[0], "Normal RemovalScheduled ") {
		t.Errorf("events = %q, want the notice", got)
	}
}
