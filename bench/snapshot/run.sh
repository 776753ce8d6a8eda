#!/usr/bin/env bash
# Data-disk snapshot benchmark (docs/spec.md §3), one run side by side:
# a pool of NODES nodes scaled 0 → NODES without a snapshot, then a snapshot
# built from that pool, then a pool from the snapshot scaled the same way.
# Every instance's link is shaped to MBIT Mbit/s (tc, both veth ends).
# Measured from the scale request: all nodes Ready, and all listed images
# present on every node (the kubelet stand-in's report written).
#
# Real: local-cloud instances, containerd in each, docker-registry seeded
# with locally built images of random bytes, the agent's package download
# from the control plane's mirror. Modelled: the network plugin's
# install-cni step (writes the CNI config once the plugin image is present,
# as flannel's init container does) — so Ready waits for that image, as it
# does on a real cluster.
#
# Run as root from anywhere:  bash bench/snapshot/run.sh
# Needs kubectl (Ready is read from the embedded cluster's API).
# Knobs (environment): NODES=3 MBIT=100 BIG=300M BIG_LAYERS=3
#   REPEAT=1   scalings of the snapshot pool (0 → NODES, back to 0), each
#              measured; the table shows the first, the steps all of them
#   KNIT_BENCH_BIN=DIR  the binaries from DIR, not built here (a before /
#              after pair run with the same command)
#   STEPS_RAW=DIR  keep the last scaling's per-node records there
#   PRELOAD=no  yes: both pools on the node image with the package and the
#              agent preloaded (`knit image preload`, the run's own images
#              directory): nodes download and write neither
set -euo pipefail
cd "$(dirname "$0")/../.."

NODES=${NODES:-3}
MBIT=${MBIT:-100}
BIG=${BIG:-300M}
BIG_LAYERS=${BIG_LAYERS:-3}

REPEAT=${REPEAT:-1}
PRELOAD=${PRELOAD:-no}
case $PRELOAD in yes | no) ;; *) echo "PRELOAD: $PRELOAD is not yes or no" >&2; exit 2 ;; esac
if [ -n "${KNIT_BENCH_BIN:-}" ]; then
    BIN=$KNIT_BENCH_BIN
else
    cargo build --release -q -p knit-cli -p knit-agent -p knit-local -p knit-kubelet-sim -p knit-registry
    BIN=$PWD/target/release
fi
WORK=$(mktemp -d -t knit-snapshot-bench-XXXXXX)
NET=$(($$ % 200 + 20))
BRIDGE=ksb$$
SUBNET=10.218.$NET.0/24
GW=10.218.$NET.1
PORT=$((21000 + $$ % 9000))
CPORT=$((PORT + 1))
RPORT=$((PORT + 2))
WPORT=$((PORT + 3))
export KNIT_CONFIG=$WORK/config
export KNIT_LOCAL_BANDWIDTH_MBIT=$MBIT
# shellcheck source=bench/lib.sh
. bench/lib.sh
# Every process started here is recorded (bench_track) and ended by its PID;
# the run fails if anything of it is still running at the end.
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    bench_end_all 10
    "$BIN/knit-local" --state-dir "$WORK/local" --bridge "$BRIDGE" --subnet "$SUBNET" down >/dev/null 2>&1 || true
    bench_left "$WORK" || rc=1
    rm -rf "$WORK"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

ms() { date +%s%3N; }
knit() { "$BIN/knit" "$@"; }
local_() { "$BIN/knit-local" --state-dir "$WORK/local" --bridge "$BRIDGE" --subnet "$SUBNET" "$@"; }
jq_() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }

knit package build --state-dir "$WORK/server" >/dev/null
IMAGE=debian-12
if [ "$PRELOAD" = yes ]; then
    mkdir -p "$WORK/images"
    ln -s "$(realpath "${KNIT_IMAGES_DIR:-/var/lib/knit/images}/debian-12")" "$WORK/images/debian-12"
    knit image preload --out "$WORK/images" --state-dir "$WORK/server" >"$WORK/preload.log" 2>&1 ||
        { cat "$WORK/preload.log" >&2; exit 1; }
    IMAGE=$WORK/images/debian-12-preloaded/root
