#!/usr/bin/env bash
# The host state the project's scripts may change, recorded and compared:
# sourced by hack/node/real-node.sh and hack/kind/*.sh for the sysctls a
# kubelet writes, run by .ci/run and hack/kind/test-crash.sh for the check
# that a run leaves the host as it found it.
#
#   hack/host-state.sh snapshot DIR    write the host's state into DIR
#   hack/host-state.sh compare A B     print what differs between two snapshots;
#                                      exit 1 when anything does
#
# A snapshot holds:
#   sysctl      `sysctl -a`, less the keys that change by themselves (below)
#   iptables    iptables-save and ip6tables-save, every table, without counters
#   links       `ip -o link`: name, kind flags, master, MTU, state; no counters
#   mounts      /proc/mounts
#   processes   the command lines of the processes that are ours: the
#               programs our scripts start (dockerd, containerd, kubelet, kind,
#               the control plane, podjanitor, ...), any whose command line
#               names the checkout, and those in our cgroups (podjanitor-*: the
#               containers of kind nodes and the real node); not kernel threads,
#               not this script's callers
#   files       what lies in the host paths our scripts or their daemons write
#               outside the checkout (/etc/docker, /run/docker, the Docker
#               socket, policy-rc.d; and, shared with other checkouts' real
#               nodes, /var/log/containers, /var/lib/cni, /etc/cni, /run/containerd)
#
# HOST_STATE_SCOPE=DIR narrows links, mounts and processes to what is this
# checkout's on a machine others share: mounts and processes that name DIR,
# links named in DIR/kind/links (the names hack/kind/dockerd.sh chose) and the
# veths on them, processes in the cgroup DIR/kind/cgroup names; the files
# that other checkouts' nodes write too are left out. The sysctls are then the ones our nodes write alone (NODE_SYSCTLS).
#
# Sysctls left out of a full snapshot, each because it changes without anyone
# setting it: fs.dentry-state, fs.inode-nr, fs.inode-state, fs.file-nr,
# fs.aio-nr, fs.quota.* (counters of the kernel's caches and handles),
# kernel.random.* (entropy, uuids), kernel.ns_last_pid, kernel.pty.nr (counters),
# kernel.perf_event_max_sample_rate (the kernel lowers it itself),
# net.netfilter.nf_conntrack_count (a counter), and the per-interface keys
# net.ipv4/ipv6.conf.IF.* and .neigh.IF.* of interfaces other than all,
# default and lo (they come and go with their links, which `links` compares).

# The kubelet sets these host sysctls at start (as on every Kubernetes node):
# the real node's (hack/node/real-node.sh) and a kind node's, whose /proc/sys
# is the host's.
KUBELET_SYSCTLS="vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops kernel.keys.root_maxkeys kernel.keys.root_maxbytes"
# A kind node's systemd (PID 1 of the node container, whose /proc/sys is the
# host's) writes these at boot: fs.file-max (and fs.nr_open where it is built
# to) raised to their maxima, and the node image's sysctl.d files (procps's
# 99-protect-links.conf: fs.protected_*). None is namespaced.
KIND_NODE_SYSCTLS="fs.file-max fs.nr_open fs.protected_fifos fs.protected_hardlinks fs.protected_regular fs.protected_symlinks"
# NODE_SYSCTLS are the ones a node of ours may write, saved and restored.
NODE_SYSCTLS="$KUBELET_SYSCTLS $KIND_NODE_SYSCTLS"

# sysctls_save FILE: record the sysctls a node writes (NODE_SYSCTLS) in FILE
# unless it exists (a run that crashed left it with the values from before
# it; keep those).
sysctls_save() {
  local file=$1 s
  [ -s "$file" ] && return 0
  mkdir -p "$(dirname "$file")"
  for s in $NODE_SYSCTLS; do
    printf '%s=%s\n' "$s" "$(sysctl -n "$s")"
  done >"$file.tmp"
  mv "$file.tmp" "$file"
}

