#!/usr/bin/env bash
# Creates podjanitor's demo workload in the local cluster (hack/local-cluster.sh):
# namespace podjanitor-demo with pods that podjanitor removes at known times,
# plus pods it must leave alone. Pods run on the kwok node kwok-node-0; their
# fates (complete, evict) come from the kwok Stages in hack/kwok/.
#
# Uses only bash and curl. It talks to the local cluster's kubeconfig
# ($CLUSTER_DIR/kubeconfig, default _output/local/kubeconfig) and ignores
# $KUBECONFIG on purpose, so it never creates demo pods in a real cluster.
# Environment: CLUSTER_DIR, DEMO_KUBECONFIG (a token kubeconfig like the local
# cluster's), DEMO_NAMESPACE (default podjanitor-demo), NODE_NAME (kwok-node-0).
# Re-running it replaces the demo pods (old ones are force-deleted first).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cluster_dir=${CLUSTER_DIR:-_output/local}
case $cluster_dir in /*) ;; *) cluster_dir="$root/$cluster_dir" ;; esac
kubeconfig=${DEMO_KUBECONFIG:-$cluster_dir/kubeconfig}
ns=${DEMO_NAMESPACE:-podjanitor-demo}
node=${NODE_NAME:-kwok-node-0}
prefix=podjanitor.io

say() { printf '[demo] %s\n' "$*"; }
die() { printf '[demo] ERROR: %s\n' "$*" >&2; exit 1; }

[ -f "$kubeconfig" ] || die "no kubeconfig at $kubeconfig; start the local cluster first (hack/local-cluster.sh up)"
server=$(sed -n 's/^ *server: *//p' "$kubeconfig" | head -n 1)
ca_data=$(sed -n 's/^ *certificate-authority-data: *//p' "$kubeconfig" | head -n 1)
token=$(sed -n 's/^ *token: *//p' "$kubeconfig" | head -n 1)
[ -n "$server" ] && [ -n "$ca_data" ] && [ -n "$token" ] ||
  die "$kubeconfig is not a token kubeconfig with certificate-authority-data (like the local cluster's)"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf '%s' "$ca_data" | base64 -d >"$tmp/ca.crt" 2>/dev/null ||
  printf '%s' "$ca_data" | base64 -D >"$tmp/ca.crt" # macOS
(umask 077 && printf 'Authorization: Bearer %s\n' "$token" >"$tmp/auth.header")

# api METHOD PATH [curl args...]: sets API_CODE and API_BODY; true on 2xx.
api() {
  local method=$1 path=$2 out
  shift 2
  API_CODE=000 API_BODY=
  out=$(curl -sS --max-time 10 --cacert "$tmp/ca.crt" -H @"$tmp/auth.header" \
    -X "$method" -w '\n%{http_code}' "$@" "$server$path" 2>&1) || return 1
  API_CODE=${out##*$'\n'}
  API_BODY=${out%$'\n'*}
  case $API_CODE in 2??) return 0 ;; *) return 1 ;; esac
}

post_yaml() { # path: body on stdin
  api POST "$1" -H 'Content-Type: application/yaml' --data-binary @-
}

epoch_to_rfc3339() { # GNU date, else BSD date
  date -u -d "@$1" +%Y-%m-%dT%H:%M:%SZ 2>/dev/null || date -u -r "$1" +%Y-%m-%dT%H:%M:%SZ
}
clock() { date -d "@$1" +%H:%M:%S 2>/dev/null || date -r "$1" +%H:%M:%S; }

api GET /readyz || die "the API server at $server is not ready (HTTP $API_CODE): $API_BODY"

# Namespace (kept if it exists; its old demo pods are removed first).
if api GET "/api/v1/namespaces/$ns"; then
  if printf '%s' "$API_BODY" | tr -d ' \n' | grep -q '"phase":"Terminating"'; then
    say "namespace $ns is terminating; waiting for it to go"
    for _ in $(seq 1 120); do api GET "/api/v1/namespaces/$ns" || break; sleep 0.5; done
  else
    say "namespace $ns exists; force-deleting its old demo pods"
    api DELETE "/api/v1/namespaces/$ns/pods?labelSelector=app.kubernetes.io%2Fpart-of%3Dpodjanitor-demo&gracePeriodSeconds=0" >/dev/null ||
      die "deleting old demo pods failed (HTTP $API_CODE): $API_BODY"
    for _ in $(seq 1 60); do
      api GET "/api/v1/namespaces/$ns/pods?labelSelector=app.kubernetes.io%2Fpart-of%3Dpodjanitor-demo" || break
      printf '%s' "$API_BODY" | tr -d ' \n' | grep -q '"items":\[\]' && break
      sleep 0.5
    done
  fi
