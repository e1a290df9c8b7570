#!/usr/bin/env bash
# Builds the local cluster's upstream binaries from the pinned tools module
# (hack/tools) into _output/bin:
#
#   hack/build-tools.sh                the control plane and the real node
#   hack/build-tools.sh control-plane  etcd, kube-apiserver, kube-controller-manager, kwok
#   hack/build-tools.sh real-node      kubelet, kube-scheduler, kustomize (REAL_NODE=1 in
#                                      hack/local-cluster.sh; the e2e tests need them)
#   hack/build-tools.sh kind-node      kubeadm, kubectl, kube-proxy: with the ones above,
#                                      the kind node image's (hack/kind/build.sh); not in `all`
#
# The first build takes many minutes on 2 cores; later ones are cached.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin="$root/_output/bin"
mkdir -p "$bin"
cd "$root/hack/tools"

kube_version=v1.37.2
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $pkg.gitVersion=$kube_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=37"
  ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done

build() { # name package
  local name=$1 pkg=$2
  if [ -x "$bin/$name" ] && [ "$bin/$name" -nt go.sum ] && [ "$bin/$name" -nt "$0" ] &&
    { [ "${pkg#./}" = "$pkg" ] || [ "$bin/$name" -nt "$pkg/main.go" ]; }; then
    echo "  $name: up to date"
    return
  fi
  local start=$SECONDS
  echo "  $name: building $pkg (first build takes minutes) ..."
  CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$bin/$name" "$pkg"
  echo "  $name: built in $((SECONDS - start))s"
}

what=${1:-all}
case $what in all | control-plane | real-node | kind-node) ;; *)
  echo "usage: $0 [all|control-plane|real-node|kind-node]" >&2
  exit 2
  ;;
esac
echo "Building local cluster tools into $bin"
if [ "$what" = kind-node ]; then
  build kubeadm k8s.io/kubernetes/cmd/kubeadm
  build kubectl k8s.io/kubernetes/cmd/kubectl
  build kube-proxy k8s.io/kubernetes/cmd/kube-proxy
  exit 0
fi
if [ "$what" != real-node ]; then
  build etcd ./etcd
  build kwok sigs.k8s.io/kwok/cmd/kwok
  build kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver
  build kube-controller-manager k8s.io/kubernetes/cmd/kube-controller-manager
fi
if [ "$what" != control-plane ]; then
  build kubelet k8s.io/kubernetes/cmd/kubelet
  build kube-scheduler k8s.io/kubernetes/cmd/kube-scheduler
  build kustomize ./kustomize
fi
