package secureserving

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"
	testingclock "k8s.io/utils/clock/testing"
)

// refusals counts Options.Refused's reasons.
type refusals struct {
	mu sync.Mutex
	n  map[string]int
}

func (f *refusals) count(reason string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n == nil {
		f.n = map[string]int{}
	}
	f.n[reason]++
}

func (f *refusals) get(reason string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.n[reason]
}

// statusOf decodes a refusal's metav1.Status body.
func statusOf(t *testing.T, body string) metav1.Status {
	t.Helper()
	var s metav1.Status
	if err := json.Unmarshal([]byte(body), &s); err != nil || s.Kind != "Status" {
		t.Errorf("body %q: want a Status (%v)", cut(body, 200), err)
	}
	return s
}

// TestUnknownPathsNotReviewed: a path no handler serves is answered 404
// before any review, whatever the token; the served paths are reviewed.
func TestUnknownPathsNotReviewed(t *testing.T) {
	r := &reviews{
		tokens:  map[string]string{"scraper-token": "prometheus", "other-token": "other"},
		allowed: map[string][]string{"prometheus": {"/metrics"}},
	}
	var refused refusals
	url, _ := serveAuthWith(t, r, Options{Refused: refused.count})
	long := "/x" + strings.Repeat("a", 1<<20)
	n := 0
	for _, path := range []string{"/", "/x", "/metricsx", "/metrics/x", "/debug/pprofx", long} {
		for _, token := range []string{"", "forged", "other-token", "scraper-token"} {
			code, body := get(t, url+path, token)
			if code != http.StatusNotFound || statusOf(t, body).Code != http.StatusNotFound {
				t.Errorf("GET %s with token %q: %d %q, want 404", cut(path, 20), token, code, cut(body, 100))
			}
			n++
		}
	}
	if tr, sar := r.counts(); tr != 0 || sar != 0 {
		t.Errorf("%d requests for unknown paths cost %d TokenReviews and %d SubjectAccessReviews, want 0 and 0", n, tr, sar)
	}
	if got := refused.get(RefusedUnknownPath); got != n {
		t.Errorf("refused %d requests as %s, want %d", got, RefusedUnknownPath, n)
	}
	if code, _ := get(t, url+"/metrics", "scraper-token"); code != http.StatusOK {
		t.Errorf("/metrics for the scraper: %d, want 200", code)
	}
	if code, _ := get(t, url+"/debug/pprof/heap", "scraper-token"); code != http.StatusForbidden {
		t.Errorf("/debug/pprof/heap for the scraper: %d, want 403 (served, not allowed)", code)
	}
	if tr, sar := r.counts(); tr != 1 || sar != 2 {
		t.Errorf("served paths cost %d TokenReviews and %d SubjectAccessReviews, want 1 and 2", tr, sar)
	}
}

// heapInUse is the live heap after a collection.
func heapInUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// TestCacheBytesBoundedUnderLongPaths: a user with a valid token and no
// rights asking for 1 MB paths under a served prefix (a server that accepts
// such headers) grows the caches by their hashes, not the paths.
func TestCacheBytesBoundedUnderLongPaths(t *testing.T) {
	r := &reviews{tokens: map[string]string{"no-rights-token": "nobody"}}
	url, a := serveAuthWith(t, r, Options{ReviewQPS: 1e6, ReviewBurst: 1e6})
	// A still clock: on a busy machine the requests take longer than
	// DenyTTL, and expired answers would leave fewer entries to count.
	a.now = testingclock.NewFakeClock(time.Now()).Now
	const requests = 32
	before := heapInUse()
	for i := range requests {
		path := fmt.Sprintf("/debug/pprof/%d%s", i, strings.Repeat("a", 1<<20))
		if code, body := get(t, url+path, "no-rights-token"); code != http.StatusForbidden {
			t.Fatalf("request %d: %d %q, want 403", i, code, cut(body, 100))
		}
	}
	r.mu.Lock()
	r.accessReview = nil // the fake API server's record of the reviews
	r.mu.Unlock()
	after := heapInUse()
	entries, bytes := a.access.held()
	grown := int64(after) - int64(before)
	t.Logf("%d requests of 1 MiB paths: access cache %d entries, %d bytes; live heap %+d KiB", requests, entries, bytes, grown/1024)
	if entries != requests || bytes > requests*entryOverhead {
		t.Errorf("access cache: %d entries, %d bytes, want %d entries of at most %d bytes", entries, bytes, requests, entryOverhead)
	}
	if grown > 16<<20 {
		t.Errorf("the live heap grew by %d MiB over %d requests of 1 MiB paths, want under 16 MiB", grown>>20, requests)
	}
}

