#!/usr/bin/env bash
# `make run`: builds podjanitor and the local cluster, starts the cluster,
# creates the demo pods and runs podjanitor in the foreground against it.
# Ctrl-C stops podjanitor, then the cluster.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
say() { printf '\n==> %s\n' "$*"; }

say "Building podjanitor"
make --no-print-directory build
say "Building the local cluster (etcd, kube-apiserver, kube-controller-manager, kwok); the first build takes 15-25 minutes on 2 cores, later ones seconds"
# The real node's tools (kubelet, kube-scheduler) only when asked for: REAL_NODE=1 make run.
if [ "${REAL_NODE:-0}" = 1 ]; then hack/build-tools.sh; else hack/build-tools.sh control-plane; fi
say "Starting the local cluster in _output/local"
hack/local-cluster.sh up
# Stop the cluster however this script ends; a closed terminal or pipe must not
# stop the clean-up halfway.
trap 'trap "" PIPE HUP; say "Stopping the local cluster" 2>/dev/null; hack/local-cluster.sh down >/dev/null 2>&1 || true' EXIT
say "Creating the demo pods in namespace podjanitor-demo"
hack/demo/create.sh
cat <<TXT

==> Running podjanitor against the local cluster (Ctrl-C to stop it and the cluster).
    In another terminal:  export KUBECONFIG=$root/_output/local/kubeconfig
    and see what podjanitor will do:  _output/bin/podjanitor plan --namespace podjanitor-demo

TXT
# podjanitor handles SIGINT itself; keep this shell alive to clean up after it.
trap '' INT
(trap - INT; exec _output/bin/podjanitor --kubeconfig _output/local/kubeconfig -v=2 \
  --metrics-bind-address=127.0.0.1:8080 --health-probe-bind-address=127.0.0.1:8081 "$@") || true
