#!/usr/bin/env bash
# A Docker daemon of the checkout's own for kind (hack/kind/README.md), started
# like the local cluster's real node starts containerd: everything it owns is
# under $KIND_DOCKER_DIR (default _output/kind/docker) or named after the
# checkout, and stopped by pids that are checked to be ours.
#
#   hack/kind/dockerd.sh up      start it (and its containerd) unless it runs
#   hack/kind/dockerd.sh down    stop it and whatever it left, even after a
#                                SIGKILL of any of it: processes, mounts, cgroups,
#                                links; the data root is kept (the images)
#   hack/kind/dockerd.sh status  exit 0 when it answers
#   hack/kind/dockerd.sh env     the DOCKER_HOST (and PATH for Debian's docker CLI) to export
#
# Ours alone:
# - the binaries: a dockerd in PATH (Docker's own packages, docker-ce) or else
#   Debian's docker.io unpacked into _output/kind/pkg without its maintainer
#   scripts: no package is installed or removed, no service started;
# - its config file ($KIND_DOCKER_DIR/daemon.json, not /etc/docker/daemon.json)
#   and its trust key; its own containerd (--containerd), config, root, state
#   and socket under $KIND_DOCKER_DIR, started and stopped here;
# - names from the checkout's path (KIND_ID, 6 hex digits of its hash): the
#   default bridge pjd$KIND_ID, kind's network's bridge pjk$KIND_ID, the
#   containers' cgroup parent podjanitor-kind-$KIND_ID; an address block (a /19
#   of 10.210.0.0-10.249.255.255) chosen free on this machine at the first
#   `up` and checked at every one: its first /20 is the address pool, the next
#   /24 the default bridge's, the one after it kind's network's;
# - pids signalled only after owned_pid_in (hack/host-state.sh) says the
#   process is that program with $KIND_DOCKER_DIR on its command line.
#
# It must not touch the host's network setup that the local cluster's real
# node relies on: no iptables rules or chains (--iptables=false,
# --ip-masq=false), no change to ip_forward (--ip-forward=false). Published
# ports of kind's API server go through docker-proxy on 127.0.0.1. The
# containers' runtime is runc through hack/kind/runc-wrapper, which drops the
# capabilities root lacks on this machine from --privileged ones.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=../host-state.sh
. "$root/hack/host-state.sh"
KIND_DOCKER_DIR=${KIND_DOCKER_DIR:-$root/_output/kind/docker}
KIND_PKG_DIR=${KIND_PKG_DIR:-$root/_output/kind/pkg}
DOCKER_SOCK="$KIND_DOCKER_DIR/docker.sock"
CONTAINERD_SOCK="$KIND_DOCKER_DIR/containerd.sock"
PIDFILE="$KIND_DOCKER_DIR/dockerd.pid"
CONTAINERD_PIDFILE="$KIND_DOCKER_DIR/containerd.pid"
# Every task our containerd's shims ran, "<namespace>/<id>", as runc-wrapper
# records it: what names their sockets in /run/containerd/s.
TASK_LOG="$KIND_DOCKER_DIR/tasks"
NETENV="$KIND_DOCKER_DIR/net.env"
LOG="$KIND_DOCKER_DIR/dockerd.log"
KIND_ID=$(printf '%s' "$root" | sha256sum | cut -c1-6)
DOCKER_BRIDGE=pjd$KIND_ID
KIND_BRIDGE=pjk$KIND_ID
CGROUP_PARENT=podjanitor-kind-$KIND_ID
# The links file and the cgroup name: what hack/host-state.sh's
# HOST_STATE_SCOPE reads as this checkout's.
SCOPE_DIR=$(dirname "$(dirname "$KIND_DOCKER_DIR")")
HOST_DIRS="/run/docker /run/docker/plugins /run/containerd /run/containerd/s /etc/docker"

say() { echo "[dockerd] $*" >&2; }
die() {
  say "$*"
  exit 1
}

export DOCKER_HOST="unix://$DOCKER_SOCK"

