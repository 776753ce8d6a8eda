//! The node OS image (`knit image build`): a Debian 12 root filesystem made
//! by mmdebstrap from Debian packages, through the host's configured apt
//! sources only. The local cloud lays its instances' overlays over the
//! image's `root/`; `vmlinuz` and `initrd.img` beside it are the kernel and
//! initramfs a VM provider boots. See docs/images.md.
//!
//! Layout under the images directory (default `/var/lib/knit/images`):
//!
//! ```text
//! <dir>/lock                 flock: one build at a time
//! <dir>/apt/                 private apt lists used to resolve versions
//! <dir>/<key>/               a finished image (made by one rename)
//!     root/  vmlinuz  initrd.img  image.json
//! <dir>/debian-12 -> <key>   the current image (replaced by one rename)
//! <dir>/.build-<key>/        a build in progress; removed by the next build
//! ```
//!
//! The key is a hash of the package list and every resolved package
//! version, so a second build against unchanged indexes does nothing.

use crate::error::{IoContext, LocalError, Result};
// Where images live is the model's (the default base root is read there).
pub use crate::model::{
    default_root, images_dir, preloaded_root, DEFAULT_DIR, DIR_ENV, NAME, PRELOADED_NAME,
};
pub use preload::{preload, Preload, PreloadInput};

mod preload;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::BufRead;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The Debian release the image is built from.
pub const SUITE: &str = "bookworm";
/// mmdebstrap's variant: Essential and Priority: required packages, and apt.
pub const VARIANT: &str = "required";
/// What a node needs on top of the variant (issue: a real node OS).
pub const PACKAGES: &[&str] = &[
    "systemd",
    // /sbin/init, and the D-Bus that logind (the ACPI power button),
    // hostnamectl and timedatectl need on a VM.
    "systemd-sysv",
    "dbus",
    "cloud-init",
    "chrony",
    "containerd",
    "runc",
    "containernetworking-plugins",
    "qemu-guest-agent",
    "iproute2",
    "iputils-ping",
    "e2fsprogs",
    "xfsprogs",
    "curl",
    "ca-certificates",
    "pigz",
    "linux-image-cloud-amd64",
];
/// Changes whenever the build steps change what an image holds.
const FORMAT: u32 = 1;
/// A build that takes longer than this is stuck (a few minutes is normal).
const BUILD_TIMEOUT: Duration = Duration::from_secs(3600);
/// `apt-get update` / the resolution each get this long.
const APT_TIMEOUT: Duration = Duration::from_secs(600);
/// mmdebstrap lines kept for an error message.
const TAIL_LINES: usize = 30;

/// `image.json`: what an image is made of.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    pub name: String,
    pub suite: String,
    pub variant: String,
    pub format: u32,
    pub key: String,
    /// The packages asked for on top of the variant.
    pub packages: Vec<String>,
    /// Every package of the resolved set and its version (the key's input).
    pub resolved: BTreeMap<String, String>,
    /// What dpkg reports as installed in `root/` after the build.
    pub installed: BTreeMap<String, String>,
    /// Kernel and initramfs beside `root/` (file names), when the image has them.
    pub kernel: Option<String>,
    pub initrd: Option<String>,
    pub kernel_version: Option<String>,
    pub build_seconds: f64,
    /// Bytes used by the image directory (`du`).
    pub size_bytes: u64,
    /// Unix seconds.
    pub built_at: u64,
    /// What `knit image preload` added to the image it was made from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preload: Option<Preload>,
}

/// The result of [`build`].
#[derive(Debug, Clone)]
pub struct Built {
    /// `<images>/<key>`.
    pub dir: PathBuf,
    /// `<images>/<key>/root`: a base root for sandboxes.
    pub root: PathBuf,
    pub manifest: Manifest,
    /// True when an image with the same key already existed (nothing built).
    pub reused: bool,
}