# containerd_tasks STATE prints "<namespace>/<id>" of the tasks in a
# containerd's state directory (its runtime v2 bundles).
containerd_tasks() {
  local t
  for t in "$1"/io.containerd.runtime.v2.task/*/*; do
    [ -d "$t" ] && printf '%s\n' "${t#"$1"/io.containerd.runtime.v2.task/}"
  done
  return 0
}

# remove_shim_sockets ADDRESS removes the sockets of the shims of the
# containerd at ADDRESS whose tasks, "<namespace>/<id>", stdin lists:
# containerd 1.6 names them /run/containerd/s/<sha256 of
# "<address>/<namespace>/<id>">, and a killed shim leaves its own. The caller
# makes sure that none of those shims runs.
remove_shim_sockets() {
  local t
  while read -r t; do
    [ -n "$t" ] || continue
    rm -f "/run/containerd/s/$(printf '%s' "$1/$t" | sha256sum | cut -c1-64)"
  done
}

# sysctls_restore FILE: write the values of FILE back, then remove it.
# Returns 1 (FILE kept) when a value cannot be written.
sysctls_restore() {
  local file=$1 saved
  [ -s "$file" ] || return 0
  mapfile -t saved <"$file"
  sysctl -q -w "${saved[@]}" >/dev/null 2>&1 || return 1
  rm -f "$file"
}

# pid_cmdline PID: its command line, the arguments joined by spaces.
pid_cmdline() {
  if [ -r "/proc/$1/cmdline" ]; then
    tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null || true
  else
    ps -o command= -p "$1" 2>/dev/null || true
  fi
}

# owned_pid_in PIDFILE NAME DIR: prints the pid in PIDFILE when that process
# runs and is ours: the program NAME (by path or name) with DIR/ on its command
# line. A pid reused by an unrelated process after a crash or reboot is not
# ours, and nothing may signal it.
owned_pid_in() {
  local f=$1 name=$2 dir=$3 pid cl
  [ -s "$f" ] || return 1
  pid=$(cat "$f" 2>/dev/null) || return 1
  case $pid in '' | *[!0-9]*) return 1 ;; esac
  kill -0 "$pid" 2>/dev/null || return 1
  cl=$(pid_cmdline "$pid")
  case $cl in
    "$name "*"$dir/"* | */"$name "*"$dir/"*) printf '%s\n' "$pid" ;;
    *) return 1 ;;
  esac
}

# apt_install PACKAGE...: apt-get install without starting any service: a
# policy-rc.d that refuses (exit 101, honoured by invoke-rc.d and
# deb-systemd-invoke) is in place while apt runs, unless one is there already;
# it is removed after, on failure and interrupt too. apt's output is shown on
# failure only.
apt_install() {
  local policy=/usr/sbin/policy-rc.d ours=false out status=0
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\n# hack/host-state.sh apt_install: no service starts while it installs\nexit 101\n' >"$policy"
    chmod 0755 "$policy"
    ours=true
    trap 'rm -f /usr/sbin/policy-rc.d' EXIT
  fi
  out=$( (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@") 2>&1) || status=$?
  if $ours; then
    rm -f "$policy"
    trap - EXIT
  fi
  [ $status = 0 ] || printf '%s\n' "$out" >&2
  return $status
}

host_sysctls() {
  if [ -n "${HOST_STATE_SCOPE:-}" ]; then
    local s
    for s in $NODE_SYSCTLS net.ipv4.ip_forward; do printf '%s = %s\n' "$s" "$(sysctl -n "$s")"; done
    return
  fi
  sysctl -a 2>/dev/null | grep -Ev '^(fs\.(dentry-state|inode-nr|inode-state|file-nr|aio-nr|quota\.)|kernel\.random\.|kernel\.(ns_last_pid|pty\.nr|perf_event_max_sample_rate) |net\.netfilter\.nf_conntrack_count )' |
    grep -Ev '^net\.ipv[46]\.(conf|neigh)\.' || true
  sysctl -a 2>/dev/null | grep -E '^net\.ipv[46]\.(conf|neigh)\.(all|default|lo)\.' || true
}

host_iptables() {
  local save
  for save in iptables-save ip6tables-save; do
    command -v "$save" >/dev/null 2>&1 || continue
    echo "## $save"
    "$save" 2>&1 | sed -e '/^#/d' -e 's/ \[[0-9]*:[0-9]*\]$//'
  done
}

# scope_links: the links this checkout's scripts make (DIR/kind/links) and
# the veths whose master is one of them.
scope_links() {
  local f="$HOST_STATE_SCOPE/kind/links"
  [ -s "$f" ] || return 0
  local names
  names=$(tr '\n' '|' <"$f")
  names=${names%|}
  ip -o link show | awk -F': ' -v re="^($names)(@|$)" '$2 ~ re {print; next} / master / {split($0, a, " master "); split(a[2], b, " "); if (b[1] ~ re) print}'
}

host_links() {
  local lines
  if [ -n "${HOST_STATE_SCOPE:-}" ]; then lines=$(scope_links); else lines=$(ip -o link show); fi
  # name, flags, mtu, master, state; not the index (it grows) nor counters.
  printf '%s\n' "$lines" | sed -n 's/^[0-9]*: \([^:]*\): \(<[^>]*>\) mtu \([0-9]*\).*/\1 \2 mtu \3/p' | sed 's/@if[0-9]*//' | sort
}

host_mounts() {
  if [ -n "${HOST_STATE_SCOPE:-}" ]; then
    grep -F -- "$HOST_STATE_SCOPE/" /proc/mounts || true
  else
    cat /proc/mounts
  fi | sort
}

OUR_PROGRAMS='dockerd|docker-proxy|containerd|containerd-shim.*|runc|kubelet|kube-apiserver|kube-controller-manager|kube-scheduler|kube-proxy|etcd|kwok|kind|podjanitor|prometheus|mmdebstrap'

# host_processes prints the command lines of our processes (sorted), leaving
# out this shell and its ancestors (the run that takes the snapshot).
host_processes() {
  local skip=" " p=$$
  while [ -n "$p" ] && [ "$p" != 0 ]; do
    skip+="$p "
    p=$(awk '{print $4}' "/proc/$p/stat" 2>/dev/null) || break
  done
  local f pid cl comm cgroup=
  [ -z "${HOST_STATE_SCOPE:-}" ] || cgroup=$(cat "$HOST_STATE_SCOPE/kind/cgroup" 2>/dev/null || true)
  for f in /proc/[0-9]*; do
    pid=${f#/proc/}
    case $skip in *" $pid "*) continue ;; esac
    cl=$( { tr '\0' ' ' <"$f/cmdline"; } 2>/dev/null) || continue
    [ -n "$cl" ] || continue # a kernel thread
    case $cl in *"host-state.sh snapshot "*) continue ;; esac # this one's subshells
    comm=$(cat "$f/comm" 2>/dev/null) || continue
    if [ -n "${HOST_STATE_SCOPE:-}" ]; then
      case $cl in *"$HOST_STATE_SCOPE/"*) printf '%s\n' "$cl" ;; esac
      [ -z "$cgroup" ] || ! grep -q ":/$cgroup/" "$f/cgroup" 2>/dev/null || printf '%s (in cgroup %s)\n' "$cl" "$cgroup"
    elif [[ $comm =~ ^($OUR_PROGRAMS)$ ]] || [[ $cl == *"${HOST_STATE_ROOT:-/nonexistent}/"* ]]; then
      printf '%s\n' "$cl"
    elif grep -q ':/podjanitor-' "$f/cgroup" 2>/dev/null; then
      printf '%s (in a podjanitor-* cgroup)\n' "$cl" # a kind node's or the real node's containers
    fi
  done | sort
}

