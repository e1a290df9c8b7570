# shellcheck shell=bash
# The local cluster's real node (REAL_NODE=1), sourced by hack/local-cluster.sh,
# whose variables and functions it uses. See docs/development.md, "Local cluster".
#
# Beside kwok's fake node, a kubelet (built from k8s.io/kubernetes like the
# control plane) runs real containers through a containerd and runc of
# Debian's packages (hack/install-node-packages.sh), each with its own config,
# root, state, socket and cgroup parent under $CLUSTER_DIR/node, so that
# several clusters can run on one machine. kube-scheduler places pods.
#
# Networking: pods get their own network namespace on a Linux bridge with the
# CNI bridge plugin, on a /24 of their own (POD_SUBNET) with no default route,
# no NAT and no forwarding: a pod reaches the bridge's address and nothing
# else. The API server and the kubelet listen on that address
# (NODE_ADDRESS, the subnet's .1) instead of 127.0.0.1, so that pods can reach
# the API server; traffic stays on this machine.
#
# Placement: the kwok node is tainted kwok.x-k8s.io/node=fake:NoSchedule and
# the real node $REAL_NODE_TAINT:NoSchedule, so the scheduler places on them
# only pods that tolerate the taint; pods bound by spec.nodeName, as the kwok
# pods are, are not scheduled. Pods that tolerate neither stay Pending.
#
# Images cannot be pulled (there is no registry): the pause image is built at
# `up` from hack/node/pause.c, and `load-image` imports OCI archives
# (`make image-archive` writes podjanitor's).

# shellcheck disable=SC2034 # some are used by hack/local-cluster.sh
REAL_NODE_NAME=real-node-0
REAL_NODE_TAINT=local-cluster.podjanitor.io/real-node
KWOK_TAINT_KEY=kwok.x-k8s.io/node
PAUSE_IMAGE=local/pause:1
CNI_BIN_DIR=${CNI_BIN_DIR:-/usr/lib/cni}
# The kubelet sets host sysctls at start (KUBELET_SYSCTLS, as on every
# Kubernetes node); `up` saves them first and `down` restores them
# (hack/host-state.sh, which the kind path shares).
# shellcheck source=../host-state.sh
. "$root/hack/host-state.sh"
# Host directories the node's daemons create outside $NODE_DIR, each at a
# path it does not let us choose: the kubelet's log links (/var/log/containers),
# containerd's CNI result cache (/var/lib/cni/results) and its shims' sockets
# (/run/containerd/s). `up` records those that do not exist yet and `down`
# removes them again once empty (another checkout's node may still use them),
# children before parents.
NODE_HOST_DIRS="/var/log/containers /var/lib/cni/results /var/lib/cni /run/containerd/s /run/containerd"

# node_vars sets the real node's paths and addresses from REAL_NODE,
# POD_SUBNET, PORT_BASE and CLUSTER_DIR (after load_ports).
node_vars() {
  NODE_DIR="$CLUSTER_DIR/node"
  CONTAINERD_SOCK="$NODE_DIR/containerd.sock"
  CTR=(ctr --address "$CONTAINERD_SOCK" --namespace k8s.io)
  DEPLOY_DIR="$CLUSTER_DIR/deploy"
  local prefix=${POD_SUBNET%.0/24}
  case $POD_SUBNET in
    *.*.*.0/24) ;;
    *) die "POD_SUBNET=$POD_SUBNET: want a /24 such as 10.200.8.0/24" ;;
  esac
  NODE_ADDRESS="$prefix.1"
  POD_RANGE_START="$prefix.10"
  BRIDGE="pjbr$APISERVER_PORT"
  CGROUP_NAME="podjanitor-$APISERVER_PORT"
  CNI_NETWORK="podjanitor-local-$APISERVER_PORT"
}

# cgroup_hierarchies lists the mounted cgroup hierarchies (v1 and v2).
cgroup_hierarchies() {
  awk '$3 == "cgroup" || $3 == "cgroup2" {print $2}' /proc/self/mounts
}

