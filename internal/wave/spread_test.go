package wave

import (
	"fmt"
	"testing"
	"time"

	"k8s.io/client-go/tools/cache"
)

var spreadT0 = time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)

// spreadWave is a wave of n pods of namespace ns, none due before.
func spreadWave(ns string, n int) Wave {
	w := Wave{InScope: n}
	for i := range n {
		w.Pods = append(w.Pods, fmt.Sprintf("%s/p%d", ns, i))
		w.Was = append(w.Was, time.Time{})
	}
	return w
}

func spreadKey(ns string, i int) cache.ObjectName {
	return cache.ObjectName{Namespace: ns, Name: fmt.Sprintf("p%d", i)}
}

func newTestSpread(held *int) *Spread {
	return NewSpread(Threshold{Pods: 10, Percent: 10, MinPods: 10}, time.Minute, 2*time.Second,
		func() int { return 1000 }, func(_ string, n int) { *held = n })
}

// One change made in three namespaces of 5 pods each, none held on its own
// (at most 10): the third passes the threshold together with the two
// before, still pending, and all 15 are held until the approval.
func TestSpreadHoldsChangesMadeTogether(t *testing.T) {
	var held int
	s := newTestSpread(&held)
	for i, ns := range []string{"a", "b"} {
		if _, ok := s.Add(ns, "change", spreadWave(ns, 5), spreadT0.Add(time.Duration(i)*100*time.Millisecond)); ok {
			t.Fatalf("held after %d namespaces of 5 pods", i+1)
		}
	}
	now := spreadT0.Add(300 * time.Millisecond)
	if ok, again := s.CheckPod(spreadKey("a", 0), nil, now); !ok || !again.Equal(spreadT0.Add(100*time.Millisecond+2*time.Second)) {
		t.Fatalf("a pending pod: held %v until %v; want held until settle after the latest change", ok, again)
	}
	h, ok := s.Add("c", "change", spreadWave("c", 5), now)
	if !ok || h.Pods != 15 || h.Source != SourceSpread {
		t.Fatalf("hold %+v, %v; want 15 pods held", h, ok)
	}
	if held != 15 {
		t.Errorf("onHeld told %d, want 15", held)
	}
	// Held past settle, with no old deadline to go at.
	later := now.Add(time.Hour)
	for _, ns := range []string{"a", "b", "c"} {
		if ok, again := s.CheckPod(spreadKey(ns, 4), nil, later); !ok || !again.IsZero() {
			t.Errorf("%s's pod: held %v, again %v; want held, no time", ns, ok, again)
		}
	}
	if _, namespaces, ok := s.Held(); !ok || fmt.Sprint(namespaces) != "[a b c]" {
		t.Errorf("held namespaces %v, %v", namespaces, ok)
	}
	if _, ok := s.Approve("0123456789ab"); ok {
		t.Fatal("another ID approved the hold")
	}
	keys, ok := s.Approve(h.ID)
	if !ok || len(keys) != 15 || held != 0 {
		t.Fatalf("approved %d keys, %v, held %d; want 15, true, 0", len(keys), ok, held)
	}
	if ok, _ := s.CheckPod(spreadKey("a", 0), nil, later); ok {
		t.Error("a pod held after the approval")
	}
}

// A lone change's pods go settle after it; changes let through count for a
// window, so changes made one after another, each settled before the next,
// are held once they pass the threshold together, and not after the window.
func TestSpreadLetsSettledChangesGoAndCountsThem(t *testing.T) {
	var held int
	s := newTestSpread(&held)
	s.Add("a", "change", spreadWave("a", 6), spreadT0)
	if ok, _ := s.CheckPod(spreadKey("a", 0), nil, spreadT0.Add(2*time.Second)); ok {
		t.Fatal("a pod held settle after its change, with nothing held")
	}
	// 6 gone, 5 more within the window: 11 > 10.
	if _, ok := s.Add("b", "change", spreadWave("b", 5), spreadT0.Add(30*time.Second)); !ok {
		t.Fatal("not held: 6 pods let through 30 s before and 5 now")
	}
	s2 := newTestSpread(&held)
	s2.Add("a", "change", spreadWave("a", 6), spreadT0)
	s2.CheckPod(spreadKey("a", 0), nil, spreadT0.Add(2*time.Second))
	if _, ok := s2.Add("b", "change", spreadWave("b", 5), spreadT0.Add(3*time.Minute)); ok {
		t.Error("held: the 6 pods let through are over a window old")
	}
}