/// Builds the node image into `out` (the images directory), or finds the
/// one with the same key there. `progress` gets one line per step and
/// mmdebstrap's own lines.
pub fn build(out: &Path, progress: &mut dyn FnMut(&str)) -> Result<Built> {
    crate::run::require_root()?;
    let out = if out.is_absolute() {
        out.to_path_buf()
    } else {
        std::env::current_dir()
            .ctx("cannot read the current directory", ".")?
            .join(out)
    };
    std::fs::create_dir_all(&out).ctx("cannot create the images directory", &out)?;
    let lock = lock(&out.join("lock"), progress)?;

    progress("[1/4] resolving package versions from the host's apt sources");
    let sources = host_sources()?;
    for s in &sources {
        progress(&format!("      apt sources: {}", s.display()));
    }
    let resolved = resolve(&out.join("apt"), progress)?;
    let key = key_of(&out.join("apt"), &resolved)?;
    let dir = out.join(&key);
    if let Some(manifest) = crate::state::read_opt::<Manifest>(&dir.join("image.json"))? {
        point_current(&out, &key)?;
        progress(&format!(
            "image {key} is already built ({} packages): nothing to do",
            manifest.installed.len()
        ));
        return Ok(Built {
            root: dir.join("root"),
            dir,
            manifest,
            reused: true,
        });
    }

    remove_unfinished(&out)?;
    // A directory without image.json under the final name cannot come
    // from a rename of ours; it is not an image.
    if dir.exists() {
        return Err(LocalError::Busy {
            what: dir.display().to_string(),
            message: "exists but holds no image.json: not made by knit image build; move it away"
                .into(),
        });
    }
    if crate::run::find_program("mmdebstrap").is_none() {
        return Err(LocalError::Command {
            command: "mmdebstrap".into(),
            status: "not found on PATH".into(),
            stderr:
                "mmdebstrap is not installed: apt-get install mmdebstrap (scripts/setup.sh does)"
                    .into(),
        });
    }
    let started = Instant::now();
    let tmp = out.join(format!(".build-{key}"));
    std::fs::create_dir(&tmp).ctx("cannot create", &tmp)?;
    progress(&format!(
        "[2/4] mmdebstrap {SUITE} ({VARIANT} + {} packages) into {}",
        PACKAGES.len(),
        tmp.display()
    ));
    // mmdebstrap's own temporary files (its gpg home) inside the build:
    // killed, it removes none, and the build directory goes as a whole.
    let scratch = tmp.join("scratch");
    std::fs::create_dir(&scratch).ctx("cannot create", &scratch)?;
    mmdebstrap(&tmp.join("root"), &scratch, &sources, &lock, progress)?;
    crate::state::remove_dir_all(&scratch)?;

    progress("[3/4] kernel, initramfs, manifest");
    let (kernel_version, kernel, initrd) = boot_files(&tmp)?;
    let installed = installed(&tmp.join("root"))?;
    let size_bytes = du(&tmp)?;
    let manifest = Manifest {
        name: NAME.into(),
        suite: SUITE.into(),
        variant: VARIANT.into(),
        format: FORMAT,
        key: key.clone(),
        packages: PACKAGES.iter().map(|p| p.to_string()).collect(),
        resolved,
        installed,
        kernel,
        initrd,
        kernel_version,
        build_seconds: (started.elapsed().as_millis() as f64) / 1000.0,
        size_bytes,
        built_at: crate::state::now(),
        preload: None,
    };
    crate::state::write_json(&tmp.join("image.json"), &manifest)?;

    progress(&format!("[4/4] publishing {}", dir.display()));
    std::fs::rename(&tmp, &dir).ctx("cannot rename the build into place", &dir)?;
    sync_dir(&out)?;
    point_current(&out, &key)?;
    progress(&format!(
        "image {key} built in {:.0} s, {} MiB, {} packages",
        manifest.build_seconds,
        manifest.size_bytes >> 20,
        manifest.installed.len()
    ));
    Ok(Built {
        root: dir.join("root"),
        dir,
        manifest,
        reused: false,
    })
}

/// The image the `debian-12` link of `images` points to, if one was built.
pub fn current(images: &Path) -> Result<Option<Built>> {
    linked(images, NAME)
}