// TestThrottledRefusedAtOnce: past the reviews' rate limit a token never
// seen is refused at once (429, Retry-After, a Status) without a review,
// while a token allowed lately is reviewed again when its answers expire.
func TestThrottledRefusedAtOnce(t *testing.T) {
	r := &reviews{
		tokens:  map[string]string{"scraper-token": "prometheus", "new-scraper-token": "prometheus-2"},
		allowed: map[string][]string{"prometheus": {"/metrics"}, "prometheus-2": {"/metrics"}},
	}
	var refused refusals
	// A burst of 2 and next to no refill: the scraper's two reviews take it.
	url, a := serveAuthWith(t, r, Options{ReviewQPS: 0.001, ReviewBurst: 2, Refused: refused.count})
	clock := testingclock.NewFakeClock(time.Now())
	a.now = clock.Now
	if code, body := get(t, url+"/metrics", "scraper-token"); code != http.StatusOK {
		t.Fatalf("the scraper: %d %q", code, body)
	}
	for _, token := range []string{"forged-1", "forged-2", "new-scraper-token"} {
		req, _ := http.NewRequest(http.MethodGet, url+"/metrics", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusTooManyRequests || statusOf(t, string(body)).Code != http.StatusTooManyRequests {
			t.Errorf("token %s past the limit: %d %q, want 429", token, resp.StatusCode, body)
		}
		if got := resp.Header.Get("Retry-After"); got != "1000" {
			t.Errorf("token %s: Retry-After %q, want 1000 (1/qps)", token, got)
		}
	}
	if tr, sar := r.counts(); tr != 1 || sar != 1 {
		t.Errorf("%d TokenReviews and %d SubjectAccessReviews, want 1 and 1: a throttled token is not reviewed", tr, sar)
	}
	if got := refused.get(RefusedThrottled); got != 3 {
		t.Errorf("refused %d requests as %s, want 3", got, RefusedThrottled)
	}
	// Both answers of the scraper expired: it is reviewed again, limiter or not.
	clock.Step(AllowTTL + time.Second)
	if code, body := get(t, url+"/metrics", "scraper-token"); code != http.StatusOK {
		t.Errorf("the scraper once its answers expired, the limiter empty: %d %q, want 200", code, body)
	}
	if tr, sar := r.counts(); tr != 2 || sar != 2 {
		t.Errorf("%d TokenReviews and %d SubjectAccessReviews, want 2 and 2", tr, sar)
	}
}

// TestReviewsSingleFlight: concurrent requests with one token cost one
// TokenReview and one SubjectAccessReview.
func TestReviewsSingleFlight(t *testing.T) {
	r := &reviews{
		tokens:  map[string]string{"scraper-token": "prometheus"},
		allowed: map[string][]string{"prometheus": {"/metrics"}},
		hold:    make(chan struct{}),
	}
	url := serveAuth(t, r)
	const callers = 16
	codes := make(chan int, callers)
	for range callers {
		go func() {
			code, _ := get(t, url+"/metrics", "scraper-token")
			codes <- code
		}()
	}
	err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		tr, _ := r.counts()
		return tr > 0, nil
	})
	if err != nil {
		t.Fatal("no TokenReview arrived")
	}
	time.Sleep(300 * time.Millisecond) // the other callers come while it is held
	close(r.hold)
	for range callers {
		if code := <-codes; code != http.StatusOK {
			t.Errorf("a concurrent scrape: %d, want 200", code)
		}
	}
	if tr, sar := r.counts(); tr != 1 || sar != 1 {
		t.Errorf("%d concurrent scrapes with one token cost %d TokenReviews and %d SubjectAccessReviews, want 1 and 1", callers, tr, sar)
	}
}

