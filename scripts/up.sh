#!/usr/bin/env bash
# The main job: a local cluster with a node pool on the embedded defaults.
# Starts the control plane (embedded Kubernetes API, local cloud, package
# mirror, web console) in the background, creates a pool of 3 nodes, shows
# them reaching Ready, then prints how to use knit, kubectl and the console
# against it. Run as root (sudo ./scripts/up.sh works with rustup's cargo
# of the user running sudo). Installs only what the main job runs
# (scripts/setup.sh; README: what it changes). Stop everything (pools,
# server, local cloud) with: knit down
set -euo pipefail
cd "$(dirname "$0")/.."

# Under sudo, root has no cargo of its own when the Rust toolchain is the
# invoking user's (rustup in ~/.cargo, ~/.rustup): use that toolchain.
# Crates are fetched into root's cargo home, never the user's.
if ! command -v cargo >/dev/null && [ -n "${SUDO_USER:-}" ]; then
    user_home=$(getent passwd "$SUDO_USER" | cut -d: -f6)
    if [ -x "$user_home/.cargo/bin/cargo" ]; then
        echo "== using $SUDO_USER's Rust toolchain ($user_home/.cargo/bin, $user_home/.rustup)"
        export PATH="$PATH:$user_home/.cargo/bin"
        export RUSTUP_HOME=${RUSTUP_HOME:-$user_home/.rustup}
    fi
fi

bash scripts/setup.sh
# knit without the parts the main job does not run (cargo features: ECS,
# QEMU, PostgreSQL for --ha, an external cluster): an eighth less CPU to
# compile. A knit built so refuses them naming the feature and the build
# command (README, "What up.sh builds").
echo "== build (release): knit (main job's features), knit-agent, knit-local, the kubelet stand-in"
cargo build --release --locked --no-default-features -p knit-cli -p knit-agent -p knit-local -p knit-kubelet-sim
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
console=${KNIT_CONSOLE_LISTEN:-127.0.0.1:7444}
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

The web console: https://$console/ui/
  Sign in with the admin token:  sudo cat $state/admin-token
  Its certificate is signed by this server's own CA ($state/pki/ca.pem):
  import that CA in the browser, or accept the warning once.
  From another machine: ssh -L ${console##*:}:$console <this host>, then the same URL.
MSG
