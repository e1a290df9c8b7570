#!/usr/bin/env bash
# Local Kubernetes control plane for podjanitor: etcd, kube-apiserver,
# kube-controller-manager and kwok (one fake Node, kwok-node-0), all on
# 127.0.0.1, built from upstream Go modules by hack/build-tools.sh. With
# REAL_NODE=1 also a real node, real-node-0 (kubelet, containerd, runc), and
# kube-scheduler; see hack/node/real-node.sh.
#
#   hack/local-cluster.sh up       start it (idempotent) and wait until it is usable
#   hack/local-cluster.sh down     stop the processes it started and remove its state
#   hack/local-cluster.sh status   show what runs; exit 0 only if the cluster is up
#   hack/local-cluster.sh env      print `export KUBECONFIG=...`
#   hack/local-cluster.sh load-image ARCHIVE...
#                                  import OCI image archives into the real node
#   hack/local-cluster.sh stop-apiserver
#                                  stop kube-apiserver alone (an outage; the fault
#                                  tests use it); the rest keeps running
#   hack/local-cluster.sh start-apiserver [FLAG...]
#                                  start it again with the command line `up` gave
#                                  it, plus FLAGs (e.g. --watch-cache=false), and
#                                  wait until it is ready
#
# Environment (all optional):
#   CLUSTER_DIR     state dir, relative to the repo root unless absolute
#                   (default _output/local); kubeconfig at $CLUSTER_DIR/kubeconfig,
#                   logs in $CLUSTER_DIR/logs/, PIDs in $CLUSTER_DIR/pids/
#   PORT_BASE       base for the default ports below (default 26400)
#   APISERVER_PORT  kube-apiserver https port        (default PORT_BASE+43 = 26443)
#   ETCD_PORT       etcd client port                 (default PORT_BASE+79 = 26479)
#   ETCD_PEER_PORT  etcd peer port                   (default PORT_BASE+80 = 26480)
#   KCM_PORT        kube-controller-manager https port (default PORT_BASE+57 = 26457)
#   BIN_DIR         where the binaries are (default _output/bin)
#   KUBE_VERSION    the Kubernetes minor of kube-apiserver, kube-controller-manager,
#                   kube-scheduler and the kubelet, one of hack/k8s/versions
#                   (default: the newest, from BIN_DIR); an older minor's come from
#                   _output/k8s/MINOR/bin (KUBE_VERSION=MINOR hack/build-tools.sh).
#                   etcd and kwok are the same for every minor.
#   REAL_NODE       1: also run the real node and kube-scheduler (needs root;
#                   installs containerd, runc and the CNI plugins from Debian's
#                   packages if they are missing). The API server then listens
#                   on the node's bridge address instead of 127.0.0.1.
#   POD_SUBNET      the real node's pods' /24 (default 10.200.<PORT_BASE/100 % 256>.0/24);
#                   its .1 is the node's and the API server's address
#   SCHEDULER_PORT, KUBELET_PORT, KUBELET_HEALTHZ_PORT, CRI_STREAM_PORT
#                   (default PORT_BASE+59, +50, +48, +51)
#   READY_TIMEOUT   seconds to wait for each component (default 120)
#   STOP_TIMEOUT    seconds `down` waits for a process after SIGTERM before
#                   SIGKILL (default 20)
# Two instances with different CLUSTER_DIR and ports can run at the same time.
# Once up, the ports are read back from $CLUSTER_DIR/cluster.env, so status,
# env and down only need CLUSTER_DIR.
#
# The kubeconfig authenticates with a static admin token (group system:masters)
# and verifies the API server with the CA of its self-signed serving cert.
# Pods run on the fake node when they set spec.nodeName: kwok-node-0; the node
# is tainted kwok.x-k8s.io/node=fake:NoSchedule, so that a scheduler (with
# REAL_NODE=1) places nothing there. Their lifecycle comes from the kwok
# Stages in hack/kwok/ (see hack/kwok/README.md).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

