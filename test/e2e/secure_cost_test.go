//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"crypto/tls"
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

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"
)

// TestSecureMetricsCallersCost checks that callers of the HTTPS metrics
// endpoint (one podjanitor as artifacts/deploy's ServiceAccount,
// --metrics-secure) cannot make it spend for them, as issue 47 found it:
//
//	(a) 2,000 requests for /N/../metrics (each a different spelling of
//	    /metrics) with the metrics reader's token, from 25 addresses (80
//	    each, within an address's burst of requests), add at most 3 requests
//	    to the API server (podjanitor's POSTs, by its own client metrics;
//	    it makes no other POST here);
//	(b) 16 loops making TLS handshakes without a token, each from its own
//	    source address, for 30 s, take under a quarter of a core of
//	    podjanitor's CPU (/proc/PID/stat before and after), while pods come
//	    due and are removed on time, and a scraper that opens a new
//	    connection for each scrape (from an address of its own) has at
//	    least 95 % of its scrapes answered.
//
// All traffic goes to 127.0.0.1 (from 127.0.0.x). About 2 minutes.
func TestSecureMetricsCallersCost(t *testing.T) {
	ctx := ctxFor(t)
	saKubeconfig, _ := setupDeployRBAC(t)
	scraperToken := applyMetricsReader(t, ctx)
	ns := newNamespace(t)
	removed := watchRemovals(t, ns)

	d := startDaemonAs(t, saKubeconfig, "Started workers", "--namespace", ns,
		"--hold-waves=false", // held waves need the Lease, which the deploy's RBAC grants in its own namespace only
		"--metrics-bind-address", "127.0.0.1:0", "--health-probe-bind-address", "127.0.0.1:0", "--metrics-secure")
	addr := d.endpoints()["metrics"]
	if addr == "" {
		d.dumpLog()
		t.Fatal("the daemon logged no metrics endpoint")
	}
	url := "https://" + addr
	// The API server's RBAC cache may not have the reader's binding yet (a
	// denial is cached for 30 s).
	err := wait.PollUntilContextTimeout(ctx, time.Second, 3*time.Minute, true, func(context.Context) (bool, error) {
		code, _ := secureGet(t, url+"/metrics", scraperToken)
		return code == http.StatusOK, nil
	})
	if err != nil {
		d.dumpLog()
		t.Fatal("the reader's token never got /metrics")
	}
	posts := func() float64 {
		return promSeries(parseScrape(secureBody(t, url, scraperToken))).sum("rest_client_requests_total", `method="POST"`)
	}

	t.Run("path spellings", func(t *testing.T) {
		const requests, callers, sources = 2000, 4, 25
		// Keep-alive connections, a few per address: their handshakes are few.
		var clients []*http.Client
		for i := range sources {
			c := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: callers,
				DialContext:     (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 9, byte(i+1))}}).DialContext,
				TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
			defer c.CloseIdleConnections()
			clients = append(clients, c)
		}
		before, start := posts(), time.Now()
		var next atomic.Int64
		var codes sync.Map // status → *atomic.Int64
		var wg sync.WaitGroup
		for range callers {
			wg.Go(func() {
				for {
					i := next.Add(1) - 1
					if i >= requests {
						return
					}
					req, _ := http.NewRequest(http.MethodGet, fmt.Sprintf("%s/%d/../metrics", url, i), nil)
					req.Header.Set("Authorization", "Bearer "+scraperToken)
					code := 0
					if resp, err := clients[i%sources].Do(req); err == nil {
						io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
						code = resp.StatusCode
					}
					n, _ := codes.LoadOrStore(code, new(atomic.Int64))
					n.(*atomic.Int64).Add(1)
				}
			})
		}
		wg.Wait()
		elapsed := time.Since(start)
		after := posts()
		var answers []string
		ok := int64(0)
		codes.Range(func(k, v any) bool {
			answers = append(answers, fmt.Sprintf("%v: %d", k, v.(*atomic.Int64).Load()))
			if k.(int) == http.StatusOK {
				ok = v.(*atomic.Int64).Load()
			}
			return true
		})
		t.Logf("%d requests for /N/../metrics with the reader's token in %v, answered %s; podjanitor's POSTs to the API server %v → %v",
			requests, elapsed.Round(time.Millisecond), strings.Join(answers, ", "), before, after)
		if after-before > 3 {
			t.Errorf("%d spellings of /metrics with one token made %v POSTs to the API server, want at most 3 (a review per token, cached)", requests, after-before)
		}
		if ok != requests {
			t.Errorf("%d of %d spellings of /metrics answered 200 to the reader, want all (they are /metrics)", ok, requests)
		}
	})

	t.Run("handshake loops", func(t *testing.T) {
		const loops, maxEach, flood = 16, 100_000, 30 * time.Second
		// The scraper: a new connection per scrape, from an address of its
		// own, allowed a scrape before the flood.
		scraper := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true,
			DialContext:     (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}).DialContext,
			TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
		scrape := func() (int, error) {
			req, _ := http.NewRequest(http.MethodGet, url+"/metrics", nil)
			req.Header.Set("Authorization", "Bearer "+scraperToken)
			resp, err := scraper.Do(req)
			if err != nil {
				return 0, err
			}
			defer resp.Body.Close()
			_, err = io.Copy(io.Discard, resp.Body)
			return resp.StatusCode, err
		}
		if code, err := scrape(); code != http.StatusOK {
			t.Fatalf("a scrape from 127.0.0.2 before the flood: %d %v", code, err)
		}
		// Pods due during the flood.
		var due []*corev1.Pod
		for i := range 6 {
			due = append(due, createPod(t, ns, fmt.Sprintf("due-%d", i), ttl(time.Duration(5*(i+1))*time.Second)))
		}

		cpuBefore := processCPU(t, d.cmd.Process.Pid)
		stop := make(chan struct{})
		var wg sync.WaitGroup
		var attempts, handshakes atomic.Int64
		start := time.Now()
		for i := range loops {
			from := &net.TCPAddr{IP: net.IPv4(127, 0, 1, byte(i+1))}
			wg.Go(func() {
				dialer := &net.Dialer{Timeout: 10 * time.Second, LocalAddr: from}
				for range maxEach {
					select {
					case <-stop:
						return
					default:
					}
					attempts.Add(1)
					if handshakeNoToken(dialer, addr) {
						handshakes.Add(1)
					}
				}
			})
		}
		var ok, total int
		var failures []string
		scraped := make(chan struct{})
		go func() {
			defer close(scraped)
			tick := time.NewTicker(2 * time.Second)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				total++
				if code, err := scrape(); code == http.StatusOK {
					ok++
				} else {
					failures = append(failures, fmt.Sprintf("%d %v", code, err))
				}
			}
		}()
		time.Sleep(flood)
		close(stop)
		wg.Wait()
		elapsed := time.Since(start)
		<-scraped
		cpu := processCPU(t, d.cmd.Process.Pid) - cpuBefore

		series := promSeries(parseScrape(secureBody(t, url, scraperToken)))
		t.Logf("%d loops for %v: %d connections, %d handshakes made (a 401 each); podjanitor's CPU %v (%.1f %% of a core); closed before the handshake: %v past their address's rate, %v past the shared one; the scraper: %d of %d scrapes 200 (failures %q)",
			loops, elapsed.Round(time.Millisecond), attempts.Load(), handshakes.Load(), cpu.Round(10*time.Millisecond), 100*cpu.Seconds()/elapsed.Seconds(),
			series.sum("podjanitor_metrics_handshakes_refused_total", `limit="address"`), series.sum("podjanitor_metrics_handshakes_refused_total", `limit="all"`),
			ok, total, failures)
		if cpu > elapsed/4 {
			t.Errorf("podjanitor used %v of CPU in %v of handshake loops, want under a quarter of a core (%v)", cpu.Round(10*time.Millisecond), elapsed.Round(time.Second), elapsed/4)
		}
		if total < 10 || ok*100 < total*95 {
			t.Errorf("the scraper got %d of %d scrapes answered 200 (failures %q), want at least 95 %%", ok, total, failures)
		}
		for i, p := range due {
			deadline := created(p).Add(time.Duration(5*(i+1)) * time.Second)
			at := removed.waitRemoved(t, p, max(time.Until(deadline.Add(latenessOK)), 0)+5*time.Second)
			lateness := at.Sub(deadline)
			t.Logf("pod %s: lateness %v", p.Name, lateness.Round(time.Millisecond))
			if lateness < 0 || lateness > latenessOK {
				t.Errorf("pod %s removed %v after its deadline, want within 0 and %v", p.Name, lateness, latenessOK)
			}
		}
		select {
		case <-d.exited:
			d.dumpLog()
			t.Fatalf("podjanitor exited: %v", d.err)
		default:
		}
	})
}

// handshakeNoToken makes a TLS handshake with addr and a GET /metrics
// without a token (401), and says whether the handshake was made.
func handshakeNoToken(dialer *net.Dialer, addr string) bool {
	c, err := tls.DialWithDialer(dialer, "tcp", addr, &tls.Config{InsecureSkipVerify: true})
	if err != nil {
		return false
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, "GET /metrics HTTP/1.1\r\nHost: podjanitor\r\nConnection: close\r\n\r\n"); err == nil {
		if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}
	return true
}

// processCPU is the CPU time process pid has used, user and system
// (utime and stime of /proc/PID/stat, in clock ticks of 1/100 s).
func processCPU(t *testing.T, pid int) time.Duration {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// The fields after the command's name, which may hold spaces: state is
	// the 3rd field of the file, utime and stime the 14th and 15th.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(f) < 13 {
		t.Fatalf("/proc/%d/stat: %q", pid, b)
	}
	var ticks int64
	for _, s := range f[11:13] {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatalf("/proc/%d/stat: %q", pid, b)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / 100
}
