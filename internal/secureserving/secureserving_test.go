package secureserving

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/cert"
)

// reviews is an API server's answers to TokenReviews (tokens: token → user)
// and SubjectAccessReviews (allowed: user → the paths it may get), and the
// reviews it was asked for.
type reviews struct {
	tokens  map[string]string
	allowed map[string][]string

	mu           sync.Mutex
	tokenReviews []authenticationv1.TokenReviewSpec
	accessReview []authorizationv1.SubjectAccessReviewSpec
}

// client is a clientset of an API server that answers reviews alone (the
// review clients post with the REST client, which a fake clientset lacks).
func (r *reviews) client(t *testing.T) kubernetes.Interface {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		var out any
		switch req.URL.Path {
		case "/apis/authentication.k8s.io/v1/tokenreviews":
			var tr authenticationv1.TokenReview
			if err := json.NewDecoder(req.Body).Decode(&tr); err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			r.mu.Lock()
			r.tokenReviews = append(r.tokenReviews, tr.Spec)
			r.mu.Unlock()
			if name, ok := r.tokens[tr.Spec.Token]; ok {
				tr.Status = authenticationv1.TokenReviewStatus{Authenticated: true, User: authenticationv1.UserInfo{Username: name}}
			}
			out = &tr
		case "/apis/authorization.k8s.io/v1/subjectaccessreviews":
			var sar authorizationv1.SubjectAccessReview
			if err := json.NewDecoder(req.Body).Decode(&sar); err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			r.mu.Lock()
			r.accessReview = append(r.accessReview, sar.Spec)
			r.mu.Unlock()
			if nr := sar.Spec.NonResourceAttributes; nr != nil && nr.Verb == "get" {
				sar.Status.Allowed = slices.Contains(r.allowed[sar.Spec.User], nr.Path)
			}
			out = &sar
		default:
			http.NotFound(w, req)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(out)
	}))
	t.Cleanup(srv.Close)
	c, err := kubernetes.NewForConfig(&rest.Config{Host: srv.URL, ContentConfig: rest.ContentConfig{ContentType: "application/json"}})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func (r *reviews) counts() (tokenReviews, accessReviews int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.tokenReviews), len(r.accessReview)
}

// serveAuth serves "secret metrics" behind WithAuth on a local address.
func serveAuth(t *testing.T, r *reviews) string {
	t.Helper()
	c := r.client(t)
	h, err := WithAuth(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Header.Get("Authorization") != "" {
			t.Error("the bearer token reached the handler")
		}
		fmt.Fprint(w, "secret metrics")
	}), c.AuthenticationV1(), c.AuthorizationV1())
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String()
}

func get(t *testing.T, url, token string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

func TestWithAuth(t *testing.T) {
	r := &reviews{
		tokens: map[string]string{
			"scraper-token": "system:serviceaccount:monitoring:prometheus",
			"other-token":   "system:serviceaccount:default:default",
		},
		allowed: map[string][]string{"system:serviceaccount:monitoring:prometheus": {"/metrics"}},
	}
	url := serveAuth(t, r)
	for name, tc := range map[string]struct {
		path, token string
		want        int
	}{
		"anonymous":                      {path: "/metrics", want: http.StatusUnauthorized},
		"a token the API server rejects": {path: "/metrics", token: "forged", want: http.StatusUnauthorized},
		"a user without the role":        {path: "/metrics", token: "other-token", want: http.StatusForbidden},
		"the scraper":                    {path: "/metrics", token: "scraper-token", want: http.StatusOK},
		"the scraper, another path":      {path: "/debug/pprof/", token: "scraper-token", want: http.StatusForbidden},
	} {
		t.Run(name, func(t *testing.T) {
			code, body := get(t, url+tc.path, tc.token)
			if code != tc.want {
				t.Fatalf("GET %s: %d %q, want %d", tc.path, code, body, tc.want)
			}
			if (code == http.StatusOK) != (body == "secret metrics") {
				t.Errorf("GET %s: %d with body %q", tc.path, code, body)
			}
		})
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range r.accessReview {
		if s.NonResourceAttributes == nil || s.ResourceAttributes != nil || s.NonResourceAttributes.Verb != "get" {
			t.Errorf("SubjectAccessReview %+v: want a non-resource get", s)
		}
	}
}

// TestWithAuthCaches: a scraper that scrapes again and again costs one
// TokenReview and one SubjectAccessReview, not one per scrape; a denied user
// is not asked about again either (within DenyTTL).
func TestWithAuthCaches(t *testing.T) {
	r := &reviews{
		tokens:  map[string]string{"scraper-token": "prometheus", "other-token": "other"},
		allowed: map[string][]string{"prometheus": {"/metrics"}},
	}
	url := serveAuth(t, r)
	for i := range 20 {
		if code, body := get(t, url+"/metrics", "scraper-token"); code != http.StatusOK {
			t.Fatalf("scrape %d: %d %q", i, code, body)
		}
		if code, _ := get(t, url+"/metrics", "other-token"); code != http.StatusForbidden {
			t.Fatalf("scrape %d without the role: %d, want 403", i, code)
		}
	}
	if tr, sar := r.counts(); tr != 2 || sar != 2 {
		t.Errorf("40 scrapes by 2 tokens cost %d TokenReviews and %d SubjectAccessReviews, want 2 and 2", tr, sar)
	}
}

// servedCert returns the certificate a TLS handshake with addr presents.
func servedCert(t *testing.T, addr string) *x509.Certificate {
	t.Helper()
	conn, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0]
}

func serveTLS(t *testing.T, cfg *tls.Config) string {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "ok") })}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