node_check() {
  [ "$(id -u)" = 0 ] || die "the real node (REAL_NODE=1) needs root: containerd, runc and the kubelet create namespaces, mounts and cgroups"
  "$root/hack/install-node-packages.sh"
  local c
  for c in kubelet kube-scheduler; do
    [ -x "$KUBE_BIN_DIR/$c" ] || die "$KUBE_BIN_DIR/$c not found; build it first (${KUBE_VERSION:+KUBE_VERSION=$KUBE_VERSION }hack/build-tools.sh real-node)"
  done
  command -v gcc >/dev/null 2>&1 || die "gcc is needed to build the pause image"
  [ ${#CONTAINERD_SOCK} -lt 100 ] || die "CLUSTER_DIR is too long for a unix socket path: $CONTAINERD_SOCK"
  if [ -n "$(ip -o -4 addr show to "$POD_SUBNET" 2>/dev/null)" ] && ! ip link show "$BRIDGE" >/dev/null 2>&1; then
    die "POD_SUBNET=$POD_SUBNET is in use on this machine (ip addr); choose another POD_SUBNET"
  fi
}

# node_network creates the pods' bridge with the node's address on it; the
# API server and the kubelet listen there.
node_network() {
  if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
    ip link add name "$BRIDGE" type bridge || die "creating bridge $BRIDGE failed"
  fi
  if ! ip -o -4 addr show dev "$BRIDGE" | grep -q " $NODE_ADDRESS/24 "; then
    ip addr add "$NODE_ADDRESS/24" dev "$BRIDGE" || die "adding $NODE_ADDRESS/24 to $BRIDGE failed"
  fi
  ip link set "$BRIDGE" up || die "bringing $BRIDGE up failed"
}

# node_start starts containerd and the kubelet (the control plane is up),
# loads the pause image and waits until the node is Ready.
node_start() {
  mkdir -p "$NODE_DIR"/{containerd,cni/net.d,cni/ipam,kubelet,kubelet-pki,pod-logs,volume-plugins,images}
  local h
  while read -r h; do
    mkdir -p "$h/$CGROUP_NAME" || die "creating cgroup $h/$CGROUP_NAME failed"
    # A new cpuset cgroup has no CPUs or memory nodes: give it its parent's.
    if [ -f "$h/cpuset.cpus" ] && [ -f "$h/$CGROUP_NAME/cpuset.cpus" ]; then
      cat "$h/cpuset.cpus" >"$h/$CGROUP_NAME/cpuset.cpus"
      cat "$h/cpuset.mems" >"$h/$CGROUP_NAME/cpuset.mems"
    fi
  done < <(cgroup_hierarchies)

  cat >"$NODE_DIR/cni/net.d/10-podjanitor.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "$CNI_NETWORK",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$BRIDGE",
      "isGateway": false,
      "ipMasq": false,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "$POD_SUBNET", "rangeStart": "$POD_RANGE_START", "gateway": "$NODE_ADDRESS"}]],
        "dataDir": "$NODE_DIR/cni/ipam"
      }
    }
  ]
}
EOF

  # restrict_oom_score_adj: this machine may not lower a process's
  # oom_score_adj (runc fails with "failed to update /proc/self/oom_score_adj:
  # Permission denied"); with it containerd raises the values it is given to
  # its own instead.
  cat >"$NODE_DIR/containerd/config.toml" <<EOF
version = 2
root = "$NODE_DIR/containerd/root"
state = "$NODE_DIR/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "$CONTAINERD_SOCK"
[ttrpc]
  address = "$CONTAINERD_SOCK.ttrpc"
