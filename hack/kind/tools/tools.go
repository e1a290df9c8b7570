//go:build tools

// Package tools pins kind and crictl for hack/kind/build.sh (the kind node
// image and the kind path of the tests). The Kubernetes binaries come from
// hack/tools, the same module as the local cluster's.
package tools

import (
	_ "sigs.k8s.io/cri-tools/cmd/crictl"
	_ "sigs.k8s.io/kind"
)
