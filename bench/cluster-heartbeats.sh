#!/usr/bin/env bash
# knit-cluster benchmark: embedded API server CPU with N heartbeating kubelet
# stand-ins (knit-kubelet-sim --lightweight: no containerd; kubelet's default
# 40 s lease renewed every 10 s, node status checked every 10 s).
# Run from the repository root:  bash bench/cluster-heartbeats.sh [N] [WINDOW_SECS]
# Prints a Markdown table (the figures in docs/benchmarks.md come from it).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p knit-kubelet-sim
cargo build --release -q -p knit-cluster --example heartbeat_bench
./target/release/examples/heartbeat_bench "$PWD/target/release/knit-kubelet-sim" "${1:-1000}" "${2:-60}"