/// The image the link `name` of `images` points to, if there is one.
pub fn linked(images: &Path, name: &str) -> Result<Option<Built>> {
    let link = images.join(name);
    let Ok(dir) = std::fs::canonicalize(&link) else {
        return Ok(None);
    };
    Ok(
        crate::state::read_opt::<Manifest>(&dir.join("image.json"))?.map(|manifest| Built {
            root: dir.join("root"),
            dir,
            manifest,
            reused: true,
        }),
    )
}

/// The lock file's open descriptor; the build holds it until it returns,
/// and mmdebstrap inherits it, so a build whose caller was killed keeps
/// the next one waiting until its processes are gone.
struct BuildLock {
    file: std::fs::File,
}

fn lock(path: &Path, progress: &mut dyn FnMut(&str)) -> Result<BuildLock> {
    let file = std::fs::File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .ctx("cannot open lock file", path)?;
    let fd = file.as_raw_fd();
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(fd, libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        progress(&format!(
            "waiting for another image build (lock {})",
            path.display()
        ));
        // SAFETY: as above.
        if unsafe { libc::flock(fd, libc::LOCK_EX) } != 0 {
            return Err(std::io::Error::last_os_error()).ctx("cannot lock", path);
        }
    }
    Ok(BuildLock { file })
}

/// The apt source files the host's apt reads: `/etc/apt/sources.list` and
/// `sources.list.d/*.list|*.sources` (the names apt itself accepts).
fn host_sources() -> Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    let main = Path::new("/etc/apt/sources.list");
    if std::fs::read_to_string(main).is_ok_and(|t| has_entries(&t)) {
        found.push(main.to_path_buf());
    }
    let dir = Path::new("/etc/apt/sources.list.d");
    if let Ok(entries) = std::fs::read_dir(dir) {
        let mut files: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                let name = p.file_name().map(|n| n.to_string_lossy().into_owned());
                name.is_some_and(|n| {
                    (n.ends_with(".list") || n.ends_with(".sources"))
                        && n.chars()
                            .all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c))
                })
            })
            .filter(|p| std::fs::read_to_string(p).is_ok_and(|t| has_entries(&t)))
            .collect();
        files.sort();
        found.extend(files);
    }
    if found.is_empty() {
        return Err(LocalError::invalid(
            "apt sources",
            "/etc/apt/sources.list, /etc/apt/sources.list.d/",
            "must configure at least one Debian 12 (bookworm) source: the image is built from apt's configured sources only",
        ));
    }
    Ok(found)
}

fn has_entries(text: &str) -> bool {
    text.lines()
        .map(str::trim)
        .any(|l| !l.is_empty() && !l.starts_with('#'))
}

/// apt options that keep the resolution's state in `apt` (never the host's
/// lists, cache or dpkg status).
fn apt_options(apt: &Path) -> Vec<String> {
    let mut o = Vec::new();
    for (k, v) in [
        ("Dir::State::Lists", apt.join("lists")),
        ("Dir::Cache", apt.join("cache")),
        ("Dir::State::status", apt.join("status")),
    ] {
        o.push("-o".into());
        o.push(format!("{k}={}", v.display()));
    }
    o.push("-o".into());
    o.push("Debug::NoLocking=true".into());
    o
}

