#!/usr/bin/env bash
# Builds the release artifacts of podjanitor into DIR (`make release`):
#   podjanitor-VERSION-OS-ARCH     static binaries (CGO_ENABLED=0, -trimpath),
#                                  stamped with VERSION and COMMIT
#   podjanitor-VERSION-OS-ARCH.sbom.json
#                                  CycloneDX SBOM of each binary's modules
#                                  (cyclonedx-gomod, hack/devtools/go.mod)
#   SHA256SUMS                     sha256sum of all of the above
#
#   hack/release.sh VERSION COMMIT DIR PLATFORM...   (PLATFORM: linux/amd64 ...)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
[ $# -ge 4 ] || { echo "usage: $0 VERSION COMMIT DIR PLATFORM..." >&2; exit 2; }
version=$1 commit=$2 dir=$3
shift 3

case $version in
  *-dirty) echo "WARNING: building $version from a work tree with uncommitted changes" >&2 ;;
esac
rm -rf "$dir" && mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
hack/build-devtools.sh cyclonedx-gomod >/dev/null
sbomtool="$root/_output/bin/cyclonedx-gomod"
# cyclonedx-gomod reads the main module's version from git (the tag on HEAD,
# else a pseudo-version) and cannot open a linked work tree (.git is a file
# there): it then reads a clone of the same commit.
sbomsrc=$root
if [ -f "$root/.git" ]; then
  sbomsrc=$(mktemp -d)
  trap 'rm -rf "$sbomsrc"' EXIT
  git clone -q --no-checkout "$root" "$sbomsrc"
  git -C "$sbomsrc" checkout -q "$(git rev-parse HEAD)"
fi
for platform in "$@"; do
  os=${platform%/*} arch=${platform#*/}
  out="$dir/podjanitor-$version-$os-$arch"
  echo "  $out"
  export CGO_ENABLED=0 GOOS=$os GOARCH=$arch
  go build -trimpath -ldflags "-s -w -X main.version=$version -X main.commit=$commit" -o "$out" .
  # The modules linked into that binary (the SBOM is per platform, as build
  # constraints choose modules), with each module's license and hashes.
  (cd "$sbomsrc" && "$sbomtool" app -json -licenses -output "$out.sbom.json" -main . . 2>"$dir/.sbom.log") ||
    { cat "$dir/.sbom.log" >&2; exit 1; }
  echo "  $out.sbom.json"
  unset CGO_ENABLED GOOS GOARCH
done
rm -f "$dir/.sbom.log"

(cd "$dir" && sha256sum -- * >SHA256SUMS)
echo "  $dir/SHA256SUMS"
cat "$dir/SHA256SUMS"