# binaries sets DOCKERD and DOCKER_PROXY, and PATH_ADD when the docker CLI
# is the unpacked one.
binaries() {
  PATH_ADD=
  if command -v dockerd >/dev/null 2>&1; then
    DOCKERD=$(command -v dockerd)
    DOCKER_PROXY=$(command -v docker-proxy 2>/dev/null || true)
  else
    DOCKERD="$KIND_PKG_DIR/usr/sbin/dockerd"
    DOCKER_PROXY="$KIND_PKG_DIR/usr/sbin/docker-proxy"
  fi
  command -v docker >/dev/null 2>&1 || PATH_ADD="$KIND_PKG_DIR/usr/bin"
}

# unpack: Debian's docker.io, downloaded and unpacked into $KIND_PKG_DIR
# (dpkg-deb -x: no maintainer scripts, dpkg's database untouched).
unpack() {
  binaries
  [ ! -x "$DOCKERD" ] || return 0
  command -v apt-get >/dev/null 2>&1 || die "no dockerd in PATH and no apt-get to fetch Debian's docker.io"
  say "unpacking Debian's docker.io into $KIND_PKG_DIR (not installed: no service, no package changed)"
  local tmp out
  tmp=$(mktemp -d)
  out=$(cd "$tmp" && apt-get download -q docker.io 2>&1) || {
    rm -rf "$tmp"
    die "apt-get download docker.io failed: $out"
  }
  mkdir -p "$KIND_PKG_DIR"
  dpkg-deb -x "$tmp"/docker.io_*.deb "$KIND_PKG_DIR" || die "dpkg-deb -x docker.io failed"
  rm -rf "$tmp"
  binaries
}

ip2int() {
  local IFS=. a b c d
  read -r a b c d <<<"$1"
  echo $(((a << 24) + (b << 16) + (c << 8) + d))
}
int2ip() { echo "$(($1 >> 24 & 255)).$(($1 >> 16 & 255)).$(($1 >> 8 & 255)).$(($1 & 255))"; }

# used_elsewhere BASE PREFIX: exit 0 when an address or route of this machine
# that is not on our bridges overlaps BASE/PREFIX.
used_elsewhere() {
  local lo hi
  lo=$(ip2int "$1")
  hi=$((lo + (1 << (32 - $2)) - 1))
  local net dev n p s e
  while read -r net dev; do
    [ "$dev" = "$DOCKER_BRIDGE" ] || [ "$dev" = "$KIND_BRIDGE" ] && continue
    n=${net%/*} p=${net#*/}
    [ "$p" != "$net" ] || p=32
    s=$(ip2int "$n")
    s=$((s & ~((1 << (32 - p)) - 1) & 0xffffffff))
    e=$((s + (1 << (32 - p)) - 1))
    [ "$e" -lt "$lo" ] || [ "$s" -gt "$hi" ] || return 0
  done < <(
    ip -o -4 addr show | awk '{print $4, $2}'
    ip -4 route show table all 2>/dev/null | awk '$1 ~ /^[0-9]/ {for (i = 1; i < NF; i++) if ($i == "dev") print $1, $(i + 1)}'
  )
  return 1
}

