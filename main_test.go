package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/flowcontrol"

	"github.com/podjanitor/podjanitor/internal/metrics"
)

func TestFlagValidation(t *testing.T) {
	tests := map[string]struct {
		args    []string
		wantErr string // "" means valid
	}{
		"defaults":                  {},
		"zero workers":              {args: []string{"--workers", "0"}, wantErr: "--workers"},
		"bad selector":              {args: []string{"--label-selector", "a b"}, wantErr: "--label-selector"},
		"bad namespace":             {args: []string{"--namespace", "Not_A_Namespace"}, wantErr: "--namespace"},
		"negative rate":             {args: []string{"--max-deletions-per-second", "-1"}, wantErr: "--max-deletions-per-second"},
		"bad prefix":                {args: []string{"--annotation-prefix", "no/slash"}, wantErr: "--annotation-prefix"},
		"lease shorter":             {args: []string{"--leader-elect", "--leader-elect-lease-duration", "5s"}, wantErr: "--leader-elect-lease-duration"},
		"renew within retry jitter": {args: []string{"--leader-elect", "--leader-elect-renew-deadline", "2s", "--leader-elect-retry-period", "1.9s"}, wantErr: "--leader-elect-renew-deadline"},
		"fast takeover":             {args: []string{"--leader-elect", "--leader-elect-lease-duration", "5s", "--leader-elect-renew-deadline", "3s", "--leader-elect-retry-period", "1s"}},
		"bad bind address":          {args: []string{"--metrics-bind-address", "8080"}, wantErr: "--metrics-bind-address"},
		"metrics disabled":          {args: []string{"--metrics-bind-address", "0"}},
		"secure metrics":            {args: []string{"--metrics-secure", "--metrics-cert-dir", "/etc/tls"}},
		"cert dir, plain HTTP":      {args: []string{"--metrics-cert-dir", "/etc/tls"}, wantErr: "--metrics-cert-dir"},
		"secure, HTTP/2, audiences": {args: []string{"--metrics-secure", "--metrics-enable-http2", "--metrics-token-audiences", "podjanitor, https://kubernetes.default.svc"}},
		"HTTP/2, plain HTTP":        {args: []string{"--metrics-enable-http2"}, wantErr: "--metrics-enable-http2"},
		"audiences, plain HTTP":     {args: []string{"--metrics-token-audiences", "podjanitor"}, wantErr: "--metrics-token-audiences"},
		"no audience":               {args: []string{"--metrics-secure", "--metrics-token-audiences", " , "}, wantErr: "--metrics-token-audiences"},
		"zero idle timeout":         {args: []string{"--http-idle-timeout", "0s"}, wantErr: "--http-idle-timeout"},
		"zero read timeout":         {args: []string{"--http-read-timeout", "0s"}, wantErr: "--http-read-timeout"},
		"no connections":            {args: []string{"--http-max-connections", "0"}, wantErr: "--http-max-connections"},
		"short idle timeout":        {args: []string{"--http-idle-timeout", "5s", "--http-read-timeout", "5s"}},
		"stray argument":            {args: []string{"extra"}, wantErr: "unexpected argument"},
		"unparsable duration":       {args: []string{"--shutdown-timeout", "soon"}, wantErr: "shutdown-timeout"},
		"klog verbosity passes":     {args: []string{"-v=4"}},
		"json content type":         {args: []string{"--kube-api-content-type", "application/json"}},
		"bad content type":          {args: []string{"--kube-api-content-type", "yaml"}, wantErr: "--kube-api-content-type"},
		"json logs":                 {args: []string{"--logging-format", "json"}},
		"bad logging format":        {args: []string{"--logging-format", "yaml"}, wantErr: "--logging-format"},
		"negative qps":              {args: []string{"--kube-api-qps", "-1"}, wantErr: "--kube-api-qps"},
		"negative burst":            {args: []string{"--kube-api-burst", "-1"}, wantErr: "--kube-api-burst"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := parseFlags(daemonCommand, tc.args)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Errorf("parseFlags(%q) = %v, want no error", tc.args, err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Errorf("parseFlags(%q) = %v, want an error naming %s", tc.args, err, tc.wantErr)
			}
		})
	}
	if _, err := parseFlags(planCommand, []string{"-o", "yaml"}); err == nil {
		t.Error("plan -o yaml accepted, want table or json only")
	}
	for _, args := range [][]string{{"-o", "json"}, {"--output", "json"}, {"--output=json"}} {
		o, err := parseFlags(planCommand, args)
		if err != nil {
			t.Errorf("plan %q: %v", args, err)
		} else if o.output != "json" {
			t.Errorf("plan %q: output %q, want json", args, o.output)
		}
	}
	if _, err := parseFlags(planCommand, []string{"--output", "yaml"}); err == nil || !strings.Contains(err.Error(), "--output") {
		t.Errorf("plan --output yaml: err = %v, want an error naming --output", err)
	}
	if _, err := parseFlags(daemonCommand, []string{"--kube-api-burst", "-1"}); err == nil || strings.Contains(err.Error(), "--kube-api-qps") {
		t.Errorf("--kube-api-burst -1: err = %v, want it to name --kube-api-burst alone", err)
	}
	var usage usageError
	if _, err := parseFlags(daemonCommand, []string{"--workers", "0"}); !errors.As(err, &usage) || exitCode(err) != 2 {
		t.Errorf("a bad flag value must be a usage error with exit status 2, got %v", err)
	}
}

