//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// hostileIdleTimeout is the daemon's --http-idle-timeout here: long enough to
// open 3,000 connections on a loaded machine before the first is closed.
const hostileIdleTimeout = 45 * time.Second

// maxHostileRSS is the RSS podjanitor must stay under while attacked.
const maxHostileRSS = 128 << 20

// TestSecureMetricsHostileCallers attacks the HTTPS metrics endpoint of one
// podjanitor (as artifacts/deploy's ServiceAccount, --metrics-secure,
// --profiling) while a scraper with the metrics reader's token scrapes it
// every 2 s, as issue 31 found it open:
//
//	(a) 64 callers, each from an address of its own, send made-up tokens
//	    for 60 s: at least 95 % of the scrapes are answered 200 within
//	    Prometheus's 10 s timeout;
//	(b) 8 callers with a valid token of a ServiceAccount without rights send
//	    ~900 KB paths for 60 s (4 more send 24 KiB paths under /debug/pprof/,
//	    which pass the header cap and reach the reviews), each over 8 source
//	    addresses (within their rate of new connections): podjanitor
//	    lives, its RSS stays under 128 MiB;
//	(c) 3,000 keep-alive connections, each after one refused request, are
//	    left idle (from 200 source addresses a scrape was allowed from, each
//	    within its handshake burst): podjanitor holds --http-max-connections (1000) of them and
//	    closes the others at once (counted), its RSS under 128 MiB while they
//	    are held; all are closed by the server after its idle timeout, and the
//	    scraper is answered after.
//
// All traffic goes to 127.0.0.1. About 3.5 minutes.
func TestSecureMetricsHostileCallers(t *testing.T) {
	ctx := ctxFor(t)
	saKubeconfig, _ := setupDeployRBAC(t)
	scraperToken := applyMetricsReader(t, ctx)
	ns := newNamespace(t)
	noRightsToken := serviceAccountToken(t, ctx, ns, "no-rights")

	d := startDaemonAs(t, saKubeconfig, "Started workers", "--namespace", ns,
		"--hold-waves=false", // held waves need the Lease, which the deploy's RBAC grants in its own namespace only
		"--metrics-bind-address", "127.0.0.1:0", "--health-probe-bind-address", "127.0.0.1:0",
		"--metrics-secure", "--profiling", "--http-idle-timeout", hostileIdleTimeout.String())
	addr := d.endpoints()["metrics"]
	if addr == "" {
		d.dumpLog()
		t.Fatal("the daemon logged no metrics endpoint")
	}
	url := "https://" + addr + "/metrics"
	rss := func() int64 { return processRSS(t, d.cmd.Process.Pid) }
	t.Logf("podjanitor's RSS at start: %d MiB", rss()>>20)

	// The scraper: its own keep-alive connection, Prometheus's timeout.
	scraper := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	scrape := func() (int, error) {
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		req.Header.Set("Authorization", "Bearer "+scraperToken)
		resp, err := scraper.Do(req)
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		_, err = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, err
	}
	// The API server's RBAC cache may not have the reader's binding yet (a
	// denial is cached for 30 s).
	err := wait.PollUntilContextTimeout(ctx, time.Second, 3*time.Minute, true, func(context.Context) (bool, error) {
		code, _ := scrape()
		return code == http.StatusOK, nil
	})
	if err != nil {
		d.dumpLog()
		t.Fatal("the reader's token never got /metrics")
	}
	// scrapeEvery2s scrapes until stop closes and returns the answers.
	scrapeEvery2s := func(stop <-chan struct{}) (ok, total int, failures []string) {
		tick := time.NewTicker(2 * time.Second)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return ok, total, failures
			case <-tick.C:
			}
			total++
			code, err := scrape()
			if code == http.StatusOK {
				ok++
			} else {
				failures = append(failures, fmt.Sprintf("%d %v", code, err))
			}
		}
	}
	alive := func(when string) {
		t.Helper()
		select {
		case <-d.exited:
			d.dumpLog()
			t.Fatalf("podjanitor exited %s: %v", when, d.err)
		default:
		}
	}

	t.Run("made-up tokens", func(t *testing.T) {
		const callers, each = 64, 100 * time.Millisecond // ≤ 640 requests/s, far past the reviews' 5/s
		stop := make(chan struct{})
		var wg sync.WaitGroup
		var codes sync.Map // status → *atomic.Int64
		for i := range callers {
			wg.Go(func() {
				// Its own address: one address's requests are bounded (20 a second).
				from := &net.TCPAddr{IP: net.IPv4(127, 0, 7, byte(i+1))}
				c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true},
					DialContext: (&net.Dialer{LocalAddr: from}).DialContext}}
				defer c.CloseIdleConnections()
				for {
					select {
					case <-stop:
						return
					case <-time.After(each):
					}
					req, _ := http.NewRequest(http.MethodGet, url, nil)
					req.Header.Set("Authorization", "Bearer "+randomHex(24))
					code := 0
					if resp, err := c.Do(req); err == nil {
						io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
						code = resp.StatusCode
					}
					n, _ := codes.LoadOrStore(code, new(atomic.Int64))
					n.(*atomic.Int64).Add(1)
				}
			})
		}
		done := make(chan struct{})
		var ok, total int
		var failures []string
		go func() { ok, total, failures = scrapeEvery2s(stop); close(done) }()
		time.Sleep(60 * time.Second)
		close(stop)
		wg.Wait()
		<-done
		var answers []string
		codes.Range(func(k, v any) bool {
			answers = append(answers, fmt.Sprintf("%v: %d", k, v.(*atomic.Int64).Load()))
			return true
		})
		t.Logf("64 callers with made-up tokens for 60 s, answered %s; the scraper: %d of %d scrapes 200 (failures %q); RSS %d MiB",
			strings.Join(answers, ", "), ok, total, failures, rss()>>20)
		if total < 20 || ok*100 < total*95 {
			t.Errorf("the scraper got %d of %d scrapes answered 200 (failures %q), want at least 95 %%", ok, total, failures)
		}
		alive("under made-up tokens")
	})

	t.Run("long paths", func(t *testing.T) {
		stop := make(chan struct{})
		var wg sync.WaitGroup
		var sent, reviewed atomic.Int64
		long := strings.Repeat("a", 900<<10)
		for i := range 12 {
			wg.Go(func() {
				for n := 0; ; n++ {
					select {
					case <-stop:
						return
					case <-time.After(50 * time.Millisecond):
					}
					// 8 callers past the header cap, 4 under /debug/pprof/ within it.
					path := fmt.Sprintf("/x%d-%d-%s", i, n, long)
					if i >= 8 {
						path = fmt.Sprintf("/debug/pprof/%d-%d-%s", i, n, long[:24<<10])
					}
					// 20 connections a second over 8 addresses: within their 5 a second each.
					from := &net.TCPAddr{IP: net.IPv4(127, 0, 8, byte(i*8+n%8+1))}
					code := rawRequest(from, addr, "GET "+path+" HTTP/1.1\r\nHost: podjanitor\r\nAuthorization: Bearer "+noRightsToken+"\r\nConnection: close\r\n\r\n")
					sent.Add(1)
					if i >= 8 && code != http.StatusRequestHeaderFieldsTooLarge && code != 0 {
						reviewed.Add(1)
					}
				}
			})
		}
		var peak atomic.Int64
		go func() {
			for {
				select {
				case <-stop:
					return
				case <-time.After(time.Second):
				}
				if r := rss(); r > peak.Load() {
					peak.Store(r)
				}
			}
		}()
		done := make(chan struct{})
		var ok, total int
		go func() { ok, total, _ = scrapeEvery2s(stop); close(done) }()
		time.Sleep(60 * time.Second)
		close(stop)
		wg.Wait()
		<-done
		alive("under long paths")
		t.Logf("12 callers sent %d requests of long paths in 60 s (%d of the /debug/pprof/ ones reached the endpoint's answers); peak RSS %d MiB, now %d MiB; the scraper: %d of %d scrapes 200",
			sent.Load(), reviewed.Load(), peak.Load()>>20, rss()>>20, ok, total)
		if peak.Load() >= maxHostileRSS {
			t.Errorf("peak RSS %d MiB under long paths, want under %d MiB", peak.Load()>>20, maxHostileRSS>>20)
		}
		if sent.Load() < 100 {
			t.Errorf("only %d requests sent: the attack did not run", sent.Load())
		}
	})

	t.Run("idle connections", func(t *testing.T) {
		// The daemon holds at most --http-max-connections (1000, the
		// scraper's among them) and closes the others at once.
		const conns, maxConns, sources = 3000, 1000, 200
		// Each source address opens 15 connections, within its handshake
		// burst (20), once a scrape was allowed from it (past the rate
		// that the addresses not vouched for share).
		from := func(i int) *net.TCPAddr { return &net.TCPAddr{IP: net.IPv4(127, 0, 2+byte(i/250), 1+byte(i%250))} }
		for i := range sources {
			c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true,
				DialContext:     (&net.Dialer{LocalAddr: from(i)}).DialContext,
				TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
			// Until then its connections take the shared rate: one may be
			// closed before its handshake.
			err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
				req, _ := http.NewRequest(http.MethodGet, url, nil)
				req.Header.Set("Authorization", "Bearer "+scraperToken)
				resp, err := c.Do(req)
				if err != nil {
					return false, nil
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				return resp.StatusCode == http.StatusOK, nil
			})
			if err != nil {
				t.Fatalf("no scrape from %v allowed within a minute", from(i).IP)
			}
		}
		held := make([]net.Conn, conns)
		stop := make(chan struct{})
		done := make(chan struct{})
		var ok, total int
		go func() { ok, total, _ = scrapeEvery2s(stop); close(done) }()
		var wg sync.WaitGroup
		var next, refused atomic.Int64
		start := time.Now()
		for range 32 {
			wg.Go(func() {
				for {
					i := int(next.Add(1)) - 1
					if i >= conns {
						return
					}
					c, err := openRefused(from(i%sources), addr)
					if err != nil {
						refused.Add(1)
						continue
					}
					held[i] = c
				}
			})
		}
		wg.Wait()
		opened := time.Since(start)
		t.Cleanup(func() {
			for _, c := range held {
				if c != nil {
					c.Close()
				}
			}
		})
		heldRSS := rss()
		nHeld := conns - int(refused.Load())
		t.Logf("%d keep-alive connections opened in %v, each after one 401 (%d closed at once by the cap); RSS while held %d MiB",
			nHeld, opened.Round(time.Millisecond), refused.Load(), heldRSS>>20)
		if nHeld > maxConns || nHeld < maxConns*95/100 {
			t.Errorf("%d connections held, want at most %d and at least 95 %% of it", nHeld, maxConns)
		}
		if heldRSS >= maxHostileRSS {
			t.Errorf("RSS %d MiB with %d idle connections, want under %d MiB", heldRSS>>20, nHeld, maxHostileRSS>>20)
		}
		// Each is closed by the server (EOF), not by the client's deadline.
		var closed, open atomic.Int64
		deadline := time.Now().Add(hostileIdleTimeout + time.Minute)
		for _, c := range held {
			if c == nil {
				continue
			}
			wg.Go(func() {
				c.SetReadDeadline(deadline)
				_, err := io.Copy(io.Discard, c)
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() {
					open.Add(1)
				} else {
					closed.Add(1)
				}
			})
		}
		wg.Wait()
		close(stop)
		<-done
		t.Logf("%d connections closed by the server within %v of opening the last, %d still open; RSS after %d MiB; the scraper meanwhile: %d of %d scrapes 200",
			closed.Load(), time.Since(start.Add(opened)).Round(time.Second), open.Load(), rss()>>20, ok, total)
		if open.Load() > 0 {
			t.Errorf("%d idle connections still open %v after the idle timeout (%v)", open.Load(), time.Minute, hostileIdleTimeout)
		}
		alive("after the idle connections")
		if code, err := scrape(); code != http.StatusOK {
			t.Errorf("the scraper after the idle connections: %d %v, want 200", code, err)
		}
		series := promSeries(parseScrape(secureBody(t, "https://"+addr, scraperToken)))
		if got := series.sum("podjanitor_http_connections_refused_total", `endpoint="metrics"`); got < float64(refused.Load()) {
			t.Errorf("podjanitor_http_connections_refused_total{endpoint=\"metrics\"} = %v, want at least the %d closed at once", got, refused.Load())
		}
	})
	scrapeBody := secureBody(t, "https://"+addr, scraperToken)
	for _, line := range strings.Split(scrapeBody, "\n") {
		if strings.HasPrefix(line, "podjanitor_metrics_requests_refused_total") || strings.HasPrefix(line, "podjanitor_metrics_review_cache_evictions_total") ||
			strings.HasPrefix(line, "podjanitor_http_connections_refused_total") {
			t.Log(line)
		}
	}
}

