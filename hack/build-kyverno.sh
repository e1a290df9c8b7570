#!/usr/bin/env bash
# Builds Kyverno's cleanup controller (github.com/kyverno/kyverno/cmd/cleanup-controller,
# pinned in the module hack/kyverno) into _output/bin/kyverno-cleanup-controller,
# for the bench's `kyverno` scenario (hack/bench.sh builds it only when
# BENCH_SCENARIOS names kyverno). The first build takes ~5 minutes on 2 cores
# (~2,900 packages, a binary of ~270 MB); later ones are cached.
#
# The scenario applies Kyverno's CRDs from the module's own config/crds
# (go list -m -f '{{.Dir}}' github.com/kyverno/kyverno, run in hack/kyverno).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin="$root/_output/bin"
self="$root/hack/$(basename "$0")"
out="$bin/kyverno-cleanup-controller"
mkdir -p "$bin"
cd "$root/hack/kyverno"

version=$(go list -m -f '{{.Version}}' github.com/kyverno/kyverno)
if [ -x "$out" ] && [ "$out" -nt go.sum ] && [ "$out" -nt "$self" ]; then
  echo "  kyverno cleanup controller: up to date ($version)"
  exit 0
fi
start=$SECONDS
echo "  kyverno cleanup controller: building github.com/kyverno/kyverno $version (first build takes ~5 minutes) ..."
CGO_ENABLED=0 go build -trimpath \
  -ldflags "-s -w -X github.com/kyverno/kyverno/pkg/version.BuildVersion=$version" \
  -o "$out.tmp" github.com/kyverno/kyverno/cmd/cleanup-controller
mv "$out.tmp" "$out"
echo "  kyverno cleanup controller: built in $((SECONDS - start))s"
