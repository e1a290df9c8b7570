#!/usr/bin/env bash
# `make test-kind-crash`: the kind path survives a crash and shares nothing
# between checkouts. Each part compares this checkout's host state
# (hack/host-state.sh, HOST_STATE_SCOPE=_output) before and after, and fails
# when anything of ours is left or changed.
#
#   hack/kind/test-crash.sh dockerd  the project's dockerd with a container
#                                    (a scratch image of hack/node/pause.c, a
#                                    published port) and a saved sysctl changed as
#                                    a kubelet would: SIGKILL dockerd, containerd,
#                                    the shim and docker-proxy, put a dummy
#                                    process's pid in both pid files, then
#                                    `dockerd.sh down`: the dummy lives, nothing
#                                    of ours is left, the sysctl is back (~1 min)
#   hack/kind/test-crash.sh daemons  this checkout's and a second one's dockerd
#                                    started at once: no name, link, address
#                                    block or kind network in common; `make clean`
#                                    in the second stops its dockerd first (~1 min)
#   hack/kind/test-crash.sh kill     `make kind-up` three times, each SIGKILLed
#                                    with everything of ours at a random point
#                                    (KIND_CRASH_MAX seconds, default 90), then
#                                    `make kind-down` (~5 min with the image cached)
#   hack/kind/test-crash.sh two      a second checkout (a copy of the tracked
#                                    files, the build output hard-linked) and this
#                                    one run `make kind-up` at once: two daemons,
#                                    two bridges, two pools, two kind networks,
#                                    both clusters answer (~3 min)
#   hack/kind/test-crash.sh          all four
#
# Needs root and the offline path's inputs (`make kind-image` builds them;
# cached after). The clusters are named pj-crash and pj-crash-2.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
# shellcheck source=../host-state.sh
. hack/host-state.sh
export HOST_STATE_SCOPE="$root/_output"
export KIND_NODE_IMAGE=offline
work="$root/_output/kind/crash-test"
mkdir -p "$work"
failed=0

say() { echo "[kind-crash] $*" >&2; }
fail() {
  say "FAIL: $*"
  failed=1
}

# ours: the pids of this checkout's kind path: in the containers' cgroup, or
# with _output/ of this checkout on their command line, or in SESSION.
ours() {
  local cg f pid cl
  cg=$(cat "$root/_output/kind/cgroup" 2>/dev/null || true)
  if [ -n "$cg" ]; then
    find /sys/fs/cgroup -path "*/$cg/*" -name cgroup.procs -exec cat {} + 2>/dev/null || true
  fi
  for f in /proc/[0-9]*; do
    pid=${f#/proc/}
    [ "$pid" != $$ ] && [ "$pid" != "$BASHPID" ] || continue
    cl=$( { tr '\0' ' ' <"$f/cmdline"; } 2>/dev/null) || continue
    case $cl in *"$root/_output/"* | *hack/kind/test-crash.sh*) ;; *) continue ;; esac
    case $cl in *hack/kind/test-crash.sh*) continue ;; esac
    echo "$pid"
  done
  [ -z "${SESSION:-}" ] || ps -o pid= -s "$SESSION" 2>/dev/null || true
}

kill_ours() {
  local pids i
  for i in 1 2 3 4 5; do
    pids=$(ours | sort -u | grep -vx "$$" || true)
    [ -n "$pids" ] || return 0
    kill -KILL $pids 2>/dev/null || true
    sleep 0.3
  done
}

snapshot() { hack/host-state.sh snapshot "$work/$1"; }
# stale_shim_sockets: the entries of /run/containerd/s (shared by every
# containerd on the host, so not in the scoped snapshot) that were not there
# at the start and that nothing listens on.
shim_sockets() { ls /run/containerd/s 2>/dev/null | sort || true; }
stale_shim_sockets() {
  local n listening
  listening=$(ss -xlH 2>/dev/null | grep -o '/run/containerd/s/[0-9a-f]*' || true)
  for n in $(comm -13 "$work/shim-sockets.before" <(shim_sockets)); do
    grep -qx "/run/containerd/s/$n" <<<"$listening" || echo "$n"
  done
}

