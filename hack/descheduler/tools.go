//go:build tools

// Package descheduler pins the descheduler (sigs.k8s.io/descheduler), the peer
// that the bench's `peer` scenario runs beside podjanitor. It is a module of its
// own because the descheduler is built on other Kubernetes module versions than
// the local cluster's tools (hack/tools); hack/build-descheduler.sh builds it
// into _output/bin/descheduler.
package descheduler

import (
	_ "sigs.k8s.io/descheduler/cmd/descheduler"
)
