//! `knit server --provider qemu` end to end: a pool of one QEMU VM — its own
//! kernel, systemd as PID 1, the image's cloud-init, a virtio and an NVMe
//! data disk — joins the embedded cluster through the real agent and
//! reaches Ready and initialized. On it: cloud-init reports done and applied
//! the pool's `#cloud-config`, the kubelet (stand-in) logs its real pulls in
//! journald. The node is rebooted through `knit exec`: it comes back Ready
//! with its data disk mounted by systemd from fstab, not reformatted (a
//! marker planted before is found after, same filesystem UUID, images
//! already present). Scaling to 0 removes the VM and leaves no QEMU
//! process, tap device or file.
//!
//! Needs root and `qemu-system-x86_64` (scripts/setup.sh installs it). This
//! host has no nested virtualization, so the VM runs under TCG: minutes.
//! Everything (the VM's state, its tap, the bridge) lives under the test's
//! own directory and subnet and is released by the guard on success,
//! failure and panic.

mod common;
mod qemu_common;

use common::Env;
use qemu_common::{node_ok, node_sh, node_until, phase, wait_ready, SYSTEM};
use std::time::{Duration, Instant};

const BOOT: Duration = Duration::from_secs(1500);
const MARKER: &str = "/var/lib/container/knit-e2e-marker";

/// `grep -c` of `pattern` in the kubelet unit's journal (`-b 0`: this boot).
fn kubelet_lines(boot_only: bool, pattern: &str) -> String {
    let boot = if boot_only { " -b 0" } else { "" };
    format!("journalctl -u kubelet{boot} --no-pager | grep -c '{pattern}' || true")
}

