#!/usr/bin/env bash
# Runs the end-to-end tests against a fresh local cluster of their own
# (_output/e2e, ports 27400+), so a `make run` cluster can stay up meanwhile.
# A second run at once needs E2E_DIR and E2E_PORT_BASE of its own
# (E2E_DIR=_output/e2e-b E2E_PORT_BASE=28400). The tests run a copy of
# _output/bin/podjanitor taken at the start, so a rebuild meanwhile does not
# change the binary under a run.
# The cluster has the real node (REAL_NODE=1: needs root; installs containerd,
# runc and the CNI plugins if missing), and podjanitor's image is loaded into
# it. Expects `make build tools helm image-archive` to have run; builds
# Prometheus for the monitoring tests (hack/install-prometheus.sh). Extra
# arguments go to `go test`.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

dir=${E2E_DIR:-_output/e2e}
export CLUSTER_DIR=$dir PORT_BASE=${E2E_PORT_BASE:-27400} REAL_NODE=1
cleanup() {
  status=$?
  if [ $status -ne 0 ] && [ -d "$dir/logs" ]; then
    echo "--- e2e failed; last lines of the cluster logs in $dir/logs:"
    for f in "$dir"/logs/*.log; do echo "== $f"; tail -n 15 "$f"; done
    rm -rf "$dir-failed-logs" && cp -r "$dir/logs" "$dir-failed-logs"
    echo "--- full cluster logs kept in $dir-failed-logs"
  fi
  hack/local-cluster.sh down || true
  exit $status
}
trap cleanup EXIT
# test/e2e/prometheus_test.go runs it (PROMETHEUS_BIN); E2E_PROMETHEUS=0 for a run without it.
[ "${E2E_PROMETHEUS:-1}" = 0 ] || hack/install-prometheus.sh
hack/local-cluster.sh down >/dev/null 2>&1 || true # state left by an interrupted run
hack/local-cluster.sh up
hack/local-cluster.sh load-image _output/images/podjanitor.tar
cp _output/bin/podjanitor "$dir/podjanitor"

# E2E_CLUSTER_DIR: the fault tests stop and restart the cluster's kube-apiserver
# (hack/local-cluster.sh stop-apiserver/start-apiserver) and reach its etcd;
# TestDeployment reads the real node's files there.
E2E_KUBECONFIG="$root/$dir/kubeconfig" PODJANITOR_BIN="$root/$dir/podjanitor" \
  HELM_BIN="${HELM_BIN:-$root/_output/bin/helm}" \
  E2E_CLUSTER_DIR="$root/$dir" E2E_IMAGE_ARCHIVE="$root/_output/images/podjanitor.tar" \
  KUSTOMIZE_BIN="$root/_output/bin/kustomize" PROMETHEUS_BIN="$root/_output/bin/prometheus" \
  go test -tags e2e -count=1 -timeout 45m -v ./test/e2e/ "$@"
