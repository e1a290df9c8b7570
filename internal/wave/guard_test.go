package wave

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
)

var (
	week       = []byte("after: 7d")
	minute     = []byte("after: 1m")
	twoMinutes = []byte("after: 2m")
	threshold  = Threshold{Pods: 2, Percent: 0}
)

// held is what onHeld last reported, by source.
type held map[string]int

func newTestGuard() (*Guard, held) {
	h := held{}
	g := NewGuard(threshold, time.Minute, week, after(7*24*time.Hour), func(s string, n int) { h[s] = n })
	return g, h
}

func checkAll(g *Guard, now time.Time, ps ...*corev1.Pod) (n int) {
	for _, p := range ps {
		if held, _ := g.Check(p.Namespace+"/"+p.Name, p, now); held {
			n++
		}
	}
	return n
}

func TestGuardHoldsALargeWaveNotTheSteadyFlow(t *testing.T) {
	g, h := newTestGuard()
	ps := []*corev1.Pod{pod("a", time.Hour), pod("b", time.Hour), pod("c", time.Hour), pod("old", 8*24*time.Hour)}
	hold, ok := g.Change(SourceFile, minute, after(time.Minute), pods(ps...), t0)
	if !ok || hold.Pods != 3 || hold.Source != SourceFile || hold.ID != ChangeID(week, minute) {
		t.Fatalf("Change = %+v, %v; want a hold of 3 pods", hold, ok)
	}
	if n := checkAll(g, t0, ps[:3]...); n != 3 {
		t.Errorf("%d pods held, want 3", n)
	}
	// Due under the baseline already: the steady flow is never held.
	if held, _ := g.Check("ns/old", ps[3], t0); held {
		t.Error("a pod due under the baseline is held")
	}
	// A held pod keeps the baseline's deadline.
	if _, deadline := g.Check("ns/a", ps[0], t0); !deadline.Equal(ps[0].CreationTimestamp.Add(7 * 24 * time.Hour)) {
		t.Errorf("held pod's deadline %v, want the baseline's (7d after its creation)", deadline)
	}
	if diff := cmp.Diff(held{SourceFile: 3}, h); diff != "" {
		t.Errorf("held (-want,+got):\n%s", diff)
	}
	g.Forget("ns/a")
	if h[SourceFile] != 2 {
		t.Errorf("held %d after a pod went, want 2", h[SourceFile])
	}
}

func TestGuardSmallWaveIsNotHeld(t *testing.T) {
	g, h := newTestGuard()
	ps := []*corev1.Pod{pod("a", time.Hour), pod("b", time.Hour)}
	if hold, ok := g.Change(SourceFile, minute, after(time.Minute), pods(ps...), t0); ok {
		t.Fatalf("a wave of 2 with a threshold of 2 is held: %+v", hold)
	}
	if n := checkAll(g, t0, ps...); n != 0 {
		t.Errorf("%d pods held", n)
	}
	if len(h) != 0 {
		t.Errorf("held reported: %v", h)
	}
}

func TestGuardApprove(t *testing.T) {
	g, h := newTestGuard()
	ps := []*corev1.Pod{pod("a", time.Hour), pod("b", time.Hour), pod("c", time.Hour)}
	hold, _ := g.Change(SourceFile, minute, after(time.Minute), pods(ps...), t0)
	checkAll(g, t0, ps...)
	if _, ok := g.Approve("not-" + hold.ID); ok {
		t.Fatal("another change's ID approved the hold")
	}
	if n := checkAll(g, t0, ps...); n != 3 {
		t.Fatalf("%d pods held after a wrong approval, want 3", n)
	}
	keys, ok := g.Approve(hold.ID)
	if !ok {
		t.Fatal("the held change's ID did not approve it")
	}
	if diff := cmp.Diff([]string{"ns/a", "ns/b", "ns/c"}, keys); diff != "" {
		t.Errorf("keys to decide again (-want,+got):\n%s", diff)
	}
	if n := checkAll(g, t0, ps...); n != 0 {
		t.Errorf("%d pods held after the approval", n)
	}
	if h[SourceFile] != 0 {
		t.Errorf("held %d after the approval", h[SourceFile])
	}
	if _, ok := g.Approve(hold.ID); ok {
		t.Error("an approval was taken twice")
	}
	// The approved change is the baseline: the same policy again is no change.
	if _, ok := g.Change(SourceFile, minute, after(time.Minute), pods(ps...), t0); ok {
		t.Error("the approved policy, loaded again, is held")
	}
}

func TestGuardRevert(t *testing.T) {
	g, h := newTestGuard()
	ps := []*corev1.Pod{pod("a", time.Hour), pod("b", time.Hour), pod("c", time.Hour)}
	hold, _ := g.Change(SourceFile, minute, after(time.Minute), pods(ps...), t0)
	checkAll(g, t0, ps...)
	if _, ok := g.Change(SourceFile, week, after(7*24*time.Hour), pods(ps...), t0); ok {
		t.Fatal("the revert is held")
	}
	if _, ok := g.Held(); ok {
		t.Error("a hold stands after the revert")
	}
	if h[SourceFile] != 0 {
		t.Errorf("held %d after the revert", h[SourceFile])
	}
	if _, ok := g.Approve(hold.ID); ok {
		t.Error("the reverted change can still be approved")
	}
}

func TestGuardTwoChangesInARow(t *testing.T) {
	g, _ := newTestGuard()
	ps := []*corev1.Pod{pod("a", time.Hour), pod("b", time.Hour), pod("c", time.Hour)}
	first, _ := g.Change(SourceFile, minute, after(time.Minute), pods(ps...), t0)
	// The second change is measured against the baseline (7d), not against
	// the held first one: its wave is the same 3 pods.
	second, ok := g.Change(SourceFile, twoMinutes, after(2*time.Minute), pods(ps...), t0)
	if !ok || second.Pods != 3 || second.ID == first.ID || second.ID != ChangeID(week, twoMinutes) {
		t.Fatalf("second Change = %+v, %v; want a hold of 3 pods of its own", second, ok)
	}
	if _, ok := g.Approve(first.ID); ok {
		t.Fatal("the first change's approval approved the second")
	}
	if n := checkAll(g, t0, ps...); n != 3 {
		t.Errorf("%d pods held, want 3", n)
	}
	if _, ok := g.Approve(second.ID); !ok {
		t.Error("the second change's ID did not approve it")
	}
}

func TestGuardFirstInstall(t *testing.T) {
	g := NewGuard(threshold, time.Minute, nil, nil, nil)
	ps := []*corev1.Pod{pod("a", time.Hour), pod("b", time.Hour), pod("c", time.Hour)}
	hold, ok := g.Change(SourceFile, minute, after(time.Minute), pods(ps...), t0)
	if !ok || hold.ID != ChangeID(nil, minute) {
		t.Fatalf("Change = %+v, %v; want the first install held", hold, ok)
	}
	if n := checkAll(g, t0, ps...); n != 3 {
		t.Errorf("%d pods held, want 3", n)
	}
}
