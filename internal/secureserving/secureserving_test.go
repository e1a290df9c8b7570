package secureserving

import (
	"context"
	"crypto/sha256"
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
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/cert"
	"k8s.io/client-go/util/flowcontrol"
)

// reviews is an API server's answers to TokenReviews (tokens: token → user)
// and SubjectAccessReviews (allowed: user → the paths it may get), and the
// reviews it was asked for.
type reviews struct {
	tokens  map[string]string
	allowed map[string][]string
	// groups and extra are given to every authenticated user.
	groups []string
	extra  map[string]authenticationv1.ExtraValue
	// fail, when set, is the HTTP status the API server answers the n-th
	// (from 0) review of path with; 0 answers it.
	fail func(path string, n int) int
	// audiences, when set, are the audiences each token is valid for (none:
	// any), as TokenRequests give them.
	audiences map[string][]string
	// hold, when set, holds each TokenReview until it is closed.
	hold chan struct{}

	mu           sync.Mutex
	tokenReviews []authenticationv1.TokenReviewSpec
	accessReview []authorizationv1.SubjectAccessReviewSpec
}

const (
	tokenReviewPath  = "/apis/authentication.k8s.io/v1/tokenreviews"
	accessReviewPath = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
)

// client is a clientset of an API server that answers reviews alone (the
// review clients post with the REST client, which a fake clientset lacks).
func (r *reviews) client(t *testing.T) kubernetes.Interface {
	t.Helper()
	seen := map[string]int{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		n := seen[req.URL.Path]
		seen[req.URL.Path]++
		r.mu.Unlock()
		if r.fail != nil {
			if code := r.fail(req.URL.Path, n); code != 0 {
				if req.URL.Path == tokenReviewPath {
					r.mu.Lock()
					r.tokenReviews = append(r.tokenReviews, authenticationv1.TokenReviewSpec{})
					r.mu.Unlock()
				} else {
					r.mu.Lock()
					r.accessReview = append(r.accessReview, authorizationv1.SubjectAccessReviewSpec{})
					r.mu.Unlock()
				}
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(code)
				fmt.Fprintf(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","code":%d}`, code)
				return
			}
		}
		var out any
		switch req.URL.Path {
		case tokenReviewPath:
			var tr authenticationv1.TokenReview
			if err := json.NewDecoder(req.Body).Decode(&tr); err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			r.mu.Lock()
			r.tokenReviews = append(r.tokenReviews, tr.Spec)
			r.mu.Unlock()
			if r.hold != nil {
				<-r.hold
			}
			if name, ok := r.tokens[tr.Spec.Token]; ok {
				// The API server's answer: the audiences asked for that the
				// token is valid for; none of them, not authenticated.
				auds, valid := tr.Spec.Audiences, true
				if r.audiences != nil && len(tr.Spec.Audiences) > 0 {
					auds = nil
					for _, a := range tr.Spec.Audiences {
						if slices.Contains(r.audiences[tr.Spec.Token], a) {
							auds = append(auds, a)
						}
					}
					valid = len(auds) > 0
				}
				if valid {
					tr.Status = authenticationv1.TokenReviewStatus{Authenticated: true, Audiences: auds,
						User: authenticationv1.UserInfo{Username: name, UID: "uid-" + name, Groups: r.groups, Extra: r.extra}}
				}
			}
			out = &tr
		case accessReviewPath:
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
	c, err := kubernetes.NewForConfig(&rest.Config{Host: srv.URL, ContentConfig: rest.ContentConfig{ContentType: "application/json"},
		RateLimiter: flowcontrol.NewFakeAlwaysRateLimiter()})
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

// serveAuth serves "secret metrics" on /metrics and /debug/pprof/ behind
// WithAuth on a local address.
func serveAuth(t *testing.T, r *reviews) string {
	t.Helper()
	url, _ := serveAuthWith(t, r, Options{})
	return url
}

// serveAuthWith is serveAuth with opts; it returns the auth too.
func serveAuthWith(t *testing.T, r *reviews, opts Options) (string, *auth) {
	t.Helper()
	c := r.client(t)
	metrics := http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Header.Get("Authorization") != "" {
			t.Error("the bearer token reached the handler")
		}
		fmt.Fprint(w, "secret metrics")
	})
	mux := http.NewServeMux()
	mux.Handle("/metrics", metrics)
	mux.Handle("/debug/pprof/", metrics)
	a, err := newAuth(mux, c.AuthenticationV1(), c.AuthorizationV1(), opts)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: a, MaxHeaderBytes: 4 << 20}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String(), a
}

func get(t *testing.T, url, token string) (int, string) {
	t.Helper()
	header := ""
	if token != "" {
		header = "Bearer " + token
	}
	return do(t, http.MethodGet, url, header)
}

// do sends a request with the given Authorization header ("": none).
func do(t *testing.T, method, url, authorization string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if authorization != "" {
		req.Header.Set("Authorization", authorization)
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

// TestWithAuthRequests: the Authorization header is read as the API server
// reads it, and the SubjectAccessReview asks about the request's own verb
// and path for the whole user (UID, groups, extra).
func TestWithAuthRequests(t *testing.T) {
	r := &reviews{
		tokens:  map[string]string{"scraper-token": "prometheus"},
		allowed: map[string][]string{"prometheus": {"/metrics"}},
		groups:  []string{"system:serviceaccounts", "system:authenticated"},
		extra:   map[string]authenticationv1.ExtraValue{"authentication.kubernetes.io/pod-name": {"prometheus-0"}},
	}
	url := serveAuth(t, r)
	for _, tc := range []struct {
		method, authorization string
		want                  int
		tokenReviews          int // how many more TokenReviews it costs
	}{
		{http.MethodGet, "bearer scraper-token", http.StatusOK, 1},
		{http.MethodGet, "Bearer  ", http.StatusUnauthorized, 0},
		{http.MethodGet, "Basic c2NyYXBlcjp4", http.StatusUnauthorized, 0},
		{http.MethodGet, "scraper-token", http.StatusUnauthorized, 0},
		{http.MethodPost, "Bearer scraper-token", http.StatusForbidden, 0}, // a get of /metrics is not a post
	} {
		before, _ := r.counts()
		code, body := do(t, tc.method, url+"/metrics", tc.authorization)
		if code != tc.want {
			t.Errorf("%s with Authorization %q: %d %q, want %d", tc.method, tc.authorization, code, body, tc.want)
		}
		if code != http.StatusOK {
			var status metav1.Status
			if err := json.Unmarshal([]byte(body), &status); err != nil || int(status.Code) != code || status.Kind != "Status" {
				t.Errorf("%s with Authorization %q: body %q, want a Status of code %d (%v)", tc.method, tc.authorization, body, code, err)
			}
		}
		if after, _ := r.counts(); after-before != tc.tokenReviews {
			t.Errorf("%s with Authorization %q: %d TokenReviews, want %d", tc.method, tc.authorization, after-before, tc.tokenReviews)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	want := []authorizationv1.SubjectAccessReviewSpec{{
		User: "prometheus", UID: "uid-prometheus", Groups: r.groups,
		Extra:                 map[string]authorizationv1.ExtraValue{"authentication.kubernetes.io/pod-name": {"prometheus-0"}},
		NonResourceAttributes: &authorizationv1.NonResourceAttributes{Path: "/metrics", Verb: "get"},
	}, {
		User: "prometheus", UID: "uid-prometheus", Groups: r.groups,
		Extra:                 map[string]authorizationv1.ExtraValue{"authentication.kubernetes.io/pod-name": {"prometheus-0"}},
		NonResourceAttributes: &authorizationv1.NonResourceAttributes{Path: "/metrics", Verb: "post"},
	}}
	if !reflect.DeepEqual(r.accessReview, want) {
		t.Errorf("SubjectAccessReviews\n%+v\nwant\n%+v", r.accessReview, want)
	}
}

// TestWithAuthCachesRefusedTokens: a caller with a token the API server does
// not authenticate costs one TokenReview per DenyTTL, not one per request.
func TestWithAuthCachesRefusedTokens(t *testing.T) {
	r := &reviews{tokens: map[string]string{}}
	url := serveAuth(t, r)
	for i := range 10 {
		if code, _ := get(t, url+"/metrics", "forged"); code != http.StatusUnauthorized {
			t.Fatalf("request %d with a forged token: %d, want 401", i, code)
		}
	}
	if tr, sar := r.counts(); tr != 1 || sar != 0 {
		t.Errorf("10 requests with a forged token cost %d TokenReviews and %d SubjectAccessReviews, want 1 and 0", tr, sar)
	}
}

// TestWithAuthReviewFailures: a review the API server fails for a reason
// that may pass (5xx, 429, no answer) is tried again with backoff; one it
// refuses for good (403: podjanitor may not create reviews) is not. Nothing
// is let through, and no failure is cached.
func TestWithAuthReviewFailures(t *testing.T) {
	saved := reviewBackoff
	reviewBackoff = wait.Backoff{Duration: time.Millisecond, Factor: 1, Steps: 5}
	t.Cleanup(func() { reviewBackoff = saved })
	users := func() *reviews {
		return &reviews{
			tokens:  map[string]string{"scraper-token": "prometheus"},
			allowed: map[string][]string{"prometheus": {"/metrics"}},
		}
	}
	for _, tc := range []struct {
		name                  string
		fail                  func(path string, n int) int
		want                  int
		tokenReviews, reviews int
		then                  int // the answer to the next request
	}{
		{"TokenReview 503 twice", func(p string, n int) int { return pick(p == tokenReviewPath && n < 2, 503) },
			http.StatusOK, 3, 1, http.StatusOK},
		{"TokenReview 429 always", func(p string, n int) int { return pick(p == tokenReviewPath, 429) },
			http.StatusUnauthorized, 5, 0, http.StatusUnauthorized},
		{"TokenReview 403 (RBAC)", func(p string, n int) int { return pick(p == tokenReviewPath, 403) },
			http.StatusUnauthorized, 1, 0, http.StatusUnauthorized},
		{"SubjectAccessReview 500 always", func(p string, n int) int { return pick(p == accessReviewPath, 500) },
			http.StatusInternalServerError, 1, 5, http.StatusInternalServerError},
		{"SubjectAccessReview 500 for one request", func(p string, n int) int { return pick(p == accessReviewPath && n < 5, 500) },
			http.StatusInternalServerError, 1, 5, http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := users()
			r.fail = tc.fail
			url := serveAuth(t, r)
			if code, body := get(t, url+"/metrics", "scraper-token"); code != tc.want {
				t.Errorf("%d %q, want %d", code, body, tc.want)
			}
			if tr, sar := r.counts(); tr != tc.tokenReviews || sar != tc.reviews {
				t.Errorf("%d TokenReviews and %d SubjectAccessReviews, want %d and %d", tr, sar, tc.tokenReviews, tc.reviews)
			}
			if code, body := get(t, url+"/metrics", "scraper-token"); code != tc.then {
				t.Errorf("the next request: %d %q, want %d", code, body, tc.then)
			}
		})
	}
}

func pick(cond bool, code int) int {
	if cond {
		return code
	}
	return 0
}

// TestTTLCacheBounded: the caches hold at most maxEntries entries and
// maxBytes bytes; expired entries go at every insert, then those closest to
// expiry, each one told.
func TestTTLCacheBounded(t *testing.T) {
	evicted := 0
	c := newTTLCache(100, 100*entryOverhead+1000, func(s string) int { return len(s) }, func() { evicted++ })
	now := time.Now()
	key := func(s string) cacheKey { return cacheKey(sha256.Sum256([]byte(s))) }
	c.put(key("old"), "", now.Add(time.Second), now)
	c.put(key("live"), "", now.Add(time.Hour), now.Add(2*time.Second)) // "old" has expired
	if n, _ := c.held(); n != 1 || evicted != 0 {
		t.Errorf("%d entries (%d evicted) once the first had expired, want 1 (0)", n, evicted)
	}
	for i := range 200 {
		c.put(key(fmt.Sprint("new", i)), "", now.Add(time.Duration(i)*time.Minute), now)
	}
	if n, _ := c.held(); n > 100 {
		t.Errorf("%d entries, want at most 100", n)
	}
	if _, _, ok := c.get(key("new199"), now); !ok {
		t.Error("the last entry put is not held")
	}
	if _, _, ok := c.get(key("new0"), now); ok {
		t.Error("the entry closest to expiry was kept in a full cache")
	}
	// Bytes: ten values of 400 bytes leave at most two (1000 bytes of values).
	for i := range 10 {
		c.put(key(fmt.Sprint("big", i)), strings.Repeat("x", 400), now.Add(2*time.Hour), now)
	}
	if _, b := c.held(); b > 100*entryOverhead+1000 {
		t.Errorf("%d bytes held, want at most %d", b, 100*entryOverhead+1000)
	}
	c.put(key("huge"), strings.Repeat("x", 1<<20), now.Add(2*time.Hour), now)
	if _, _, ok := c.get(key("huge"), now); ok {
		t.Error("a value larger than the cache was stored")
	}
	if evicted == 0 {
		t.Error("no eviction was told")
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
	cfg, err := TLSConfig(ctx, TLSOptions{Hosts: []string{"podjanitor-7d9f-abcde"}})
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
	cfg2, err := TLSConfig(ctx, TLSOptions{Hosts: []string{"podjanitor-7d9f-abcde"}})
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
	cfg, err := TLSConfig(ctx, TLSOptions{CertDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	addr := serveTLS(t, cfg)
	if c := servedCert(t, addr); c.VerifyHostname("first.example") != nil {
		t.Fatalf("served %v, want the mounted first.example", c.DNSNames)
	}
	writeCertDir(t, dir, "second.example")
	// The files are read again every CertPoll.
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
	if _, err := TLSConfig(context.Background(), TLSOptions{CertDir: t.TempDir()}); err == nil {
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