fi
# The binary itself, not the knit() function: `func &` forks a subshell,
# and $! would be that subshell, not the server.
"$BIN/knit" server --write-config --state-dir "$WORK/server" --cluster embedded --cluster-port "$CPORT" \
    --listen "0.0.0.0:$PORT" --advertise-address "$GW" --local-state-dir "$WORK/local" \
    --local-bridge "$BRIDGE" --local-subnet "$SUBNET" --parallelism "$NODES" >"$WORK/server.log" 2>&1 &
bench_track $! "$WORK/server"
for _ in $(seq 300); do [ -f "$KNIT_CONFIG" ] && knit get clusters >/dev/null 2>&1 && break; sleep 0.1; done

# Pull-only where instances reach it; pushes go to a loopback writer over
# the same storage, with the writer credential (knit-writer, the token in
# writer-token; /v2/ answers it 401 without).
"$BIN/knit-registry" serve --dir "$WORK/registry" --addr "0.0.0.0:$RPORT" >"$WORK/registry.log" 2>&1 &
bench_track $! "$WORK/registry"
"$BIN/knit-registry" serve --dir "$WORK/registry" --addr "127.0.0.1:$WPORT" >"$WORK/registry-push.log" 2>&1 &
bench_track $! "$WORK/registry"
for _ in $(seq 100); do
    curl -sf "http://127.0.0.1:$RPORT/v2/" >/dev/null && [ -s "$WORK/registry/writer-token" ] &&
        printf 'user = "knit-writer:%s"\n' "$(cat "$WORK/registry/writer-token")" |
        curl -sf -K - "http://127.0.0.1:$WPORT/v2/" >/dev/null && break
    sleep 0.1
done
APP=docker.io/knit/bench-app:1
IMAGES=(registry.k8s.io/pause:3.10 registry.k8s.io/kube-proxy:v1.31.4 docker.io/flannel/flannel:v0.26.1 "$APP")
t=$(ms)
"$BIN/knit-registry" seed --registry "http://127.0.0.1:$WPORT" --credential-file "$WORK/registry/writer-token" --work "$WORK/seed" \
    registry.k8s.io/pause:3.10=512K registry.k8s.io/kube-proxy:v1.31.4=28M \
    docker.io/flannel/flannel:v0.26.1=30M "$APP=${BIG}x${BIG_LAYERS}" >"$WORK/seed.json"
seed_ms=$(($(ms) - t))
image_bytes=$(python3 -c "import json; print(sum(json.loads(l)['transferBytes'] for l in open('$WORK/seed.json')))")

pool() { # $1 = name, $2 = data disk
    cat <<YAML
apiVersion: knit.dev/v1alpha1
kind: NodePool
metadata: {name: $1}
spec:
  replicas: 0
  image: $IMAGE
  systemDisk: {sizeGiB: 20}
  dataDisks: [$2]
  containerd:
    registryMirrors:
      registry.k8s.io: ["http://$GW:$RPORT"]
      docker.io: ["http://$GW:$RPORT"]
    insecureRegistries: ["$GW:$RPORT"]
  kubelet:
    customizedArgs: {image-list: /etc/knit-bench/images.txt}
  preUserData: |
    touch /var/.skip-yum
    mkdir -p /etc/knit-bench
    printf '%s\n' ${IMAGES[*]} > /etc/knit-bench/images.txt
    # install-cni: the network plugin writes its CNI config once its image is present.
    nohup sh -c 'until ctr -n k8s.io images ls -q 2>/dev/null | grep -qx docker.io/flannel/flannel:v0.26.1; do sleep 0.2; done; mkdir -p /etc/cni/net.d; echo "{\"cniVersion\":\"1.0.0\",\"name\":\"flannel\",\"plugins\":[{\"type\":\"loopback\"}]}" > /etc/cni/net.d/10-flannel.conflist' >/dev/null 2>&1 &
YAML
}

