package secureserving

import (
	"context"
	"crypto/sha256"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/klog/v2"
)

// Defaults of SourceLimits. A TLS handshake costs the server a signature
// (~1.3 ms of CPU with an RSA-2048 key): 25 a second are about 3 % of a core.
// A source address has at most 16 connections open (a scraper keeps one, the
// kubelet's probes open one each and close it) and makes at most 20 requests
// a second (a scraper makes one every 15 s, the kubelet's probes one every
// few seconds).
const (
	DefaultAddressQPS          = 5
	DefaultAddressBurst        = 20
	DefaultHandshakeQPS        = 25
	DefaultHandshakeBurst      = 50
	DefaultAddressConnections  = 16
	DefaultAddressRequestQPS   = 20
	DefaultAddressRequestBurst = 100
)

// NoSharedRate, as SourceLimits.QPS, leaves the addresses without a shared
// rate: for a plain-HTTP endpoint, whose connections cost no handshake, so
// that one address's connections never wait on others'.
const NoSharedRate = -1

// Which limit refused a connection or a request: the values SourceLimiter's
// refused is given.
const (
	LimitAddress            = "address"             // its source address's rate of new connections
	LimitAll                = "all"                 // the rate of new connections of all addresses not vouched for
	LimitAddressConnections = "address_connections" // the connections its source address has open
	LimitAddressRequests    = "address_requests"    // its source address's rate of requests
)

// SourceLimits are the bounds of each source address's connections and
// requests that a SourceLimiter keeps; a zero field is its default.
type SourceLimits struct {
	// AddressQPS and AddressBurst: the new connections of one source address.
	AddressQPS   float64
	AddressBurst int
	// QPS and Burst: those of all the addresses not vouched for (no request
	// allowed from them within RecentTTL), together; a negative QPS
	// (NoSharedRate): none.
	QPS   float64
	Burst int
	// AddressConnections: the connections one source address has open at once.
	AddressConnections int
	// AddressRequestQPS and AddressRequestBurst: the requests of one source
	// address, on all its connections.
	AddressRequestQPS   float64
	AddressRequestBurst int
}

// The bounds of a SourceLimiter's tables: source addresses with bounds of
// their own (more while more have connections open), and addresses vouched
// for.
const (
	maxAddresses = 4096
	maxVouched   = 1024
)

// refusedLogEvery is how often refused connections and requests are logged
// at most.
const refusedLogEvery = 10 * time.Second

// A connection past the limits is held, unread, for refusedHold before it is
// closed, so that a caller that dials again at once waits for it instead of
// having podjanitor accept and close thousands a second; at most maxHeld of
// a listener's are held, more are closed at once.
const (
	refusedHold = time.Second
	maxHeld     = 512
)

// SourceLimiter bounds what each source address can make an endpoint do, so
// that one address, or a few, can neither hold all its connections nor take
// its CPU: as connections are accepted (the listener's Accept, before any
// TLS work), each address has a rate of new connections and a number of
// them open at once of its own, and the addresses not vouched for share one
// more rate (the TLS handshakes of callers who have not shown a token); a
// connection past any is closed, after refusedHold. Its requests, on all its
// connections, have a rate of their own (Requests): one past it is answered
// 429 and its connection closed, so that a keep-alive flood costs a new
// connection per refused request. An address is vouched for once a request
// from it was allowed (Vouch, from Options.Allowed), for RecentTTL: a
// scraper's new connections do not compete with a flood from other
// addresses.
type SourceLimiter struct {
	limits    SourceLimits
	refused   func(limit string)
	now       func() time.Time
	afterFunc func(time.Duration, func()) // runs a refused connection's close
	maxHeld   int64
	vouched   *ttlCache[struct{}]

	mu             sync.Mutex
	addresses      map[netip.Addr]*source
	all            bucket
	logged         time.Time
	closedSinceLog int
}

// source is what a SourceLimiter keeps of an address.
type source struct {
	connections, requests bucket
	open                  int
}

