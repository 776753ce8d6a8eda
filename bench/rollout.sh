#!/usr/bin/env bash
# A rolling update of a 10-node pool on the local cloud with the embedded
# cluster: `updateStrategy: {maxSurge: 2, maxUnavailable: 0}`, the instance
# type changed. Prints the time from the apply to `knit rollout status`
# exiting 0, and the lowest Ready count and the highest instance count
# seen by a sampler reading the pool every ~200 ms (the bounds: Ready never
# below 10, instances never above 12).
# Run as root from the repository root:  bash bench/rollout.sh [N] [SURGE]
# The server, its machines and the bridge are this run's own and are
# released on exit (`knit down`; the local cloud's `down` after it).
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-10}
SURGE=${2:-2}

# KNIT_BENCH_PROFILE=debug uses the workspace's debug binaries (no
# release build; the control plane's share of the time is small).
if [ "${KNIT_BENCH_PROFILE:-release}" = debug ]; then
    cargo build -q -p knit-cli -p knit-agent -p knit-local -p knit-kubelet-sim
    BIN=$PWD/target/debug
else
    cargo build --release -q -p knit-cli -p knit-agent -p knit-local -p knit-kubelet-sim
    BIN=$PWD/target/release
fi
WORK=$(mktemp -d)
STATE=$WORK/server
BRIDGE=kbro$$
BRIDGE=${BRIDGE:0:15}
SUBNET=10.218.$(( $$ % 200 + 20 )).0/24
GATEWAY=${SUBNET%.0/24}.1
export KNIT_CONFIG=$WORK/config

# shellcheck source=bench/lib.sh
. bench/lib.sh
PORT=$(bench_free_port)
CLUSTER_PORT=$(bench_free_port)
SAMPLER=

# The sampler and the server `knit up` started are recorded and ended by
# their PIDs (the server by `knit down` first); the run fails if anything
# of it is left running.
cleanup() {
    local rc=$?
    trap - EXIT
    if [ -n "$SAMPLER" ] && bench_ours "$SAMPLER"; then kill "$SAMPLER" 2>/dev/null || true; fi
    "$BIN/knit" down --timeout 180 >/dev/null 2>&1 || true
    bench_end_all 10
    "$BIN/knit-local" --state-dir "$WORK/local" --bridge "$BRIDGE" --subnet "$SUBNET" down >/dev/null 2>&1 || true
    bench_left "$WORK" || rc=1
    rm -rf "$WORK"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 143' TERM INT

pool() { # $1 = replicas, $2 = instance type
    cat <<POOL
apiVersion: knit.dev/v1alpha1
kind: NodePool
metadata: {name: bench}
spec:
  replicas: $1
  instanceTypes: [$2]
  systemDisk: {sizeGiB: 20}
  updateStrategy: {type: RollingUpdate, maxSurge: $SURGE, maxUnavailable: 0}
  preUserData: |
    touch /var/.skip-yum
    mkdir -p /etc/cni/net.d
    echo '{"cniVersion":"1.0.0","name":"knit","plugins":[{"type":"loopback"}]}' > /etc/cni/net.d/10-knit.conflist
POOL
}

echo "load: $(uptime)"
"$BIN/knit" package build --state-dir "$STATE" >/dev/null
"$BIN/knit" up --state-dir "$STATE" --listen "127.0.0.1:$PORT,$GATEWAY:$PORT" \
    --advertise-address "$GATEWAY" --cluster embedded --cluster-port "$CLUSTER_PORT" \
    --console-listen off --parallelism 2 \
    --local-state-dir "$WORK/local" --local-bridge "$BRIDGE" --local-subnet "$SUBNET" >/dev/null
bench_track_up "$KNIT_CONFIG"
pool 0 ecs.g7.large > "$WORK/pool.yaml"
"$BIN/knit" create -f "$WORK/pool.yaml" >/dev/null
"$BIN/knit" scale pool bench --replicas "$N" --wait --timeout 1800 >/dev/null

# The sampler: "<instances> <ready>" a line every ~200 ms, until its stop
# file exists (so it never dies in the middle of writing a line).
(
    while [ ! -e "$WORK/stop-sampler" ]; do
        "$BIN/knit" get pool bench -o json 2>/dev/null | python3 -c '
import json, sys
s = json.load(sys.stdin)["status"]
print(s["instances"], s["ready"])' 2>/dev/null || true
        sleep 0.2
    done
) > "$WORK/samples" &
SAMPLER=$!
bench_track "$SAMPLER" rollout.sh

pool "$N" ecs.g7.xlarge > "$WORK/pool.yaml"
t0=$(date +%s%3N)
"$BIN/knit" apply -f "$WORK/pool.yaml" >/dev/null
"$BIN/knit" rollout status pool bench --timeout 60m >/dev/null
t1=$(date +%s%3N)
touch "$WORK/stop-sampler"
wait "$SAMPLER" 2>/dev/null || true
SAMPLER=

read -r samples lowest highest < <(awk '
    NF == 2 { n++; if (min == "" || $2 < min) min = $2; if ($1 > max) max = $1 }
    END { print n, min, max }' "$WORK/samples")
echo "| nodes | maxSurge | rollout s | lowest Ready | highest instances | samples |"
echo "|---|---|---|---|---|---|"
printf '| %d | %d | %.1f | %s | %s | %s |\n' "$N" "$SURGE" "$(awk "BEGIN {print ($t1 - $t0) / 1000}")" "$lowest" "$highest" "$samples"
