//! The data-disk phase on real loop devices: choice, format, mount, markers,
//! crash and rerun. Run as root.

mod common;

use common::{disk_config, stderr, stdout, Node};
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::process::Command;

fn plan(node: &Node, config: &str) -> serde_json::Value {
    let cfg = node.write_config(config);
    let out = node.agent(&[
        "plan",
        "--config",
        &cfg.to_string_lossy(),
        "--output",
        "json",
    ]);
    assert!(out.status.success(), "plan failed: {}", stderr(&out));
    serde_json::from_str(&stdout(&out)).expect("plan json")
}

fn init(node: &Node, config: &str) -> std::process::Output {
    let cfg = node.write_config(config);
    node.agent(&[
        "init",
        "--config",
        &cfg.to_string_lossy(),
        "--stop-after",
        "data-disk",
    ])
}

fn mkfs_runs(node: &Node) -> usize {
    node.log()
        .lines()
        .filter(|l| l.contains("[run] mkfs."))
        .count()
}

#[test]
fn chooses_last_virtio_disk() {
    let mut node = Node::new();
    for name in ["vdb", "vdd", "vdc"] {
        node.add_disk(name, 64);
    }
    let plan = plan(&node, &disk_config(""));
    assert_eq!(plan["dataDisk"]["device"], "/dev/vdd");
    assert_eq!(plan["dataDisk"]["action"], "format");
    assert_eq!(
        plan["dataDisk"]["candidates"].as_array().map(Vec::len),
        Some(3)
    );
    let names: Vec<&str> = plan["phases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    // Every phase, in the one order knit-api declares.
    let all: Vec<&str> = knit_api::PhaseName::ALL
        .iter()
        .map(|p| p.as_str())
        .collect();
    assert_eq!(names, all);
    // plan changed nothing: no log, no journal, no mount.
    assert!(!node.path("/var/lib/knit/journal.json").exists());
    assert!(node.mounts().is_empty());
}

#[test]
fn prefers_nvme_and_last_nvme() {
    let mut node = Node::new();
    for name in ["vdb", "vdc", "nvme0n1", "nvme1n1"] {
        node.add_disk(name, 64);
    }
    assert_eq!(
        plan(&node, &disk_config(""))["dataDisk"]["device"],
        "/dev/nvme1n1"
    );

    let mut only_nvme = Node::new();
    for name in ["nvme1n1", "nvme0n1"] {
        only_nvme.add_disk(name, 64);
    }
    assert_eq!(
        plan(&only_nvme, &disk_config(""))["dataDisk"]["device"],
        "/dev/nvme1n1"
    );
}

#[test]
fn explicit_device_overrides_the_rule() {
    let mut node = Node::new();
    node.add_disk("vdb", 64);
    node.add_disk("nvme0n1", 64);
    let plan = plan(&node, &disk_config("  device: /dev/vdb\n"));
    assert_eq!(plan["dataDisk"]["device"], "/dev/vdb");
    let missing = self::plan(&node, &disk_config("  device: /dev/vdz\n"));
    assert_eq!(missing["dataDisk"]["action"], "refuse");
}

#[test]
fn mounted_and_system_disks_are_never_candidates() {
    let mut node = Node::new();
    // A "system disk": a filesystem mounted as the node's root tree.
    let system = node.add_disk("vda", 64);
    assert!(Command::new("mkfs.ext4")
        .args(["-q", &system])
        .status()
        .unwrap()
        .success());
    let sysroot = node.path("/sysroot");
    fs::create_dir_all(&sysroot).unwrap();
    nix::mount::mount(
        Some(system.as_str()),
        &sysroot,
        Some("ext4"),
        nix::mount::MsFlags::empty(),
        None::<&str>,
    )
    .unwrap();
    // The node tree is now the mounted system disk; give it its own /dev.
    fs::create_dir_all(sysroot.join("dev")).unwrap();
    let meta = fs::metadata(&system).unwrap();
    nix::sys::stat::mknod(
        &sysroot.join("dev/vda"),
        nix::sys::stat::SFlag::S_IFBLK,
        nix::sys::stat::Mode::from_bits_truncate(0o660),
        meta.rdev(),
    )
    .unwrap();
    // A second disk mounted somewhere else.
    let busy = node.add_disk("vdz", 64);
    assert!(Command::new("mkfs.ext4")
        .args(["-q", &busy])
        .status()
        .unwrap()
        .success());
    let elsewhere = node.path("/elsewhere");
    fs::create_dir_all(&elsewhere).unwrap();
    nix::mount::mount(
        Some(busy.as_str()),
        &elsewhere,
        Some("ext4"),
        nix::mount::MsFlags::empty(),
        None::<&str>,
    )
    .unwrap();
    let busy_meta = fs::metadata(&busy).unwrap();
    nix::sys::stat::mknod(
        &sysroot.join("dev/vdz"),
        nix::sys::stat::SFlag::S_IFBLK,
        nix::sys::stat::Mode::from_bits_truncate(0o660),
        busy_meta.rdev(),
    )
    .unwrap();

    let cfg = sysroot.join("node.yaml");
    fs::write(&cfg, disk_config("")).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_knit-agent"))
        .args([
            "--root",
            &sysroot.to_string_lossy(),
            "plan",
            "--config",
            &cfg.to_string_lossy(),
            "-o",
            "json",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let plan: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(plan["dataDisk"]["action"], "skip", "{plan}");
    let candidates = plan["dataDisk"]["candidates"].as_array().unwrap();
    let reason = |dev: &str| {
        candidates
            .iter()
            .find(|c| c["device"] == dev)
            .and_then(|c| c["excluded"].as_str())
            .unwrap_or("")
            .to_string()
    };
    assert_eq!(reason("/dev/vda"), "holds the root filesystem");
    assert_eq!(reason("/dev/vdz"), "is mounted");
}

#[test]
fn formats_blank_disk_mounts_and_persists() {
    let mut node = Node::new();
    node.add_disk("vdb", 128);
    let out = init(&node, &disk_config(""));
    assert!(out.status.success(), "{}\n{}", stderr(&out), node.log());
    assert!(node.mounted_at("/var/lib/container"));
    assert!(node.mounted_at("/var/lib/containerd"));
    assert!(node.mounted_at("/var/lib/kubelet"));
    let fstab = fs::read_to_string(node.path("/etc/fstab")).unwrap();
    let uuid = node.journal()["dataDisk"]["fsUuid"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        fstab.contains(&format!(
            "UUID={uuid} /var/lib/container ext4 defaults,nofail 0 2"
        )),
        "{fstab}"
    );
    assert!(fstab.contains("/var/lib/container/containerd /var/lib/containerd none bind,nofail"));
    // Files written through the bind mount land on the disk.
    fs::write(node.path("/var/lib/containerd/probe"), b"x").unwrap();
    assert!(node.path("/var/lib/container/containerd/probe").exists());
    assert_eq!(mkfs_runs(&node), 1);
    // A rerun verifies and does nothing.
    let again = init(&node, &disk_config(""));
    assert!(again.status.success(), "{}", stderr(&again));
    assert_eq!(mkfs_runs(&node), 1);
    assert!(node.log().contains("[data-disk] already done"));
    // ACK's log name points at ours.
    assert!(fs::read_to_string(node.path("/var/log/ack-deploy.log"))
        .unwrap()
        .contains("data-disk"));
}

#[test]
fn xfs_when_asked() {
    let mut node = Node::new();
    let dev = node.add_disk("nvme0n1", 512);
    let out = init(&node, &disk_config("  fsType: xfs\n"));
    assert!(out.status.success(), "{}\n{}", stderr(&out), node.log());
    let blkid = Command::new("blkid")
        .args(["-o", "value", "-s", "TYPE", &dev])
        .output()
        .unwrap();
    assert_eq!(stdout(&blkid).trim(), "xfs");
}

#[test]
fn snapshot_like_disk_is_mounted_not_wiped_and_keep_container_data_is_ignored() {
    let mut node = Node::new();
    let dev = node.add_disk("vdb", 128);
    // Build the "snapshot": a filesystem holding a cache.
    assert!(Command::new("mkfs.ext4")
        .args(["-q", &dev])
        .status()
        .unwrap()
        .success());
    let staging = tempfile::tempdir().unwrap();
    nix::mount::mount(
        Some(dev.as_str()),
        staging.path(),
        Some("ext4"),
        nix::mount::MsFlags::empty(),
        None::<&str>,
    )
    .unwrap();
    fs::create_dir_all(staging.path().join("ack/kubernetes")).unwrap();
    fs::write(staging.path().join("ack/kubernetes/marker"), b"cached").unwrap();
    fs::create_dir_all(
        staging
            .path()
            .join("containerd/io.containerd.content.v1.content"),
    )
    .unwrap();
    nix::mount::umount(staging.path()).unwrap();

    // Marker precedence 2 (docs/agent.md): keep-container-data applies only
    // to a disk formatted in this run; on a disk that holds data (a
    // snapshot) it is ignored, and the disk's content wins over the node's.
    fs::create_dir_all(node.path("/var/lib/containerd")).unwrap();
    fs::write(node.path("/var/lib/containerd/node-only"), b"local").unwrap();
    fs::write(node.path("/var/.keep-container-data"), b"").unwrap();

    let plan = plan(&node, &disk_config(""));
    assert_eq!(plan["dataDisk"]["action"], "mount", "{plan}");
    let out = init(&node, &disk_config(""));
    assert!(out.status.success(), "{}\n{}", stderr(&out), node.log());
    assert_eq!(mkfs_runs(&node), 0);
    assert_eq!(
        fs::read(node.path("/var/lib/container/ack/kubernetes/marker")).unwrap(),
        b"cached"
    );
    assert!(node
        .path("/var/lib/containerd/io.containerd.content.v1.content")
        .is_dir());
    assert!(
        !node
            .path("/var/lib/container/containerd/node-only")
            .exists(),
        "the node's container data was not copied over the snapshot's"
    );
    let log = node.log();
    assert!(
        log.contains("marker /var/.keep-container-data ignored: the disk already holds data"),
        "{log}"
    );
}

#[test]
fn a_partitioned_disk_is_left_alone_refused_when_named_and_formatted_when_forced() {
    let mut node = Node::new();
    let dev = node.add_disk("vdb", 64);
    let mut sfdisk = Command::new("sfdisk")
        .args(["-q", &dev])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .expect("sfdisk (package fdisk)");
    use std::io::Write;
    sfdisk
        .stdin
        .take()
        .unwrap()
        .write_all(b"label: gpt\n,\n")
        .unwrap();
    assert!(sfdisk.wait().unwrap().success());

    // Named by the config: refused, the whole initialization stops.
    let out = init(&node, &disk_config("  device: /dev/vdb\n"));
    assert!(!out.status.success());
    let code = fs::read_to_string(node.path("/var/log/ack-deploy-error-code.log")).unwrap();
    assert_eq!(code.trim(), "FailDataDiskRefused");
    let msg = fs::read_to_string(node.path("/var/log/knit-deploy-error-msg.log")).unwrap();
    assert!(msg.contains("/dev/vdb holds GPT partition table"), "{msg}");
    assert!(msg.contains("format: force"), "{msg}");
    assert_eq!(mkfs_runs(&node), 0);
    assert!(node.mounts().is_empty());

    // Found by the selection rule (the last disk of an added instance):
    // left alone with the reason and the ways out; initialization goes on.
    let out = init(&node, &disk_config(""));
    assert!(out.status.success(), "{}\n{}", stderr(&out), node.log());
    let phase = &node.journal()["phases"]["data-disk"];
    assert_eq!(phase["outcome"], "skipped", "{phase}");
    let reason = phase["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("left alone: /dev/vdb holds GPT partition table")
            && reason.contains("format: force"),
        "{reason}"
    );
    assert_eq!(mkfs_runs(&node), 0);
    assert!(node.mounts().is_empty());

    let forced = init(&node, &disk_config("  format: force\n"));
    assert!(
        forced.status.success(),
        "{}\n{}",
        stderr(&forced),
        node.log()
    );
    assert_eq!(mkfs_runs(&node), 1);
    assert!(
        !node.path("/var/log/knit-deploy-error-code.log").exists(),
        "error files cleared on success"
    );
}

/// Unknown data on the disk the rule picks is never formatted: the plan
/// and the run leave it alone, its bytes unchanged.
#[test]
fn unknown_data_is_left_alone() {
    let mut node = Node::new();
    let dev = node.add_disk("vdb", 64);
    let mut f = fs::OpenOptions::new().write(true).open(&dev).unwrap();
    use std::io::{Seek, SeekFrom, Write};
    f.seek(SeekFrom::Start(70_000)).unwrap();
    f.write_all(b"precious user bytes").unwrap();
    f.sync_all().unwrap();
    let found = plan(&node, &disk_config(""));
    assert_eq!(found["dataDisk"]["action"], "skip");
    assert!(found["dataDisk"]["reason"]
        .as_str()
        .unwrap()
        .contains("no recognised signature"));
    let named = plan(&node, &disk_config("  device: /dev/vdb\n"));
    assert_eq!(named["dataDisk"]["action"], "refuse");
    let out = init(&node, &disk_config(""));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(mkfs_runs(&node), 0);
    let bytes = fs::read(&dev).unwrap();
    assert_eq!(&bytes[70_000..70_019], b"precious user bytes");
}

#[test]
fn skip_auto_fdisk_wins_over_everything() {
    let mut node = Node::new();
    node.add_disk("vdb", 64);
    fs::write(node.path("/var/.skip-auto-fdisk"), b"").unwrap();
    fs::write(node.path("/var/.keep-container-data"), b"").unwrap();
    assert_eq!(plan(&node, &disk_config(""))["dataDisk"]["action"], "skip");
    let out = init(&node, &disk_config(""));
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(node.mounts().is_empty());
    assert_eq!(mkfs_runs(&node), 0);
    assert_eq!(node.journal()["phases"]["data-disk"]["outcome"], "skipped");
}

#[test]
fn disabled_data_disk_touches_nothing() {
    let mut node = Node::new();
    node.add_disk("vdb", 64);
    let config = "apiVersion: knit.dev/v1alpha1\nkind: NodeConfig\n";
    let plan = plan(&node, config);
    assert_eq!(plan["dataDisk"]["action"], "skip");
    assert_eq!(plan["dataDisk"]["reason"], "dataDisk.enabled is false");
}

#[test]
fn keep_container_data_copies_bit_for_bit() {
    let mut node = Node::new();
    node.add_disk("vdb", 256);
    let src = node.path("/var/lib/containerd");
    fs::create_dir_all(src.join("dir")).unwrap();
    fs::write(src.join("dir/file"), b"layer bytes").unwrap();
    fs::set_permissions(src.join("dir/file"), fs::Permissions::from_mode(0o640)).unwrap();
    std::os::unix::fs::chown(src.join("dir/file"), Some(1234), Some(5678)).unwrap();
    fs::hard_link(src.join("dir/file"), src.join("dir/hardlink")).unwrap();
    std::os::unix::fs::symlink("dir/file", src.join("link")).unwrap();
    xattr_set(&src.join("dir/file"), "user.knit", b"kept");
    let sparse = fs::File::create(src.join("sparse")).unwrap();
    sparse.set_len(64 << 20).unwrap();
    drop(sparse);
    fs::create_dir_all(node.path("/var/lib/kubelet/pods")).unwrap();
    fs::write(node.path("/var/lib/kubelet/pods/state"), b"kubelet").unwrap();
    fs::write(node.path("/var/.keep-container-data"), b"").unwrap();

    let out = init(&node, &disk_config(""));
    assert!(out.status.success(), "{}\n{}", stderr(&out), node.log());
    assert!(node.mounted_at("/var/lib/containerd"));
    // Seen through the bind mount, i.e. on the new disk.
    let dst = node.path("/var/lib/containerd");
    assert_eq!(fs::read(dst.join("dir/file")).unwrap(), b"layer bytes");
    let meta = fs::metadata(dst.join("dir/file")).unwrap();
    assert_eq!(
        (meta.uid(), meta.gid(), meta.mode() & 0o7777),
        (1234, 5678, 0o640)
    );
    assert_eq!(meta.nlink(), 2, "hard link kept");
    assert_eq!(
        fs::metadata(dst.join("dir/hardlink")).unwrap().ino(),
        meta.ino()
    );
    assert_eq!(
        fs::read_link(dst.join("link")).unwrap().to_string_lossy(),
        "dir/file"
    );
    assert_eq!(xattr_get(&dst.join("dir/file"), "user.knit"), b"kept");
    let sparse_meta = fs::metadata(dst.join("sparse")).unwrap();
    assert_eq!(sparse_meta.len(), 64 << 20);
    assert!(
        sparse_meta.blocks() * 512 < 1 << 20,
        "holes kept: {} blocks",
        sparse_meta.blocks()
    );
    assert_eq!(
        fs::read(node.path("/var/lib/kubelet/pods/state")).unwrap(),
        b"kubelet"
    );
    assert_eq!(node.journal()["dataDisk"]["copyCompleted"], true);
}

fn xattr_set(path: &std::path::Path, name: &str, value: &[u8]) {
    let p = std::ffi::CString::new(path.to_string_lossy().as_bytes()).unwrap();
    let n = std::ffi::CString::new(name).unwrap();
    let rc = unsafe {
        libc::setxattr(
            p.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    assert_eq!(rc, 0, "setxattr: {}", std::io::Error::last_os_error());
}

fn xattr_get(path: &std::path::Path, name: &str) -> Vec<u8> {
    let p = std::ffi::CString::new(path.to_string_lossy().as_bytes()).unwrap();
    let n = std::ffi::CString::new(name).unwrap();
    let mut buf = vec![0u8; 256];
    let len = unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    assert!(len >= 0, "getxattr: {}", std::io::Error::last_os_error());
    buf.truncate(len as usize);
    buf
}

/// kill -9 at a checkpoint inside the phase, then rerun: exactly one mkfs.
fn crash_and_rerun(checkpoint: &str, keep_data: bool) {
    let mut node = Node::new();
    node.add_disk("vdb", 128);
    if keep_data {
        fs::create_dir_all(node.path("/var/lib/containerd/x")).unwrap();
        fs::write(node.path("/var/lib/containerd/x/f"), b"data").unwrap();
        fs::write(node.path("/var/.keep-container-data"), b"").unwrap();
    }
    let cfg = node.write_config(&disk_config(""));
    let mut child = node
        .agent_cmd(&[
            "init",
            "--config",
            &cfg.to_string_lossy(),
            "--stop-after",
            "data-disk",
        ])
        .env("KNIT_AGENT_PAUSE_AT", checkpoint)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until the agent says it reached the checkpoint.
    let mut stderr_pipe = child.stderr.take().unwrap();
    let mut seen = String::new();
    use std::io::Read;
    let mut buf = [0u8; 256];
    while !seen.contains("paused at checkpoint") {
        let n = stderr_pipe.read(&mut buf).unwrap();
        assert!(n > 0, "agent ended before the checkpoint: {seen}");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let status = child.wait().unwrap();
    assert!(!status.success());
    assert_eq!(node.journal()["dataDisk"]["formatCompleted"], true);

    let out = init(&node, &disk_config(""));
    assert!(out.status.success(), "{}\n{}", stderr(&out), node.log());
    assert_eq!(mkfs_runs(&node), 1, "{}", node.log());
    assert!(node.mounted_at("/var/lib/containerd"));
    if keep_data {
        assert_eq!(
            fs::read(node.path("/var/lib/containerd/x/f")).unwrap(),
            b"data"
        );
    }
}

#[test]
fn killed_after_format_rerun_formats_once() {
    crash_and_rerun("after-format", false);
}

#[test]
fn killed_during_copy_rerun_formats_once_and_copies() {
    crash_and_rerun("during-copy", true);
}

#[test]
fn corrupt_journal_is_a_clear_error() {
    let node = Node::new();
    fs::create_dir_all(node.path("/var/lib/knit")).unwrap();
    fs::write(node.path("/var/lib/knit/journal.json"), b"{ not json").unwrap();
    let out = init(&node, &disk_config(""));
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("FailJournal")
            && err.contains("is corrupt")
            && err.contains("knit-agent reset"),
        "{err}"
    );
    let code = fs::read_to_string(node.path("/var/log/knit-deploy-error-code.log")).unwrap();
    assert_eq!(code.trim(), "FailJournal");
    let reset = node.agent(&["reset"]);
    assert!(reset.status.success());
    assert!(!node.path("/var/lib/knit/journal.json").exists());
}

#[test]
fn invalid_config_lists_every_error() {
    let node = Node::new();
    let out = init(
        &node,
        "apiVersion: knit.dev/v1alpha1\nkind: NodeConfig\nkubelet: {eventBurst: 500, kubeAPIQPS: 0}\ncontainerd: {maxConcurrentDownloads: 21}\n",
    );
    assert!(!out.status.success());
    let err = stderr(&out);
    for needle in [
        "kubelet.eventBurst: value 500 must be in [1, 100]",
        "kubelet.kubeAPIQPS: value 0 must be in [1, 50]",
        "containerd.maxConcurrentDownloads: value 21 must be in [1, 20]",
    ] {
        assert!(err.contains(needle), "missing {needle:?} in {err}");
    }
    assert_eq!(
        fs::read_to_string(node.path("/var/log/knit-deploy-error-code.log"))
            .unwrap()
            .trim(),
        "FailConfig"
    );
}

/// Runs `init` until the agent reports `checkpoint`, then kills it (-9).
fn kill_at(node: &Node, config: &str, checkpoint: &str) {
    let cfg = node.write_config(config);
    let mut child = node
        .agent_cmd(&[
            "init",
            "--config",
            &cfg.to_string_lossy(),
            "--stop-after",
            "data-disk",
        ])
        .env("KNIT_AGENT_PAUSE_AT", checkpoint)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr_pipe = child.stderr.take().unwrap();
    let mut seen = String::new();
    use std::io::Read;
    let mut buf = [0u8; 256];
    while !seen.contains("paused at checkpoint") {
        let n = stderr_pipe.read(&mut buf).unwrap();
        assert!(n > 0, "agent ended before the checkpoint: {seen}");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    assert!(!child.wait().unwrap().success());
}

/// Killed after copying /var/lib/containerd but before /var/lib/kubelet: the
/// rerun finds the disk mounted and must finish the copy (it used to declare
/// the phase done and bind the disk over the kubelet's uncopied data).
#[test]
fn killed_during_copy_rerun_copies_the_rest() {
    let mut node = Node::new();
    node.add_disk("vdb", 128);
    fs::create_dir_all(node.path("/var/lib/containerd/x")).unwrap();
    fs::write(node.path("/var/lib/containerd/x/f"), b"images").unwrap();
    fs::create_dir_all(node.path("/var/lib/kubelet/pods")).unwrap();
    fs::write(node.path("/var/lib/kubelet/pods/state"), b"kubelet").unwrap();
    fs::write(node.path("/var/.keep-container-data"), b"").unwrap();
    kill_at(&node, &disk_config(""), "during-copy");
    let journal = node.journal();
    assert_eq!(journal["dataDisk"]["formatCompleted"], true);
    assert_eq!(journal["dataDisk"]["copyCompleted"], false);
    assert!(node.mounted_at("/var/lib/container"));

    let out = init(&node, &disk_config(""));
    assert!(out.status.success(), "{}\n{}", stderr(&out), node.log());
    assert_eq!(mkfs_runs(&node), 1, "{}", node.log());
    assert!(node.log().contains("resuming the copy"), "{}", node.log());
    // Seen through the bind mounts, i.e. on the disk.
    assert!(node.mounted_at("/var/lib/kubelet"));
    assert_eq!(
        fs::read(node.path("/var/lib/kubelet/pods/state")).unwrap(),
        b"kubelet"
    );
    assert_eq!(
        fs::read(node.path("/var/lib/containerd/x/f")).unwrap(),
        b"images"
    );
    assert_eq!(node.journal()["dataDisk"]["copyCompleted"], true);
}

/// Killed after the format, before the mount: the rerun mounts the disk it
/// formatted and still makes the copy.
#[test]
fn killed_after_format_rerun_still_copies() {
    let mut node = Node::new();
    node.add_disk("vdb", 128);
    fs::create_dir_all(node.path("/var/lib/kubelet")).unwrap();
    fs::write(node.path("/var/lib/kubelet/state"), b"kubelet").unwrap();
    fs::write(node.path("/var/.keep-container-data"), b"").unwrap();
    kill_at(&node, &disk_config(""), "after-format");
    let out = init(&node, &disk_config(""));
    assert!(out.status.success(), "{}\n{}", stderr(&out), node.log());
    assert_eq!(mkfs_runs(&node), 1, "{}", node.log());
    assert!(node.mounted_at("/var/lib/kubelet"));
    assert_eq!(
        fs::read(node.path("/var/lib/kubelet/state")).unwrap(),
        b"kubelet"
    );
    assert_eq!(node.journal()["dataDisk"]["copyCompleted"], true);
}

/// The format intent names the disk by identity, not only `major:minor`:
/// killed before mkfs, the same disk resumes the format; another disk that
/// got the same loop device (same `major:minor`) is treated as new — here it
/// holds a filesystem with data, which is mounted, never formatted.
#[test]
fn unfinished_format_resumes_only_on_the_same_disk() {
    // Same disk: resumed (the first run was killed before its mkfs).
    let mut node = Node::new();
    node.add_disk("vdb", 128);
    kill_at(&node, &disk_config(""), "format-intent");
    let journal = node.journal();
    assert_eq!(journal["dataDisk"]["formatStarted"], true);
    assert_eq!(journal["dataDisk"]["identity"]["sizeBytes"], 128u64 << 20);
    let out = init(&node, &disk_config(""));
    assert!(out.status.success(), "{}\n{}", stderr(&out), node.log());
    assert!(node.log().contains("resuming a format"), "{}", node.log());
    assert_eq!(mkfs_runs(&node), 1);
    drop(node);

    // Another disk at the same major:minor.
    let mut node = Node::new();
    let loop_dev = node.add_disk("vdb", 128);
    kill_at(&node, &disk_config(""), "format-intent");
    let other = tempfile::NamedTempFile::new().unwrap();
    other.as_file().set_len(96 << 20).unwrap();
    let mkfs = Command::new("mkfs.ext4")
        .args(["-F", "-q"])
        .arg(other.path())
        .output()
        .unwrap();
    assert!(mkfs.status.success());
    let debugfs = Command::new("debugfs")
        .args(["-w", "-R", "mkdir precious"])
        .arg(other.path())
        .output()
        .unwrap();
    assert!(debugfs.status.success());
    node.replace_disk_backing(&loop_dev, other.path());

    let out = init(&node, &disk_config(""));
    assert!(out.status.success(), "{}\n{}", stderr(&out), node.log());
    assert_eq!(
        mkfs_runs(&node),
        0,
        "the other disk was formatted: {}",
        node.log()
    );
    let log = node.log();
    assert!(log.contains("stale format intent ignored"), "{log}");
    assert!(
        log.contains("size was 134217728 bytes, is 100663296 bytes"),
        "{log}"
    );
    assert!(node.path("/var/lib/container/precious").is_dir());
    assert_eq!(
        node.journal()["dataDisk"]["identity"]["sizeBytes"],
        96u64 << 20
    );
}