compare() {
  local what=$1
  snapshot "$what.after"
  if ! hack/host-state.sh compare "$work/before" "$work/$what.after" >&2; then
    fail "$what: the host state differs from before"
  fi
  local stale
  stale=$(stale_shim_sockets)
  [ -z "$stale" ] || fail "$what: shim sockets left in /run/containerd/s: $(echo $stale)"
  local left
  left=$(ours | sort -u || true)
  [ -z "$left" ] || fail "$what: processes of ours left: $(ps -o pid=,args= -p "$(echo $left | tr ' ' ,)" 2>/dev/null | cut -c1-150)"
}

part_dockerd() {
  say "dockerd: a container, then SIGKILL of dockerd, containerd, the shim, docker-proxy"
  hack/kind/dockerd.sh up
  eval "$(hack/kind/dockerd.sh env)"
  mkdir -p "$work/img"
  gcc -static -Os -o "$work/img/pause" hack/node/pause.c
  (cd "$work/img" && tar c pause | docker import - podjanitor.local/crash-test:1 >/dev/null)
  docker rm -f pj-crash-c pj-crash-c2 >/dev/null 2>&1 || true
  docker run -d --name pj-crash-c -p 127.0.0.1::80 podjanitor.local/crash-test:1 /pause >/dev/null
  # A kubelet's write of a host sysctl, recorded first as up.sh does.
  sysctls_save "$root/_output/kind/sysctl.saved"
  local key=kernel.keys.root_maxbytes was
  was=$(sysctl -n $key)
  sysctl -q -w "$key=$((was + 1))"
  # The shim first, alone: containerd notices, removes the task's bundle
  # from its state, and the socket the shim made stays (the leak of a crash
  # mid-run: the task's own directory no longer names it).
  local shim task=_output/kind/docker/containerd/state/io.containerd.runtime.v2.task/moby
  shim=$(pgrep -f "containerd-shim.*$root/_output/" | head -1 || true)
  [ -n "$shim" ] || fail "dockerd: no shim of ours runs"
  [ -z "$shim" ] || kill -KILL "$shim"
  local i
  for i in $(seq 1 40); do
    [ -n "$(ls "$task" 2>/dev/null)" ] || break
    sleep 0.25
  done
  say "dockerd: the shim (pid $shim) SIGKILLed; tasks left in containerd's state: $(ls "$task" 2>/dev/null | wc -l)"
  docker run -d --name pj-crash-c2 podjanitor.local/crash-test:1 /pause >/dev/null
  local pids
  pids=$(ours | sort -u)
  say "dockerd: SIGKILL $(echo $pids)"
  kill -KILL $pids
  sleep 1
  # The pid files now name a process that is not ours.
  sleep 300 &
  local dummy=$!
  echo "$dummy" >"$root/_output/kind/docker/dockerd.pid"
  echo "$dummy" >"$root/_output/kind/docker/containerd.pid"
  hack/kind/dockerd.sh down
  kill -0 "$dummy" 2>/dev/null || fail "dockerd: down signalled the dummy process (pid $dummy) of the pid files"
  kill "$dummy" 2>/dev/null || true
  wait "$dummy" 2>/dev/null || true
  [ "$(sysctl -n $key)" = "$was" ] || fail "dockerd: $key is $(sysctl -n $key), want $was back"
  compare dockerd
}

part_kill() {
  local n max=${KIND_CRASH_MAX:-90}
  for n in 1 2 3; do
    local at=$((RANDOM % max + 1))
    say "kill $n/3: make kind-up, SIGKILL of everything of ours after ${at}s"
    setsid make --no-print-directory kind-up KIND_CLUSTER=pj-crash >"$work/kind-up.$n.log" 2>&1 &
    local mk=$!
    SESSION=$mk
    sleep "$at"
    kill_ours
    wait "$mk" 2>/dev/null || true
    SESSION=
    say "kill $n/3: $(tail -1 "$work/kind-up.$n.log")"
  done
  make --no-print-directory kind-down KIND_CLUSTER=pj-crash >"$work/kind-down.log" 2>&1 || {
    cat "$work/kind-down.log" >&2
    fail "kill: make kind-down failed"
  }
  compare kill
}

