//! optional-components: skipped when not configured; GPU detected by PCI
//! vendor in the tree's sysfs; SGX by its device node; each failing clearly
//! when configured but absent. Image acceleration under `--root` needs
//! `containerd-stargz-grpc` in the tree (packages are installed only live).

mod components_support;

use components_support::*;
use knit_api::{ErrorCode, NodeConfig, PhaseName, PhaseOutcome};

fn node_with_package() -> (Node, NodeConfig) {
    let node = Node::new();
    let dir = node.path("/opt/knit-packages");
    std::fs::create_dir_all(&dir).unwrap();
    build_package(
        &dir,
        VERSION,
        &[
            ("bin/kubelet", b"#!/bin/sh\n"),
            ("bin/containerd", b"#!/bin/sh\n"),
        ],
    );
    let mut config = base_config();
    config.kubernetes.dir = Some("/opt/knit-packages".into());
    (node, config)
}

fn pci_device(node: &Node, address: &str, vendor: &str) {
    let dir = node.path(&format!("/sys/bus/pci/devices/{address}"));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("vendor"), format!("{vendor}\n")).unwrap();
}

#[test]
fn not_configured_is_skipped_with_the_reason() {
    let (node, config) = node_with_package();
    node.init(&config).expect("init");
    let record = &node.journal().phases[&PhaseName::OptionalComponents];
    assert_eq!(record.outcome, PhaseOutcome::Skipped);
    assert!(record
        .reason
        .as_deref()
        .unwrap()
        .contains("no optional component configured"));
}

#[test]
fn gpu_is_detected_by_pci_vendor_or_refused() {
    let (node, mut config) = node_with_package();
    config.components.gpu.enabled = true;
    // An Intel device only: no GPU.
    pci_device(&node, "0000:00:02.0", "0x8086");
    let err = node.init(&config).unwrap_err();
    assert_eq!(err.code, ErrorCode::FailOptionalComponents);
    assert!(err.message.contains("components.gpu"), "{err}");
    assert!(err.message.contains("0x10de"), "{err}");

    // A GPU without NVIDIA's toolkit: seen, nothing installed, so skipped
    // with the reason (never `done`).
    pci_device(&node, "0000:00:05.0", "0x10de");
    node.init(&config).expect("init with a GPU");
    let record = &node.journal().phases[&PhaseName::OptionalComponents];
    assert_eq!(record.outcome, PhaseOutcome::Skipped);
    let reason = record.reason.as_deref().unwrap();
    assert!(
        reason.contains("1 NVIDIA GPU(s) at 0000:00:05.0"),
        "{reason}"
    );
    assert!(reason.contains("installs no NVIDIA driver"), "{reason}");
    let toml = std::fs::read_to_string(node.path("/etc/containerd/config.toml")).unwrap();
    assert!(toml.contains("containerd.runtimes.nvidia]"), "{toml}");

    // With the toolkit in place the GPU is ready: done.
    std::fs::create_dir_all(node.path("/usr/bin")).unwrap();
    std::fs::write(
        node.path("/usr/bin/nvidia-container-runtime"),
        b"#!/bin/sh\n",
    )
    .unwrap();
    node.init(&config).expect("init with a GPU and the toolkit");
    let record = &node.journal().phases[&PhaseName::OptionalComponents];
    assert_eq!(record.outcome, PhaseOutcome::Done);
    assert!(
        record.reason.as_deref().unwrap().contains("(present)"),
        "{record:?}"
    );
}

#[test]
fn sgx_needs_its_device() {
    let (node, mut config) = node_with_package();
    config.components.sgx.enabled = true;
    let err = node.init(&config).unwrap_err();
    assert_eq!(err.code, ErrorCode::FailOptionalComponents);
    assert!(err.message.contains("/dev/sgx_enclave"), "{err}");
    // A device node in the tree (a regular file stands in: only existence is checked).
    std::fs::create_dir_all(node.path("/dev")).unwrap();
    std::fs::write(node.path("/dev/sgx_enclave"), b"").unwrap();
    node.init(&config).expect("init with SGX");
    let record = &node.journal().phases[&PhaseName::OptionalComponents];
    assert!(record
        .reason
        .as_deref()
        .unwrap()
        .contains("/dev/sgx_enclave present"));
}

#[test]
fn image_acceleration_under_root_needs_the_snapshotter_in_the_tree() {
    let (node, mut config) = node_with_package();
    config.components.image_acceleration.enabled = true;
    let err = node.init(&config).unwrap_err();
    assert_eq!(err.code, ErrorCode::FailOptionalComponents);
    assert!(err.message.contains("containerd-stargz-grpc"), "{err}");
    assert!(
        err.message.contains(&node.root().display().to_string()),
        "{err}"
    );
    // containerd is configured for the proxy snapshotter all the same.
    let toml = std::fs::read_to_string(node.path("/etc/containerd/config.toml")).unwrap();
    assert!(toml.contains("[proxy_plugins.stargz]"), "{toml}");
    assert!(toml.contains("snapshotter = \"stargz\""), "{toml}");
}

/// A stand-in for containerd-stargz-grpc (not packaged by Debian): it
/// listens on the socket it is given, which is all the phase waits for.
const STARGZ_STANDIN: &str = r#"#!/usr/bin/env python3
import os, socket, sys
addr = next(a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--address="))
os.makedirs(os.path.dirname(addr), exist_ok=True)
s = socket.socket(socket.AF_UNIX)
s.bind(addr)
s.listen(8)
while True:
    s.accept()[0].close()
"#;

#[test]
fn image_acceleration_runs_the_snapshotter_as_a_service() {
    let (node, mut config) = node_with_package();
    config.components.image_acceleration.enabled = true;
    let bin = node.path("/usr/bin/containerd-stargz-grpc");
    std::fs::create_dir_all(bin.parent().unwrap()).unwrap();
    std::fs::write(&bin, STARGZ_STANDIN).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    node.init(&config).expect("init");
    let record = &node.journal().phases[&PhaseName::OptionalComponents];
    assert_eq!(record.outcome, PhaseOutcome::Done, "{record:?}");
    let root = node.root().display().to_string();
    let pid = knit_agent::services::main_pid(&node.host, "containerd-stargz-grpc").unwrap();
    let cmdline = knit_os::proc::cmdline(pid)
        .unwrap_or_else(|| panic!("no process {pid}"))
        .iter()
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect::<Vec<_>>()
        .join(" ");
    assert!(
        cmdline.contains(&format!(
            "--address={root}/run/containerd-stargz-grpc/containerd-stargz-grpc.sock"
        )),
        "{cmdline}"
    );
    // The socket containerd's proxy plugin names is the one served.
    let toml = std::fs::read_to_string(node.path("/etc/containerd/config.toml")).unwrap();
    assert!(toml.contains(&format!(
        "address = \"{root}/run/containerd-stargz-grpc/containerd-stargz-grpc.sock\""
    )));
    // A rerun finds it running.
    node.init(&config).expect("rerun");
    let record = &node.journal().phases[&PhaseName::OptionalComponents];
    assert!(
        record.reason.as_deref().unwrap().contains("in place"),
        "{record:?}"
    );
}
