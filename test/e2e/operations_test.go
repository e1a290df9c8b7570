//go:build e2e

package e2e

import (
	"context"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

var servingRE = regexp.MustCompile(`"Serving (metrics|health) endpoint" address="([^"]+)"`)

// endpoints returns the addresses the daemon logged for its HTTP endpoints.
func (d *daemon) endpoints() map[string]string {
	out := map[string]string{}
	for _, m := range servingRE.FindAllStringSubmatch(d.log(), -1) {
		out[m[1]] = m[2]
	}
	return out
}

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// TestOperations checks the metrics and health endpoints of a leader-elected
// daemon, then that SIGTERM exits 0 and releases the lease.
func TestOperations(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	r := watchRemovals(t, ns)
	d := startDaemon(t, "--namespace", ns, "--metrics-bind-address", "127.0.0.1:0", "--health-probe-bind-address", "127.0.0.1:0",
		"--leader-elect", "--leader-elect-resource-namespace", ns, "--leader-elect-resource-name", "ops")
	addr := d.endpoints()
	if addr["metrics"] == "" || addr["health"] == "" {
		t.Fatalf("endpoints not logged: %v", addr)
	}
	for _, path := range []string{"/healthz", "/readyz"} {
		if code, body := httpGet(t, "http://"+addr["health"]+path); code != http.StatusOK {
			t.Errorf("%s = %d %q, want 200", path, code, body)
		}
	}

	pod := createPod(t, ns, "measured", ttl(2*time.Second))
	waiting := createPod(t, ns, "waiting", ttl(time.Hour))
	r.checkOnTime(t, pod, created(pod).Add(2*time.Second))
	time.Sleep(500 * time.Millisecond)

	_, metrics := httpGet(t, "http://"+addr["metrics"]+"/metrics")
	for _, series := range []string{
		`podjanitor_pods_removed_total{action="delete",dry_run="false",reason="ttl"} 1`,
		`podjanitor_pods_scheduled 1`,
		`podjanitor_removal_lateness_seconds_count 1`,
		`podjanitor_removal_errors_total{action="evict",error="timeout"} 0`,
		`podjanitor_leader 1`,
		`podjanitor_build_info{`,
		`controller_runtime_reconcile_total{controller="podjanitor",result="requeue"} 0`,
		`controller_runtime_reconcile_total{controller="podjanitor",result="requeue_after"}`,
		`controller_runtime_reconcile_panics_total{controller="podjanitor"} 0`,
		`controller_runtime_max_concurrent_reconciles{controller="podjanitor"} 16`, // --workers default
		`workqueue_adds_total{name="podjanitor"}`,
		`workqueue_depth{name="podjanitor"}`,
		`workqueue_retries_total{name="podjanitor"}`,
		`rest_client_requests_total{code="200",host=`,
		`go_goroutines`,
		`process_resident_memory_bytes`,
	} {
		if !strings.Contains(metrics, series) {
			t.Errorf("/metrics lacks %s", series)
		}
	}
	if code, _ := httpGet(t, "http://"+addr["metrics"]+"/debug/pprof/"); code != http.StatusNotFound {
		t.Errorf("/debug/pprof/ = %d without --profiling, want 404", code)
	}
	if strings.Contains(metrics, pod.Name) || strings.Contains(metrics, ns) {
		t.Error("/metrics carries a pod or namespace name as a label value")
	}

	if code := d.stop(40 * time.Second); code != 0 {
		t.Errorf("exit code after SIGTERM = %d, want 0", code)
	}
	if !d.logContains("Released the leader lease") {
		t.Error("the lease was not released on shutdown")
	}
	lease, err := client.CoordinationV1().Leases(ns).Get(context.Background(), "ops", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if h := lease.Spec.HolderIdentity; h != nil && *h != "" {
		t.Errorf("lease still held by %q after a clean shutdown", *h)
	}
	r.checkNotRemoved(t, waiting)
}
