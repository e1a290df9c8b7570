//go:build e2e

package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// TestLeaderElection runs two replicas: only the leader removes pods; when the
// leader is SIGKILLed the other takes over within the lease duration and every
// due pod is still removed exactly once.
func TestLeaderElection(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	r := watchRemovals(t, ns)
	const lease = 6 * time.Second
	args := []string{"--namespace", ns, "--leader-elect", "--leader-elect-resource-namespace", ns,
		"--leader-elect-lease-duration", lease.String(), "--leader-elect-renew-deadline", "4s", "--leader-elect-retry-period", "500ms"}
	a := startDaemonWaiting(t, "Waiting to become the leader", args...)
	b := startDaemonWaiting(t, "Waiting to become the leader", args...)

	var leader, follower *daemon
	deadline := time.Now().Add(30 * time.Second)
	for leader == nil && time.Now().Before(deadline) {
		switch {
		case a.logContains("Became the leader"):
			leader, follower = a, b
		case b.logContains("Became the leader"):
			leader, follower = b, a
		default:
			time.Sleep(100 * time.Millisecond)
		}
	}
	if leader == nil {
		t.Fatal("no replica became the leader")
	}
	leader.waitLog("Started workers", 30*time.Second)

	var first []*corev1.Pod
	for i := range 4 {
		first = append(first, createPod(t, ns, fmt.Sprintf("before-%d", i), ttl(time.Duration(2+i)*time.Second)))
	}
	for _, p := range first {
		r.checkOnTime(t, p, created(p).Add(ttlOf(t, p)))
	}
	if follower.logContains("Removed pod") {
		t.Error("the follower removed pods while the leader held the lease")
	}

	// Pods that fall due while the leadership changes hands.
	var second []*corev1.Pod
	for i := range 4 {
		second = append(second, createPod(t, ns, fmt.Sprintf("after-%d", i), ttl(time.Duration(2+3*i)*time.Second)))
	}
	leader.kill()
	killed := time.Now()
	follower.waitLog("Became the leader", lease+10*time.Second)
	takeover := time.Since(killed)
	t.Logf("the follower took over %v after the leader was killed (lease %v)", takeover, lease)
	if takeover > lease+3*time.Second {
		t.Errorf("takeover took %v, want within the lease duration %v (+ retry slack)", takeover, lease)
	}
	for _, p := range second {
		due := created(p).Add(ttlOf(t, p))
		at := r.waitRemoved(t, p, time.Until(due)+lease+15*time.Second)
		if at.Before(due) {
			t.Errorf("pod %s removed %v before its deadline", p.Name, due.Sub(at))
		}
		t.Logf("pod %s: deadline %s, removed %v late", p.Name, due.Format(time.RFC3339), at.Sub(due))
	}
	for _, p := range append(first, second...) {
		if n := countEvents(t, p, reasonRemoved); n != 1 {
			t.Errorf("pod %s: %d %s events, want exactly 1", p.Name, n, reasonRemoved)
		}
	}
	if n := strings.Count(follower.log()+leader.log(), "Removed pod"); n != len(first)+len(second) {
		t.Errorf("replicas logged %d removals, want %d", n, len(first)+len(second))
	}
}

func ttlOf(t *testing.T, p *corev1.Pod) time.Duration {
	t.Helper()
	d, err := time.ParseDuration(p.Annotations[prefix+"ttl"])
	if err != nil {
		t.Fatal(err)
	}
	return d
}