// TestRefreshAheadOfExpiry: a token allowed lately is reviewed again in the
// last quarter of its cached answers' time, in the background, so that its
// requests do not wait for a review when the answers would have expired.
func TestRefreshAheadOfExpiry(t *testing.T) {
	r := &reviews{
		tokens:  map[string]string{"scraper-token": "prometheus"},
		allowed: map[string][]string{"prometheus": {"/metrics"}},
	}
	url, a := serveAuthWith(t, r, Options{})
	clock := testingclock.NewFakeClock(time.Now())
	a.now = clock.Now
	scrape := func(when string) {
		t.Helper()
		if code, body := get(t, url+"/metrics", "scraper-token"); code != http.StatusOK {
			t.Fatalf("%s: %d %q", when, code, body)
		}
	}
	waitReviews := func(when string, tokenReviews, accessReviews int) {
		t.Helper()
		err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
			tr, sar := r.counts()
			return tr == tokenReviews && sar == accessReviews, nil
		})
		if err != nil {
			tr, sar := r.counts()
			t.Fatalf("%s: %d TokenReviews and %d SubjectAccessReviews, want %d and %d", when, tr, sar, tokenReviews, accessReviews)
		}
	}
	scrape("first scrape")
	waitReviews("first scrape", 1, 1)
	clock.Step(TokenTTL / 2)
	scrape("half the token's time")
	waitReviews("half the token's time", 1, 1)
	clock.Step(TokenTTL/2 - 5*time.Second) // 5 s before the token's answer expires
	scrape("5 s before the token's answer expires")
	waitReviews("5 s before the token's answer expires (a refresh)", 2, 1)
	clock.Step(10 * time.Second) // past the first answer's expiry: the refreshed one serves
	scrape("after the first answer's expiry")
	if tr, _ := r.counts(); tr != 2 {
		t.Errorf("after the first answer's expiry: %d TokenReviews, want 2 (the refreshed answer)", tr)
	}
	clock.Step(AllowTTL - TokenTTL - 5*time.Second - 10*time.Second) // 10 s before the access answer expires
	scrape("10 s before the access answer expires")
	waitReviews("10 s before the access answer expires (a refresh)", 3, 2)
	clock.Step(time.Minute)
	scrape("past the first access answer's expiry")
	if _, sar := r.counts(); sar != 2 {
		t.Errorf("past the first access answer's expiry: %d SubjectAccessReviews, want 2 (the refreshed answer)", sar)
	}
}

// TestTokenAudiences: with audiences the TokenReview asks for them, a token
// not valid for one of them is not authenticated, and the audiences are in
// the token's cache key.
func TestTokenAudiences(t *testing.T) {
	r := &reviews{
		tokens:    map[string]string{"podjanitor-token": "prometheus", "api-token": "prometheus"},
		audiences: map[string][]string{"podjanitor-token": {"podjanitor"}, "api-token": {"https://kubernetes.default.svc"}},
		allowed:   map[string][]string{"prometheus": {"/metrics"}},
	}
	url, a := serveAuthWith(t, r, Options{Audiences: []string{"podjanitor"}})
	if code, body := get(t, url+"/metrics", "podjanitor-token"); code != http.StatusOK {
		t.Errorf("a token for the audience: %d %q, want 200", code, body)
	}
	if code, _ := get(t, url+"/metrics", "api-token"); code != http.StatusUnauthorized {
		t.Errorf("a token for another audience: %d, want 401", code)
	}
	r.mu.Lock()
	for _, spec := range r.tokenReviews {
		if len(spec.Audiences) != 1 || spec.Audiences[0] != "podjanitor" {
			t.Errorf("TokenReview audiences %q, want [podjanitor]", spec.Audiences)
		}
	}
	r.mu.Unlock()
	other, _ := newAuth(http.NewServeMux(), a.authn, a.authz, Options{Audiences: []string{"other"}})
	none, _ := newAuth(http.NewServeMux(), a.authn, a.authz, Options{})
	if k := a.tokenKey("t"); k == other.tokenKey("t") || k == none.tokenKey("t") {
		t.Error("one token has the same cache key for other audiences")
	}
}

// capture is a klog logger whose lines are kept.
type capture struct {
	mu    sync.Mutex
	lines []string
}

func (c *capture) logger() klog.Logger {
	return funcr.NewJSON(func(obj string) {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.lines = append(c.lines, obj)
	}, funcr.Options{Verbosity: 4})
}

