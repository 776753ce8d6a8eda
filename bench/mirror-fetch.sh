#!/usr/bin/env bash
# The package mirror under a fetch storm (issue 31 item 1), as root:
#   bash bench/mirror-fetch.sh [CLIENTS] [ROUNDS]
#
# What a scale-out does to the server first: every new node fetches the
# agent (`/mirror/bin/knit-agent`, about 9 MB) over HTTPS at once. Starts a
# knit server of its own (state directory, ports; no local cloud is used),
# builds its package mirror, then ROUNDS times runs CLIENTS curls fetching
# the agent in parallel, and prints per round the wall time, the MiB/s
# served and the server's CPU (utime+stime from /proc/PID/stat) per GiB
# served. Every fetched copy is checked against the served file's size.
#
# Knobs (environment): KNIT_BIN=DIR (knit, knit-agent and knit-kubelet-sim,
# else the release build's), CLIENTS=64, ROUNDS=3. Compare two builds by
# running it with each KNIT_BIN in turn.
set -euo pipefail
cd "$(dirname "$0")/.."
CLIENTS=${1:-${CLIENTS:-64}}
ROUNDS=${2:-${ROUNDS:-3}}
for v in CLIENTS ROUNDS; do
    case ${!v} in '' | *[!0-9]*) echo "$v: ${!v} is not a number" >&2; exit 2 ;; esac
done
BIN=${KNIT_BIN:-target/release}
KNIT=$BIN/knit
for b in knit knit-agent knit-kubelet-sim; do
    [ -x "$BIN/$b" ] || { echo "no $b in $BIN (cargo build --release -p knit-cli -p knit-agent -p knit-kubelet-sim, or KNIT_BIN=DIR)" >&2; exit 2; }
done

WORK=$(mktemp -d -t knit-mirror-bench-XXXXXX)
export KNIT_CONFIG=$WORK/config
# shellcheck source=bench/lib.sh
. bench/lib.sh
PORT=$(bench_free_port)
CLUSTER_PORT=$(bench_free_port)
cleanup() {
    local rc=$?
    trap - EXIT
    bench_end_all 10
    bench_left "$WORK" || rc=1
    rm -rf "$WORK"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 143' TERM INT

"$KNIT" package build --no-runtime --state-dir "$WORK/server" >"$WORK/package.log" 2>&1 ||
    { cat "$WORK/package.log" >&2; exit 1; }
"$KNIT" server --write-config --state-dir "$WORK/server" --provider none --cluster embedded \
    --cluster-port "$CLUSTER_PORT" --listen "127.0.0.1:$PORT" --console-listen off --autoscaler-listen off \
    >"$WORK/server.log" 2>&1 &
SERVER=$!
bench_track "$SERVER" "$WORK/server"
for _ in $(seq 300); do
    [ -f "$WORK/server/pki/ca.pem" ] && curl -fsS --cacert "$WORK/server/pki/ca.pem" \
        -o /dev/null "https://127.0.0.1:$PORT/healthz" 2>/dev/null && break
    bench_ours "$SERVER" || { cat "$WORK/server.log" >&2; echo "the server exited" >&2; exit 1; }
    sleep 0.1
done
URL=https://127.0.0.1:$PORT/mirror/bin/knit-agent
SIZE=$(curl -fsS --cacert "$WORK/server/pki/ca.pem" -o "$WORK/one" -w '%{size_download}' "$URL")
[ "$SIZE" -gt 0 ] || { echo "the mirror served nothing at $URL" >&2; exit 1; }
cpu_ticks() { echo $(($(bench_stat_field "$SERVER" 14) + $(bench_stat_field "$SERVER" 15))); }
HZ=$(getconf CLK_TCK)

echo "mirror fetch bench: $CLIENTS clients x $ROUNDS rounds of $SIZE bytes, $(nproc) cores, $(date -u +%FT%TZ), $KNIT"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "| round | wall | MiB/s served | server CPU s per GiB |"
echo "|---|---|---|---|"
for r in $(seq "$ROUNDS"); do
    rm -f "$WORK"/got.*
    c0=$(cpu_ticks)
    t0=$(date +%s%N)
    pids=()
    for i in $(seq "$CLIENTS"); do
        curl -fsS --max-time 300 --cacert "$WORK/server/pki/ca.pem" -o "$WORK/got.$i" "$URL" &
        pids+=("$!")
    done
    failed=0
    for p in "${pids[@]}"; do wait "$p" || failed=$((failed + 1)); done
    t1=$(date +%s%N)
    c1=$(cpu_ticks)
    [ "$failed" = 0 ] || { echo "$failed of $CLIENTS fetches failed" >&2; exit 1; }
    for i in $(seq "$CLIENTS"); do
        [ "$(stat -c %s "$WORK/got.$i")" = "$SIZE" ] || { echo "fetch $i is short" >&2; exit 1; }
    done
    python3 - "$r" "$t0" "$t1" "$c0" "$c1" "$HZ" "$SIZE" "$CLIENTS" <<'PY'
import sys
r, t0, t1, c0, c1, hz, size, n = sys.argv[1:]
wall = (int(t1) - int(t0)) / 1e9
served = int(size) * int(n)
cpu = (int(c1) - int(c0)) / int(hz)
print(f"| {r} | {wall:.2f} s | {served / 2**20 / wall:.0f} | {cpu / (served / 2**30):.2f} |")
PY
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