/// The versions mmdebstrap would install: `apt-get update` into private
/// lists, then a simulated install on an empty dpkg status.
fn resolve(apt: &Path, progress: &mut dyn FnMut(&str)) -> Result<BTreeMap<String, String>> {
    for d in ["lists/partial", "cache/archives/partial"] {
        std::fs::create_dir_all(apt.join(d)).ctx("cannot create", apt.join(d))?;
    }
    std::fs::write(apt.join("status"), "").ctx("cannot write", apt.join("status"))?;
    let opts = apt_options(apt);
    let mut update: Vec<&str> = opts.iter().map(String::as_str).collect();
    update.extend(["-q", "update"]);
    if let Err(e) = apt_get(&update) {
        let have_lists = std::fs::read_dir(apt.join("lists"))
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .any(|e| e.file_name().to_string_lossy().ends_with("_Packages"))
            })
            .unwrap_or(false);
        if !have_lists {
            return Err(e);
        }
        progress(&format!(
            "      warning: apt-get update failed, resolving from the last update's indexes: {e}"
        ));
    }
    let mut install: Vec<&str> = opts.iter().map(String::as_str).collect();
    install.extend([
        "-s",
        "-o",
        "APT::Install-Recommends=false",
        "install",
        "?essential",
        "?priority(required)",
        "apt",
    ]);
    install.extend(PACKAGES);
    let out = apt_get(&install)?;
    let resolved = parse_simulation(&out);
    if resolved.is_empty() {
        return Err(LocalError::Command {
            command: "apt-get -s install …".into(),
            status: "no package to install".into(),
            stderr: out.chars().take(2000).collect(),
        });
    }
    progress(&format!("      {} packages resolved", resolved.len()));
    Ok(resolved)
}

/// `Inst NAME (VERSION suite [arch])` lines of `apt-get -s install`.
fn parse_simulation(out: &str) -> BTreeMap<String, String> {
    out.lines()
        .filter_map(|l| l.strip_prefix("Inst "))
        .filter_map(|l| {
            let (name, rest) = l.split_once(' ')?;
            let version = rest.strip_prefix('(')?.split_whitespace().next()?;
            Some((name.to_string(), version.to_string()))
        })
        .collect()
}

/// The image's key: the build format, suite, variant, package list and
/// every resolved version (written to `apt/key-input`, hashed with sha256).
fn key_of(apt: &Path, resolved: &BTreeMap<String, String>) -> Result<String> {
    let input = key_input(resolved);
    let file = apt.join("key-input");
    std::fs::write(&file, &input).ctx("cannot write", &file)?;
    let out = crate::run::run("sha256sum", &[&file.display().to_string()])?;
    match out.split_whitespace().next() {
        Some(h) if h.len() == 64 => Ok(h[..16].to_string()),
        _ => Err(LocalError::Command {
            command: format!("sha256sum {}", file.display()),
            status: "unreadable output".into(),
            stderr: out,
        }),
    }
}

fn key_input(resolved: &BTreeMap<String, String>) -> String {
    let mut s = format!("format {FORMAT}\nsuite {SUITE}\nvariant {VARIANT}\n");
    for p in PACKAGES {
        s.push_str(&format!("include {p}\n"));
    }
    for (name, version) in resolved {
        s.push_str(&format!("{name} {version}\n"));
    }
    s
}

/// Removes what killed builds left in `out` (waits for a running build).
pub fn clean_unfinished(out: &Path) -> Result<()> {
    let _lock = lock(&out.join("lock"), &mut |_| {})?;
    remove_unfinished(out)
}

/// Removes builds a killed run left (`.build-*`). Called under the lock,
/// so no build is running; mmdebstrap ran in its own mount namespace, so
/// nothing can be mounted under them — checked anyway before deleting.
fn remove_unfinished(out: &Path) -> Result<()> {
    let entries = std::fs::read_dir(out).ctx("cannot list", out)?;
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    for e in entries.filter_map(|e| e.ok()) {
        if !e.file_name().to_string_lossy().starts_with(".build-") {
            continue;
        }
        let path = e.path();
        let prefix = format!("{}/", path.display());
        if mounts
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .any(|m| m.starts_with(&prefix))
        {
            return Err(LocalError::Busy {
                what: path.display().to_string(),
                message: "an unfinished image build still has mounts under it; unmount them first"
                    .into(),
            });
        }
        crate::state::remove_dir_all(&path)?;
    }
    Ok(())
}

