//! Disks and snapshots: a machine's disk files, data disks made, attached,
//! detached and deleted, snapshots of them.

use super::*;

impl Cloud {
    /// Disks from snapshots: the snapshot exists and the disk is not smaller.
    pub(super) fn check_snapshots(&self, disks: &[DiskSpec]) -> Result<()> {
        let mut errors = Vec::new();
        for (i, d) in disks.iter().enumerate() {
            let Some(s) = &d.snapshot else { continue };
            match self.state.snapshot(s) {
                Err(_) => errors.push(knit_api::FieldError {
                    field: format!("disks[{i}].snapshot"),
                    value: format!("{s:?}"),
                    rule: "must name an existing snapshot".into(),
                }),
                Ok(snap) => {
                    if let Some(size) = d
                        .size
                        .as_ref()
                        .filter(|q| q.bytes().is_some_and(|b| b < snap.size))
                    {
                        errors.push(knit_api::FieldError {
                            field: format!("disks[{i}].size"),
                            value: size.to_string(),
                            rule: format!(
                                "must be at least the size of snapshot {s} ({} bytes)",
                                snap.size
                            ),
                        });
                    }
                }
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(LocalError::Invalid(errors))
        }
    }

    pub(super) fn new_disk_record(
        &self,
        d: &DiskSpec,
        attach: Option<(&str, &mut BTreeSet<String>)>,
    ) -> Result<DiskRecord> {
        let id = new_id("d-")?;
        let size = match (&d.size, &d.snapshot) {
            (Some(q), _) => q.bytes().unwrap_or(0),
            (None, Some(s)) => self.state.snapshot(s)?.size,
            (None, None) => 0,
        };
        let (attached_to, device) = match attach {
            Some((inst, used)) => {
                let dev = device_name(d.interface, used).ok_or_else(|| {
                    LocalError::invalid("disks", used.len(), "too many disks of this interface")
                })?;
                used.insert(dev.clone());
                (Some(inst.to_string()), Some(dev))
            }
            None => (None, None),
        };
        Ok(DiskRecord {
            serial: id[2..].to_string(),
            id,
            name: d.name.clone(),
            size,
            interface: d.interface,
            attached_to,
            device,
            from_snapshot: d.snapshot.clone(),
            created_at: now(),
        })
    }

    pub(super) fn make_disks(&self, rec: &InstanceRecord, tpl: &Template) -> Result<()> {
        self.make_system_disk(rec)?;
        for (id, spec) in rec.disks.iter().zip(&tpl.disks) {
            self.make_disk_file(&self.state.disk(id)?, spec)?;
        }
        Ok(())
    }

    pub(super) fn make_system_disk(&self, rec: &InstanceRecord) -> Result<()> {
        let file = self.state.system_disk_file(&rec.id);
        state::remove_file(&file)?;
        loopdev::create_sparse(&file, rec.system_disk_size)?;
        loopdev::mkfs(&file, "ext4")
    }

    /// The disk's file is made in the block store; `disks/<id>/disk.img` is a
    /// link to it, made first, so that a crash leaves nothing unfindable and
    /// the link survives reimage's renaming of the disk's directory.
    pub(super) fn make_disk_file(&self, disk: &DiskRecord, spec: &DiskSpec) -> Result<()> {
        self.store()?;
        let link = self.state.disk_file(&disk.id);
        let file = self.store.file("disks", &disk.id);
        std::fs::create_dir_all(self.state.disk_dir(&disk.id))
            .ctx("cannot create", self.state.disk_dir(&disk.id))?;
        state::remove_file(&link)?;
        std::os::unix::fs::symlink(&file, &link).ctx("cannot link", &link)?;
        state::remove_file(&file)?;
        match &spec.snapshot {
            Some(s) => {
                // A reflink clone in the store: instant, blocks shared with
                // the snapshot until the instance writes them.
                loopdev::copy_disk(&self.state.snapshot_file(s), &file)?;
                let len = std::fs::metadata(&file).ctx("cannot stat", &file)?.len();
                if disk.size > len {
                    std::fs::File::options()
                        .write(true)
                        .open(&file)
                        .and_then(|f| f.set_len(disk.size))
                        .ctx("cannot grow", &file)?;
                }
            }
            None => loopdev::create_sparse(&file, disk.size)?,
        }
        if let Some(fs) = &spec.format {
            loopdev::mkfs(&file, fs)?;
        }
        Ok(())
    }

    // ---- disks and snapshots ------------------------------------------------

    pub fn snapshot_create(&self, disk_id: &str) -> Result<SnapshotRecord> {
        self.snapshot_create_named(disk_id, None)
    }

    /// A snapshot carrying `name`. The record (method `pending`, with the
    /// name) is written before the clone: a caller that dies before the id
    /// comes back can still find its snapshot by name and delete it.
    pub fn snapshot_create_named(
        &self,
        disk_id: &str,
        name: Option<&str>,
    ) -> Result<SnapshotRecord> {
        let disk = self.state.disk(disk_id)?;
        let mut snap = SnapshotRecord {
            id: new_id("s-")?,
            name: name.map(str::to_string),
            source_disk: disk.id.clone(),
            size: disk.size,
            method: "pending".into(),
            created_at: now(),
        };
        self.store()?;
        self.state.put_snapshot(&snap)?;
        crate::pause::checkpoint("snapshot-record");
        // Like a disk: the file in the block store, a link beside the record.
        let link = self.state.snapshot_file(&snap.id);
        let file = self.store.file("snapshots", &snap.id);
        let made = std::os::unix::fs::symlink(&file, &link)
            .ctx("cannot link", &link)
            .and_then(|_| loopdev::copy_disk(&self.state.disk_file(disk_id), &file));
        match made {
            Ok(m) => snap.method = m.into(),
            Err(e) => {
                if let Err(undo) = self.remove_with_file(&self.state.snapshot_dir(&snap.id), &link)
                {
                    tracing::warn!(snapshot = %snap.id, error = %undo, "cannot remove a failed snapshot");
                }
                return Err(e);
            }
        }
        self.state.put_snapshot(&snap)?;
        Ok(snap)
    }

    pub fn snapshots(&self) -> Result<Vec<SnapshotRecord>> {
        self.state.snapshots()
    }

    pub fn snapshot_delete(&self, id: &str) -> Result<()> {
        self.state.snapshot(id)?;
        self.remove_with_file(&self.state.snapshot_dir(id), &self.state.snapshot_file(id))
    }

    /// A detached disk (blank, formatted, or from a snapshot).
    pub fn disk_create(&self, spec: &DiskSpec) -> Result<DiskRecord> {
        let tpl = Template {
            disks: vec![spec.clone()],
            ..Template::default()
        };
        tpl.validate()?;
        self.check_snapshots(&tpl.disks)?;
        let disk = self.new_disk_record(spec, None)?;
        self.state.put_disk(&disk)?;
        if let Err(e) = self.make_disk_file(&disk, spec) {
            if let Err(undo) = self.remove_with_file(
                &self.state.disk_dir(&disk.id),
                &self.state.disk_file(&disk.id),
            ) {
                tracing::warn!(disk = %disk.id, error = %undo, "cannot remove a failed disk");
            }
            return Err(e);
        }
        Ok(disk)
    }

    pub fn disks(&self) -> Result<Vec<DiskRecord>> {
        self.state.disks()
    }

    pub fn disk_delete(&self, id: &str) -> Result<()> {
        let d = self.state.disk(id)?;
        if let Some(i) = d.attached_to {
            return Err(LocalError::Busy {
                what: format!("disk {id}"),
                message: format!("attached to {i}; detach it first"),
            });
        }
        self.remove_with_file(&self.state.disk_dir(id), &self.state.disk_file(id))
    }

    pub fn disk_attach(&self, disk_id: &str, instance_id: &str) -> Result<DiskRecord> {
        let _lock = self.state.lock()?;
        let mut d = self.state.disk(disk_id)?;
        let mut rec = self.state.instance(instance_id)?;
        if let Some(i) = &d.attached_to {
            return Err(LocalError::Busy {
                what: format!("disk {disk_id}"),
                message: format!("already attached to {i}"),
            });
        }
        let used: BTreeSet<String> = rec
            .disks
            .iter()
            .filter_map(|x| self.state.disk(x).ok()?.device)
            .collect();
        let dev = device_name(d.interface, &used).ok_or_else(|| LocalError::Busy {
            what: format!("instance {instance_id}"),
            message: "no free device name left".into(),
        })?;
        d.attached_to = Some(instance_id.into());
        d.device = Some(dev.clone());
        self.state.put_disk(&d)?;
        rec.disks.push(d.id.clone());
        self.state.put_instance(&rec)?;
        if let Some(init) = rec.init.filter(|i| i.alive()) {
            let loop_dev = loopdev::attach(&self.state.disk_file(disk_id))?;
            crate::bounds::set_disk(
                &rec.cgroups,
                crate::bounds::Dev {
                    major: loop_dev.major,
                    minor: loop_dev.minor,
                },
                true,
                &self.machine_devs(&rec, None)?,
            )?;
            crate::boot::add_disk(
                Path::new(&format!("/proc/{}/root", init.pid)),
                &BootDisk::new(&loop_dev, &d),
            )?;
        }
        Ok(d)
    }

    /// The loop devices of a running machine's system disk and data disks,
    /// `except`'s left out (the device list of a v2 cgroup is made whole).
    pub(super) fn machine_devs(
        &self,
        rec: &InstanceRecord,
        except: Option<&str>,
    ) -> Result<Vec<crate::bounds::Dev>> {
        let mut files = vec![self.state.system_disk_file(&rec.id)];
        files.extend(
            rec.disks
                .iter()
                .filter(|d| Some(d.as_str()) != except)
                .map(|d| self.state.disk_file(d)),
        );
        let mut out = Vec::new();
        for f in files {
            for (dev, _) in loopdev::backed_under(&f) {
                let ld = loopdev::LoopDev::of(&dev)?;
                out.push(crate::bounds::Dev {
                    major: ld.major,
                    minor: ld.minor,
                });
            }
        }
        Ok(out)
    }

    pub fn disk_detach(&self, disk_id: &str) -> Result<DiskRecord> {
        let _lock = self.state.lock()?;
        let mut d = self.state.disk(disk_id)?;
        let Some(inst) = d.attached_to.clone() else {
            return Err(LocalError::WrongState {
                id: disk_id.into(),
                state: "detached".into(),
                action: "detach",
                wanted: "attached",
            });
        };
        let mut rec = self.state.instance(&inst)?;
        let file = self.state.disk_file(disk_id);
        if let Some(init) = rec.init.filter(|i| i.alive()) {
            for (dev, _) in loopdev::backed_under(&file) {
                let ld = loopdev::LoopDev::of(&dev)?;
                let num = format!("{}:{}", ld.major, ld.minor);
                let info = std::fs::read_to_string(format!("/proc/{}/mountinfo", init.pid))
                    .unwrap_or_default();
                if info
                    .lines()
                    .any(|l| l.split_whitespace().nth(2) == Some(num.as_str()))
                {
                    return Err(LocalError::Busy {
                        what: format!("disk {disk_id}"),
                        message: format!("mounted inside {inst}; unmount it there first"),
                    });
                }
                crate::boot::remove_disk(
                    Path::new(&format!("/proc/{}/root", init.pid)),
                    &BootDisk::new(&ld, &d),
                )?;
                crate::bounds::set_disk(
                    &rec.cgroups,
                    crate::bounds::Dev {
                        major: ld.major,
                        minor: ld.minor,
                    },
                    false,
                    &self.machine_devs(&rec, Some(disk_id))?,
                )?;
            }
            loopdev::detach_file(&file)?;
        }
        rec.disks.retain(|x| x != disk_id);
        self.state.put_instance(&rec)?;
        d.attached_to = None;
        d.device = None;
        self.state.put_disk(&d)?;
        Ok(d)
    }
}

/// First free cloud device name for the interface.
pub(super) fn device_name(iface: DiskInterface, used: &BTreeSet<String>) -> Option<String> {
    match iface {
        DiskInterface::Virtio => (b'b'..=b'z')
            .map(|c| format!("vd{}", c as char))
            .find(|n| !used.contains(n)),
        DiskInterface::Nvme => (0..32)
            .map(|i| format!("nvme{i}n1"))
            .find(|n| !used.contains(n)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_names_follow_the_interface() {
        let mut used = BTreeSet::new();
        assert_eq!(
            device_name(DiskInterface::Virtio, &used).as_deref(),
            Some("vdb")
        );
        used.insert("vdb".into());
        assert_eq!(
            device_name(DiskInterface::Virtio, &used).as_deref(),
            Some("vdc")
        );
        assert_eq!(
            device_name(DiskInterface::Nvme, &used).as_deref(),
            Some("nvme0n1")
        );
    }
}