[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "docker.io/$PAUSE_IMAGE"
    stream_server_address = "127.0.0.1"
    stream_server_port = "$CRI_STREAM_PORT"
    restrict_oom_score_adj = true
    disable_apparmor = true
    netns_mounts_under_state_dir = true
    [plugins."io.containerd.grpc.v1.cri".containerd]
      snapshotter = "overlayfs"
      default_runtime_name = "runc"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
          BinaryName = "$(command -v runc)"
          Root = "$NODE_DIR/runc"
          SystemdCgroup = false
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "$CNI_BIN_DIR"
      conf_dir = "$NODE_DIR/cni/net.d"
  [plugins."io.containerd.internal.v1.opt"]
    path = "$NODE_DIR/containerd/opt"
EOF
  host_dirs_save "$NODE_DIR/host-dirs.created"
  say "starting containerd (socket $CONTAINERD_SOCK)"
  start_proc containerd -- --config "$NODE_DIR/containerd/config.toml"
  wait_for containerd "containerd to serve on $CONTAINERD_SOCK" containerd_serving

  say "building and loading the pause image $PAUSE_IMAGE"
  gcc -static -Os -o "$NODE_DIR/images/pause" "$root/hack/node/pause.c" ||
    die "building the pause program (gcc -static) failed"
  (cd "$root" && go run ./hack/image -kind pause -binary "$NODE_DIR/images/pause" \
    -name "$PAUSE_IMAGE" -o "$NODE_DIR/images/pause.tar") >/dev/null ||
    die "writing the pause image failed"
  load_images "$NODE_DIR/images/pause.tar"

  # The kubelet authenticates as system:node:$REAL_NODE_NAME (the Node
  # authorizer and NodeRestriction limit it to its own node and pods); the API
  # server authenticates to it with a client certificate of the client CA.
  write_kubeconfig "$NODE_DIR/kubelet.kubeconfig" "$(cat "$PKI/node.token")" "system:node:$REAL_NODE_NAME"
  cat >"$NODE_DIR/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_ADDRESS
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $KUBELET_HEALTHZ_PORT
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: $PKI/client-ca.crt}
authorization:
  mode: Webhook
containerRuntimeEndpoint: unix://$CONTAINERD_SOCK
# This machine kind has cgroup v1, which the kubelet only runs on when told.
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /$CGROUP_NAME
failSwapOn: false
# Lowering the kubelet's own oom_score_adj is not permitted here.
oomScoreAdj: 0
podLogsDir: $NODE_DIR/pod-logs
volumePluginDir: $NODE_DIR/volume-plugins
registerWithTaints:
  - key: $REAL_NODE_TAINT
    value: "true"
    effect: NoSchedule
# Pod syncs (and so ConfigMap volume updates) every 10s instead of every minute.
syncFrequency: 10s
maxPods: 30
# A shared development machine: evict only when memory or disk is nearly gone,
# and never collect the images (they cannot be pulled again).
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%
  nodefs.inodesFree: 1%
  imagefs.available: 1%
imageGCHighThresholdPercent: 100
# No iptables chains on the host (KUBE-IPTABLES-HINT, KUBE-FIREWALL,
# KUBE-KUBELET-CANARY): the kubelet makes them for kube-proxy and others,
# which this node does not run, and nothing would remove them at down.
makeIPTablesUtilChains: false
EOF
  sysctls_save "$NODE_DIR/sysctl.saved"
  say "starting kubelet (node $REAL_NODE_NAME at $NODE_ADDRESS, port $KUBELET_PORT)"
  start_proc kubelet -- \
    --config="$NODE_DIR/kubelet.yaml" \
    --kubeconfig="$NODE_DIR/kubelet.kubeconfig" \
    --root-dir="$NODE_DIR/kubelet" \
    --cert-dir="$NODE_DIR/kubelet-pki" \
    --hostname-override="$REAL_NODE_NAME" \
    --node-ip="$NODE_ADDRESS"
  wait_for kubelet "node $REAL_NODE_NAME to become Ready" node_ready "$REAL_NODE_NAME"
  # As for the kwok node: no node lifecycle controller lifts the not-ready
  # taint that admission put on the new node; keep only the node's own.
  api PATCH "/api/v1/nodes/$REAL_NODE_NAME" -H 'Content-Type: application/merge-patch+json' \
    --data "{\"spec\":{\"taints\":[{\"key\":\"$REAL_NODE_TAINT\",\"value\":\"true\",\"effect\":\"NoSchedule\"}]}}" >/dev/null ||
    fail_with_log kube-apiserver "setting the taints of $REAL_NODE_NAME failed (HTTP $API_CODE): $API_BODY"
  write_deploy_overlay
}

