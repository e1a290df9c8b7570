#!/usr/bin/env bash
# Which path hack/kind/up.sh takes (`up.sh plan`), shown without Docker or a
# registry: stub docker and kubectl programs in PATH stand for a user's, and
# KIND_BIN_DIR for a checkout whose offline build never ran. Also that
# `make bench-kind`'s defaults leave out recovery and evict-backlog. Seconds; hack/kind/test.sh
# runs it first.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/bin" "$tmp/path" "$tmp/answering"
# A kind that lists no clusters (choose builds kind when it is missing).
printf '#!/bin/sh\nexit 0\n' >"$tmp/bin/kind"
printf '#!/bin/sh\necho "kubectl stub"\n' >"$tmp/path/kubectl"
# A docker CLI whose daemon never answers, and one whose daemon does.
printf '#!/bin/sh\nexit 1\n' >"$tmp/path/docker"
printf '#!/bin/sh\necho 28.2.2\n' >"$tmp/answering/docker"
chmod +x "$tmp"/bin/* "$tmp"/path/* "$tmp"/answering/*
ours="unix://$root/_output/kind/docker/docker.sock"
failed=0
# check NAME WANT ENV...: up.sh plan under ENV prints WANT.
check() {
  local name=$1 want=$2 got
  shift 2
  got=$(env -u DOCKER_HOST -u KUBECTL KIND_BIN_DIR="$tmp/bin" "$@" hack/kind/up.sh plan 2>&1) || true
  if [ "$got" = "$want" ]; then
    echo "ok   $name"
  else
    printf 'FAIL %s\n  want %s\n  got  %s\n' "$name" "$want" "$got"
    failed=1
  fi
}
sock=/var/run/docker.sock
[ ! -S "$sock" ] || echo "note: $sock exists here; the auto cases set DOCKER_HOST"
check "stock: kubectl from PATH when the offline build made none" \
  "image=stock offline=false docker_host=/var/run/docker.sock kubectl=$tmp/path/kubectl" \
  KIND_NODE_IMAGE=stock PATH="$tmp/path:$PATH"
check "stock: KUBECTL wins" \
  "image=stock offline=false docker_host=/var/run/docker.sock kubectl=/opt/kubectl" \
  KIND_NODE_IMAGE=stock KUBECTL=/opt/kubectl PATH="$tmp/path:$PATH"
check "auto: a Docker of the user's that answers: stock" \
  "image=stock offline=false docker_host=unix:///tmp/users-docker.sock kubectl=$tmp/path/kubectl" \
  KIND_NODE_IMAGE=auto DOCKER_HOST=unix:///tmp/users-docker.sock PATH="$tmp/answering:$tmp/path:$PATH"
check "auto: a Docker that does not answer: offline, in our dockerd" \
  "image=podjanitor.local/kind-node:v1.37.2 offline=true docker_host=$ours kubectl=$tmp/path/kubectl" \
  KIND_NODE_IMAGE=auto DOCKER_HOST=unix:///tmp/users-docker.sock PATH="$tmp/path:$PATH"
check "offline: our dockerd" \
  "image=podjanitor.local/kind-node:v1.37.2 offline=true docker_host=$ours kubectl=$tmp/path/kubectl" \
  KIND_NODE_IMAGE=offline PATH="$tmp/answering:$tmp/path:$PATH"
# make bench-kind: its default scenarios run on kind (no recovery, no
# evict-backlog), and those two asked for are refused before anything starts.
if make -n --no-print-directory bench-kind 2>/dev/null | grep -q 'BENCH_SCENARIOS=idle,backlog,ns-backlog,steady,churn BENCH_KIND'; then
  echo "ok   bench-kind: default scenarios without recovery or evict-backlog"
else
  echo "FAIL bench-kind: default scenarios: $(make -n --no-print-directory bench-kind 2>&1 | grep -o 'BENCH_SCENARIOS=[^ ]*' | tr '\n' ' ')"
  failed=1
fi
if out=$(BENCH_KIND_CLUSTER=x BENCH_SCENARIOS=steady,recovery hack/kind/bench.sh 2>&1); then
  echo "FAIL bench-kind: BENCH_SCENARIOS with recovery ran"
  failed=1
else
  case $out in *"recovery needs the local cluster"*) echo "ok   bench-kind: recovery refused" ;; *) echo "FAIL bench-kind: recovery: $out"; failed=1 ;; esac
fi
if out=$(BENCH_KIND_CLUSTER=x BENCH_SCENARIOS=ns-backlog,evict-backlog hack/kind/bench.sh 2>&1); then
  echo "FAIL bench-kind: BENCH_SCENARIOS with evict-backlog ran"
  failed=1
else
  case $out in *"evict-backlog needs the local cluster"*) echo "ok   bench-kind: evict-backlog refused" ;; *) echo "FAIL bench-kind: evict-backlog: $out"; failed=1 ;; esac
fi
exit $failed
