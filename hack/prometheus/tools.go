//go:build tools

// Package prometheus pins Prometheus (github.com/prometheus/prometheus), the
// server that the e2e tests run against the local cluster to scrape
// podjanitor, evaluate its alert rules and answer its dashboard's queries
// (test/e2e/prometheus_test.go). The same version as test/promql's parser. A
// module of its own so that Prometheus's dependencies stay out of the daemon's
// go.mod; hack/install-prometheus.sh builds it into _output/bin/prometheus.
package prometheus

import (
	_ "github.com/prometheus/prometheus/cmd/prometheus"
)