/// Runs mmdebstrap in a private mount namespace (the /proc, /sys and /dev
/// it mounts in the chroot go with it, even when it is killed: run
/// directly, a killed mmdebstrap leaves them mounted and its dpkg running)
/// and a PID namespace, all killed if knit dies, holding the build lock
/// while any of its processes live.
fn mmdebstrap(
    root: &Path,
    scratch: &Path,
    sources: &[PathBuf],
    lock: &BuildLock,
    progress: &mut dyn FnMut(&str),
) -> Result<()> {
    let mut args: Vec<String> = vec![
        "--mount".into(),
        "--propagation".into(),
        "private".into(),
        // Its own PID namespace, whose init (mmdebstrap) unshare kills when
        // it dies: no dpkg or apt of a killed build keeps running.
        "--pid".into(),
        "--fork".into(),
        "--kill-child".into(),
        "mmdebstrap".into(),
        "--mode=root".into(),
        "--format=directory".into(),
        format!("--variant={VARIANT}"),
        format!("--include={}", PACKAGES.join(",")),
        SUITE.into(),
        root.display().to_string(),
    ];
    args.extend(sources.iter().map(|s| s.display().to_string()));
    let command = format!("unshare {}", args.join(" "));
    let lock_fd = lock.file.as_raw_fd();
    let mut cmd = Command::new("unshare");
    cmd.args(&args)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .env("TMPDIR", scratch)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            let flags = libc::fcntl(lock_fd, libc::F_GETFD);
            libc::fcntl(lock_fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC);
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(|e| LocalError::Command {
        command: command.clone(),
        status: "not started".into(),
        stderr: if e.kind() == std::io::ErrorKind::NotFound {
            "unshare (util-linux) is not installed".into()
        } else {
            e.to_string()
        },
    })?;
    let stderr = child.stderr.take();
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        if let Some(s) = stderr {
            for line in std::io::BufReader::new(s).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        }
    });
    let deadline = Instant::now() + BUILD_TIMEOUT;
    let mut tail: std::collections::VecDeque<String> = Default::default();
    let mut timed_out = false;
    loop {
        match rx.recv_timeout(Duration::from_secs(1)) {
            Ok(line) => {
                progress(&format!("      mmdebstrap: {line}"));
                if tail.len() == TAIL_LINES {
                    tail.pop_front();
                }
                tail.push_back(line);
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
        }
        if Instant::now() > deadline {
            timed_out = true;
            let _ = child.kill();
            break;
        }
    }
    let status = child.wait().map_err(|e| LocalError::Command {
        command: command.clone(),
        status: "wait failed".into(),
        stderr: e.to_string(),
    })?;
    let _ = reader.join();
    if timed_out || !status.success() {
        let stderr: Vec<String> = tail.into_iter().collect();
        return Err(LocalError::Command {
            command,
            status: if timed_out {
                format!(
                    "{} after {} s: killed",
                    crate::error::TIMED_OUT,
                    BUILD_TIMEOUT.as_secs()
                )
            } else {
                status.to_string()
            },
            stderr: stderr.join("\n"),
        });
    }
    Ok(())
}

/// Copies the kernel and initramfs out of `root/boot` (a VM boots them
/// directly): (kernel version, kernel file, initrd file).
type BootFiles = (Option<String>, Option<String>, Option<String>);
fn boot_files(image: &Path) -> Result<BootFiles> {
    let boot = image.join("root/boot");
    let mut versions: Vec<String> = std::fs::read_dir(&boot)
        .ctx("cannot list", &boot)?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            e.file_name()
                .to_string_lossy()
                .strip_prefix("vmlinuz-")
                .map(str::to_string)
        })
        .collect();
    versions.sort();
    let Some(version) = versions.pop() else {
        return Ok((None, None, None));
    };
    let kernel = boot.join(format!("vmlinuz-{version}"));
    std::fs::copy(&kernel, image.join("vmlinuz")).ctx("cannot copy", &kernel)?;
    let initrd = boot.join(format!("initrd.img-{version}"));
    let initrd_name = if initrd.exists() {
        std::fs::copy(&initrd, image.join("initrd.img")).ctx("cannot copy", &initrd)?;
        Some("initrd.img".to_string())
    } else {
        None
    };
    Ok((Some(version), Some("vmlinuz".into()), initrd_name))
}

