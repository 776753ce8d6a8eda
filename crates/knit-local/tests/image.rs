//! The node OS image (`knit image build`) and instances on it, for real:
//! mmdebstrap from the host's apt sources into the images directory
//! (`KNIT_IMAGES_DIR`, default /var/lib/knit/images; the first build takes
//! minutes, later ones find it by key), then sandboxes whose base root is
//! the image's root directory.

mod common;

use common::TestCloud;
use knit_local::image;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// Builds the image (or finds it): its root directory.
fn node_image() -> image::Built {
    let dir = image::images_dir();
    image::build(&dir, &mut |line| eprintln!("{line}")).expect("knit image build")
}

fn mounts_under(dir: &Path) -> Vec<String> {
    let prefix = format!("{}/", dir.display());
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter_map(|l| l.split(' ').nth(4).map(str::to_string))
        .filter(|m| m.starts_with(&prefix))
        .collect()
}

#[test]
fn the_image_has_a_node_os_and_a_second_build_is_a_no_op() {
    let first = node_image();
    let m = &first.manifest;
    assert_eq!(m.name, "debian-12");
    assert_eq!(first.dir, image::images_dir().join(&m.key));
    assert_eq!(
        std::fs::canonicalize(image::default_root()).unwrap(),
        first.root,
        "debian-12 points at the image"
    );
    let os = std::fs::read_to_string(first.root.join("etc/os-release")).unwrap();
    assert!(os.contains("VERSION_ID=\"12\""), "{os}");
    // Everything a node uses, from the image's own packages.
    for p in image::PACKAGES {
        assert!(m.installed.contains_key(*p), "{p} not installed");
    }
    for bin in [
        "usr/bin/bash",
        "usr/bin/curl",
        "usr/bin/sha256sum",
        "usr/bin/containerd",
        "usr/sbin/runc",
        "usr/lib/cni/bridge",
        "usr/lib/cni/host-local",
        "usr/bin/cloud-init",
        "usr/sbin/chronyd",
        "usr/sbin/qemu-ga",
        "usr/sbin/mkfs.xfs",
        "usr/sbin/mkfs.ext4",
        "usr/sbin/chpasswd",
        "usr/bin/pigz",
        "usr/bin/ping",
        "usr/bin/env",
        "usr/bin/apt-get",
        "lib/systemd/systemd",
    ] {
        assert!(first.root.join(bin).exists(), "{bin} missing in the image");
    }
    // Kernel and initramfs beside the root, for a VM.
    assert!(m
        .kernel_version
        .as_deref()
        .unwrap()
        .ends_with("-cloud-amd64"));
    assert!(std::fs::metadata(first.dir.join("vmlinuz")).unwrap().len() > 1 << 20);
    assert!(
        std::fs::metadata(first.dir.join("initrd.img"))
            .unwrap()
            .len()
            > 1 << 20
    );
    assert!(m.size_bytes > 100 << 20);
    assert!(mounts_under(&image::images_dir()).is_empty());

    // Same packages, same versions: nothing is built or touched.
    let before = std::fs::metadata(&first.dir).unwrap();
    let second = node_image();
    assert!(second.reused);
    assert_eq!(second.manifest.key, m.key);
    let after = std::fs::metadata(&first.dir).unwrap();
    assert_eq!(
        (before.ino(), before.mtime(), before.mtime_nsec()),
        (after.ino(), after.mtime(), after.mtime_nsec())
    );
    assert_eq!(second.manifest.built_at, m.built_at);
}

/// Files only the host has, under the paths the issue names.
struct Planted {
    files: Vec<PathBuf>,
}

impl Planted {
    fn new(state_dir: &Path) -> Planted {
        let tag = format!("knit-secret-{}-{:x}", std::process::id(), rand_u64());
        let files = vec![
            PathBuf::from(format!("/var/lib/{tag}/ca.key")),
            PathBuf::from(format!("/root/{tag}")),
            // The server's default state directory's parent.
            PathBuf::from(format!("/var/lib/knit/{tag}/pki/ca.key")),
            state_dir.join(format!("{tag}.key")),
        ];
        for f in &files {
            std::fs::create_dir_all(f.parent().unwrap()).unwrap();
            std::fs::write(f, "secret\n").unwrap();
        }
        Planted { files }
    }
}

impl Drop for Planted {
    fn drop(&mut self) {
        for f in &self.files {
            let _ = std::fs::remove_file(f);
            if let Some(d) = f.parent() {
                if d.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("knit-secret-"))
                    || d.ends_with("pki")
                {
                    let top = if d.ends_with("pki") {
                        d.parent().unwrap()
                    } else {
                        d
                    };
                    let _ = std::fs::remove_dir_all(top);
                }
            }
        }
    }
}

fn rand_u64() -> u64 {
    let mut b = [0u8; 8];
    std::io::Read::read_exact(&mut std::fs::File::open("/dev/urandom").unwrap(), &mut b).unwrap();
    u64::from_le_bytes(b)
}

