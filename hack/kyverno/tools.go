//go:build tools

// Package kyverno pins Kyverno (github.com/kyverno/kyverno), whose cleanup
// controller's TTL manager the bench's `kyverno` scenario runs beside
// podjanitor. It is a module of its own because Kyverno is built on other
// Kubernetes module versions than podjanitor and the local cluster's tools, and
// its cleanup controller pulls in ~2,900 packages; hack/build-kyverno.sh builds
// it into _output/bin/kyverno-cleanup-controller only when the scenario is
// asked for.
package kyverno

import (
	_ "github.com/kyverno/kyverno/cmd/cleanup-controller"
)
