//! Data-disk snapshots on QEMU VMs, end to end: `knit snapshot create` from
//! a VM pool (a builder VM joins, gets the package and the images, powers
//! off; its NVMe data disk is copied to a qcow2 snapshot), then a pool of
//! two VMs, each with a virtio data disk and an NVMe data disk made from
//! the snapshot (a copy-on-write qcow2 overlay on it), reaches Ready with a
//! data-disk cache hit and zero image pulls: no `pulled image` in the
//! kubelet's journal, no blob or manifest GET at the registry. Teardown
//! leaves no QEMU process, tap device or file, and the snapshot goes.
//!
//! Three VM boots under TCG, two of them at once: too slow for CI on this
//! machine (see docs/benchmarks.md for the measured time). Run it with
//! `cargo nextest run -p knit-cli --test qemu_snapshot_e2e --run-ignored all`.
//! Needs root, `qemu-system-x86_64` and docker-registry (scripts/setup.sh).

mod common;
mod qemu_common;

use common::{tail, Env};
use qemu_common::{node_ok, phase, wait_ready, SYSTEM};
use std::time::{Duration, Instant};

/// A business image the snapshot carries besides the system images.
const APP: &str = "docker.io/knit/app:1";

#[test]
#[ignore = "slow: three VM boots under TCG (4 min alone on 2 cores, longer beside the rest of CI); run with --run-ignored all"]
fn a_snapshot_from_a_vm_pool_gives_a_new_vm_pool_a_cache_hit() {
    for bin in ["qemu-system-x86_64", "docker-registry"] {
        assert!(
            common::on_path(bin),
            "{bin} is missing: scripts/setup.sh installs it"
        );
    }
    let mut env = Env::builder()
        .cluster(true)
        .parallelism(2)
        .registry(true)
        .provider("qemu")
        .build();
    env.start(false);
    qemu_common::seed(&env, SYSTEM);
    qemu_common::seed(&env, &[APP]);
    let mirror = env.registry_mirror();
    env.create(
        "vms",
        &qemu_common::pool_yaml(
            "vms",
            &mirror,
            "[{sizeGiB: 40, interface: virtio}, {sizeGiB: 48, interface: nvme}]",
        ),
    );

    // 1. Build from the VM pool.
    let t0 = Instant::now();
    let out = env.knit_ok(&[
        "snapshot",
        "create",
        "--pool",
        "vms",
        "--images",
        APP,
        "--timeout",
        "2400",
    ]);
    let build_time = t0.elapsed();
    let id = out
        .split_whitespace()
        .find(|w| w.starts_with("build-"))
        .unwrap()
        .to_string();
    let build = env.json(&["snapshot", "builds", &id, "-o", "json"]);
    assert_eq!(build["status"], "Succeeded", "{build}");
    let list = env.json(&["snapshot", "list", "-o", "json"]);
    let snap = list["items"][0].clone();
    let sid = snap["id"].as_str().unwrap().to_string();
    assert_eq!(snap["images"].as_array().unwrap().len(), 4, "{snap}");
    // The builder VM is gone; the snapshot is knit-qemu's qcow2 copy.
    assert!(qemu_common::held(&env).is_empty(), "builder not released");
    let snaps = qemu_common::machines(&env).snapshots().unwrap();
    assert_eq!(snaps.len(), 1, "{snaps:?}");
    assert_eq!(snaps[0].id, sid);
    assert!(snaps[0].complete);

    // 2. A pool of two VMs from it: the NVMe disk from the snapshot, a
    // fresh virtio disk beside it.
    let log_before = env.registry().log_text();
    let blobs_before = knit_registry::count_blob_gets(&log_before);
    let manifests_before = knit_registry::count_manifest_gets(&log_before);
    let fast = qemu_common::pool_yaml(
        "fast",
        &mirror,
        &format!("[{{sizeGiB: 40, interface: virtio}}, {{snapshotId: {sid}, interface: nvme}}]"),
    );
    std::fs::write(env.path("fast.yaml"), &fast).unwrap();
    let (ok, _, err) = env.knit(&["create", "-f", env.path("fast.yaml").to_str().unwrap()]);
    assert!(ok && !err.contains("Warning"), "{err}");
    let t1 = Instant::now();
    env.knit_ok(&["scale", "pool", "fast", "--replicas", "2"]);
    let nodes = wait_ready(&env, "fast", 2, Duration::from_secs(2400));
    let two_ready = t1.elapsed();
    let vms = qemu_common::held(&env);
    assert_eq!(vms.len(), 2, "{vms:?}");
    // Each disk from the snapshot is an overlay whose backing file is it.
    let m = qemu_common::machines(&env);
    for vm in &vms {
        let rec = m.describe(&vm.id).unwrap().record;
        assert_eq!(rec.disks.len(), 2, "{rec:?}");
        assert_eq!(rec.disks[1].snapshot.as_deref(), Some(sid.as_str()));
        assert_eq!(rec.disks[0].snapshot, None);
    }
    for n in &nodes {
        let name = n["name"].as_str().unwrap();
        // The stand-in publishes its report shortly after start.
        let deadline = Instant::now() + Duration::from_secs(300);
        let described = loop {
            let d = env.knit_ok(&["describe", "node", name]);
            if d.contains("Images:        cache hit") || Instant::now() > deadline {
                break d;
            }
            std::thread::sleep(Duration::from_secs(2));
        };
        assert!(
            described.contains("Package:       data-disk cache hit"),
            "{described}"
        );
        assert!(
            described.contains("Images:        cache hit 3, miss 0, failed 0, 0 bytes pulled"),
            "{described}"
        );
        let doc = env.json(&["describe", "node", name, "-o", "json"]);
        let data_disk = phase(&doc, "data-disk");
        assert!(
            data_disk["reason"]
                .as_str()
                .is_some_and(|r| r.contains("/dev/nvme0n1")),
            "{data_disk}"
        );
        let init = env.knit_ok(&["logs", "node", name]);
        assert!(init.contains("using cached kubernetes"), "{init}");
        assert!(init.contains("mount as is, never wipe"), "{init}");
        assert!(!init.contains("check cached kubernetes failed"), "{init}");
        // journald holds the kubelet's log: nothing pulled, all present.
        let pulled = node_ok(
            &env,
            name,
            "journalctl -u kubelet --no-pager | grep -c 'pulled image' || true",
        );
        assert_eq!(pulled.trim(), "0", "{name} pulled images");
        let present = node_ok(
            &env,
            name,
            "journalctl -u kubelet --no-pager | grep -c 'already present on machine' || true",
        );
        assert_eq!(present.trim(), "3", "{name}");
        // The virtio disk is there, fresh; the business image too.
        node_ok(&env, name, "test -b /dev/vdb");
        let app = node_ok(&env, name, "ctr -n k8s.io images ls -q");
        assert!(app.lines().any(|l| l.starts_with(APP)), "{app}");
    }
    let log = env.registry().log_text();
    assert_eq!(
        knit_registry::count_blob_gets(&log),
        blobs_before,
        "{}",
        tail(&log, 20)
    );
    assert_eq!(knit_registry::count_manifest_gets(&log), manifests_before);
    eprintln!(
        "MEASURE snapshot build from a VM pool {:.1} s; 2 VMs from it → Ready {:.1} s",
        build_time.as_secs_f64(),
        two_ready.as_secs_f64()
    );

    // 3. Teardown: the pools, then the snapshot; nothing left.
    for p in ["fast", "vms"] {
        env.knit_ok(&["delete", "pool", p]);
    }
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let (ok, _, err) = env.knit(&["snapshot", "delete", &sid]);
        if ok {
            break;
        }
        assert!(Instant::now() < deadline, "snapshot not deletable: {err}");
        std::thread::sleep(Duration::from_secs(3));
    }
    qemu_common::assert_released(&env, &vms);
    assert!(
        qemu_common::machines(&env).snapshots().unwrap().is_empty(),
        "snapshot file left"
    );
}
