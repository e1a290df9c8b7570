#!/usr/bin/env bash
# `make bench`: podjanitor's load benchmark (see BENCHMARKS.md).
#
# Brings up a local cluster of its own in _output/bench/cluster (ports
# BENCH_PORT_BASE+, default 29400, so `make run` and `make e2e` clusters can
# stay up), builds the driver (test/bench) and runs it against the release
# build of podjanitor (_output/bin/podjanitor, from `make build`), then takes
# the cluster down again. Results: a table on stdout and JSON in _output/bench/,
# with charts (PNG) and the data behind each (JSON) beside them; each records
# the make command (from the BENCH_* variables) and the commit.
#
# Environment (the Makefile passes its BENCH_* variables):
#   BENCH_PODS          N for the idle and steady scenarios      (default 10000)
#   BENCH_BACKLOG_PODS  pods per backlog run and per deleter     (default 3000)
#   BENCH_CAP_PODS      pods per side of evict-backlog, ns-backlog (default 600)
#   BENCH_SCENARIOS     idle,backlog,evict-backlog,ns-backlog,steady,churn,recovery (default all seven);
#                       evict-backlog needs kwok (the local cluster, not bench-kind);
#                       idle-standin alone needs no cluster (pods served by the driver);
#                       recovery needs the local cluster (not BENCH_KUBECONFIG);
#                       peer (not in the default) runs the descheduler beside podjanitor,
#                       built first by hack/build-descheduler.sh; it needs the local
#                       cluster's kwok; kyverno (not in the default) runs Kyverno's cleanup
#                       controller and the ideal remover beside podjanitor, built first by
#                       hack/build-kyverno.sh; it needs an API server on this machine (the
#                       local cluster: Kyverno's webhooks are at https://127.0.0.1:<port>);
#                       takeover (not in the default) runs two podjanitors with
#                       --leader-elect, SIGKILLs the leader once the other is a synced
#                       standby and measures the takeover (-takeover-* flags; metrics of
#                       the second podjanitor on BENCH_PORT_BASE+92)
#   BENCH_RUNS          runs of the short measurements, median   (default 3)
#   BENCH_WINDOWS       steady: deadline windows, one run each   (default 5m,1m)
#   BENCH_WORKERS       podjanitor --workers = raw deleter goroutines (default 16)
#   BENCH_QPS/BENCH_BURST  client QPS/burst of both              (default 1000/1000)
#   BENCH_IDLE          idle measurement period                  (default 60s)
#   BENCH_KUBECONFIG    use this cluster instead of starting one (bench-kind)
#   BENCH_PODJANITOR    process (default): podjanitor as a process of this machine;
#                       pod: as a pod of artifacts/deploy on the local cluster's real
#                       node (REAL_NODE=1: root; image from `make image-archive`)
#   BENCH_ARGS          more driver flags (go run ./test/bench -h)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

out=_output/bench
mkdir -p "$out"
go build -o _output/bin/podjanitor-bench ./test/bench
[ -x _output/bin/podjanitor ] || make --no-print-directory build

args=(
  -podjanitor "$root/_output/bin/podjanitor"
  -out "$out"
  -pods "${BENCH_PODS:-10000}"
  -backlog-pods "${BENCH_BACKLOG_PODS:-3000}"
  -cap-pods "${BENCH_CAP_PODS:-600}"
  -scenarios "${BENCH_SCENARIOS:-idle,backlog,evict-backlog,ns-backlog,steady,churn,recovery}"
  -runs "${BENCH_RUNS:-3}"
  -windows "${BENCH_WINDOWS:-5m,1m}"
  -workers "${BENCH_WORKERS:-16}"
  -qps "${BENCH_QPS:-1000}"
  -burst "${BENCH_BURST:-1000}"
  -idle "${BENCH_IDLE:-60s}"
  -metrics-port "$(( ${BENCH_PORT_BASE:-29400} + 90 ))"
)
# BENCH_ARGS is split as the shell splits a command line, so quotes group words:
# BENCH_ARGS='-podjanitor-alt "_output/bin/podjanitor --removal-events=false"'
eval "extra=(${BENCH_ARGS:-})"
# The command and commit, recorded with the results and beside every chart.
quote() { case $1 in *[!A-Za-z0-9_.,:/=+@%-]*|'') printf "'%s'" "${1//\'/\'\\\'\'}" ;; *) printf %s "$1" ;; esac; }
command="make bench"
for v in BENCH_PODS BENCH_BACKLOG_PODS BENCH_CAP_PODS BENCH_SCENARIOS BENCH_RUNS BENCH_WINDOWS BENCH_WORKERS BENCH_QPS \
  BENCH_BURST BENCH_IDLE BENCH_PODJANITOR BENCH_KUBECONFIG BENCH_ARGS; do
  [ -z "${!v:-}" ] || command+=" $v=$(quote "${!v}")"
