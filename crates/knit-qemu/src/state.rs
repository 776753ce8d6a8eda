//! The state directory: every VM, disk, tap and process is written down
//! here before it is made, so `delete` and `down` release exactly what was
//! made, even after a crash.
//!
//! ```text
//! <state>/lock                       flock: record changes are serialised
//! <state>/vms/<id>/vm.json           the record (tap, MAC, IP, disks, pid)
//!                  system.qcow2      overlay on the base image's disk
//!                  disk-<disk>.qcow2 data disks
//!                  seed.img          cloud-init NoCloud seed (vfat, CIDATA)
//!                  console.log       the serial console (QEMU's)
//!                  run/              QEMU's own (its uid): qmp.sock qga.sock
//! <state>/snapshots/<id>/snapshot.json  snapshot.qcow2
//! ```

use crate::error::{IoContext, QemuError, Result};
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use std::collections::BTreeMap;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Interface {
    Virtio,
    Nvme,
}

impl std::fmt::Display for Interface {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Interface::Virtio => "virtio",
            Interface::Nvme => "nvme",
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VmState {
    /// Recorded, being made.
    Creating,
    Running,
    Stopped,
    /// Being deleted (a crash here is finished by the next delete/down).
    Deleting,
}

impl std::fmt::Display for VmState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            VmState::Creating => "creating",
            VmState::Running => "running",
            VmState::Stopped => "stopped",
            VmState::Deleting => "deleting",
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DiskRecord {
    /// `d-<10 hex>`, also the device's serial (`/dev/disk/by-id/…-<id>`).
    pub id: String,
    pub interface: Interface,
    pub size_bytes: u64,
    /// The snapshot this disk is an overlay on, if any.
    pub snapshot: Option<String>,
}

/// The QEMU process of a running VM, identified so that a reused PID is
/// never signalled: its start time (clock ticks since boot, /proc/PID/stat).
pub use knit_os::proc::ProcRef as Process;

/// The files a VM boots from (copied out of a knit OS image).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BootFiles {
    /// The OS image directory this came from (`knit image build`).
    pub image: PathBuf,
    /// The read-only base disk (raw ext4) system overlays sit on.
    pub disk: PathBuf,
    pub kernel: PathBuf,
    pub initrd: PathBuf,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VmRecord {
    /// `vm-<12 hex>`.
    pub id: String,
    pub name: String,
    pub hostname: String,
    pub state: VmState,
    pub boot: BootFiles,
    pub system_disk_bytes: u64,
    pub memory_mib: u32,
    pub cpus: u32,
    pub bridge: String,
    /// `kq<12 hex>`: recorded before it is made.
    pub tap: String,
    pub mac: String,
    pub ip: String,
    /// The subnet's prefix length and gateway (network-config).
    pub prefix: u8,
    pub gateway: String,
    pub disks: Vec<DiskRecord>,
    /// cloud-init's instance-id is `<id>-<generation>`; reimage bumps it so
    /// the new user data runs.
    pub generation: u32,
    pub tags: BTreeMap<String, String>,
    pub process: Option<Process>,
    /// `tcg` or `kvm`: what the last start used.
    pub accel: Option<String>,
    pub created_at: u64,
    pub password_set_at: Option<u64>,
    /// The create's idempotency key (absent in records of older versions).
    #[serde(default)]
    pub client_token: Option<String>,
    /// The uid and gid its QEMU runs as ([`crate::confine`]); records of
    /// older versions get one at their next start.
    #[serde(default)]
    pub uid: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotRecord {
    /// `s-<12 hex>`.
    pub id: String,
    pub name: Option<String>,
    /// The disk it was taken from.
    pub source_disk: String,
    pub size_bytes: u64,
    /// False until the copy finished (a crash leaves an unfinished one,
    /// found by name and deleted).
    pub complete: bool,
    pub created_at: u64,
}

pub struct State {
    root: PathBuf,
}

/// Holds the state directory's flock until dropped.
pub struct StateLock {
    _file: std::fs::File,
}

impl State {
    pub fn open(root: &Path) -> Result<State> {
        for d in ["vms", "snapshots"] {
            std::fs::create_dir_all(root.join(d)).ctx("cannot create", root.join(d))?;
        }
        use std::os::unix::fs::PermissionsExt;
        // Searchable, not listable: a VM's QEMU (its own uid) reaches a
        // snapshot it is an overlay on by `../../snapshots/<id>/`.
        for d in [root.to_path_buf(), root.join("vms"), root.join("snapshots")] {
            std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o711))
                .ctx("cannot set the mode of", &d)?;
        }
        Ok(State {
            root: root.to_path_buf(),
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn lock(&self) -> Result<StateLock> {
        let path = self.root.join("lock");
        let file = std::fs::File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .ctx("cannot open lock file", &path)?;
        // SAFETY: flock on a descriptor we own.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(std::io::Error::last_os_error()).ctx("cannot lock", &path);
        }
        Ok(StateLock { _file: file })
    }

    pub fn vm_dir(&self, id: &str) -> PathBuf {
        self.root.join("vms").join(id)
    }

    pub fn snapshot_dir(&self, id: &str) -> PathBuf {
        self.root.join("snapshots").join(id)
    }

    pub fn vm(&self, id: &str) -> Result<VmRecord> {
        if !valid_id(id, "vm-") {
            return Err(QemuError::NotFound {
                kind: "VM",
                id: id.to_string(),
            });
        }
        read_opt(&self.vm_dir(id).join("vm.json"))?.ok_or_else(|| QemuError::NotFound {
            kind: "VM",
            id: id.to_string(),
        })
    }

    pub fn put_vm(&self, rec: &VmRecord) -> Result<()> {
        let dir = self.vm_dir(&rec.id);
        std::fs::create_dir_all(&dir).ctx("cannot create", &dir)?;
        write_json(&dir.join("vm.json"), rec)
    }

    pub fn vms(&self) -> Result<Vec<VmRecord>> {
        let mut out = Vec::new();
        for id in list_dir(&self.root.join("vms"))? {
            if let Some(r) = read_opt::<VmRecord>(&self.vm_dir(&id).join("vm.json"))? {
                out.push(r);
            }
        }
        out.sort_by_key(|r| (r.created_at, r.id.clone()));
        Ok(out)
    }

    /// VM directories, with or without a record (a crash can leave a
    /// directory whose record was never written).
    pub fn vm_dirs(&self) -> Result<Vec<String>> {
        list_dir(&self.root.join("vms"))
    }

    pub fn snapshot(&self, id: &str) -> Result<SnapshotRecord> {
        if !valid_id(id, "s-") {
            return Err(QemuError::NotFound {
                kind: "snapshot",
                id: id.to_string(),
            });
        }
        read_opt(&self.snapshot_dir(id).join("snapshot.json"))?.ok_or_else(|| QemuError::NotFound {
            kind: "snapshot",
            id: id.to_string(),
        })
    }

    pub fn put_snapshot(&self, rec: &SnapshotRecord) -> Result<()> {
        let dir = self.snapshot_dir(&rec.id);
        std::fs::create_dir_all(&dir).ctx("cannot create", &dir)?;
        write_json(&dir.join("snapshot.json"), rec)
    }

    pub fn snapshots(&self) -> Result<Vec<SnapshotRecord>> {
        let mut out = Vec::new();
        for id in list_dir(&self.root.join("snapshots"))? {
            if let Some(r) =
                read_opt::<SnapshotRecord>(&self.snapshot_dir(&id).join("snapshot.json"))?
            {
                out.push(r);
            }
        }
        out.sort_by_key(|r| (r.created_at, r.id.clone()));
        Ok(out)
    }
}

/// `prefix` + 10 or 12 lower-case hex digits: the only names we make, so a
/// caller's id can never reach outside the state directory.
pub fn valid_id(id: &str, prefix: &str) -> bool {
    id.strip_prefix(prefix).is_some_and(|h| {
        (h.len() == 10 || h.len() == 12)
            && h.chars()
                .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c))
    })
}

