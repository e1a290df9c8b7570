package metrics

import "github.com/prometheus/client_golang/prometheus"

func newPodWatchGauge(reg *prometheus.Registry) prometheus.Gauge {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "podjanitor_pod_watch_healthy",
		Help: "1 while the pod informer's list and watch requests succeed, 0 once they have failed for 2 minutes, none succeeding, until one succeeds; " +
			"while 0, /readyz fails and new pods and pod changes are not seen (no pod is removed but those already known).",
	})
	reg.MustRegister(g)
	return g
}

// SetPodWatchHealthy sets podjanitor_pod_watch_healthy.
func (m *Metrics) SetPodWatchHealthy(healthy bool) {
	if m != nil {
		setBool(m.podWatch, healthy)
	}
}
