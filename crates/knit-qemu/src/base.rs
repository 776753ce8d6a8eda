//! The disk a VM boots: made once per OS image from the image's `root/`
//! (`knit image build`), kept read-only in a cache keyed by the image's key
//! and this file's [`FORMAT`], and used as the backing file of every VM's
//! qcow2 system overlay.
//!
//! ```text
//! <cache>/lock
//! <cache>/<image key>-v<FORMAT>/disk.raw  vmlinuz  initrd.img  base.json
//! <cache>/.build-…            a build in progress (removed by the next one)
//! ```
//!
//! The disk is a whole-device ext4 (no partition table, no boot loader):
//! QEMU loads the image's kernel and initramfs directly (`-kernel`,
//! `-initrd`, `root=/dev/vda`). What a VM needs beyond the sandbox root is
//! added to the disk only, never to the shared `root/`: systemd-networkd
//! enabled (cloud-init renders its network-config for networkd; Debian does
//! not enable it), and cloud-init limited to the NoCloud datasource.

use crate::error::{IoContext, QemuError, Result};
use crate::run::run;
use crate::state::BootFiles;
use serde::{Deserialize, Serialize};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Changes whenever what the base disk holds changes.
pub const FORMAT: u32 = 3;
/// Default cache (kept across `down`: it is derived from the image only).
pub const DEFAULT_CACHE: &str = "/var/cache/knit/qemu";
const MKFS_TIMEOUT: Duration = Duration::from_secs(1200);

/// Files added to the base disk: (path in the guest, contents).
const FILES: &[(&str, &str)] = &[
    (
        "/etc/cloud/cloud.cfg.d/90-knit-qemu.cfg",
        "# knit QEMU provider: the seed disk (label CIDATA) is the only datasource.\ndatasource_list: [NoCloud, None]\n# The image carries no locales package (update-locale): keep the C.UTF-8 default.\nlocale: false\n",
    ),
    (
        "/etc/fstab",
        "# knit QEMU provider: the root is the whole system disk (kernel root=/dev/vda).\n/dev/vda / ext4 defaults,discard 0 1\n",
    ),
];
/// Symlinks added (enabling systemd-networkd): (link, target).
const LINKS: &[(&str, &str)] = &[
    (
        "/etc/systemd/system/multi-user.target.wants/systemd-networkd.service",
        "/lib/systemd/system/systemd-networkd.service",
    ),
    (
        "/etc/systemd/system/sockets.target.wants/systemd-networkd.socket",
        "/lib/systemd/system/systemd-networkd.socket",
    ),
];

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct BaseManifest {
    image: PathBuf,
    image_key: String,
    format: u32,
    disk_bytes: u64,
    build_seconds: f64,
}

/// The key of a knit OS image directory (its `image.json`).
fn image_key(image: &Path) -> Result<String> {
    let manifest = image.join("image.json");
    let v: serde_json::Value = serde_json::from_slice(
        &std::fs::read(&manifest).map_err(|e| {
            QemuError::invalid(
                "image",
                image.display(),
                format!("must be an OS image directory made by `knit image build` (reading image.json: {e})"),
            )
        })?,
    )
    .map_err(|e| QemuError::invalid("image", image.display(), format!("image.json is unreadable: {e}")))?;
    let key = v.get("key").and_then(|k| k.as_str()).unwrap_or_default();
    if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric()) {
        return Err(QemuError::invalid(
            "image",
            image.display(),
            "image.json must carry the image's key (letters and digits)",
        ));
    }
    Ok(key.to_string())
}

/// Checks that `image` can boot a VM (root, kernel, initramfs, key);
/// changes nothing.
pub fn check_image(image: &Path) -> Result<()> {
    if !image.is_absolute() {
        return Err(QemuError::invalid(
            "image",
            image.display(),
            "must be an absolute path",
        ));
    }
    image_key(image)?;
    for f in ["root/usr/lib/systemd/systemd", "vmlinuz", "initrd.img"] {
        // symlink_metadata: root/sbin/init links to an absolute path inside the image.
        if std::fs::symlink_metadata(image.join(f)).is_err() {
            return Err(QemuError::invalid(
                "image",
                image.display(),
                format!("must hold {f} (a VM boots the image's kernel and initramfs, systemd as PID 1): rebuild it with `knit image build`"),
            ));
        }
    }
    Ok(())
}

