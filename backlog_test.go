package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/cache"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/podjanitor/podjanitor/internal/apitest"
)

// overdue is a Succeeded pod whose 1m ttl ended by at t0.
func overdue(name string, by time.Duration) *corev1.Pod {
	return apitest.Pod(name, t0.Add(-time.Minute-by), corev1.PodSucceeded, map[string]string{"podjanitor.io/ttl": "1m"})
}

// deletedNames is the pods deleted so far, in the order of their deletes.
func (f *fixture) deletedNames() []string {
	var names []string
	for _, a := range f.writes() {
		if a.GetVerb() == "delete" && a.GetResource().Resource == "pods" {
			names = append(names, a.(interface{ GetName() string }).GetName())
		}
	}
	return names
}

// Under the cap, the waiting pods of a namespace go most overdue first, whatever order they
// were decided in; pods that came due at the same time go in the order they
// came to wait; a pod decided later but more overdue passes the others.
func TestBacklogGoesMostOverdueFirst(t *testing.T) {
	first := overdue("first", time.Minute) // takes the burst
	a := overdue("a", 10*time.Minute)
	b := overdue("b", 20*time.Minute)
	tieLate, tieEarly := overdue("tie-2", 5*time.Minute), overdue("tie-1", 5*time.Minute)
	most := overdue("most", time.Hour)
	f := newFixture(t, Options{MaxRemovalsPerSecond: 1, RemovalBurst: 1, NoRemovalEvents: true}, first, a, b, tieLate, tieEarly, most)
	for _, p := range []*corev1.Pod{first, a, b, tieLate, tieEarly} {
		f.process(keyOf(p))
	}
	if got := f.c.state.waitingForSlot(); got != 4 {
		t.Fatalf("%d pods wait for a slot, want 4", got)
	}
	f.process(keyOf(most)) // decided last, due longest
	f.stepUntilWritten(6, 10, nil)
	want := []string{"first", "most", "b", "a", "tie-2", "tie-1"}
	if got := f.deletedNames(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("removal order %q, want %q (most overdue first, ties as they came)", got, want)
	}
	if w := metricValue(f.metrics, "podjanitor_pods_waiting_for_removal"); w != 0 {
		t.Errorf("waiting for removal %v after the backlog, want 0", w)
	}
}

// A pod decided again while it waits keeps its place by its new deadline,
// and leaves the backlog when it is no longer due or gone.
func TestBacklogFollowsDecisionsAgain(t *testing.T) {
	first, a, b, c := overdue("first", time.Minute), overdue("a", 10*time.Minute), overdue("b", 20*time.Minute), overdue("c", 30*time.Minute)
	f := newFixture(t, Options{MaxRemovalsPerSecond: 1, RemovalBurst: 1, NoRemovalEvents: true}, first, a, b, c)
	for _, p := range []*corev1.Pod{first, a, b, c} {
		f.process(keyOf(p))
	}
	kept := c.DeepCopy()
	kept.Annotations["podjanitor.io/keep"] = "true"
	if err := f.c.pods.Update(kept); err != nil {
		t.Fatal(err)
	}
	f.process(keyOf(c)) // kept now: leaves the backlog
	if err := f.c.pods.Delete(b); err != nil {
		t.Fatal(err)
	}
	f.process(keyOf(b)) // gone
	if got := f.c.state.waitingForSlot(); got != 1 {
		t.Fatalf("%d pods wait for a slot, want 1 (a)", got)
	}
	if w := metricValue(f.metrics, "podjanitor_pods_waiting_for_removal"); w != 1 {
		t.Errorf("waiting for removal %v, want 1", w)
	}
	f.stepUntilWritten(2, 5, nil)
	if got := f.deletedNames(); fmt.Sprint(got) != "[first a]" {
		t.Errorf("removed %q, want first and a", got)
	}
	if got := f.c.state.len(); got != 2 { // the removed marks of first and a
		t.Errorf("%d state entries, want 2", got)
	}
}