// TestAPILimitsFollowTheCap: at the defaults the client-side limits leave
// room for three requests per removal the cap allows (the pod read, the
// eviction, the namespace read), so that a backlog of evictions drains at
// the cap, not at half of it; limits that are set are kept.
func TestAPILimitsFollowTheCap(t *testing.T) {
	tests := map[string]struct {
		cmd   command
		args  []string
		qps   float64
		burst int
	}{
		"defaults":             {cmd: daemonCommand, qps: 150, burst: 300},
		"a higher cap":         {cmd: daemonCommand, args: []string{"--max-deletions-per-second=200", "--deletion-burst=50"}, qps: 600, burst: 150},
		"a low cap":            {cmd: daemonCommand, args: []string{"--max-deletions-per-second=5", "--deletion-burst=10"}, qps: 50, burst: 100},
		"no cap":               {cmd: daemonCommand, args: []string{"--max-deletions-per-second=0"}, qps: 50, burst: 100},
		"set":                  {cmd: daemonCommand, args: []string{"--kube-api-qps=20", "--kube-api-burst=30"}, qps: 20, burst: 30},
		"qps set, burst not":   {cmd: daemonCommand, args: []string{"--kube-api-qps=20"}, qps: 20, burst: 300},
		"plan removes nothing": {cmd: planCommand, qps: 50, burst: 100},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			o, err := parseFlags(tc.cmd, tc.args)
			if err != nil {
				t.Fatal(err)
			}
			if o.cluster.kubeAPIQPS != tc.qps || o.cluster.kubeAPIBurst != tc.burst {
				t.Errorf("%s %q: --kube-api-qps %v, --kube-api-burst %d; want %v, %d",
					tc.cmd, tc.args, o.cluster.kubeAPIQPS, o.cluster.kubeAPIBurst, tc.qps, tc.burst)
			}
		})
	}
}

func TestProfilingIsOptIn(t *testing.T) {
	for _, profiling := range []bool{false, true} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		ctx, cancel := context.WithCancel(context.Background())
		cfg := endpointsConfig{metricsAddr: addr, healthAddr: "0", profiling: profiling}
		if err := serveEndpoints(ctx, cfg, metrics.New(controllerName, "test", "test"), nil, func() bool { return true }, func() error { return nil }, make(chan error, 2)); err != nil {
			t.Fatal(err)
		}
		resp, err := http.Get("http://" + addr + "/debug/pprof/cmdline")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		want := http.StatusNotFound
		if profiling {
			want = http.StatusOK
		}
		if resp.StatusCode != want {
			t.Errorf("--profiling=%v: /debug/pprof/cmdline = %d, want %d", profiling, resp.StatusCode, want)
		}
		cancel()
	}
}

