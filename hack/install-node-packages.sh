#!/usr/bin/env bash
# Installs what the local cluster's real node needs from Debian's packages:
# containerd (with ctr), runc, the CNI plugins (bridge, host-local, loopback),
# iproute2 (ip, for the node's bridge) and the static C library (the pause
# image's program is linked statically). Idempotent and quiet: it does nothing
# when everything is there, and prints apt's output only when apt fails.
#
#   hack/install-node-packages.sh          install what is missing (needs root)
#   hack/install-node-packages.sh --check  exit 1 and name what is missing
set -euo pipefail

CNI_BIN_DIR=${CNI_BIN_DIR:-/usr/lib/cni}

missing=()
need() { # package, then the files or commands that show it is installed
  local pkg=$1 what
  shift
  for what in "$@"; do
    case $what in
      /*) [ -e "$what" ] && continue ;;
      *) command -v "$what" >/dev/null 2>&1 && continue ;;
    esac
    missing+=("$pkg")
    return
  done
}
need containerd containerd ctr
need runc runc
need containernetworking-plugins "$CNI_BIN_DIR/bridge" "$CNI_BIN_DIR/host-local" "$CNI_BIN_DIR/loopback"
need iproute2 ip
need libc6-dev "/usr/lib/$(gcc -dumpmachine 2>/dev/null || echo x86_64-linux-gnu)/libc.a"
need gcc gcc
need ca-certificates /etc/ssl/certs/ca-certificates.crt

[ ${#missing[@]} -eq 0 ] && exit 0
if [ "${1:-}" = --check ]; then
  echo "[install-node-packages] missing Debian packages: ${missing[*]}" >&2
  exit 1
fi
if [ "$(id -u)" != 0 ]; then
  echo "[install-node-packages] ERROR: the real node needs Debian packages ${missing[*]}; as root run: apt-get install -y ${missing[*]}" >&2
  exit 1
fi
command -v apt-get >/dev/null 2>&1 || {
  echo "[install-node-packages] ERROR: no apt-get; install ${missing[*]} (or their equivalents) by hand" >&2
  exit 1
}

echo "[install-node-packages] installing ${missing[*]}"
# No service is started (apt_install's policy-rc.d refuses them; on a host with
# systemd, containerd's package would start containerd.service): the local
# cluster and the kind path run a containerd of their own.
# shellcheck source=host-state.sh
. "$(dirname "$0")/host-state.sh"
if ! apt_install "${missing[@]}"; then
  echo "[install-node-packages] ERROR: apt-get install ${missing[*]} failed" >&2
  exit 1
fi
missing=()
need containerd containerd ctr
need runc runc
need containernetworking-plugins "$CNI_BIN_DIR/bridge" "$CNI_BIN_DIR/host-local" "$CNI_BIN_DIR/loopback"
if [ ${#missing[@]} -gt 0 ]; then
  echo "[install-node-packages] ERROR: still missing after apt-get install: ${missing[*]}" >&2
  exit 1
fi
