//! Loop devices over the sparse files that back instance disks.

use crate::error::{IoContext, LocalError, Result};
use crate::run::{run, run_absent_ok};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// An attached loop device: its node and device number.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LoopDev {
    pub path: PathBuf,
    pub major: u64,
    pub minor: u64,
}

pub fn attach(file: &Path) -> Result<LoopDev> {
    let out = run("losetup", &["--find", "--show", &file.to_string_lossy()])?;
    LoopDev::of(Path::new(out.trim()))
}

impl LoopDev {
    /// The device number of an existing loop device node.
    pub fn of(path: &Path) -> Result<LoopDev> {
        let meta = std::fs::metadata(path).ctx("cannot stat", path)?;
        if !meta.file_type().is_block_device() {
            return Err(LocalError::Busy {
                what: path.display().to_string(),
                message: "is not a block device".into(),
            });
        }
        let rdev = meta.rdev();
        Ok(LoopDev {
            path: path.to_path_buf(),
            major: libc::major(rdev) as u64,
            minor: libc::minor(rdev) as u64,
        })
    }
}

pub fn detach(dev: &Path) -> Result<()> {
    run_absent_ok(
        "losetup",
        &["-d", &dev.to_string_lossy()],
        &["No such device", "No such file"],
    )
}

/// Loop devices whose backing file lies under `dir`, found through sysfs, so
/// that a crash between attach and record still leaves them findable.
/// `dir` may be (or pass through) a symlink: disk files are links into the
/// block store, and the kernel reports the resolved path.
pub fn backed_under(dir: &Path) -> Vec<(PathBuf, PathBuf)> {
    let dir = &std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/sys/block")
        .into_iter()
        .flatten()
        .flatten()
    {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("loop") {
            continue;
        }
        if let Ok(backing) = std::fs::read_to_string(entry.path().join("loop/backing_file")) {
            let backing = PathBuf::from(backing.trim().trim_end_matches(" (deleted)"));
            if backing.starts_with(dir) {
                out.push((PathBuf::from("/dev").join(&name), backing));
            }
        }
    }
    out
}

/// Detaches every loop device over `file` and waits until the kernel has
/// let go: a device still held (by a dying mount namespace) detaches lazily,
/// and the file must not be attached twice meanwhile.
pub fn detach_file(file: &Path) -> Result<()> {
    for (dev, _) in backed_under(file) {
        detach(&dev)?;
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let left = backed_under(file);
        if left.is_empty() {
            return Ok(());
        }
        if std::time::Instant::now() > deadline {
            return Err(LocalError::Busy {
                what: left[0].0.display().to_string(),
                message: format!("still attached to {} after 10s", file.display()),
            });
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// A sparse file of `size` bytes.
pub fn create_sparse(file: &Path, size: u64) -> Result<()> {
    let f = std::fs::File::options()
        .write(true)
        .create_new(true)
        .open(file)
        .ctx("cannot create disk file", file)?;
    f.set_len(size).ctx("cannot size disk file", file)
}

/// Makes a filesystem directly on a backing file (no loop device needed).
pub fn mkfs(file: &Path, fs: &str) -> Result<()> {
    let f = file.to_string_lossy();
    match fs {
        "xfs" => run("mkfs.xfs", &["-q", "-f", &f]),
        // lazy init keeps mkfs of a big sparse file to milliseconds.
        _ => run(
            "mkfs.ext4",
            &[
                "-q",
                "-F",
                "-E",
                "lazy_itable_init=1,lazy_journal_init=1",
                &f,
            ],
        ),
    }
    .map(|_| ())
}

/// Copies a disk file into a new file: a reflink clone where the filesystem
/// can (the block store), a sparse copy otherwise (e.g. a disk file of an
/// older state directory, outside the store).
pub fn copy_disk(from: &Path, to: &Path) -> Result<&'static str> {
    if clone_file(from, to).is_ok() {
        return Ok("reflink");
    }
    let _ = std::fs::remove_file(to);
    run(
        "cp",
        &[
            "--sparse=always",
            &from.to_string_lossy(),
            &to.to_string_lossy(),
        ],
    )?;
    Ok("sparse-copy")
}

/// Clones `from` into a new file `to` (FICLONE): instant, blocks shared.
pub fn clone_file(from: &Path, to: &Path) -> Result<()> {
    let src = std::fs::File::open(from).ctx("cannot open", from)?;
    let dst = std::fs::File::options()
        .write(true)
        .create_new(true)
        .open(to)
        .ctx("cannot create", to)?;
    // SAFETY: both descriptors are open files we own for the call's duration.
    let rc = unsafe {
        libc::ioctl(
            std::os::fd::AsRawFd::as_raw_fd(&dst),
            libc::FICLONE,
            std::os::fd::AsRawFd::as_raw_fd(&src),
        )
    };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        drop(dst);
        let _ = std::fs::remove_file(to);
        return Err(e).ctx("cannot reflink-clone into", to);
    }
    Ok(())
}
