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
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/klog/v2"

	"github.com/podjanitor/podjanitor/internal/metrics"
	"github.com/podjanitor/podjanitor/internal/secureserving"
)

// endpointsConfig are the addresses of podjanitor's HTTP endpoints ("0"
// disables one), whether the metrics address serves pprof, and whether it
// serves HTTPS to authorized callers only, with the certificate of
// metricsCertDir (else self-signed).
type endpointsConfig struct {
	metricsAddr, healthAddr string
	profiling               bool
	metricsSecure           bool
	metricsCertDir          string
	// reviews is the API server that reviews the metrics callers' tokens and
	// access (with metricsSecure).
	reviews kubernetes.Interface
}

// reviewedBy is cfg with the API server of the reviews.
func (cfg endpointsConfig) reviewedBy(kube kubernetes.Interface) endpointsConfig {
	cfg.reviews = kube
	return cfg
}

// serveEndpoints starts /metrics and /healthz+/readyz; they serve before the
// cache syncs. /healthz fails while watchdog (nil without leader election)
// does, /readyz until synced and while namespaceWatch returns an error. With
// cfg.metricsSecure, /metrics (and pprof) are served over HTTPS to callers
// whose token reviews (a TokenReview and a SubjectAccessReview through
// cfg.reviews) allow it; the health endpoints stay plain HTTP, for the kubelet. An
// endpoint that stops serving sends its error to errs.
func serveEndpoints(ctx context.Context, cfg endpointsConfig, metrics *metrics.Metrics, watchdog *leaderelection.HealthzAdaptor,
	synced func() bool, namespaceWatch func() error, errs chan<- error) error {
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
		if cfg.metricsSecure {
			var err error
			if handler, err = secureserving.WithAuth(mux, cfg.reviews.AuthenticationV1(), cfg.reviews.AuthorizationV1()); err != nil {
				return fmt.Errorf("metrics endpoint: %w", err)
			}
			if tlsConfig, err = secureserving.TLSConfig(ctx, cfg.metricsCertDir, secureserving.Hosts()...); err != nil {
				return fmt.Errorf("metrics endpoint: %w", err)
			}
		}
		if err := serve(ctx, "metrics", cfg.metricsAddr, handler, tlsConfig, errs); err != nil {
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
			if err := namespaceWatch(); err != nil {
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
			fmt.Fprintln(w, "ok")
		})
		if err := serve(ctx, "health", cfg.healthAddr, mux, nil, errs); err != nil {
			return err
		}
	}
	return nil
}

// serve serves handler on addr, over TLS with a non-nil tlsConfig.
func serve(ctx context.Context, name, addr string, handler http.Handler, tlsConfig *tls.Config, errs chan<- error) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("%s endpoint: %w", name, err)
	}
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second}
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
