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

// TestLeaderWithAStartThatFailsExits: the record Lease cannot be read (500
// for good, through the fault proxy). The leader's start fails on it, once
// its reads have been tried for the renew deadline (10 s): the process exits
// 1 within 20 s of leading, naming the record, with the Lease
// released and no worker started, and a pod due from the start is not
// removed (never a leader that renews its Lease with nothing running).
// (A record that does not parse is taken as nothing acted on:
// TestRecordThatDoesNotParseStartsAsAFirstInstall.)
func TestLeaderWithAStartThatFailsExits(t *testing.T) {
	t.Parallel()
	const exitWithin = 20 * time.Second // the reads tried for the renew deadline, 10 s
	ns := newNamespace(t)
	r := watchRemovals(t, ns)
	proxy := newFaultProxy(t)
	leasePath := "/apis/coordination.k8s.io/v1/namespaces/" + ns + "/leases/podjanitor"
	proxy.inject(&fault{Method: http.MethodGet, Match: func(r proxiedRequest) bool { return r.Path == leasePath },
		Status: http.StatusInternalServerError})
	args := []string{"--namespace", ns, "--leader-elect-resource-namespace", ns, "--kubeconfig", proxy.kubeconfig(t)}
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "podjanitor", Namespace: ns}}
	if _, err := client.CoordinationV1().Leases(ns).Create(ctxFor(t), lease, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	due := time.Now().Truncate(time.Second)
	pod := createPod(t, ns, "due", unscheduled, expiresAt(due))

	first := startDaemonWaiting(t, "", args...)
	const acting = "Starting controller"
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
	code := first.cmd.ProcessState.ExitCode()
	t.Logf("podjanitor exited %d, %v after %q", code, took.Round(time.Millisecond), acting)
	if code != 1 {
		t.Errorf("podjanitor exited %d, want 1", code)
	}
	if took > exitWithin {
		t.Errorf("podjanitor exited %v after %q, want within %v", took, acting, exitWithin)
	}
	log := first.log()
	for _, want := range []string{"podjanitor failed", "--hold-waves: the policy the last leader acted on"} {
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
}
