//! A VM's disks: the system overlay, data disk files, snapshots.

use super::*;

impl Machines {
    pub(super) fn system_overlay(&self, rec: &VmRecord) -> Result<()> {
        let file = self.state.vm_dir(&rec.id).join("system.qcow2");
        let _ = std::fs::remove_file(&file);
        let (b, f, size) = (
            rec.boot.disk.display().to_string(),
            file.display().to_string(),
            rec.system_disk_bytes.to_string(),
        );
        run(
            "qemu-img",
            &[
                "create", "-q", "-f", "qcow2", "-b", &b, "-F", "raw", &f, &size,
            ],
            CMD_TIMEOUT,
        )
        .map(|_| ())
    }

    pub(super) fn snapshot_file(&self, id: &str) -> PathBuf {
        self.state.snapshot_dir(id).join("snapshot.qcow2")
    }

    /// A snapshot of a data disk: a standalone qcow2 copy (`qemu-img
    /// convert`). Of a running VM it is crash-consistent (`-U`): run `sync`
    /// inside first. The record (with `name`) is written before the copy.
    pub fn snapshot_create(
        &self,
        vm_id: &str,
        disk_index: usize,
        name: Option<&str>,
    ) -> Result<SnapshotRecord> {
        let vm = self.describe(vm_id)?;
        let disk = vm
            .record
            .disks
            .get(disk_index)
            .cloned()
            .ok_or_else(|| QemuError::NotFound {
                kind: "data disk",
                id: format!("{vm_id} #{disk_index}"),
            })?;
        let mut rec = SnapshotRecord {
            id: format!("s-{}", random_hex(6)?),
            name: name.map(str::to_string),
            source_disk: disk.id.clone(),
            size_bytes: disk.size_bytes,
            complete: false,
            created_at: now_secs(),
        };
        self.state.put_snapshot(&rec)?;
        pause("snapshot-record");
        let src = disk_file(&vm.dir, &disk.id).display().to_string();
        let dst = self.snapshot_file(&rec.id).display().to_string();
        let mut args = vec!["convert", "-O", "qcow2"];
        if vm.alive {
            args.push("-U");
        }
        args.extend([src.as_str(), dst.as_str()]);
        if let Err(e) = run("qemu-img", &args, COPY_TIMEOUT) {
            let _ = std::fs::remove_dir_all(self.state.snapshot_dir(&rec.id));
            return Err(e);
        }
        rec.complete = true;
        self.state.put_snapshot(&rec)?;
        Ok(rec)
    }

    pub fn snapshots(&self) -> Result<Vec<SnapshotRecord>> {
        self.state.snapshots()
    }

    /// Refused while a disk is an overlay on it (its backing file).
    pub fn snapshot_delete(&self, id: &str) -> Result<()> {
        self.state.snapshot(id)?;
        let users: Vec<String> = self
            .state
            .vms()?
            .into_iter()
            .filter(|v| v.disks.iter().any(|d| d.snapshot.as_deref() == Some(id)))
            .map(|v| v.id)
            .collect();
        if !users.is_empty() {
            return Err(QemuError::Busy {
                what: format!("snapshot {id}"),
                message: format!(
                    "is the backing file of disks of {}; delete those first",
                    users.join(", ")
                ),
            });
        }
        let dir = self.state.snapshot_dir(id);
        std::fs::remove_dir_all(&dir).ctx("cannot remove", &dir)
    }
}

pub(super) fn disk_file(dir: &Path, disk_id: &str) -> PathBuf {
    dir.join(disk_name(disk_id))
}

pub(super) fn disk_name(disk_id: &str) -> String {
    format!("disk-{disk_id}.qcow2")
}

/// A snapshot as the backing file of a data disk, relative to the disk's
/// directory (`<state>/vms/<id>/`): QEMU reaches it without searching the
/// state directory's parents.
pub(super) fn snapshot_backing(snapshot: &str) -> String {
    format!("../../snapshots/{snapshot}/snapshot.qcow2")
}