# Scale $1 to NODES; prints "ready_ms images_ms bytes_pulled hits misses".
measure() {
    local p=$1 t0 ready=0 images=0 now ids done_ids
    t0=$(ms)
    echo "$t0" >"$WORK/t0-$p"
    knit scale pool "$p" --replicas "$NODES" >/dev/null
    while :; do
        now=$(ms)
        # Ready as the cluster has it (the control plane polls it every 2 s).
        if [ "$ready" = 0 ] && [ "$(kubectl --kubeconfig "$WORK/server/cluster/admin.kubeconfig" get nodes -l "knit.dev/pool=$p" -o json |
            jq_ "sum(1 for n in d['items'] for c in n['status'].get('conditions', []) if c['type'] == 'Ready' and c['status'] == 'True')")" = "$NODES" ]; then
            ready=$((now - t0))
        fi
        if [ "$images" = 0 ]; then
            # `list`: ID NAME STATE IP TYPE; instance names start with the pool's.
            ids=$(local_ list | awk -v p="$p-" 'index($2, p) == 1 && $3 == "running" {print $1}')
            done_ids=0
            for id in $ids; do
                local_ exec "$id" test -f /var/lib/kubelet/knit-images.json 2>/dev/null && done_ids=$((done_ids + 1))
            done
            [ "$done_ids" = "$NODES" ] && images=$((now - t0))
        fi
        [ "$ready" != 0 ] && [ "$images" != 0 ] && break
        [ $((now - t0)) -gt 1800000 ] && { echo "timeout scaling $p" >&2; exit 1; }
        sleep 0.25
    done
    local bytes=0 hits=0 misses=0 r
    for id in $ids; do
        r=$(local_ exec "$id" cat /var/lib/kubelet/knit-images.json)
        bytes=$((bytes + $(echo "$r" | jq_ "d['bytesPulled']")))
        hits=$((hits + $(echo "$r" | jq_ "d['hit']")))
        misses=$((misses + $(echo "$r" | jq_ "d['miss']")))
    done
    echo "$ready $images $bytes $hits $misses"
}

# Where the time went for each node of pool $1 in the last measure():
# milliseconds from the scale request to each step, from the control
# plane's records (node created, instance created, the agent's phase
# reports), the kubelet stand-in's log and the CNI config's mtime (the
# instances share the host's clock).
steps() {
    local p=$1 id name
    : >"$WORK/steps.jsonl"
    for name in $(knit get nodes -o json | jq_ "' '.join(n['name'] for n in d['items'] if n['pool']=='$p')"); do
        # The local cloud's instance ID is the node's provider ID.
        id=$(knit get nodes -o json | jq_ "[n.get('providerId') for n in d['items'] if n['name']=='$name'][0]")
        {
            printf '{"node": "%s", "describe": ' "$name"
            knit describe node "$name" -o json | tr -d '\n'
            printf ', "kubelet": %s' "$(local_ exec "$id" cat /var/log/knit/kubelet.log 2>/dev/null | python3 -c 'import json,sys; print(json.dumps(sys.stdin.read()))')"
            printf ', "cni": "%s"' "$(local_ exec "$id" stat -c %.3Y /etc/cni/net.d/10-flannel.conflist 2>/dev/null || true)"
            # The user-data stub's steps: started (the CA it writes first),
            # the agent in place, the node's configuration fetched.
            printf ', "files": "%s"}\n' "$(local_ exec "$id" stat -c '%n %.3Y' /var/lib/knit/bootstrap/control-plane-ca.pem \
                /var/lib/knit/bootstrap/knit-agent /var/lib/knit/bootstrap/node-config.yaml 2>/dev/null | tr '\n' ';' || true)"
        } >>"$WORK/steps.jsonl"
    done
    knit get events -o json >"$WORK/events.json"
    if [ -n "${STEPS_RAW:-}" ]; then
        mkdir -p "$STEPS_RAW" && cp "$WORK/steps.jsonl" "$WORK/events.json" "$STEPS_RAW/"
    fi
    python3 bench/snapshot/steps.py "$(cat "$WORK/t0-$p")" "$WORK/steps.jsonl" "$WORK/events.json"
}

echo "seeded $image_bytes bytes of images in $seed_ms ms; scaling without a snapshot" >&2
pool plain "{sizeGiB: 40, interface: nvme}" >"$WORK/plain.yaml"
knit create -f "$WORK/plain.yaml" >/dev/null
read -r a_ready a_images a_bytes a_hits a_misses <<<"$(measure plain)"
a_downloads=$(grep -c 'check cached kubernetes failed' <(for n in $(knit get nodes -o json | jq_ "' '.join(n['name'] for n in d['items'] if n['pool']=='plain')"); do knit logs node "$n"; done) || true)
first_node() { knit get nodes -o json | jq_ "[n['name'] for n in d['items'] if n['pool']=='$1'][0]"; }
knit describe node "$(first_node plain)" >"$WORK/describe-plain.txt"
knit scale pool plain --replicas 0 --wait --timeout 600 >/dev/null

