#!/bin/bash
# kind-preload-images.service: imports /kind/images/*.tar into containerd's
# k8s.io namespace once per node (the marker is on the node's /var volume).
set -euo pipefail
marker=/var/lib/kind-preloaded-images
[ -f "$marker" ] && exit 0
for i in $(seq 1 60); do
  ctr version >/dev/null 2>&1 && break
  sleep 0.5
done
for f in /kind/images/*.tar; do
  ctr --namespace=k8s.io images import --all-platforms "$f"
done
touch "$marker"