#[test]
fn a_vm_pool_joins_reboots_keeps_its_data_disk_and_is_released() {
    assert!(
        common::on_path("qemu-system-x86_64"),
        "qemu-system-x86_64 is missing: scripts/setup.sh installs it"
    );
    let mut env = Env::builder()
        .cluster(true)
        .registry(true)
        .provider("qemu")
        .build();
    env.start(false);
    qemu_common::seed(&env, SYSTEM);
    let pool = qemu_common::pool_yaml(
        "vms",
        &env.registry_mirror(),
        "[{sizeGiB: 40, interface: virtio}, {sizeGiB: 48, interface: nvme}]",
    );
    env.create("vms", &pool);
    let t0 = Instant::now();
    env.knit_ok(&["scale", "pool", "vms", "--replicas", "1"]);
    let node = wait_ready(&env, "vms", 1, BOOT).remove(0);
    let to_ready = t0.elapsed();
    let name = node["name"].as_str().unwrap().to_string();
    let described = env.json(&["describe", "node", &name, "-o", "json"]);
    // Under systemd the image's own chrony unit keeps the clock.
    let time_sync = phase(&described, "time-sync");
    assert_eq!(time_sync["outcome"], "done", "{time_sync}");
    assert!(
        time_sync["reason"]
            .as_str()
            .is_some_and(|r| r.contains("the system's chrony service")),
        "{time_sync}"
    );
    // The runtime disk is the NVMe one (preferred over virtio), formatted
    // by the agent; the virtio disk is there too, untouched.
    let data_disk = phase(&described, "data-disk");
    assert!(
        data_disk["reason"]
            .as_str()
            .is_some_and(|r| r.contains("/dev/nvme0n1")),
        "{data_disk}"
    );
    assert_eq!(phase(&described, "join")["outcome"], "done");
    let sizes = node_ok(&env, &name, "blockdev --getsize64 /dev/vdb /dev/nvme0n1");
    assert_eq!(
        sizes.split_whitespace().collect::<Vec<_>>(),
        [(40u64 << 30).to_string(), (48u64 << 30).to_string()],
        "{sizes}"
    );
    let vms = qemu_common::held(&env);
    assert_eq!(vms.len(), 1, "{vms:?}");
    assert!(!vms[0].pids.is_empty(), "no QEMU process for {}", vms[0].id);

    // Add-existing's preflight reads the VM's facts (the provider's record,
    // swap from inside): every check passes but the one that says it is
    // already a node of this pool.
    let (ok, out, err) = env.knit(&[
        "attach",
        "--pool",
        "vms",
        "--instances",
        &vms[0].id,
        "--dry-run",
        "-o",
        "json",
    ]);
    assert!(
        !ok,
        "a dry run of a node already in the pool passed: {out}{err}"
    );
    let report: serde_json::Value =
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}{err}"));
    let results = report["preflight"][0]["results"].as_array().unwrap();
    let status = |code: &str| {
        results
            .iter()
            .find(|r| r["code"] == code)
            .map(|r| r["status"].as_str().unwrap_or("").to_string())
            .unwrap_or_else(|| panic!("no {code} in {report}"))
    };
    let errors: Vec<&str> = results
        .iter()
        .filter(|r| r["status"] == "error")
        .map(|r| r["code"].as_str().unwrap())
        .collect();
    assert_eq!(errors, ["PreflightAlreadyInCluster"], "{report}");
    assert_eq!(status("PreflightSwapOn"), "pass", "{report}");
    assert_eq!(status("PreflightInstanceTypeNotInPool"), "pass", "{report}");

    // cloud-init: the image's own, from the NoCloud seed, every stage done;
    // the pool's #cloud-config applied.
    let status = node_until(
        &env,
        &name,
        "cloud-init status --long",
        Duration::from_secs(600),
        |o| o.contains("status: done") || o.contains("status: error"),
    );
    assert!(status.contains("status: done"), "{status}");
    assert!(status.contains("NoCloud"), "{status}");
    let written = node_ok(
        &env,
        &name,
        &format!("cat {}", qemu_common::CLOUD_CONFIG_FILE),
    );
    assert_eq!(written, format!("{}\n", qemu_common::CLOUD_CONFIG_TEXT));
    let output_log = node_ok(&env, &name, "cat /var/log/cloud-init-output.log");
    assert!(output_log.contains("knit"), "{output_log}");

    // The kubelet's log is journald's: every system image pulled once,
    // through the registry mirror.
    let pulled = node_until(
        &env,
        &name,
        &kubelet_lines(false, "pulled image"),
        Duration::from_secs(600),
        |o| o.trim() == SYSTEM.len().to_string(),
    );
    assert_eq!(pulled.trim(), SYSTEM.len().to_string());

    // Reboot: a marker on the data disk first.
    let uuid = node_ok(&env, &name, "findmnt -no UUID /var/lib/container");
    assert!(
        !uuid.trim().is_empty(),
        "no filesystem at /var/lib/container"
    );
    let fstab = node_ok(&env, &name, "cat /etc/fstab");
    assert!(
        fstab.contains(&format!("UUID={} /var/lib/container", uuid.trim())),
        "{fstab}"
    );
    let token = format!("planted-{}", std::process::id());
    node_ok(&env, &name, &format!("echo {token} > {MARKER} && sync"));
    let boot_id = node_ok(&env, &name, "cat /proc/sys/kernel/random/boot_id");
    let t1 = Instant::now();
    // Detached: the guest agent answers before systemd stops it.
    node_ok(
        &env,
        &name,
        "(sleep 2; systemctl reboot) </dev/null >/dev/null 2>&1 &",
    );
    node_until(
        &env,
        &name,
        "cat /proc/sys/kernel/random/boot_id",
        BOOT,
        |o| !o.trim().is_empty() && o != boot_id,
    );
    // systemd mounted the disk and the runtime directories from fstab (the
    // agent does not run at boot); the filesystem is the same one.
    let units = node_until(
        &env,
        &name,
        "systemctl is-active var-lib-container.mount var-lib-containerd.mount var-lib-kubelet.mount containerd kubelet",
        Duration::from_secs(600),
        |o| o.lines().all(|l| l.trim() == "active"),
    );
    assert_eq!(units.lines().count(), 5, "{units}");
    assert_eq!(
        node_ok(&env, &name, "findmnt -no UUID /var/lib/container"),
        uuid
    );
    assert_eq!(node_ok(&env, &name, &format!("cat {MARKER}")).trim(), token);
    // containerd's store is on that disk: after the reboot every image is
    // already present, nothing is pulled.
    node_until(
        &env,
        &name,
        &kubelet_lines(true, "already present on machine"),
        Duration::from_secs(600),
        |o| o.trim() == SYSTEM.len().to_string(),
    );
    let (_, again) = node_sh(&env, &name, &kubelet_lines(true, "pulled image"));
    assert_eq!(again.trim(), "0", "pulled again after the reboot");
    // The kubelet of the new boot keeps the node Ready.
    let after = wait_ready(&env, "vms", 1, Duration::from_secs(600)).remove(0);
    assert_eq!(after["name"], name.as_str());
    let reboot_to_ready = t1.elapsed();
    eprintln!(
        "MEASURE scale→Ready {:.1} s; reboot→Ready (images present) {:.1} s",
        to_ready.as_secs_f64(),
        reboot_to_ready.as_secs_f64()
    );

    env.knit_ok(&[
        "scale",
        "pool",
        "vms",
        "--replicas",
        "0",
        "--wait",
        "--timeout",
        "600",
    ]);
    assert!(env.nodes_of("vms").is_empty(), "the node stays registered");
    qemu_common::assert_released(&env, &vms);
}