// NewSourceLimiter is a SourceLimiter of limits; refused (may be nil) is
// told the limit (a Limit*) of each connection and request it refuses.
func NewSourceLimiter(limits SourceLimits, refused func(limit string)) *SourceLimiter {
	orDefault := func(v *float64, def float64) {
		if *v <= 0 {
			*v = def
		}
	}
	orDefaultInt := func(v *int, def int) {
		if *v <= 0 {
			*v = def
		}
	}
	orDefault(&limits.AddressQPS, DefaultAddressQPS)
	orDefaultInt(&limits.AddressBurst, DefaultAddressBurst)
	if limits.QPS == 0 {
		limits.QPS = DefaultHandshakeQPS
	}
	orDefaultInt(&limits.Burst, DefaultHandshakeBurst)
	orDefaultInt(&limits.AddressConnections, DefaultAddressConnections)
	orDefault(&limits.AddressRequestQPS, DefaultAddressRequestQPS)
	orDefaultInt(&limits.AddressRequestBurst, DefaultAddressRequestBurst)
	if refused == nil {
		refused = func(string) {}
	}
	return &SourceLimiter{
		limits:  limits,
		refused: refused, now: time.Now,
		afterFunc: func(d time.Duration, f func()) { time.AfterFunc(d, f) }, maxHeld: maxHeld,
		vouched:   newTTLCache(maxVouched, maxVouched*entryOverhead, func(struct{}) int { return 0 }, nil),
		addresses: map[netip.Addr]*source{},
		all:       bucket{tokens: float64(limits.Burst)},
	}
}

// Vouch vouches for the host of remoteAddr (host:port) for RecentTTL.
func (h *SourceLimiter) Vouch(remoteAddr string) {
	addr, ok := hostOf(remoteAddr)
	if !ok {
		return
	}
	key, now := addressKey(addr), h.now()
	if _, expires, ok := h.vouched.get(key, now); !ok || expires.Sub(now) < RecentTTL/2 {
		h.vouched.put(key, struct{}{}, now.Add(RecentTTL), now)
	}
}

// Listener is ln whose connections past the limits are not returned but
// held and closed; wrap it in LimitConnections and the TLS listener (nil
// h: ln). Refused connections are logged through ctx's logger, at most once
// per 10 s.
func (h *SourceLimiter) Listener(ctx context.Context, ln net.Listener) net.Listener {
	if h == nil {
		return ln
	}
	return &sourceListener{Listener: ln, limiter: h, logger: klog.FromContext(ctx)}
}

type sourceListener struct {
	net.Listener
	limiter *SourceLimiter
	logger  klog.Logger
	held    atomic.Int64
}

func (l *sourceListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		addr, _ := hostOf(c.RemoteAddr().String())
		limit := l.limiter.admit(addr)
		if limit == "" {
			return &sourceConn{Conn: c, release: func() { l.limiter.release(addr) }}, nil
		}
		l.limiter.refused(limit)
		if l.held.Add(1) <= l.limiter.maxHeld {
			l.limiter.afterFunc(refusedHold, func() {
				c.Close()
				l.held.Add(-1)
			})
		} else {
			l.held.Add(-1)
			c.Close()
		}
		if n, ok := l.limiter.logDue(); ok {
			l.logger.Info("Closing connections and refusing requests past their source address's bounds",
				"address", addr.String(), "limit", limit, "refusedSinceLastLog", n)
		}
	}
}

// sourceConn gives its address's place back when closed.
type sourceConn struct {
	net.Conn
	release func()
	once    sync.Once
}

func (c *sourceConn) Close() error {
	c.once.Do(c.release)
	return c.Conn.Close()
}

// Requests is next with the requests of each source address within its
// rate (nil h: next): one past it is answered 429 and its connection
// closed. Refused requests are logged through ctx's logger with the
// refused connections.
func (h *SourceLimiter) Requests(ctx context.Context, next http.Handler) http.Handler {
	if h == nil {
		return next
	}
	logger := klog.FromContext(ctx)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		addr, _ := hostOf(r.RemoteAddr)
		if h.request(addr) {
			next.ServeHTTP(w, r)
			return
		}
		h.refused(LimitAddressRequests)
		w.Header().Set("Connection", "close")
		w.Header().Set("Retry-After", "1")
		http.Error(w, "too many requests from "+addr.String(), http.StatusTooManyRequests)
		if n, ok := h.logDue(); ok {
			logger.Info("Closing connections and refusing requests past their source address's bounds",
				"address", addr.String(), "limit", LimitAddressRequests, "refusedSinceLastLog", n)
		}
	})
}

