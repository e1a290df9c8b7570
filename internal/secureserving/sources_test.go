package secureserving

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	testingclock "k8s.io/utils/clock/testing"
)

// limitsCounted counts SourceLimiter's refusals by limit.
type limitsCounted struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *limitsCounted) count(limit string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[limit]++
}

func (c *limitsCounted) get(limit string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[limit]
}

// TestSourceLimiterRates: each source address has a rate of its own;
// the addresses not vouched for share one more; a vouched address skips the
// shared one (not its own) for RecentTTL.
func TestSourceLimiterRates(t *testing.T) {
	h := NewSourceLimiter(SourceLimits{AddressQPS: 1, AddressBurst: 2, QPS: 1, Burst: 3}, nil)
	clock := testingclock.NewFakeClock(time.Now())
	h.now = clock.Now
	ip := func(s string) netip.Addr { return netip.MustParseAddr(s) }
	admit := func(addr, want string) {
		t.Helper()
		if got := h.admit(ip(addr)); got != want {
			t.Errorf("a connection from %s: past %q, want %q", addr, got, want)
		}
	}
	admit("10.0.0.1", "")
	admit("10.0.0.1", "")
	admit("10.0.0.1", LimitAddress) // its burst of 2 taken
	admit("10.0.0.2", "")           // the last of the shared burst of 3
	admit("10.0.0.3", LimitAll)
	if s := h.addresses[ip("10.0.0.3")]; s.connections.tokens != 2 {
		t.Errorf("a connection past the shared rate took its address's rate: %v left of 2", s.connections.tokens)
	}
	h.Vouch("10.0.0.9:4321")
	admit("10.0.0.9", "") // vouched for: the shared rate is not its
	admit("10.0.0.9", "")
	admit("10.0.0.9", LimitAddress) // its own still is
	clock.Step(time.Second)         // one more of each
	admit("10.0.0.3", "")
	admit("10.0.0.4", LimitAll)
	admit("10.0.0.9", "")
	h.Vouch("[::ffff:10.0.0.8]:80") // IPv4 in IPv6 is the IPv4 address
	admit("10.0.0.8", "")
	clock.Step(RecentTTL)
	admit("10.0.0.9", "") // the shared rate's burst is back
	for _, a := range []string{"10.0.0.9", "10.0.0.8"} {
		admit(a, "")
	}
	admit("10.0.0.8", LimitAll) // no longer vouched for: the shared burst taken
	// The addresses' table is bounded.
	for i := range 2 * maxAddresses {
		h.admit(netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)}))
	}
	if n := len(h.addresses); n > maxAddresses {
		t.Errorf("%d addresses held, want at most %d", n, maxAddresses)
	}
}