HOST_FILES="/etc/docker /run/docker /run/docker.sock /var/run/docker.sock /usr/sbin/policy-rc.d"
# Written by every containerd and kubelet, the local cluster's real nodes too:
# in a full snapshot only.
HOST_SHARED_FILES="/var/log/containers /var/lib/cni /etc/cni /run/containerd"
host_files() {
  local p all=$HOST_FILES
  [ -n "${HOST_STATE_SCOPE:-}" ] || all="$all $HOST_SHARED_FILES"
  for p in $all; do
    [ -e "$p" ] || [ -L "$p" ] || continue
    find "$p" -maxdepth 3 2>/dev/null | sort
  done
}

host_snapshot() {
  local dir=$1
  mkdir -p "$dir"
  host_sysctls >"$dir/sysctl"
  host_iptables >"$dir/iptables"
  host_links >"$dir/links"
  host_mounts >"$dir/mounts"
  host_processes >"$dir/processes"
  host_files >"$dir/files"
}

host_compare() {
  local a=$1 b=$2 part status=0
  for part in sysctl iptables links mounts processes files; do
    [ -f "$a/$part" ] || continue
    if ! cmp -s "$a/$part" "$b/$part"; then
      echo "host state changed: $part (< before, > after)"
      diff "$a/$part" "$b/$part" | grep '^[<>]' | head -40
      status=1
    fi
  done
  return $status
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -euo pipefail
  HOST_STATE_ROOT=${HOST_STATE_ROOT:-$(cd "$(dirname "$0")/.." && pwd)}
  case ${1:-} in
    snapshot)
      [ $# = 2 ] || { echo "usage: $0 snapshot DIR" >&2; exit 2; }
      host_snapshot "$2"
      ;;
    compare)
      [ $# = 3 ] || { echo "usage: $0 compare BEFORE AFTER" >&2; exit 2; }
      host_compare "$2" "$3"
      ;;
    *)
      echo "usage: $0 snapshot DIR | compare BEFORE AFTER" >&2
      exit 2
      ;;
  esac
fi
