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

// limitsCounted counts HandshakeLimiter's refusals by limit.
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

// TestHandshakeLimiterRates: each source address has a rate of its own;
// the addresses not vouched for share one more; a vouched address skips the
// shared one (not its own) for RecentTTL.
func TestHandshakeLimiterRates(t *testing.T) {
	h := NewHandshakeLimiter(HandshakeLimits{AddressQPS: 1, AddressBurst: 2, QPS: 1, Burst: 3}, nil)
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
	admit("10.0.0.1", HandshakeLimitAddress) // its burst of 2 taken
	admit("10.0.0.2", "")                    // the last of the shared burst of 3
	admit("10.0.0.3", HandshakeLimitAll)
	if b := h.addresses[ip("10.0.0.3")]; b.tokens != 2 {
		t.Errorf("a connection past the shared rate took its address's rate: %v left of 2", b.tokens)
	}
	h.Vouch("10.0.0.9:4321")
	admit("10.0.0.9", "") // vouched for: the shared rate is not its
	admit("10.0.0.9", "")
	admit("10.0.0.9", HandshakeLimitAddress) // its own still is
	clock.Step(time.Second)                  // one more of each
	admit("10.0.0.3", "")
	admit("10.0.0.4", HandshakeLimitAll)
	admit("10.0.0.9", "")
	h.Vouch("[::ffff:10.0.0.8]:80") // IPv4 in IPv6 is the IPv4 address
	admit("10.0.0.8", "")
	clock.Step(RecentTTL)
	admit("10.0.0.9", "") // the shared rate's burst is back
	for _, a := range []string{"10.0.0.9", "10.0.0.8"} {
		admit(a, "")
	}
	admit("10.0.0.8", HandshakeLimitAll) // no longer vouched for: the shared burst taken
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
	h := NewHandshakeLimiter(HandshakeLimits{AddressQPS: 0.001, AddressBurst: 5, QPS: 0.001, Burst: 7}, refused.count)
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
	if got := refused.get(HandshakeLimitAddress); got != 25 {
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
	h := NewHandshakeLimiter(HandshakeLimits{AddressQPS: 0.001, AddressBurst: 1, QPS: 1000, Burst: 1000}, nil)
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
