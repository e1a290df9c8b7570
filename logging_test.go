package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/podjanitor/podjanitor/internal/apitest"
)

// jsonLines decodes every line of buf as one JSON object.
func jsonLines(t *testing.T, buf *bytes.Buffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(buf)
	for sc.Scan() {
		var m map[string]any
		dec := json.NewDecoder(strings.NewReader(sc.Text()))
		dec.UseNumber()
		if err := dec.Decode(&m); err != nil {
			t.Fatalf("log line is not one JSON object: %v\n%s", err, sc.Text())
		}
		out = append(out, m)
	}
	return out
}

// keyOrder is the order of the keys in a JSON object line.
func keyOrder(t *testing.T, line string) []string {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(line))
	if _, err := dec.Token(); err != nil { // {
		t.Fatal(err)
	}
	var keys []string
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, tok.(string))
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			t.Fatal(err)
		}
	}
	return keys
}

// TestJSONLogShape pins the shape of --logging-format=json to that of
// Kubernetes components (k8s.io/component-base/logs/json): ts in milliseconds
// since the epoch, caller, msg, then v (info) or err (errors), then the keys;
// objects from klog.KObj as {"name","namespace"}; lines above -v dropped.
func TestJSONLogShape(t *testing.T) {
	var buf bytes.Buffer
	logger := newJSONLogger(&buf, 2)
	before := float64(time.Now().UnixNano()) / 1e6
	logger.V(2).Info("Removed pod", "pod", klog.KRef("default", "web-1"), "lateness", 1500*time.Microsecond, "count", 3)
	logger.V(3).Info("Too verbose")
	logger.WithValues("worker", 1).Error(errors.New("boom"), "Removal failed", "pod", cache.ObjectName{Namespace: "default", Name: "web-1"})
	after := float64(time.Now().UnixNano()) / 1e6

	raw := buf.String()
	lines := jsonLines(t, &buf)
	if len(lines) != 2 {
		t.Fatalf("got %d lines, want 2 (V(3) dropped at verbosity 2):\n%s", len(lines), raw)
	}
	info, failure := lines[0], lines[1]
	for i, line := range lines {
		ts, err := line["ts"].(json.Number).Float64()
		if err != nil || ts < before || ts > after {
			t.Errorf("line %d: ts = %v, want milliseconds since the epoch between %f and %f", i, line["ts"], before, after)
		}
		if c, _ := line["caller"].(string); !strings.HasPrefix(c, "logging_test.go:") {
			t.Errorf("line %d: caller = %v, want logging_test.go:<line>", i, line["caller"])
		}
		delete(line, "ts")
		delete(line, "caller")
	}
	wantInfo := map[string]any{
		"msg": "Removed pod", "v": json.Number("2"),
		"pod":      map[string]any{"name": "web-1", "namespace": "default"},
		"lateness": "1.5ms", "count": json.Number("3"),
	}
	if diff := cmp.Diff(wantInfo, info); diff != "" {
		t.Errorf("info line (-want,+got):\n%s", diff)
	}
	wantError := map[string]any{"msg": "Removal failed", "err": "boom", "worker": json.Number("1"), "pod": "default/web-1"}
	if diff := cmp.Diff(wantError, failure); diff != "" {
		t.Errorf("error line (-want,+got):\n%s", diff)
	}
	first := strings.SplitN(raw, "\n", 2)[0]
	if diff := cmp.Diff([]string{"ts", "caller", "msg", "v", "pod", "lateness", "count"}, keyOrder(t, first)); diff != "" {
		t.Errorf("key order (-want,+got):\n%s", diff)
	}
}

// TestRemovalLogLine: the line logged for every removal carries pod,
// namespace, uid, action, reason, deadline and lateness.
func TestRemovalLogLine(t *testing.T) {
	pod := apitest.Pod("web-1", t0.Add(-2*time.Hour), corev1.PodSucceeded, map[string]string{"podjanitor.io/ttl": "1h"})
	pod.UID = types.UID("uid-web-1")
	f := newFixture(t, Options{}, pod)
	var buf bytes.Buffer
	f.ctx = klog.NewContext(f.ctx, newJSONLogger(&buf, 2))
	f.process(cache.MetaObjectToName(pod))

	var removed map[string]any
	for _, line := range jsonLines(t, &buf) {
		if line["msg"] == "Removed pod" {
			removed = line
		}
	}
	if removed == nil {
		t.Fatalf("no \"Removed pod\" line in:\n%s", buf.String())
	}
	want := map[string]any{
		"pod":       map[string]any{"name": "web-1", "namespace": "default"},
		"namespace": "default",
		"uid":       "uid-web-1",
		"action":    "delete",
		"reason":    "ttl",
		"by":        "podjanitor.io/ttl",
		"deadline":  t0.Add(-time.Hour).String(),
		"lateness":  "1h0m0s",
	}
	got := map[string]any{}
	for k := range want {
		got[k] = removed[k]
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("\"Removed pod\" line (-want,+got):\n%s", diff)
	}
}
