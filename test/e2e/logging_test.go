//go:build e2e

package e2e

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// TestJSONLogs: with --logging-format=json every line the real binary writes
// (its own, client-go's, klog's) is one JSON object in the shape of
// Kubernetes components, and the removal line carries the pod's identity,
// the decision and the lateness.
func TestJSONLogs(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	r := watchRemovals(t, ns)
	d := startDaemon(t, "--namespace", ns, "--logging-format=json")
	pod := createPod(t, ns, "json", ttl(2*time.Second))
	r.checkOnTime(t, pod, created(pod).Add(2*time.Second))
	d.waitLog(`"msg":"Removed pod"`, 10*time.Second)
	if code := d.stop(30 * time.Second); code != 0 {
		t.Errorf("podjanitor exited %d, want 0", code)
	}

	var removed map[string]any
	lines := strings.Split(strings.TrimSpace(d.log()), "\n")
	for i, line := range lines {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %d is not a JSON object: %v\n%s", i+1, err, line)
		}
		_, ts := m["ts"].(float64)
		_, msg := m["msg"].(string)
		_, caller := m["caller"].(string)
		_, v := m["v"].(float64)
		_, hasErr := m["err"]
		if !ts || !msg || !caller || v == hasErr {
			t.Errorf("log line %d lacks ts, msg, caller, or v or err: %s", i+1, line)
		}
		if m["msg"] == "Removed pod" {
			removed = m
		}
	}
	if removed == nil {
		t.Fatal("no Removed pod line")
	}
	if p, _ := removed["pod"].(map[string]any); p["name"] != pod.Name || p["namespace"] != ns {
		t.Errorf("pod = %v, want {name: %s, namespace: %s}", removed["pod"], pod.Name, ns)
	}
	want := map[string]any{"namespace": ns, "uid": string(pod.UID), "action": "delete", "reason": "ttl", "v": float64(2)}
	for k, v := range want {
		if removed[k] != v {
			t.Errorf("Removed pod line: %s = %v, want %v", k, removed[k], v)
		}
	}
	for _, k := range []string{"deadline", "lateness"} {
		if s, _ := removed[k].(string); s == "" {
			t.Errorf("Removed pod line: no %s", k)
		}
	}
	t.Logf("%d JSON lines; the removal: %v", len(lines), removed)
}
