package secureserving

import (
	"context"
	"log"
	"net/http"
	"strings"
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