echo "without: Ready $a_ready ms, images $a_images ms; building the snapshot" >&2
t=$(ms)
knit snapshot create --pool plain --images "$APP" --timeout 1800 >"$WORK/build.txt"
build_ms=$(($(ms) - t))
snap=$(knit snapshot list -o json | jq_ "d['items'][0]['id']")
snap_bytes=$(knit snapshot list -o json | jq_ "d['items'][0]['sizeBytes']")

echo "snapshot $snap built in $build_ms ms; scaling from it" >&2
pool fast "{snapshotId: $snap, interface: nvme}" >"$WORK/fast.yaml"
knit create -f "$WORK/fast.yaml" >/dev/null
read -r b_ready b_images b_bytes b_hits b_misses <<<"$(measure fast)"
steps fast >"$WORK/steps-fast-1.txt"
for i in $(seq 2 "$REPEAT"); do
    knit scale pool fast --replicas 0 --wait --timeout 600 >/dev/null
    read -r r_ready r_images _ <<<"$(measure fast)"
    echo "repeat $i: Ready $r_ready ms, images $r_images ms" >&2
    echo "$r_ready" >>"$WORK/repeat-ready.txt"
    steps fast >"$WORK/steps-fast-$i.txt"
done
# Once more as a user waits: `knit scale --wait` returns when every node is
# initialized (all agent phases) and Ready as the control plane has it.
knit scale pool fast --replicas 0 --wait --timeout 600 >/dev/null
t=$(ms)
echo "$t" >"$WORK/t0-fast"
knit scale pool fast --replicas "$NODES" --wait --timeout 600 >/dev/null
wait_ms=$(($(ms) - t))
steps fast >"$WORK/steps-fast-wait.txt"
b_downloads=$(grep -c 'check cached kubernetes failed' <(for n in $(knit get nodes -o json | jq_ "' '.join(n['name'] for n in d['items'] if n['pool']=='fast')"); do knit logs node "$n"; done) || true)

knit describe node "$(first_node fast)" >"$WORK/describe-fast.txt"

ratio() { python3 -c "print(f'{$1/max($2,1):.1f}')"; }
echo "Snapshot benchmark: $NODES nodes, links shaped to $MBIT Mbit/s, $(nproc) cores; images: ${IMAGES[*]} ($image_bytes bytes compressed, seeded in $seed_ms ms)"
echo
echo "| | without snapshot | with snapshot | speed-up |"
echo "|---|---|---|---|"
echo "| scale request → $NODES nodes Ready | $a_ready ms | $b_ready ms | $(ratio "$a_ready" "$b_ready")× |"
echo "| scale request → all listed images present on all nodes | $a_images ms | $b_images ms | $(ratio "$a_images" "$b_images")× |"
echo "| image bytes pulled (all nodes) | $a_bytes | $b_bytes | |"
echo "| image cache hit / miss (all nodes) | $a_hits / $a_misses | $b_hits / $b_misses | |"
echo "| nodes that downloaded the Kubernetes package | $a_downloads | $b_downloads | |"
echo
echo "Snapshot build (knit snapshot create, builder from the shaped pool): $build_ms ms; snapshot $snap holds $snap_bytes bytes used."
sed 's/^/    /' "$WORK/build.txt"
for f in "$WORK"/steps-fast-*.txt; do
    echo
    echo "Steps of pool fast, scaling ${f##*steps-fast-} (ms from the scale request; median of the nodes, max in brackets):"
    sed 's/^/    /' "$f"
done
echo
echo "scale request → knit scale --wait returned (initialized and Ready, as the control plane has it): $wait_ms ms"
if [ -s "$WORK/repeat-ready.txt" ]; then
    echo
    echo "Ready of the repeats: $(tr '\n' ' ' <"$WORK/repeat-ready.txt")ms"
fi
for p in plain fast; do
    echo
    echo "One node of pool $p (knit describe node):"
    sed 's/^/    /' "$WORK/describe-$p.txt"
done
