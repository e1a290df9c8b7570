#!/usr/bin/env bash
# Builds the descheduler (sigs.k8s.io/descheduler, pinned in the module
# hack/descheduler) into _output/bin/descheduler, for the bench's `peer`
# scenario (hack/bench.sh builds it only when BENCH_SCENARIOS names peer).
# The first build takes a few minutes on 2 cores; later ones are cached.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin="$root/_output/bin"
self="$root/hack/$(basename "$0")"
mkdir -p "$bin"
cd "$root/hack/descheduler"

# The version in the form of the descheduler's release builds, v<tag date>-<tag>
# (v20260519-v0.36.0), from which it derives the major and minor version that
# it checks against the API server's.
version=$(go list -m -f '{{.Time.Format "20060102"}}-{{.Version}}' sigs.k8s.io/descheduler)
version=v$version
if [ -x "$bin/descheduler" ] && [ "$bin/descheduler" -nt go.sum ] && [ "$bin/descheduler" -nt "$self" ]; then
  echo "  descheduler: up to date"
  exit 0
fi
start=$SECONDS
echo "  descheduler: building sigs.k8s.io/descheduler ${version#*-} (first build takes minutes) ..."
CGO_ENABLED=0 go build -trimpath \
  -ldflags "-s -w -X sigs.k8s.io/descheduler/pkg/version.version=$version" \
  -o "$bin/descheduler" sigs.k8s.io/descheduler/cmd/descheduler
echo "  descheduler: built in $((SECONDS - start))s"
