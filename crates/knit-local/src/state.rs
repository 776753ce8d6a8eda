//! The state directory: one JSON record per object, written atomically and
//! always before the resource it names is made, so delete and `down` know
//! what to release.

use crate::error::{IoContext, LocalError, Result};
use crate::model::{DiskRecord, InstanceRecord, NetworkRecord, SnapshotRecord};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::fs::File;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone)]
pub struct StateDir {
    root: PathBuf,
}

impl StateDir {
    pub fn open(root: &Path) -> Result<StateDir> {
        for sub in ["instances", "disks", "snapshots"] {
            std::fs::create_dir_all(root.join(sub))
                .ctx("cannot create state directory", root.join(sub))?;
        }
        // Records hold user data: root only.
        std::fs::set_permissions(root, std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .ctx("cannot restrict", root)?;
        Ok(StateDir {
            root: root.to_path_buf(),
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn instance_dir(&self, id: &str) -> PathBuf {
        self.root.join("instances").join(id)
    }
    pub fn disk_dir(&self, id: &str) -> PathBuf {
        self.root.join("disks").join(id)
    }
    pub fn disk_file(&self, id: &str) -> PathBuf {
        self.disk_dir(id).join("disk.img")
    }
    pub fn snapshot_dir(&self, id: &str) -> PathBuf {
        self.root.join("snapshots").join(id)
    }
    pub fn snapshot_file(&self, id: &str) -> PathBuf {
        self.snapshot_dir(id).join("snapshot.img")
    }
    pub fn system_disk_file(&self, id: &str) -> PathBuf {
        self.instance_dir(id).join("system.img")
    }

    /// Serialises mutations across processes (CLI invocations, the server).
    pub fn lock(&self) -> Result<StateLock> {
        let path = self.root.join("lock");
        let file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .ctx("cannot open lock file", &path)?;
        // SAFETY: flock on a descriptor we own; released when the file closes.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
        if rc != 0 {
            return Err(std::io::Error::last_os_error()).ctx("cannot lock", path);
        }
        Ok(StateLock { _file: file })
    }

    pub fn network(&self) -> Result<Option<NetworkRecord>> {
        read_opt(&self.root.join("network.json"))
    }
    pub fn put_network(&self, n: &NetworkRecord) -> Result<()> {
        write_json(&self.root.join("network.json"), n)
    }
    pub fn remove_network(&self) -> Result<()> {
        remove_file(&self.root.join("network.json"))
    }

    pub fn instance(&self, id: &str) -> Result<InstanceRecord> {
        check_id(id, "i-", "instance")?;
        read_opt(&self.instance_dir(id).join("instance.json"))?.ok_or_else(|| {
            LocalError::NotFound {
                kind: "instance",
                id: id.into(),
            }
        })
    }
    pub fn put_instance(&self, r: &InstanceRecord) -> Result<()> {
        let dir = self.instance_dir(&r.id);
        create_dir_durable(&dir)?;
        write_json(&dir.join("instance.json"), r)
    }
    pub fn instances(&self) -> Result<Vec<InstanceRecord>> {
        self.list(&self.root.join("instances"), "instance.json")
    }

    pub fn disk(&self, id: &str) -> Result<DiskRecord> {
        check_id(id, "d-", "disk")?;
        read_opt(&self.disk_dir(id).join("disk.json"))?.ok_or_else(|| LocalError::NotFound {
            kind: "disk",
            id: id.into(),
        })
    }
    pub fn put_disk(&self, r: &DiskRecord) -> Result<()> {
        let dir = self.disk_dir(&r.id);
        create_dir_durable(&dir)?;
        write_json(&dir.join("disk.json"), r)
    }
    pub fn disks(&self) -> Result<Vec<DiskRecord>> {
        self.list(&self.root.join("disks"), "disk.json")
    }

    pub fn snapshot(&self, id: &str) -> Result<SnapshotRecord> {
        check_id(id, "s-", "snapshot")?;
        read_opt(&self.snapshot_dir(id).join("snapshot.json"))?.ok_or_else(|| {
            LocalError::NotFound {
                kind: "snapshot",
                id: id.into(),
            }
        })
    }
    pub fn put_snapshot(&self, r: &SnapshotRecord) -> Result<()> {
        let dir = self.snapshot_dir(&r.id);
        create_dir_durable(&dir)?;
        write_json(&dir.join("snapshot.json"), r)
    }
    pub fn snapshots(&self) -> Result<Vec<SnapshotRecord>> {
        self.list(&self.root.join("snapshots"), "snapshot.json")
    }

    fn list<T: DeserializeOwned>(&self, dir: &Path, file: &str) -> Result<Vec<T>> {
        let mut out = Vec::new();
        let mut names: Vec<_> = std::fs::read_dir(dir)
            .ctx("cannot list", dir)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect();
        names.sort();
        for p in names {
            // A directory removed between listing and reading reads as None.
            if let Some(r) = read_opt(&p.join(file))? {
                out.push(r);
            }
        }
        Ok(out)
    }
}

pub struct StateLock {
    _file: File,
}

/// Ids are generated by us; anything else (`../x`) is simply not found.
fn check_id(id: &str, prefix: &str, kind: &'static str) -> Result<()> {
    let ok = id
        .strip_prefix(prefix)
        .is_some_and(|rest| !rest.is_empty() && rest.chars().all(|c| c.is_ascii_hexdigit()));
    if ok {
        Ok(())
    } else {
        Err(LocalError::NotFound {
            kind,
            id: id.into(),
        })
    }
}

pub fn read_opt<T: DeserializeOwned>(path: &Path) -> Result<Option<T>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).ctx("cannot read", path),
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| LocalError::State {
            path: path.into(),
            message: e.to_string(),
        })
}

/// A record, written with [`write_durable`].
pub fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<()> {
    let text = serde_json::to_vec_pretty(value).map_err(|e| LocalError::State {
        path: path.into(),
        message: e.to_string(),
    })?;
    write_durable(path, &text)
}

/// Replaces `path` with `bytes` so that a crash (of this process or of the
/// host) leaves either the old file or the new one, whole: a temporary file
/// in the same directory is written and fsynced, renamed into place, and
/// the directory fsynced so the rename itself is on disk when this returns.
/// Records are written before what they name is made: a record lost to a
/// power cut would leave a resource nothing knows to release.
/// Records are private to root (0600).
pub fn write_durable(path: &Path, bytes: &[u8]) -> Result<()> {
    write_durable_with_mode(path, bytes, 0o600)
}

/// [`write_durable`] for a file others may read: it has `mode` before it
/// appears under its name.
pub fn write_durable_with_mode(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    Ok(knit_os::durable::write(path, bytes, mode)?)
}

/// Makes `dir` (and its parents) if missing, its entry in its parent on
/// disk before a record goes into it.
pub fn create_dir_durable(dir: &Path) -> Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    std::fs::create_dir_all(dir).ctx("cannot create", dir)?;
    if let Some(parent) = dir.parent() {
        knit_os::durable::sync_dir(parent)?;
    }
    Ok(())
}

