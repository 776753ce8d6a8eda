#!/usr/bin/env bash
# The main job: a local cluster with a node pool on the embedded defaults.
# Starts the control plane (embedded Kubernetes API, local cloud, package
# mirror) in the background, creates a pool of 3 nodes, shows them reaching
# Ready, then prints how to use knit and kubectl against it. Run as root.
# Stop everything (pools, server, local cloud) with: knit down
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh
echo "== build (release)"
cargo build --release --locked -p knit-cli -p knit-agent -p knit-kubelet-sim -p knit-local
export PATH="$PWD/target/release:$PATH"

echo "== node image (Debian 12 from Debian packages; a no-op once built)"
knit image build
echo "== package mirror"
knit package build
echo "== control plane"
knit up
echo "== node pool"
knit apply -f examples/pool.yaml
knit scale pool workers --replicas 3 --wait --timeout 600
echo
knit get nodes -o wide

state=${KNIT_STATE_DIR:-/var/lib/knit/server}
kubeconfig=$state/cluster/admin.kubeconfig
if command -v kubectl >/dev/null; then
    echo
    kubectl --kubeconfig "$kubeconfig" get nodes -o wide
fi
cat <<MSG

The cluster is up. Try:
  export PATH=$PWD/target/release:\$PATH
  knit get pools                          # the pool and its desired/actual count
  knit describe node <name>               # a node's phase timeline
  knit logs node <name>                   # its initialization log
  knit scale pool workers --replicas 5 --wait
  kubectl --kubeconfig $kubeconfig get nodes
  knit down                               # delete the pool, stop the server, remove the local cloud
MSG