// After a start (or a takeover) over an overdue backlog, the first pass
// decides every cached pod before a slot is handed out: the backlog goes
// most overdue first from its first removal, not in the order the pods were
// listed, the burst included.
func TestBacklogAfterAStartGoesMostOverdueFirst(t *testing.T) {
	const n = 40
	var pods []*corev1.Pod
	for i := range n { // listed least overdue first
		pods = append(pods, overdue(fmt.Sprintf("pod-%02d", i), time.Duration(i)*time.Minute))
	}
	f := newFixture(t, Options{MaxRemovalsPerSecond: 10, RemovalBurst: 5, NoRemovalEvents: true}, pods...)
	for _, p := range pods {
		f.c.enqueue(p) // the initial list
	}
	ctx, cancel := context.WithCancel(f.ctx)
	ran := make(chan struct{})
	t.Cleanup(func() { cancel(); <-ran })
	go func() { defer close(ran); _ = f.c.Run(ctx, 1) }()
	if err := wait.PollUntilContextTimeout(ctx, time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return f.deletes() == 5, nil
	}); err != nil {
		t.Fatalf("%d removed at the start, want the burst of 5", f.deletes())
	}
	for f.deletes() < n {
		f.clock.Step(100 * time.Millisecond)
		if err := wait.PollUntilContextTimeout(ctx, time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
			return f.c.Pending() == 0 && f.c.state.settled(), nil
		}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Millisecond)
	}
	got := f.deletedNames()
	for i, name := range got {
		if want := fmt.Sprintf("pod-%02d", n-1-i); name != want {
			t.Fatalf("removal %d: %s, want %s (most overdue first); order %q", i, name, want, got)
		}
	}
}

// backlogKey is pod i's key in namespace ns.
func backlogKey(ns string, i int) cache.ObjectName {
	return cache.ObjectName{Namespace: ns, Name: fmt.Sprintf("%s-%04d", ns, i)}
}

// The namespaces with waiting pods take turns, a slot each, whatever their
// pods' deadlines: 1,500 pods an hour overdue in one namespace leave every
// other slot to 20 pods that came due later in another, which joins the
// round last; within each namespace the most overdue pods go first; a
// namespace alone takes every slot. No pod is handed out twice or lost.
func TestBacklogSharesSlotsBetweenNamespaces(t *testing.T) {
	const busy, quiet = 1500, 20
	var b backlog
	due := map[cache.ObjectName]time.Time{}
	add := func(key cache.ObjectName, at time.Time) {
		due[key] = at
		b.add(key, at)
	}
	for i := range busy {
		add(backlogKey("busy", i), t0.Add(-time.Hour-time.Duration(i*7919%busy)*time.Second))
	}
	var order []cache.ObjectName
	pop := func(n int) string {
		var namespaces []byte
		for range n {
			e := b.pop()
			order = append(order, e.key)
			namespaces = append(namespaces, e.key.Namespace[0])
		}
		return string(namespaces)
	}
	if got := pop(10); got != strings.Repeat("b", 10) {
		t.Errorf("busy alone: slots to %q, want every one to busy", got)
	}
	for i := range quiet {
		add(backlogKey("quiet", i), t0.Add(time.Duration(quiet-i)*time.Second))
	}
	if got := b.namespaceCount(); got != 2 {
		t.Errorf("%d namespaces waiting, want 2", got)
	}
	if got, want := pop(2*quiet), strings.Repeat("bq", quiet); got != want {
		t.Errorf("busy and quiet: slots to %q, want %q (in turn, the newcomer last)", got, want)
	}
	if got := b.namespaceCount(); got != 1 {
		t.Errorf("%d namespaces waiting after quiet's last pod went, want 1", got)
	}
	rest := b.len()
	if got := pop(rest); strings.Count(got, "b") != rest {
		t.Errorf("busy alone again: %d of %d slots to busy, want every one", strings.Count(got, "b"), rest)
	}
	if b.len() != 0 || b.namespaceCount() != 0 || b.turn != nil {
		t.Errorf("after the last pod: %d pods, %d namespaces, turn %v; want none", b.len(), b.namespaceCount(), b.turn)
	}

	seen := map[cache.ObjectName]bool{}
	last := map[string]time.Time{}
	for _, key := range order {
		if seen[key] {
			t.Fatalf("%v handed a slot twice", key)
		}
		seen[key] = true
		if due[key].Before(last[key.Namespace]) {
			t.Errorf("%v (due %v) went after a pod of its namespace due %v: not most overdue first", key, due[key], last[key.Namespace])
		}
		last[key.Namespace] = due[key]
	}
	if len(seen) != busy+quiet {
		t.Errorf("%d pods handed a slot, want %d", len(seen), busy+quiet)
	}
}

