#!/usr/bin/env bash
# knit-agent benchmark (issue 2): a full `init` on a --root tree with a loop
# data disk and components from a local package directory (no network).
# Reports: wall time / time inside external commands, peak RSS, and start-up
# time of `knit-agent --version` beside `cloud-init --version`.
# Run as root from the repository: bash bench/agent/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."

RUNS=${RUNS:-5}
cargo build --release -q -p knit-agent -p knit-kubelet-sim
AGENT=$PWD/target/release/knit-agent
KUBELET=$PWD/target/release/knit-kubelet-sim

work=$(mktemp -d /tmp/knit-agent-bench.XXXXXX)
cleanup() {
    while read -r m; do umount -l "$m" 2>/dev/null || true; done < <(awk -v dir=" $work" 'index($0, dir) {print $5}' /proc/self/mountinfo | sort -r)
    # Loop devices over this run's disk images, found by backing file.
    for l in $(losetup -j "$work/disk"* 2>/dev/null | cut -d: -f1); do losetup -d "$l" 2>/dev/null || true; done
    losetup -a | grep "$work/" | cut -d: -f1 | xargs -r -n1 losetup -d 2>/dev/null || true
    rm -rf "$work"
}
# shellcheck source=bench/lib.sh
. bench/lib.sh
# The agent runs in the foreground; whatever it started (services under
# --root) names $work, and the run fails if any is left.
finish() {
    local rc=$?
    trap - EXIT
    bench_left "$work" || rc=1
    cleanup
    exit "$rc"
}
trap finish EXIT

# The package: the layout of kubernetes-<v>-linux-amd64.tar.gz.
version=1.31.4
pkgsrc=$work/pkgsrc/pkg/kubernetes
mkdir -p "$pkgsrc/bin"
cp "$KUBELET" "$pkgsrc/bin/kubelet"
for b in containerd containerd-shim-runc-v2 ctr runc; do cp "$(command -v $b)" "$pkgsrc/bin/$b"; done
: > "$pkgsrc/images.txt"
files=$(cd "$pkgsrc" && for f in bin/*; do printf '"%s":"%s",' "$f" "$(sha256sum "$f" | cut -d' ' -f1)"; done)
printf '{"version":"%s","containerdVersion":"%s","files":{%s}}\n' "$version" \
    "$(containerd --version | awk '{print $3}')" "${files%,}" > "$pkgsrc/knit-package.json"
mkdir -p "$work/pkgdir"
tar -C "$work/pkgsrc" -czf "$work/pkgdir/kubernetes-$version-linux-amd64.tar.gz" pkg
tarsum=$(sha256sum "$work/pkgdir/kubernetes-$version-linux-amd64.tar.gz" | cut -d' ' -f1)
pkgbytes=$(stat -c %s "$work/pkgdir/kubernetes-$version-linux-amd64.tar.gz")

one_run() {
    local root=$work/root$1
    mkdir -p "$root/dev" "$root/etc" "$root/var/lib/containerd/seed" "$root/pkg"
    cp "$work/pkgdir/"* "$root/pkg/"
    # Some runtime data to carry over with keep-container-data.
    head -c 32M /dev/urandom > "$root/var/lib/containerd/seed/layer"
    touch "$root/var/.keep-container-data"
    truncate -s 2G "$work/disk$1.img"
    local l; l=$(losetup -f --show "$work/disk$1.img")
    local rdev; rdev=$(stat -c '%t %T' "$l")
    mknod "$root/dev/vdb" b $((16#${rdev% *})) $((16#${rdev#* }))
    cat > "$root/node.yaml" <<YAML
apiVersion: knit.dev/v1alpha1
kind: NodeConfig
node: {region: bench, instanceId: i-$1, ip: 10.213.0.9}
dataDisk: {enabled: true}
kubernetes: {version: "$version", dir: /pkg, sha256: "$tarsum"}
YAML
    /usr/bin/time -f '%e %M' -o "$work/time$1" "$AGENT" --root "$root" init --config "$root/node.yaml" >/dev/null
    python3 - "$root/var/lib/knit/journal.json" "$work/time$1" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
wall, rss_kb = open(sys.argv[2]).read().split()
phases = j["phases"]
dur = sum(p.get("durationMs", 0) for p in phases.values())
cmd = sum(p.get("commandMs", 0) for p in phases.values())
print(f"{float(wall)*1000:.0f} {dur} {cmd} {int(rss_kb)/1024:.1f} "
      + " ".join(f"{k}={v.get('durationMs',0)}/{v.get('commandMs',0)}" for k, v in phases.items()))
PY
    # The same package work with the standard tools, on the same disks, for
    # comparison: verify the tarball, unpack it onto the data disk, verify
    # every file, install the binaries, flush.
    local shell_dir=$root/var/lib/container/shell-baseline
    local t0; t0=$(date +%s%N)
    sha256sum "$root/pkg/kubernetes-$version-linux-amd64.tar.gz" >/dev/null
    mkdir -p "$shell_dir" "$root/shell-bin"
    tar -C "$shell_dir" -xzf "$root/pkg/kubernetes-$version-linux-amd64.tar.gz"
    (cd "$shell_dir/pkg/kubernetes" && sha256sum bin/* images.txt knit-package.json >/dev/null)
    cp "$shell_dir"/pkg/kubernetes/bin/* "$root/shell-bin/"
    sync -f "$root/shell-bin" "$shell_dir"
    local shell_ms=$(( ($(date +%s%N) - t0) / 1000000 ))
    echo "shell_components_ms=$shell_ms" >&2
    while read -r m; do umount -l "$m"; done < <(awk -v dir=" $root" 'index($0, dir) {print $5}' /proc/self/mountinfo | sort -r)
    # one_run runs in a subshell: detach here, the trap cannot see this loop.
    losetup -d "$l"
}

echo "package: $pkgbytes bytes; runs: $RUNS"
echo "run wall_ms phases_ms command_ms rss_mib per-phase(duration/command ms) shell baseline of the package work"
for i in $(seq 1 "$RUNS"); do echo "$i $(one_run "$i" 2>"$work/shell$i") $(cat "$work/shell$i")"; done

if command -v hyperfine >/dev/null; then
    args=("$AGENT --version")
    command -v cloud-init >/dev/null && args+=("cloud-init --version")
    hyperfine -N --warmup 3 --runs 30 "${args[@]}" 2>/dev/null | grep -E "Time|±|Benchmark" || true
fi
