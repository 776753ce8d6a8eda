#!/usr/bin/env bash
# Failover time of `knit up --ha 2` (two knit servers on one PostgreSQL,
# HAProxy in front) on the real local cloud, for docs/benchmarks.md (run as
# root from the repository root):  bash bench/ha-failover.sh [K]
#
# A pool of one node is brought to Ready, then K times (default 5): the
# leader (from `knit get servers -o json`, its pid one of those this run's
# `knit up` recorded under <state>/ha/pids/) is killed with SIGKILL, and the
# time is taken from the kill to the other server's log line "first
# reconcile pass as leader" (its timestamp). The killed server is then
# started again by running the same `knit up --ha 2` once more (it starts
# what is recorded but not running, with the command line and environment
# it gives every server), and the next round kills the new leader; so the
# two servers take turns. Prints each round and min/median/max.
#
# The lease time is the servers' default (8 s: renewed every third of it,
# taken over once lapsed); `knit up --ha` has no option to pass another.
# Everything lives in a temporary directory, on a bridge and subnet of its
# own, and is released on exit (`knit down`; should that refuse, the
# processes this run's `knit up` recorded are ended by pid).
set -euo pipefail
cd "$(dirname "$0")/.."
K=${1:-5}

cargo build --release -q -p knit-cli -p knit-agent -p knit-local -p knit-kubelet-sim

BIN=target/release
WORK=$(mktemp -d)
# PostgreSQL runs as the postgres user under <state>/ha/postgres: it must be
# able to pass through (knit up keeps what is secret in directories of its own).
chmod 711 "$WORK"
STATE=$WORK/server
BRIDGE=kbha$$
BRIDGE=${BRIDGE:0:15}
SUBNET=10.217.$(( $$ % 200 + 20 )).0/24
GATEWAY=${SUBNET%.0/24}.1
export KNIT_CONFIG=$WORK/config

# shellcheck source=bench/lib.sh
. bench/lib.sh
PORT=$(bench_free_port)
CLUSTER_PORT=$(bench_free_port)
UP=(up --ha 2 --state-dir "$STATE" --listen "127.0.0.1:$PORT,$GATEWAY:$PORT"
    --advertise-address "$GATEWAY" --cluster embedded --cluster-port "$CLUSTER_PORT"
    --console-listen off --parallelism 2
    --local-state-dir "$WORK/local" --local-bridge "$BRIDGE" --local-subnet "$SUBNET")

# The pid recorded for $1 (server-1, server-2, postgres, haproxy), if any.
recorded() {
    local f=$STATE/ha/pids/$1.pid
    if [ -f "$f" ]; then tr -d '[:space:]' < "$f"; fi
}

# Only processes whose command line names this run's state directory.
ours() {
    [ -r "/proc/$1/cmdline" ] && tr '\0' ' ' < "/proc/$1/cmdline" | grep -qF "$STATE"
}

