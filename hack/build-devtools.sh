#!/usr/bin/env bash
# Builds the chart and release tools pinned in hack/devtools/go.mod into
# _output/bin: helm (`make test`: chart lint, template and install tests),
# kustomize (`make test`: builds of artifacts/; the wrapper of hack/tools,
# which hack/build-tools.sh builds for the e2e tests too) and cyclonedx-gomod
# (`make release`: the SBOMs). Arguments name the tools to build (default:
# all). Up to date binaries are kept.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
self="$root/hack/build-devtools.sh"
bin="$root/_output/bin"
mkdir -p "$bin"
cd "$root/hack/devtools"

build() { # name package extra-ldflags
  local name=$1 pkg=$2
  if [ -x "$bin/$name" ] && [ "$bin/$name" -nt go.sum ] && [ "$bin/$name" -nt "$self" ] &&
    { [ "${pkg#./}" = "$pkg" ] || [ "$bin/$name" -nt "$pkg/main.go" ]; }; then
    echo "  $name: up to date"
    return
  fi
  local start=$SECONDS
  echo "  $name: building $pkg ..."
  CGO_ENABLED=0 go build -trimpath -ldflags "-s -w $3" -o "$bin/$name" "$pkg"
  echo "  $name: built in $((SECONDS - start))s"
}

want=${*:-helm kustomize cyclonedx-gomod}
echo "Building dev tools into $bin: $want"
for tool in $want; do
  case $tool in
    # helm reports the version in this variable (`helm version`).
    helm) build helm helm.sh/helm/v3/cmd/helm \
      "-X helm.sh/helm/v3/internal/version.version=$(go list -m -f '{{.Version}}' helm.sh/helm/v3)" ;;
    cyclonedx-gomod) build cyclonedx-gomod github.com/CycloneDX/cyclonedx-gomod/cmd/cyclonedx-gomod "" ;;
    # One kustomize for the unit and the e2e tests: the local cluster's (hack/tools).
    kustomize) (cd "$root/hack/tools" && build kustomize ./kustomize "") ;;
    *) echo "unknown tool $tool (helm, kustomize, cyclonedx-gomod)" >&2; exit 2 ;;
  esac
done
