package secureserving

import (
	"context"
	"crypto/sha256"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/klog/v2"
)

// Defaults of HandshakeLimits. A TLS handshake costs the server a signature
// (~1.3 ms of CPU with an RSA-2048 key): 25 a second are about 3 % of a core.
const (
	DefaultHandshakeAddressQPS   = 5
	DefaultHandshakeAddressBurst = 20
	DefaultHandshakeQPS          = 25
	DefaultHandshakeBurst        = 50
)

// Which limit closed a connection before its handshake: the values
// HandshakeLimiter's refused is given.
const (
	HandshakeLimitAddress = "address" // its source address's rate
	HandshakeLimitAll     = "all"     // the rate of all addresses not vouched for
)

// HandshakeLimits are the rates of new connections, each a TLS handshake,
// that a HandshakeLimiter lets through; a zero field is its default.
type HandshakeLimits struct {
	// AddressQPS and AddressBurst: those of one source address.
	AddressQPS   float64
	AddressBurst int
	// QPS and Burst: those of all the addresses not vouched for (no request
	// allowed from them within RecentTTL), together.
	QPS   float64
	Burst int
}

// The bounds of a HandshakeLimiter's tables: source addresses with a rate
// of their own, and addresses vouched for.
const (
	maxAddresses = 4096
	maxVouched   = 1024
)

// handshakeLogEvery is how often connections closed before their handshake
// are logged at most.
const handshakeLogEvery = 10 * time.Second

// A connection past the limits is held, unread, for refusedHold before it is
// closed, so that a caller that dials again at once waits for it instead of
// having podjanitor accept and close thousands a second; at most maxHeld of
// a listener's are held, more are closed at once.
const (
	refusedHold = time.Second
	maxHeld     = 512
)

// HandshakeLimiter bounds the TLS handshakes that callers who have not shown
// a token can make, counting each connection before the TLS work (the
// listener's Accept): each source address has a rate of its own, and the
// addresses not vouched for share one more; a connection past either is
// closed, after refusedHold. An address is vouched for once a request from
// it was allowed (Vouch, from Options.Allowed), for RecentTTL: a scraper's
// new connections do not compete with a flood from other addresses.
type HandshakeLimiter struct {
	addressRate, addressBurst float64
	allRate, allBurst         float64
	refused                   func(limit string)
	now                       func() time.Time
	afterFunc                 func(time.Duration, func()) // runs a refused connection's close
	maxHeld                   int64
	vouched                   *ttlCache[struct{}]

	mu             sync.Mutex
	addresses      map[netip.Addr]*bucket
	all            bucket
	logged         time.Time
	closedSinceLog int
}

// NewHandshakeLimiter is a HandshakeLimiter of limits; refused (may be nil)
// is told the limit (a HandshakeLimit*) of each connection it closes.
func NewHandshakeLimiter(limits HandshakeLimits, refused func(limit string)) *HandshakeLimiter {
	if limits.AddressQPS <= 0 {
		limits.AddressQPS = DefaultHandshakeAddressQPS
	}
	if limits.AddressBurst <= 0 {
		limits.AddressBurst = DefaultHandshakeAddressBurst
	}
	if limits.QPS <= 0 {
		limits.QPS = DefaultHandshakeQPS
	}
	if limits.Burst <= 0 {
		limits.Burst = DefaultHandshakeBurst
	}
	if refused == nil {
		refused = func(string) {}
	}
	return &HandshakeLimiter{
		addressRate: limits.AddressQPS, addressBurst: float64(limits.AddressBurst),
		allRate: limits.QPS, allBurst: float64(limits.Burst),
		refused: refused, now: time.Now,
		afterFunc: func(d time.Duration, f func()) { time.AfterFunc(d, f) }, maxHeld: maxHeld,
		vouched:   newTTLCache(maxVouched, maxVouched*entryOverhead, func(struct{}) int { return 0 }, nil),
		addresses: map[netip.Addr]*bucket{},
		all:       bucket{tokens: float64(limits.Burst)},
	}
}

// Vouch vouches for the host of remoteAddr (host:port) for RecentTTL.
func (h *HandshakeLimiter) Vouch(remoteAddr string) {
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
// h: ln). Closed connections are logged through ctx's logger, at most once
// per 10 s.
func (h *HandshakeLimiter) Listener(ctx context.Context, ln net.Listener) net.Listener {
	if h == nil {
		return ln
	}
	return &handshakeListener{Listener: ln, limiter: h, logger: klog.FromContext(ctx)}
}

type handshakeListener struct {
	net.Listener
	limiter *HandshakeLimiter
	logger  klog.Logger
	held    atomic.Int64
}

func (l *handshakeListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		addr, _ := hostOf(c.RemoteAddr().String())
		limit := l.limiter.admit(addr)
		if limit == "" {
			return c, nil
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
			l.logger.Info("Closing connections before their TLS handshake, past the handshake rate",
				"address", addr.String(), "limit", limit, "closedSinceLastLog", n)
		}
	}
}

// admit takes a handshake of addr from its rate and, unless addr is vouched
// for, from the rate of all; it returns the limit it is past, "" if none.
func (h *HandshakeLimiter) admit(addr netip.Addr) string {
	now := h.now()
	_, _, vouched := h.vouched.get(addressKey(addr), now)
	h.mu.Lock()
	defer h.mu.Unlock()
	b, ok := h.addresses[addr]
	if !ok {
		h.makeRoom(now)
		b = &bucket{tokens: h.addressBurst, last: now}
		h.addresses[addr] = b
	}
	if !b.take(now, h.addressRate, h.addressBurst) {
		return HandshakeLimitAddress
	}
	if !vouched && !h.all.take(now, h.allRate, h.allBurst) {
		b.tokens++ // not made: its address's rate is not spent on it
		return HandshakeLimitAll
	}
	return ""
}

// makeRoom drops, when the table of addresses is full, those whose rate is
// back to its burst (nothing to remember); if that leaves it over three
// quarters full, all of them (the shared rate still bounds those not
// vouched for). Either way the next sweep is a quarter of the table away.
func (h *HandshakeLimiter) makeRoom(now time.Time) {
	if len(h.addresses) < maxAddresses {
		return
	}
	for a, b := range h.addresses {
		if b.full(now, h.addressRate, h.addressBurst) {
			delete(h.addresses, a)
		}
	}
	if len(h.addresses) > maxAddresses*3/4 {
		clear(h.addresses)
	}
}

// logDue counts a closed connection and says whether to log now, with the
// number closed since the last line.
func (h *HandshakeLimiter) logDue() (int, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closedSinceLog++
	now := h.now()
	if !h.logged.IsZero() && now.Sub(h.logged) < handshakeLogEvery {
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