func (c *capture) matching(s string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, l := range c.lines {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return out
}

// TestFailedReviewsLogBounded: failed reviews are logged at most once per
// failureLogEvery, without the path asked for.
func TestFailedReviewsLogBounded(t *testing.T) {
	saved := reviewBackoff
	reviewBackoff = wait.Backoff{Duration: time.Millisecond, Factor: 1, Steps: 1}
	t.Cleanup(func() { reviewBackoff = saved })
	r := &reviews{tokens: map[string]string{"scraper-token": "prometheus"},
		fail: func(p string, n int) int { return pick(p == accessReviewPath, 500) }}
	var logs capture
	url, a := serveAuthWith(t, r, Options{ReviewQPS: 1e6, ReviewBurst: 1e6})
	srv := &http.Server{Handler: a, MaxHeaderBytes: 4 << 20,
		BaseContext: func(net.Listener) context.Context { return klog.NewContext(context.Background(), logs.logger()) }}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	_ = url
	for i := range 20 {
		path := fmt.Sprintf("/debug/pprof/%d-attacker-chosen", i)
		if code, _ := get(t, "http://"+ln.Addr().String()+path, "scraper-token"); code != http.StatusInternalServerError {
			t.Fatalf("request %d: %d, want 500", i, code)
		}
	}
	lines := logs.matching("Unable to authorize")
	if len(lines) != 1 {
		t.Errorf("20 failed reviews within %v logged %d lines, want 1:\n%s", failureLogEvery, len(lines), strings.Join(lines, "\n"))
	}
	if got := logs.matching("attacker-chosen"); len(got) > 0 {
		t.Errorf("the log has the path asked for: %s", got[0])
	}
}

// TestServerLimits: NewServer's connections are bounded: an idle keep-alive
// connection and one that sends no whole header are closed, headers past
// MaxHeaderBytes are refused (431), and the server's own errors (a failed
// TLS handshake) go to the klog logger.
func TestServerLimits(t *testing.T) {
	if d := NewServer(context.Background(), http.NotFoundHandler(), Limits{}); d.ReadHeaderTimeout != DefaultReadHeaderTimeout ||
		d.ReadTimeout != DefaultReadTimeout || d.IdleTimeout != DefaultIdleTimeout || d.MaxHeaderBytes != DefaultMaxHeaderBytes || d.ErrorLog == nil {
		t.Errorf("NewServer with zero limits: %v %v %v %d %v, want the defaults and an ErrorLog",
			d.ReadHeaderTimeout, d.ReadTimeout, d.IdleTimeout, d.MaxHeaderBytes, d.ErrorLog)
	}
	var logs capture
	ctx := klog.NewContext(context.Background(), logs.logger())
	srv := NewServer(ctx, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "ok") }),
		Limits{ReadHeaderTimeout: 500 * time.Millisecond, ReadTimeout: time.Second, IdleTimeout: 500 * time.Millisecond, MaxHeaderBytes: 4 << 10})
	cfg, err := TLSConfig(ctx, TLSOptions{Hosts: []string{"localhost"}})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(tls.NewListener(ln, cfg))
	t.Cleanup(func() { srv.Close() })
	dial := func() *tls.Conn {
		t.Helper()
		c, err := tls.Dial("tcp", ln.Addr().String(), &tls.Config{InsecureSkipVerify: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	// closedWithin reads c until the server closes it.
	closedWithin := func(what string, c net.Conn, d time.Duration) {
		t.Helper()
		c.SetReadDeadline(time.Now().Add(d))
		_, err := io.Copy(io.Discard, c)
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Errorf("%s: still open after %v", what, d)
		}
	}
	idle := dial()
	fmt.Fprint(idle, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	br := bufio.NewReader(idle)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("a request: %v %v", resp, err)
	}
	io.Copy(io.Discard, resp.Body)
	closedWithin("an idle keep-alive connection", idle, 10*time.Second)

	slow := dial()
	fmt.Fprint(slow, "GET / HTTP/1.1\r\nHost: x\r\n") // never ends its headers
	closedWithin("a connection that sends half a header", slow, 10*time.Second)

	big := dial()
	fmt.Fprintf(big, "GET /%s HTTP/1.1\r\nHost: x\r\n\r\n", strings.Repeat("a", 64<<10))
	if resp, err := http.ReadResponse(bufio.NewReader(big), nil); err != nil || resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("a 64 KiB request line: %v %v, want 431", resp, err)
	}

	plain, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprint(plain, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	io.Copy(io.Discard, plain)
	plain.Close()
	err = wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		return len(logs.matching("TLS handshake failed")) > 0, nil
	})
	if err != nil {
		t.Error("a failed TLS handshake was not logged through klog")
	}
}