// rawRequest sends req over a new TLS connection to addr from the local
// address from and returns the answer's status (0: none, the connection cut).
func rawRequest(from *net.TCPAddr, addr, req string) int {
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second, LocalAddr: from}, "tcp", addr, &tls.Config{InsecureSkipVerify: true})
	if err != nil {
		return 0
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(20 * time.Second))
	go io.WriteString(c, req) // the server may answer (431) before reading it all
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// openRefused opens a keep-alive connection to addr from the local address
// from, makes one request without a token (401) and returns the
// connection, left open.
func openRefused(from *net.TCPAddr, addr string) (net.Conn, error) {
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 20 * time.Second, LocalAddr: from}, "tcp", addr, &tls.Config{InsecureSkipVerify: true})
	if err != nil {
		return nil, err
	}
	c.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := io.WriteString(c, "GET /metrics HTTP/1.1\r\nHost: podjanitor\r\n\r\n"); err != nil {
		c.Close()
		return nil, err
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		c.Close()
		return nil, err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		c.Close()
		return nil, fmt.Errorf("%d, want 401", resp.StatusCode)
	}
	c.SetDeadline(time.Time{})
	return c, nil
}

// processRSS is the resident set of process pid (VmRSS of /proc/PID/status).
func processRSS(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatalf("/proc/%d/status has no VmRSS", pid)
	return 0
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}
