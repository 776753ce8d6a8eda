#!/usr/bin/env bash
# knit-cluster benchmark: embedded API server CPU with N heartbeating kubelet
# stand-ins (knit-kubelet-sim --lightweight: no containerd; kubelet's default
# 40 s lease renewed every 10 s, node status checked every 10 s), first on
# SQLite, then back to back on PostgreSQL (a throwaway server of the
# benchmark's own from Debian's binaries, as root; KNIT_BENCH_DATASTORE=postgres),
# where the PostgreSQL processes' CPU is reported beside the API server's.
# Run from the repository root:  bash bench/cluster-heartbeats.sh [N] [WINDOW_SECS]
# Prints a Markdown table and the PostgreSQL/SQLite CPU ratios (the figures
# in docs/benchmarks.md come from it).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p knit-kubelet-sim
cargo build --release -q -p knit-cluster --example heartbeat_bench
# shellcheck source=bench/lib.sh
. bench/lib.sh
# In a session of its own: its stand-ins (and PostgreSQL's processes) must
# be gone when it returns, or the bench fails.
run() {
    KNIT_BENCH_DATASTORE=$1 bench_session ./target/release/examples/heartbeat_bench \
        "$PWD/target/release/knit-kubelet-sim" "${N}" "${WINDOW}"
}
N=${1:-1000}
WINDOW=${2:-60}
echo "load before: $(uptime)"
sqlite=$(run sqlite)
echo "$sqlite"
echo "load before: $(uptime)"
postgres=$(run postgres | tail -n 1)
echo "$postgres"
echo "load after: $(uptime)"
# Cells (split on "|"): 5 API server CPU ("12.34 %"), 6 PostgreSQL processes' CPU.
python3 - "$(echo "$sqlite" | tail -n 1)" "$postgres" <<'PY'
import sys
cell = lambda row, i: float(row.split("|")[i].split()[0])
s, p = sys.argv[1], sys.argv[2]
base, knit, db = cell(s, 5), cell(p, 5), cell(p, 6)
print(f"PostgreSQL/SQLite CPU: knit process {knit / base:.2f}x, knit + PostgreSQL {(knit + db) / base:.2f}x")
PY