// TestHTTP2Off: HTTP/2 is offered only with TLSOptions.HTTP2.
func TestHTTP2Off(t *testing.T) {
	for _, tc := range []struct {
		http2 bool
		want  string
	}{{false, "http/1.1"}, {true, "h2"}} {
		cfg, err := TLSConfig(context.Background(), TLSOptions{HTTP2: tc.http2})
		if err != nil {
			t.Fatal(err)
		}
		addr := serveTLS(t, cfg)
		c, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2", "http/1.1"}})
		if err != nil {
			t.Fatal(err)
		}
		if got := c.ConnectionState().NegotiatedProtocol; got != tc.want {
			t.Errorf("HTTP2 %v: negotiated %q, want %q", tc.http2, got, tc.want)
		}
		c.Close()
	}
}

// TestCertificateExpiryServed: Served is told the expiry of each
// certificate that starts being served.
func TestCertificateExpiryServed(t *testing.T) {
	var mu sync.Mutex
	var got []time.Time
	served := func(at time.Time) { mu.Lock(); got = append(got, at); mu.Unlock() }
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := TLSConfig(ctx, TLSOptions{Served: served}); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	if len(got) != 1 || time.Until(got[0]) < 300*24*time.Hour {
		t.Errorf("self-signed: told %v, want one expiry about a year away", got)
	}
	got = nil
	mu.Unlock()
	dir := t.TempDir()
	writeCertDir(t, dir, "first.example")
	cfg, err := TLSConfig(ctx, TLSOptions{CertDir: dir, Served: served})
	if err != nil {
		t.Fatal(err)
	}
	first := servedCert(t, serveTLS(t, cfg)).NotAfter
	mu.Lock()
	if len(got) != 1 || !got[0].Equal(first) {
		t.Errorf("from files: told %v, want [%v]", got, first)
	}
	mu.Unlock()
}

// TestLimitConnections: past max open connections, one more is closed at
// once (and told); a closed one gives its place back.
func TestLimitConnections(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var refused atomic.Int64
	ln := LimitConnections(inner, 2, func() { refused.Add(1) })
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "ok") })}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	// open makes a request on a new keep-alive connection; nil when the
	// connection was closed instead.
	open := func() net.Conn {
		t.Helper()
		c, err := net.Dial("tcp", inner.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprint(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err != nil || resp.StatusCode != http.StatusOK {
			c.Close()
			return nil
		}
		return c
	}
	first, second := open(), open()
	if first == nil || second == nil {
		t.Fatal("the first two connections were refused")
	}
	if third := open(); third != nil {
		t.Error("a third connection was served, want it closed at once")
	}
	if refused.Load() != 1 {
		t.Errorf("told of %d refused connections, want 1", refused.Load())
	}
	first.Close()
	err = wait.PollUntilContextTimeout(context.Background(), 20*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		c := open()
		if c != nil {
			c.Close()
		}
		return c != nil, nil
	})
	if err != nil {
		t.Error("a closed connection did not give its place back")
	}
	second.Close()
}

// TestPathSpellingsReviewedOnce: a path is cleaned before anything else:
// the spellings of /metrics (dot elements, repeated slashes, escapes) are
// /metrics, reviewed once per token and served as /metrics; a path that is
// not served once cleaned is 404, nothing reviewed.
func TestPathSpellingsReviewedOnce(t *testing.T) {
	r := &reviews{
		tokens:  map[string]string{"scraper-token": "prometheus", "other-token": "other"},
		allowed: map[string][]string{"prometheus": {"/metrics"}},
	}
	var refused refusals
	url, _ := serveAuthWith(t, r, Options{Refused: refused.count})
	spellings := []string{"/metrics", "/./metrics", "//metrics", "/metrics/.", "/a/b/../../metrics", "/%6detrics", "/x/..%2Fmetrics"}
	for i := range 200 {
		spellings = append(spellings, fmt.Sprintf("/%d/../metrics", i))
	}
	for _, p := range spellings {
		if code, body := get(t, url+p, "scraper-token"); code != http.StatusOK || body != "secret metrics" {
			t.Errorf("GET %s with the scraper's token: %d %q, want 200 and the metrics", p, code, cut(body, 100))
		}
		if code, _ := get(t, url+p, "other-token"); code != http.StatusForbidden {
			t.Errorf("GET %s with a token without the role: %d, want 403", p, code)
		}
	}
	if tr, sar := r.counts(); tr != 2 || sar != 2 {
		t.Errorf("%d spellings of /metrics with two tokens cost %d TokenReviews and %d SubjectAccessReviews, want 2 and 2", len(spellings), tr, sar)
	}
	r.mu.Lock()
	for _, s := range r.accessReview {
		if s.NonResourceAttributes.Path != "/metrics" {
			t.Errorf("a SubjectAccessReview of %q, want /metrics", s.NonResourceAttributes.Path)
		}
	}
	r.mu.Unlock()
	n := 0
	for i := range 50 {
		for _, p := range []string{fmt.Sprintf("/metrics/../%d", i), fmt.Sprintf("/metrics/%d/..", i) + "/x", "/metrics/"} {
			if code, _ := get(t, url+p, "scraper-token"); code != http.StatusNotFound {
				t.Errorf("GET %s: %d, want 404", p, code)
			}
			n++
		}
	}
	if tr, sar := r.counts(); tr != 2 || sar != 2 {
		t.Errorf("%d paths not served once cleaned: %d TokenReviews and %d SubjectAccessReviews, want none more", n, tr-2, sar-2)
	}
	if got := refused.get(RefusedUnknownPath); got != n {
		t.Errorf("refused %d requests as %s, want %d", got, RefusedUnknownPath, n)
	}
}

