#!/usr/bin/env bash
# Builds knit's Debian package from binaries already built:
#   packaging/debian/build-deb.sh [--bin-dir target/dist] [--out DIR]
#                                 [--compression xz|gzip|none]
# The package holds knit, knit-agent, knit-local, knit-kubelet-sim and
# knit-registry in /usr/bin, the knit-server.service unit, the config file
# /etc/knit/server.yaml (a conffile: upgrades keep your edits) and the docs.
set -euo pipefail
cd "$(dirname "$0")/../.."

bin_dir=target/dist
out=target/debian
compression=xz
while [ $# -gt 0 ]; do
    case "$1" in
        --bin-dir) bin_dir="$2"; shift 2 ;;
        --out) out="$2"; shift 2 ;;
        --compression) compression="$2"; shift 2 ;;
        *) echo "build-deb.sh: unknown argument $1 (--bin-dir DIR, --out DIR, --compression xz|gzip|none)" >&2; exit 2 ;;
    esac
done

bins=(knit knit-agent knit-local knit-kubelet-sim knit-registry)
for b in "${bins[@]}"; do
    if [ ! -x "$bin_dir/$b" ]; then
        echo "build-deb.sh: $bin_dir/$b is missing: build first (cargo build --profile dist --bins)" >&2
        exit 1
    fi
done

version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)
arch=$(dpkg --print-architecture)
stage=$(mktemp -d)
chmod 0755 "$stage"
trap 'rm -rf "$stage"' EXIT

install -d "$stage/DEBIAN" "$stage/usr/bin" "$stage/lib/systemd/system" \
    "$stage/etc/knit" "$stage/usr/share/doc/knit"
for b in "${bins[@]}"; do
    install -m 0755 "$bin_dir/$b" "$stage/usr/bin/$b"
done
install -m 0644 packaging/debian/knit-server.service "$stage/lib/systemd/system/"
install -m 0600 packaging/debian/server.yaml "$stage/etc/knit/server.yaml"
for d in README.md docs/install.md docs/control-plane.md docs/architecture.md; do
    install -m 0644 "$d" "$stage/usr/share/doc/knit/"
done
printf 'knit\nLicense: Apache-2.0 (/usr/share/common-licenses/Apache-2.0)\n' \
    > "$stage/usr/share/doc/knit/copyright"

# What the main job runs (scripts/setup.sh's main group, less the build),
# and Debian's SQLite, which knit links (the state store).
cat > "$stage/DEBIAN/control" <<CONTROL
Package: knit
Version: $version
Architecture: $arch
Maintainer: knit developers <knit@localhost>
Section: admin
Priority: optional
Depends: libsqlite3-0, e2fsprogs, xfsprogs, util-linux, iproute2, kmod, nftables, containerd, runc, containernetworking-plugins, mmdebstrap, dpkg-dev, gpg, curl, ca-certificates
Suggests: postgresql, haproxy, qemu-system-x86, qemu-utils
Installed-Size: $(du -sk "$stage" | cut -f1)
Description: node pools for Kubernetes, on your own machines
 knit brings Kubernetes nodes to life the way a managed Kubernetes service
 does: node pools, a node agent that initializes a machine step by step and
 joins it to the cluster, adding machines you already own, and data-disk
 snapshots that make scale-out fast.
CONTROL
echo /etc/knit/server.yaml > "$stage/DEBIAN/conffiles"
install -m 0755 packaging/debian/postinst "$stage/DEBIAN/postinst"
install -m 0755 packaging/debian/prerm "$stage/DEBIAN/prerm"
install -m 0755 packaging/debian/postrm "$stage/DEBIAN/postrm"

mkdir -p "$out"
deb="$out/knit_${version}_${arch}.deb"
dpkg-deb --root-owner-group "-Z$compression" --build "$stage" "$deb" >/dev/null
echo "$deb"
