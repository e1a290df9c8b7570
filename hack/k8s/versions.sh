#!/usr/bin/env bash
# Reads hack/k8s/versions, the supported Kubernetes minors.
#
#   hack/k8s/versions.sh minors           every supported minor, oldest first
#   hack/k8s/versions.sh oldest|newest    one of them
#   hack/k8s/versions.sh release MINOR    its release (v1.35.4)
#   hack/k8s/versions.sh bin-dir MINOR    where its binaries go (absolute)
#
# Sourced, it defines kube_minors, kube_tools_minor (the minor hack/tools pins)
# and kube_resolve MINOR (empty: the newest),
# which sets KUBE_MINOR, KUBE_RELEASE, KUBE_MODULE (absolute) and KUBE_BIN_DIR:
# _output/bin for the minor that hack/tools pins, _output/k8s/MINOR/bin for the
# others.
k8s_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
k8s_versions_file="$k8s_root/hack/k8s/versions"

kube_minors() { awk '!/^#/ && NF { print $1 }' "$k8s_versions_file"; }
kube_tools_minor() { awk '!/^#/ && $3 == "hack/tools" { print $1 }' "$k8s_versions_file"; }

kube_resolve() { # [minor]
  local want=${1:-} line
  [ -n "$want" ] || want=$(kube_minors | tail -n 1)
  want=${want#v}
  line=$(awk -v m="$want" '!/^#/ && $1 == m' "$k8s_versions_file")
  if [ -z "$line" ]; then
    printf 'KUBE_VERSION=%s is not a supported minor (%s in hack/k8s/versions)\n' \
      "$want" "$(kube_minors | tr '\n' ' ' | sed 's/ $//')" >&2
    return 1
  fi
  read -r KUBE_MINOR KUBE_RELEASE KUBE_MODULE <<<"$line"
  KUBE_MODULE="$k8s_root/$KUBE_MODULE"
  if [ "$KUBE_MODULE" = "$k8s_root/hack/tools" ]; then
    KUBE_BIN_DIR="$k8s_root/_output/bin"
  else
    KUBE_BIN_DIR="$k8s_root/_output/k8s/$KUBE_MINOR/bin"
  fi
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -euo pipefail
  case ${1:-} in
  minors) kube_minors ;;
  oldest) kube_minors | head -n 1 ;;
  newest) kube_minors | tail -n 1 ;;
  release) kube_resolve "${2:?minor}" && echo "$KUBE_RELEASE" ;;
  bin-dir) kube_resolve "${2:?minor}" && echo "$KUBE_BIN_DIR" ;;
  *)
    echo "usage: $0 minors|oldest|newest|release MINOR|bin-dir MINOR" >&2
    exit 2
    ;;
  esac
fi