func TestTLSConfigSelfSigned(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg, err := TLSConfig(ctx, "", "podjanitor-7d9f-abcde")
	if err != nil {
		t.Fatal(err)
	}
	addr := serveTLS(t, cfg)
	c := servedCert(t, addr)
	if err := c.VerifyHostname("podjanitor-7d9f-abcde"); err != nil {
		t.Error(err)
	}
	if err := c.VerifyHostname("127.0.0.1"); err != nil {
		t.Error(err)
	}
	if time.Until(c.NotAfter) < 300*24*time.Hour {
		t.Errorf("the self-signed certificate expires at %v", c.NotAfter)
	}
	// A second process makes a certificate of its own.
	cfg2, err := TLSConfig(ctx, "", "podjanitor-7d9f-abcde")
	if err != nil {
		t.Fatal(err)
	}
	if c2 := servedCert(t, serveTLS(t, cfg2)); c2.Equal(c) {
		t.Error("two self-signed certificates are the same")
	}
}

// writeCertDir writes a fresh key pair for host into dir the way the kubelet
// updates a Secret's volume: the files are symlinks into a ..data directory
// whose symlink is replaced at once.
func writeCertDir(t *testing.T, dir, host string) {
	t.Helper()
	crt, key, err := cert.GenerateSelfSignedCertKey(host, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ts := filepath.Join(dir, fmt.Sprintf("..%d", time.Now().UnixNano()))
	if err := os.Mkdir(ts, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{CertFile: crt, KeyFile: key} {
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
	for _, name := range []string{CertFile, KeyFile} {
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

func TestTLSConfigFromFilesReloads(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dir := t.TempDir()
	writeCertDir(t, dir, "first.example")
	cfg, err := TLSConfig(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	addr := serveTLS(t, cfg)
	if c := servedCert(t, addr); c.VerifyHostname("first.example") != nil {
		t.Fatalf("served %v, want the mounted first.example", c.DNSNames)
	}
	writeCertDir(t, dir, "second.example")
	// The files are watched (inotify), and read again every minute anyway.
	deadline := time.Now().Add(3 * time.Minute)
	for {
		c := servedCert(t, addr)
		if c.VerifyHostname("second.example") == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still serving %v 3 minutes after the certificate was replaced", c.DNSNames)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// A key that does not match the certificate is not taken: the last good pair stays.
	if err := os.WriteFile(filepath.Join(dir, "..data", KeyFile), pemKey(t), 0o600); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	if c := servedCert(t, addr); c.VerifyHostname("second.example") != nil {
		t.Errorf("after a mismatched key was written: serving %v, want second.example still", c.DNSNames)
	}
}

func TestTLSConfigMissingFiles(t *testing.T) {
	if _, err := TLSConfig(context.Background(), t.TempDir()); err == nil {
		t.Error("TLSConfig with an empty directory: no error")
	}
}

func pemKey(t *testing.T) []byte {
	t.Helper()
	_, key, err := cert.GenerateSelfSignedCertKey("other.example", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := pem.Decode(key); b == nil {
		t.Fatal("no PEM key")
	}
	return key
}
