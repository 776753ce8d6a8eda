#!/usr/bin/env bash
# Scale-out on one host (issue 31 item 2), as root from anywhere:
#   bash bench/scale.sh N
#
# A knit server of the run's own (state directory, bridge, subnet, ports)
# on the local cloud with the embedded cluster; light machines: a pool with
# `runtime: none` (no containerd configured or started; the kubelet
# stand-in runs --lightweight), the package without a runtime (`knit
# package build --no-runtime`: the agent, the kubelet stand-in, CNI
# plugins), no data disk, and (PRELOAD=yes) that package and the agent
# preloaded in the node image (`knit image preload` into the run's own
# images directory): nodes neither download nor write them. One pool,
# scaled 0 → N with one `knit scale` (no --wait), then N → 0; the Cluster's
# nodeQuota raised to N first (the basic edition allows 10).
#
# A sampler (bench/scale_sampler.py) reads every INTERVAL s: Ready nodes
# through the real kubectl, the control plane's CPU (utime+stime of the
# knit server process, /proc/PID/stat deltas) and RSS, the host's memory,
# the machines' loop devices and bridge ports. Phases: idle (before the
# request), out (until all N are Ready), steady (STEADY s at N), quiet
# (QUIET s more at N without the sampler's kubectl), in (until
# no machine is left), after (AFTER s). Prints time to all Ready, P50/P90
# of each node's first Ready from the scale request, CPU and RSS per phase,
# the per-machine host cost at N (census), what the embedded API was
# asked in the quiet phase (per verb, resource and code, from its own
# request counters), and what is left on the host
# after scale-in and after the server and the local cloud are taken down:
# anything left fails the run. Writes OUT/samples.csv and OUT/nodes.csv,
# and OUT/ready.png (Ready nodes over time, crates/knit-bench's
# scale_chart example) unless CHART=no.
#
# Knobs (environment): KNIT_BIN=DIR (binaries to use, else the release
# build), OUT (default target/bench-scale/N), INTERVAL=1, STEADY=60, QUIET=30,
# AFTER=20, IDLE=10, TIMEOUT=900 (each of scale-out and scale-in, s),
# PARALLELISM=8 (the server's provider calls in flight), CHART=yes,
# PRELOAD=yes (no: every node downloads and installs the package).
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:?usage: bash bench/scale.sh N}
case $N in '' | *[!0-9]*) echo "N: $N is not a number" >&2; exit 2 ;; esac
INTERVAL=${INTERVAL:-1}
STEADY=${STEADY:-60}
QUIET=${QUIET:-30}
AFTER=${AFTER:-20}
IDLE=${IDLE:-10}
TIMEOUT=${TIMEOUT:-900}
PARALLELISM=${PARALLELISM:-8}
PRELOAD=${PRELOAD:-yes}
case $PRELOAD in yes | no) ;; *) echo "PRELOAD: $PRELOAD is not yes or no" >&2; exit 2 ;; esac
OUT=$(realpath -m "${OUT:-target/bench-scale/$N}")

if [ -z "${KNIT_BIN:-}" ]; then
    cargo build --release -q -p knit-cli -p knit-agent -p knit-local -p knit-kubelet-sim
fi
BIN=$(realpath "${KNIT_BIN:-target/release}")
# The sampler and report are run as scripts: no __pycache__ in bench/.
export PYTHONDONTWRITEBYTECODE=1
# A /22 of 10.250.0.0/16 (1,022 addresses), or a /20 of 10.251.0.0/16 past
# 1,000 machines: /16s no test or other benchmark uses (the end-to-end
# suites take 10.216.x/24s, the other benchmarks 10.217, 10.218 and
# 10.254), and of them the first from the PID's on that no host route
# overlaps, so that runs side by side do not collide.
SUBNET=$(python3 - "$N" "$$" <<'PY'
import ipaddress, json, subprocess, sys
n, pid = int(sys.argv[1]), int(sys.argv[2])
base, prefix = ("10.250.0.0/16", 22) if n <= 1000 else ("10.251.0.0/16", 20)
nets = list(ipaddress.ip_network(base).subnets(new_prefix=prefix))
routes = [ipaddress.ip_network(r["dst"] if "/" in r["dst"] else r["dst"] + "/32", strict=False)
          for r in json.loads(subprocess.run(["ip", "-j", "-4", "route", "show", "table", "all"],
                              capture_output=True, text=True, timeout=30).stdout or "[]")
          if r.get("dst", "default") not in ("default",) and r["dst"][0].isdigit()]
for i in range(len(nets)):
    net = nets[(pid + i) % len(nets)]
    if not any(net.overlaps(r) for r in routes if r.prefixlen > 0):
        print(net)
        break
else:
    sys.exit(f"no free /{prefix} in {base}")
PY
)
GATEWAY=$(python3 -c "import ipaddress, sys; print(ipaddress.ip_network(sys.argv[1])[1])" "$SUBNET")
BRIDGE=kbsc$$
BRIDGE=${BRIDGE:0:15}
# Made after the checks above, so that a run refused there leaves nothing.
WORK=$(mktemp -d -t knit-scale-bench-XXXXXX)
export KNIT_CONFIG=$WORK/config
# shellcheck source=bench/lib.sh
. bench/lib.sh
PORT=$(bench_free_port)
CLUSTER_PORT=$(bench_free_port)
SAMPLER=
SERVER=