pub fn remove_file(path: &Path) -> Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e).ctx("cannot remove", path),
        _ => Ok(()),
    }
}

pub fn remove_dir_all(path: &Path) -> Result<()> {
    match std::fs::remove_dir_all(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e).ctx("cannot remove", path),
        _ => Ok(()),
    }
}

/// `prefix` + 12 random hex digits from the kernel's CSPRNG.
pub fn new_id(prefix: &str) -> Result<String> {
    let mut buf = [0u8; 6];
    File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .ctx("cannot read", "/dev/urandom")?;
    Ok(format!("{prefix}{}", hex(&buf)))
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Whole seconds since the epoch (records' `created_at`).
pub use knit_os::time::now_secs as now;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ProcRef;

    #[test]
    fn ids_are_checked_and_unique() {
        let a = new_id("i-").unwrap();
        assert_eq!(a.len(), 14);
        assert_ne!(a, new_id("i-").unwrap());
        assert!(check_id(&a, "i-", "instance").is_ok());
        assert!(check_id("i-../../etc", "i-", "instance").is_err());
        assert!(check_id("d-00", "i-", "instance").is_err());
    }

    #[test]
    fn own_process_is_alive_and_records_round_trip() {
        let me = ProcRef::of(std::process::id() as i32).unwrap();
        assert!(me.alive());
        let other = ProcRef {
            start_time: me.start_time + 1,
            ..me
        };
        assert!(!other.alive());
        let dir = tempfile::tempdir().unwrap();
        let s = StateDir::open(dir.path()).unwrap();
        assert!(s.network().unwrap().is_none());
        let err = s.instance("i-0123456789ab").unwrap_err();
        assert_eq!(err.code(), "LocalNotFound");
        assert!(err.to_string().contains("i-0123456789ab"));
    }
}
