package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/podjanitor/podjanitor/internal/secureserving"
)

// endpointMetrics are the series of the HTTPS metrics endpoint
// (--metrics-secure): the requests it refused and why, the answers its
// review caches dropped to make room, and when its serving certificate
// expires, and the connections it closed before their TLS handshake; and
// the connections either endpoint refused, and those and the requests it
// refused for their source address's bounds.
type endpointMetrics struct {
	refused           *prometheus.CounterVec
	evicted           *prometheus.CounterVec
	certExpiry        prometheus.Gauge
	handshakesRefused *prometheus.CounterVec
	connsRefused      *prometheus.CounterVec
	sourceRefused     *prometheus.CounterVec
}

func newEndpointMetrics(reg *prometheus.Registry) endpointMetrics {
	e := endpointMetrics{
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "podjanitor_metrics_requests_refused_total",
			Help: "Requests the HTTPS metrics endpoint refused, by reason: unknown_path (404, nothing reviewed), unauthenticated (401), " +
				"review_throttled (429: the reviews of callers not allowed lately are past their rate limit), forbidden (403), review_failed (the API server did not answer the review).",
		}, []string{"reason"}),
		evicted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "podjanitor_metrics_review_cache_evictions_total",
			Help: "Live answers the HTTPS metrics endpoint's review caches dropped to stay within their bounds (4,096 answers, 4 MiB each), by cache: tokens (TokenReviews) or access (SubjectAccessReviews).",
		}, []string{"cache"}),
		certExpiry: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "podjanitor_metrics_certificate_expiry_timestamp_seconds",
			Help: "When the certificate the HTTPS metrics endpoint serves expires, in Unix seconds; 0 without --metrics-secure.",
		}),
		handshakesRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "podjanitor_metrics_handshakes_refused_total",
			Help: "Connections the HTTPS metrics endpoint closed before their TLS handshake, past the handshake rate, by limit: address (the source address's own rate) or all (the rate shared by the addresses no request was allowed from lately).",
		}, []string{"limit"}),
		connsRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "podjanitor_http_connections_refused_total",
			Help: "Connections the metrics or health endpoint closed at once because it had --http-max-connections open, by endpoint (metrics, health).",
		}, []string{"endpoint"}),
	}
	e.sourceRefused = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "podjanitor_http_source_refused_total",
		Help: "Connections and requests the metrics or health endpoint refused for their source address's bounds, by endpoint and limit: " +
			"address (its rate of new connections), all (the rate of new connections shared by the addresses no request was allowed from lately, HTTPS metrics only), " +
			"address_connections (the connections it has open), address_requests (its rate of requests: answered 429, the connection closed).",
	}, []string{"endpoint", "limit"})
	reg.MustRegister(e.refused, e.evicted, e.certExpiry, e.handshakesRefused, e.connsRefused, e.sourceRefused)
	e.handshakesRefused.WithLabelValues(secureserving.LimitAddress)
	e.handshakesRefused.WithLabelValues(secureserving.LimitAll)
	for _, endpoint := range []string{EndpointMetrics, EndpointHealth} {
		for _, limit := range []string{secureserving.LimitAddress, secureserving.LimitAll, secureserving.LimitAddressConnections, secureserving.LimitAddressRequests} {
			if limit != secureserving.LimitAll || endpoint == EndpointMetrics {
				e.sourceRefused.WithLabelValues(endpoint, limit)
			}
		}
	}
	e.connsRefused.WithLabelValues(EndpointMetrics)
	e.connsRefused.WithLabelValues(EndpointHealth)
	for _, r := range secureserving.RefusalReasons {
		e.refused.WithLabelValues(r)
	}
	e.evicted.WithLabelValues(secureserving.CacheTokens)
	e.evicted.WithLabelValues(secureserving.CacheAccess)
	return e
}

// The endpoints, as podjanitor_http_connections_refused_total labels them.
const (
	EndpointMetrics = "metrics"
	EndpointHealth  = "health"
)

// CountConnectionRefused counts a connection an endpoint (EndpointMetrics,
// EndpointHealth) closed at once for having its most open.
func (m *Metrics) CountConnectionRefused(endpoint string) {
	if m != nil {
		m.endpoint.connsRefused.WithLabelValues(endpoint).Inc()
	}
}

// CountSourceRefused counts a connection or request an endpoint
// (EndpointMetrics, EndpointHealth) refused for its source address's bounds
// (a secureserving.Limit* limit); the metrics endpoint's past a rate of new
// connections (LimitAddress, LimitAll) also in
// podjanitor_metrics_handshakes_refused_total.
func (m *Metrics) CountSourceRefused(endpoint, limit string) {
	if m == nil {
		return
	}
	m.endpoint.sourceRefused.WithLabelValues(endpoint, limit).Inc()
	if endpoint == EndpointMetrics && (limit == secureserving.LimitAddress || limit == secureserving.LimitAll) {
		m.endpoint.handshakesRefused.WithLabelValues(limit).Inc()
	}
}

// CountMetricsRefusal counts a request the metrics endpoint refused (a
// secureserving.Refused* reason).
func (m *Metrics) CountMetricsRefusal(reason string) {
	if m != nil {
		m.endpoint.refused.WithLabelValues(reason).Inc()
	}
}

// CountReviewCacheEviction counts a live answer dropped from a review cache
// (secureserving.CacheTokens or CacheAccess).
func (m *Metrics) CountReviewCacheEviction(cache string) {
	if m != nil {
		m.endpoint.evicted.WithLabelValues(cache).Inc()
	}
}

// SetMetricsCertificateExpiry records when the served certificate expires.
func (m *Metrics) SetMetricsCertificateExpiry(notAfter time.Time) {
	if m != nil {
		m.endpoint.certExpiry.Set(float64(notAfter.Unix()))
	}
}