fi
if ! api GET "/api/v1/namespaces/$ns"; then
  say "creating namespace $ns"
  post_yaml /api/v1/namespaces <<EOF || [ "$API_CODE" = 409 ] || die "creating namespace $ns failed (HTTP $API_CODE): $API_BODY"
apiVersion: v1
kind: Namespace
metadata:
  name: $ns
  labels:
    app.kubernetes.io/part-of: podjanitor-demo
EOF
fi

say "waiting for the default ServiceAccount in $ns"
for i in $(seq 1 120); do
  api GET "/api/v1/namespaces/$ns/serviceaccounts/default" && break
  [ "$i" -lt 120 ] || die "no default ServiceAccount in $ns after 60s; is kube-controller-manager running?"
  sleep 0.5
done

# pod NAME RESTART-POLICY LABELS ANNOTATIONS DESCRIPTION EXPECTED
# LABELS/ANNOTATIONS: "key=value" pairs separated by ';' (values without ';').
summary=()
yq() { local s=${1//\'/\'\'}; printf "'%s'" "$s"; } # YAML single-quoted string
pod() {
  local name=$1 restart=$2 labels=$3 annotations=$4 what=$5 expect=$6 kv x
  {
    printf 'apiVersion: v1\nkind: Pod\nmetadata:\n  name: %s\n  namespace: %s\n' "$name" "$ns"
    printf '  labels:\n    app.kubernetes.io/part-of: podjanitor-demo\n'
    IFS=';' read -r -a kv <<<"$labels"
    for x in ${kv[@]+"${kv[@]}"}; do printf '    %s: %s\n' "${x%%=*}" "$(yq "${x#*=}")"; done
    printf '  annotations:\n    demo.podjanitor.io/description: %s\n' "$(yq "$what")"
    IFS=';' read -r -a kv <<<"$annotations"
    for x in ${kv[@]+"${kv[@]}"}; do printf '    %s: %s\n' "${x%%=*}" "$(yq "${x#*=}")"; done
    printf 'spec:\n  nodeName: %s\n  restartPolicy: %s\n  terminationGracePeriodSeconds: 5\n' "$node" "$restart"
    printf '  containers:\n  - name: main\n    image: registry.k8s.io/pause:3.10\n'
  } >"$tmp/pod.yaml"
  post_yaml "/api/v1/namespaces/$ns/pods" <"$tmp/pod.yaml" || die "creating pod $name failed (HTTP $API_CODE): $API_BODY"
  summary+=("$(printf '  %-22s %-44s %s' "$name" "$what" "$expect")")
}

now=$(date +%s)
expires=$(epoch_to_rfc3339 $((now + 90)))
say "creating demo pods on $node"
pod ttl-20s Always "" "$prefix/ttl=20s" "ttl 20s" "removed ~$(clock $((now + 20)))"
pod ttl-40s Always "" "$prefix/ttl=40s" "ttl 40s" "removed ~$(clock $((now + 40)))"
pod ttl-60s Always "" "$prefix/ttl=60s" "ttl 60s" "removed ~$(clock $((now + 60)))"
pod expires-at-90s Always "" "$prefix/expires-at=$expires" "expires-at $expires" "removed ~$(clock $((now + 90)))"
pod completed-a Never "e2e.podjanitor.io/fate=complete" \
  "$prefix/ttl-after-finished=30s;e2e.podjanitor.io/fate-after=5s" \
  "completes after 5s; ttl-after-finished 30s" "removed ~$(clock $((now + 35)))"
pod completed-b Never "e2e.podjanitor.io/fate=complete" \
  "$prefix/ttl-after-finished=30s;e2e.podjanitor.io/fate-after=20s" \
  "completes after 20s; ttl-after-finished 30s" "removed ~$(clock $((now + 50)))"
pod evicted Always "e2e.podjanitor.io/fate=evict" \
  "$prefix/ttl-after-finished=45s;e2e.podjanitor.io/fate-after=5s" \
  "evicted after 5s; ttl-after-finished 45s" "removed ~$(clock $((now + 50)))"
pod keep Always "" "$prefix/keep=true;$prefix/ttl=10s" "keep=true vetoes ttl 10s" "kept"
pod invalid-ttl Always "" "$prefix/ttl=3x" "ttl \"3x\" does not parse" "kept, Warning event"
pod no-annotations Always "" "" "no podjanitor annotations" "kept"

say "created ${#summary[@]} pods in namespace $ns at $(clock "$now"):"
printf '  %-22s %-44s %s\n' POD WHAT EXPECTED
printf '%s\n' "${summary[@]}"