// A namespace whose pods all leave the backlog (no longer due, gone) leaves
// the round, wherever its turn is, and the others keep theirs; one that
// comes back joins it last.
func TestBacklogNamespaceLeavesAndJoinsTheRound(t *testing.T) {
	var b backlog
	entries := map[cache.ObjectName]*backlogEntry{}
	for _, ns := range []string{"a", "b", "c"} {
		for i := range 2 {
			key := backlogKey(ns, i)
			entries[key] = b.add(key, t0.Add(time.Duration(i)*time.Second))
		}
	}
	b.remove(entries[backlogKey("b", 0)])
	b.move(entries[backlogKey("a", 1)], t0.Add(-time.Hour)) // now a's most overdue
	if got := b.pop().key; got != backlogKey("a", 1) {
		t.Errorf("first slot to %v, want a-0001 (moved before a-0000)", got)
	}
	b.remove(entries[backlogKey("b", 1)]) // b's turn is next: it passes to c
	if got := b.namespaceCount(); got != 2 {
		t.Errorf("%d namespaces waiting after b's pods left, want 2", got)
	}
	b.add(backlogKey("b", 2), t0.Add(-time.Hour)) // back, last in the round
	var got []string
	for b.len() > 0 {
		got = append(got, b.pop().key.Name)
	}
	if want := []string{"c-0000", "a-0000", "b-0002", "c-0001"}; !slices.Equal(got, want) {
		t.Errorf("slots to %q, want %q", got, want)
	}
	if b.namespaceCount() != 0 || b.turn != nil {
		t.Errorf("after the last pod: %d namespaces, turn %v; want none", b.namespaceCount(), b.turn)
	}
}