// dialFrom makes a TLS handshake with addr from the local address from and a
// GET of path; it returns the status, 0 when the connection was closed
// before an answer.
func dialFrom(t *testing.T, from, addr, path string) int {
	t.Helper()
	d := &net.Dialer{Timeout: 10 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
	c, err := tls.DialWithDialer(d, "tcp", addr, &tls.Config{InsecureSkipVerify: true})
	if err != nil {
		return 0
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer scraper-token\r\nConnection: close\r\n\r\n", path)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// TestHandshakesLimitedBeforeTLS: connections past the handshake limits are
// closed as they are accepted, before any TLS work (the server never reads
// their ClientHello); another address goes on, and an address a request was
// allowed from goes past the shared rate.
func TestHandshakesLimitedBeforeTLS(t *testing.T) {
	r := &reviews{tokens: map[string]string{"scraper-token": "prometheus"}, allowed: map[string][]string{"prometheus": {"/metrics"}}}
	var refused limitsCounted
	h := NewSourceLimiter(SourceLimits{AddressQPS: 0.001, AddressBurst: 5, QPS: 0.001, Burst: 7}, refused.count)
	h.afterFunc = func(_ time.Duration, closeConn func()) { closeConn() } // no hold
	c := r.client(t)
	mux := http.NewServeMux()
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "secret metrics") })
	handler, err := WithAuth(mux, c.AuthenticationV1(), c.AuthorizationV1(), Options{Allowed: h.Vouch})
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := TLSConfig(context.Background(), TLSOptions{Hosts: []string{"localhost"}})
	if err != nil {
		t.Fatal(err)
	}
	var hellos atomic.Int64 // ClientHellos the TLS server read
	cfg.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) { hellos.Add(1); return nil, nil }
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := NewServer(context.Background(), handler, Limits{})
	go srv.Serve(tls.NewListener(h.Listener(context.Background(), ln), cfg))
	t.Cleanup(func() { srv.Close() })
	addr := ln.Addr().String()

	served := 0
	for range 30 {
		if code := dialFrom(t, "127.0.0.1", addr, "/x"); code == http.StatusNotFound {
			served++
		}
	}
	if served != 5 || hellos.Load() != 5 {
		t.Errorf("30 connections from one address: %d served, %d ClientHellos read; want its burst, 5 and 5", served, hellos.Load())
	}
	if got := refused.get(LimitAddress); got != 25 {
		t.Errorf("told of %d connections past the address's rate, want 25", got)
	}
	// Two more addresses take the shared burst of 7; a third is past it.
	if code := dialFrom(t, "127.0.0.2", addr, "/metrics"); code != http.StatusOK {
		t.Fatalf("a scrape from another address: %d, want 200", code)
	}
	if code := dialFrom(t, "127.0.0.3", addr, "/x"); code != http.StatusNotFound {
		t.Fatalf("a request from a third address: %d, want 404", code)
	}
	if code := dialFrom(t, "127.0.0.4", addr, "/x"); code != 0 {
		t.Errorf("a request from a fourth address, the shared burst taken: %d, want the connection closed", code)
	}
	// 127.0.0.2 was allowed a scrape: its new connections skip the shared rate.
	for i := range 3 {
		if code := dialFrom(t, "127.0.0.2", addr, "/metrics"); code != http.StatusOK {
			t.Errorf("scrape %d from the address allowed a scrape, the shared burst taken: %d, want 200", i, code)
		}
	}
	if got := hellos.Load(); got != 5+2+3 {
		t.Errorf("%d ClientHellos read, want %d: one per connection let through", got, 5+2+3)
	}
}

// TestRefusedConnectionsHeld: a connection past the limits is held, unread,
// for refusedHold before it is closed (a caller that dials again at once
// waits for it); past maxHeld held, one more is closed at once.
func TestRefusedConnectionsHeld(t *testing.T) {
	h := NewSourceLimiter(SourceLimits{AddressQPS: 0.001, AddressBurst: 1, QPS: 1000, Burst: 1000}, nil)
	h.maxHeld = 2
	var mu sync.Mutex
	var closes []func()
	h.afterFunc = func(d time.Duration, closeConn func()) {
		if d != refusedHold {
			t.Errorf("a refused connection held for %v, want %v", d, refusedHold)
		}
		mu.Lock()
		closes = append(closes, closeConn)
		mu.Unlock()
	}
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := h.Listener(context.Background(), inner)
	t.Cleanup(func() { ln.Close() })
	accepted := make(chan net.Conn, 10)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	dial := func() net.Conn {
		t.Helper()
		c, err := net.Dial("tcp", inner.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	// open says whether the server has not closed c (a read waits).
	open := func(c net.Conn) bool {
		c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		_, err := c.Read(make([]byte, 1))
		ne, ok := err.(net.Error)
		return ok && ne.Timeout()
	}
	// closed waits until the server closed c.
	closed := func(c net.Conn) bool {
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, err := c.Read(make([]byte, 1))
		ne, ok := err.(net.Error)
		return err != nil && !(ok && ne.Timeout())
	}
	dial()
	<-accepted // the address's burst
	first, second := dial(), dial()
	err = wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		mu.Lock()
		defer mu.Unlock()
		return len(closes) == 2, nil
	})
	if err != nil {
		t.Fatal("the two connections past the address's rate were not held")
	}
	if !open(first) || !open(second) {
		t.Error("a held connection was closed before its hold ended")
	}
	if third := dial(); !closed(third) {
		t.Error("a connection past maxHeld held was not closed at once")
	}
	mu.Lock()
	for _, f := range closes {
		f()
	}
	mu.Unlock()
	if !closed(first) || !closed(second) {
		t.Error("a held connection was not closed when its hold ended")
	}
	if len(accepted) != 0 {
		t.Errorf("%d connections past the limit returned by Accept", len(accepted))
	}
}

