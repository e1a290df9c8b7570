#!/usr/bin/env bash
# Fails when the generated code of the podjanitor.io API is stale: runs
# hack/update-codegen.sh and compares what it writes with what is checked in
# (pkg/, artifacts/crd, charts/podjanitor/files). The tree is left as it was.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
generated=(pkg artifacts/crd charts/podjanitor/files)

saved=$(mktemp -d)
trap 'rm -rf "$saved"' EXIT
for dir in "${generated[@]}"; do
  mkdir -p "$saved/$(dirname "$dir")"
  cp -a "$dir" "$saved/$dir"
done

restore() {
  for dir in "${generated[@]}"; do
    rm -rf "${dir:?}"
    cp -a "$saved/$dir" "$dir"
  done
}

if ! hack/update-codegen.sh >"$saved/update.log" 2>&1; then
  cat "$saved/update.log" >&2
  restore
  echo "hack/update-codegen.sh failed" >&2
  exit 1
fi
ret=0
for dir in "${generated[@]}"; do
  diff -Naupr "$saved/$dir" "$dir" || ret=1
done
restore
if [ "$ret" -ne 0 ]; then
  echo "The generated code is stale (diff above: checked in, then generated): run hack/update-codegen.sh" >&2
  exit 1
fi
echo "Generated code up to date: ${generated[*]}"
