//go:build e2e

package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/cert"
)

// The scrapers' RBAC and ServiceAccount that artifacts/monitoring ships; its
// PodMonitor scrapes with the token in metricsReaderSecret.
const (
	metricsReaderFile   = "../../artifacts/monitoring/metrics-reader.yaml"
	metricsReaderSA     = "podjanitor-metrics-reader"
	metricsReaderSecret = "podjanitor-metrics-reader-token"
)

// TestSecureMetrics runs podjanitor as artifacts/deploy's ServiceAccount (its
// RBAC must let it create the TokenReviews and SubjectAccessReviews) with
// --metrics-secure and a certificate directory mounted the kubelet's way, and
// checks who may read /metrics: nobody anonymous (401), no forged token
// (401), no ServiceAccount without the reader ClusterRole (403, also for
// pprof), and the token artifacts/monitoring's PodMonitor uses (200, the
// metrics); that scraping again costs the API server no review; that the
// health endpoint stays plain HTTP; and that a certificate replaced on disk
// is served without a restart.
func TestSecureMetrics(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	saKubeconfig, _ := setupDeployRBAC(t)
	scraperToken := applyMetricsReader(t, ctx)
	ns := newNamespace(t)
	otherToken := serviceAccountToken(t, ctx, ns, "no-metrics-role")

	certDir := t.TempDir()
	writeMountedCert(t, certDir, "first.podjanitor.e2e")
	d := startDaemonAs(t, saKubeconfig, "Started workers", "--namespace", ns,
		"--hold-waves=false", // held waves need the Lease, which the deploy's RBAC grants in its own namespace only
		"--metrics-bind-address", "127.0.0.1:0", "--health-probe-bind-address", "127.0.0.1:0",
		"--metrics-secure", "--metrics-cert-dir", certDir, "--profiling")
	addr := d.endpoints()["metrics"]
	if addr == "" || !d.logContains(`scheme="https"`) {
		d.dumpLog()
		t.Fatal("the daemon logged no HTTPS metrics endpoint")
	}
	url := "https://" + addr

	// The scraper's token: allowed once the API server's RBAC cache has the
	// binding (a denial is cached for 30 s, so allow a few of them).
	var body string
	err := wait.PollUntilContextTimeout(ctx, time.Second, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		var code int
		code, body = secureGet(t, url+"/metrics", scraperToken)
		return code == http.StatusOK, nil
	})
	if err != nil {
		d.dumpLog()
		t.Fatalf("the reader's token never got /metrics: last answer %q", lastLines(body, 5))
	}
	if !strings.Contains(body, "podjanitor_build_info") {
		t.Errorf("/metrics with the reader's token: no podjanitor_build_info in %q", lastLines(body, 5))
	}

	for _, c := range []struct {
		what, path, token string
		want              int
	}{
		{"anonymous", "/metrics", "", http.StatusUnauthorized},
		{"a forged token", "/metrics", "not-a-token", http.StatusUnauthorized},
		{"a ServiceAccount without the reader role", "/metrics", otherToken, http.StatusForbidden},
		{"a ServiceAccount without the reader role, pprof", "/debug/pprof/cmdline", otherToken, http.StatusForbidden},
		{"the reader, pprof (the role grants /metrics alone)", "/debug/pprof/cmdline", scraperToken, http.StatusForbidden},
		{"anonymous, pprof", "/debug/pprof/", "", http.StatusUnauthorized},
	} {
		code, body := secureGet(t, url+c.path, c.token)
		if code != c.want || strings.Contains(body, "podjanitor_") {
			t.Errorf("%s: GET %s = %d %q, want %d", c.what, c.path, code, lastLines(body, 3), c.want)
		}
	}
	// Plain HTTP on the metrics port serves nothing; the health port stays plain.
	if resp, err := http.Get("http://" + addr + "/metrics"); err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK || strings.Contains(string(b), "podjanitor_") {
			t.Errorf("plain HTTP /metrics: %d", resp.StatusCode)
		}
	}
	if code, _ := httpGet(t, "http://"+d.endpoints()["health"]+"/readyz"); code != http.StatusOK {
		t.Errorf("plain HTTP /readyz = %d, want 200", code)
	}

	// Scraping again costs no review: the daemon makes no other POST here
	// (no pods, no leader election), so its POST count stays put while the
	// answers are cached (a token for a minute).
	start := time.Now()
	before := promSeries(parseScrape(secureBody(t, url, scraperToken))).sum("rest_client_requests_total", `method="POST"`)
	for range 10 {
		if code, _ := secureGet(t, url+"/metrics", scraperToken); code != http.StatusOK {
			t.Fatalf("scrape: %d", code)
		}
	}
	after := promSeries(parseScrape(secureBody(t, url, scraperToken))).sum("rest_client_requests_total", `method="POST"`)
	if elapsed := time.Since(start); elapsed > 45*time.Second {
		t.Logf("12 scrapes took %v, past what the caches are sure to hold; not counting reviews", elapsed)
	} else if after != before {
		t.Errorf("12 scrapes with one token made %v POSTs to the API server, want 0 (the reviews are cached)", after-before)
	}
	t.Logf("reviews (POSTs) the daemon made for all the requests above: %v", after)

	// A certificate replaced on disk (the kubelet updating a Secret's volume,
	// cert-manager renewing it) is served without a restart.
	if c := servedCertificate(t, addr); c.VerifyHostname("first.podjanitor.e2e") != nil {
		t.Fatalf("serving %v, want the mounted first.podjanitor.e2e", c.DNSNames)
	}
	writeMountedCert(t, certDir, "second.podjanitor.e2e")
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 3*time.Minute, true, func(context.Context) (bool, error) {
		return servedCertificate(t, addr).VerifyHostname("second.podjanitor.e2e") == nil, nil
	})
	if err != nil {
		t.Fatalf("still serving %v 3 minutes after the certificate was replaced", servedCertificate(t, addr).DNSNames)
	}
	if code, _ := secureGet(t, url+"/metrics", scraperToken); code != http.StatusOK {
		t.Errorf("/metrics after the certificate changed: %d", code)
	}
	if d.logContains("forbidden") {
		d.dumpLog()
		t.Error("the daemon's log mentions forbidden: its RBAC lacks the reviews")
	}
}

