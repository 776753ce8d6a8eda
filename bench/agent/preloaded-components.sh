#!/usr/bin/env bash
# The kubernetes-components phase on a node whose image has the package
# preloaded (issue 31 item 4), for docs/benchmarks.md. Run as root from the
# repository:
#   bash bench/agent/preloaded-components.sh AGENT [AGENT…]
#
# Each AGENT (a knit-agent binary) preloads an image root of its own, as
# `knit image preload` does (`knit-agent --root IMAGE preload`), from the
# package the local mirror serves (PACKAGE, default the server's
# kubernetes-1.31.4 tarball). Then ROUNDS (default 10) rounds, the agents
# taking turns within each round (order reversed every other round): a
# fresh node root, an overlay over the agent's image as the local cloud
# makes it (its upper layer on this host's disk, not a loop disk), `init
# --stop-after kubernetes-components` with PARALLEL (default 1) such nodes
# at once, and the phase's own duration from each node's journal. One
# round before the measured ones warms the page cache (a host's nodes
# share it) and is not counted. Prints every run, then per agent the
# median, min and max of the phase's duration in ms.
#
# Nothing it makes outlives it: the overlays are unmounted and the work
# directory removed on exit; it starts no process that outlives a run (the
# services start in `join`, which is not run).
set -euo pipefail
cd "$(dirname "$0")/../.."

if [ "$#" -eq 0 ]; then
    echo "usage: $0 AGENT [AGENT…]" >&2
    exit 2
fi
ROUNDS=${ROUNDS:-10}
PARALLEL=${PARALLEL:-1}
PACKAGE=${PACKAGE:-/var/lib/knit/server/mirror/pkg/kubernetes/kubernetes-1.31.4-linux-amd64.tar.gz}
VERSION=$(basename "$PACKAGE" | sed -n 's/^kubernetes-\(.*\)-linux-amd64\.tar\.gz$/\1/p')
SHA=$(sha256sum "$PACKAGE" | cut -d' ' -f1)
if [ -z "$VERSION" ]; then
    echo "$PACKAGE: not a kubernetes-<version>-linux-amd64.tar.gz" >&2
    exit 2
fi

WORK=$(mktemp -d /var/tmp/knit-preloaded-components.XXXXXX)
cleanup() {
    local rc=$? m
    trap - EXIT
    while read -r m; do
        umount "$m" 2>/dev/null || umount -l "$m" || rc=1
    done < <(awk -v dir="$WORK/" 'index($5, dir) == 1 {print $5}' /proc/self/mountinfo | sort -r)
    rm -rf "$WORK"
    exit "$rc"
}
trap cleanup EXIT

cat >"$WORK/config.yaml" <<EOF
apiVersion: knit.dev/v1alpha1
kind: NodeConfig
node: {region: cn-bench, instanceId: i-0001, ip: 10.0.0.7}
kubernetes: {version: "$VERSION", sha256: "$SHA"}
timeSync: {enabled: false}
basePackages: {enabled: false}
EOF

AGENTS=()
for agent in "$@"; do
    AGENTS+=("$(realpath "$agent")")
done
for i in "${!AGENTS[@]}"; do
    mkdir -p "$WORK/image$i"
    "${AGENTS[$i]}" --root "$WORK/image$i" preload --package "$PACKAGE" \
        --kubernetes-version "$VERSION" --sha256 "$SHA" >/dev/null
done

# One node on agent I's image: prints the phase's duration in ms.
node() {
    local i=$1 dir=$2
    mkdir -p "$dir/upper" "$dir/work" "$dir/root"
    mount -t overlay overlay \
        -o "lowerdir=$WORK/image$i,upperdir=$dir/upper,workdir=$dir/work" "$dir/root"
    "${AGENTS[$i]}" --root "$dir/root" init --config "$WORK/config.yaml" \
        --stop-after kubernetes-components >"$dir/out" 2>&1 || {
        cat "$dir/out" >&2
        return 1
    }
    python3 -c 'import json, sys
p = json.load(open(sys.argv[1]))["phases"]["kubernetes-components"]
assert p["outcome"] == "done", p
print(p["durationMs"])' "$dir/root/var/lib/knit/journal.json"
    umount "$dir/root"
    rm -rf "$dir"
}

# PARALLEL nodes at once on agent I's image: one line per node.
nodes() {
    local i=$1 run=$2 n pids=() failed=0
    for n in $(seq 1 "$PARALLEL"); do
        node "$i" "$WORK/node-$run-$n" >"$WORK/ms-$run-$n" &
        pids+=("$!")
    done
    # Every node waited for, so that none still runs when one failed.
    for n in "${!pids[@]}"; do
        wait "${pids[$n]}" || failed=1
    done
    [ "$failed" -eq 0 ]
    cat "$WORK"/ms-"$run"-*
    rm -f "$WORK"/ms-"$run"-*
}

echo "package $PACKAGE ($VERSION), $ROUNDS rounds, $PARALLEL node(s) at once, load $(cut -d' ' -f1-3 /proc/loadavg), $(date -u +%FT%TZ)"
for round in $(seq 0 "$ROUNDS"); do
    order=("${!AGENTS[@]}")
    if [ $((round % 2)) -eq 1 ]; then
        mapfile -t order < <(printf '%s\n' "${!AGENTS[@]}" | sort -rn)
    fi
    for i in "${order[@]}"; do
        ms=$(nodes "$i" "$round-$i")
        if [ "$round" -gt 0 ]; then
            echo "$ms" >>"$WORK/result$i"
            echo "round $round agent $i: $(echo "$ms" | tr '\n' ' ')"
        fi
    done
done
echo "load $(cut -d' ' -f1-3 /proc/loadavg), $(date -u +%FT%TZ)"
for i in "${!AGENTS[@]}"; do
    sort -n "$WORK/result$i" | awk -v agent="${AGENTS[$i]}" '
        { v[NR] = $1 }
        END {
            m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
            printf "%s: kubernetes-components median %s ms, min %s, max %s (%d nodes)\n", agent, m, v[1], v[NR], NR
        }'
done
