#!/usr/bin/env bash
# The sysctls a kind node writes come back (hack/kind/up.sh, hack/host-state.sh) after
# a kind cluster's success, failure, interrupt and crash, shown in seconds
# without Docker: a stub kind whose `create cluster` writes a sysctl as a kind
# node's kubelet does (kernel.keys.root_maxbytes, one more) and one as the
# node's systemd does at boot (fs.protected_fifos, 1 or 2), then succeeds,
# fails, or hangs until it is interrupted or SIGKILLed. hack/kind/test.sh runs
# it first. Needs root (it writes those sysctls, and puts them back).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
[ "$(id -u)" = 0 ] || { echo "hack/kind/test-sysctls.sh: needs root" >&2; exit 1; }
tmp=$(mktemp -d)
key=kernel.keys.root_maxbytes
was=$(sysctl -n $key)
key2=fs.protected_fifos
was2=$(sysctl -n $key2)
new2=$(( was2 == 1 ? 2 : 1 ))
saved="$root/_output/kind/sysctl.saved"
trap 'sysctl -q -w "$key=$was" "$key2=$was2"; rm -rf "$tmp" "$root/_output/kind/pj-sysctl-test.kubeconfig" "$root/_output/kind/pj-sysctl-test.cluster.yaml"' EXIT
[ ! -e "$saved" ] || { echo "hack/kind/test-sysctls.sh: $saved exists (a cluster of this checkout runs?)" >&2; exit 1; }
mkdir -p "$tmp/bin" "$tmp/state"
cat >"$tmp/bin/kind" <<STUB
#!/usr/bin/env bash
state=$tmp/state
case "\$1 \$2" in
  "get clusters") cat "\$state/clusters" 2>/dev/null || true ;;
  "get kubeconfig") echo "apiVersion: v1" ;;
  "create cluster")
    sysctl -q -w "$key=\$(( \$(sysctl -n $key) + 1 ))" "$key2=$new2"
    case \$(cat "\$state/mode") in
      fail) exit 1 ;;
      hang) sleep 120 ;;
    esac
    echo pj-sysctl-test >>"\$state/clusters" ;;
  "delete cluster") : >"\$state/clusters" ;;
esac
STUB
# A created cluster's node reaches its API server through the Service at once.
printf '#!/bin/sh\necho 10.96.0.1\n' >"$tmp/bin/kubectl"
printf '#!/bin/sh\n[ "$1" != inspect ] || echo true\n' >"$tmp/bin/docker"
chmod +x "$tmp/bin/kind" "$tmp/bin/kubectl" "$tmp/bin/docker"
failed=0
up() { PATH="$tmp/bin:$PATH" KIND_BIN_DIR="$tmp/bin" KIND_NODE_IMAGE=stock hack/kind/up.sh "$@"; }
check() {
  local name=$1 now now2
  now=$(sysctl -n $key)
  now2=$(sysctl -n $key2)
  if [ "$now" = "$was" ] && [ "$now2" = "$was2" ] && [ ! -e "$saved" ]; then
    echo "ok   $name"
  else
    echo "FAIL $name: $key=$now (want $was), $key2=$now2 (want $was2), $saved $( [ -e "$saved" ] && echo left || echo gone)"
    failed=1
    sysctl -q -w "$key=$was" "$key2=$was2"
    rm -f "$saved"
  fi
}
echo ok >"$tmp/state/mode"
up up pj-sysctl-test >/dev/null 2>&1 || { echo "FAIL success: up failed"; failed=1; }
[ "$(sysctl -n $key)" != "$was" ] && [ "$(sysctl -n $key2)" = "$new2" ] || { echo "FAIL success: the stub's writes did not happen"; failed=1; }
up down pj-sysctl-test >/dev/null 2>&1
check "success: back at down"
echo fail >"$tmp/state/mode"
! up up pj-sysctl-test >/dev/null 2>&1 || { echo "FAIL failure: up succeeded"; failed=1; }
check "failure: back when create fails"
echo hang >"$tmp/state/mode"
setsid bash -c 'KIND_BIN_DIR="$0/bin" KIND_NODE_IMAGE=stock exec hack/kind/up.sh up pj-sysctl-test' "$tmp" >/dev/null 2>&1 &
pid=$!
for _ in $(seq 50); do [ "$(sysctl -n $key)" != "$was" ] && break; sleep 0.1; done
# SIGTERM to the process group, as a CI timeout or a closed terminal (HUP)
# sends it; a Ctrl-C's SIGINT takes the same trap.
kill -TERM -- -"$pid"
wait "$pid" 2>/dev/null || true
check "interrupt: back after a SIGTERM to the group"
setsid bash -c 'KIND_BIN_DIR="$0/bin" KIND_NODE_IMAGE=stock exec hack/kind/up.sh up pj-sysctl-test' "$tmp" >/dev/null 2>&1 &
pid=$!
for _ in $(seq 50); do [ "$(sysctl -n $key)" != "$was" ] && break; sleep 0.1; done
kill -KILL -- -"$pid"
wait "$pid" 2>/dev/null || true
up down pj-sysctl-test >/dev/null 2>&1
check "crash: back at the next down after a SIGKILL"
exit $failed