// serveLimited serves handler in plain HTTP on 127.0.0.1 within sources
// (nil: none) and at most maxConnections open, as the health endpoint is
// served; it returns the address and the listener of open connections.
func serveLimited(t *testing.T, sources *SourceLimiter, maxConnections int, limits Limits, handler http.Handler) (string, *limitListener) {
	t.Helper()
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := LimitConnections(sources.Listener(context.Background(), inner), maxConnections, nil).(*limitListener)
	srv := NewServer(context.Background(), sources.Requests(context.Background(), handler), limits)
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return inner.Addr().String(), ln
}

// probe is the kubelet's HTTP probe: a new connection from the local
// address from, a GET of path, within timeout; the status, 0 for none.
func probe(from, addr, path string, timeout time.Duration) int {
	c := &http.Client{Timeout: timeout, Transport: &http.Transport{DisableKeepAlives: true,
		DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}).DialContext}}
	resp, err := c.Get("http://" + addr + path)
	if err != nil {
		return 0
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// holdConnections opens and holds, from each of the addresses froms, as
// many connections to addr as it can (each of its callers dialling again,
// after 20 ms, when the server closes one), until the test ends.
func holdConnections(t *testing.T, addr string, froms []string, callersEach int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	for _, from := range froms {
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
		for range callersEach {
			wg.Go(func() {
				for ctx.Err() == nil {
					c, err := d.DialContext(ctx, "tcp", addr)
					if err == nil {
						context.AfterFunc(ctx, func() { c.Close() })
						io.Copy(io.Discard, c) // until the server closes it
						c.Close()
					}
					select {
					case <-ctx.Done():
					case <-time.After(20 * time.Millisecond):
					}
				}
			})
		}
	}
}

// TestProbeAnsweredWhileOthersHoldConnections: while 8 other source
// addresses open and hold as many connections as they can (40 callers
// each, dialling again as theirs are closed: 320, past the endpoint's 200),
// a probe from another address (a new connection each, 5 s timeout, as the
// kubelet's) is answered each time: each address holds at most its 16.
// Without the source bounds the 8 hold all 200 and the probe is refused.
func TestProbeAnsweredWhileOthersHoldConnections(t *testing.T) {
	const maxConnections, callersEach, probes = 200, 40, 10
	others := []string{"127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5", "127.0.0.6", "127.0.0.7", "127.0.0.8", "127.0.0.9"}
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	// Connections that send nothing stay open for the test.
	limits := Limits{ReadHeaderTimeout: time.Minute}
	for _, tc := range []struct {
		name    string
		sources *SourceLimiter
	}{
		{"source bounds", NewSourceLimiter(SourceLimits{QPS: NoSharedRate}, nil)},
		{"no source bounds", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr, ln := serveLimited(t, tc.sources, maxConnections, limits, ok)
			holdConnections(t, addr, others, callersEach)
			want := maxConnections
			if tc.sources != nil {
				want = len(others) * DefaultAddressConnections
			}
			err := wait.PollUntilContextTimeout(context.Background(), 20*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
				return ln.open.Load() >= int64(want), nil
			})
			if err != nil {
				t.Fatalf("the 8 addresses hold %d connections, want %d", ln.open.Load(), want)
			}
			answered := 0
			for range probes {
				start := time.Now()
				if code := probe("127.0.0.10", addr, "/healthz", 5*time.Second); code == http.StatusOK {
					answered++
				} else {
					t.Logf("a probe: %d after %v", code, time.Since(start).Round(time.Millisecond))
				}
				time.Sleep(100 * time.Millisecond)
			}
			held := ln.open.Load()
			t.Logf("%d connections open, %d of %d probes answered", held, answered, probes)
			if tc.sources == nil {
				if answered > 0 {
					t.Errorf("without the source bounds %d of %d probes were answered, want none: the test's flood does not fill the endpoint", answered, probes)
				}
				return
			}
			if answered != probes {
				t.Errorf("%d of %d probes answered within 5 s while 8 other addresses held %d connections, want all", answered, probes, held)
			}
			if held > int64(want+1) {
				t.Errorf("%d connections open, want at most the 8 addresses' %d and a probe's", held, want)
			}
		})
	}
}