// TestKnownTokenNewRequestsShareTheLimit: a token allowed lately has a lane
// of its own for the requests it was allowed, not for others: the reviews
// of paths (or verbs) it makes up take the newcomers' limit and are refused
// past it (429); its allowed requests go on.
func TestKnownTokenNewRequestsShareTheLimit(t *testing.T) {
	r := &reviews{
		tokens:  map[string]string{"scraper-token": "prometheus"},
		allowed: map[string][]string{"prometheus": {"/metrics"}},
	}
	var refused refusals
	// A burst of 4 and next to no refill: the scraper's two reviews take half.
	url, a := serveAuthWith(t, r, Options{ReviewQPS: 0.001, ReviewBurst: 4, Refused: refused.count})
	clock := testingclock.NewFakeClock(time.Now())
	a.now = clock.Now
	if code, body := get(t, url+"/metrics", "scraper-token"); code != http.StatusOK {
		t.Fatalf("the scraper: %d %q", code, body)
	}
	const madeUp = 50
	for i := range madeUp {
		code, _ := get(t, fmt.Sprintf("%s/debug/pprof/%d", url, i), "scraper-token")
		if code != http.StatusForbidden && code != http.StatusTooManyRequests {
			t.Errorf("a made-up path with the scraper's token: %d, want 403 or 429", code)
		}
	}
	for _, method := range []string{"HEAD", "PUT", "X1", "X2", "X3"} {
		if code, _ := do(t, method, url+"/metrics", "Bearer scraper-token"); code != http.StatusTooManyRequests {
			t.Errorf("%s /metrics with the scraper's token, the limit taken: %d, want 429", method, code)
		}
	}
	if _, sar := r.counts(); sar != 3 {
		t.Errorf("%d made-up paths and 5 made-up verbs with the scraper's token cost %d SubjectAccessReviews, want 3 (its own and the limit's 2 left)", madeUp, sar)
	}
	if got := refused.get(RefusedThrottled); got != madeUp-2+5 {
		t.Errorf("refused %d requests as %s, want %d", got, RefusedThrottled, madeUp-2+5)
	}
	clock.Step(AllowTTL + time.Second)
	if code, body := get(t, url+"/metrics", "scraper-token"); code != http.StatusOK {
		t.Errorf("the scraper once its answers expired, the limit taken: %d %q, want 200", code, body)
	}
}

// TestAllowedToldTheAddress: Options.Allowed is told the remote address of
// each request allowed, and of no other.
func TestAllowedToldTheAddress(t *testing.T) {
	r := &reviews{
		tokens:  map[string]string{"scraper-token": "prometheus", "other-token": "other"},
		allowed: map[string][]string{"prometheus": {"/metrics"}},
	}
	var mu sync.Mutex
	var told []string
	url, _ := serveAuthWith(t, r, Options{Allowed: func(addr string) { mu.Lock(); told = append(told, addr); mu.Unlock() }})
	for _, c := range []struct{ path, token string }{{"/metrics", ""}, {"/metrics", "forged"}, {"/metrics", "other-token"}, {"/x", "scraper-token"}} {
		get(t, url+c.path, c.token)
	}
	mu.Lock()
	if len(told) != 0 {
		t.Errorf("told %q for refused requests, want nothing", told)
	}
	mu.Unlock()
	get(t, url+"/metrics", "scraper-token")
	mu.Lock()
	defer mu.Unlock()
	if len(told) != 1 || !strings.HasPrefix(told[0], "127.0.0.1:") {
		t.Errorf("told %q for an allowed request, want its remote address", told)
	}
}