#[test]
fn an_instance_on_the_image_sees_nothing_of_the_host_and_runs_user_data() {
    let built = node_image();
    let t = TestCloud::new();
    let planted = Planted::new(&t.dir);
    let checks: String = planted
        .files
        .iter()
        .map(|f| format!("test -e {} && echo SEEN {}; ", f.display(), f.display()))
        .collect();

    // Through the `debian-12` link, as a pool names it.
    let inst = t.create(&format!(
        "baseRoot: {}\nsystemDiskSize: 512Mi\nuserData: |\n  #!/bin/bash\n  {checks}\n  echo user-data-ran-on-$(. /etc/os-release; echo $ID-$VERSION_ID) > /root/ran\n",
        image::default_root().display()
    ));
    let id = inst.record.id.clone();
    // The record keeps the image it was made from, not the moving link.
    assert_eq!(inst.record.template.base_root, built.root);
    assert_eq!(inst.record.os.id, "debian");
    let result = t
        .cloud
        .wait_user_data(&id, Duration::from_secs(120))
        .unwrap();
    assert_eq!(result["v1"]["errors"], serde_json::json!([]), "{result}");
    assert_eq!(t.sh(&id, "cat /root/ran"), "user-data-ran-on-debian-12\n");
    let log = t.sh(&id, "cat /var/log/cloud-init-output.log");
    assert!(!log.contains("SEEN"), "user data saw host files:\n{log}");
    // And through exec, file by file.
    for f in &planted.files {
        let out = t.sh_out(&id, &format!("cat {}", f.display()));
        assert!(!out.status.success(), "{} readable inside", f.display());
    }
    // The tools a node uses are the image's.
    let v = t.sh(
        &id,
        "containerd --version && runc --version | head -1 && curl --version | head -1 && ls /usr/lib/cni/bridge",
    );
    assert!(
        v.contains("containerd") && v.contains("runc") && v.contains("curl"),
        "{v}"
    );
    // The image stays as built: the instance's writes are in its own layer.
    assert!(!built.root.join("root/ran").exists());
}

/// The host's root stays possible, as an explicit choice, and then the
/// host's files are visible (what the image prevents).
#[test]
fn the_host_root_is_an_explicit_opt_in_that_shows_host_files() {
    let t = TestCloud::new();
    let planted = Planted::new(&t.dir);
    let inst = t.create("baseRoot: /\nsystemDiskSize: 256Mi\n");
    let id = inst.record.id.clone();
    let var_lib = &planted.files[0];
    assert_eq!(t.sh(&id, &format!("cat {}", var_lib.display())), "secret\n");
    // The local cloud's own state directory stays hidden even then.
    let out = t.sh_out(&id, &format!("cat {}", planted.files[3].display()));
    assert!(!out.status.success());
}

/// A build killed in the middle leaves no image, no link, no mount; the
/// next build (or `image::clean_unfinished`) removes what it left.
#[test]
fn a_killed_build_leaves_no_half_image() {
    let out = tempfile::Builder::new()
        .prefix("knit-image-killed-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let mut child = Command::new(common::BIN)
        .args(["image-build", "--out"])
        .arg(out.path())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until mmdebstrap is unpacking into the build directory.
    let started = std::time::Instant::now();
    let build_dir = loop {
        let found = std::fs::read_dir(out.path())
            .unwrap()
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .find(|p| {
                p.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with(".build-")
                    && p.join("root/usr/bin").exists()
            });
        if let Some(p) = found {
            break p;
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "build ended before it was killed"
        );
        assert!(
            started.elapsed() < Duration::from_secs(900),
            "build did not start"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    child.kill().unwrap();
    child.wait().unwrap();
    // mmdebstrap dies with it (parent-death signal) and holds the lock
    // until it is gone: taking the lock means the build is over.
    let lock = std::fs::File::open(out.path().join("lock")).unwrap();
    // SAFETY: flock on our own descriptor.
    assert_eq!(
        unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&lock), libc::LOCK_EX) },
        0
    );
    let names: Vec<String> = std::fs::read_dir(out.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(!names.iter().any(|n| n == image::NAME), "{names:?}");
    assert!(
        names
            .iter()
            .all(|n| n.starts_with('.') || n == "lock" || n == "apt"),
        "a finished-looking image after a kill: {names:?}"
    );
    assert!(
        mounts_under(out.path()).is_empty(),
        "{:?}",
        mounts_under(out.path())
    );
    // No dpkg or apt of the killed build is left running in its chroot.
    let survivors: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
        .filter(|e| {
            std::fs::read_link(e.path().join("root")).is_ok_and(|r| r.starts_with(&build_dir))
        })
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        survivors.is_empty(),
        "processes of the killed build: {survivors:?}"
    );
    assert!(image::current(out.path()).unwrap().is_none());
    drop(lock);
    image::clean_unfinished(out.path()).unwrap();
    assert!(!build_dir.exists());
}