// TestKeepAliveFloodBounded: one source address sending requests as fast
// as it can on keep-alive connections gets its burst of requests served;
// each request past its rate is answered 429 and its connection closed, so
// that it costs the server a new connection each, within its rate of new
// connections. Another address is served meanwhile. (A still clock: no rate
// refills during the test.)
func TestKeepAliveFloodBounded(t *testing.T) {
	var refused limitsCounted
	sources := NewSourceLimiter(SourceLimits{QPS: NoSharedRate}, refused.count)
	sources.now = testingclock.NewFakeClock(time.Now()).Now
	sources.afterFunc = func(_ time.Duration, closeConn func()) { closeConn() } // no hold
	var served atomic.Int64
	addr, _ := serveLimited(t, sources, DefaultMaxConnections, Limits{}, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		served.Add(1)
		fmt.Fprintln(w, "ok")
	}))
	const callers, each = 4, 500
	var codes [600]atomic.Int64
	var connections atomic.Int64
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}}
			sent := 0
			for sent < each {
				c, err := d.Dial("tcp", addr)
				if err != nil {
					t.Error(err)
					return
				}
				connections.Add(1)
				c.SetDeadline(time.Now().Add(10 * time.Second))
				br := bufio.NewReader(c)
				for ; sent < each; sent++ {
					if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
						break
					}
					resp, err := http.ReadResponse(br, nil)
					if err != nil {
						codes[0].Add(1)
						sent++
						break
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					codes[resp.StatusCode].Add(1)
					if resp.Close {
						sent++
						break
					}
				}
				c.Close()
			}
		})
	}
	wg.Wait()
	t.Logf("%d requests from one address on %d connections: %d served, %d answered 429, %d connections closed unanswered; refused: %d requests, %d connections",
		callers*each, connections.Load(), codes[200].Load(), codes[429].Load(), codes[0].Load(),
		refused.get(LimitAddressRequests), refused.get(LimitAddress)+refused.get(LimitAddressConnections))
	if got := served.Load(); got != DefaultAddressRequestBurst {
		t.Errorf("the handler served %d of %d requests from one address, want its burst, %d", got, callers*each, DefaultAddressRequestBurst)
	}
	// A refused request closes its connection: at most one per connection
	// let through, and those within the address's burst of new connections.
	if got := codes[429].Load(); got > DefaultAddressBurst {
		t.Errorf("%d requests answered 429, want at most one on each connection let through (%d)", got, DefaultAddressBurst)
	}
	if got := refused.get(LimitAddressRequests); int64(got) != codes[429].Load() {
		t.Errorf("told of %d requests refused, want the %d answered 429", got, codes[429].Load())
	}
	if code := probe("127.0.0.10", addr, "/healthz", 5*time.Second); code != http.StatusOK {
		t.Errorf("a probe from another address after the flood: %d, want 200", code)
	}
}
