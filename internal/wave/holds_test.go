package wave

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

func nsPod(namespace, name string, ago time.Duration) *corev1.Pod {
	p := pod(name, ago)
	p.Namespace = namespace
	return p
}

// TestHoldsMeasureEachScopeAlone: a scope's wave is held by itself, the
// held pods of all scopes are counted together, another scope's pods are
// not held, and a revert ends the scope's hold and keeps nothing for it.
func TestHoldsMeasureEachScopeAlone(t *testing.T) {
	total := -1
	h := NewHolds(SourceTenant, threshold, time.Minute, func(s string, n int) {
		if s != SourceTenant {
			t.Errorf("source %q", s)
		}
		total = n
	})
	a := []*corev1.Pod{nsPod("a", "1", time.Hour), nsPod("a", "2", time.Hour), nsPod("a", "3", time.Hour)}
	b := []*corev1.Pod{nsPod("b", "1", time.Hour), nsPod("b", "2", time.Hour), nsPod("b", "3", time.Hour)}
	hold, ok := h.Change("a", "a/p", week, after(7*24*time.Hour), minute, after(time.Minute), pods(a...), t0)
	if !ok || hold.Pods != 3 || hold.Source != SourceTenant {
		t.Fatalf("Change(a) = %+v, %v; want a hold of 3", hold, ok)
	}
	// A small wave in b: not held, nothing kept.
	if _, ok := h.Change("b", "b/p", week, after(7*24*time.Hour), minute, after(time.Minute), pods(b[:2]...), t0); ok {
		t.Fatal("a wave of 2 (threshold 2) held")
	}
	for _, p := range b {
		if held, _ := h.Check("b", "b/"+p.Name, p, t0); held {
			t.Errorf("pod b/%s held, b has no held change", p.Name)
		}
	}
	for _, p := range a {
		if held, _ := h.Check("a", "a/"+p.Name, p, t0); !held {
			t.Errorf("pod a/%s not held", p.Name)
		}
	}
	if total != 3 {
		t.Errorf("held %d, want 3", total)
	}
	if _, _, ok := h.Held("a"); !ok {
		t.Error("a not held")
	}
	// The revert: back to the baseline.
	if _, ok := h.Change("a", "a/p", minute, after(time.Minute), week, after(7*24*time.Hour), pods(a...), t0); ok {
		t.Fatal("the revert is held")
	}
	if _, _, ok := h.Held("a"); ok || total != 0 || len(h.scopes) != 0 {
		t.Errorf("after the revert: held %v, total %d, %d scopes kept; want none", ok, total, len(h.scopes))
	}
	if held, _ := h.Check("a", "a/1", a[0], t0); held {
		t.Error("a pod held after the revert")
	}
}

// TestHoldsApproveOnTheObjectThatChanged: an approval is taken only with
// the held change's ID, on the object that made it; another change of the
// scope while held is measured against the baseline and needs its own.
func TestHoldsApproveOnTheObjectThatChanged(t *testing.T) {
	h := NewHolds(SourceTenant, threshold, time.Minute, nil)
	a := []*corev1.Pod{nsPod("a", "1", time.Hour), nsPod("a", "2", time.Hour), nsPod("a", "3", time.Hour)}
	first, _ := h.Change("a", "a/p", week, after(7*24*time.Hour), minute, after(time.Minute), pods(a...), t0)
	second, ok := h.Change("a", "a/q", minute, after(time.Minute), twoMinutes, after(2*time.Minute), pods(a...), t0)
	if !ok || second.ID != ChangeID(week, twoMinutes) || second.ID == first.ID {
		t.Fatalf("second change %+v, %v; want held against the baseline (7d), its own ID", second, ok)
	}
	for _, p := range a {
		h.Check("a", "a/"+p.Name, p, t0)
	}
	if _, ok := h.Approve("a", "a/q", first.ID); ok {
		t.Error("the first change's ID approved the second")
	}
	if _, ok := h.Approve("a", "a/p", second.ID); ok {
		t.Error("an approval on another object than the one that changed was taken")
	}
	if _, ok := h.Approve("b", "a/q", second.ID); ok {
		t.Error("an approval in another scope was taken")
	}
	keys, ok := h.Approve("a", "a/q", second.ID)
	if !ok || len(keys) != 3 {
		t.Fatalf("Approve = %v, %v; want the 3 held keys", keys, ok)
	}
	if held, _ := h.Check("a", "a/1", a[0], t0); held {
		t.Error("a pod held after the approval")
	}
	// End: the object that made a hold is gone.
	h.Change("a", "a/p", week, after(7*24*time.Hour), minute, after(time.Minute), pods(a...), t0)
	if h.End("a", "a/other") {
		t.Error("End by another object ended the hold")
	}
	if !h.End("a", "a/p") {
		t.Error("End by the object that made the hold did not end it")
	}
	if _, _, ok := h.Held("a"); ok {
		t.Error("held after End")
	}
}

// TestHoldsRevertLeavesTheSpread: changes of three scopes, each small
// enough on its own, are held together by the Spread; each scope changed
// back to what it was before leaves the hold, and the last one ends it.
func TestHoldsRevertLeavesTheSpread(t *testing.T) {
	var spreadHeld int
	s := NewSpread(Threshold{Pods: 4}, time.Minute, 2*time.Second, func() int { return 1000 }, func(_ string, n int) { spreadHeld = n })
	h := NewHolds(SourceTenant, Threshold{Pods: 10}, time.Minute, nil)
	h.SetSpread(s)
	scopes := []string{"a", "b", "c"}
	for _, ns := range scopes {
		ps := pods(nsPod(ns, "1", time.Hour), nsPod(ns, "2", time.Hour))
		if _, ok := h.Change(ns, ns+"/p", week, after(7*24*time.Hour), minute, after(time.Minute), ps, t0); ok {
			t.Fatalf("scope %s's 2 pods held on their own", ns)
		}
	}
	if _, _, ok := s.Held(); !ok || spreadHeld != 6 {
		t.Fatalf("the Spread holds %d pods (held %v), want 6", spreadHeld, ok)
	}
	for i, ns := range scopes {
		ps := pods(nsPod(ns, "1", time.Hour), nsPod(ns, "2", time.Hour))
		h.Change(ns, ns+"/p", minute, after(time.Minute), week, after(7*24*time.Hour), ps, t0)
		if _, ok := h.Before(ns, t0); ok {
			t.Errorf("scope %s reverted still waits", ns)
		}
		if want := 2 * (len(scopes) - i - 1); spreadHeld != want {
			t.Errorf("after %s's revert the Spread holds %d pods, want %d", ns, spreadHeld, want)
		}
	}
	if hold, _, ok := s.Held(); ok {
		t.Errorf("a Spread of reverted changes still holds: %+v", hold)
	}
}
