//go:build tools

// Package tools pins the Kubernetes 1.36 binaries of the local cluster
// (KUBE_VERSION=1.36); see hack/build-tools.sh and hack/k8s/versions.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
