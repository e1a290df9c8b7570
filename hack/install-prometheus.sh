#!/usr/bin/env bash
# Builds Prometheus (github.com/prometheus/prometheus, pinned in the module
# hack/prometheus at the version whose PromQL parser test/promql uses) into
# _output/bin/prometheus, for the e2e tests that scrape podjanitor, evaluate its
# alert rules and run its dashboard's queries (test/e2e/prometheus_test.go).
# hack/e2e.sh runs it before the tests.
#
# A build from source rather than Debian's package: Debian 12 ships Prometheus
# 2.42 (2023), while prometheus-operator installs 3.x, whose PromQL differs
# (left-open range selectors, UTF-8 names), and it is the same code as
# test/promql's parser. Only the Kubernetes service discovery is compiled in
# (Prometheus's remove_all_sd and enable_kubernetes_sd build tags), and no web
# UI (its API is all the tests use). Nothing is installed outside _output and no
# service is started. The first build takes minutes on 2 cores; later ones are
# cached, and a binary newer than go.sum and this script is kept.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin="$root/_output/bin"
self="$root/hack/$(basename "$0")"
mkdir -p "$bin"
cd "$root/hack/prometheus"

version=$(go list -m -f '{{.Version}}' github.com/prometheus/prometheus)
if [ -x "$bin/prometheus" ] && [ "$bin/prometheus" -nt go.sum ] && [ "$bin/prometheus" -nt "$self" ]; then
  echo "  prometheus: up to date"
  exit 0
fi
start=$SECONDS
echo "  prometheus: building github.com/prometheus/prometheus $version (first build takes minutes) ..."
# Prometheus's Go module versions v0.3XX.Y are its releases 3.XX.Y.
release=$(echo "$version" | sed -E 's/^v0\.3([0-9]+)\.([0-9]+)$/3.\1.\2/')
pkg=github.com/prometheus/common/version
CGO_ENABLED=0 go build -trimpath -tags remove_all_sd,enable_kubernetes_sd \
  -ldflags "-s -w -X $pkg.Version=$release -X $pkg.Branch=HEAD -X $pkg.Revision=$version" \
  -o "$bin/prometheus.new" github.com/prometheus/prometheus/cmd/prometheus
mv "$bin/prometheus.new" "$bin/prometheus"
echo "  prometheus: built $("$bin/prometheus" --version 2>&1 | head -n 1) in $((SECONDS - start))s"
