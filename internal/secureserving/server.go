package secureserving

import (
	"context"
	"log"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/klog/v2"
)

// Limits bound each connection of a server.
type Limits struct {
	// ReadHeaderTimeout bounds the TLS handshake and the reading of a
	// request's headers; ReadTimeout the whole request.
	ReadHeaderTimeout, ReadTimeout time.Duration
	// IdleTimeout closes a keep-alive connection that sends no request for
	// that long.
	IdleTimeout time.Duration
	// MaxHeaderBytes bounds a request's line and headers together; past it
	// the server answers 431 and closes the connection.
	MaxHeaderBytes int
}

// Defaults of Limits.
const (
	DefaultReadHeaderTimeout = 10 * time.Second
	DefaultReadTimeout       = 30 * time.Second
	DefaultIdleTimeout       = 60 * time.Second
	DefaultMaxHeaderBytes    = 32 << 10
)

// DefaultLimits are the Limits of the defaults.
var DefaultLimits = Limits{ReadHeaderTimeout: DefaultReadHeaderTimeout, ReadTimeout: DefaultReadTimeout,
	IdleTimeout: DefaultIdleTimeout, MaxHeaderBytes: DefaultMaxHeaderBytes}

// NewServer is an HTTP server of handler within limits (a zero field is
// its default), whose own errors go to ctx's klog logger: TLS handshake
// errors (every port scan makes some) at V(2), others as errors.
func NewServer(ctx context.Context, handler http.Handler, limits Limits) *http.Server {
	d := DefaultLimits
	pick := func(v, def time.Duration) time.Duration {
		if v > 0 {
			return v
		}
		return def
	}
	if limits.MaxHeaderBytes <= 0 {
		limits.MaxHeaderBytes = d.MaxHeaderBytes
	}
	return &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: pick(limits.ReadHeaderTimeout, d.ReadHeaderTimeout),
		ReadTimeout:       pick(limits.ReadTimeout, d.ReadTimeout),
		IdleTimeout:       pick(limits.IdleTimeout, d.IdleTimeout),
		MaxHeaderBytes:    limits.MaxHeaderBytes,
		ErrorLog:          log.New(serverLog{klog.FromContext(ctx)}, "", 0),
	}
}

// serverLog writes net/http's server errors to a klog logger.
type serverLog struct{ logger klog.Logger }

func (l serverLog) Write(p []byte) (int, error) {
	msg := cut(strings.TrimSpace(string(p)), 512)
	if strings.HasPrefix(msg, "http: TLS handshake error") {
		l.logger.V(2).Info("TLS handshake failed", "error", msg)
	} else {
		l.logger.Error(nil, "HTTP server error", "detail", msg)
	}
	return len(p), nil
}

// DefaultMaxConnections is the default bound of LimitConnections: an idle
// HTTPS connection costs ~35 KiB of RSS, so 1,000 of them ~35 MiB.
const DefaultMaxConnections = 1000

// LimitConnections bounds the connections ln has open at once to max: one
// accepted past it is closed at once, and refused told.
func LimitConnections(ln net.Listener, max int, refused func()) net.Listener {
	if refused == nil {
		refused = func() {}
	}
	return &limitListener{Listener: ln, max: int64(max), refused: refused}
}

type limitListener struct {
	net.Listener
	max     int64
	open    atomic.Int64
	refused func()
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.open.Add(1) > l.max {
			l.open.Add(-1)
			// Told before the close, which the caller may be waiting on.
			l.refused()
			c.Close()
			continue
		}
		return &countedConn{Conn: c, open: &l.open}, nil
	}
}

// countedConn gives its place back when closed.
type countedConn struct {
	net.Conn
	open *atomic.Int64
	once sync.Once
}

func (c *countedConn) Close() error {
	c.once.Do(func() { c.open.Add(-1) })
	return c.Conn.Close()
}