done
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
[ -z "$(git status --porcelain --untracked-files=no 2>/dev/null)" ] || commit+=-dirty
args+=(-command "$command" -commit "$commit")
case ",${BENCH_SCENARIOS:-}," in *,peer,*)
  hack/build-descheduler.sh
  args+=(-descheduler "$root/_output/bin/descheduler")
  ;;
esac
case ",${BENCH_SCENARIOS:-}," in *,kyverno,*)
  hack/build-kyverno.sh
  args+=(-kyverno "$root/_output/bin/kyverno-cleanup-controller"
    -kyverno-crds "$(cd hack/kyverno && go list -m -f '{{.Dir}}' github.com/kyverno/kyverno)/config/crds")
  ;;
esac

if [ "${BENCH_SCENARIOS:-}" = idle-standin ]; then
  # podjanitor against the driver's stand-in API server: no cluster needed
  exec _output/bin/podjanitor-bench "${args[@]}" "${extra[@]}"
fi
if [ -n "${BENCH_KUBECONFIG:-}" ]; then
  exec _output/bin/podjanitor-bench -kubeconfig "$BENCH_KUBECONFIG" "${args[@]}" "${extra[@]}"
fi

export CLUSTER_DIR=$out/cluster PORT_BASE=${BENCH_PORT_BASE:-29400}
case ${BENCH_PODJANITOR:-process} in
  process) tools="etcd kube-apiserver kube-controller-manager kwok" ;;
  pod)
    export REAL_NODE=1
    tools="etcd kube-apiserver kube-controller-manager kwok kubelet kube-scheduler kustomize"
    make --no-print-directory image-archive
    ;;
  *) echo "BENCH_PODJANITOR=${BENCH_PODJANITOR}: want process or pod" >&2; exit 2 ;;
esac
for c in $tools; do
  [ -x "_output/bin/$c" ] || { hack/build-tools.sh; break; }
done
cleanup() {
  status=$?
  if [ $status -ne 0 ] && [ -d "$CLUSTER_DIR/logs" ]; then
    cp -r "$CLUSTER_DIR/logs" "$out/cluster-logs" 2>/dev/null || true
    echo "--- bench failed; cluster logs copied to $out/cluster-logs, podjanitor logs in $out/" >&2
  fi
  [ -n "${BENCH_KEEP_CLUSTER:-}" ] || hack/local-cluster.sh down >/dev/null || true
  exit $status
}
trap cleanup EXIT
hack/local-cluster.sh down >/dev/null 2>&1 || true # a cluster left by an interrupted run
hack/local-cluster.sh up
if [ "${BENCH_PODJANITOR:-process}" = pod ]; then
  hack/local-cluster.sh load-image _output/images/podjanitor.tar
  _output/bin/kustomize build "$CLUSTER_DIR/deploy" >"$out/podjanitor-pod.yaml"
  args+=(-pod-manifests "$out/podjanitor-pod.yaml")
fi
# -cluster-dir: the recovery scenario stops and starts this cluster's kube-apiserver.
_output/bin/podjanitor-bench -kubeconfig "$CLUSTER_DIR/kubeconfig" -cluster-dir "$root/$CLUSTER_DIR" "${args[@]}" "${extra[@]}"
