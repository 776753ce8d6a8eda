#!/usr/bin/env bash
# The embedded API at size (issue 31 item 5): N heartbeating kubelet
# stand-ins (1,000 by default, `knit-kubelet-sim --lightweight`) on SQLite,
# then, with the heartbeats running, the real kubectl's `get nodes` timed
# RUNS times (its default pages of 500, and the whole list in one answer)
# and a watch fan-out to WATCHERS `kubectl get nodes --watch` processes
# (one Node annotated PATCHES times, 5 per second, with its send time).
# Prints the heartbeat table, then p50/p99/max of each and the API
# server's CPU while the watchers ran.
# Run from the repository root:  bash bench/api-at-size.sh [N]
# Knobs (environment): KNIT_BENCH_API_RUNS=30, KNIT_BENCH_WATCHERS=50,
# KNIT_BENCH_PATCHES=100, WINDOW=30 (the heartbeat CPU window first, s),
# KNIT_BENCH_SETTLE=60 (s after all Ready before that window).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v kubectl >/dev/null || { echo "api-at-size: kubectl is needed (the real client)" >&2; exit 2; }
cargo build --release -q -p knit-kubelet-sim
cargo build --release -q -p knit-cluster --example heartbeat_bench
# shellcheck source=bench/lib.sh
. bench/lib.sh
N=${1:-1000}
case $N in '' | *[!0-9]*) echo "N: $N is not a number" >&2; exit 2 ;; esac
echo "load before: $(uptime)"
# In a session of its own: its stand-ins and kubectls must be gone when it
# returns, or the bench fails.
KNIT_BENCH_API=1 KNIT_BENCH_DATASTORE=sqlite bench_session ./target/release/examples/heartbeat_bench \
    "$PWD/target/release/knit-kubelet-sim" "$N" "${WINDOW:-30}"
echo "load after: $(uptime)"
