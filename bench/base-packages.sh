#!/usr/bin/env bash
# The package mirror's Debian repository as nodes use it, for
# docs/benchmarks.md (run as root from the repository root):
#   bash bench/base-packages.sh [NODES] [ROUNDS]
#
# 1. `knit up` on the real local cloud (a temporary state directory, a
#    bridge, subnet and ports of its own), the mirror assembled by `knit
#    package build` (the Debian repository signed when gpg is installed).
# 2. ROUNDS (default 5) times `apt-get update` from this host against the
#    mirror's repository, apt's state in a temporary directory (`-o Dir::…`:
#    the host's lists, cache, dpkg status and configuration files are not
#    read or written): the wall time of each, and apt's lines of the first.
# 3. A pool of NODES (default 3) scaled from 0 with `--wait`: per node, the
#    base-packages phase (nothing to install: the image has pigz and
#    zlib1g) and the whole initialization, from the agent's log
#    (`knit logs node`: "[init] initializing" to "[init] node … initialized"),
#    and the time `knit scale --wait` took.
# Everything is released on exit (`knit down`, then the local cloud by its
# state directory).
#
# KNIT_BIN=DIR uses the binaries in DIR (knit, knit-agent, knit-local,
# knit-kubelet-sim) instead of building the release ones.
set -euo pipefail
cd "$(dirname "$0")/.."
NODES=${1:-3}
ROUNDS=${2:-5}

if [ -z "${KNIT_BIN:-}" ]; then
    cargo build --release -q -p knit-cli -p knit-agent -p knit-local -p knit-kubelet-sim
fi
BIN=$(realpath "${KNIT_BIN:-target/release}")
WORK=$(mktemp -d)
STATE=$WORK/server
BRIDGE=kbbp$$
BRIDGE=${BRIDGE:0:15}
SUBNET=10.218.$(( $$ % 200 + 20 )).0/24
GATEWAY=${SUBNET%.0/24}.1
export KNIT_CONFIG=$WORK/config

# shellcheck source=bench/lib.sh
. bench/lib.sh
PORT=$(bench_free_port)
CLUSTER_PORT=$(bench_free_port)

# The server `knit up` started is recorded (bench_track_up) and ended by its
# PID should `knit down` not stop it; the run fails if anything of it is
# left running.
cleanup() {
    local rc=$?
    trap - EXIT
    "$BIN/knit" down --timeout 120 >/dev/null 2>&1 || true
    bench_end_all 10
    "$BIN/knit-local" --state-dir "$WORK/local" --bridge "$BRIDGE" --subnet "$SUBNET" down >/dev/null 2>&1 || true
    bench_left "$WORK" || rc=1
    rm -rf "$WORK"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 143' TERM INT

echo "load: $(uptime)"
"$BIN/knit" image build >/dev/null
"$BIN/knit" package build --state-dir "$STATE" | grep -E '^debian repository|warning' || true
"$BIN/knit" up --state-dir "$STATE" --listen "127.0.0.1:$PORT,$GATEWAY:$PORT" \
    --cluster-port "$CLUSTER_PORT" --console-listen off \
    --local-state-dir "$WORK/local" --local-bridge "$BRIDGE" --local-subnet "$SUBNET" >/dev/null
bench_track_up "$KNIT_CONFIG"
REPO=$STATE/mirror/debian
if [ -f "$REPO/InRelease" ]; then signed=yes; else signed=no; fi
echo "repository: $(grep -c '^Package:' "$REPO/Packages") packages, signed: $signed"

# apt-get update from this host, apt's state and configuration in $APT only.
APT=$WORK/apt
mkdir -p "$APT/lists/partial" "$APT/cache/archives/partial" "$APT/sources" "$APT/parts"
: > "$APT/status"
if [ "$signed" = yes ]; then
    cp "$REPO/knit-archive-keyring.gpg" "$APT/key.gpg"
    trust="Signed-By: $APT/key.gpg"
else
    trust="Trusted: yes"
fi
printf 'Types: deb\nURIs: https://127.0.0.1:%s/mirror/debian/\nSuites: ./\n%s\n' "$PORT" "$trust" \
    > "$APT/sources/knit.sources"
apt_update() {
    apt-get -o Dir::Etc::main=/dev/null -o Dir::Etc::Parts="$APT/parts" \
        -o Dir::Etc::SourceList=/dev/null -o Dir::Etc::SourceParts="$APT/sources" \
        -o Dir::State::Lists="$APT/lists" -o Dir::Cache="$APT/cache" \
        -o Dir::State::status="$APT/status" -o Debug::NoLocking=1 \
        -o APT::Sandbox::User=root -o Acquire::https::CaInfo="$STATE/pki/ca.pem" \
        -o Acquire::Retries=0 -o Acquire::https::Timeout=20 update
}
times=()
for round in $(seq 1 "$ROUNDS"); do
    rm -rf "$APT/lists"; mkdir -p "$APT/lists/partial"
    start=$(date +%s%N)
    out=$(apt_update 2>&1)
    times+=($(( ($(date +%s%N) - start) / 1000000 )))
    if [ "$round" = 1 ]; then while IFS= read -r line; do echo "  apt: $line"; done <<< "$out"; fi
done
again_start=$(date +%s%N)
again=$(apt_update 2>&1 | grep -cE '^(Get|Ign|Err)' || true)
again_ms=$(( ($(date +%s%N) - again_start) / 1000000 ))
sorted=$(printf '%s\n' "${times[@]}" | sort -n | tr '\n' ' ')
echo "apt-get update from empty lists, $ROUNDS rounds (ms, sorted): $sorted"
echo "apt-get update again, lists current: ${again_ms} ms, $again Get/Ign/Err lines"

cat > "$WORK/pool.yaml" <<'POOL'
apiVersion: knit.dev/v1alpha1
kind: NodePool
metadata: {name: bench}
spec:
  replicas: 0
  dataDisks:
  - {sizeGiB: 40, interface: nvme}
POOL
"$BIN/knit" apply -f "$WORK/pool.yaml" >/dev/null
start=$(date +%s%N)
"$BIN/knit" scale pool bench --replicas "$NODES" --wait --timeout 600 >/dev/null
echo "knit scale pool bench --replicas $NODES --wait: $(( ($(date +%s%N) - start) / 1000000 )) ms"
for node in $("$BIN/knit" get nodes -o json | python3 -c '
import json, sys
d = json.load(sys.stdin)
for n in (d["items"] if isinstance(d, dict) else d):
    print(n["name"])
'); do
    "$BIN/knit" logs node "$node" | python3 -c '
import datetime, sys
t = {}
for line in sys.stdin:
    words = line.split()
    if len(words) < 3:
        continue
    at = datetime.datetime.fromisoformat(words[0].replace("Z", "+00:00"))
    if words[1] == "[init]" and words[2] == "initializing":
        t.setdefault("init", at)
    elif words[1] == "[init]" and words[-1] == "initialized":
        t["initialized"] = at
    elif words[1] == "[base-packages]" and words[2] in ("start:", "done:", "skipped:"):
        t[words[2]] = at
ms = lambda a, b: "%d ms" % ((t[b] - t[a]).total_seconds() * 1000) if a in t and b in t else "?"
print("  %s: base-packages %s, initialization %s" % (sys.argv[1], ms("start:", "done:"), ms("init", "initialized")))
' "$node"
done