// TestSecureMetricsRefuseAnonymous: with --metrics-secure, /metrics and pprof
// are HTTPS only and refuse a caller without a token (401, before any review
// reaches the API server, here an address that answers nothing); the health
// endpoints stay plain HTTP, for the kubelet.
func TestSecureMetricsRefuseAnonymous(t *testing.T) {
	addrs := make([]string, 2)
	for i := range addrs {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addrs[i] = ln.Addr().String()
		ln.Close()
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg := endpointsConfig{metricsAddr: addrs[0], healthAddr: addrs[1], profiling: true, metricsSecure: true,
		reviews: &rest.Config{Host: "https://127.0.0.1:1"}}
	if err := serveEndpoints(ctx, cfg, metrics.New(controllerName, "test", "test"), nil, func() bool { return true }, func() error { return nil }, make(chan error, 2)); err != nil {
		t.Fatal(err)
	}
	insecure := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	for _, path := range []string{"/metrics", "/debug/pprof/", "/debug/pprof/cmdline"} {
		resp, err := insecure.Get("https://" + addrs[0] + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized || strings.Contains(string(body), "podjanitor_") {
			t.Errorf("anonymous GET %s: %d %q, want 401", path, resp.StatusCode, body)
		}
	}
	if resp, err := http.Get("http://" + addrs[0] + "/metrics"); err == nil {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK || strings.Contains(string(body), "podjanitor_") {
			t.Errorf("plain HTTP GET /metrics with --metrics-secure: %d %q", resp.StatusCode, body)
		}
	}
	resp, err := http.Get("http://" + addrs[1] + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("plain HTTP /healthz with --metrics-secure: %d, want 200", resp.StatusCode)
	}
}

// countingLimiter is a client-side rate limiter that counts the requests it lets through.
type countingLimiter struct {
	flowcontrol.RateLimiter
	n atomic.Int64
}

func (l *countingLimiter) Wait(ctx context.Context) error { l.n.Add(1); return l.RateLimiter.Wait(ctx) }
func (l *countingLimiter) TryAccept() bool                { l.n.Add(1); return l.RateLimiter.TryAccept() }
func (l *countingLimiter) Accept()                        { l.n.Add(1); l.RateLimiter.Accept() }

// TestSecureMetricsReviewsHaveTheirOwnLimiter: callers with tokens of their
// own making (a TokenReview each, nothing cached) take the reviews' client
// limiter, not the one that paces the removals.
func TestSecureMetricsReviewsHaveTheirOwnLimiter(t *testing.T) {
	var reviews atomic.Int64
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/apis/authentication.k8s.io/v1/tokenreviews" {
			http.NotFound(w, r)
			return
		}
		reviews.Add(1)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"apiVersion":"authentication.k8s.io/v1","kind":"TokenReview","status":{"authenticated":false}}`)
	}))
	defer api.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	removals := &countingLimiter{RateLimiter: flowcontrol.NewTokenBucketRateLimiter(50, 100)}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg := endpointsConfig{metricsAddr: addr, healthAddr: "0", metricsSecure: true,
		reviews: &rest.Config{Host: api.URL, RateLimiter: removals, ContentConfig: rest.ContentConfig{ContentType: "application/json"}}}
	if err := serveEndpoints(ctx, cfg, metrics.New(controllerName, "test", "test"), nil, func() bool { return true }, func() error { return nil }, make(chan error, 2)); err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	for i := range 5 {
		req, _ := http.NewRequest(http.MethodGet, "https://"+addr+"/metrics", nil)
		req.Header.Set("Authorization", fmt.Sprintf("Bearer made-up-%d", i))
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("made-up token %d: %d, want 401", i, resp.StatusCode)
		}
	}
	if reviews.Load() != 5 || removals.n.Load() != 0 {
		t.Errorf("5 made-up tokens: %d TokenReviews, %d of them through the removals' limiter; want 5 and 0", reviews.Load(), removals.n.Load())
	}
}

// TestAPIResponsesAreNotCompressedByDefault: the API server gzips a watch
// that began as a streaming list for its whole life when the client accepts
// gzip, one gzip stream per pod event on the API server's CPU. podjanitor's
// clients do not ask for it unless --kube-api-compression says so.
func TestAPIResponsesAreNotCompressedByDefault(t *testing.T) {
	encodings := make(chan string, 1)
	// TLS, as an API server: client-go gives a plain-HTTP config Go's default
	// transport, which always asks for gzip.
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case encodings <- r.Header.Get("Accept-Encoding"):
		default:
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		_, _ = w.Write([]byte(`{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}`))
	}))
	defer srv.Close()
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "`+srv.URL+`", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, ""},
		{[]string{"--kube-api-compression"}, "gzip"},
	} {
		t.Run(fmt.Sprint(tc.args), func(t *testing.T) {
			o, err := parseFlags(daemonCommand, append([]string{"--kubeconfig", kubeconfig}, tc.args...))
			if err != nil {
				t.Fatal(err)
			}
			cfg, err := restConfig(o.cluster)
			if err != nil {
				t.Fatal(err)
			}
			c, err := newClients(cfg)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = c.kube.CoreV1().Pods("default").Get(context.Background(), "p", metav1.GetOptions{})
			select {
			case got := <-encodings:
				if got != tc.want {
					t.Errorf("flags %q: Accept-Encoding %q, want %q", tc.args, got, tc.want)
				}
			default: // the handler sends before it answers, so the Get has returned by now
				t.Fatalf("flags %q: no request reached the server", tc.args)
			}
		})
	}
}

// TestUntilEndpointFails: an HTTP endpoint that fails stops the controller
// and is the daemon's error (exit 1, a restart), where it used to stop the
// controller and exit 0; a signal still ends the run with no error.
func TestUntilEndpointFails(t *testing.T) {
	untilStopped := func(ctx context.Context) error { <-ctx.Done(); return nil }
	t.Run("endpoint fails", func(t *testing.T) {
		serveErr := make(chan error, 2)
		boom := errors.New("metrics endpoint: accept: too many open files")
		serveErr <- boom
		err := untilEndpointFails(t.Context(), serveErr, untilStopped)
		if !errors.Is(err, boom) {
			t.Fatalf("got %v, want the endpoint's error", err)
		}
	})
	t.Run("signal", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		if err := untilEndpointFails(ctx, make(chan error, 2), untilStopped); err != nil {
			t.Fatalf("got %v, want none", err)
		}
	})
	t.Run("controller stops", func(t *testing.T) {
		err := untilEndpointFails(t.Context(), make(chan error, 2), func(context.Context) error { return errControllerStopped })
		if !errors.Is(err, errControllerStopped) {
			t.Fatalf("got %v, want errControllerStopped", err)
		}
	})
}