abspath() { # path relative to the repo root unless absolute, without trailing /
  local p=$1
  case $p in /*) ;; *) p="$root/$p" ;; esac
  while [ "${#p}" -gt 1 ] && [ "${p%/}" != "$p" ]; do p=${p%/}; done
  printf '%s\n' "$p"
}

CLUSTER_DIR=$(abspath "${CLUSTER_DIR:-_output/local}")
BIN_DIR=$(abspath "${BIN_DIR:-_output/bin}")
STAGE_DIR="$root/hack/kwok"
READY_TIMEOUT=${READY_TIMEOUT:-120}
STOP_TIMEOUT=${STOP_TIMEOUT:-20}
NODE_NAME=kwok-node-0
NODE_IP=10.1.0.1   # fake; pods get IPs from 10.0.0.0/16
MARKER="$CLUSTER_DIR/.podjanitor-local-cluster"
STATE_ENV="$CLUSTER_DIR/cluster.env"
PKI="$CLUSTER_DIR/pki"
KUBECONFIG_FILE="$CLUSTER_DIR/kubeconfig"
# kube-apiserver generates its self-signed serving cert in its cert dir: the
# file holds the serving cert followed by the CA that signed it; CA_FILE is
# that CA alone (clients and kube-controller-manager's --root-ca-file).
SERVING_CERT="$PKI/apiserver/apiserver.crt"
CA_FILE="$PKI/ca.crt"
AUTH_HEADER_FILE="$PKI/admin-auth.header"

say() { printf '[local-cluster] %s\n' "$*"; }
warn() { printf '[local-cluster] WARNING: %s\n' "$*" >&2; }
die() { printf '[local-cluster] ERROR: %s\n' "$*" >&2; exit 1; }

# Ports asked for in the environment (captured before a state file is read).
ENV_PORT_BASE=${PORT_BASE:-26400}
ENV_APISERVER_PORT=${APISERVER_PORT:-$((ENV_PORT_BASE + 43))}
ENV_ETCD_PORT=${ETCD_PORT:-$((ENV_PORT_BASE + 79))}
ENV_ETCD_PEER_PORT=${ETCD_PEER_PORT:-$((ENV_PORT_BASE + 80))}
ENV_KCM_PORT=${KCM_PORT:-$((ENV_PORT_BASE + 57))}
ENV_SCHEDULER_PORT=${SCHEDULER_PORT:-$((ENV_PORT_BASE + 59))}
ENV_KUBELET_PORT=${KUBELET_PORT:-$((ENV_PORT_BASE + 50))}
ENV_KUBELET_HEALTHZ_PORT=${KUBELET_HEALTHZ_PORT:-$((ENV_PORT_BASE + 48))}
ENV_CRI_STREAM_PORT=${CRI_STREAM_PORT:-$((ENV_PORT_BASE + 51))}
ENV_REAL_NODE=${REAL_NODE:-0}
ENV_KUBE_VERSION=${KUBE_VERSION:-}
ENV_POD_SUBNET=${POD_SUBNET:-10.200.$(((ENV_PORT_BASE / 100) % 256)).0/24}

# shellcheck source=k8s/versions.sh
. "$root/hack/k8s/versions.sh"
# shellcheck source=node/real-node.sh
. "$root/hack/node/real-node.sh"

load_ports() {
  # An existing instance's ports (from its state file) win over the environment.
  APISERVER_PORT=$ENV_APISERVER_PORT ETCD_PORT=$ENV_ETCD_PORT
  ETCD_PEER_PORT=$ENV_ETCD_PEER_PORT KCM_PORT=$ENV_KCM_PORT
  SCHEDULER_PORT=$ENV_SCHEDULER_PORT KUBELET_PORT=$ENV_KUBELET_PORT
  KUBELET_HEALTHZ_PORT=$ENV_KUBELET_HEALTHZ_PORT CRI_STREAM_PORT=$ENV_CRI_STREAM_PORT
  REAL_NODE=$ENV_REAL_NODE POD_SUBNET=$ENV_POD_SUBNET KUBE_VERSION=$ENV_KUBE_VERSION
  if [ -f "$STATE_ENV" ]; then
    # shellcheck disable=SC1090
    . "$STATE_ENV"
  fi
  case $REAL_NODE in 0 | 1) ;; *) die "REAL_NODE=$REAL_NODE: want 0 or 1" ;; esac
  KUBE_BIN_DIR=$BIN_DIR
  if [ -n "$KUBE_VERSION" ]; then
    kube_resolve "$KUBE_VERSION" || exit 1
  fi
  node_vars
  API_ADDRESS=127.0.0.1
  COMPONENTS="etcd kube-apiserver kube-controller-manager kwok" # start order
  if [ "$REAL_NODE" = 1 ]; then
    API_ADDRESS=$NODE_ADDRESS
    COMPONENTS="etcd kube-apiserver kube-controller-manager kube-scheduler kwok containerd kubelet"
  fi
  APISERVER_URL="https://$API_ADDRESS:$APISERVER_PORT"
}

# ---------------------------------------------------------------- processes

# Prints the PID of component $1 if it runs and is the process this script
# started for this CLUSTER_DIR (binary name and state dir on its command line;
# owned_pid_in, hack/host-state.sh).
owned_pid() { owned_pid_in "$CLUSTER_DIR/pids/$1.pid" "$1" "$CLUSTER_DIR"; }

start_proc() { # name env-assignments... -- args...
  local name=$1 pidf="$CLUSTER_DIR/pids/$1.pid" log="$CLUSTER_DIR/logs/$1.log"
  shift
  local envs=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do envs+=("$1"); shift; done
  shift
  rm -f "$pidf"
  # setsid: own session, so a Ctrl-C in the terminal that ran `up` (or make)
  # does not reach the cluster; `down` stops it. The inner shell records its
  # PID and execs the binary, so the PID file holds the binary's PID.
  local launcher=()
  command -v setsid >/dev/null 2>&1 && launcher=(setsid)
  local binary="$BIN_DIR/$name"
  case $name in kube-* | kubelet) binary="$KUBE_BIN_DIR/$name" ;; esac
  [ "$name" != containerd ] || binary=$(command -v containerd) || die "containerd not found"
  "${launcher[@]}" env ${envs[@]+"${envs[@]}"} bash -c 'echo $$ >"$0"; exec "$@"' \
    "$pidf" "$binary" "$@" </dev/null >>"$log" 2>&1 &
  local i
  for i in $(seq 1 50); do
    [ -s "$pidf" ] && owned_pid "$name" >/dev/null && return 0
    sleep 0.1
  done
  fail_with_log "$name" "$name did not start"
}

stop_proc() { # name
  local name=$1 pid i
  if ! pid=$(owned_pid "$name"); then
    if [ -s "$CLUSTER_DIR/pids/$name.pid" ]; then
      say "$name: not running (stale PID file $(cat "$CLUSTER_DIR/pids/$name.pid"))"
    fi
    rm -f "$CLUSTER_DIR/pids/$name.pid"
    return 0
  fi
  say "stopping $name (pid $pid)"
  kill -TERM "$pid" 2>/dev/null || true
  for i in $(seq 1 $((STOP_TIMEOUT * 10))); do
    owned_pid "$name" >/dev/null || break
    sleep 0.1
  done
  if owned_pid "$name" >/dev/null; then
    warn "$name (pid $pid) did not exit within ${STOP_TIMEOUT}s; sending SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    for i in $(seq 1 50); do
      owned_pid "$name" >/dev/null || break
      sleep 0.1
    done
  fi
  rm -f "$CLUSTER_DIR/pids/$name.pid"
}

stop_all() {
  local c
  stop_proc kube-scheduler
  [ "$REAL_NODE" != 1 ] || node_stop
  for c in kwok kube-controller-manager kube-apiserver etcd; do stop_proc "$c"; done
  [ "$REAL_NODE" != 1 ] || node_network_down
}

# --------------------------------------------------------------- API access

# api METHOD PATH [curl args...]: sets API_CODE and API_BODY; true on 2xx.
api() {
  local method=$1 path=$2 out
  shift 2
  API_CODE=000 API_BODY=
  local ca=$CA_FILE
  [ -s "$ca" ] || ca=$SERVING_CERT # before extract_ca
  out=$(curl -sS --max-time 10 --cacert "$ca" -H @"$AUTH_HEADER_FILE" \
    -X "$method" -w '\n%{http_code}' "$@" "$APISERVER_URL$path" 2>&1) || return 1
  API_CODE=${out##*$'\n'}
  API_BODY=${out%$'\n'*}
  case $API_CODE in 2??) return 0 ;; *) return 1 ;; esac
}

squash() { tr -d ' \n\t'; } # the API server pretty-prints JSON for curl

fail_with_log() { # name message
  local log="$CLUSTER_DIR/logs/$1.log"
  {
    printf '[local-cluster] ERROR: %s\n' "$2"
    if [ -f "$log" ]; then
      printf '[local-cluster] last lines of %s:\n' "$log"
      tail -n 25 "$log" | sed 's/^/    /'
    fi
    printf '[local-cluster] full log: %s\n' "$log"
  } >&2
  exit 1
}

wait_for() { # name description command...: polls until command succeeds
  local name=$1 what=$2 deadline=$((SECONDS + READY_TIMEOUT))
  shift 2
  until "$@"; do
    if ! owned_pid "$name" >/dev/null; then
      fail_with_log "$name" "$name exited while waiting for $what"
    fi
    if [ $SECONDS -ge $deadline ]; then
      fail_with_log "$name" "timed out after ${READY_TIMEOUT}s waiting for $what"
    fi
    sleep 0.25
  done
}

etcd_healthy() {
  curl -sS --max-time 2 "http://127.0.0.1:$ETCD_PORT/health" 2>/dev/null | squash | grep -q '"health":"true"'
}
serving_cert_written() { grep -q 'END CERTIFICATE' "$SERVING_CERT" 2>/dev/null; }
apiserver_ready() { serving_cert_written && api GET /readyz && [ "$API_BODY" = ok ]; }
kcm_healthy() { [ "$(curl -sSk --max-time 2 "https://127.0.0.1:$KCM_PORT/healthz" 2>/dev/null)" = ok ]; }
scheduler_healthy() { [ "$(curl -sSk --max-time 2 "https://127.0.0.1:$SCHEDULER_PORT/healthz" 2>/dev/null)" = ok ]; }
node_ready() { # [node name]
  api GET "/api/v1/nodes/${1:-$NODE_NAME}" &&
    printf '%s' "$API_BODY" | squash | grep -q '"type":"Ready","status":"True"'
}
default_sa_exists() { api GET /api/v1/namespaces/default/serviceaccounts/default; }

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# ---------------------------------------------------------------- commands

is_up() { # all components run and the API server is ready
  local c
  [ -f "$MARKER" ] || return 1
  for c in $COMPONENTS; do owned_pid "$c" >/dev/null || return 1; done
  apiserver_ready
}

extract_ca() {
  # The second certificate of the serving cert file is its CA; if a future
  # kube-apiserver writes only one (self-signed) certificate, use that.
  awk '/-----BEGIN CERTIFICATE-----/{n++} n==2' "$SERVING_CERT" >"$CA_FILE.tmp"
  grep -q 'END CERTIFICATE' "$CA_FILE.tmp" || cp "$SERVING_CERT" "$CA_FILE.tmp"
  mv "$CA_FILE.tmp" "$CA_FILE"
}

write_kubeconfig() { # file token user
  local file=$1 token=$2 user=$3 ca_data
  ca_data=$(base64 <"$CA_FILE" | tr -d '\n')
  (umask 077 && : >"$file.tmp")
  cat >"$file.tmp" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: podjanitor-local
  cluster:
    server: $APISERVER_URL
    certificate-authority-data: $ca_data
users:
- name: $user
  user:
    token: $token
contexts:
- name: podjanitor-local
  context:
    cluster: podjanitor-local
    user: $user
    namespace: default
current-context: podjanitor-local
EOF
  mv "$file.tmp" "$file"
}

cmd_up() {
  local start=$SECONDS c
  for c in curl openssl base64; do
    command -v "$c" >/dev/null 2>&1 || die "'$c' is required (apt-get install -y curl openssl)"
  done
  load_ports
  if [ -d "$CLUSTER_DIR" ]; then
    if is_up; then
      if [ "$APISERVER_PORT" != "$ENV_APISERVER_PORT" ]; then
        warn "the running cluster uses port $APISERVER_PORT, not $ENV_APISERVER_PORT (run down first to change ports)"
      fi
      if [ "$REAL_NODE" != "$ENV_REAL_NODE" ]; then
        warn "the running cluster has REAL_NODE=$REAL_NODE, not $ENV_REAL_NODE (run down first to change it)"
      fi
      if [ "$KUBE_VERSION" != "$ENV_KUBE_VERSION" ]; then
        warn "the running cluster has KUBE_VERSION=$KUBE_VERSION, not $ENV_KUBE_VERSION (run down first to change it)"
      fi
      say "already running in $CLUSTER_DIR (API server $APISERVER_URL)"
      say "export KUBECONFIG=$KUBECONFIG_FILE"
      return 0
    fi
    if [ -f "$MARKER" ]; then
      say "found a stopped or partial cluster in $CLUSTER_DIR; removing it and starting afresh"
      stop_all
      rm -rf --one-file-system "$CLUSTER_DIR"
    elif [ -n "$(ls -A "$CLUSTER_DIR" 2>/dev/null)" ]; then
      die "$CLUSTER_DIR exists, is not empty and was not created by this script; choose another CLUSTER_DIR"
    fi
  fi
  load_ports
  for c in $COMPONENTS; do
    case $c in
    containerd) ;;
    kube-* | kubelet) [ -x "$KUBE_BIN_DIR/$c" ] || die "$KUBE_BIN_DIR/$c not found; build the tools first (${KUBE_VERSION:+KUBE_VERSION=$KUBE_VERSION }hack/build-tools.sh)" ;;
    *) [ -x "$BIN_DIR/$c" ] || die "$BIN_DIR/$c not found; build the tools first (hack/build-tools.sh)" ;;
    esac
  done
  [ "$REAL_NODE" != 1 ] || node_check
  local p ports=("$ETCD_PORT" "$ETCD_PEER_PORT" "$APISERVER_PORT" "$KCM_PORT")
  [ "$REAL_NODE" != 1 ] || ports+=("$SCHEDULER_PORT" "$KUBELET_PORT" "$KUBELET_HEALTHZ_PORT" "$CRI_STREAM_PORT")
  for p in "${ports[@]}"; do
    if port_in_use "$p"; then
      die "port 127.0.0.1:$p is already in use; pick other ports (PORT_BASE=..., or APISERVER_PORT/ETCD_PORT/ETCD_PEER_PORT/KCM_PORT)"
    fi
  done

  say "starting a local cluster in $CLUSTER_DIR (Kubernetes $("$KUBE_BIN_DIR/kube-apiserver" --version | sed 's/^Kubernetes //'))"
  mkdir -p "$CLUSTER_DIR"/{logs,pids,etcd,kwok,kcm} "$PKI/apiserver" "$PKI/kcm"
  chmod 700 "$CLUSTER_DIR" "$PKI" "$CLUSTER_DIR/etcd"
  : >"$MARKER"
  cat >"$STATE_ENV" <<EOF
APISERVER_PORT=$APISERVER_PORT
ETCD_PORT=$ETCD_PORT
ETCD_PEER_PORT=$ETCD_PEER_PORT
KCM_PORT=$KCM_PORT
SCHEDULER_PORT=$SCHEDULER_PORT
KUBELET_PORT=$KUBELET_PORT
KUBELET_HEALTHZ_PORT=$KUBELET_HEALTHZ_PORT
CRI_STREAM_PORT=$CRI_STREAM_PORT
REAL_NODE=$REAL_NODE
POD_SUBNET=$POD_SUBNET
KUBE_VERSION=$KUBE_VERSION
EOF

  # From here on, a failure stops whatever was started (logs are kept).
  trap 'rc=$?; if [ $rc -ne 0 ]; then warn "up failed; stopping what was started (logs kept in $CLUSTER_DIR/logs)"; stop_all; fi' EXIT
  trap 'exit 130' INT TERM

  say "generating service-account key pair, client CA and admin token"
  (
    umask 077
    openssl genrsa -out "$PKI/sa.key" 2048 2>/dev/null
    openssl rsa -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
    # Client CA (also the request-header CA): nothing logs in with it (the
    # admin uses a token), but with it the API server publishes a complete
    # kube-system/extension-apiserver-authentication ConfigMap, which
    # kube-controller-manager's delegated authentication looks up.
    openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj /CN=podjanitor-local-client-ca \
      -keyout "$PKI/client-ca.key" -out "$PKI/client-ca.crt" 2>/dev/null
    openssl rand -hex 32 >"$PKI/admin.token"
    printf '%s,podjanitor-admin,podjanitor-admin,"system:masters"\n' "$(cat "$PKI/admin.token")" >"$PKI/tokens.csv"
    # The real node's kubelet, and the API server's client certificate for
    # the kubelet's API (logs, exec), signed by the client CA.
    openssl rand -hex 32 >"$PKI/node.token"
    printf '%s,system:node:%s,system:node:%s,"system:nodes"\n' "$(cat "$PKI/node.token")" \
      "$REAL_NODE_NAME" "$REAL_NODE_NAME" >>"$PKI/tokens.csv"
    openssl req -newkey rsa:2048 -nodes -subj "/O=system:masters/CN=kube-apiserver-kubelet-client" \
      -keyout "$PKI/kubelet-client.key" -out "$PKI/kubelet-client.csr" 2>/dev/null
    openssl x509 -req -in "$PKI/kubelet-client.csr" -CA "$PKI/client-ca.crt" -CAkey "$PKI/client-ca.key" \
      -CAcreateserial -days 3650 -out "$PKI/kubelet-client.crt" 2>/dev/null
    printf 'Authorization: Bearer %s\n' "$(cat "$PKI/admin.token")" >"$AUTH_HEADER_FILE"
  )

  say "starting etcd on 127.0.0.1:$ETCD_PORT (peer $ETCD_PEER_PORT)"
  # An 8 GiB backend quota (default 2 GiB): `make bench` stores up to 150,000 pods.
  start_proc etcd -- \
    --name=podjanitor-local \
    --data-dir="$CLUSTER_DIR/etcd" \
    --listen-client-urls="http://127.0.0.1:$ETCD_PORT" \
    --advertise-client-urls="http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-advertise-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster="podjanitor-local=http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster-state=new \
    --unsafe-no-fsync \
    --quota-backend-bytes=8589934592 \
    --log-level=warn
  wait_for etcd "etcd health (http://127.0.0.1:$ETCD_PORT/health)" etcd_healthy

  if [ "$REAL_NODE" = 1 ]; then
    say "creating bridge $BRIDGE with the node's address $NODE_ADDRESS (pods on $POD_SUBNET)"
    node_network
  fi

  # Gang scheduling (the GenericWorkload gate, pod groups in
  # scheduling.k8s.io/v1beta1) is beta but off by default from 1.37: it is
  # turned on where it is beta, so the e2e can run pods that wait for their gang
  # (test/e2e/lifecycle_test.go). Pods without a pod group see no difference.
  workload_flags=() workload_api=()
  minor=$("$KUBE_BIN_DIR/kube-apiserver" --version | sed -n 's/^Kubernetes v1\.\([0-9]*\)\..*/\1/p')
  if [ -n "$minor" ] && [ "$minor" -ge 37 ]; then
    workload_flags=(--feature-gates=GenericWorkload=true)
    workload_api=(--runtime-config=scheduling.k8s.io/v1beta1=true)
    say "gang scheduling on (GenericWorkload, scheduling.k8s.io/v1beta1)"
  fi
  say "starting kube-apiserver on $APISERVER_URL"
  start_proc kube-apiserver -- \
    "${workload_flags[@]}" "${workload_api[@]}" \
    --etcd-servers="http://127.0.0.1:$ETCD_PORT" \
    --bind-address="$API_ADDRESS" \
    --advertise-address="$API_ADDRESS" \
    --secure-port="$APISERVER_PORT" \
    --cert-dir="$PKI/apiserver" \
    --client-ca-file="$PKI/client-ca.crt" \
    --requestheader-client-ca-file="$PKI/client-ca.crt" \
    --requestheader-allowed-names=front-proxy-client \
    --requestheader-username-headers=X-Remote-User \
    --requestheader-group-headers=X-Remote-Group \
    --requestheader-extra-headers-prefix=X-Remote-Extra- \
    --token-auth-file="$PKI/tokens.csv" \
    --authorization-mode=Node,RBAC \
    --kubelet-client-certificate="$PKI/kubelet-client.crt" \
    --kubelet-client-key="$PKI/kubelet-client.key" \
    --kubelet-preferred-address-types=InternalIP \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$PKI/sa.pub" \
    --service-account-signing-key-file="$PKI/sa.key" \
    --service-cluster-ip-range=10.96.0.0/16 \
    --endpoint-reconciler-type=none \
    --allow-privileged=true \
    --profiling=false
  wait_for kube-apiserver "kube-apiserver /readyz ($APISERVER_URL/readyz)" apiserver_ready
  extract_ca
  write_kubeconfig "$KUBECONFIG_FILE" "$(cat "$PKI/admin.token")" podjanitor-local-admin
  say "kubeconfig: $KUBECONFIG_FILE"

  say "starting kube-controller-manager (health on https://127.0.0.1:$KCM_PORT)"
  start_proc kube-controller-manager -- \
    --kubeconfig="$KUBECONFIG_FILE" \
    --authentication-kubeconfig="$KUBECONFIG_FILE" \
    --authorization-kubeconfig="$KUBECONFIG_FILE" \
    --bind-address=127.0.0.1 \
    --secure-port="$KCM_PORT" \
    --cert-dir="$PKI/kcm" \
    --service-account-private-key-file="$PKI/sa.key" \
    --root-ca-file="$CA_FILE" \
    --controllers='*,-node-ipam-controller,-node-lifecycle-controller' \
    --leader-elect=false \
    --terminated-pod-gc-threshold=0 \
    --flex-volume-plugin-dir="$CLUSTER_DIR/kcm/flexvolume" \
    --profiling=false
  wait_for kube-controller-manager "kube-controller-manager /healthz" kcm_healthy

  if [ "$REAL_NODE" = 1 ]; then
    say "starting kube-scheduler (health on https://127.0.0.1:$SCHEDULER_PORT)"
    mkdir -p "$PKI/scheduler"
    start_proc kube-scheduler -- \
      --kubeconfig="$KUBECONFIG_FILE" \
      --authentication-kubeconfig="$KUBECONFIG_FILE" \
      --authorization-kubeconfig="$KUBECONFIG_FILE" \
      --bind-address=127.0.0.1 \
      --secure-port="$SCHEDULER_PORT" \
      --cert-dir="$PKI/scheduler" \
      "${workload_flags[@]}" \
      --leader-elect=false \
      --profiling=false
    wait_for kube-scheduler "kube-scheduler /healthz" scheduler_healthy
  fi

  say "registering fake node $NODE_NAME"
  if ! api POST /api/v1/nodes -H 'Content-Type: application/yaml' --data-binary @- <<EOF; then
apiVersion: v1
kind: Node
metadata:
  name: $NODE_NAME
  labels:
    type: kwok
    kubernetes.io/hostname: $NODE_NAME
    kubernetes.io/os: linux
    kubernetes.io/arch: amd64
    kubernetes.io/role: agent
    node-role.kubernetes.io/agent: ""
  annotations:
    kwok.x-k8s.io/node: fake
    node.alpha.kubernetes.io/ttl: "0"
spec: {}
status:
  addresses:
  - type: InternalIP
    address: $NODE_IP
  - type: Hostname
    address: $NODE_NAME
EOF
    [ "$API_CODE" = 409 ] || fail_with_log kube-apiserver "creating node $NODE_NAME failed (HTTP $API_CODE): $API_BODY"
  fi

  say "starting kwok (stages from $STAGE_DIR)"
  local stage_args=() f
  for f in "$STAGE_DIR"/*.yaml; do stage_args+=(-c "$f"); done
  [ ${#stage_args[@]} -gt 0 ] || die "no kwok stage files in $STAGE_DIR"
  # KWOK_WORKDIR keeps kwok away from ~/.kwok/kwok.yaml.
  start_proc kwok "KWOK_WORKDIR=$CLUSTER_DIR/kwok" -- \
    --kubeconfig="$KUBECONFIG_FILE" \
    --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake \
    --cidr=10.0.0.0/16 \
    --node-ip="$NODE_IP" \
    "${stage_args[@]}"
  wait_for kwok "node $NODE_NAME to become Ready" node_ready
  # The TaintNodesByCondition admission plugin taints new nodes not-ready;
  # without the node lifecycle controller nobody lifts it, so do it here. The
  # node keeps kwok's own taint: pods get here by spec.nodeName, not by a scheduler.
  api PATCH "/api/v1/nodes/$NODE_NAME" -H 'Content-Type: application/merge-patch+json' \
    --data "{\"spec\":{\"taints\":[{\"key\":\"$KWOK_TAINT_KEY\",\"value\":\"fake\",\"effect\":\"NoSchedule\"}]}}" >/dev/null ||
    fail_with_log kube-apiserver "removing taints from $NODE_NAME failed (HTTP $API_CODE): $API_BODY"

  if [ "$REAL_NODE" = 1 ]; then
    node_start
  fi

  say "waiting for the default ServiceAccount in namespace default"
  wait_for kube-controller-manager "ServiceAccount default/default" default_sa_exists

  trap - EXIT INT TERM
  local nodes=$NODE_NAME
  [ "$REAL_NODE" != 1 ] || nodes="$NODE_NAME and $REAL_NODE_NAME (deploy overlay: $DEPLOY_DIR)"
  say "cluster is up in $((SECONDS - start))s: API server $APISERVER_URL, nodes $nodes, logs in $CLUSTER_DIR/logs"
  say "export KUBECONFIG=$KUBECONFIG_FILE"
}

cmd_down() {
  if [ ! -d "$CLUSTER_DIR" ]; then
    say "no cluster in $CLUSTER_DIR; nothing to do"
    return 0
  fi
  [ -f "$MARKER" ] || die "$CLUSTER_DIR was not created by this script; not touching it"
  say "stopping the local cluster in $CLUSTER_DIR"
  load_ports
  stop_all
  local c left=
  for c in $COMPONENTS; do
    if owned_pid "$c" >/dev/null; then left="$left $c"; fi
  done
  [ -z "$left" ] || die "still running:$left; state kept in $CLUSTER_DIR"
  # --one-file-system: never into a mount the real node might have left.
  rm -rf --one-file-system "$CLUSTER_DIR"
  say "stopped; removed $CLUSTER_DIR"
}

cmd_status() {
  if [ ! -f "$MARKER" ]; then
    say "no cluster in $CLUSTER_DIR"
    return 1
  fi
  load_ports
  local c pid ok=0
  for c in $COMPONENTS; do
    if pid=$(owned_pid "$c"); then
      say "$c: running (pid $pid)"
    else
      say "$c: NOT running"
      ok=1
    fi
  done
  if apiserver_ready; then
    say "kube-apiserver: ready at $APISERVER_URL"
  else
    say "kube-apiserver: NOT ready at $APISERVER_URL"
    ok=1
  fi
  local n nodes=$NODE_NAME
  [ "$REAL_NODE" != 1 ] || nodes="$NODE_NAME $REAL_NODE_NAME"
  for n in $nodes; do
    if [ $ok = 0 ] && node_ready "$n"; then
      say "node $n: Ready"
    elif [ $ok = 0 ]; then
      say "node $n: NOT Ready"
      ok=1
    fi
  done
  [ ! -f "$KUBECONFIG_FILE" ] || say "kubeconfig: $KUBECONFIG_FILE"
  return $ok
}

cmd_env() {
  if ! [ -f "$MARKER" ]; then
    warn "no cluster in $CLUSTER_DIR (run: hack/local-cluster.sh up)"
  fi
  printf 'export KUBECONFIG=%s\n' "$KUBECONFIG_FILE"
}

cmd_load_image() {
  [ $# -gt 0 ] || die "usage: $0 load-image ARCHIVE..."
  load_ports
  is_up || die "no cluster is up in $CLUSTER_DIR"
  [ "$REAL_NODE" = 1 ] || die "the cluster in $CLUSTER_DIR has no real node (start it with REAL_NODE=1)"
  say "importing into the real node's containerd: $*"
  load_images "$@"
}

# ------------------------------------------------- API server outages

# The command line `up` started kube-apiserver with, one argument per line,
# saved the first time it is stopped, so that flags added by start-apiserver
# are not carried into later restarts.
APISERVER_CMDLINE="$CLUSTER_DIR/kube-apiserver.cmdline"

cmd_stop_apiserver() {
  [ -f "$MARKER" ] || die "no cluster in $CLUSTER_DIR"
  local pid
  pid=$(owned_pid kube-apiserver) || die "kube-apiserver is not running in $CLUSTER_DIR"
  if [ ! -s "$APISERVER_CMDLINE" ]; then
    [ -r "/proc/$pid/cmdline" ] || die "cannot read /proc/$pid/cmdline to restart kube-apiserver later"
    tr '\0' '\n' <"/proc/$pid/cmdline" | tail -n +2 >"$APISERVER_CMDLINE.tmp"
    mv "$APISERVER_CMDLINE.tmp" "$APISERVER_CMDLINE"
  fi
  # It stops listening at once, then waits up to a minute for open watches
  # to end: give it 5 s before SIGKILL.
  local STOP_TIMEOUT=5
  stop_proc kube-apiserver
}

cmd_start_apiserver() {
  [ -f "$MARKER" ] || die "no cluster in $CLUSTER_DIR"
  [ -s "$APISERVER_CMDLINE" ] || die "kube-apiserver was not stopped by stop-apiserver; nothing to restart"
  ! owned_pid kube-apiserver >/dev/null || die "kube-apiserver is already running"
  load_ports
  local args=()
  mapfile -t args <"$APISERVER_CMDLINE"
  say "starting kube-apiserver on $APISERVER_URL${*:+ with $*}"
  start_proc kube-apiserver -- "${args[@]}" "$@"
  wait_for kube-apiserver "kube-apiserver /readyz ($APISERVER_URL/readyz)" apiserver_ready
}

case ${1:-} in
  up) cmd_up ;;
  load-image) shift; cmd_load_image "$@" ;;
  down) cmd_down ;;
  status) cmd_status ;;
  env) cmd_env ;;
  stop-apiserver) cmd_stop_apiserver ;;
  start-apiserver) shift; cmd_start_apiserver "$@" ;;
  *)
    sed -n '2,/^set -euo/{/^#/s/^# \{0,1\}//p}' "$0" >&2
    exit 2
    ;;
esac
