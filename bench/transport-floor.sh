#!/usr/bin/env bash
# The transport's floor under the kubelets' heartbeat cadence (issue 31
# item 2): N clients, each renewing "a Lease" (PUT) and reading "a Node"
# (GET) every 10 s over one kept-alive TLS connection, against a server
# built as the embedded API is (one async worker, rustls, hyper, axum,
# mimalloc) that answers with fixed bodies and does nothing else
# (crates/knit-cluster/examples/transport_floor.rs). Three runs, in one
# session so that their ratios hold:
#   1. the floor on loopback;
#   2. the floor with the clients in a network namespace of this bench's
#      own, behind a veth on a bridge of its own (as the local cloud's
#      machines reach the server), in 198.18.0.0/15, the range set aside
#      for benchmarks; removed on exit;
#   3. the embedded API itself with N kubelet stand-ins (heartbeat_bench,
#      SQLite, on loopback): what it costs above run 1 is knit's own work.
# Run as root from the repository root:
#   bash bench/transport-floor.sh [N] [WINDOW_SECS]
# KNIT_BENCH_BIN=DIR takes the binaries from DIR (examples/transport_floor,
# examples/heartbeat_bench, knit-kubelet-sim) instead of building them.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-1000}
WINDOW=${2:-60}
if [ -n "${KNIT_BENCH_BIN:-}" ]; then
    BIN=$(cd "$KNIT_BENCH_BIN" && pwd)
else
    cargo build --release -q -p knit-kubelet-sim
    cargo build --release -q -p knit-cluster --example transport_floor --example heartbeat_bench
    BIN=$PWD/target/release
fi
# shellcheck source=bench/lib.sh
. bench/lib.sh

# Names of this run's own (at most 15 characters for links).
tag=$$
ns=kfloor$tag
br=kflbr$tag
host_end=kflh$tag
ns_end=kfln$tag
server_ip=198.18.255.1
client_ip=198.18.255.2
if ip route show to match "$client_ip" | grep -qv '^default'; then
    echo "transport-floor: $client_ip is already routed on this host; not touching it" >&2
    exit 1
fi
cleanup() {
    ip netns del "$ns" 2>/dev/null || true
    ip link del "$host_end" 2>/dev/null || true
    ip link del "$br" 2>/dev/null || true
}
trap cleanup EXIT
ip netns add "$ns"
ip link add "$br" type bridge
ip link add "$host_end" type veth peer name "$ns_end" netns "$ns"
ip link set "$host_end" master "$br"
ip addr add "$server_ip/30" dev "$br"
ip link set "$br" up
ip link set "$host_end" up
ip -n "$ns" addr add "$client_ip/30" dev "$ns_end"
ip -n "$ns" link set "$ns_end" up
ip -n "$ns" link set lo up

echo "load before: $(uptime)"
echo "## 1. the floor on loopback"
bench_session "$BIN/examples/transport_floor" "$N" "$WINDOW"
echo "load before: $(uptime)"
echo "## 2. the floor through a veth and a bridge"
KNIT_FLOOR_ADDR=$server_ip KNIT_FLOOR_CLIENT_NETNS=$ns \
    bench_session "$BIN/examples/transport_floor" "$N" "$WINDOW"
echo "load before: $(uptime)"
echo "## 3. the embedded API (SQLite, loopback)"
KNIT_BENCH_DATASTORE=sqlite bench_session "$BIN/examples/heartbeat_bench" \
    "$BIN/knit-kubelet-sim" "$N" "$WINDOW"
echo "load after: $(uptime)"
