//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestHealthPortNeighbours floods the health port of one podjanitor from
// other source addresses, as tenant pods could (issue 53 found the liveness
// probe failing 12 times of 12 under it), while a probe as the kubelet's
// (a new connection each, 5 s timeout, from an address of its own) checks
// /healthz every 2 s:
//
//	(a) 8 addresses open and hold as many connections as they can (150
//	    callers each, dialling again 20 ms after theirs is closed: 1,200,
//	    past --http-max-connections' 1,000) for 30 s: every probe is
//	    answered 200 within its timeout;
//	(b) one address sends /healthz on 8 keep-alive connections as fast as
//	    it can for 20 s: podjanitor spends under a quarter of a core, it is
//	    served at most its burst and rate of requests, and every probe is
//	    answered.
//
// All traffic goes to 127.0.0.1 (from 127.0.6.x). About a minute.
func TestHealthPortNeighbours(t *testing.T) {
	ns := newNamespace(t)
	d := startDaemon(t, "--namespace", ns, "--metrics-bind-address", "127.0.0.1:0", "--health-probe-bind-address", "127.0.0.1:0")
	addr := d.endpoints()["health"]
	if addr == "" {
		d.dumpLog()
		t.Fatal("the daemon logged no health endpoint")
	}
	prober := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true,
		DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 6, 100)}}).DialContext}}
	probe := func() error {
		resp, err := prober.Get("http://" + addr + "/healthz")
		if err != nil {
			return err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%d", resp.StatusCode)
		}
		return nil
	}
	// probeEvery2s probes until stop closes and returns the failures.
	probeEvery2s := func(stop <-chan struct{}) (total int, failures []string) {
		tick := time.NewTicker(2 * time.Second)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return total, failures
			case <-tick.C:
			}
			total++
			start := time.Now()
			if err := probe(); err != nil {
				failures = append(failures, fmt.Sprintf("%v after %v", err, time.Since(start).Round(time.Millisecond)))
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
	if err := probe(); err != nil {
		t.Fatalf("a probe before the flood: %v", err)
	}

	t.Run("held connections", func(t *testing.T) {
		const sources, callersEach, flood = 8, 150, 30 * time.Second
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		var open, dials atomic.Int64 // connections open as the callers see them
		for s := range sources {
			d := &net.Dialer{Timeout: 10 * time.Second, LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 6, byte(s+1))}}
			for range callersEach {
				wg.Go(func() {
					for ctx.Err() == nil {
						c, err := d.DialContext(ctx, "tcp", addr)
						if err == nil {
							dials.Add(1)
							open.Add(1)
							stop := context.AfterFunc(ctx, func() { c.Close() })
							io.Copy(io.Discard, c) // until the server closes it
							stop()
							c.Close()
							open.Add(-1)
						}
						select {
						case <-ctx.Done():
						case <-time.After(20 * time.Millisecond):
						}
					}
				})
			}
		}
		// The callers hold their connections before the first probe: 1,000
		// (all) without the source bounds, 128 and 512 held to be closed with them.
		deadline := time.Now().Add(20 * time.Second)
		for open.Load() < 600 && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		held := open.Load()
		stop := make(chan struct{})
		done := make(chan struct{})
		var total int
		var failures []string
		go func() { total, failures = probeEvery2s(stop); close(done) }()
		time.Sleep(flood)
		close(stop)
		<-done
		cancel()
		wg.Wait()
		series := d.scrape(t)
		t.Logf("%d callers from %d addresses: %d connections made, %d open as the first probe went; probes failed %d of %d (%q); refused: %v for the addresses' bounds, %v for --http-max-connections",
			sources*callersEach, sources, dials.Load(), held, len(failures), total, failures,
			series.sum("podjanitor_http_source_refused_total", `endpoint="health"`), series.sum("podjanitor_http_connections_refused_total", `endpoint="health"`))
		if total < 10 || len(failures) > 0 {
			t.Errorf("%d of %d probes failed (%q) while 8 other addresses held connections, want none", len(failures), total, failures)
		}
		alive("under held connections")
	})

	t.Run("keep-alive flood", func(t *testing.T) {
		const conns, flood = 8, 20 * time.Second
		before := d.scrape(t).sum("podjanitor_http_source_refused_total", `endpoint="health",limit="address_requests"`)
		cpuBefore := processCPU(t, d.cmd.Process.Pid)
		ctx, cancel := context.WithTimeout(context.Background(), flood)
		defer cancel()
		var wg sync.WaitGroup
		var sent, ok atomic.Int64
		dialer := &net.Dialer{Timeout: 10 * time.Second, LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 6, 20)}}
		for range conns {
			wg.Go(func() {
				for ctx.Err() == nil {
					c, err := dialer.DialContext(ctx, "tcp", addr)
					if err != nil {
						continue
					}
					stop := context.AfterFunc(ctx, func() { c.Close() })
					br := bufio.NewReader(c)
					for ctx.Err() == nil {
						if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: podjanitor\r\n\r\n"); err != nil {
							break
						}
						sent.Add(1)
						resp, err := http.ReadResponse(br, nil)
						if err != nil {
							break
						}
						io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
						if resp.StatusCode == http.StatusOK {
							ok.Add(1)
						}
						if resp.Close {
							break
						}
					}
					stop()
					c.Close()
				}
			})
		}
		start := time.Now()
		stopProbes := make(chan struct{})
		done := make(chan struct{})
		var total int
		var failures []string
		go func() { total, failures = probeEvery2s(stopProbes); close(done) }()
		wg.Wait()
		elapsed := time.Since(start)
		close(stopProbes)
		<-done
		cpu := processCPU(t, d.cmd.Process.Pid) - cpuBefore
		refused := d.scrape(t).sum("podjanitor_http_source_refused_total", `endpoint="health",limit="address_requests"`) - before
		t.Logf("one address on %d keep-alive connections for %v: %d requests sent, %d answered 200, %v refused (429, the connection closed); podjanitor's CPU %v (%.1f %% of a core); probes failed %d of %d (%q)",
			conns, elapsed.Round(time.Millisecond), sent.Load(), ok.Load(), refused, cpu.Round(10*time.Millisecond), 100*cpu.Seconds()/elapsed.Seconds(), len(failures), total, failures)
		if cpu > elapsed/4 {
			t.Errorf("podjanitor used %v of CPU in %v of a keep-alive flood from one address, want under a quarter of a core", cpu.Round(10*time.Millisecond), elapsed.Round(time.Second))
		}
		// Its burst (100) and 20 a second.
		if max := 100 + 20*int64(elapsed.Seconds()+1); ok.Load() > max {
			t.Errorf("%d requests from one address answered 200 in %v, want at most %d (its burst and rate)", ok.Load(), elapsed.Round(time.Second), max)
		}
		if total < 5 || len(failures) > 0 {
			t.Errorf("%d of %d probes failed (%q) under a keep-alive flood from another address, want none", len(failures), total, failures)
		}
		alive("under a keep-alive flood")
	})
}
