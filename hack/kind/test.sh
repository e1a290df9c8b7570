#!/usr/bin/env bash
# `make test-kind`: the kind tests (test/kind, build tag kind) on a fresh kind
# cluster of their own, KIND_TEST_CLUSTER (default podjanitor-test): creates it
# (hack/kind/up.sh; on a machine without Docker of its own: the project's
# dockerd and the offline node image, built or taken from the cache), loads
# podjanitor's image archive (`make image-archive`), runs the tests, deletes
# the cluster. It checks that the host's iptables rules, the ip_forward sysctl
# and dockerd's network links are as they were before, and stops the project's
# dockerd again if it started it. Expects `make build image-archive` to have
# run. Extra arguments go to `go test`.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
name=${KIND_TEST_CLUSTER:-podjanitor-test}
image=docker.io/local/podjanitor:dev
archive=_output/images/podjanitor.tar
[ -f "$archive" ] || { echo "[kind-test] $archive not found: make image-archive" >&2; exit 1; }

snapshot() {
  # The links dockerd makes (its bridge, its networks' bridges): other links
  # come and go with other clusters on the machine.
  { iptables -S 2>/dev/null; iptables -t nat -S 2>/dev/null; sysctl net.ipv4.ip_forward
    ip -o link show | awk -F': ' '{print $2}' | sed 's/@.*//' | { grep -E '^(pjdocker|docker|br-)' || true; } | sort; } 2>&1
}
before=$(snapshot)
started_dockerd=false
eval "$(hack/kind/up.sh env)"
if [ "${DOCKER_HOST:-}" = "unix://$root/_output/kind/docker/docker.sock" ] && ! hack/kind/dockerd.sh status; then
  started_dockerd=true
fi

cleanup() {
  local status=$?
  hack/kind/up.sh down "$name" >/dev/null 2>&1 || true
  hack/kind/up.sh down "$name-bench" >/dev/null 2>&1 || true
  if $started_dockerd; then hack/kind/dockerd.sh down >/dev/null 2>&1 || true; fi
  # Silent when unchanged: go test's summary stays the last line.
  if $started_dockerd; then
    local after
    after=$(snapshot)
    if [ "$before" != "$after" ]; then
      echo "[kind-test] FAIL: the host's network setup changed (iptables, ip_forward, links):" >&2
      diff <(echo "$before") <(echo "$after") >&2 || true
      status=1
    fi
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
  go test -tags kind -count=1 -timeout 40m -v ./test/kind/ "$@"