// applyMetricsReader applies artifacts/monitoring/metrics-reader.yaml and
// returns the token that the API server's token controller put in its Secret.
func applyMetricsReader(t *testing.T, ctx context.Context) string {
	t.Helper()
	docs, err := deployDocuments(metricsReaderFile)
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]bool{}
	for _, doc := range docs {
		var tm metav1.TypeMeta
		if err := json.Unmarshal(doc, &tm); err != nil {
			t.Fatal(err)
		}
		kinds[tm.Kind] = true
		if tm.Kind == "Secret" {
			var s corev1.Secret
			if err := rbacStrictJSON(doc, &s); err != nil {
				t.Fatal(err)
			}
			if _, err := client.CoreV1().Secrets(s.Namespace).Create(ctx, &s, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
				t.Fatal(err)
			}
			continue
		}
		if err := applyDeployDoc(ctx, tm.Kind, doc); err != nil {
			t.Fatalf("%s: %s: %v", metricsReaderFile, tm.Kind, err)
		}
	}
	for _, k := range []string{"ServiceAccount", "Secret", "ClusterRole", "ClusterRoleBinding"} {
		if !kinds[k] {
			t.Fatalf("%s has no %s", metricsReaderFile, k)
		}
	}
	var token string
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		s, err := client.CoreV1().Secrets(rbacNS).Get(ctx, metricsReaderSecret, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		token = string(s.Data[corev1.ServiceAccountTokenKey])
		return token != "", nil
	})
	if err != nil {
		t.Fatalf("Secret %s/%s never got the token of %s: %v", rbacNS, metricsReaderSecret, metricsReaderSA, err)
	}
	return token
}

// serviceAccountToken creates a ServiceAccount in ns and returns a token of it.
func serviceAccountToken(t *testing.T, ctx context.Context, ns, name string) string {
	t.Helper()
	if _, err := client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tr, err := client.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptrTo(int64(3600))},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}

// insecureClient trusts any certificate: the identity checked here is the
// caller's, by its token.
var insecureClient = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}

func secureGet(t *testing.T, url, token string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := insecureClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func secureBody(t *testing.T, url, token string) string {
	t.Helper()
	code, body := secureGet(t, url+"/metrics", token)
	if code != http.StatusOK {
		t.Fatalf("GET %s/metrics: %d %q", url, code, lastLines(body, 3))
	}
	return body
}

// parseScrape reads a text exposition into series → value.
func parseScrape(body string) map[string]float64 {
	m := map[string]float64{}
	for _, line := range strings.Split(body, "\n") {
		k := strings.LastIndexByte(line, ' ')
		if line == "" || line[0] == '#' || k < 0 {
			continue
		}
		var v float64
		if _, err := fmt.Sscan(line[k+1:], &v); err == nil {
			m[line[:k]] = v
		}
	}
	return m
}

// servedCertificate is the certificate a TLS handshake with addr presents.
func servedCertificate(t *testing.T, addr string) *x509.Certificate {
	t.Helper()
	conn, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0]
}

// writeMountedCert writes a new key pair for host into dir as the kubelet
// updates a Secret's volume: tls.crt and tls.key are symlinks through ..data,
// a symlink to a timestamped directory, swapped at once.
func writeMountedCert(t *testing.T, dir, host string) {
	t.Helper()
	crt, key, err := cert.GenerateSelfSignedCertKey(host, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ts := filepath.Join(dir, fmt.Sprintf("..%d", time.Now().UnixNano()))
	if err := os.Mkdir(ts, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{"tls.crt": crt, "tls.key": key} {
		if err := os.WriteFile(filepath.Join(ts, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	old, _ := os.Readlink(filepath.Join(dir, "..data"))
	tmp := filepath.Join(dir, "..data_tmp")
	if err := os.Symlink(filepath.Base(ts), tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"tls.crt", "tls.key"} {
		if _, err := os.Lstat(filepath.Join(dir, name)); os.IsNotExist(err) {
			if err := os.Symlink(filepath.Join("..data", name), filepath.Join(dir, name)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if old != "" {
		os.RemoveAll(filepath.Join(dir, old))
	}
}
