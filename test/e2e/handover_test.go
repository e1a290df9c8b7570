//go:build e2e

package e2e

import (
	"fmt"
	"net/http"
	"os"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// handoverArgs are two replicas' flags for a takeover in seconds: lease 6 s,
// renew deadline 4 s, retry period 500 ms.
func handoverArgs(ns string) []string {
	return []string{"--namespace", ns, "--hold-waves=false", "--leader-elect", "--leader-elect-resource-namespace", ns,
		"--leader-elect-lease-duration", "6s", "--leader-elect-renew-deadline", "4s", "--leader-elect-retry-period", "500ms"}
}

var identityLine = regexp.MustCompile(`"Waiting to become the leader" lease="[^"]+" identity="([^"]+)"`)

// identity is the daemon's identity in the Lease, as it logged it.
func (d *daemon) identity(t *testing.T) string {
	t.Helper()
	m := identityLine.FindStringSubmatch(d.log())
	if m == nil {
		t.Fatal("podjanitor logged no identity")
	}
	return m[1]
}

var klogRemoved = regexp.MustCompile(`(?m)^I(\d{4} \d{2}:\d{2}:\d{2}\.\d{6})\s.*"Removed pod" pod="([^"]+)"`)

// removalTimes is when the daemon logged each removal (the call's answer),
// by pod.
func (d *daemon) removalTimes(t *testing.T) map[string]time.Time {
	t.Helper()
	out := map[string]time.Time{}
	year := time.Now().Year()
	for _, m := range klogRemoved.FindAllStringSubmatch(d.log(), -1) {
		at, err := time.ParseInLocation("2006 0102 15:04:05.000000", fmt.Sprintf("%d %s", year, m[1]), time.Local)
		if err != nil {
			t.Fatal(err)
		}
		out[m[2]] = at
	}
	return out
}

// maxInWindow is the most of times (sorted) within any window of d.
func maxInWindow(times []time.Time, d time.Duration) (most int, at time.Time) {
	j := 0
	for i := range times {
		for times[i].Sub(times[j]) >= d {
			j++
		}
		if n := i - j + 1; n > most {
			most, at = n, times[j]
		}
	}
	return most, at
}

// TestHandoverKeepsOneLeaderAndTheCap: two replicas on one Lease, 60 pods
// overdue and a removal cap of 5/s with a burst of 5. While the leader
// drains them, its Lease is handed to the standby by hand (holderIdentity
// patched) or deleted (the old leader's creating it again refused, so that
// the standby creates it). Asserted: no removal by the old leader is logged
// after the new leader's first (one leader removes at a time), the old
// leader exits 1 ("Lost the leader lease"), every pod goes once, and the
// removals seen in any 1 s, across the handover, are at most the cap plus
// one burst (10): the new leader starts without a burst of its own. Before,
// the old leader removed on until its renew deadline (4 s) while the new
// one removed from its first try, with a full burst. The new leader's first
// pass runs on the machine's cores, not the standby's one P.
func TestHandoverKeepsOneLeaderAndTheCap(t *testing.T) {
	t.Parallel()
	const (
		n           = 60
		rate, burst = 5, 5
		handoverAt  = 15 // removals before the Lease changes hands
		windowLimit = rate + burst
	)
	for _, how := range []string{"taken by hand", "deleted"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			ns := newNamespace(t)
			r := watchRemovalsDurably(t, ns)
			overdue := time.Now().Add(-time.Hour)
			pods := createPods(t, n, func(i int) *corev1.Pod {
				return pod(ns, fmt.Sprintf("pod-%02d", i), expiresAt(overdue.Add(time.Duration(i)*time.Second)))
			})
			args := append(handoverArgs(ns), "--max-deletions-per-second", fmt.Sprint(rate), "--deletion-burst", fmt.Sprint(burst))
			// The old leader through a proxy that can refuse its creating the
			// Lease again once deleted, so that the standby does.
			proxy := newFaultProxy(t)
			old := startDaemon(t, append(slices.Clone(args), "--kubeconfig", proxy.kubeconfig(t))...)
			standby := startDaemonWaiting(t, "Waiting to become the leader", args...)
			removed := func() int {
				c := 0
				for _, p := range pods {
					if _, ok := r.get(p.UID); ok {
						c++
					}
				}
				return c
			}
			for deadline := time.Now().Add(time.Minute); removed() < handoverAt; time.Sleep(20 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("the leader removed %d pods in a minute", removed())
				}
			}
			leases := client.CoordinationV1().Leases(ns)
			switch how {
			case "taken by hand":
				l, err := leases.Get(ctxFor(t), "podjanitor", metav1.GetOptions{})
				if err != nil {
					t.Fatal(err)
				}
				l.Spec.HolderIdentity = ptr.To(standby.identity(t))
				if _, err := leases.Update(ctxFor(t), l, metav1.UpdateOptions{}); err != nil {
					t.Fatal(err)
				}
			case "deleted":
				leasesPath := "/apis/coordination.k8s.io/v1/namespaces/" + ns + "/leases"
				proxy.inject(&fault{Method: http.MethodPost, Match: func(r proxiedRequest) bool { return r.Path == leasesPath },
					Status: http.StatusInternalServerError})
				if err := leases.Delete(ctxFor(t), "podjanitor", metav1.DeleteOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			changed := time.Now()
			select {
			case <-old.exited:
				t.Logf("the old leader exited %d, %v after the Lease was %s", old.cmd.ProcessState.ExitCode(), time.Since(changed).Round(time.Millisecond), how)
				if code := old.cmd.ProcessState.ExitCode(); code != 1 || !old.logContains("Lost the leader lease") {
					t.Errorf("the old leader exited %d, want 1 having logged that it lost the Lease", code)
				}
			case <-time.After(30 * time.Second):
				t.Fatalf("the old leader still runs 30 s after its Lease was %s", how)
			}
			for deadline := time.Now().Add(2 * time.Minute); removed() < n; time.Sleep(100 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("%d of %d pods removed 2 minutes after the handover", removed(), n)
				}
			}

			oldTimes, newTimes := old.removalTimes(t), standby.removalTimes(t)
			var firstNew time.Time
			for _, at := range newTimes {
				if firstNew.IsZero() || at.Before(firstNew) {
					firstNew = at
				}
			}
			for p, at := range oldTimes {
				if !at.Before(firstNew) {
					t.Errorf("the old leader removed %s at %s, after the new leader's first removal at %s", p, stamp(at), stamp(firstNew))
				}
			}
			t.Logf("the old leader removed %d pods, the new one %d, its first %v after the Lease was %s",
				len(oldTimes), len(newTimes), firstNew.Sub(changed).Round(time.Millisecond), how)
			// On one P since its sync, the standby takes over on the machine's cores.
			if runtime.NumCPU() > 1 && os.Getenv("GOMAXPROCS") == "" &&
				!standby.logContains("First pass begins; GOMAXPROCS set to the container's cores") {
				t.Error("the new leader's first pass did not get the machine's cores back")
			}
			for _, p := range pods {
				_, byOld := oldTimes[p.Namespace+"/"+p.Name]
				_, byNew := newTimes[p.Namespace+"/"+p.Name]
				if byOld == byNew {
					t.Errorf("pod %s: removed by the old leader %v, by the new %v; want by one of them", p.Name, byOld, byNew)
				}
			}
			var seen []time.Time
			for _, p := range pods {
				at, _ := r.get(p.UID)
				seen = append(seen, at)
			}
			slices.SortFunc(seen, time.Time.Compare)
			most, at := maxInWindow(seen, time.Second)
			t.Logf("at most %d removals seen in 1 s (from %s; the Lease %s at %s)", most, stamp(at), how, stamp(changed))
			if most > windowLimit {
				t.Errorf("%d removals seen within 1 s from %s, want at most the cap plus one burst, %d", most, stamp(at), windowLimit)
			}
		})
	}
}

