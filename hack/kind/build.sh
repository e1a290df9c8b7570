#!/usr/bin/env bash
# Builds kind and a kind node image for Kubernetes v1.37.2 from sources only
# (Go modules and Debian's packages; nothing is pulled from a registry), into
# the Docker daemon of hack/kind/dockerd.sh. See hack/kind/README.md.
#
#   hack/kind/build.sh         kind and crictl into _output/bin, then the image
#   hack/kind/build.sh tools   kind and crictl only
#
# Steps, each cached on its inputs (a second build takes seconds):
#   tools    kind and crictl from hack/kind/tools; kubeadm, kubectl, kube-proxy,
#            the control plane and the kubelet from hack/tools (hack/build-tools.sh)
#   rootfs   a Debian 12 root filesystem (mmdebstrap) with systemd, iptables and
#            Debian's containerd, runc and CNI plugins (as the local cluster's
#            real node has), imported as $KIND_BASE_IMAGE:<key>
#   images   the images kubeadm runs, under the names `kubeadm config images
#            list` gives: kube-apiserver, kube-controller-manager, kube-scheduler,
#            kube-proxy, etcd (the local cluster's binaries) and pause
#            (hack/node/pause.c); no CoreDNS (hack/kind/cluster.yaml skips it)
#   node     $KIND_NODE_IMAGE: the root filesystem, kind's entrypoint and
#            systemd units (from the kind module's images/base), the Kubernetes
#            binaries and the images as archives that the node imports at boot
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
# The node's Kubernetes release: the one hack/tools pins (not KUBE_VERSION, the
# local cluster's minor, which make exports and the tools build below reads).
NODE_KUBE_VERSION=v1.37.2
KIND_VERSION=v0.33.0
KIND_NODE_IMAGE=${KIND_NODE_IMAGE:-podjanitor.local/kind-node:$NODE_KUBE_VERSION}
KIND_BASE_IMAGE=${KIND_BASE_IMAGE:-podjanitor.local/kind-rootfs}
bin="$root/_output/bin"
work="$root/_output/kind"
cache="$work/cache"
mkdir -p "$bin" "$cache"
# shellcheck source=../host-state.sh
. hack/host-state.sh

say() { echo "[kind-build] $*" >&2; }
die() {
  say "$*"
  exit 1
}
# step NAME COMMAND...: runs and times one step.
step() {
  local name=$1 start=$SECONDS
  shift
  "$@"
  say "$name: $((SECONDS - start))s"
}
# quiet COMMAND...: runs it with the legacy builder (Debian's dockerd has no
# BuildKit that the newer CLI would use), its output shown only on failure.
quiet() {
  local out
  out=$(DOCKER_BUILDKIT=0 "$@" 2>&1) || {
    printf '%s\n' "$out" >&2
    return 1
  }
}