# Every process started here is recorded and ended by its PID; the local
# cloud is taken down by its state directory; the run fails if anything of
# it is left (processes, loop devices, mounts, veths, namespaces, cgroups).
cleanup() {
    local rc=$?
    trap - EXIT
    touch "$WORK/stop"
    if [ -n "$SAMPLER" ]; then wait "$SAMPLER" 2>/dev/null || true; fi
    bench_end_all 30
    "$BIN/knit-local" --state-dir "$WORK/local" --bridge "$BRIDGE" --subnet "$SUBNET" down >/dev/null 2>&1 || true
    if [ -f "$WORK/seen.json" ]; then
        python3 bench/scale_sampler.py left "$WORK" "$BRIDGE" after-down || rc=1
    fi
    bench_left "$WORK" || rc=1
    if [ "$rc" != 0 ] && [ -f "$WORK/server/server.log" ]; then
        mkdir -p "$OUT" && cp "$WORK/server/server.log" "$OUT/server.log"
        echo "server log kept: $OUT/server.log" >&2
    fi
    rm -rf "$WORK"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 143' TERM INT

ms() { date +%s%3N; }
# The time and the embedded API's metrics, into $WORK/metrics-$1.txt
# (empty when the API does not answer: the report says so).
api_counters() {
    { ms; kubectl --kubeconfig "$KUBECONFIG_FILE" --request-timeout=30s get --raw /metrics; } \
        >"$WORK/metrics-$1.txt" 2>/dev/null || : >"$WORK/metrics-$1.txt"
}
phase() { echo "$1" >"$WORK/phase"; }
# The sampler's last line, field $1 (1-based: 3 instances, 4 nodes, 5 ready, 6 bridge ports, 7 loops).
last() { tail -n 1 "$WORK/samples.csv" | cut -d, -f"$1"; }

echo "scale bench: N=$N, $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo), $(date -u +%FT%TZ), binaries $BIN"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
"$BIN/knit" package build --no-runtime --state-dir "$WORK/server" >"$WORK/package.log" 2>&1 ||
    { cat "$WORK/package.log" >&2; exit 1; }
"$BIN/knit" server --write-config --state-dir "$WORK/server" --cluster embedded --cluster-port "$CLUSTER_PORT" \
    --listen "127.0.0.1:$PORT,$GATEWAY:$PORT" --advertise-address "$GATEWAY" --console-listen off \
    --parallelism "$PARALLELISM" --local-state-dir "$WORK/local" --local-bridge "$BRIDGE" \
    --local-subnet "$SUBNET" >"$WORK/server.log" 2>&1 &
SERVER=$!
bench_track "$SERVER" "$WORK/server"
for _ in $(seq 300); do
    [ -f "$KNIT_CONFIG" ] && "$BIN/knit" get clusters >/dev/null 2>&1 && break
    bench_ours "$SERVER" || { cat "$WORK/server.log" >&2; echo "the server exited" >&2; exit 1; }
    sleep 0.1
done
KUBECONFIG_FILE=$WORK/server/cluster/admin.kubeconfig
for _ in $(seq 300); do [ -f "$KUBECONFIG_FILE" ] && break; sleep 0.1; done

IMAGE=debian-12
if [ "$PRELOAD" = yes ]; then
    # The run's own images directory: the host's current image, preloaded.
    mkdir -p "$WORK/images"
    ln -s "$(realpath "${KNIT_IMAGES_DIR:-/var/lib/knit/images}/debian-12")" "$WORK/images/debian-12"
    "$BIN/knit" image preload --out "$WORK/images" --state-dir "$WORK/server" >"$WORK/preload.log" 2>&1 ||
        { cat "$WORK/preload.log" >&2; exit 1; }
    IMAGE=$WORK/images/debian-12-preloaded/root
fi
echo "image: $IMAGE"
cat >"$WORK/pool.yaml" <<POOL
apiVersion: knit.dev/v1alpha1
kind: NodePool
metadata: {name: scale}
spec:
  replicas: 0
  runtime: none
  image: $IMAGE
  systemDisk: {sizeGiB: 20}
  preUserData: touch /var/.skip-yum
POOL
# The basic edition's node quota is 10: the Cluster as the server has it,
# with room for N.
"$BIN/knit" get cluster knit -o json >"$WORK/cluster.json"
python3 - "$WORK/cluster.json" "$N" <<'PY'
import json, sys
path, n = sys.argv[1], int(sys.argv[2])
with open(path) as f:
    c = json.load(f)
c = {k: c[k] for k in ("apiVersion", "kind", "spec")} | {"metadata": {"name": c["metadata"]["name"]}}
c["spec"]["nodeQuota"] = max(n, c["spec"].get("nodeQuota") or 0)
with open(path, "w") as f:
    json.dump(c, f)
PY
"$BIN/knit" apply -f "$WORK/cluster.json" >/dev/null
"$BIN/knit" create -f "$WORK/pool.yaml" >/dev/null

phase idle
python3 bench/scale_sampler.py sample "$WORK" "$SERVER" "$KUBECONFIG_FILE" "$BRIDGE" "$INTERVAL" &
SAMPLER=$!
bench_track "$SAMPLER" scale_sampler.py
for _ in $(seq 100); do [ -s "$WORK/samples.csv" ] && [ "$(wc -l <"$WORK/samples.csv")" -ge 2 ] && break; sleep 0.1; done
sleep "$IDLE"

# 0 → N with one request; all Ready when the sampler has seen N Ready.
phase out
t0=$(ms)
"$BIN/knit" scale pool scale --replicas "$N" >/dev/null
ready_at=0
while [ $(($(ms) - t0)) -lt $((TIMEOUT * 1000)) ]; do
    if [ "$(last 5)" = "$N" ]; then ready_at=$(ms); break; fi
    sleep "$INTERVAL"
done
all_ready=1
if [ "$ready_at" = 0 ]; then
    all_ready=0
    echo "not all $N nodes Ready within $TIMEOUT s (last sample: $(tail -n 1 "$WORK/samples.csv"))" >&2
    ready_at=$(ms)
fi
phase steady
sleep 2
python3 bench/scale_sampler.py census "$WORK"
sleep "$STEADY"
# The control plane at N with nobody asking it anything (the sampler's
# kubectl lists every Node each interval): what N nodes alone cost, and
# what they ask (the embedded API's request counters at both ends).
phase quiet
api_counters start
sleep "$QUIET"
api_counters end

# N → 0; done when no instance record, bridge port or loop device is left.
phase in
t_in=$(ms)
"$BIN/knit" scale pool scale --replicas 0 >/dev/null
gone=0
while [ $(($(ms) - t_in)) -lt $((TIMEOUT * 1000)) ]; do
    if [ "$(last 3)" = 0 ] && [ "$(last 6)" = 0 ] && [ "$(last 7)" = 0 ] && [ "$(last 4)" = 0 ]; then gone=1; break; fi
    sleep "$INTERVAL"
done
[ "$gone" = 1 ] || echo "machines or nodes still there $TIMEOUT s after the scale-in request: $(tail -n 1 "$WORK/samples.csv")" >&2
phase after
sleep "$AFTER"
touch "$WORK/stop"
wait "$SAMPLER" || true
SAMPLER=

echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 bench/scale_sampler.py report "$WORK" "$OUT" "$N" "$t0" "$ready_at" "$t_in"
python3 bench/scale_sampler.py requests "$WORK"
left_ok=0
python3 bench/scale_sampler.py left "$WORK" "$BRIDGE" || left_ok=1
if [ "${CHART:-yes}" = yes ]; then
    if [ -x "$BIN/examples/scale_chart" ]; then
        chart=$BIN/examples/scale_chart
    else
        cargo build --release -q -p knit-bench --example scale_chart
        chart=target/release/examples/scale_chart
    fi
    "$chart" "$OUT/samples.csv" "$OUT/ready.png" "$N" && echo "chart: $OUT/ready.png"
fi
[ "$all_ready" = 1 ] && [ "$gone" = 1 ] && [ "$left_ok" = 0 ]
