#!/usr/bin/env bash
# knit-cluster benchmark: listing N Nodes (1,000 by default) with and
# without limit/continue, on SQLite, in one process (the embedded API
# server on 127.0.0.1, HTTPS, the admin identity). Prints a Markdown table:
# requests per run, the server's time (from its /metrics) and the client's.
# Run from the repository root:  bash bench/cluster-list.sh [N] [RUNS]
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p knit-cluster --example list_bench
echo "load before: $(uptime)"
# shellcheck source=bench/lib.sh
. bench/lib.sh
# In a session of its own: nothing of it may be left when it returns.
bench_session ./target/release/examples/list_bench "${1:-1000}" "${2:-30}"
echo "load after: $(uptime)"
