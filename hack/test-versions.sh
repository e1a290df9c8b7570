#!/usr/bin/env bash
# `make test-versions`: the e2e suite's version-sensitive core on each supported
# Kubernetes minor, one after another, each on a fresh local cluster of that
# minor (hack/e2e.sh with KUBE_VERSION; E2E_PORT_BASE as there).
#
#   hack/test-versions.sh [MINOR|oldest|newest]...   default: every minor in hack/k8s/versions
#
# Builds each minor's kube-apiserver, kube-controller-manager, kube-scheduler and
# kubelet first (hack/build-tools.sh); expects `make build image-archive` (the
# core needs neither helm nor Prometheus).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
# shellcheck source=k8s/versions.sh
. hack/k8s/versions.sh

# The core: the e2e tests of what crosses the API server in ways that differ
# between minors. One name a line; the -run regexp is made of them.
core=(
  TestTTLPodGoesAtItsDeadlineNotBefore      # delete with a UID and resourceVersion precondition
  TestFaultStaleCache                       # a stale delete refused (409), an eviction read first
  TestEvictionHonoursKeepAddedOnAStaleCache # evictions with a precondition under a PDB
  TestPodDisruptionBudgetBlocksEviction     # a PDB refuses an eviction (429)
  TestPolicyRules                           # the policy file (--config)
  TestTenantPolicies                        # PodLifetimePolicy through the CRD, its status and events
  TestTenantAPIAgreesWithLoader             # the CRD's CEL validation rules
  TestAdmissionPolicyTable                  # the ValidatingAdmissionPolicy
  TestTenantWaveIsHeld                      # a held wave and its approval on the Lease
  TestLeaderElection                        # leader election on a Lease
  TestDeadlinesHoldInTheAPIServersTime      # the clock probe (the API server's Date)
  TestSecureMetrics                         # HTTPS metrics with TokenReview and SubjectAccessReview
  TestRestartRulesOnARealNode               # container restart rules as the kubelet writes them (1.35+)
  TestGangWaitingPodIsNotStuck              # a pod waiting for its gang (1.37+; skipped before)
)
for t in "${core[@]}"; do
  grep -q "^func $t(t \*testing.T)" test/e2e/*_test.go || { echo "hack/test-versions.sh: no test $t in test/e2e" >&2; exit 1; }
done
run="^($(IFS='|'; echo "${core[*]}"))\$"

if [ "${1:-}" = --run ]; then # the regexp alone
  echo "$run"
  exit 0
fi
minors=()
for m in "${@:-$(kube_minors)}"; do
  case $m in oldest) m=$(kube_minors | head -n 1) ;; newest) m=$(kube_minors | tail -n 1) ;; esac
  kube_resolve "$m"
  minors+=("$KUBE_MINOR")
done

results=()
for m in "${minors[@]}"; do
  echo "=== Kubernetes $m: building its binaries"
  KUBE_VERSION=$m hack/build-tools.sh cluster
  echo "=== Kubernetes $m: the e2e core"
  start=$SECONDS
  if KUBE_VERSION=$m E2E_PROMETHEUS=0 hack/e2e.sh -run "$run"; then
    results+=("$m: ok in $((SECONDS - start))s")
  else
    results+=("$m: FAILED after $((SECONDS - start))s")
  fi
done
echo "=== The e2e core on each minor"
printf '  %s\n' "${results[@]}"
! printf '%s\n' "${results[@]}" | grep -q FAILED
