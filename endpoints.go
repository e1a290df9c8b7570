package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/util/flowcontrol"
	"k8s.io/klog/v2"

	"github.com/podjanitor/podjanitor/internal/metrics"
	"github.com/podjanitor/podjanitor/internal/secureserving"
)

// endpointsConfig are the addresses of podjanitor's HTTP endpoints ("0"
// disables one), whether the metrics address serves pprof, and whether it
// serves HTTPS to authorized callers only, with the certificate of
// metricsCertDir (else self-signed), HTTP/2 or not, and the audiences of
// the callers' tokens; readTimeout and idleTimeout bound the connections of
// both endpoints.
type endpointsConfig struct {
	metricsAddr, healthAddr  string
	profiling                bool
	metricsSecure            bool
	metricsCertDir           string
	metricsHTTP2             bool
	tokenAudiences           string   // comma-separated, as given
	audiences                []string // tokenAudiences split (validate)
	readTimeout, idleTimeout time.Duration
	maxConnections           int // of each endpoint
	// reviews is the configuration of the API server that reviews the
	// metrics callers' tokens and access (with metricsSecure).
	reviews *rest.Config
}

// reviewedBy is cfg with the API server of the reviews.
func (cfg endpointsConfig) reviewedBy(config *rest.Config) endpointsConfig {
	cfg.reviews = config
	return cfg
}

// limits are the bounds of each connection to the endpoints.
func (cfg endpointsConfig) limits() secureserving.Limits {
	return secureserving.Limits{ReadHeaderTimeout: secureserving.DefaultReadHeaderTimeout, ReadTimeout: cfg.readTimeout,
		IdleTimeout: cfg.idleTimeout, MaxHeaderBytes: secureserving.DefaultMaxHeaderBytes}
}

// reviewClient is a clientset of config for the reviews, without the
// removals' rate limiter: secureserving limits the reviews of callers it
// does not know (refusing those past the limit at once, never queueing
// them), and a known scraper costs a review a minute.
func reviewClient(config *rest.Config) (kubernetes.Interface, error) {
	c := rest.CopyConfig(config)
	c.RateLimiter = flowcontrol.NewFakeAlwaysRateLimiter()
	return kubernetes.NewForConfig(c)
}

// serveEndpoints starts /metrics and /healthz+/readyz; the daemon calls it
// before its first request to the API server. /healthz fails while watchdog
// (nil without leader election) does, /readyz until synced and while ready
// returns an error (the namespace watch failing, a leader whose workers do
// not run).
// With cfg.metricsSecure, /metrics (and pprof) are served over HTTPS to
// callers whose reviews (a TokenReview and a SubjectAccessReview to
// cfg.reviews) allow it, other paths answered 404 before any review; the
// health endpoints stay plain HTTP, for the kubelet. Each endpoint bounds
// the connections and requests of each source address
// (secureserving.SourceLimiter). An endpoint that stops serving sends its error to errs.
func serveEndpoints(ctx context.Context, cfg endpointsConfig, metrics *metrics.Metrics, watchdog *leaderelection.HealthzAdaptor,
	synced func() bool, ready func() error, errs chan<- error) error {
	if cfg.metricsAddr != "0" {
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(metrics.Registry, promhttp.HandlerOpts{Registry: metrics.Registry}))
		if cfg.profiling {
			mux.HandleFunc("/debug/pprof/", pprof.Index)
			mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
			mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
			mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
			mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		}
		var handler http.Handler = mux
		var tlsConfig *tls.Config
		limits := secureserving.SourceLimits{QPS: secureserving.NoSharedRate} // plain HTTP: no handshake to pay for
		if cfg.metricsSecure {
			limits = secureserving.SourceLimits{}
		}
		sources := secureserving.NewSourceLimiter(limits, countRefused(metrics, "metrics"))
		if cfg.metricsSecure {
			reviews, err := reviewClient(cfg.reviews)
			if err != nil {
				return fmt.Errorf("metrics endpoint: %w", err)
			}
			handler, err = secureserving.WithAuth(mux, reviews.AuthenticationV1(), reviews.AuthorizationV1(), secureserving.Options{
				Audiences: cfg.audiences,
				Refused:   metrics.CountMetricsRefusal,
				Evicted:   metrics.CountReviewCacheEviction,
				Allowed:   sources.Vouch,
			})
			if err != nil {
				return fmt.Errorf("metrics endpoint: %w", err)
			}
			tlsConfig, err = secureserving.TLSConfig(ctx, secureserving.TLSOptions{CertDir: cfg.metricsCertDir, Hosts: secureserving.Hosts(),
				HTTP2: cfg.metricsHTTP2, Served: metrics.SetMetricsCertificateExpiry})
			if err != nil {
				return fmt.Errorf("metrics endpoint: %w", err)
			}
		}
		srv := secureserving.NewServer(ctx, sources.Requests(ctx, handler), cfg.limits())
		if err := serve(ctx, metrics, cfg.maxConnections, "metrics", cfg.metricsAddr, srv, tlsConfig, sources, errs); err != nil {
			return err
		}
	}
	if cfg.healthAddr != "0" {
		mux := http.NewServeMux()
		mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
			if watchdog != nil {
				if err := watchdog.Check(r); err != nil {
					http.Error(w, "leader election: "+err.Error(), http.StatusInternalServerError)
					return
				}
			}
			fmt.Fprintln(w, "ok")
		})
		mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
			if !synced() {
				http.Error(w, "pod and namespace caches not synced", http.StatusServiceUnavailable)
				return
			}
			if err := ready(); err != nil {
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
			fmt.Fprintln(w, "ok")
		})
		// The bounds of the metrics endpoint, without the shared rate of
		// new connections (no handshake to pay for): the kubelet's probes,
		// from the node's address, are never refused for other addresses'.
		sources := secureserving.NewSourceLimiter(secureserving.SourceLimits{QPS: secureserving.NoSharedRate}, countRefused(metrics, "health"))
		srv := secureserving.NewServer(ctx, sources.Requests(ctx, mux), cfg.limits())
		if err := serve(ctx, metrics, cfg.maxConnections, "health", cfg.healthAddr, srv, nil, sources, errs); err != nil {
			return err
		}
	}
	return nil
}

// serve serves srv on addr, over TLS with a non-nil tlsConfig, new
// connections within sources, at most maxConnections at once (0:
// secureserving.DefaultMaxConnections), name (metrics.EndpointMetrics or
// EndpointHealth) counting those past it.
func serve(ctx context.Context, meters *metrics.Metrics, maxConnections int, name, addr string, srv *http.Server, tlsConfig *tls.Config,
	sources *secureserving.SourceLimiter, errs chan<- error) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("%s endpoint: %w", name, err)
	}
	if maxConnections <= 0 {
		maxConnections = secureserving.DefaultMaxConnections
	}
	ln = secureserving.LimitConnections(sources.Listener(ctx, ln), maxConnections, func() { meters.CountConnectionRefused(name) })
	scheme := "http"
	if tlsConfig != nil {
		scheme = "https"
		ln = tls.NewListener(ln, tlsConfig)
	}
	klog.FromContext(ctx).Info("Serving "+name+" endpoint", "address", ln.Addr().String(), "scheme", scheme)
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			errs <- fmt.Errorf("%s endpoint: %w", name, err)
		}
	}()
	context.AfterFunc(ctx, func() { _ = srv.Close() })
	return nil
}

// countRefused counts in meters the connections and requests that an
// endpoint's SourceLimiter refuses.
func countRefused(meters *metrics.Metrics, endpoint string) func(limit string) {
	return func(limit string) { meters.CountSourceRefused(endpoint, limit) }
}
