#!/usr/bin/env bash
# Builds the local cluster's upstream binaries from pinned Go modules:
#
#   hack/build-tools.sh                the control plane and the real node
#   hack/build-tools.sh control-plane  etcd, kube-apiserver, kube-controller-manager, kwok
#   hack/build-tools.sh real-node      kubelet, kube-scheduler, kustomize (REAL_NODE=1 in
#                                      hack/local-cluster.sh; the e2e tests need them)
#   hack/build-tools.sh kind-node      kubeadm, kubectl, kube-proxy: with the ones above,
#                                      the kind node image's (hack/kind/build.sh); not in `all`
#   hack/build-tools.sh cluster        what the cluster with its real node runs: etcd, kwok,
#                                      kube-apiserver, kube-controller-manager, kube-scheduler,
#                                      kubelet (no kustomize; hack/test-versions.sh)
#   hack/build-tools.sh module         KUBE_VERSION's module alone, generated if missing
#
# etcd, kwok and kustomize come from the tools module (hack/tools) into
# _output/bin. The Kubernetes binaries are KUBE_VERSION's (a minor in
# hack/k8s/versions; default the newest): the tools module's minor's into
# _output/bin, another minor's from its own module (hack/k8s/MINOR) into
# _output/k8s/MINOR/bin. A minor listed without a module gets one generated
# here (k8s.io/kubernetes and its staging modules at the listed release).
# kind-node's are always the tools module's.
#
# The first build takes many minutes on 2 cores; later ones are cached.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin="$root/_output/bin"
mkdir -p "$bin"
# shellcheck source=k8s/versions.sh
. "$root/hack/k8s/versions.sh"
what=${1:-all}
case $what in all | control-plane | real-node | kind-node | cluster | module) ;; *)
  echo "usage: $0 [all|control-plane|real-node|kind-node|cluster|module]" >&2
  exit 2
  ;;
esac
# The kind node image's Kubernetes is the tools module's.
if [ "$what" = kind-node ]; then kube_resolve "$(kube_tools_minor)"; else kube_resolve "${KUBE_VERSION:-}"; fi
mkdir -p "$KUBE_BIN_DIR"

ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $pkg.gitVersion=$KUBE_RELEASE -X $pkg.gitMajor=1 -X $pkg.gitMinor=${KUBE_MINOR#1.}"
  ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done

# new_module writes $KUBE_MODULE: k8s.io/kubernetes at $KUBE_RELEASE, its
# staging modules replaced by their tagged releases (v0.MINOR.PATCH), as the
# tools module does.
new_module() {
  local dir=$KUBE_MODULE staging=v0.${KUBE_RELEASE#v1.} gomod
  echo "  generating the module $dir for $KUBE_RELEASE"
  mkdir -p "$dir"
  gomod=$(cd "$dir" && GOFLAGS=-mod=mod go mod download -json "k8s.io/kubernetes@$KUBE_RELEASE" |
    sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
  [ -s "$gomod" ] || { echo "no go.mod for k8s.io/kubernetes@$KUBE_RELEASE" >&2; exit 1; }
  {
    echo "module github.com/podjanitor/podjanitor/${dir#"$root"/}"
    echo
    echo "go $(sed -n 's/^go //p' "$root/hack/tools/go.mod")"
    echo
    echo "require k8s.io/kubernetes $KUBE_RELEASE"
    echo
    echo "replace ("
    sed -n 's#^[[:space:]]*\(k8s\.io/[a-z0-9-]*\) => \./staging/.*#\t\1 => \1 '"$staging"'#p' "$gomod"
    echo ")"
  } >"$dir/go.mod"
  cat >"$dir/tools.go" <<GO
//go:build tools

// Package tools pins the Kubernetes $KUBE_MINOR binaries of the local cluster
// (KUBE_VERSION=$KUBE_MINOR); see hack/build-tools.sh and hack/k8s/versions.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
GO
  (cd "$dir" && go mod tidy)
}

build() { # module-dir out-dir name package
  local dir=$1 out=$2 name=$3 pkg=$4
  if [ -x "$out/$name" ] && [ "$out/$name" -nt "$dir/go.sum" ] && [ "$out/$name" -nt "$0" ] &&
    { [ "${pkg#./}" = "$pkg" ] || [ "$out/$name" -nt "$dir/$pkg/main.go" ]; }; then
    echo "  $name: up to date"
    return
  fi
  local start=$SECONDS
  echo "  $name: building $pkg (first build takes minutes) ..."
  (cd "$dir" && CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$out/$name" "$pkg")
  echo "  $name: built in $((SECONDS - start))s"
}
tool() { build "$root/hack/tools" "$bin" "$@"; }
kube() { build "$KUBE_MODULE" "$KUBE_BIN_DIR" "$1" "k8s.io/kubernetes/cmd/$1"; }

[ -f "$KUBE_MODULE/go.mod" ] || new_module
[ "$what" != module ] || exit 0
echo "Building local cluster tools into $bin (Kubernetes $KUBE_RELEASE into $KUBE_BIN_DIR)"
if [ "$what" = kind-node ]; then
  kube kubeadm
  kube kubectl
  kube kube-proxy
  exit 0
fi
if [ "$what" = cluster ]; then
  tool etcd ./etcd
  tool kwok sigs.k8s.io/kwok/cmd/kwok
  for c in kube-apiserver kube-controller-manager kube-scheduler kubelet; do kube "$c"; done
  exit 0
fi
if [ "$what" != real-node ]; then
  tool etcd ./etcd
  tool kwok sigs.k8s.io/kwok/cmd/kwok
  kube kube-apiserver
  kube kube-controller-manager
fi
if [ "$what" != control-plane ]; then
  kube kubelet
  kube kube-scheduler
  tool kustomize ./kustomize
fi