// TestHealthzFailsWhenRenewalsAreStuck: the leader reaches the API server
// through a proxy that, once it leads, answers its Lease's writes 500 and
// holds its reads of the namespace (which each due pod's removal makes)
// for a minute, so that its workers cannot stop. It starts no removal
// after its renew deadline, and its /healthz, 200 while it renewed, fails
// within the lease duration plus the watchdog's 20 s after its last
// renewal, while the process still runs: the kubelet restarts it. Before,
// /healthz never looked at the Lease.
func TestHealthzFailsWhenRenewalsAreStuck(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	proxy := newFaultProxy(t)
	args := append(handoverArgs(ns), "--kubeconfig", proxy.kubeconfig(t), "--health-probe-bind-address", "127.0.0.1:0",
		"--write-timeout", "90s", "--shutdown-timeout", "90s")
	leader := startDaemon(t, args...)
	health := "http://" + leader.endpoints()["health"] + "/healthz"
	if code, body := httpGet(t, health); code != http.StatusOK {
		t.Fatalf("/healthz = %d %q while the leader renews, want 200", code, body)
	}
	leasePath := "/apis/coordination.k8s.io/v1/namespaces/" + ns + "/leases/podjanitor"
	nsPath := "/api/v1/namespaces/" + ns
	proxy.inject(&fault{Method: http.MethodPut, Match: func(r proxiedRequest) bool { return r.Path == leasePath },
		Status: http.StatusInternalServerError})
	proxy.inject(&fault{Method: http.MethodGet, Match: func(r proxiedRequest) bool { return r.Path == nsPath }, Delay: time.Minute})
	stuck := time.Now()
	for i := range 5 {
		createPod(t, ns, fmt.Sprintf("due-%d", i), unscheduled, expiresAt(time.Now().Add(-time.Minute)))
	}
	const within = 6*time.Second + 20*time.Second + 5*time.Second // lease duration, watchdog, margin
	for {
		select {
		case <-leader.exited:
			t.Fatalf("the leader exited (%v) %v after its renewals began to fail, with /healthz never failing",
				leader.err, time.Since(stuck).Round(time.Millisecond))
		default:
		}
		resp, err := http.Get(health)
		if err != nil {
			t.Fatalf("/healthz: %v", err)
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusInternalServerError {
			t.Logf("/healthz failed %v after the Lease's writes began to fail", time.Since(stuck).Round(time.Millisecond))
			break
		}
		if time.Since(stuck) > within {
			t.Fatalf("/healthz still %d %v after the Lease's writes began to fail, want 500 within %v", resp.StatusCode, time.Since(stuck), within)
		}
		time.Sleep(500 * time.Millisecond)
	}
	if leader.logContains("Removed pod") {
		t.Error("the leader removed a pod with its renewals failing and its namespace reads held")
	}
	if !strings.Contains(leader.log(), "Lost the leader lease") {
		t.Error("the leader did not log that it lost its Lease")
	}
}
