#!/usr/bin/env bash
# Installs what knit and its tests need on a fresh Debian machine. Idempotent.
# Run as root. Add a package here when a test or the main job needs it.
set -euo pipefail

if [ "$(id -u)" -ne 0 ]; then
    echo "setup.sh: must run as root (it installs Debian packages)" >&2
    exit 1
fi

PACKAGES=(
    e2fsprogs xfsprogs util-linux iproute2 kmod   # disks, mounts, namespaces, veth, tc
    fdisk attr                                    # partition tables and xattrs in data-disk tests
    pigz containernetworking-plugins              # base tools and CNI plugins the sandbox machines inherit from the host root
    containerd runc                                 # the real container runtime inside instances
    docker-registry                                 # the local OCI registry (snapshot tests)
    python3                                         # user-data composition parse check
    curl ca-certificates
    iputils-ping                                    # instances ping each other (knit-local tests)
    iptables                                        # attach e2e: cut one instance off the gateway (rule removed after)
    nftables                                        # knit-local: anti-spoofing guard on every instance's link (nft)
    cloud-init                                      # knit-local: the optional cloud-init user-data runner (test)
    chrony                                          # time-sync on every node (chronyd, tracking only in sandboxes)
    protobuf-compiler                               # protoc: builds the CRI API bindings (k8s-cri)
    mmdebstrap                                      # knit image build: the node OS image from Debian packages
    dpkg-dev                                        # knit package build: dpkg-scanpackages indexes the mirror's Debian repository
    gpg                                             # knit package build: signs that repository (InRelease, Release.gpg)
    dosfstools mtools                               # knit-qemu: the cloud-init NoCloud seed (vfat, label CIDATA)
    shellcheck                                      # scripts/test.sh: lints every tracked *.sh
    chromium chromium-driver fonts-liberation       # the web console's browser test (headless, WebDriver)
    postgresql                                      # the PostgreSQL datastore: knit up --ha and the tests run their own server from its binaries (own data dir and port; Debian's cluster service is left alone)
    haproxy                                         # knit up --ha: one address (TCP, health-checked) in front of the servers
)

missing=()
for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "setup.sh: installing ${missing[*]}"
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# The QEMU provider: qemu-system-x86 and qemu-utils (qemu-img) must come from
# the same Debian release. A machine image may ship a newer qemu-utils
# (a backport) than bookworm's qemu-system-x86, and apt then refuses the pair:
# install both at qemu-system-x86's candidate version, downgrading qemu-utils.
qemu_version=$(apt-cache policy qemu-system-x86 2>/dev/null | awk '/Candidate:/ {print $2}')
if [ -z "$qemu_version" ] || [ "$qemu_version" = "(none)" ]; then
    apt-get update -q
    qemu_version=$(apt-cache policy qemu-system-x86 | awk '/Candidate:/ {print $2}')
fi
if [ -n "$qemu_version" ] && [ "$qemu_version" != "(none)" ]; then
    have_system=$(dpkg-query -W -f='${Version}' qemu-system-x86 2>/dev/null || true)
    have_utils=$(dpkg-query -W -f='${Version}' qemu-utils 2>/dev/null || true)
    if [ "$have_system" != "$qemu_version" ] || [ "$have_utils" != "$qemu_version" ]; then
        echo "setup.sh: installing qemu-system-x86 and qemu-utils $qemu_version"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends --allow-downgrades \
            "qemu-system-x86=$qemu_version" "qemu-utils=$qemu_version"
    fi
else
    echo "setup.sh: qemu-system-x86 has no install candidate in apt's sources; the QEMU provider's tests will be skipped" >&2
fi

# Debian starts services on install where it can; knit runs its own instances
# of them, so the host copies must not hold the sockets or ports.
for svc in containerd docker-registry; do
    if pgrep -x "$svc" >/dev/null 2>&1 && [ -x "/etc/init.d/$svc" ]; then
        "/etc/init.d/$svc" stop >/dev/null 2>&1 || true
    fi
done

if ! command -v cargo >/dev/null; then
    echo "setup.sh: cargo not found: install a Rust toolchain (rustup) first" >&2
    exit 1
fi
if ! command -v cargo-nextest >/dev/null; then
    cargo install --locked cargo-nextest
fi
modprobe loop 2>/dev/null || true
modprobe overlay 2>/dev/null || true