fn list_dir(dir: &Path) -> Result<Vec<String>> {
    let mut names: Vec<String> = match std::fs::read_dir(dir) {
        Ok(entries) => entries
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| !n.starts_with('.'))
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(e).ctx("cannot list", dir),
    };
    names.sort();
    Ok(names)
}

pub fn read_opt<T: DeserializeOwned>(path: &Path) -> Result<Option<T>> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| QemuError::State {
                path: path.display().to_string(),
                message: e.to_string(),
            }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).ctx("cannot read", path),
    }
}

/// Written to a temporary file in the same directory, fsynced, renamed
/// over, directory fsynced: a record either is whole or was never there.
pub fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<()> {
    let body = serde_json::to_vec_pretty(value).map_err(|e| QemuError::State {
        path: path.display().to_string(),
        message: e.to_string(),
    })?;
    // 0600 as the temporary file it used to be renamed from.
    Ok(knit_os::durable::write(path, &body, 0o600)?)
}

/// `n` random bytes as lower-case hex.
pub fn random_hex(n: usize) -> Result<String> {
    let mut buf = vec![0u8; n];
    let mut f = std::fs::File::open("/dev/urandom").ctx("cannot open", "/dev/urandom")?;
    std::io::Read::read_exact(&mut f, &mut buf).ctx("cannot read", "/dev/urandom")?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_cannot_name_paths() {
        assert!(valid_id("vm-0123456789ab", "vm-"));
        assert!(valid_id("d-0123456789", "d-"));
        assert!(!valid_id("vm-../../etc", "vm-"));
        assert!(!valid_id("vm-0123456789AB", "vm-"));
        assert!(!valid_id("s-0123456789ab", "vm-"));
    }
}
