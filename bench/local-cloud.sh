#!/usr/bin/env bash
# knit-local benchmark: create+boot N instances (no runtime, then with
# containerd), idle memory per instance, and the effect of link shaping.
# Run as root from the repository root:  bash bench/local-cloud.sh [N…]
# Prints a Markdown table (the figures in docs/benchmarks.md come from it).
set -euo pipefail
cd "$(dirname "$0")/.."

COUNTS=("${@:-1 10 50}")
# shellcheck disable=SC2206
COUNTS=(${COUNTS[@]})
cargo build --release -q -p knit-local
BIN=$PWD/target/release/knit-local
WORK=$(mktemp -d -t knit-local-bench-XXXXXX)
export KNIT_LOCAL_STATE_DIR=$WORK/state KNIT_LOCAL_BRIDGE=kbench$$ KNIT_LOCAL_SUBNET=10.254.$(($$ % 200)).0/24
# shellcheck source=bench/lib.sh
. bench/lib.sh
# Every process of the run (PID 1s, shims, the metadata server) names
# $WORK in its command line; the run fails if one is left after `down`.
cleanup() {
    local rc=$?
    trap - EXIT
    "$BIN" down >/dev/null 2>&1 || true
    bench_left "$WORK" || rc=1
    rm -rf "$WORK"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 143' TERM INT

ms() { date +%s%3N; }

# PSS (KiB) of every process in an instance's network namespace: PID 1, the
# shim and whatever runs inside.
instance_pss() {
    local ns=/run/netns/knit-$1 ino total=0
    ino=$(stat -L -c %i "$ns")
    for p in /proc/[0-9]*; do
        [ "$(readlink "$p/ns/net" 2>/dev/null)" = "net:[$ino]" ] || continue
        total=$((total + $(awk '/^Pss:/ {print $2}' "$p/smaps_rollup" 2>/dev/null || echo 0)))
    done
    echo "$total"
}

run() { # $1 = label, $2 = N, $3 = template
    local label=$1 n=$2 tpl=$WORK/t.yaml ids=() t0 t1 boot=0 pss=0
    printf '%s' "$3" > "$tpl"
    t0=$(ms)
    for _ in $(seq "$n"); do
        ids+=("$("$BIN" create -f "$tpl" | sed -n 's/^  "id": "\(i-[0-9a-f]*\)",/\1/p')")
    done
    if [ "$label" = containerd ]; then
        for id in "${ids[@]}"; do
            # shellcheck disable=SC2016 # the loop runs inside the instance, not here
            "$BIN" exec "$id" sh -c 'for i in $(seq 600); do ctr version >/dev/null 2>&1 && exit 0; sleep 0.05; done; exit 1'
        done
    fi
    t1=$(ms)
    for id in "${ids[@]}"; do
        boot=$((boot + $("$BIN" describe "$id" | sed -n 's/.*"lastBootMs": \([0-9]*\).*/\1/p')))
    done
    sleep 3 # settle to idle
    for id in "${ids[@]}"; do pss=$((pss + $(instance_pss "$id"))); done
    printf '| %s | %d | %d | %d | %d | %d |\n' "$label" "$n" $((t1 - t0)) $(((t1 - t0) / n)) $((boot / n)) $((pss / n))
    "$BIN" down >/dev/null
}

echo "| instances | N | wall ms (create+ready) | ms per instance | spawn→ready ms (avg) | idle PSS KiB per instance |"
echo "|---|---|---|---|---|---|"
for n in "${COUNTS[@]}"; do
    run "no runtime" "$n" $'systemDiskSize: 2Gi\n'
done
for n in "${COUNTS[@]}"; do
    run containerd "$n" $'systemDiskSize: 2Gi\ndisks:\n- {name: containerd, size: 2Gi, format: ext4}\nuserData: |\n  #!/bin/sh\n  mkdir -p /var/lib/containerd && mount /dev/vdb /var/lib/containerd\n  containerd >/var/log/containerd.log 2>&1 &\n'
done

# Shaping: the same transfer between two instances, unshaped then at 50 Mbit/s.
printf 'systemDiskSize: 1Gi\n' > "$WORK/t.yaml"
A=$("$BIN" create -f "$WORK/t.yaml" | sed -n 's/^  "id": "\(i-[0-9a-f]*\)",/\1/p')
B=$("$BIN" create -f "$WORK/t.yaml" | sed -n 's/^  "id": "\(i-[0-9a-f]*\)",/\1/p')
BIP=$("$BIN" describe "$B" | sed -n 's/.*"privateIp": "\(.*\)",/\1/p')
SERVER='import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("0.0.0.0", 9000)); s.listen()
while True:
    c, _ = s.accept()
    while c.recv(1 << 16): pass
    c.close()'
CLIENT="import socket, time
s = socket.create_connection(('$BIP', 9000)); t = time.monotonic(); buf = b'x' * (1 << 16)
for _ in range(128): s.sendall(buf)
s.shutdown(socket.SHUT_WR); s.recv(1); print(int((time.monotonic() - t) * 1000))"
"$BIN" exec "$B" sh -c "python3 -c '$SERVER' >/dev/null 2>&1 &"
sleep 0.5
fast=$("$BIN" exec "$A" python3 -c "$CLIENT")
"$BIN" shape "$B" --mbit 50
slow=$("$BIN" exec "$A" python3 -c "$CLIENT")
echo
echo "shaping: 8 MiB A→B unshaped ${fast} ms, B shaped to 50 Mbit/s ${slow} ms, ratio $(awk "BEGIN {printf \"%.0f\", $slow / ($fast > 0 ? $fast : 1)}")x"
