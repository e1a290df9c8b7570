#!/usr/bin/env bash
# Builds the descheduler (sigs.k8s.io/descheduler, pinned in the module
# hack/descheduler) into _output/bin/descheduler, for the bench's `peer`
# scenario (hack/bench.sh builds it only when BENCH_SCENARIOS names peer).
# The first build takes a few minutes on 2 cores; later ones are cached.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin="$root/_output/bin"
mkdir -p "$bin"
cd "$root/hack/descheduler"

version=$(go list -m -f '{{.Version}}' sigs.k8s.io/descheduler)
if [ -x "$bin/descheduler" ] && [ "$bin/descheduler" -nt go.sum ] && [ "$bin/descheduler" -nt "$0" ]; then
  echo "  descheduler: up to date"
  exit 0
fi
start=$SECONDS
echo "  descheduler: building sigs.k8s.io/descheduler $version (first build takes minutes) ..."
CGO_ENABLED=0 go build -trimpath \
  -ldflags "-s -w -X sigs.k8s.io/descheduler/pkg/version.version=$version" \
  -o "$bin/descheduler" sigs.k8s.io/descheduler/cmd/descheduler
echo "  descheduler: built in $((SECONDS - start))s"
