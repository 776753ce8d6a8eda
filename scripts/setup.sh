#!/usr/bin/env bash
# Installs what knit needs on a Debian machine. Idempotent. Run as root.
#
#   scripts/setup.sh           what the main job runs (scripts/up.sh: knit up
#                              on the local cloud): the local cloud's tools,
#                              the runtime packaged for nodes, the node image
#                              and package mirror builders
#   scripts/setup.sh --ha      and what `knit up --ha` runs (PostgreSQL, HAProxy)
#   scripts/setup.sh --qemu    and what `knit up --provider qemu` runs (QEMU)
#   scripts/setup.sh --tests   everything the tests need (scripts/test.sh)
#
# It installs Debian packages only. It never removes or downgrades a host
# package, nor stops a host service, without asking: such a step is asked
# on a terminal, and skipped (saying what and how to do it) elsewhere,
# unless KNIT_SETUP_HOST_CHANGES=yes allows it (CI does: .ci/run, on a
# fresh machine). Add a package to the group that runs it.
set -euo pipefail

if [ "$(id -u)" -ne 0 ]; then
    echo "setup.sh: must run as root (it installs Debian packages)" >&2
    exit 1
fi

ha=no
qemu=no
tests=no
for arg in "$@"; do
    case $arg in
        --ha) ha=yes ;;
        --qemu) qemu=yes ;;
        --tests) tests=yes; ha=yes; qemu=yes ;;
        *) echo "setup.sh: unknown option $arg (--ha, --qemu, --tests)" >&2; exit 2 ;;
    esac
done

# The main job (scripts/up.sh).
MAIN=(
    e2fsprogs xfsprogs util-linux iproute2 kmod   # the local cloud: disks, mounts, namespaces, veth, tc
    nftables                                      # the local cloud: anti-spoofing guard on every instance's link
    containerd runc                               # knit package build: the container runtime shipped to nodes
    containernetworking-plugins                   # knit package build: the CNI plugins shipped to nodes
    protobuf-compiler                             # protoc: builds the CRI API bindings (k8s-cri) of the kubelet stand-in
    libsqlite3-dev                                # knit links Debian's SQLite (the state store) instead of compiling its own
    mmdebstrap                                    # knit image build: the node OS image from Debian packages
    dpkg-dev                                      # knit package build: dpkg-scanpackages indexes the mirror's Debian repository
    gpg                                           # knit package build: signs that repository (InRelease, Release.gpg)
    curl ca-certificates
)
HA=(
    postgresql                                    # knit up --ha: its own PostgreSQL from Debian's binaries (own data dir and port; Debian's cluster service is left alone)
    haproxy                                       # knit up --ha: one address (TCP, health-checked) in front of the servers
)
QEMU=(
    dosfstools mtools                             # knit-qemu: the cloud-init NoCloud seed (vfat, label CIDATA)
)
# Only the tests (scripts/test.sh).
TESTS=(
    fdisk attr                                    # partition tables and xattrs in data-disk tests
    pigz                                          # base tools the host-root sandboxes of the tests inherit
    docker-registry                               # the local OCI registry (snapshot tests, knit registry up)
    python3                                       # user-data composition parse check
    iputils-ping                                  # instances ping each other (knit-local tests)
    iptables                                      # attach e2e: cut one instance off the gateway (rule removed after)
    cloud-init                                    # knit-local: the optional cloud-init user-data runner (test)
    chrony                                        # time-sync in host-root sandboxes (replaces systemd-timesyncd: asked)
    shellcheck                                    # scripts/test.sh: lints every tracked *.sh
    chromium chromium-driver fonts-liberation     # the web console's browser test (headless, WebDriver)
)

# Whether a change to the host's packages or services may be made: yes
# with KNIT_SETUP_HOST_CHANGES=yes, else asked on a terminal, else no.
may_change_host() {
    if [ "${KNIT_SETUP_HOST_CHANGES:-}" = yes ]; then
        return 0
    fi
    if [ -t 0 ]; then
        local answer
        read -r -p "setup.sh: $1 — go ahead? [y/N] " answer
        [ "$answer" = y ] || [ "$answer" = Y ]
        return
    fi
    return 1
}

updated=no
apt_update() {
    if [ "$updated" = no ]; then
        apt-get update -q
        updated=yes
    fi
}