# second_checkout DIR: a copy of this checkout's files (tracked and new), its
# build output hard-linked; its own _output/kind otherwise.
second_checkout() {
  local other=$1
  rm -rf "$other"
  mkdir -p "$other/_output/kind"
  git ls-files -z -co --exclude-standard | xargs -0 cp --parents -a -t "$other" 2>/dev/null || true
  cp -al _output/bin "$other/_output/bin"
  [ ! -d _output/kind/pkg ] || cp -al _output/kind/pkg "$other/_output/kind/pkg"
}

# daemons: the two checkouts' dockerds started at once share no name, link,
# address block or kind network.
part_daemons() {
  local other="$work/checkout-d"
  say "daemons: this checkout's and a second one's dockerd started at once"
  second_checkout "$other"
  hack/kind/dockerd.sh up >"$work/daemons.1.log" 2>&1 &
  local a=$!
  (cd "$other" && hack/kind/dockerd.sh up) >"$work/daemons.2.log" 2>&1 &
  local b=$!
  wait $a || { cat "$work/daemons.1.log" >&2; fail "daemons: dockerd up failed"; }
  wait $b || { cat "$work/daemons.2.log" >&2; fail "daemons: the second checkout's dockerd up failed"; }
  local n1 n2 k1 k2
  n1=$(cat _output/kind/docker/net.env _output/kind/links 2>/dev/null)
  n2=$(cat "$other/_output/kind/docker/net.env" "$other/_output/kind/links" 2>/dev/null)
  k1=$(eval "$(hack/kind/dockerd.sh env)" && docker network inspect kind -f '{{(index .IPAM.Config 0).Subnet}} {{index .Options "com.docker.network.bridge.name"}}' 2>&1 || true)
  k2=$(cd "$other" && eval "$(hack/kind/dockerd.sh env)" && docker network inspect kind -f '{{(index .IPAM.Config 0).Subnet}} {{index .Options "com.docker.network.bridge.name"}}' 2>&1 || true)
  say "daemons: $(echo $n1) kind: $k1"
  say "daemons: $(echo $n2) kind: $k2"
  [ -n "$n1" ] && [ -n "$n2" ] || fail "daemons: no addresses chosen"
  [ -z "$(comm -12 <(echo "$n1" | sort) <(echo "$n2" | sort))" ] || fail "daemons: the checkouts share an address block or a link: $(comm -12 <(echo "$n1" | sort) <(echo "$n2" | sort))"
  [ "$k1" != "$k2" ] || fail "daemons: the kind networks are the same: $k1"
  # `make clean` in the second checkout stops its dockerd before it removes _output.
  local links2
  links2=$(cat "$other/_output/kind/links")
  (cd "$other" && make --no-print-directory clean) >>"$work/daemons.2.log" 2>&1 || fail "daemons: make clean in the second checkout failed"
  [ -z "$(pgrep -f "$other/_output/" || true)" ] || fail "daemons: make clean left the second checkout's processes: $(pgrep -af "$other/_output/")"
  for l in $links2; do ! ip link show "$l" >/dev/null 2>&1 || fail "daemons: make clean left the second checkout's link $l"; done
  hack/kind/dockerd.sh down >>"$work/daemons.1.log" 2>&1 || fail "daemons: dockerd down failed"
  rm -rf "$other"
  compare daemons
}

