//! One VM's life: create, start, stop, reboot, reimage, delete.

use super::*;

impl Machines {
    /// Makes and boots a VM. Returns once QEMU runs it (the guest boots on;
    /// see [`Machines::wait_agent`]). On any failure everything made is
    /// released.
    pub fn create(&self, t: &VmTemplate) -> Result<Vm> {
        self.validate(t)?;
        let boot = crate::base::prepare(&t.image, &self.cfg.cache_dir, &mut |l| {
            tracing::info!("{l}")
        })?;
        let base_bytes = std::fs::metadata(&boot.disk)
            .ctx("cannot stat", &boot.disk)?
            .len();
        if t.system_disk_bytes < base_bytes {
            return Err(QemuError::invalid(
                "systemDiskSize",
                t.system_disk_bytes,
                format!(
                    "must be at least the image's disk ({base_bytes} bytes, {} GiB)",
                    base_bytes.div_ceil(1 << 30)
                ),
            ));
        }
        self.require_bridge()?;
        let rec = {
            let _lock = self.state.lock()?;
            if let Some(token) = &t.client_token {
                if let Some(existing) = self
                    .state
                    .vms()?
                    .into_iter()
                    .find(|v| v.client_token.as_ref() == Some(token))
                {
                    tracing::info!(id = %existing.id, "create repeated with the same client token: the VM it made");
                    return self.describe(&existing.id);
                }
            }
            let hex = random_hex(6)?;
            let ip = self.pick_ip(t.ip)?;
            let uid = self.pick_uid()?;
            let mut disks = Vec::new();
            for d in &t.disks {
                let size_bytes = match (&d.snapshot, d.size_bytes) {
                    (Some(s), size) => {
                        let snap = self.state.snapshot(s)?;
                        size.unwrap_or(snap.size_bytes).max(snap.size_bytes)
                    }
                    (None, Some(size)) => size,
                    (None, None) => 0,
                };
                disks.push(DiskRecord {
                    id: format!("d-{}", random_hex(5)?),
                    interface: d.interface,
                    size_bytes,
                    snapshot: d.snapshot.clone(),
                });
            }
            let rec = VmRecord {
                id: format!("vm-{hex}"),
                name: t.name.clone(),
                hostname: t.name.clone(),
                state: VmState::Creating,
                boot,
                system_disk_bytes: t.system_disk_bytes,
                memory_mib: t.memory_mib.unwrap_or(self.cfg.memory_mib),
                cpus: t.cpus.unwrap_or(self.cfg.cpus),
                bridge: self.cfg.bridge.clone(),
                tap: format!("kq{hex}"),
                mac: format!("52:54:00:{}", colon_hex(&random_hex(3)?)),
                ip: ip.to_string(),
                prefix: self.subnet.prefix,
                gateway: self.gateway.to_string(),
                disks,
                generation: 1,
                tags: t.tags.clone(),
                process: None,
                accel: None,
                created_at: now_secs(),
                password_set_at: None,
                client_token: t.client_token.clone(),
                uid: Some(uid),
            };
            // Written before any file, tap or process it names.
            self.state.put_vm(&rec)?;
            rec
        };
        pause("record");
        let made = (|| {
            let dir = self.state.vm_dir(&rec.id);
            self.system_overlay(&rec)?;
            for d in &rec.disks {
                let file = disk_file(&dir, &d.id);
                let size = d.size_bytes.to_string();
                let f = file.display().to_string();
                match &d.snapshot {
                    Some(s) => {
                        let backing = snapshot_backing(s);
                        run(
                            "qemu-img",
                            &[
                                "create", "-q", "-f", "qcow2", "-b", &backing, "-F", "qcow2", &f,
                                &size,
                            ],
                            CMD_TIMEOUT,
                        )?;
                    }
                    None => {
                        run(
                            "qemu-img",
                            &["create", "-q", "-f", "qcow2", &f, &size],
                            CMD_TIMEOUT,
                        )?;
                    }
                }
            }
            pause("disks");
            self.write_seed(&rec, Some(&t.user_data))?;
            pause("seed");
            let mut rec = rec.clone();
            self.spawn(&mut rec)?;
            Ok(rec)
        })();
        match made {
            Ok(rec) => Ok(self.view(rec)),
            Err(e) => {
                if let Err(cleanup) = self.delete(&rec.id) {
                    tracing::warn!(id = %rec.id, error = %cleanup, "releasing a failed create");
                }
                Err(e)
            }
        }
    }

