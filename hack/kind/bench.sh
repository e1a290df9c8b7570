#!/usr/bin/env bash
# `make bench-kind`: hack/bench.sh's load benchmark against a fresh kind
# cluster BENCH_KIND_CLUSTER (hack/kind/up.sh), deleted after unless
# BENCH_KEEP_CLUSTER is set; the project's dockerd is stopped again when this
# run started it. The scenarios are BENCH_SCENARIOS (hack/bench.mk gives
# idle,backlog,ns-backlog,steady,churn: recovery stops and starts a local
# cluster's API server, which a kind cluster does not have, and evict-backlog
# binds its pods to the local cluster's kwok nodes).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
name=${BENCH_KIND_CLUSTER:?}
case ",${BENCH_SCENARIOS:-}," in
  *,recovery,*) echo "[bench-kind] BENCH_SCENARIOS=$BENCH_SCENARIOS: recovery needs the local cluster (make bench), not kind" >&2; exit 2 ;;
  *,evict-backlog,*) echo "[bench-kind] BENCH_SCENARIOS=$BENCH_SCENARIOS: evict-backlog needs the local cluster's kwok nodes (make bench), not kind" >&2; exit 2 ;;
esac
started_dockerd=false
eval "$(hack/kind/up.sh env)"
if [ "${DOCKER_HOST:-}" = "unix://$root/_output/kind/docker/docker.sock" ] && ! hack/kind/dockerd.sh status; then
  started_dockerd=true
fi
finish() {
  local status=$?
  if [ -n "${BENCH_KEEP_CLUSTER:-}" ]; then
    echo "kind cluster $name kept; remove it with: make kind-down KIND_CLUSTER=$name"
  else
    hack/kind/up.sh down "$name" || status=1
    if $started_dockerd; then hack/kind/up.sh stop || status=1; fi
  fi
  exit $status
}
trap finish EXIT
hack/kind/up.sh down "$name"
hack/kind/up.sh up "$name" >/dev/null
BENCH_KUBECONFIG="$root/_output/kind/$name.kubeconfig" BENCH_ARGS="-idle-bound=false ${BENCH_ARGS:-}" hack/bench.sh
