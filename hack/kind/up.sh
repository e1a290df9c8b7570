#!/usr/bin/env bash
# kind clusters for `make kind-up`, `make kind-deploy`, `make bench-kind` and
# the kind tests (hack/kind/README.md).
#
#   hack/kind/up.sh up NAME       create the kind cluster NAME unless it exists,
#                                 and wait until its node reaches the API server
#                                 through the kubernetes Service (kube-proxy's
#                                 rules); its kubeconfig: _output/kind/NAME.kubeconfig
#   hack/kind/up.sh load NAME ARCHIVE...
#                                 kind load image-archive (an OCI archive of `make image-archive`)
#   hack/kind/up.sh deploy NAME IMAGE
#                                 apply artifacts/deploy with the image IMAGE (an overlay
#                                 in _output/kind/deploy that changes nothing else) and wait
#                                 for the rollout
#   hack/kind/up.sh deploy-chart NAME IMAGE
#                                 helm install charts/podjanitor (release podjanitor in the
#                                 namespace podjanitor-chart) with the image IMAGE, and wait
#   hack/kind/up.sh down NAME     delete it
#   hack/kind/up.sh stop          stop the project's dockerd (hack/kind/dockerd.sh down)
#
# Which node image (KIND_NODE_IMAGE):
#   offline     podjanitor.local/kind-node:v1.37.2, built from sources by
#               hack/kind/build.sh into the project's own dockerd; nothing is pulled
#   stock       kind's default image (kindest/node), pulled by kind through the
#               Docker of DOCKER_HOST or /var/run/docker.sock
#   auto        (default) stock when a Docker daemon of the user's own answers
#               (DOCKER_HOST or /var/run/docker.sock), offline otherwise: the
#               project's machines and CI have no Docker daemon and reach no
#               registry but Debian's and the Go module proxy. It does not probe
#               any registry.
#   other       any image name: used as it is
#
# A kind node writes host sysctls, its kubelet and its systemd (NODE_SYSCTLS
# of hack/host-state.sh: its /proc/sys is the host's): `up` records them in
# _output/kind/sysctl.saved before it creates a cluster, and they are written
# back when a failed `up` leaves no cluster of this checkout, at `down` (the
# file is removed when the last one is gone) and at `stop`.
#
# kubectl (deploy): KUBECTL, else _output/bin/kubectl (the offline build's, or
# hack/build-tools.sh's), else the one in PATH.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
# shellcheck source=../host-state.sh
. hack/host-state.sh
bin=${KIND_BIN_DIR:-$root/_output/bin}
KIND=${KIND:-$bin/kind}
OFFLINE_IMAGE=podjanitor.local/kind-node:v1.37.2
SYSCTLS_SAVED="$root/_output/kind/sysctl.saved"

say() { echo "[kind] $*" >&2; }
die() {
  say "$*"
  exit 1
}

# choose sets IMAGE (empty: kind's default) and OFFLINE, and DOCKER_HOST for
# the offline image.
choose() {
  local want=${KIND_NODE_IMAGE:-auto}
  if [ "$want" = auto ]; then
    want=offline
    local ours
    ours=$(hack/kind/dockerd.sh env | head -1)
    if [ "export DOCKER_HOST=${DOCKER_HOST:-}" = "$ours" ]; then
      : # the project's own dockerd
    elif [ -n "${DOCKER_HOST:-}" ] || [ -S /var/run/docker.sock ]; then
      docker version --format '{{.Server.Version}}' >/dev/null 2>&1 && want=stock
    fi
  fi
  OFFLINE=false
  case $want in
    offline)
      IMAGE=$OFFLINE_IMAGE OFFLINE=true
      eval "$(hack/kind/dockerd.sh env)"
      ;;
    stock) IMAGE= ;;
    *) IMAGE=$want ;;
  esac
  [ -x "$KIND" ] || hack/kind/build.sh tools
}

exists() { "$KIND" get clusters 2>/dev/null | grep -qx "$1"; }