# network sets POOL, DOCKER_BIP and KIND_SUBNET: those of $NETENV, else a
# free /19 from a start that the checkout's hash picks.
network() {
  if [ -s "$NETENV" ]; then
    # shellcheck disable=SC1090
    . "$NETENV"
    if used_elsewhere "${POOL%/*}" 19; then
      say "the address block ${POOL%/*}/19 of $NETENV is in use on this machine now: choosing another"
      rm -f "$NETENV"
    fi
  fi
  if [ ! -s "$NETENV" ]; then
    local n=320 i start base
    start=$((16#$KIND_ID % n))
    for ((i = 0; i < n; i++)); do
      base="10.$((210 + (start + i) % n / 8)).$((((start + i) % 8) * 32)).0"
      used_elsewhere "$base" 19 || break
      base=
    done
    [ -n "$base" ] || die "no free /19 in 10.210.0.0-10.249.255.255 for dockerd's networks"
    local b
    b=$(ip2int "$base")
    POOL="$base/20" DOCKER_BIP="$(int2ip $((b + 16 * 256 + 1)))/24" KIND_SUBNET="$(int2ip $((b + 17 * 256)))/24"
    mkdir -p "$KIND_DOCKER_DIR"
    printf 'POOL=%s\nDOCKER_BIP=%s\nKIND_SUBNET=%s\n' "$POOL" "$DOCKER_BIP" "$KIND_SUBNET" >"$NETENV"
  fi
}

dockerd_pid() { owned_pid_in "$PIDFILE" dockerd "$KIND_DOCKER_DIR"; }
containerd_pid() { owned_pid_in "$CONTAINERD_PIDFILE" containerd "$KIND_DOCKER_DIR"; }
answers() { docker version --format '{{.Server.Version}}' >/dev/null 2>&1; }

start_containerd() {
  containerd_pid >/dev/null && return 0
  local bin
  # Debian's containerd and runc, as the real node's (no service started).
  command -v containerd >/dev/null 2>&1 && command -v runc >/dev/null 2>&1 || "$root/hack/install-node-packages.sh" >&2
  bin=$(command -v containerd) || die "containerd not found: hack/install-node-packages.sh installs Debian's"
  mkdir -p "$KIND_DOCKER_DIR/containerd"
  cat >"$KIND_DOCKER_DIR/containerd/config.toml" <<EOF
version = 2
root = "$KIND_DOCKER_DIR/containerd/root"
state = "$KIND_DOCKER_DIR/containerd/state"
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "$CONTAINERD_SOCK"
[ttrpc]
  address = "$CONTAINERD_SOCK.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "$KIND_DOCKER_DIR/containerd/opt"
EOF
  PODJANITOR_TASK_LOG="$TASK_LOG" setsid bash -c 'echo $$ >"$0"; exec "$@"' "$CONTAINERD_PIDFILE" "$bin" --config "$KIND_DOCKER_DIR/containerd/config.toml" \
    </dev/null >>"$KIND_DOCKER_DIR/containerd.log" 2>&1 &
  local i
  for i in $(seq 1 100); do
    [ -S "$CONTAINERD_SOCK" ] && containerd_pid >/dev/null && return 0
    sleep 0.2
  done
  tail -20 "$KIND_DOCKER_DIR/containerd.log" >&2 || true
  die "containerd did not come up on $CONTAINERD_SOCK"
}

up() {
  [ "$(id -u)" = 0 ] || die "dockerd needs root"
  mkdir -p "$KIND_DOCKER_DIR"
  [ ${#CONTAINERD_SOCK} -lt 100 ] || die "KIND_DOCKER_DIR is too long for a unix socket path: $CONTAINERD_SOCK"
  unpack
  [ -z "$PATH_ADD" ] || export PATH="$PATH_ADD:$PATH"
  printf '%s\n' "$DOCKER_BRIDGE" "$KIND_BRIDGE" >"$SCOPE_DIR/kind/links"
  printf '%s\n' "$CGROUP_PARENT" >"$SCOPE_DIR/kind/cgroup"
  if dockerd_pid >/dev/null; then
    answers && return
    die "dockerd (pid $(dockerd_pid)) runs but does not answer on $DOCKER_SOCK; see $LOG"
  fi
  # Whatever a killed daemon left (processes, mounts, links) goes first.
  cleanup
  local wrapper="$root/_output/bin/runc-wrapper"
  if [ ! -x "$wrapper" ] || [ -n "$(find "$root/hack/kind/runc-wrapper" -newer "$wrapper" -name '*.go')" ]; then
    (cd "$root" && CGO_ENABLED=0 go build -o "$wrapper" ./hack/kind/runc-wrapper)
  fi
  # docker-proxy by a path under our directory: its processes are ours by
  # their command line, even when dockerd is gone.
  mkdir -p "$KIND_DOCKER_DIR/bin"
  [ -z "$DOCKER_PROXY" ] || ln -sfn "$DOCKER_PROXY" "$KIND_DOCKER_DIR/bin/docker-proxy"
  # The address block, and dockerd's own bridge with its first address on it
  # (ours to remove at down), under a machine-wide lock: another checkout
  # choosing at the same time sees the block taken. The lock is on the
  # directory /run/lock (or /tmp): no file is left.
  local lockdir=/run/lock
  [ -d "$lockdir" ] || lockdir=/tmp
  exec 9<"$lockdir"
  flock 9
  network
  if ! ip -o -4 addr show dev "$DOCKER_BRIDGE" 2>/dev/null | grep -q " $DOCKER_BIP "; then
    ip link del "$DOCKER_BRIDGE" 2>/dev/null || true
    ip link add name "$DOCKER_BRIDGE" type bridge
    ip addr add "$DOCKER_BIP" dev "$DOCKER_BRIDGE"
  fi
  ip link set "$DOCKER_BRIDGE" up
  flock -u 9
  exec 9<&-
  # The host directories dockerd and containerd make for themselves (plugin
  # sockets, shim sockets): those missing now are removed at down when empty.
  local d
  if [ ! -f "$KIND_DOCKER_DIR/host-dirs" ]; then
    for d in $HOST_DIRS; do [ -e "$d" ] || echo "$d"; done >"$KIND_DOCKER_DIR/host-dirs"
  fi
  start_containerd
  # Its own config file; Debian's dockerd 20.10 also keeps its trust key in
  # /etc/docker unless told (deprecated-key-path, gone in Docker 23).
  case $("$DOCKERD" --version 2>/dev/null) in
    "Docker version 1"[0-9].* | "Docker version 2"[0-2].*)
      printf '{"deprecated-key-path": "%s"}\n' "$KIND_DOCKER_DIR/key.json" >"$KIND_DOCKER_DIR/daemon.json" ;;
    *) echo '{}' >"$KIND_DOCKER_DIR/daemon.json" ;;
  esac
  say "starting dockerd (socket $DOCKER_SOCK, log $LOG)"
  # setsid: the daemon outlives the make or test that started it; down stops it.
  setsid "$DOCKERD" \
    --config-file "$KIND_DOCKER_DIR/daemon.json" \
    --containerd "$CONTAINERD_SOCK" \
    --host "$DOCKER_HOST" \
    --data-root "$KIND_DOCKER_DIR/data" \
    --exec-root "$KIND_DOCKER_DIR/exec" \
    --pidfile "$PIDFILE" \
    --bridge "$DOCKER_BRIDGE" \
    --default-address-pool "base=$POOL,size=24" \
    --cgroup-parent "/$CGROUP_PARENT" \
    --iptables=false --ip6tables=false --ip-masq=false --ip-forward=false \
    ${DOCKER_PROXY:+--userland-proxy-path "$KIND_DOCKER_DIR/bin/docker-proxy"} \
    --oom-score-adjust=0 \
    --add-runtime "pj-runc=$wrapper" --default-runtime pj-runc \
    --storage-driver overlay2 \
    --exec-opt native.cgroupdriver=cgroupfs \
    --log-level warn \
    </dev/null >>"$LOG" 2>&1 &
  local i ok=false
  for i in $(seq 1 120); do
    answers && ok=true && break
    sleep 0.5
  done
  $ok || {
    tail -20 "$LOG" >&2 || true
    die "dockerd did not come up on $DOCKER_SOCK"
  }
  # kind's network, made before kind makes it: bridge name and subnet ours.
  local have
  have=$(docker network inspect kind -f '{{(index .IPAM.Config 0).Subnet}} {{index .Options "com.docker.network.bridge.name"}}' 2>/dev/null || true)
  if [ "$have" != "$KIND_SUBNET $KIND_BRIDGE" ]; then
    [ -z "$have" ] || docker network rm kind >/dev/null
    docker network create kind --driver bridge --subnet "$KIND_SUBNET" \
      -o com.docker.network.bridge.name="$KIND_BRIDGE" -o com.docker.network.bridge.enable_ip_masquerade=false >/dev/null ||
      die "creating the network kind ($KIND_SUBNET on $KIND_BRIDGE) failed"
  fi
}

# stop_owned NAME PIDFUNC: SIGTERM, then SIGKILL, the pid PIDFUNC prints,
# each only while it is still ours.
stop_owned() {
  local name=$1 f=$2 pid i
  pid=$($f) || return 0
  say "stopping $name (pid $pid)"
  kill -TERM "$pid" 2>/dev/null || true
  for i in $(seq 1 60); do
    $f >/dev/null || return 0
    sleep 0.5
  done
  pid=$($f) || return 0
  kill -KILL "$pid" 2>/dev/null || true
}

# leftover_pids: processes of ours that outlive their daemon: in the
# containers' cgroup parent, or our daemons' programs (dockerd, containerd,
# its shims, docker-proxy, runc) with $KIND_DOCKER_DIR/ on their command line,
# as after a SIGKILL of the daemon or the loss of its pid file.
leftover_pids() {
  local h f pid cl arg0
  while read -r h; do
    [ -d "$h/$CGROUP_PARENT" ] || continue
    find "$h/$CGROUP_PARENT" -name cgroup.procs -exec cat {} + 2>/dev/null
  done < <(cgroup_hierarchies)
  for f in /proc/[0-9]*/cmdline; do
    pid=${f#/proc/}
    pid=${pid%/cmdline}
    [ "$pid" != $$ ] || continue
    cl=$( { tr '\0' ' ' <"$f"; } 2>/dev/null) || continue
    case $cl in
      *"$KIND_DOCKER_DIR/"*) ;;
      *) continue ;;
    esac
    arg0=${cl%% *}
    case ${arg0##*/} in
      dockerd | containerd | containerd-shim* | docker-proxy | runc | runc-wrapper) printf '%s\n' "$pid" ;;
    esac
  done
}

cgroup_hierarchies() { awk '$3 == "cgroup" || $3 == "cgroup2" {print $2}' /proc/self/mounts; }

# cleanup removes what a dockerd of ours left behind when it is not running.
cleanup() {
  local pids pid i
  for i in 1 2 3 4 5 6 7 8 9 10; do
    pids=$(leftover_pids | sort -u)
    [ -n "$pids" ] || break
    [ "$i" = 1 ] && say "stopping what our dockerd left: pids $(echo $pids)"
    for pid in $pids; do kill -KILL "$pid" 2>/dev/null || true; done
    sleep 0.3
  done
  [ -z "$(leftover_pids)" ] || say "WARNING: processes of ours still run: $(echo $(leftover_pids))"
  local m
  for _ in 1 2 3; do
    while read -r m; do
      [ -n "$m" ] || continue
      umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
    done < <(awk -v d="$KIND_DOCKER_DIR/" 'index($5, d) == 1 {print $5}' /proc/self/mountinfo | sort -r)
  done
  local h
  while read -r h; do
    [ -d "$h/$CGROUP_PARENT" ] || continue
    find "$h/$CGROUP_PARENT" -depth -type d -exec rmdir {} \; 2>/dev/null || true
  done < <(cgroup_hierarchies)
  # The shims' sockets (remove_shim_sockets). A shim SIGKILLed while
  # containerd runs leaves its socket, and containerd removes the task's
  # bundle from its state: the tasks runc-wrapper recorded name them all.
  # Nothing of ours runs now, so none of them is in use.
  { cat "$TASK_LOG" 2>/dev/null || true; containerd_tasks "$KIND_DOCKER_DIR/containerd/state"; } |
    sort -u | remove_shim_sockets "$CONTAINERD_SOCK"
  rm -f "$TASK_LOG"
  rm -f "$PIDFILE" "$CONTAINERD_PIDFILE"
}

down() {
  local d
  stop_owned dockerd dockerd_pid
  stop_owned containerd containerd_pid
  cleanup
  local br
  for br in "$KIND_BRIDGE" "$DOCKER_BRIDGE"; do
    if ip link show "$br" >/dev/null 2>&1; then ip link del "$br" || say "WARNING: could not delete bridge $br"; fi
  done
  if [ -f "$KIND_DOCKER_DIR/host-dirs" ]; then
    tac "$KIND_DOCKER_DIR/host-dirs" | while read -r d; do rmdir "$d" 2>/dev/null || true; done
    rm -f "$KIND_DOCKER_DIR/host-dirs"
  fi
  # No kind node of ours runs now: the sysctls its kubelet wrote go back.
  sysctls_restore "$SCOPE_DIR/kind/sysctl.saved" || say "WARNING: could not restore the sysctls of $SCOPE_DIR/kind/sysctl.saved"
}

case ${1:-} in
  up) up ;;
  down) down ;;
  status) dockerd_pid >/dev/null && answers ;;
  env)
    echo "export DOCKER_HOST=$DOCKER_HOST"
    binaries
    [ -z "$PATH_ADD" ] || echo "export PATH=$PATH_ADD:\$PATH"
    ;;
  *)
    echo "usage: $0 up|down|status|env" >&2
    exit 2
    ;;
esac