/// The boot files for `image`, made on first use (minutes: `mkfs.ext4 -d`
/// copies the whole root), found in `cache` afterwards.
pub fn prepare(image: &Path, cache: &Path, progress: &mut dyn FnMut(&str)) -> Result<BootFiles> {
    let image = std::fs::canonicalize(image)
        .map_err(|e| QemuError::invalid("image", image.display(), format!("must exist: {e}")))?;
    check_image(&image)?;
    let key = format!("{}-v{FORMAT}", image_key(&image)?);
    std::fs::create_dir_all(cache).ctx("cannot create", cache)?;
    let dir = cache.join(&key);
    let files = BootFiles {
        image: image.clone(),
        disk: dir.join("disk.raw"),
        kernel: dir.join("vmlinuz"),
        initrd: dir.join("initrd.img"),
    };
    if dir.join("base.json").is_file() {
        return Ok(files);
    }
    let lock_path = cache.join("lock");
    let lock = std::fs::File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .ctx("cannot open", &lock_path)?;
    // SAFETY: flock on a descriptor we own; released when `lock` drops.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(std::io::Error::last_os_error()).ctx("cannot lock", &lock_path);
    }
    if dir.join("base.json").is_file() {
        return Ok(files);
    }
    // Builds a killed run left.
    for e in std::fs::read_dir(cache)
        .ctx("cannot list", cache)?
        .flatten()
    {
        if e.file_name().to_string_lossy().starts_with(".build-") {
            std::fs::remove_dir_all(e.path()).ctx("cannot remove", e.path())?;
        }
    }
    let started = std::time::Instant::now();
    let tmp = cache.join(format!(".build-{key}"));
    std::fs::create_dir(&tmp).ctx("cannot create", &tmp)?;
    let root = image.join("root");
    let used = du(&root)?;
    // Room for the guest's first boot (logs, cloud-init, journal); the
    // overlay grows the filesystem to the system disk size at boot.
    let size = (used + used / 2 + (768 << 20)).div_ceil(1 << 30) << 30;
    let raw = tmp.join("disk.raw");
    progress(&format!(
        "making the VM base disk from {} ({} MiB used) into {}",
        root.display(),
        used >> 20,
        raw.display()
    ));
    let f = std::fs::File::create(&raw).ctx("cannot create", &raw)?;
    f.set_len(size).ctx("cannot size", &raw)?;
    drop(f);
    let raw_s = raw.display().to_string();
    let root_s = root.display().to_string();
    run(
        "mkfs.ext4",
        &["-q", "-F", "-L", "knit-root", "-d", &root_s, &raw_s],
        MKFS_TIMEOUT,
    )?;
    customise(&raw, &tmp)?;
    std::fs::copy(image.join("vmlinuz"), tmp.join("vmlinuz"))
        .ctx("cannot copy", image.join("vmlinuz"))?;
    std::fs::copy(image.join("initrd.img"), tmp.join("initrd.img"))
        .ctx("cannot copy", image.join("initrd.img"))?;
    use std::os::unix::fs::PermissionsExt;
    // Backing file of every overlay: nothing may write it.
    std::fs::set_permissions(&raw, std::fs::Permissions::from_mode(0o444))
        .ctx("cannot chmod", &raw)?;
    let manifest = BaseManifest {
        image: image.clone(),
        image_key: image_key(&image)?,
        format: FORMAT,
        disk_bytes: size,
        build_seconds: started.elapsed().as_secs_f64(),
    };
    crate::state::write_json(&tmp.join("base.json"), &manifest)?;
    std::fs::rename(&tmp, &dir).ctx("cannot rename into place", &dir)?;
    progress(&format!(
        "VM base disk ready in {:.0} s: {}",
        manifest.build_seconds,
        dir.display()
    ));
    Ok(files)
}

/// Writes [`FILES`] and [`LINKS`] into the ext4 image with debugfs (no
/// mount on the host).
fn customise(raw: &Path, tmp: &Path) -> Result<()> {
    let mut script = String::new();
    for (i, (path, body)) in FILES.iter().enumerate() {
        let src = tmp.join(format!("file-{i}"));
        std::fs::write(&src, body).ctx("cannot write", &src)?;
        script.push_str(&format!("rm {path}\nwrite {} {path}\n", src.display()));
        script.push_str(&format!("set_inode_field {path} mode 0100644\n"));
    }
    for (link, target) in LINKS {
        let parent = Path::new(link)
            .parent()
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        script.push_str(&format!("mkdir {parent}\nsymlink {link} {target}\n"));
    }
    let cmds = tmp.join("debugfs.cmds");
    std::fs::write(&cmds, &script).ctx("cannot write", &cmds)?;
    let (raw_s, cmds_s) = (raw.display().to_string(), cmds.display().to_string());
    // debugfs reports "rm: file not found" or "mkdir: exists" on stderr and
    // goes on; each result is checked below instead.
    crate::run::run_status("debugfs", &["-w", "-f", &cmds_s, &raw_s], MKFS_TIMEOUT)?;
    for path in FILES
        .iter()
        .map(|(p, _)| *p)
        .chain(LINKS.iter().map(|(l, _)| *l))
    {
        let out = run(
            "debugfs",
            &["-R", &format!("stat {path}"), &raw_s],
            MKFS_TIMEOUT,
        )?;
        if !out.contains("Inode:") {
            return Err(QemuError::Command {
                command: format!("debugfs -w {raw_s}"),
                status: "file missing after write".into(),
                stderr: path.to_string(),
            });
        }
    }
    for i in 0..FILES.len() {
        let _ = std::fs::remove_file(tmp.join(format!("file-{i}")));
    }
    let _ = std::fs::remove_file(&cmds);
    Ok(())
}

fn du(dir: &Path) -> Result<u64> {
    let p = dir.display().to_string();
    let out = run("du", &["-sx", "--block-size=1", &p], MKFS_TIMEOUT)?;
    out.split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| QemuError::Command {
            command: format!("du -sx --block-size=1 {p}"),
            status: "unreadable output".into(),
            stderr: out.clone(),
        })
}
