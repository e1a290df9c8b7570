package main

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"testing"
	"time"
)

// TestHealthServedBeforeTheAPIServerAnswers: the daemon serves /healthz (200)
// and /readyz (503) before its first request to the API server, which on a
// new node whose Service rules are not written yet waits out client-go's 30 s
// dial timeout. The kubelet's liveness probe (three failures 10 s apart)
// restarted a podjanitor that had not listened yet on a busy kind node.
func TestHealthServedBeforeTheAPIServerAnswers(t *testing.T) {
	// The runtime settings as they are: applyRuntimeDefaults leaves them.
	t.Setenv("GOMAXPROCS", strconv.Itoa(runtime.GOMAXPROCS(0)))
	t.Setenv("GOGC", "100")
	t.Setenv("GOMEMLIMIT", "off")

	first := make(chan string, 1)
	release := make(chan struct{})
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case first <- r.Method + " " + r.URL.Path:
		default:
		}
		select { // every request held until the checks are done
		case <-release:
		case <-r.Context().Done():
			return
		}
		http.Error(w, "unavailable", http.StatusServiceUnavailable)
	}))
	defer api.Close()
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "`+api.URL+`"}}]
users: [{name: u, user: {}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`), 0o600); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	health := ln.Addr().String()
	ln.Close()
	o, err := parseFlags(daemonCommand, []string{"--kubeconfig", kubeconfig, "--metrics-bind-address=0", "--health-probe-bind-address", health})
	if err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- daemon(ctx, o) }()
	defer func() {
		close(release)
		cancel()
		select {
		case <-done:
		case <-time.After(time.Minute):
			t.Error("the daemon did not return within a minute of its context's end")
		}
	}()
	select {
	case req := <-first:
		t.Logf("the first request to the API server, held: %s", req)
	case err := <-done:
		t.Fatalf("the daemon returned before any request to the API server: %v", err)
	case <-time.After(time.Minute):
		t.Fatal("no request reached the API server within a minute")
	}
	for path, want := range map[string]int{"/healthz": http.StatusOK, "/readyz": http.StatusServiceUnavailable} {
		resp, err := http.Get("http://" + health + path)
		if err != nil {
			t.Errorf("GET %s while the API server has not answered: %v", path, err)
			continue
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("GET %s while the API server has not answered: %d, want %d", path, resp.StatusCode, want)
		}
	}
}