tools() {
  local t=hack/kind/tools
  if [ -x "$bin/kind" ] && [ "$bin/kind" -nt $t/go.sum ] && [ -x "$bin/crictl" ] && [ "$bin/crictl" -nt $t/go.sum ]; then
    say "kind, crictl: up to date"
  else
    say "kind, crictl: building from $t"
    (cd $t && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X sigs.k8s.io/kind/pkg/internal/version.gitCommit=$KIND_VERSION" -o "$bin/kind" sigs.k8s.io/kind &&
      CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=v1.37.0" -o "$bin/crictl" sigs.k8s.io/cri-tools/cmd/crictl)
  fi
}

k8s_binaries() {
  hack/build-tools.sh >&2
  hack/build-tools.sh kind-node >&2
}

# The root filesystem: the Debian packages kind's base image installs that a
# one-node cluster uses, with Debian's containerd, runc and CNI plugins in
# place of kind's builds of them.
ROOTFS_PACKAGES=systemd,dbus,iptables,nftables,conntrack,iproute2,ethtool,util-linux,mount,kmod,libseccomp2,pigz,e2fsprogs,bash,ca-certificates,procps,socat,containerd,runc,containernetworking-plugins
# Where the packages come from: given to mmdebstrap on its command line (it
# reads no sources from standard input nor from the host). A snapshot mirror
# (KIND_DEBIAN_MIRROR=http://snapshot.debian.org/archive/debian/20261201T000000Z)
# pins the versions; deb.debian.org gives the suite's current ones.
KIND_DEBIAN_MIRROR=${KIND_DEBIAN_MIRROR:-http://deb.debian.org/debian}
KIND_DEBIAN_SECURITY=${KIND_DEBIAN_SECURITY:-http://deb.debian.org/debian-security}
ROOTFS_SOURCES=("deb $KIND_DEBIAN_MIRROR bookworm main" "deb $KIND_DEBIAN_MIRROR bookworm-updates main" "deb $KIND_DEBIAN_SECURITY bookworm-security main")
rootfs() {
  command -v mmdebstrap >/dev/null 2>&1 || {
    [ "$(id -u)" = 0 ] || die "mmdebstrap not found: apt-get install mmdebstrap"
    say "installing mmdebstrap (no service is started)"
    apt_install mmdebstrap || die "apt-get install mmdebstrap failed"
  }
  # The key: what mmdebstrap is given (variant, packages, suite, sources) and
  # its version.
  ROOTFS_KEY=$( (echo "essential $ROOTFS_PACKAGES bookworm"; printf '%s\n' "${ROOTFS_SOURCES[@]}"; mmdebstrap --version) | sha256sum | cut -c1-16)
  local tar="$cache/rootfs-$ROOTFS_KEY.tar"
  if [ ! -f "$tar" ]; then
    say "rootfs: mmdebstrap bookworm (Debian packages; first build takes minutes)"
    rm -f "$cache"/rootfs-*.tar
    mmdebstrap --quiet --variant=essential --format=tar --include="$ROOTFS_PACKAGES" \
      bookworm "$tar.tmp.tar" "${ROOTFS_SOURCES[@]}" </dev/null || die "mmdebstrap failed"
    mv "$tar.tmp.tar" "$tar"
  fi
  if ! docker image inspect "$KIND_BASE_IMAGE:$ROOTFS_KEY" >/dev/null 2>&1; then
    say "rootfs: docker import as $KIND_BASE_IMAGE:$ROOTFS_KEY"
    docker import "$tar" "$KIND_BASE_IMAGE:$ROOTFS_KEY" >/dev/null
  fi
}

# image NAME FROM ENTRYPOINT FILE...: a one-layer image of static binaries in
# /usr/local/bin (the PATH containerd gives a container) on FROM, saved for the
# node. Kubernetes gives the control plane's commands; ENTRYPOINT may be empty.
image() {
  local name=$1 from=$2 entrypoint=$3
  shift 3
  local base=${name##*/}
  base=${base%%:*}
  local out="$work/node-ctx/stage/kind/images/$base.tar" key
  key=$( (echo "$name $from $entrypoint"; sha256sum "$@") | sha256sum | cut -c1-16)
  if [ -f "$out" ] && [ "$(cat "$out.key" 2>/dev/null)" = "$key" ]; then
    return
  fi
  local ctx
  ctx=$(mktemp -d "$work/ctx.XXXXXX")
  cp "$@" "$ctx/"
  {
    echo "FROM $from"
    local f
    for f; do echo "COPY $(basename "$f") /usr/local/bin/"; done
    [ -z "$entrypoint" ] || echo "ENTRYPOINT [\"$entrypoint\"]"
  } >"$ctx/Dockerfile"
  say "images: $name"
  quiet docker build -q -t "$name" "$ctx" || die "docker build of $name failed"
  rm -rf "$ctx"
  mkdir -p "$(dirname "$out")"
  docker save -o "$out" "$name"
  echo "$key" >"$out.key"
}

images() {
  local b="$bin" reg=registry.k8s.io
  mkdir -p "$work/node-ctx/stage/kind/images" "$work/pause"
  if [ ! -x "$work/pause/pause" ] || [ hack/node/pause.c -nt "$work/pause/pause" ]; then
    gcc -static -Os -o "$work/pause/pause" hack/node/pause.c || die "building the pause program (gcc -static) failed"
  fi
  image $reg/kube-apiserver:$NODE_KUBE_VERSION scratch "" "$b/kube-apiserver"
  image $reg/kube-controller-manager:$NODE_KUBE_VERSION scratch "" "$b/kube-controller-manager"
  image $reg/kube-scheduler:$NODE_KUBE_VERSION scratch "" "$b/kube-scheduler"
  image $reg/etcd:3.7.0-0 scratch "" "$b/etcd"
  # The pod sandbox: the pause program of the local cluster's real node.
  image $reg/pause:3.10.2 scratch /usr/local/bin/pause "$work/pause/pause"
  # kube-proxy runs iptables: it gets the node's root filesystem.
  image $reg/kube-proxy:$NODE_KUBE_VERSION "$KIND_BASE_IMAGE:$ROOTFS_KEY" "" "$b/kube-proxy"
  local want have
  want=$("$b/kubeadm" config images list --kubernetes-version "$NODE_KUBE_VERSION" 2>/dev/null | grep -v coredns | sort)
  have=$(for f in "$work"/node-ctx/stage/kind/images/*.tar; do tar -xOf "$f" manifest.json | grep -o '"RepoTags":\[[^]]*' | grep -o 'registry[^"]*'; done | sort)
  [ "$want" = "$have" ] || die "images: kubeadm wants $(echo $want), the node has $(echo $have)"
}

node() {
  local kindsrc stage="$work/node-ctx/stage"
  kindsrc=$(cd hack/kind/tools && go list -m -f '{{.Dir}}' sigs.k8s.io/kind)
  local files="$kindsrc/images/base/files"
  [ -f "$files/usr/local/bin/entrypoint" ] || die "kind's images/base not found in $kindsrc"
  mkdir -p "$stage"/{usr/bin,usr/local/bin,kind/bin,etc/systemd/system/kubelet.service.d,etc/systemd/system/multi-user.target.wants,etc/containerd,etc/cni/net.d,etc/default,etc/sysctl.d}
  # From kind's base image: the entrypoint, its scripts and the units.
  install -m 0755 "$files/usr/local/bin/entrypoint" "$stage/usr/local/bin/entrypoint"
  install -m 0755 "$files"/kind/bin/*.sh "$stage/kind/bin/"
  install -m 0644 "$files"/etc/systemd/system/{kubelet.service,kubelet.slice,undo-mount-hacks.service} "$stage/etc/systemd/system/"
  install -m 0644 "$files"/etc/systemd/system/kubelet.service.d/* "$stage/etc/systemd/system/kubelet.service.d/"
  install -m 0644 "$files/etc/default/kubelet" "$stage/etc/default/kubelet"
  install -m 0644 "$files"/etc/sysctl.d/* "$stage/etc/sysctl.d/"
  install -m 0644 "$files/etc/crictl.yaml" "$stage/etc/crictl.yaml"
  # Ours (hack/kind/node): containerd for Debian's binaries, the CNI bridge,
  # the preload of the images.
  install -m 0644 hack/kind/node/containerd.service hack/kind/node/kind-preload-images.service "$stage/etc/systemd/system/"
  install -m 0644 hack/kind/node/containerd.toml "$stage/etc/containerd/config.toml"
  install -m 0644 hack/kind/node/10-bridge.conflist "$stage/etc/cni/net.d/10-bridge.conflist"
  install -m 0755 hack/kind/node/preload-images.sh "$stage/kind/bin/preload-images.sh"
  local u
  for u in kubelet containerd undo-mount-hacks kind-preload-images; do
    ln -sfn "../$u.service" "$stage/etc/systemd/system/multi-user.target.wants/$u.service"
  done
  ln -sfn /dev/null "$stage/etc/systemd/system/systemd-binfmt.service"
  install -m 0755 "$bin"/{kubeadm,kubelet,kubectl} "$stage/usr/bin/"
  install -m 0755 "$bin/crictl" "$stage/usr/local/bin/crictl"
  echo "$NODE_KUBE_VERSION" >"$stage/kind/version"

  local key
  key=$( (echo "$KIND_BASE_IMAGE:$ROOTFS_KEY"; sha256sum "$0"; cd "$stage" && find . -type f -print0 | sort -z | xargs -0 sha256sum; find . -type l -printf '%p %l\n' | sort) | sha256sum | cut -c1-16)
  if [ "$(docker image inspect -f '{{index .Config.Labels "io.podjanitor.kind-node.key"}}' "$KIND_NODE_IMAGE" 2>/dev/null)" = "$key" ]; then
    say "node: $KIND_NODE_IMAGE up to date ($key)"
    return
  fi
  cat >"$work/node-ctx/Dockerfile" <<EOF
FROM $KIND_BASE_IMAGE:$ROOTFS_KEY
# As kind's base image: no units but those enabled below, no kernel log.
RUN rm -f /lib/systemd/system/sysinit.target.wants/systemd-tmpfiles-setup.service \\
      /lib/systemd/system/multi-user.target.wants/* /etc/systemd/system/*.wants/* \\
      /lib/systemd/system/local-fs.target.wants/* /lib/systemd/system/sockets.target.wants/*udev* \\
      /lib/systemd/system/sockets.target.wants/*initctl* /lib/systemd/system/basic.target.wants/* \\
    && echo ReadKMsg=no >>/etc/systemd/journald.conf \\
    && ln -sf /usr/lib/systemd/systemd /sbin/init \\
    && mkdir -p /etc/kubernetes/manifests \\
    && rm -rf /usr/share/doc /usr/share/man /var/cache/apt/* /var/lib/apt/lists/*
COPY stage/ /
ENV container=docker
STOPSIGNAL SIGRTMIN+3
LABEL io.podjanitor.kind-node.key=$key io.podjanitor.kind-node.kubernetes=$NODE_KUBE_VERSION
ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]
EOF
  say "node: docker build $KIND_NODE_IMAGE ($key)"
  quiet docker build -q -t "$KIND_NODE_IMAGE" "$work/node-ctx" ||
    die "docker build of $KIND_NODE_IMAGE failed"
}

what=${1:-all}
case $what in
  tools) step tools tools ;;
  all)
    eval "$(hack/kind/dockerd.sh env)"
    hack/kind/dockerd.sh up
    step "tools (kind, crictl)" tools
    step "tools (Kubernetes binaries)" k8s_binaries
    step rootfs rootfs
    step images images
    step node node
    ;;
  *)
    echo "usage: $0 [all|tools]" >&2
    exit 2
    ;;
esac