# Installs the packages not yet installed; an install that would remove a
# host package is asked first (skipped, saying so, when not allowed).
install() {
    local missing=() p removals
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    if [ ${#missing[@]} -eq 0 ]; then
        return 0
    fi
    apt_update
    removals=$(apt-get -s install --no-install-recommends "${missing[@]}" 2>/dev/null \
        | awk '/^Remv / {print $2}' | tr '\n' ' ')
    if [ -n "$removals" ] && ! may_change_host "installing ${missing[*]} removes ${removals}"; then
        echo "setup.sh: NOT installing ${missing[*]}: it would remove ${removals}from this host." >&2
        echo "          Install them yourself (apt-get install ${missing[*]}), or rerun with KNIT_SETUP_HOST_CHANGES=yes." >&2
        return 1
    fi
    echo "setup.sh: installing ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
}

failed=no
install "${MAIN[@]}" || failed=yes
if [ "$ha" = yes ]; then install "${HA[@]}" || failed=yes; fi
if [ "$qemu" = yes ]; then install "${QEMU[@]}" || failed=yes; fi
if [ "$tests" = yes ]; then
    # One at a time: chrony alone replaces systemd-timesyncd (asked), and a
    # refused one does not hold back the others.
    for p in "${TESTS[@]}"; do install "$p" || failed=yes; done
fi

# The QEMU provider: qemu-system-x86 and qemu-utils (qemu-img) must come
# from the same Debian release. A machine image may ship a newer
# qemu-utils (a backport) than bookworm's qemu-system-x86, and apt then
# refuses the pair: both at qemu-system-x86's candidate version, which
# downgrades qemu-utils (asked).
if [ "$qemu" = yes ]; then
    qemu_version=$(apt-cache policy qemu-system-x86 2>/dev/null | awk '/Candidate:/ {print $2}')
    if [ -z "$qemu_version" ] || [ "$qemu_version" = "(none)" ]; then
        apt_update
        qemu_version=$(apt-cache policy qemu-system-x86 | awk '/Candidate:/ {print $2}')
    fi
    if [ -n "$qemu_version" ] && [ "$qemu_version" != "(none)" ]; then
        have_system=$(dpkg-query -W -f='${Version}' qemu-system-x86 2>/dev/null || true)
        have_utils=$(dpkg-query -W -f='${Version}' qemu-utils 2>/dev/null || true)
        if [ "$have_system" != "$qemu_version" ] || [ "$have_utils" != "$qemu_version" ]; then
            downgrade=no
            if [ -n "$have_utils" ] && dpkg --compare-versions "$have_utils" gt "$qemu_version"; then
                downgrade=yes
            fi
            if [ "$downgrade" = no ] || may_change_host "qemu-utils $have_utils is newer than qemu-system-x86 $qemu_version: downgrade qemu-utils to $qemu_version"; then
                echo "setup.sh: installing qemu-system-x86 and qemu-utils $qemu_version"
                DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends --allow-downgrades \
                    "qemu-system-x86=$qemu_version" "qemu-utils=$qemu_version"
            else
                echo "setup.sh: NOT downgrading qemu-utils $have_utils to $qemu_version (qemu-system-x86's version): the QEMU provider and its tests need both at one version." >&2
                echo "          Rerun with KNIT_SETUP_HOST_CHANGES=yes, or install a qemu-system-x86 matching qemu-utils $have_utils." >&2
                failed=yes
            fi
        fi
    else
        echo "setup.sh: qemu-system-x86 has no install candidate in apt's sources; the QEMU provider's tests will be skipped (and fail under CI=true)" >&2
    fi
fi

# Debian starts services on install where it can. The tests run their own
# containerd and registry on the default socket and port, so the host's
# copies must not hold them (asked: they are the host's services). The main
# job does not need this: its containerd runs inside each node.
if [ "$tests" = yes ]; then
    for svc in containerd docker-registry; do
        if pgrep -x "$svc" >/dev/null 2>&1 && [ -x "/etc/init.d/$svc" ]; then
            if may_change_host "stop the host's $svc service (the tests run their own)"; then
                "/etc/init.d/$svc" stop >/dev/null 2>&1 || true
            else
                echo "setup.sh: the host's $svc service is left running; tests that run their own $svc may fail (stop it: /etc/init.d/$svc stop)" >&2
            fi
        fi
    done
fi

if ! command -v cargo >/dev/null; then
    echo "setup.sh: cargo not found: install a Rust toolchain (rustup) first; under sudo, run it as sudo env PATH=\"\$PATH\" ./scripts/up.sh" >&2
    exit 1
fi
if [ "$tests" = yes ] && ! command -v cargo-nextest >/dev/null; then
    cargo install --locked cargo-nextest
fi
# The dependency policy check of scripts/test.sh (deny.toml). Built from
# source when missing: about 12 minutes on a two-core machine (5 minutes of
# CPU), once per machine.
if [ "$tests" = yes ] && ! command -v cargo-deny >/dev/null; then
    cargo install --locked cargo-deny
fi
modprobe loop 2>/dev/null || true
modprobe overlay 2>/dev/null || true

if [ "$failed" = yes ]; then
    echo "setup.sh: some packages were not installed (above); what needs them will say so" >&2
    exit 1
fi
if [ "$tests" = no ]; then
    absent=()
    for p in "${HA[@]}" "${QEMU[@]}" qemu-system-x86; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || absent+=("$p")
    done
    if [ ${#absent[@]} -gt 0 ]; then
        echo "setup.sh: not installed (not needed by the main job): ${absent[*]}; knit up --ha needs scripts/setup.sh --ha, knit up --provider qemu needs scripts/setup.sh --qemu"
    fi
fi