    pub(super) fn validate(&self, t: &VmTemplate) -> Result<()> {
        crate::require_root()?;
        valid_name(&t.name)?;
        crate::base::check_image(&t.image)?;
        if t.disks.len() > MAX_DISKS {
            return Err(QemuError::invalid(
                "disks",
                t.disks.len(),
                format!("must be at most {MAX_DISKS} data disks"),
            ));
        }
        for (i, d) in t.disks.iter().enumerate() {
            if let Some(size) = d.size_bytes {
                if size == 0 || size > MAX_DISK_BYTES || size % 512 != 0 {
                    return Err(QemuError::invalid(
                        &format!("disks[{i}].size"),
                        size,
                        format!("must be a positive multiple of 512 bytes up to {MAX_DISK_BYTES}"),
                    ));
                }
            } else if d.snapshot.is_none() {
                return Err(QemuError::invalid(
                    &format!("disks[{i}].size"),
                    "(none)",
                    "is required unless the disk comes from a snapshot",
                ));
            }
            if let Some(s) = &d.snapshot {
                let snap = self.state.snapshot(s).map_err(|_| {
                    QemuError::invalid(
                        &format!("disks[{i}].snapshot"),
                        s,
                        "must name an existing snapshot",
                    )
                })?;
                if !snap.complete {
                    return Err(QemuError::invalid(
                        &format!("disks[{i}].snapshot"),
                        s,
                        "must be a complete snapshot (this one's copy never finished)",
                    ));
                }
            }
        }
        if let Some(m) = t.memory_mib {
            if !(256..=1 << 20).contains(&m) {
                return Err(QemuError::invalid(
                    "memoryMiB",
                    m,
                    "must be between 256 and 1048576",
                ));
            }
        }
        if let Some(c) = t.cpus {
            if !(1..=64).contains(&c) {
                return Err(QemuError::invalid("cpus", c, "must be between 1 and 64"));
            }
        }
        Ok(())
    }

    pub fn start(&self, id: &str) -> Result<Vm> {
        crate::require_root()?;
        let mut rec = self.state.vm(id)?;
        match rec.state {
            VmState::Creating | VmState::Deleting => {
                return Err(QemuError::WrongState {
                    what: format!("VM {id}"),
                    message: format!("is {}; only a running or stopped VM starts", rec.state),
                })
            }
            VmState::Running | VmState::Stopped => {}
        }
        self.spawn(&mut rec)?;
        Ok(self.view(rec))
    }

    /// The guest is asked to power off (ACPI, through QMP); after the stop
    /// timeout QEMU is told to quit, then killed. The tap goes; files stay.
    pub fn stop(&self, id: &str) -> Result<Vm> {
        crate::require_root()?;
        let mut rec = self.state.vm(id)?;
        let dir = self.state.vm_dir(id);
        if !live_pids(&rec, &dir).is_empty() {
            // systemd powers off when the guest agent asks; the ACPI power
            // button needs systemd-logind (and D-Bus), which an image may lack.
            let asked = self
                .exec(
                    id,
                    &detached_systemctl("poweroff")?,
                    Duration::from_secs(20),
                )
                .is_ok_and(|out| out.code == 0)
                || agent::qmp(&qmp_socket(&dir), "system_powerdown", None, QMP_TIMEOUT).is_ok();
            let gone = asked && wait_gone(&rec, &dir, self.cfg.stop_timeout);
            if !gone {
                tracing::warn!(id, "the guest did not power off in time: quitting QEMU");
                self.end_process(&rec, &dir);
            }
        }
        self.release_tap(&rec, &dir)?;
        rec.process = None;
        if rec.state == VmState::Running {
            rec.state = VmState::Stopped;
        }
        self.state.put_vm(&rec)?;
        Ok(self.view(rec))
    }