// Under the cap (10/s), a namespace with 1,500 pods an hour overdue takes
// half the slots once a second namespace's 20 pods come due 2 s later, not
// all of them: the quiet namespace's pods go within 4 s (40 slots), where
// a single heap by deadline would have left them behind the 1,500 (150 s).
// Alone, either namespace takes the full cap; no pod is handed a slot twice.
func TestBacklogSharesTheCapBetweenNamespaces(t *testing.T) {
	const busy, quiet, perSecond = 1500, 20, 10
	clk := testingclock.NewFakeClock(t0)
	s := newPodStates(clk, clk.Now, nil)
	s.limiter = rate.NewLimiter(perSecond, 1)
	var waiting, namespaces int
	s.onWaiting = func(pods, ns int) { waiting, namespaces = pods, ns }
	slots := map[cache.ObjectName]int{}
	take := func(key cache.ObjectName) { // the key comes back with its token
		t.Helper()
		slots[key]++
		if got, _ := s.reserve(key, types.UID(key.Name), t0); got != slotNow {
			t.Fatalf("%v handed a slot: %v, want it to go now", key, got)
		}
	}
	for i := range busy {
		key := backlogKey("busy", i)
		switch got, _ := s.reserve(key, types.UID(key.Name), t0.Add(-time.Hour)); {
		case i == 0 && got == slotNow: // the free token
			slots[key]++
		case i > 0 && got == slotQueued:
		default:
			t.Fatalf("%v: slot %v", key, got)
		}
	}
	perNamespace := func(from, to time.Duration) map[string]int {
		t.Helper()
		got := map[string]int{}
		for clk.Since(t0) < to {
			clk.Step(time.Second / perSecond)
			keys, _, _ := s.grant()
			for _, key := range keys {
				if clk.Since(t0) > from {
					got[key.Namespace]++
				}
				take(key)
			}
		}
		return got
	}
	if got := perNamespace(0, 2*time.Second); got["busy"] != 2*perSecond {
		t.Errorf("busy alone, 2 s: %v slots, want the full cap (%d)", got, 2*perSecond)
	}
	for i := range quiet {
		key := backlogKey("quiet", i)
		if got, _ := s.reserve(key, types.UID(key.Name), clk.Now()); got != slotQueued {
			t.Fatalf("%v: slot %v, want queued", key, got)
		}
	}
	if waiting != busy+quiet-2*perSecond-1 || namespaces != 2 {
		t.Errorf("gauges: %d pods waiting in %d namespaces, want %d in 2", waiting, namespaces, busy+quiet-2*perSecond-1)
	}
	both := perNamespace(2*time.Second, 6*time.Second)
	if both["quiet"] != quiet || both["busy"] != quiet {
		t.Errorf("busy and quiet, 4 s at %d/s: %v slots, want %d each", perSecond, both, quiet)
	}
	if namespaces != 1 {
		t.Errorf("%d namespaces waiting after quiet's last pod went, want 1", namespaces)
	}
	if got := perNamespace(6*time.Second, 8*time.Second); got["busy"] != 2*perSecond {
		t.Errorf("busy alone again, 2 s: %v slots, want the full cap (%d)", got, 2*perSecond)
	}
	for key, n := range slots {
		if n != 1 {
			t.Errorf("%v handed %d slots, want 1", key, n)
		}
	}
	if want := 1 + 8*perSecond; len(slots) != want {
		t.Errorf("%d pods handed a slot in 8 s, want %d (the cap and the free token)", len(slots), want)
	}
}

// Two namespaces at the cap (1/s): 30 pods an hour overdue in one and 4
// pods a minute overdue in the other take the slots in turn, each
// namespace's most overdue first, and a pod of the quiet namespace not yet
// due is not handed a slot before its deadline (it is parked, not in the
// backlog), then takes its namespace's next turn.
func TestBacklogTakesNamespacesInTurn(t *testing.T) {
	var pods, busy, quiet []*corev1.Pod
	for i := range 30 {
		p := overdue(fmt.Sprintf("busy-%02d", i), time.Hour+time.Duration(i)*time.Minute)
		p.Namespace = "busy"
		busy = append(busy, p)
	}
	for i := range 4 {
		p := overdue(fmt.Sprintf("quiet-%d", i), time.Duration(i)*time.Second)
		p.Namespace = "quiet"
		quiet = append(quiet, p)
	}
	notDue := overdue("quiet-later", -5*time.Second) // due at t0+5s
	notDue.Namespace = "quiet"
	pods = slices.Concat(busy, quiet, []*corev1.Pod{notDue})
	f := newFixture(t, Options{MaxRemovalsPerSecond: 1, RemovalBurst: 1, NoRemovalEvents: true}, pods...)
	for _, p := range pods {
		f.process(keyOf(p))
	}
	if got, ns := f.c.state.waitingForSlot(), f.c.state.namespacesWaiting(); got != 33 || ns != 2 {
		t.Fatalf("%d pods wait for a slot in %d namespaces, want 33 (the not due one parked) in 2", got, ns)
	}
	if ns := metricValue(f.metrics, "podjanitor_removal_backlog_namespaces"); ns != 2 {
		t.Errorf("podjanitor_removal_backlog_namespaces %v, want 2", ns)
	}
	f.stepUntilWritten(12, 15, func(second int) {
		if slices.Contains(f.deletedNames(), notDue.Name) && f.clock.Since(t0) < 5*time.Second {
			t.Fatalf("%s removed %v after t0, before its deadline (5 s)", notDue.Name, f.clock.Since(t0))
		}
	})
	// busy-00 took the free token; then busy and quiet in turn, each most
	// overdue first; quiet-later, due at 5 s, in its namespace's turn
	// after the pods of its namespace that waited before it.
	want := []string{"busy-00", "busy-29", "quiet-3", "busy-28", "quiet-2", "busy-27", "quiet-1", "busy-26", "quiet-0", "busy-25", "quiet-later", "busy-24"}
	if got := f.deletedNames(); !slices.Equal(got, want) {
		t.Errorf("removal order %q,\nwant %q", got, want)
	}
	if ns := metricValue(f.metrics, "podjanitor_removal_backlog_namespaces"); ns != 1 {
		t.Errorf("podjanitor_removal_backlog_namespaces %v after quiet's pods went, want 1", ns)
	}
}