containerd_serving() { "${CTR[@]}" version >/dev/null 2>&1; }

# load_images imports OCI archives into the node's containerd.
load_images() {
  local f out
  for f; do
    [ -f "$f" ] || die "image archive $f not found"
    out=$("${CTR[@]}" images import "$f" 2>&1) || die "importing $f into containerd failed: $out"
    printf '%s\n' "$out" | sed 's/^/[local-cluster]   /'
  done
}

# write_deploy_overlay writes $CLUSTER_DIR/deploy, a kustomize overlay of
# artifacts/deploy for this cluster: the image loaded by `make image-archive`
# and `load-image`, the API server's address (there is no kube-proxy to make
# the kubernetes Service's address work), and a toleration of the real node's taint.
write_deploy_overlay() {
  mkdir -p "$DEPLOY_DIR"
  local base
  base=$(realpath -m --relative-to="$DEPLOY_DIR" "$root/artifacts/deploy")
  cat >"$DEPLOY_DIR/kustomization.yaml" <<EOF
# Written by hack/local-cluster.sh: artifacts/deploy for the local cluster in
# $CLUSTER_DIR, whose real node runs it. Load the image first
# (make image-archive && hack/local-cluster.sh load-image _output/images/podjanitor.tar).
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - $base
images:
  - name: podjanitor
    newName: local/podjanitor
    newTag: dev
patches:
  - path: local-cluster.yaml
EOF
  cat >"$DEPLOY_DIR/local-cluster.yaml" <<EOF
apiVersion: apps/v1
kind: Deployment
metadata:
  name: podjanitor
  namespace: podjanitor
spec:
  template:
    spec:
      tolerations:
        - key: $REAL_NODE_TAINT
          operator: Exists
          effect: NoSchedule
      containers:
        - name: podjanitor
          env:
            - name: KUBERNETES_SERVICE_HOST
              value: "$NODE_ADDRESS"
            - name: KUBERNETES_SERVICE_PORT
              value: "$APISERVER_PORT"
EOF
}

