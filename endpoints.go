package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/klog/v2"

	"github.com/podjanitor/podjanitor/internal/metrics"
)

// endpointsConfig are the addresses of podjanitor's HTTP endpoints ("0"
// disables one) and whether the metrics address serves pprof.
type endpointsConfig struct {
	metricsAddr, healthAddr string
	profiling               bool
}

// serveEndpoints starts /metrics and /healthz+/readyz; they serve before the
// cache syncs. /healthz fails while watchdog (nil without leader election)
// does, /readyz until synced and while namespaceWatch returns an error. An
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
		if err := serve(ctx, "metrics", cfg.metricsAddr, mux, errs); err != nil {
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
		if err := serve(ctx, "health", cfg.healthAddr, mux, errs); err != nil {
			return err
		}
	}
	return nil
}

func serve(ctx context.Context, name, addr string, handler http.Handler, errs chan<- error) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("%s endpoint: %w", name, err)
	}
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second}
	klog.FromContext(ctx).Info("Serving "+name+" endpoint", "address", ln.Addr().String())
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			errs <- fmt.Errorf("%s endpoint: %w", name, err)
		}
	}()
	context.AfterFunc(ctx, func() { _ = srv.Close() })
	return nil
}