    /// Restarts the guest: a clean reboot through the guest agent, or a
    /// reset (QMP) when the agent does not answer; returns once the guest
    /// agent answers from a new boot (a new `boot_id`).
    pub fn reboot(&self, id: &str, timeout: Duration) -> Result<()> {
        let vm = self.describe(id)?;
        if !vm.alive {
            return Err(QemuError::WrongState {
                what: format!("VM {id}"),
                message: "is not running".into(),
            });
        }
        let before = self.boot_id(id, Duration::from_secs(30)).ok();
        // A clean reboot by systemd (qemu-ga's guest-shutdown runs
        // /sbin/shutdown, which an image without systemd-sysv lacks); a reset
        // when the guest cannot be asked.
        let requested = before.is_some()
            && self
                .exec(id, &detached_systemctl("reboot")?, Duration::from_secs(30))
                .is_ok_and(|out| out.code == 0);
        if !requested {
            tracing::warn!(id, "the guest could not be asked to reboot: resetting it");
        }
        if !requested {
            agent::qmp(&qmp_socket(&vm.dir), "system_reset", None, QMP_TIMEOUT).map_err(|e| {
                QemuError::Qmp {
                    id: id.to_string(),
                    message: e.0,
                }
            })?;
        }
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(now) = self.boot_id(id, Duration::from_secs(10)) {
                if Some(&now) != before.as_ref() {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                return Err(QemuError::Timeout {
                    what: format!("reboot of {id}"),
                    secs: timeout.as_secs(),
                });
            }
            std::thread::sleep(Duration::from_secs(1));
        }
    }

    /// A new system disk from `image` (default: the VM's current image),
    /// data disks kept, a new seed with `user_data` and a new instance-id
    /// (cloud-init runs it as a new instance); boots. The image is checked
    /// (and its base disk made) before the VM is stopped.
    pub fn reimage(&self, id: &str, image: Option<&Path>, user_data: &str) -> Result<Vm> {
        let current = self.state.vm(id)?;
        let boot = crate::base::prepare(
            image.unwrap_or(&current.boot.image),
            &self.cfg.cache_dir,
            &mut |l| tracing::info!("{l}"),
        )?;
        let base_bytes = std::fs::metadata(&boot.disk)
            .ctx("cannot stat", &boot.disk)?
            .len();
        if current.system_disk_bytes < base_bytes {
            return Err(QemuError::invalid(
                "image",
                boot.image.display(),
                format!(
                    "its disk ({base_bytes} bytes) is larger than the VM's system disk ({} bytes)",
                    current.system_disk_bytes
                ),
            ));
        }
        self.stop(id)?;
        let rec = {
            let _lock = self.state.lock()?;
            let mut rec = self.state.vm(id)?;
            rec.boot = boot;
            rec.generation += 1;
            rec.password_set_at = None;
            self.state.put_vm(&rec)?;
            rec
        };
        self.system_overlay(&rec)?;
        self.write_seed(&rec, Some(user_data))?;
        self.start(id)
    }

    /// Releases everything of a VM: its QEMU process, tap, disks and files.
    /// Works from what was recorded, and from the directory alone when a
    /// crash came before the record.
    pub fn delete(&self, id: &str) -> Result<()> {
        crate::require_root()?;
        if !crate::state::valid_id(id, "vm-") {
            return Err(QemuError::NotFound {
                kind: "VM",
                id: id.to_string(),
            });
        }
        let dir = self.state.vm_dir(id);
        if !dir.exists() {
            return Err(QemuError::NotFound {
                kind: "VM",
                id: id.to_string(),
            });
        }
        let rec = crate::state::read_opt::<VmRecord>(&dir.join("vm.json"))?;
        if let Some(mut rec) = rec.clone() {
            rec.state = VmState::Deleting;
            self.state.put_vm(&rec)?;
            if !live_pids(&rec, &dir).is_empty() {
                self.end_process(&rec, &dir);
            }
            self.release_tap(&rec, &dir)?;
        } else {
            for pid in pids_naming(&dir) {
                // SAFETY: a process whose command line names this VM's directory.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
        if !pids_naming(&dir).is_empty() {
            return Err(QemuError::Busy {
                what: format!("VM {id}"),
                message: "its QEMU process did not end".into(),
            });
        }
        std::fs::remove_dir_all(&dir).ctx("cannot remove", &dir)?;
        Ok(())
    }
}

/// A VM name: a lower-case DNS name of at most 64 characters.
pub(crate) fn valid_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name.split('.').all(|l| {
            !l.is_empty()
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        });
    if !ok {
        return Err(QemuError::invalid(
            "name",
            format!("{name:?}"),
            "must be a lower-case DNS name (letters, digits, '-', '.') of at most 64 characters",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_dns_rule() {
        assert!(valid_name("workers-abcde").is_ok());
        for bad in ["", "Upper", "-x", "a_b", &"a".repeat(65)] {
            let e = valid_name(bad).unwrap_err().to_string();
            assert!(e.starts_with("name: value"), "{e}");
        }
    }
}
