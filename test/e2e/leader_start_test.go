//go:build e2e

package e2e

import (
	"net/http"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const heldNamespacesAnnotation = "podjanitor.io/held-namespaces"

// TestLeaderWithAStartThatFailsExits: the record Lease carries a
// held-namespaces record that does not parse (a hand edit, a bad restore).
// The leader's start fails on it: the process exits 1 within 10 s of
// leading, naming the annotation, with the Lease released and no worker
// started, and a pod due from the start is not removed (never a leader
// that renews its Lease with nothing running). Without --leader-elect it exits
// 1 too. Once the record is deleted, a second replica takes the Lease at
// once and removes the due pod. The same for the Lease's read failing for
// good (500, through the fault proxy), once it has been tried for the renew
// deadline (10 s).
func TestLeaderWithAStartThatFailsExits(t *testing.T) {
	t.Parallel()
	const exitWithin = 10 * time.Second
	for _, tc := range []struct {
		name        string
		leaderElect bool
		// leaseReads500 answers the Lease's GETs 500 rather than put the record on it.
		leaseReads500 bool
		want          string
	}{
		{name: "leader", leaderElect: true, want: heldNamespacesAnnotation},
		{name: "no leader election", want: heldNamespacesAnnotation},
		{name: "Lease unreadable", leaseReads500: true, want: "--hold-waves: the policy the last leader acted on"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ns := newNamespace(t)
			r := watchRemovals(t, ns)
			args := []string{"--namespace", ns, "--leader-elect-resource-namespace", ns}
			if tc.leaderElect {
				args = append(args, "--leader-elect")
			}
			lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "podjanitor", Namespace: ns}}
			if tc.leaseReads500 {
				proxy := newFaultProxy(t)
				leasePath := "/apis/coordination.k8s.io/v1/namespaces/" + ns + "/leases/podjanitor"
				proxy.inject(&fault{Method: http.MethodGet, Match: func(r proxiedRequest) bool { return r.Path == leasePath },
					Status: http.StatusInternalServerError})
				args = append(args, "--kubeconfig", proxy.kubeconfig(t))
			} else {
				lease.Annotations = map[string]string{heldNamespacesAnnotation: "{not json"}
			}
			if _, err := client.CoordinationV1().Leases(ns).Create(ctxFor(t), lease, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			due := time.Now().Truncate(time.Second)
			pod := createPod(t, ns, "due", unscheduled, expiresAt(due))

			first := startDaemonWaiting(t, "", args...)
			acting := "Starting controller"
			if tc.leaderElect {
				acting = "Became the leader"
			}
			first.waitLog(acting, 60*time.Second)
			leading := time.Now()
			select {
			case <-first.exited:
			case <-time.After(time.Minute):
				first.dumpLog()
				t.Fatalf("podjanitor still runs a minute after it began to act, with a start that cannot succeed (workers started: %v)",
					first.logContains("Started workers"))
			}
			took := time.Since(leading)
			limit := exitWithin
			if tc.leaseReads500 {
				limit += 10 * time.Second // the Lease's reads are tried for the renew deadline
			}
			code := first.cmd.ProcessState.ExitCode()
			t.Logf("podjanitor exited %d, %v after %q", code, took.Round(time.Millisecond), acting)
			if code != 1 {
				t.Errorf("podjanitor exited %d, want 1", code)
			}
			if took > limit {
				t.Errorf("podjanitor exited %v after %q, want within %v", took, acting, limit)
			}
			log := first.log()
			for _, want := range []string{"podjanitor failed", tc.want} {
				if !strings.Contains(log, want) {
					t.Errorf("the log does not say %q", want)
				}
			}
			if strings.Contains(log, "Started workers") {
				t.Error("workers started")
			}
			if _, removed := r.get(pod.UID); removed {
				t.Error("the due pod was removed by a start that failed")
			}
			if !tc.leaderElect {
				return
			}

			l, err := client.CoordinationV1().Leases(ns).Get(ctxFor(t), "podjanitor", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if h := l.Spec.HolderIdentity; h != nil && *h != "" {
				t.Errorf("the Lease is still held by %s after the leader exited, want it released", *h)
			}
			if l.Annotations[heldNamespacesAnnotation] != "{not json" {
				t.Errorf("the record became %q, want it left for a person to mend", l.Annotations[heldNamespacesAnnotation])
			}
			// What docs/operations.md says to do: delete the record. A second
			// replica takes the released Lease and removes the pod.
			delete(l.Annotations, heldNamespacesAnnotation)
			if _, err := client.CoordinationV1().Leases(ns).Update(ctxFor(t), l, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			second := startDaemonWaiting(t, "Became the leader", args...)
			second.waitLog("Started workers", 60*time.Second)
			r.waitRemoved(t, pod, time.Minute)
		})
	}
}