/// Package → version, from the image's own dpkg database.
fn installed(root: &Path) -> Result<BTreeMap<String, String>> {
    let admin = root.join("var/lib/dpkg");
    let out = crate::run::run(
        "dpkg-query",
        &[
            &format!("--admindir={}", admin.display()),
            "-W",
            "-f=${Package}\t${Version}\t${db:Status-Abbrev}\n",
        ],
    )?;
    Ok(out
        .lines()
        .filter_map(|l| {
            let mut f = l.split('\t');
            let (name, version, status) = (f.next()?, f.next()?, f.next()?);
            status
                .starts_with("ii")
                .then(|| (name.to_string(), version.to_string()))
        })
        .collect())
}

/// Bytes used under `dir`, not crossing into other filesystems.
fn du(dir: &Path) -> Result<u64> {
    let p = dir.display().to_string();
    let out = crate::run::run("du", &["-sx", "--block-size=1", &p])?;
    out.split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| LocalError::Command {
            command: format!("du -sx --block-size=1 {p}"),
            status: "unreadable output".into(),
            stderr: out.clone(),
        })
}

/// Points `<out>/debian-12` at `key`, atomically (a new link renamed over).
fn point_current(out: &Path, key: &str) -> Result<()> {
    point(out, NAME, key)
}

/// Points `<out>/<name>` at `key`, atomically.
fn point(out: &Path, name: &str, key: &str) -> Result<()> {
    let link = out.join(name);
    if std::fs::read_link(&link).is_ok_and(|t| t == Path::new(key)) {
        return Ok(());
    }
    let tmp = out.join(format!(".{name}.link"));
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(key, &tmp).ctx("cannot link", &tmp)?;
    std::fs::rename(&tmp, &link).ctx("cannot rename the link into place", &link)?;
    sync_dir(out)
}

fn sync_dir(dir: &Path) -> Result<()> {
    Ok(knit_os::durable::sync_dir(dir)?)
}

/// apt's output kept (each stream): the simulation lists every package.
const APT_OUTPUT_CAP: usize = 16 << 20;

/// Runs apt-get with its deadline (killed after it) and cap: its stdout.
fn apt_get(args: &[&str]) -> Result<String> {
    crate::run::run_within("apt-get", args, "", APT_TIMEOUT, APT_OUTPUT_CAP)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simulation_lines_give_names_and_versions() {
        let out =
            "NOTE: simulation\nInst libc6 (2.36-9+deb12u14 Debian:12.15/oldstable [amd64]) []\n\
                   Inst curl (7.88.1-10+deb12u15 Debian-Security:12/oldstable-security [amd64])\n\
                   Conf libc6 (2.36-9+deb12u14 Debian:12.15/oldstable [amd64])\n";
        let r = parse_simulation(out);
        assert_eq!(r.len(), 2);
        assert_eq!(r["libc6"], "2.36-9+deb12u14");
        assert_eq!(r["curl"], "7.88.1-10+deb12u15");
    }

    #[test]
    fn the_key_changes_with_any_version() {
        let apt = tempfile::tempdir().unwrap();
        let mut a = BTreeMap::new();
        a.insert("curl".to_string(), "1".to_string());
        let k1 = key_of(apt.path(), &a).unwrap();
        assert_eq!(k1, key_of(apt.path(), &a).unwrap());
        assert!(key_input(&a).contains("include linux-image-cloud-amd64\n"));
        a.insert("curl".to_string(), "2".to_string());
        assert_ne!(k1, key_of(apt.path(), &a).unwrap());
        assert_eq!(k1.len(), 16);
    }

    #[test]
    fn an_unbuilt_image_says_how_to_build_it() {
        let root = images_dir().join("0000000000000000/root");
        let rule = crate::check_base_root(&root).unwrap_err();
        assert!(rule.contains("knit image build"), "{rule}");
        // Any other missing directory keeps the general rule.
        let rule = crate::check_base_root(Path::new("/nonexistent-knit-root")).unwrap_err();
        assert!(rule.contains("root filesystem directory"), "{rule}");
    }

    #[test]
    fn comment_only_sources_do_not_count() {
        assert!(!has_entries("# deb http://x y main\n\n"));
        assert!(has_entries("Types: deb\n"));
    }
}
