#!/usr/bin/env bash
# A Docker daemon of the project's own for kind (hack/kind/README.md): Debian's
# dockerd (package docker.io, installed here when missing), started like the
# local cluster's real node starts containerd: its own data root, exec root,
# pid file and socket under $KIND_DOCKER_DIR, stopped by its pid.
#
#   hack/kind/dockerd.sh up      start it unless it runs; prints nothing else
#   hack/kind/dockerd.sh down    stop it (and the containerd it started) by pid,
#                                remove its bridges; the data root is kept (the images)
#   hack/kind/dockerd.sh status  exit 0 when it answers
#   hack/kind/dockerd.sh env     the DOCKER_HOST (and DOCKER_API_VERSION) to export
#
# It must not touch the host's network setup that the local cluster's real
# node (hack/node/real-node.sh) relies on in the same `make test`: no iptables
# rules or chains (--iptables=false, --ip-masq=false), no change to the
# ip_forward sysctl (--ip-forward=false), its own default bridge and address
# pool on 172.29.0.0/16 (the real node's bridges are 10.200.x.0/24). With
# --iptables=false the published ports of kind's API server go through
# docker-proxy on 127.0.0.1; containers reach no network beyond this machine.
# The containers' runtime is runc through hack/kind/runc-wrapper, which drops
# the capabilities that root lacks on this machine from --privileged ones.
# Debian's dockerd is 20.10 (API 1.41); the Docker CLI in PATH may be newer and
# negotiates down, and kind drives that CLI.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
KIND_DOCKER_DIR=${KIND_DOCKER_DIR:-$root/_output/kind/docker}
DOCKER_SOCK="$KIND_DOCKER_DIR/docker.sock"
PIDFILE="$KIND_DOCKER_DIR/dockerd.pid"
LOG="$KIND_DOCKER_DIR/dockerd.log"
DOCKER_BRIDGE=${DOCKER_BRIDGE:-pjdocker0}
DOCKER_BIP=${DOCKER_BIP:-172.29.255.1/24}
DOCKER_POOL=${DOCKER_POOL:-172.29.0.0/17}

say() { echo "[dockerd] $*" >&2; }
die() {
  say "$*"
  exit 1
}

export DOCKER_HOST="unix://$DOCKER_SOCK"

running() {
  [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null
}

answers() { docker version --format '{{.Server.Version}}' >/dev/null 2>&1; }

install() {
  command -v dockerd >/dev/null 2>&1 && command -v docker >/dev/null 2>&1 && return
  [ "$(id -u)" = 0 ] || die "dockerd not found and not root: apt-get install docker.io"
  say "installing Debian's docker.io"
  local out
  out=$( (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker.io) 2>&1) ||
    die "apt-get install docker.io failed: $out"
}

up() {
  [ "$(id -u)" = 0 ] || die "dockerd needs root"
  install
  mkdir -p "$KIND_DOCKER_DIR"
  [ ${#DOCKER_SOCK} -lt 100 ] || die "KIND_DOCKER_DIR is too long for a unix socket path: $DOCKER_SOCK"
  if running; then
    answers && return
    die "dockerd (pid $(cat "$PIDFILE")) runs but does not answer on $DOCKER_SOCK; see $LOG"
  fi
  # The OCI runtime: runc, less the capabilities root lacks here
  # (hack/kind/runc-wrapper): a --privileged kind node fails to start otherwise.
  local wrapper="$root/_output/bin/runc-wrapper"
  if [ ! -x "$wrapper" ] || [ -n "$(find "$root/hack/kind/runc-wrapper" -newer "$wrapper" -name '*.go')" ]; then
    (cd "$root" && CGO_ENABLED=0 go build -o "$wrapper" ./hack/kind/runc-wrapper)
  fi
  # dockerd's own bridge: created here so that it is ours to remove at down.
  if ! ip link show "$DOCKER_BRIDGE" >/dev/null 2>&1; then
    ip link add name "$DOCKER_BRIDGE" type bridge
    ip addr add "$DOCKER_BIP" dev "$DOCKER_BRIDGE"
    ip link set "$DOCKER_BRIDGE" up
  fi
  say "starting dockerd (socket $DOCKER_SOCK, log $LOG)"
  # setsid: the daemon outlives the make or test that started it; down stops it.
  setsid dockerd \
    --host "$DOCKER_HOST" \
    --data-root "$KIND_DOCKER_DIR/data" \
    --exec-root "$KIND_DOCKER_DIR/exec" \
    --pidfile "$PIDFILE" \
    --bridge "$DOCKER_BRIDGE" \
    --default-address-pool "base=$DOCKER_POOL,size=24" \
    --iptables=false --ip6tables=false --ip-masq=false --ip-forward=false \
    --oom-score-adjust=0 \
    --add-runtime "pj-runc=$wrapper" --default-runtime pj-runc \
    --storage-driver overlay2 \
    --exec-opt native.cgroupdriver=cgroupfs \
    --log-level warn \
    </dev/null >>"$LOG" 2>&1 &
  local i
  for i in $(seq 1 120); do
    answers && return
    [ -f "$PIDFILE" ] && ! running && break
    sleep 0.5
  done
  tail -20 "$LOG" >&2 || true
  die "dockerd did not come up on $DOCKER_SOCK"
}

down() {
  if running; then
    local pid
    pid=$(cat "$PIDFILE")
    say "stopping dockerd (pid $pid)"
    kill "$pid"
    local i
    for i in $(seq 1 60); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.5
    done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
  fi
  rm -f "$PIDFILE"
  # The containerd dockerd started (its pid file is under the exec root).
  local cpid="$KIND_DOCKER_DIR/exec/containerd/containerd.pid"
  if [ -f "$cpid" ] && kill -0 "$(cat "$cpid")" 2>/dev/null; then
    kill "$(cat "$cpid")" || true
  fi
  rm -f "$cpid"
  # The bridges of its networks (kind's), those with an address of its pool,
  # and its own.
  local br
  for br in $(ip -o -4 addr show to "$DOCKER_POOL" 2>/dev/null | awk '{print $2}' | grep -E '^br-[0-9a-f]{12}$' || true); do
    ip link del "$br" 2>/dev/null || true
  done
  if ip link show "$DOCKER_BRIDGE" >/dev/null 2>&1; then ip link del "$DOCKER_BRIDGE"; fi
}

case ${1:-} in
  up) up ;;
  down) down ;;
  status) running && answers ;;
  env) echo "export DOCKER_HOST=$DOCKER_HOST" ;;
  *)
    echo "usage: $0 up|down|status|env" >&2
    exit 2
    ;;
esac