// sourceOf is addr's source, made if new; h.mu is held.
func (h *SourceLimiter) sourceOf(addr netip.Addr, now time.Time) *source {
	s, ok := h.addresses[addr]
	if !ok {
		h.makeRoom(now)
		s = &source{connections: bucket{tokens: float64(h.limits.AddressBurst), last: now},
			requests: bucket{tokens: float64(h.limits.AddressRequestBurst), last: now}}
		h.addresses[addr] = s
	}
	return s
}

// admit counts a connection from addr open unless addr has its most open,
// taking it from addr's rate and, unless addr is vouched for, from the
// shared one; it returns the limit it is past, "" if none.
func (h *SourceLimiter) admit(addr netip.Addr) string {
	now := h.now()
	_, _, vouched := h.vouched.get(addressKey(addr), now)
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.sourceOf(addr, now)
	if s.open >= h.limits.AddressConnections {
		return LimitAddressConnections
	}
	if !s.connections.take(now, h.limits.AddressQPS, float64(h.limits.AddressBurst)) {
		return LimitAddress
	}
	if !vouched && h.limits.QPS > 0 && !h.all.take(now, h.limits.QPS, float64(h.limits.Burst)) {
		s.connections.tokens++ // not made: its address's rate is not spent on it
		return LimitAll
	}
	s.open++
	return ""
}

// release counts a connection from addr closed.
func (h *SourceLimiter) release(addr netip.Addr) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if s, ok := h.addresses[addr]; ok && s.open > 0 {
		s.open--
	}
}

// request takes a request of addr from its rate, and says whether there was one.
func (h *SourceLimiter) request(addr netip.Addr) bool {
	now := h.now()
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.sourceOf(addr, now).requests.take(now, h.limits.AddressRequestQPS, float64(h.limits.AddressRequestBurst))
}

// makeRoom drops, when the table of addresses is full, those with no
// connection open whose rates are back to their bursts (nothing to
// remember); if that leaves it over three quarters full, all those with no
// connection open (the shared rate still bounds those not vouched for).
// Either way the next sweep is a quarter of the table away, or the table
// holds only addresses with connections open (at most the listener's).
func (h *SourceLimiter) makeRoom(now time.Time) {
	if len(h.addresses) < maxAddresses {
		return
	}
	l := h.limits
	for a, s := range h.addresses {
		if s.open == 0 && s.connections.full(now, l.AddressQPS, float64(l.AddressBurst)) &&
			s.requests.full(now, l.AddressRequestQPS, float64(l.AddressRequestBurst)) {
			delete(h.addresses, a)
		}
	}
	if len(h.addresses) > maxAddresses*3/4 {
		for a, s := range h.addresses {
			if s.open == 0 {
				delete(h.addresses, a)
			}
		}
	}
}

// logDue counts a refusal and says whether to log now, with the number
// refused since the last line.
func (h *SourceLimiter) logDue() (int, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closedSinceLog++
	now := h.now()
	if !h.logged.IsZero() && now.Sub(h.logged) < refusedLogEvery {
		return 0, false
	}
	n := h.closedSinceLog
	h.logged, h.closedSinceLog = now, 0
	return n, true
}

// bucket is a token bucket: tokens, as of last.
type bucket struct {
	tokens float64
	last   time.Time
}

func (b *bucket) refill(now time.Time, rate, burst float64) {
	if now.After(b.last) {
		b.tokens = min(burst, b.tokens+now.Sub(b.last).Seconds()*rate)
		b.last = now
	}
}

func (b *bucket) take(now time.Time, rate, burst float64) bool {
	b.refill(now, rate, burst)
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

func (b *bucket) full(now time.Time, rate, burst float64) bool {
	b.refill(now, rate, burst)
	return b.tokens >= burst
}

// hostOf is the address of a host:port, IPv4 in IPv6 as IPv4.
func hostOf(hostport string) (netip.Addr, bool) {
	ap, err := netip.ParseAddrPort(hostport)
	if err != nil {
		return netip.Addr{}, false
	}
	return ap.Addr().Unmap().WithZone(""), true
}

func addressKey(addr netip.Addr) cacheKey {
	b, _ := addr.MarshalBinary()
	return sha256.Sum256(b)
}
