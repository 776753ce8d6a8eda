//! A snapshot's data disk keeps only `scrub::KEEP` (issue 30 item 5), on a
//! real ext4 loop device laid out as a builder's: the disk mounted at the
//! runtime's home with containerd's root and the kubelet's directory bound
//! from it, a real containerd holding an image, a container (with a file
//! written in its root filesystem), a lease and a stray active snapshot, a
//! pod's volumes (one a tmpfs mounted as kubelet does), kubelet
//! credentials and state, a half-written package staging directory, and
//! stray files. `knit-agent snapshot-prepare clean` runs as the control
//! plane runs it; then the disk is opened read-only on a loop device of
//! its own: every path on it is kept or a parent of a kept one, the raw
//! device holds none of the removed files' bytes, and a containerd started
//! on it again lists the image and no container, lease or active snapshot.
//!
//! Needs root, containerd, ctr, mkfs.ext4 and fstrim. Everything it makes
//! (mounts, loop devices, the backing file, containerd) is undone on drop,
//! after a failed assertion too.

mod components_support;

use components_support::*;
use knit_agent::render::{self, RuntimeOptions};
use knit_agent::services;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const MOUNT: &str = "/var/lib/container";
const IMAGE: &str = "registry.k8s.io/scrub-test:1";

fn sh(program: &str, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A loop device over a sparse file of this test's own; detached and the
/// file removed on drop (after the node's mounts are undone).
struct Disk {
    backing: PathBuf,
    loops: Vec<String>,
}

impl Disk {
    fn new(backing: &Path) -> Disk {
        let backing = backing.to_path_buf();
        let file = std::fs::File::create(&backing).unwrap();
        file.set_len(256 << 20).unwrap();
        let mut disk = Disk {
            backing,
            loops: Vec::new(),
        };
        disk.attach(false);
        disk
    }

    fn attach(&mut self, read_only: bool) -> String {
        let backing = self.backing.to_string_lossy().into_owned();
        let mut args = vec!["--find", "--show"];
        if read_only {
            args.push("--read-only");
        }
        args.push(&backing);
        let dev = sh("losetup", &args).trim().to_string();
        self.loops.push(dev.clone());
        dev
    }

    fn detach(&mut self, dev: &str) {
        sh("losetup", &["-d", dev]);
        self.loops.retain(|d| d != dev);
    }

    /// Where the disk's bytes contain `needle` first.
    fn find(&self, needle: &[u8]) -> Option<usize> {
        let data = std::fs::read(&self.backing).unwrap();
        data.windows(needle.len()).position(|w| w == needle)
    }
}

impl Drop for Disk {
    fn drop(&mut self) {
        for dev in &self.loops {
            let _ = Command::new("losetup").args(["-d", dev]).output();
        }
        let _ = std::fs::remove_file(&self.backing);
    }
}

fn mount(source: &str, target: &Path, fs: Option<&str>, flags: nix::mount::MsFlags) {
    std::fs::create_dir_all(target).unwrap();
    nix::mount::mount(Some(source), target, fs, flags, None::<&str>)
        .unwrap_or_else(|e| panic!("mount {source} on {}: {e}", target.display()));
}

fn umount(target: &Path) {
    nix::mount::umount2(target, nix::mount::MntFlags::empty())
        .unwrap_or_else(|e| panic!("umount {}: {e}", target.display()));
}

/// The disk mounted at the runtime's home, containerd's root and the
/// kubelet's directory bound from it, as the agent's data-disk phase does.
fn mount_as_builder(node: &Node, dev: &str) {
    mount(
        dev,
        &node.path(MOUNT),
        Some("ext4"),
        nix::mount::MsFlags::empty(),
    );
    for (dir, sub) in knit_agent::phases::data_disk::RUNTIME_DIRS {
        let source = node.path(&format!("{MOUNT}/{sub}"));
        std::fs::create_dir_all(&source).unwrap();
        mount(
            &source.to_string_lossy(),
            &node.path(dir),
            None,
            nix::mount::MsFlags::MS_BIND,
        );
    }
}

fn unmount_builder(node: &Node) {
    for (dir, _) in knit_agent::phases::data_disk::RUNTIME_DIRS {
        umount(&node.path(dir));
    }
    umount(&node.path(MOUNT));
}

fn start_containerd(node: &Node) {
    let config = base_config();
    let options = RuntimeOptions::new(&config, false);
    let toml = render::containerd_config(&node.host, &config.containerd, options);
    node.host
        .write_file(render::CONTAINERD_CONFIG, toml.as_bytes(), 0o644)
        .unwrap();
    let spec = render::containerd_service(&node.host, &config.containerd, "/usr/bin/containerd");
    services::ensure_running(&node.host, &spec).expect("start containerd");
    wait_for("containerd answers", Duration::from_secs(60), || {
        Command::new("ctr")
            .args(ctr_args(node, &["version"]))
            .output()
            .is_ok_and(|o| o.status.success())
    });
}

fn ctr_args(node: &Node, args: &[&str]) -> Vec<String> {
    let mut all = vec![
        "--address".to_string(),
        node.host.host_path(render::CONTAINERD_SOCK),
        "--timeout".to_string(),
        "60s".to_string(),
        "-n".to_string(),
        "k8s.io".to_string(),
    ];
    all.extend(args.iter().map(|a| a.to_string()));
    all
}

fn ctr(node: &Node, args: &[&str]) -> String {
    let all = ctr_args(node, args);
    let refs: Vec<&str> = all.iter().map(String::as_str).collect();
    sh("ctr", &refs)
}

/// An OCI image archive of one layer holding `/hello`, for `ctr import`.
fn image_archive(dir: &Path) -> PathBuf {
    let layer_dir = dir.join("layer");
    std::fs::create_dir_all(&layer_dir).unwrap();
    std::fs::write(layer_dir.join("hello"), "layer file\n").unwrap();
    let layer = dir.join("layer.tar");
    sh(
        "tar",
        &[
            "-C",
            &layer_dir.to_string_lossy(),
            "-cf",
            &layer.to_string_lossy(),
            "hello",
        ],
    );
    let layer_bytes = std::fs::read(&layer).unwrap();
    let layer_digest = sha256_hex(&layer_bytes);
    let config = serde_json::json!({
        "architecture": "amd64", "os": "linux",
        "config": {"Cmd": ["/hello"]},
        "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{layer_digest}")]}
    })
    .to_string();
    let config_digest = sha256_hex(config.as_bytes());
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": format!("sha256:{config_digest}"), "size": config.len()},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": format!("sha256:{layer_digest}"), "size": layer_bytes.len()}]
    })
    .to_string();
    let manifest_digest = sha256_hex(manifest.as_bytes());
    let index = serde_json::json!({
        "schemaVersion": 2,
        "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                       "digest": format!("sha256:{manifest_digest}"), "size": manifest.len(),
                       "annotations": {"io.containerd.image.name": IMAGE,
                                       "org.opencontainers.image.ref.name": "1"}}]
    })
    .to_string();
    let oci = dir.join("oci");
    let blobs = oci.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).unwrap();
    std::fs::write(blobs.join(&layer_digest), &layer_bytes).unwrap();
    std::fs::write(blobs.join(&config_digest), &config).unwrap();
    std::fs::write(blobs.join(&manifest_digest), &manifest).unwrap();
    std::fs::write(oci.join("index.json"), &index).unwrap();
    std::fs::write(oci.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
    let archive = dir.join("image.tar");
    sh(
        "tar",
        &[
            "-C",
            &oci.to_string_lossy(),
            "-cf",
            &archive.to_string_lossy(),
            "oci-layout",
            "index.json",
            "blobs",
        ],
    );
    archive
}