// A pending or held pod whose deadline before the change comes goes then,
// and a pod forgotten (gone, or no longer due) is held no more.
func TestSpreadLetsOldDeadlinesGo(t *testing.T) {
	var held int
	s := newTestSpread(&held)
	w := spreadWave("a", 11)
	w.Was[0] = spreadT0.Add(time.Second)
	h, ok := s.Add("a", "change", w, spreadT0)
	if !ok {
		t.Fatal("11 pods not held")
	}
	if ok, again := s.CheckPod(spreadKey("a", 0), nil, spreadT0.Add(500*time.Millisecond)); !ok || !again.Equal(spreadT0.Add(time.Second)) {
		t.Errorf("held %v until %v; want held until its old deadline", ok, again)
	}
	if ok, _ := s.CheckPod(spreadKey("a", 0), nil, spreadT0.Add(time.Second)); ok {
		t.Error("held at its old deadline")
	}
	s.ForgetPod(spreadKey("a", 1))
	if held != 9 {
		t.Errorf("onHeld told %d, want 9", held)
	}
	if keys, _ := s.Approve(h.ID); len(keys) != 9 {
		t.Errorf("approved %d keys, want 9", len(keys))
	}
}

// One namespace changed again and again (a tenant toggling a policy) counts
// once, by the most of its pods that went together: alone it cannot make
// the Spread hold another namespace's small change.
func TestSpreadCountsANamespaceOnce(t *testing.T) {
	var held int
	s := newTestSpread(&held)
	now := spreadT0
	for range 5 {
		if _, ok := s.Add("a", "change", spreadWave("a", 6), now); ok {
			t.Fatal("a namespace's 6 pods held, changed again")
		}
		now = now.Add(3 * time.Second)
		s.CheckPod(spreadKey("a", 0), nil, now) // settled: gone
	}
	if _, ok := s.Add("b", "change", spreadWave("b", 1), now); ok {
		t.Error("b's one pod held: a's repeated changes counted more than once (6 + 1 is under 10)")
	}
}

// A hold whose changes are all reverted ends: later changes are measured
// as if it never was. One left with other changes is named by them, and so
// is one a change joins: an approval covers the hold as it stood.
func TestSpreadHoldOfRevertedChangesEnds(t *testing.T) {
	var held int
	s := newTestSpread(&held)
	for _, ns := range []string{"a", "b", "c"} {
		s.Add(ns, "change", spreadWave(ns, 5), spreadT0)
	}
	h, _, ok := s.Held()
	if !ok {
		t.Fatal("15 pods of 3 namespaces not held")
	}
	s.Add("d", "change", spreadWave("d", 5), spreadT0)
	joined, _, _ := s.Held()
	if joined.ID == h.ID {
		t.Error("a change joining the hold left its ID as approved before it joined")
	}
	if _, ok := s.Approve(h.ID); ok {
		t.Error("the approval of the hold before d joined approved d's change")
	}
	s.Revert("a")
	s.Revert("b")
	if ok, _ := s.CheckPod(spreadKey("a", 0), nil, spreadT0); ok {
		t.Error("a reverted namespace's pod still held")
	}
	if ok, _ := s.CheckPod(spreadKey("c", 0), nil, spreadT0); !ok {
		t.Error("c's pod, its change not reverted, is not held")
	}
	if held != 10 {
		t.Errorf("onHeld told %d, want 10", held)
	}
	s.Revert("c")
	s.Revert("d")
	if h, _, ok := s.Held(); ok {
		t.Fatalf("a hold of reverted changes lasts: %+v", h)
	}
	if held != 0 {
		t.Errorf("onHeld told %d, want 0", held)
	}
	later := spreadT0.Add(time.Hour)
	if _, ok := s.Add("e", "change", spreadWave("e", 5), later); ok {
		t.Error("a lone change of 5 pods held after the reverted hold")
	}
	if ok, _ := s.CheckPod(spreadKey("e", 0), nil, later.Add(3*time.Second)); ok {
		t.Error("a lone change's pod held past settle")
	}
}
