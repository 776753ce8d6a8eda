//! The block store: where data-disk and snapshot files live, so that a
//! snapshot and every disk made from it are reflink clones — made at once,
//! sharing blocks until written, the way a cloud's snapshots are
//! copy-on-write.
//!
//! When the state directory's own filesystem does reflinks (XFS, btrfs), the
//! store is the plain directory `<state>/store`. Otherwise (ext4) it is an XFS
//! made with `reflink=1` on a sparse file `<state>/store.img`, on a loop
//! device, mounted on `<state>/store` with `discard`, so that blocks freed in
//! it (a deleted disk, a discard inside an instance) are punched out of the
//! backing file again. `<state>/store.json` is written before anything is
//! made; every step is idempotent, so a crash at any point is repaired by the
//! next `ensure` or removed by `down`.

use crate::error::{IoContext, LocalError, Result, SysContext};
use crate::loopdev::{self, clone_file};
use crate::mounts::mount_points;
use crate::run::{find_program, run};
use crate::state::{self, now};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

/// The host must have this much free where the state directory lives for a
/// new XFS store (mkfs needs ~300 MiB; the rest is room for disks).
pub const MIN_FREE_BYTES: u64 = 2 << 30;
/// The XFS is sized to the host's free space, at most this (sparse: only
/// what is written takes room).
const MAX_SIZE_BYTES: u64 = 16 << 40;

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StoreKind {
    /// The state directory's filesystem clones files itself.
    Native,
    /// An XFS with reflink on a loop-backed sparse file.
    XfsLoop,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoreRecord {
    pub kind: StoreKind,
    /// Bytes of the XFS (the sparse backing file's length).
    #[serde(default)]
    pub size: u64,
    /// mkfs finished: a backing file without it is formatted (again).
    #[serde(default)]
    pub formatted: bool,
    pub created_at: u64,
}

/// The store of one state directory.
#[derive(Debug, Clone)]
pub struct BlockStore {
    root: PathBuf,
}

impl BlockStore {
    pub fn new(state_root: &Path) -> BlockStore {
        BlockStore {
            root: state_root.to_path_buf(),
        }
    }

    /// Where the files are (the XFS mount point, or a plain directory).
    pub fn dir(&self) -> PathBuf {
        self.root.join("store")
    }
    pub fn backing_file(&self) -> PathBuf {
        self.root.join("store.img")
    }
    fn record_path(&self) -> PathBuf {
        self.root.join("store.json")
    }
    pub fn record(&self) -> Result<Option<StoreRecord>> {
        state::read_opt(&self.record_path())
    }

    /// The file of a disk (`kind` "disks") or snapshot ("snapshots") in the store.
    pub fn file(&self, kind: &str, id: &str) -> PathBuf {
        self.dir().join(kind).join(format!("{id}.img"))
    }

    /// The XFS is mounted on [`BlockStore::dir`] (in this mount namespace).
    pub fn mounted(&self) -> bool {
        let dir = self.dir();
        mount_points().iter().any(|m| Path::new(m) == dir.as_path())
    }

    /// Quick check without the state lock: nothing to do.
    pub fn ready(&self) -> bool {
        match self.record() {
            Ok(Some(r)) if r.kind == StoreKind::Native => self.dir().is_dir(),
            Ok(Some(_)) => self.mounted(),
            _ => false,
        }
    }

    /// Makes the store usable: probes, creates, formats, attaches and mounts
    /// as needed. The caller holds the state lock.
    pub fn ensure(&self) -> Result<PathBuf> {
        let dir = self.dir();
        let rec = match self.record()? {
            Some(r) => r,
            None => {
                let kind = if reflink_works(&self.root) {
                    StoreKind::Native
                } else {
                    StoreKind::XfsLoop
                };
                let mut r = StoreRecord {
                    kind,
                    size: 0,
                    formatted: false,
                    created_at: now(),
                };
                if kind == StoreKind::XfsLoop {
                    r.size = self.check_host()?;
                }
                state::write_json(&self.record_path(), &r)?;
                r
            }
        };
        std::fs::create_dir_all(&dir).ctx("cannot create", &dir)?;
        if rec.kind == StoreKind::XfsLoop && !self.mounted() {
            self.mount_xfs(rec)?;
        }
        for sub in ["disks", "snapshots"] {
            std::fs::create_dir_all(dir.join(sub)).ctx("cannot create", dir.join(sub))?;
        }
        Ok(dir)
    }

    /// Free space and mkfs.xfs, checked before a new XFS store is made;
    /// returns the size to make it.
    fn check_host(&self) -> Result<u64> {
        let stat = nix::sys::statvfs::statvfs(&self.root)
            .sys(|| format!("statvfs {}", self.root.display()))?;
        let free = stat.blocks_available() as u64 * stat.fragment_size() as u64;
        if free < MIN_FREE_BYTES {
            return Err(LocalError::invalid(
                "stateDir",
                format!("{:?}", self.root.display().to_string()),
                format!(
                    "needs at least {} GiB free ({:.1} GiB free): its filesystem has no reflink, so knit-local keeps disks in an XFS block store on a sparse file there ({})",
                    MIN_FREE_BYTES >> 30,
                    free as f64 / (1u64 << 30) as f64,
                    self.backing_file().display(),
                ),
            ));
        }
        if find_program("mkfs.xfs").is_none() {
            return Err(LocalError::Command {
                command: "mkfs.xfs".into(),
                status: "not found".into(),
                stderr: format!(
                    "mkfs.xfs (xfsprogs) is not installed: the filesystem of the state directory {} has no reflink, so knit-local keeps disks in an XFS block store ({}) and needs it",
                    self.root.display(),
                    self.backing_file().display()
                ),
            });
        }
        // Whole GiB, so that the size is the same however often it is asked.
        Ok((free.min(MAX_SIZE_BYTES) >> 30) << 30)
    }

    fn mount_xfs(&self, mut rec: StoreRecord) -> Result<()> {
        let file = self.backing_file();
        if !rec.formatted {
            if !file.exists() {
                loopdev::create_sparse(&file, rec.size)?;
            }
            // -K: the file is sparse already, discarding it is wasted time.
            run(
                "mkfs.xfs",
                &[
                    "-q",
                    "-f",
                    "-K",
                    "-m",
                    "reflink=1",
                    "-L",
                    "knit-store",
                    &file.to_string_lossy(),
                ],
            )?;
            rec.formatted = true;
            state::write_json(&self.record_path(), &rec)?;
        }
        // A loop device left by a crash between attach and mount is reused.
        let dev = match loopdev::backed_under(&file).into_iter().next() {
            Some((dev, _)) => dev,
            None => {
                // Direct I/O: the XFS's page cache is enough, the host's
                // cache of the backing file would hold every block twice.
                let out = run(
                    "losetup",
                    &[
                        "--find",
                        "--show",
                        "--direct-io=on",
                        &file.to_string_lossy(),
                    ],
                )?;
                PathBuf::from(out.trim())
            }
        };
        crate::pause::checkpoint("store-loop");
        nix::mount::mount(
            Some(&dev),
            &self.dir(),
            Some("xfs"),
            nix::mount::MsFlags::MS_NOATIME,
            Some("discard"),
        )
        .sys(|| {
            format!(
                "mount the block store {} ({}) on {}",
                file.display(),
                dev.display(),
                self.dir().display()
            )
        })?;
        tracing::info!(store = %self.dir().display(), device = %dev.display(), "block store mounted");
        Ok(())
    }

    /// Unmounts the store and detaches its loop device (for `down`; the
    /// files under it are gone with the state directory). Returns how many
    /// mounts were released.
    pub fn release(&self) -> Result<usize> {
        let mut n = 0;
        let dir = self.dir();
        while mount_points().iter().any(|m| Path::new(m) == dir.as_path()) {
            // Lazy: an instance's namespace may still be dying; the
            // filesystem goes when its last user does.
            nix::mount::umount2(&dir, nix::mount::MntFlags::MNT_DETACH)
                .sys(|| format!("umount the block store {}", dir.display()))?;
            n += 1;
        }
        loopdev::detach_file(&self.backing_file())?;
        Ok(n)
    }
}

/// Whether files in `dir` can be reflink-cloned (tried on two probe files).
fn reflink_works(dir: &Path) -> bool {
    let a = dir.join(format!(".reflink-probe-{}-a", std::process::id()));
    let b = dir.join(format!(".reflink-probe-{}-b", std::process::id()));
    let ok = std::fs::File::create(&a)
        .and_then(|mut f| f.write_all(&[0x6b; 4096]))
        .is_ok()
        && clone_file(&a, &b).is_ok()
        && std::fs::File::open(&b)
            .and_then(|mut f| {
                let mut v = Vec::new();
                f.read_to_end(&mut v).map(|_| v)
            })
            .is_ok_and(|v| v.len() == 4096 && v.iter().all(|&x| x == 0x6b));
    let _ = std::fs::remove_file(&a);
    let _ = std::fs::remove_file(&b);
    ok
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_files_are_named_by_kind_and_id() {
        let s = BlockStore::new(Path::new("/var/lib/knit/local"));
        assert_eq!(
            s.file("disks", "d-0123456789ab"),
            Path::new("/var/lib/knit/local/store/disks/d-0123456789ab.img")
        );
        assert_eq!(s.backing_file(), Path::new("/var/lib/knit/local/store.img"));
    }
}
