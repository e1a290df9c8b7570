#!/usr/bin/env bash
# Builds the chart and release tools pinned in hack/devtools/go.mod into
# _output/bin: helm (`make test`: chart lint, template and install tests) and
# cyclonedx-gomod (`make release`: the SBOM). Arguments name the tools to
# build (default: all). Up to date binaries are kept.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin="$root/_output/bin"
mkdir -p "$bin"
cd "$root/hack/devtools"

build() { # name package extra-ldflags
  local name=$1 pkg=$2
  if [ -x "$bin/$name" ] && [ "$bin/$name" -nt go.sum ] && [ "$bin/$name" -nt "$0" ]; then
    echo "  $name: up to date"
    return
  fi
  local start=$SECONDS
  echo "  $name: building $pkg ..."
  CGO_ENABLED=0 go build -trimpath -ldflags "-s -w $3" -o "$bin/$name" "$pkg"
  echo "  $name: built in $((SECONDS - start))s"
}

want=${*:-helm cyclonedx-gomod}
echo "Building dev tools into $bin: $want"
for tool in $want; do
  case $tool in
    # helm reports the version in this variable (`helm version`).
    helm) build helm helm.sh/helm/v3/cmd/helm \
      "-X helm.sh/helm/v3/internal/version.version=$(go list -m -f '{{.Version}}' helm.sh/helm/v3)" ;;
    cyclonedx-gomod) build cyclonedx-gomod github.com/CycloneDX/cyclonedx-gomod/cmd/cyclonedx-gomod "" ;;
    *) echo "unknown tool $tool (helm, cyclonedx-gomod)" >&2; exit 2 ;;
  esac
done
