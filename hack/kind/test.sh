#!/usr/bin/env bash
# `make test-kind`: the kind tests (test/kind, build tag kind) on a fresh kind
# cluster of their own, KIND_TEST_CLUSTER (default podjanitor-test): creates it
# (hack/kind/up.sh; on a machine without Docker of its own: the project's
# dockerd and the offline node image, built or taken from the cache), loads
# podjanitor's image archive (`make image-archive`), runs the tests, deletes
# the cluster, and stops the project's dockerd again if it started it.
# Expects `make build image-archive` to have run. Extra arguments go to `go test`.
#
# On a failed test, `kind export logs` writes the cluster's logs (the node's
# journal, the kubelet's and containerd's, every container's) to
# _output/kind/logs/<cluster> before the cluster is deleted, and says so.
#
# It fails when this checkout's host state (hack/host-state.sh with
# HOST_STATE_SCOPE=_output: the kubelet's sysctls and ip_forward, host
# iptables in every table, the links, mounts and processes of ours) differs
# from before. On a machine others share, a kubelet of another checkout that
# starts or stops meanwhile changes the sysctls too.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
name=${KIND_TEST_CLUSTER:-podjanitor-test}
image=docker.io/local/podjanitor:dev
archive=_output/images/podjanitor.tar
[ -f "$archive" ] || { echo "[kind-test] $archive not found: make image-archive" >&2; exit 1; }

# The path choice and bench-kind's defaults, and the kubelet's sysctls back
# after success, failure, interrupt and crash, without Docker (seconds).
for t in hack/kind/test-choose.sh hack/kind/test-sysctls.sh; do
  out=$("$t" 2>&1) || { printf '%s\n' "$out" >&2; echo "[kind-test] FAIL: $t" >&2; exit 1; }
done

state="$root/_output/kind/host-state"
rm -rf "$state"
export HOST_STATE_SCOPE="$root/_output"
hack/host-state.sh snapshot "$state/before"
started_dockerd=false
eval "$(hack/kind/up.sh env)"
if [ "${DOCKER_HOST:-}" = "unix://$root/_output/kind/docker/docker.sock" ] && ! hack/kind/dockerd.sh status; then
  started_dockerd=true
fi
eval "$(hack/kind/dockerd.sh env | grep PATH || true)"
tests_failed=false

cleanup() {
  local status=$?
  if $tests_failed; then
    local logs="$root/_output/kind/logs/$name"
    rm -rf "$logs"
    if _output/bin/kind export logs "$logs" --name "$name" >/dev/null 2>&1; then
      echo "[kind-test] the tests failed: the cluster's logs are in $logs" >&2
    else
      echo "[kind-test] the tests failed; kind export logs into $logs failed too" >&2
    fi
  fi
  hack/kind/up.sh down "$name" >/dev/null 2>&1 || true
  hack/kind/up.sh down "$name-bench" >/dev/null 2>&1 || true
  if $started_dockerd; then hack/kind/dockerd.sh down >/dev/null 2>&1 || true; fi
  # Silent when unchanged: go test's summary stays the last line.
  hack/host-state.sh snapshot "$state/after"
  if ! hack/host-state.sh compare "$state/before" "$state/after" >&2; then
    echo "[kind-test] FAIL: the host state changed (snapshots in $state)" >&2
    status=1
  fi
  exit $status
}
trap cleanup EXIT

start=$SECONDS
hack/kind/up.sh down "$name" >/dev/null 2>&1 || true # a cluster left by an interrupted run
kubeconfig=$(hack/kind/up.sh up "$name")
hack/kind/up.sh load "$name" "$archive"
echo "[kind-test] cluster $name ready in $((SECONDS - start))s"

pause=
case ${KIND_NODE_IMAGE:-auto} in offline) ;; *)
  # The stock image's pause image (the sandbox image of its containerd).
  pause=$(docker exec "$name-control-plane" crictl info -o go-template --template '{{.config.sandboxImage}}' 2>/dev/null || true)
  ;;
esac
KIND_CLUSTER=$name KIND_KUBECONFIG=$kubeconfig KIND_IMAGE=$image KIND_PAUSE_IMAGE=$pause \
  go test -tags kind -count=1 -timeout 40m -v ./test/kind/ "$@" || { tests_failed=true; exit 1; }
