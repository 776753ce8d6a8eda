#!/usr/bin/env bash
# Control-plane figures for docs/benchmarks.md (run as root from the
# repository root):
#  1. the in-process benchmark: reconcile decision time for a 1,000-node
#     pool, API latency p50/p99 under concurrent HTTPS clients on loopback,
#     server RSS with 1,000 nodes stored; then the same API latency with
#     the server's datastore on PostgreSQL (a throwaway server of its own
#     from Debian's binaries; skipped, saying why, where none can start)
#     and the PostgreSQL/SQLite ratios;
#  2. time from `knit scale` to every node done, on the real local cloud,
#     for 1, 3 and 10 nodes: first joining no cluster (provider create +
#     boot + stub + every agent phase), then joining the embedded cluster
#     with real containerd and the kubelet stand-in (until every node is
#     also Ready).
# Everything lives in a temporary directory, on a bridge and subnet of its
# own, and is released on exit.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --release -q -p knit-cli -p knit-agent -p knit-local -p knit-kubelet-sim
echo "== in-process: planning, API latency (SQLite, then PostgreSQL), RSS"
# shellcheck source=bench/lib.sh
. bench/lib.sh
# In a session of its own: whatever it starts (PostgreSQL's processes
# included) must be gone when it returns.
cargo build --release -q -p knit-server --example bench_control_plane
bench_session target/release/examples/bench_control_plane

BIN=target/release
WORK=$(mktemp -d)
BRIDGE=kbcp$$
BRIDGE=${BRIDGE:0:15}
SUBNET=10.218.$(( $$ % 200 + 20 )).0/24
GATEWAY=${SUBNET%.0/24}.1
export KNIT_CONFIG=$WORK/config
LOCAL=(--local-state-dir "$WORK/local" --local-bridge "$BRIDGE" --local-subnet "$SUBNET")

# The servers `knit up` started are recorded and ended by their PIDs should
# `knit down` not stop them; the run fails if anything of it is left running.
cleanup() {
    local rc=$?
    trap - EXIT
    "$BIN/knit" down --timeout 120 >/dev/null 2>&1 || true
    bench_end_all 10
    "$BIN/knit-local" --state-dir "$WORK/local" --bridge "$BRIDGE" --subnet "$SUBNET" down >/dev/null 2>&1 || true
    bench_left "$WORK" || rc=1
    rm -rf "$WORK"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 143' TERM INT


cat > "$WORK/pool.yaml" <<'POOL'
apiVersion: knit.dev/v1alpha1
kind: NodePool
metadata: {name: bench}
spec:
  replicas: 0
  systemDisk: {sizeGiB: 20}
  dataDisks: [{sizeGiB: 40, interface: nvme}]
  preUserData: |
    touch /var/.skip-yum
    mkdir -p /etc/cni/net.d
    echo '{"cniVersion":"1.0.0","name":"knit","plugins":[{"type":"loopback"}]}' > /etc/cni/net.d/10-knit.conflist
POOL

phase_means() {
    python3 - "$KNIT_CONFIG" <<'PY'
import ssl, sys, urllib.request, yaml
cfg = yaml.safe_load(open(sys.argv[1]))
ctx = ssl.create_default_context(cadata=cfg["caCert"])
req = urllib.request.Request(cfg["server"] + "/metrics", headers={"Authorization": "Bearer " + cfg["token"]})
text = urllib.request.urlopen(req, context=ctx).read().decode()
sums, counts = {}, {}
for line in text.splitlines():
    if line.startswith("knit_phase_duration_seconds_sum"):
        sums[line.split('"')[1]] = float(line.split()[-1])
    if line.startswith("knit_phase_duration_seconds_count"):
        counts[line.split('"')[1]] = float(line.split()[-1])
for phase in sums:
    if counts.get(phase):
        print(f"  {phase}: mean {1000 * sums[phase] / counts[phase]:.1f} ms over {int(counts[phase])} nodes")
PY
}

# $1: none | embedded. With none the package has no runtime and nodes join
# nothing; with embedded, real containerd and the kubelet stand-in run and
# --wait also waits for Ready.
run_pass() {
    local cluster=$1
    local pkg=()
    if [ "$cluster" = none ]; then pkg=(--no-runtime); fi
    "$BIN/knit" package build --state-dir "$WORK/server" "${pkg[@]}" >/dev/null
    "$BIN/knit" up --state-dir "$WORK/server" --listen "0.0.0.0:$(bench_free_port)" --advertise-address "$GATEWAY" \
        --cluster "$cluster" --cluster-port "$(bench_free_port)" "${LOCAL[@]}" >/dev/null
    bench_track_up "$KNIT_CONFIG"
    "$BIN/knit" apply -f "$WORK/pool.yaml" >/dev/null
    echo "== local cloud, cluster: $cluster; scale request -> every node done"
    for n in 1 3 10; do
        start=$(date +%s%N)
        "$BIN/knit" scale pool bench --replicas "$n" --wait --timeout 600 >/dev/null
        end=$(date +%s%N)
        echo "0 -> $n nodes: $(( (end - start) / 1000000 )) ms"
        "$BIN/knit" scale pool bench --replicas 0 --wait --timeout 600 >/dev/null
    done
    echo "mean agent phase durations (server histogram):"
    phase_means
    "$BIN/knit" down --timeout 300 >/dev/null
}

run_pass none
# A fresh server state for the second pass (its own CA, store, mirror).
rm -rf "$WORK/server"
run_pass embedded