part_two() {
  local other="$work/checkout-2"
  say "two: a second checkout in $other"
  second_checkout "$other"
  # The same image inputs, hard-linked; its own dockerd.
  [ ! -d _output/kind/cache ] || cp -al _output/kind/cache "$other/_output/kind/cache"
  [ ! -d _output/kind/node-ctx ] || cp -al _output/kind/node-ctx "$other/_output/kind/node-ctx"
  [ ! -d _output/kind/pause ] || cp -al _output/kind/pause "$other/_output/kind/pause"
  make --no-print-directory kind-up KIND_CLUSTER=pj-crash >"$work/two.1.log" 2>&1 &
  local a=$!
  (cd "$other" && make --no-print-directory kind-up KIND_CLUSTER=pj-crash-2) >"$work/two.2.log" 2>&1 &
  local b=$!
  wait $a || { tail -20 "$work/two.1.log" >&2; fail "two: make kind-up in this checkout failed"; }
  wait $b || { tail -20 "$work/two.2.log" >&2; fail "two: make kind-up in the second checkout failed"; }
  local l1 l2 n1 n2
  l1=$(cat _output/kind/links 2>/dev/null | sort) l2=$(cat "$other/_output/kind/links" 2>/dev/null | sort)
  n1=$(cat _output/kind/docker/net.env 2>/dev/null) n2=$(cat "$other/_output/kind/docker/net.env" 2>/dev/null)
  say "two: links $(echo $l1) / $(echo $l2); pools $(echo $n1 | cut -d' ' -f1) / $(echo $n2 | cut -d' ' -f1)"
  [ -n "$l1" ] && [ -n "$l2" ] && [ -z "$(comm -12 <(echo "$l1") <(echo "$l2"))" ] || fail "two: the checkouts share a link name: $(echo $l1) / $(echo $l2)"
  [ -n "$n1" ] && [ "$n1" != "$n2" ] || fail "two: the checkouts share an address block: $n1"
  local k
  for k in "_output/kind/pj-crash.kubeconfig" "$other/_output/kind/pj-crash-2.kubeconfig"; do
    KUBECONFIG=$k _output/bin/kubectl get nodes -o name >/dev/null 2>&1 || fail "two: the cluster of $k does not answer"
  done
  # Each checkout's kind network on its own bridge and subnet.
  (eval "$(hack/kind/dockerd.sh env)" && docker network inspect kind -f '{{(index .IPAM.Config 0).Subnet}} {{index .Options "com.docker.network.bridge.name"}}') >"$work/two.net.1" 2>&1 || true
  (cd "$other" && eval "$(hack/kind/dockerd.sh env)" && docker network inspect kind -f '{{(index .IPAM.Config 0).Subnet}} {{index .Options "com.docker.network.bridge.name"}}') >"$work/two.net.2" 2>&1 || true
  say "two: kind networks $(cat "$work/two.net.1") / $(cat "$work/two.net.2")"
  cmp -s "$work/two.net.1" "$work/two.net.2" && fail "two: the kind networks are the same"
  (cd "$other" && make --no-print-directory kind-down KIND_CLUSTER=pj-crash-2) >"$work/two.down.2.log" 2>&1 || fail "two: kind-down in the second checkout failed"
  make --no-print-directory kind-down KIND_CLUSTER=pj-crash >"$work/two.down.1.log" 2>&1 || fail "two: kind-down failed"
  [ -z "$(ip -o link show | grep -F -e "$(echo "$l2" | head -1)" || true)" ] || fail "two: the second checkout's links are left"
  rm -rf "$other"
  compare two
}

[ "$(id -u)" = 0 ] || { say "needs root"; exit 1; }
# Nothing of ours may run when it starts: the comparison is with a clean state.
make --no-print-directory kind-down KIND_CLUSTER=pj-crash >/dev/null 2>&1 || true
snapshot before
shim_sockets >"$work/shim-sockets.before"
parts=${1:-all}
[ "$parts" != all ] || parts="dockerd daemons kill two"
start=$SECONDS
for p in $parts; do
  case $p in
    dockerd | daemons | kill | two) "part_$p" ;;
    *) say "unknown part $p"; exit 2 ;;
  esac
done
say "done in $((SECONDS - start))s"
exit $failed
