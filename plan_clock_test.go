package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/podjanitor/podjanitor/internal/apitest"
)

// TestPlanCountsInTheAPIServersTime: `plan` says when a pod goes in the API
// server's time, as the daemon decides, not in this machine's. The API server
// here runs 2h ahead; a pod it created a minute ago with ttl 1h goes in 59m,
// not in 2h59m as this machine's clock would have it.
func TestPlanCountsInTheAPIServersTime(t *testing.T) {
	const serverAhead = 2 * time.Hour
	serverNow := func() time.Time { return time.Now().Add(serverAhead) }
	pod := apitest.Pod("due", serverNow().Add(-time.Minute), corev1.PodRunning, map[string]string{"podjanitor.io/ttl": "1h"})
	pod.TypeMeta = metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"}
	pods := corev1.PodList{TypeMeta: metav1.TypeMeta{Kind: "PodList", APIVersion: "v1"}, Items: []corev1.Pod{*pod}}
	namespaces := metav1.PartialObjectMetadataList{
		TypeMeta: metav1.TypeMeta{Kind: "PartialObjectMetadataList", APIVersion: "meta.k8s.io/v1"},
		Items: []metav1.PartialObjectMetadata{{
			TypeMeta:   metav1.TypeMeta{Kind: "PartialObjectMetadata", APIVersion: "meta.k8s.io/v1"},
			ObjectMeta: metav1.ObjectMeta{Name: "default"},
		}},
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Date", serverNow().UTC().Format(http.TimeFormat))
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/api/v1/pods":
			_ = json.NewEncoder(w).Encode(pods)
		case "/api/v1/namespaces":
			_ = json.NewEncoder(w).Encode(namespaces)
		default:
			w.WriteHeader(http.StatusNotFound)
			_, _ = w.Write([]byte(`{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}`))
		}
	}))
	defer srv.Close()
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "`+srv.URL+`"}}]
users: [{name: u, user: {}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`), 0o600); err != nil {
		t.Fatal(err)
	}
	o, err := parseFlags(planCommand, []string{"--kubeconfig", kubeconfig, "-o", "json"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out bytes.Buffer
	if err := plan(ctx, o, &out); err != nil {
		t.Fatal(err)
	}
	var report planReport
	if err := json.Unmarshal(out.Bytes(), &report); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if len(report.Pods) != 1 {
		t.Fatalf("plan lists %d pods, want 1:\n%s", len(report.Pods), out.String())
	}
	// The Date header is cut to the second, and the estimate is its lower
	// end: up to a second (and a round trip) behind the server, or, once a
	// probe's Date turned a second just before it came back, within a
	// millisecond of it. The pod's creationTimestamp is cut to the second
	// too, so its deadline lies up to a second before the minute: in 58m59.5s
	// with an exact estimate is as right as 59m, and rounds either way.
	if e := report.Pods[0]; e.In != "in 58m59s" && e.In != "in 59m" && e.In != "in 59m1s" && e.In != "in 59m2s" {
		t.Errorf("plan says the pod goes %s (deadline %s), want in 59m: the API server's time, not this machine's", e.In, e.Deadline.Format(time.RFC3339))
	}
	if skew := report.GeneratedAt.Sub(serverNow()); skew < -5*time.Second || skew > time.Second {
		t.Errorf("generatedAt %s is %v from the API server's time", report.GeneratedAt.Format(time.RFC3339), skew)
	}
}