# node_stop stops the kubelet and containerd, then whatever they left: the
# containers' processes (by cgroup), containerd's shims (by socket), mounts
# under $NODE_DIR (overlay roots, volumes, network namespaces), the cgroups
# and the kubelet's log links; removes the host directories `up` found
# missing (host_dirs_save) and restores the sysctls. The bridge goes
# last (node_network_down): the control plane listens on its address.
node_stop() {
  stop_proc kubelet
  stop_proc containerd
  local h pids pid i
  # The shims' sockets (remove_shim_sockets), named before the shims are
  # killed: the ids from the live shims' command lines and the tasks in
  # containerd's state; the CRI's shim is its pod sandbox's, itself a task.
  local shims
  shims=$(node_shim_tasks)
  for i in 1 2 3 4 5 6 7 8 9 10; do
    pids=$(node_leftover_pids)
    [ -n "$pids" ] || break
    [ "$i" = 1 ] && say "stopping the real node's containers and shims"
    for pid in $pids; do kill -KILL "$pid" 2>/dev/null || true; done
    sleep 0.3
  done
  [ -z "$(node_leftover_pids)" ] || warn "processes of the real node still run: $(node_leftover_pids)"
  if [ -d "$NODE_DIR" ]; then
    local m
    for _ in 1 2 3; do
      while read -r m; do
        [ -n "$m" ] || continue
        umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
      done < <(awk -v d="$NODE_DIR/" 'index($5, d) == 1 {print $5}' /proc/self/mountinfo | sort -r)
    done
    m=$(awk -v d="$NODE_DIR/" 'index($5, d) == 1 {print $5}' /proc/self/mountinfo)
    [ -z "$m" ] || warn "still mounted under $NODE_DIR: $m"
  fi
  while read -r h; do
    [ -d "$h/$CGROUP_NAME" ] || continue
    for i in 1 2 3 4 5; do
      find "$h/$CGROUP_NAME" -depth -type d -exec rmdir {} \; 2>/dev/null || true
      [ -d "$h/$CGROUP_NAME" ] || break
      sleep 0.3
    done
    [ ! -d "$h/$CGROUP_NAME" ] || warn "could not remove cgroup $h/$CGROUP_NAME"
  done < <(cgroup_hierarchies)
  { echo "$shims"; node_shim_tasks; } | remove_shim_sockets "$CONTAINERD_SOCK"
  find /var/log/containers -maxdepth 1 -type l -lname "$NODE_DIR/*" -delete 2>/dev/null || true
  # containerd's CNI results of the node's sandboxes, each network's named
  # <network>-<sandbox id>-<interface>: ours, and the loopback's of the same
  # sandboxes (a sandbox not torn down before its containerd stopped).
  local f id
  for f in /var/lib/cni/results/"$CNI_NETWORK"-*; do
    [ -e "$f" ] || continue
    id=${f#/var/lib/cni/results/"$CNI_NETWORK"-}
    id=${id%-*}
    rm -f "$f" /var/lib/cni/results/cni-loopback-"$id"-lo
  done
  host_dirs_remove "$NODE_DIR/host-dirs.created"
  sysctls_restore "$NODE_DIR/sysctl.saved" || warn "could not restore the sysctls of $NODE_DIR/sysctl.saved"
}

# host_dirs_save FILE records which of NODE_HOST_DIRS do not exist, unless
# FILE does (a run that crashed left it with the list from before it).
host_dirs_save() {
  local file=$1 d
  [ -e "$file" ] && return 0
  mkdir -p "$(dirname "$file")"
  for d in $NODE_HOST_DIRS; do
    [ -e "$d" ] || printf '%s\n' "$d"
  done >"$file.tmp"
  mv "$file.tmp" "$file"
}

# host_dirs_remove FILE removes the directories FILE lists that are empty,
# in its order, then FILE.
host_dirs_remove() {
  local file=$1 d
  [ -f "$file" ] || return 0
  while read -r d; do
    [ -d "$d" ] && rmdir "$d" 2>/dev/null || true
  done <"$file"
  rm -f "$file"
}

node_network_down() {
  if ip link show "$BRIDGE" >/dev/null 2>&1; then
    ip link del "$BRIDGE" || warn "could not delete bridge $BRIDGE"
  fi
}

# node_shim_tasks prints "<namespace>/<id>" of the shims serving the node's
# containerd (from their command lines) and of the tasks in its state.
node_shim_tasks() {
  local f
  for f in /proc/[0-9]*/cmdline; do
    case $({ tr '\0' ' ' <"$f"; } 2>/dev/null) in
      *containerd-shim*" $CONTAINERD_SOCK "* | *containerd-shim*" $CONTAINERD_SOCK")
        tr '\0' '\n' <"$f" 2>/dev/null | awk '$0 == "-namespace" {getline; ns = $0} $0 == "-id" {getline; id = $0} END {if (ns != "" && id != "") print ns "/" id}' ;;
    esac
  done
  containerd_tasks "$NODE_DIR/containerd/state"
}

# node_leftover_pids prints the processes in the node's cgroups and the
# containerd shims serving its socket.
node_leftover_pids() {
  local h f pid
  while read -r h; do
    [ -d "$h/$CGROUP_NAME" ] || continue
    find "$h/$CGROUP_NAME" -name cgroup.procs -exec cat {} + 2>/dev/null
  done < <(cgroup_hierarchies)
  for f in /proc/[0-9]*/cmdline; do
    pid=${f#/proc/}
    pid=${pid%/cmdline}
    case $({ tr '\0' ' ' <"$f"; } 2>/dev/null) in
      *containerd-shim*" $CONTAINERD_SOCK "* | *containerd-shim*" $CONTAINERD_SOCK") printf '%s\n' "$pid" ;;
    esac
  done
}
