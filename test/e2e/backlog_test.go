//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
)

// A start over 3,000 overdue pods with mixed deadlines: the backlog drains at
// the cap most overdue first (by the order of the removals the API server
// reports), not in the order the pods were listed, and the gauges of the
// pods waiting for a slot and of the time to drain them fall to 0 with it.
func TestBacklogDrainsMostOverdueFirst(t *testing.T) {
	t.Parallel()
	const (
		n, groups = 3000, 30
		perSecond = 200
	)
	ns := newNamespace(t)
	// A watch that resumes where it broke off: the API server closes a
	// watcher that falls behind 3,000 creations on a busy machine.
	r := watchRemovalsDurably(t, ns)
	base := time.Now().Add(-time.Minute)
	// Group g is overdue by 30-g minutes; the names (the list order) mix the groups.
	group := func(i int) int { return i * 7 % groups }
	pods := createPods(t, n, func(i int) *corev1.Pod {
		return pod(ns, fmt.Sprintf("backlog-%04d", i), expiresAt(base.Add(-time.Duration(groups-group(i))*time.Minute)))
	})
	groupOf := map[types.UID]int{}
	for i, p := range pods {
		groupOf[p.UID] = group(i)
	}

	d := startDaemon(t, "--namespace", ns, "--hold-waves=false", "--metrics-bind-address", "127.0.0.1:0",
		"--max-deletions-per-second", fmt.Sprint(perSecond))
	d.waitLog("Serving metrics endpoint", 30*time.Second)
	maxWaiting, checkedETA := 0.0, false
	deadline := time.Now().Add(2 * time.Minute)
	for r.count() < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d pods removed after 2 minutes", r.count(), n)
		}
		m := d.scrape(t)
		waiting, eta := m.sum("podjanitor_pods_waiting_for_removal"), m.sum("podjanitor_removal_backlog_seconds")
		maxWaiting = max(maxWaiting, waiting)
		if waiting > 0 {
			// The two gauges are set one after the other as the pods go:
			// a scrape may see them a few removals apart.
			if want := waiting / perSecond; math.Abs(eta-want) > 0.25 {
				t.Errorf("backlog of %v pods: %v s to drain, want %v at %d/s", waiting, eta, want, perSecond)
			}
			checkedETA = true
		}
		time.Sleep(200 * time.Millisecond)
	}
	if maxWaiting < n/2 || !checkedETA {
		t.Errorf("at most %v pods seen waiting for a slot, want most of the %d", maxWaiting, n)
	}
	if err := wait.PollUntilContextTimeout(ctxFor(t), 200*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		m := d.scrape(t)
		return m.sum("podjanitor_pods_waiting_for_removal") == 0 && m.sum("podjanitor_removal_backlog_seconds") == 0, nil
	}); err != nil {
		m := d.scrape(t)
		t.Errorf("after the backlog: %v waiting, %v s to drain; want 0 and 0", m.sum("podjanitor_pods_waiting_for_removal"), m.sum("podjanitor_removal_backlog_seconds"))
	}

	// The removals in the order the watch saw them.
	type removal struct {
		at    time.Time
		group int
		name  string
	}
	var order []removal
	for _, p := range pods {
		at, _ := r.get(p.UID)
		order = append(order, removal{at, groupOf[p.UID], p.Name})
	}
	sort.SliceStable(order, func(i, j int) bool { return order[i].at.Before(order[j].at) })
	// Workers remove the pods given slots together in parallel, so two
	// pods of neighbouring groups may be seen swapped; no removal is two
	// groups behind one before it.
	highest, inversions := 0, 0
	var bad []string
	for i, o := range order {
		if o.group < highest {
			inversions++
		}
		if o.group < highest-1 && len(bad) < 10 {
			bad = append(bad, fmt.Sprintf("#%d %s (overdue %d min) after one overdue %d min", i, o.name, groups-o.group, groups-highest))
		}
		highest = max(highest, o.group)
	}
	if len(bad) > 0 {
		t.Errorf("removals out of deadline order:\n%s", strings.Join(bad, "\n"))
	}
	firsts := make([]int, 0, 10)
	for _, o := range order[:10] {
		firsts = append(firsts, groups-o.group)
	}
	t.Logf("%d removals, %d seen after a later deadline's; the first 10 overdue by %v minutes; most pods waiting %v", n, inversions, firsts, maxWaiting)
	if !slices.Equal(firsts, slices.Repeat([]int{groups}, 10)) {
		t.Errorf("the first removals were overdue by %v minutes, want the most overdue (%d)", firsts, groups)
	}
}