# The run fails if any process naming its work directory (servers,
# HAProxy, PostgreSQL, the local cloud's) is left running.
cleanup() {
    local rc=$?
    trap - EXIT
    "$BIN/knit" down --timeout 120 >/dev/null 2>&1 || true
    for name in server-1 server-2 haproxy postgres; do
        pid=$(recorded "$name")
        if [ -n "$pid" ] && ours "$pid"; then kill -9 "$pid" 2>/dev/null || true; fi
    done
    "$BIN/knit-local" --state-dir "$WORK/local" --bridge "$BRIDGE" --subnet "$SUBNET" down >/dev/null 2>&1 || true
    # PostgreSQL's children outlive a killed postmaster for a moment.
    for _ in $(seq 50); do bench_left "$WORK" 2>/dev/null && break; sleep 0.2; done
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
  preUserData: |
    touch /var/.skip-yum
    mkdir -p /etc/cni/net.d
    echo '{"cniVersion":"1.0.0","name":"knit","plugins":[{"type":"loopback"}]}' > /etc/cni/net.d/10-knit.conflist
POOL

# Waits (120 s at most) until `knit get servers` lists two live servers,
# one of them leader, the leader's pid not $1; prints "PID EPOCH" of it.
leader_not() {
    local deadline=$((SECONDS + 120)) out
    while [ "$SECONDS" -lt "$deadline" ]; do
        out=$("$BIN/knit" get servers -o json 2>/dev/null | python3 -c '
import json, sys
live = [s for s in json.load(sys.stdin).get("items", []) if not s.get("stale")]
leaders = [s for s in live if s.get("leader")]
if len(live) == 2 and len(leaders) == 1 and str(leaders[0]["pid"]) != sys.argv[1]:
    print(leaders[0]["pid"], leaders[0].get("epoch", "?"))
' "$1" 2>/dev/null || true)
        if [ -n "$out" ]; then echo "$out"; return 0; fi
        sleep 0.5
    done
    echo "no single leader among two live servers within 120 s" >&2
    return 1
}

# Epoch nanoseconds of the first "first reconcile pass as leader" line in
# log $1 past byte $2 (its own timestamp, colours stripped), and its epoch.
first_pass_after() {
    tail -c +"$(($2 + 1))" "$1" | sed 's/\x1b\[[0-9;]*m//g' \
        | grep -m1 'first reconcile pass as leader' \
        | python3 -c '
import datetime, re, sys
line = sys.stdin.readline()
if line:
    at = datetime.datetime.fromisoformat(line.split()[0].replace("Z", "+00:00"))
    epoch = re.search(r"epoch=(\d+)", line)
    ns = int(at.timestamp()) * 10**9 + at.microsecond * 1000
    print(ns, epoch.group(1) if epoch else "?")
' || true
}

echo "load: $(uptime)"
"$BIN/knit" package build --state-dir "$STATE" >/dev/null
"$BIN/knit" "${UP[@]}" >/dev/null
"$BIN/knit" apply -f "$WORK/pool.yaml" >/dev/null
"$BIN/knit" scale pool bench --replicas 1 --wait --timeout 600 >/dev/null
echo "knit up --ha 2, pool of 1 node Ready; lease TTL 8 s (the default)"

times=()
previous=0
for round in $(seq 1 "$K"); do
    read -r pid epoch < <(leader_not "$previous")
    leader=""
    for name in server-1 server-2; do
        if [ "$(recorded "$name")" = "$pid" ]; then leader=$name; fi
    done
    if [ -z "$leader" ] || ! ours "$pid"; then
        echo "leader pid $pid is not one this run's knit up recorded" >&2
        exit 1
    fi
    if [ "$leader" = server-1 ]; then other=server-2; else other=server-1; fi
    log=$STATE/ha/$other/server.log
    offset=$(stat -c %s "$log")
    start=$(date +%s%N)
    kill -9 "$pid"
    found=""
    deadline=$((SECONDS + 120))
    while [ -z "$found" ] && [ "$SECONDS" -lt "$deadline" ]; do
        sleep 0.2
        found=$(first_pass_after "$log" "$offset")
    done
    if [ -z "$found" ]; then
        echo "round $round: $other logged no first reconcile pass within 120 s" >&2
        exit 1
    fi
    read -r at new_epoch <<< "$found"
    ms=$(( (at - start) / 1000000 ))
    times+=("$ms")
    echo "round $round: killed $leader (pid $pid, epoch $epoch); $other's first reconcile pass as leader (epoch $new_epoch) after $ms ms"
    # The killed server again, as `knit up` starts it.
    while [ -d "/proc/$pid" ]; do sleep 0.1; done
    "$BIN/knit" "${UP[@]}" >/dev/null
    previous=$pid
done
printf '%s\n' "${times[@]}" | sort -n | python3 -c '
import statistics, sys
t = [int(x) for x in sys.stdin]
print(f"failover over {len(t)} kills (kill -9 -> first reconcile pass as leader): "
      f"min {min(t) / 1000:.1f} s, median {statistics.median(t) / 1000:.1f} s, max {max(t) / 1000:.1f} s")
'
echo "load: $(uptime)"
