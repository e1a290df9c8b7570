#!/usr/bin/env bash
# Generates the code of the podjanitor.io API (pkg/apis) the way
# sample-controller does, with k8s.io/code-generator at the version pinned in
# hack/codegen/go.mod (the version of client-go in go.mod):
#   pkg/apis/podjanitor/v1alpha1/zz_generated.deepcopy.go
#   pkg/generated/{clientset,informers,listers}
# and, from the same Go types, the CRD (hack/crdgen):
#   artifacts/crd/podjanitor.io_podlifetimepolicies.yaml and its copy in
#   charts/podjanitor/files/ (the chart's templates/crd.yaml renders it).
# The generators are built into _output/codegen/bin (kept between runs).
# hack/verify-codegen.sh (in `make vet`) fails when any of it is stale.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

export GOBIN="$root/_output/codegen/bin"
mkdir -p "$GOBIN"
CODEGEN_PKG=$(cd hack/codegen && go mod download k8s.io/code-generator && go list -m -f '{{.Dir}}' k8s.io/code-generator)
# kube_codegen.sh installs the generators with `go install` from its own
# module; pin that to the version in hack/codegen/go.mod.
want=$(cd hack/codegen && go list -m -f '{{.Version}}' k8s.io/code-generator)
[[ "$CODEGEN_PKG" == *"@$want" ]] || { echo "code-generator $CODEGEN_PKG is not $want" >&2; exit 1; }

# shellcheck source=/dev/null
source "$CODEGEN_PKG/kube_codegen.sh"

module=github.com/podjanitor/podjanitor
boilerplate="$root/hack/boilerplate.go.txt"

kube::codegen::gen_helpers \
  --boilerplate "$boilerplate" \
  "$root/pkg/apis"

kube::codegen::gen_client \
  --with-watch \
  --output-dir "$root/pkg/generated" \
  --output-pkg "$module/pkg/generated" \
  --boilerplate "$boilerplate" \
  "$root/pkg/apis"

if [ -d hack/crdgen ]; then
  go run ./hack/crdgen
fi