# our_clusters: the kind clusters of this checkout (a kubeconfig of
# _output/kind) that exist.
our_clusters() {
  local c
  for c in $("$KIND" get clusters 2>/dev/null); do
    [ ! -f "$root/_output/kind/$c.kubeconfig" ] || echo "$c"
  done
}

# sysctls_back writes the saved sysctls back; the file goes with the last
# cluster of this checkout.
sysctls_back() {
  if [ -n "$(our_clusters)" ]; then
    [ ! -s "$SYSCTLS_SAVED" ] || sysctl -q -w $(cat "$SYSCTLS_SAVED") >/dev/null 2>&1
  else
    sysctls_restore "$SYSCTLS_SAVED"
  fi || say "WARNING: could not restore the sysctls of $SYSCTLS_SAVED"
}

# kubectl_path: KUBECTL, ours, or PATH's.
kubectl_path() {
  if [ -n "${KUBECTL:-}" ]; then
    echo "$KUBECTL"
  elif [ -x "$bin/kubectl" ]; then
    echo "$bin/kubectl"
  elif command -v kubectl >/dev/null 2>&1; then
    command -v kubectl
  else
    die "no kubectl: not in $bin (hack/build-tools.sh kind-node builds it) nor in PATH"
  fi
}

# service_network waits until the node reaches the API server through the
# kubernetes Service's ClusterIP, i.e. kube-proxy has written its rules: `kind
# create cluster --wait` waits for the node's Ready only, and on a busy
# machine kube-proxy comes later. A pod's first connection to a ClusterIP
# made before the rules waits out its dial timeout (client-go's: 30 s).
service_network() {
  local name=$1 start=$SECONDS ip= kubectl
  kubectl=$(kubectl_path)
  until [ -n "$ip" ] && docker exec "$name-control-plane" timeout 2 bash -c "exec 3<>/dev/tcp/$ip/443" 2>/dev/null; do
    [ $((SECONDS - start)) -lt 180 ] || die "kind cluster $name: its node does not reach the API server at ${ip:-the kubernetes Service}:443 (kube-proxy) after 180 s"
    [ -n "$ip" ] || ip=$(KUBECONFIG="$root/_output/kind/$name.kubeconfig" "$kubectl" get service kubernetes -n default -o jsonpath='{.spec.clusterIP}' 2>/dev/null) || true
    sleep 1
  done
  say "kind cluster $name: the node reaches the API server through its Service ($ip) after $((SECONDS - start))s"
}

# plan prints the path choose takes, for the docs and hack/kind/test-choose.sh.
plan() {
  choose
  echo "image=${IMAGE:-stock} offline=$OFFLINE docker_host=${DOCKER_HOST:-/var/run/docker.sock} kubectl=$(kubectl_path)"
}

up() {
  local name=$1 start=$SECONDS
  choose
  if $OFFLINE; then
    # Saved before the image's build too, in case its chroot writes any.
    exists "$name" || sysctls_save "$SYSCTLS_SAVED"
    KIND_NODE_IMAGE=$IMAGE hack/kind/build.sh || { sysctls_back; exit 1; }
  fi
  local kubeconfig="$root/_output/kind/$name.kubeconfig"
  mkdir -p "$root/_output/kind"
  if exists "$name" && [ "$(docker inspect -f '{{.State.Running}}' "$name-control-plane" 2>/dev/null)" != true ]; then
    say "kind cluster $name exists but its node does not run (a crash?): deleting it"
    "$KIND" delete cluster --name "$name" --kubeconfig "$kubeconfig" >/dev/null 2>&1 || true
  fi
  if exists "$name"; then
    say "kind cluster $name exists"
  else
    sysctls_save "$SYSCTLS_SAVED"
    # A failed or interrupted create: no cluster, the sysctls back.
    touch "$kubeconfig"
    UP_NAME=$name UP_KUBECONFIG=$kubeconfig
    trap 'st=$?; [ $st = 0 ] || { exists "$UP_NAME" || rm -f "$UP_KUBECONFIG"; sysctls_back; }; exit $st' EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM HUP
    local config="$root/_output/kind/$name.cluster.yaml"
    if $OFFLINE; then
      cp hack/kind/cluster.yaml "$config"
    else
      # kindnet and CoreDNS are in the stock image: keep them.
      grep -v '# offline-image' hack/kind/cluster.yaml >"$config"
    fi
    say "creating kind cluster $name (image ${IMAGE:-the stock kindest/node})"
    "$KIND" create cluster --name "$name" ${IMAGE:+--image "$IMAGE"} --config "$config" \
      --kubeconfig "$kubeconfig" --wait 5m ${KIND_RETAIN:+--retain} || die "kind create cluster failed"
    say "kind cluster $name created in $((SECONDS - start))s"
  fi
  "$KIND" get kubeconfig --name "$name" >"$kubeconfig"
  service_network "$name"
  trap - EXIT INT TERM HUP
  echo "$kubeconfig"
}