/// Every path under `dir`, relative, directories included.
fn listing(dir: &Path, rel: &str, out: &mut Vec<String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().to_string_lossy().into_owned();
        let child = if rel.is_empty() {
            name
        } else {
            format!("{rel}/{name}")
        };
        let meta = std::fs::symlink_metadata(entry.path()).unwrap();
        out.push(child.clone());
        if meta.is_dir() {
            listing(&entry.path(), &child, out);
        }
    }
}

#[test]
fn a_scrubbed_data_disk_keeps_only_the_image_store_and_the_package_cache() {
    for bin in ["containerd", "ctr", "mkfs.ext4", "fstrim"] {
        assert!(
            Command::new("sh")
                .args(["-c", &format!("command -v {bin}")])
                .output()
                .is_ok_and(|o| o.status.success()),
            "{bin} is not installed (scripts/setup.sh)"
        );
    }
    // Dropped in reverse: the node (containerd stopped, mounts undone),
    // then the disk, then the work directory.
    let work = tempfile::Builder::new()
        .prefix("knit-scrub-work-")
        .tempdir()
        .unwrap();
    let mut disk = Disk::new(&work.path().join("disk.img"));
    let node = Node::new();
    let dev = disk.loops[0].clone();
    // 4 KiB blocks, as on a disk of a real size (the loop device discards
    // in 4 KiB units).
    sh("mkfs.ext4", &["-q", "-F", "-b", "4096", &dev]);
    mount_as_builder(&node, &dev);
    // Unique per run: what must not survive, in file contents only.
    let secret = format!(
        "knit-scrub-secret-{}-{}",
        std::process::id(),
        node.root().file_name().unwrap().to_string_lossy()
    );
    let secret_block = secret.repeat(200);

    // What a builder's disk holds after its pods ran.
    let disk_files: &[(&str, &str)] = &[
        ("ack/kubernetes/bin/kubelet", "kubelet binary"),
        ("ack/kubernetes/knit-cache.json", "{\"version\":\"1.31.4\"}"),
        ("ack/kubernetes.staging/bin/kubelet", &secret_block),
        ("kubelet/pki/kubelet-client-current.pem", &secret_block),
        (
            "kubelet/pods/0b9c/volumes/kubernetes.io~secret/db/password",
            &secret_block,
        ),
        ("kubelet/pods/0b9c/containers/app/4f1e", &secret_block),
        ("kubelet/pods/0b9c/etc-hosts", &secret_block),
        (
            "kubelet/device-plugins/kubelet_internal_checkpoint",
            &secret_block,
        ),
        ("kubelet/cpu_manager_state", &secret_block),
        ("kubelet/memory_manager_state", &secret_block),
        ("kubelet/knit-images.json", &secret_block),
        ("kubelet/kubeconfig", &secret_block),
        ("notes.txt", &secret_block),
        ("lost+found/#4711", &secret_block),
    ];
    for (rel, text) in disk_files {
        let path = node.path(&format!("{MOUNT}/{rel}"));
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, text.replace(&secret, &format!("{secret}:{rel}"))).unwrap();
    }
    std::os::unix::fs::symlink("/etc", node.path(&format!("{MOUNT}/escape"))).unwrap();
    // A projected token volume, a tmpfs as kubelet mounts it (through the
    // kubelet's directory, not the disk's mount).
    let projected = node.path("/var/lib/kubelet/pods/0b9c/volumes/kubernetes.io~projected/token");
    mount(
        "tmpfs",
        &projected,
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
    );
    std::fs::write(projected.join("token"), &secret).unwrap();

    // containerd, root on the disk: an image, a container with a file
    // written in its root filesystem, a lease, a stray active snapshot.
    start_containerd(&node);
    let archive = image_archive(&work.path().join("image"));
    ctr(&node, &["images", "import", &archive.to_string_lossy()]);
    ctr(&node, &["containers", "create", IMAGE, "app-1"]);
    let mounts = ctr(&node, &["snapshots", "mounts", "/tmp/unused", "app-1"]);
    let upper = mounts
        .split(',')
        .find_map(|o| o.strip_prefix("upperdir="))
        .unwrap_or_else(|| panic!("no upperdir in {mounts}"))
        .to_string();
    let upper = upper.trim();
    std::fs::write(Path::new(&upper).join("written-by-app"), &secret_block).unwrap();
    let lease = ctr(&node, &["leases", "create"]);
    assert!(!lease.trim().is_empty());
    ctr(&node, &["snapshots", "prepare", "stray-unpack"]);
    nix::unistd::sync();
    assert!(
        disk.find(secret.as_bytes()).is_some(),
        "the test's files reached the disk"
    );

    // As the control plane runs it in the builder.
    let out = Command::new(env!("CARGO_BIN_EXE_knit-agent"))
        .arg("--root")
        .arg(node.root())
        .args(["snapshot-prepare", "clean", "--mount", MOUNT])
        .output()
        .unwrap();
    let answer = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{answer}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cleaned: knit_api::agent::BuilderCleaned =
        serde_json::from_str(answer.trim()).unwrap_or_else(|e| panic!("{e}: {answer}"));
    assert!(cleaned.trimmed, "fstrim on a loop device works: {answer}");
    // The container, the lease and the stray snapshot at least.
    assert!(cleaned.runtime_deleted >= 3, "{answer}");
    assert!(cleaned.removed.contains(&"kubelet".to_string()), "{answer}");
    assert!(!services::is_running(&node.host, "containerd"));
    let pods = node
        .path("/var/lib/kubelet/pods")
        .to_string_lossy()
        .into_owned();
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mountinfo.contains(&pods),
        "the pod's tmpfs is unmounted: {mountinfo}"
    );

    // The disk as a snapshot of it: read-only, on a loop device of its own.
    unmount_builder(&node);
    disk.detach(&dev);
    let ro = disk.attach(true);
    let view = node.path("/snapshot");
    mount(&ro, &view, Some("ext4"), nix::mount::MsFlags::MS_RDONLY);
    let mut paths = Vec::new();
    listing(&view, "", &mut paths);
    let app = paths.iter().find(|p| p.ends_with("written-by-app"));
    assert!(app.is_none(), "the container's file is kept: {app:?}");
    let stray: Vec<&String> = paths
        .iter()
        .filter(|p| !knit_api::agent::snapshot_keeps(p))
        .collect();
    assert!(stray.is_empty(), "not in the keep-list: {stray:?}");
    for kept in [
        "ack/kubernetes/bin/kubelet",
        "ack/kubernetes/knit-cache.json",
        "containerd/io.containerd.metadata.v1.bolt/meta.db",
        "containerd/io.containerd.content.v1.content/blobs/sha256",
        "containerd/io.containerd.snapshotter.v1.overlayfs/metadata.db",
        "lost+found",
    ] {
        assert!(paths.iter().any(|p| p == kept), "{kept} kept: {paths:?}");
    }
    assert!(std::fs::read_dir(view.join("lost+found"))
        .unwrap()
        .next()
        .is_none());
    umount(&view);
    // Not a byte of the removed files on the device.
    if let Some(at) = disk.find(secret.as_bytes()) {
        let end = (at + 160).min(std::fs::metadata(&disk.backing).unwrap().len() as usize);
        let data = std::fs::read(&disk.backing).unwrap();
        panic!(
            "removed data left on the disk at byte {at}: {}",
            String::from_utf8_lossy(&data[at..end])
        );
    }
    disk.detach(&ro);

    // A node from it: containerd finds the image, and nothing else.
    let dev = disk.attach(false);
    mount_as_builder(&node, &dev);
    start_containerd(&node);
    let images = ctr(&node, &["images", "ls", "-q"]);
    // The CRI plugin also names an image by its id (`sha256:…`).
    let names: Vec<&str> = images
        .lines()
        .filter(|l| !l.starts_with("sha256:"))
        .collect();
    assert_eq!(names, [IMAGE], "{images}");
    assert_eq!(ctr(&node, &["containers", "ls", "-q"]).trim(), "");
    assert_eq!(ctr(&node, &["leases", "ls", "-q"]).trim(), "");
    let snapshots = ctr(&node, &["snapshots", "ls"]);
    assert!(
        !snapshots.lines().skip(1).any(|l| l.ends_with("Active")) && snapshots.lines().count() > 1,
        "{snapshots}"
    );
    services::stop(&node.host, "containerd").unwrap();
    unmount_builder(&node);
    disk.detach(&dev);
}