// Any order of pods coming to wait, moving and leaving over five
// namespaces: the backlog hands each waiting pod one slot at most, the most
// overdue of its namespace, and while a namespace waits no other takes two
// slots (nor one that came to wait after it did); the counts follow.
func TestBacklogIsFairUnderAnyOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 53))
	var b backlog
	waiting := map[cache.ObjectName]*backlogEntry{}
	// since[ns] is, for each namespace waiting, the slots the others may
	// take before its turn: one each of those that waited when it began
	// to wait or last had its turn.
	since := map[string]map[string]int{}
	others := func(ns string) map[string]int {
		left := map[string]int{}
		for key := range waiting {
			if key.Namespace != ns {
				left[key.Namespace] = 1
			}
		}
		return left
	}
	next := 0
	for step := range 20000 {
		switch op := rng.IntN(10); {
		case op < 4: // a pod comes to wait
			ns := fmt.Sprintf("ns-%d", rng.IntN(5))
			key := backlogKey(ns, next)
			next++
			if since[ns] == nil {
				since[ns] = others(ns)
			}
			waiting[key] = b.add(key, t0.Add(time.Duration(rng.IntN(100))*time.Second))
		case op < 5 && len(waiting) > 0: // one is decided again
			for _, e := range waiting {
				b.move(e, t0.Add(time.Duration(rng.IntN(100))*time.Second))
				break
			}
		case op < 6 && len(waiting) > 0: // one leaves: gone, or no longer due
			for key, e := range waiting {
				b.remove(e)
				delete(waiting, key)
				break
			}
		case len(waiting) > 0: // a slot
			e := b.pop()
			if _, ok := waiting[e.key]; !ok {
				t.Fatalf("step %d: %v handed a slot, but it does not wait", step, e.key)
			}
			delete(waiting, e.key)
			ns := e.key.Namespace
			for key, o := range waiting {
				if key.Namespace == ns && o.before(e) {
					t.Fatalf("step %d: %v went before %v, more overdue in its namespace", step, e.key, key)
				}
			}
			for other, left := range since {
				if other == ns {
					continue
				}
				if left[ns]--; left[ns] < 0 {
					t.Fatalf("step %d: %s took a slot before %s's turn", step, ns, other)
				}
			}
			since[ns] = others(ns)
		}
		namespaces := map[string]bool{}
		for key := range waiting {
			namespaces[key.Namespace] = true
		}
		for ns := range since {
			if !namespaces[ns] {
				delete(since, ns)
			}
		}
		if b.len() != len(waiting) || b.namespaceCount() != len(namespaces) {
			t.Fatalf("step %d: backlog counts %d pods in %d namespaces, want %d in %d", step, b.len(), b.namespaceCount(), len(waiting), len(namespaces))
		}
	}
}