# deploy applies the shipped manifests, changing the image only.
deploy() {
  local name=$1 image=$2 dir="$root/_output/kind/deploy"
  mkdir -p "$dir"
  cat >"$dir/kustomization.yaml" <<EOF
# Written by hack/kind/up.sh: artifacts/deploy with the image loaded into the
# kind cluster by kind load image-archive (make kind-load); nothing else changes.
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - ../../../artifacts/deploy
images:
  - name: podjanitor
    newName: ${image%:*}
    newTag: ${image##*:}
EOF
  local kubectl=(env KUBECONFIG="$root/_output/kind/$name.kubeconfig" "$(kubectl_path)")
  "${kubectl[@]}" apply -k "$dir"
  "${kubectl[@]}" -n podjanitor rollout status deployment/podjanitor --timeout=180s
}

case ${1:-} in
  up)
    [ $# = 2 ] || die "usage: $0 up NAME"
    up "$2"
    ;;
  load)
    [ $# -ge 3 ] || die "usage: $0 load NAME ARCHIVE..."
    choose
    name=$2
    shift 2
    for a; do "$KIND" load image-archive "$a" --name "$name"; done
    ;;
  deploy)
    [ $# = 3 ] || die "usage: $0 deploy NAME IMAGE"
    deploy "$2" "$3"
    ;;
  deploy-chart)
    [ $# = 3 ] || die "usage: $0 deploy-chart NAME IMAGE"
    image=$3
    KUBECONFIG="$root/_output/kind/$2.kubeconfig" "${HELM:-$bin/helm}" upgrade --install podjanitor charts/podjanitor \
      --namespace podjanitor-chart --create-namespace \
      --set image.repository="${image%:*}" --set image.tag="${image##*:}" --wait --timeout 3m
    ;;
  down)
    [ $# = 2 ] || die "usage: $0 down NAME"
    choose
    # After a crash of our dockerd its stopped containers are still in its
    # data root: start it to delete them (`stop` stops it again).
    if $OFFLINE && ! hack/kind/dockerd.sh status && [ -n "$(ls -A "$root/_output/kind/docker/data/containers" 2>/dev/null)" ]; then
      hack/kind/dockerd.sh up
    fi
    if exists "$2"; then "$KIND" delete cluster --name "$2" --kubeconfig "$root/_output/kind/$2.kubeconfig"; fi
    rm -f "$root/_output/kind/$2.kubeconfig" "$root/_output/kind/$2.cluster.yaml"
    sysctls_back
    ;;
  stop) hack/kind/dockerd.sh down ;;
  plan) plan ;;
  env)
    choose
    [ -z "${DOCKER_HOST:-}" ] || echo "export DOCKER_HOST=$DOCKER_HOST"
    ;;
  *)
    echo "usage: $0 up|load|down NAME ...|stop|env" >&2
    exit 2
    ;;
esac