// Two namespaces at a cap of 10 removals a second: one with 400 pods an
// hour overdue, the other with 20 pods of ttl 5s created once the first
// one's backlog drains. The namespaces take the slots in turn, so the
// second namespace's pods go within a few seconds of their deadlines (20
// pods at half the cap: 4 s), none before it, while the first's backlog
// still waits; a single heap by deadline left them behind that whole
// backlog (over 30 s late).
func TestBacklogSharesTheCapBetweenNamespaces(t *testing.T) {
	t.Parallel()
	const (
		busyPods, quietPods, perSecond = 400, 20, 10
		quietTTL                       = 5 * time.Second
		// 20 pods at half the cap take 4 s; a busy machine's API server and
		// workers add a few seconds to that. A single heap: over 30 s.
		quietLateness = 12 * time.Second
	)
	run := fmt.Sprintf("%04d", rand.IntN(10000))
	busy, quiet := newNamespace(t), newNamespace(t)
	rBusy, rQuiet := watchRemovalsDurably(t, busy), watchRemovals(t, quiet)
	overdue := time.Now().Add(-time.Hour)
	createPods(t, busyPods, func(i int) *corev1.Pod {
		return pod(busy, fmt.Sprintf("busy-%04d", i), label(nsRunLabel, run), expiresAt(overdue.Add(-time.Duration(i)*time.Second)))
	})
	d := startDaemon(t, "--label-selector", nsRunLabel+"="+run, "--hold-waves=false", "--metrics-bind-address", "127.0.0.1:0",
		"--max-deletions-per-second", fmt.Sprint(perSecond), "--deletion-burst", "1")
	if err := wait.PollUntilContextTimeout(ctxFor(t), 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		return rBusy.count() >= 2*perSecond, nil
	}); err != nil {
		t.Fatalf("%d of the busy namespace's pods removed after a minute, want %d", rBusy.count(), 2*perSecond)
	}
	quiets := createPods(t, quietPods, func(i int) *corev1.Pod {
		return pod(quiet, fmt.Sprintf("quiet-%02d", i), label(nsRunLabel, run), ttl(quietTTL))
	})

	maxNamespaces := 0.0
	var busyLeft int
	if err := wait.PollUntilContextTimeout(ctxFor(t), 200*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		maxNamespaces = max(maxNamespaces, d.scrape(t).sum("podjanitor_removal_backlog_namespaces"))
		busyLeft = busyPods - rBusy.count()
		return rQuiet.count() == quietPods, nil
	}); err != nil {
		t.Fatalf("%d of %d quiet pods removed after a minute", rQuiet.count(), quietPods)
	}
	var worst time.Duration
	for _, p := range quiets {
		at, _ := rQuiet.get(p.UID)
		deadline := created(p).Add(quietTTL)
		if at.Before(deadline) {
			t.Errorf("pod %s removed %v before its deadline", p.Name, deadline.Sub(at))
		}
		worst = max(worst, at.Sub(deadline))
	}
	t.Logf("quiet pods at most %v late, %d busy pods still waiting when the last went; at most %v namespaces seen waiting",
		worst.Round(time.Millisecond), busyLeft, maxNamespaces)
	if worst > quietLateness {
		t.Errorf("a quiet pod went %v after its deadline, want within %v (its namespace's share of the cap)", worst.Round(time.Millisecond), quietLateness)
	}
	if busyLeft < busyPods/4 {
		t.Errorf("%d busy pods waited still when the quiet ones had gone, want most of the backlog", busyLeft)
	}
	if maxNamespaces != 2 {
		t.Errorf("podjanitor_removal_backlog_namespaces at most %v, want 2 while both namespaces wait", maxNamespaces)
	}
	// Alone again, the busy namespace drains at the full cap (logged only:
	// the unit tests check the shares).
	from, left := time.Now(), busyPods-rBusy.count()
	if err := wait.PollUntilContextTimeout(ctxFor(t), 200*time.Millisecond, 2*time.Minute, true, func(context.Context) (bool, error) {
		return rBusy.count() == busyPods, nil
	}); err != nil {
		t.Fatalf("%d of %d busy pods removed", rBusy.count(), busyPods)
	}
	took := time.Since(from)
	t.Logf("the busy namespace's last %d pods in %v alone (%.1f/s at a cap of %d/s)", left, took.Round(time.Millisecond), float64(left)/took.Seconds(), perSecond)
}
