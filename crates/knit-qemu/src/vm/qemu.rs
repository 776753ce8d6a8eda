//! QEMU for one VM: its seed (cloud-init's meta-data and network
//! config), its command line, the process spawned with the files it holds.

use super::*;

impl Machines {
    /// The NoCloud seed: a vfat image labelled CIDATA holding meta-data,
    /// network-config and (when given) user-data. The user data (it holds a
    /// bootstrap token) lives only in the seed, mode 0600, never in a record.
    pub(super) fn write_seed(&self, rec: &VmRecord, user_data: Option<&str>) -> Result<()> {
        let dir = self.state.vm_dir(&rec.id);
        let stage = dir.join("seed.d");
        let _ = std::fs::remove_dir_all(&stage);
        std::fs::create_dir(&stage).ctx("cannot create", &stage)?;
        let result = (|| {
            let mut files = vec![
                ("meta-data", meta_data(rec)),
                ("network-config", network_config(rec)),
            ];
            if let Some(u) = user_data {
                files.push(("user-data", u.to_string()));
            }
            for (name, body) in &files {
                write_private(&stage.join(name), body.as_bytes())?;
            }
            let seed = dir.join("seed.img");
            let s = seed.display().to_string();
            if user_data.is_some() {
                let total: usize = files.iter().map(|(_, b)| b.len()).sum();
                let kib = ((total * 2) / 1024 + 1024).max(1024);
                let _ = std::fs::remove_file(&seed);
                run(
                    "mkfs.vfat",
                    &["-n", "CIDATA", "-C", &s, &kib.to_string()],
                    CMD_TIMEOUT,
                )?;
                set_mode(&seed, 0o600)?;
            }
            for (name, _) in &files {
                let src = stage.join(name).display().to_string();
                run(
                    "mcopy",
                    &["-o", "-i", &s, &src, &format!("::{name}")],
                    CMD_TIMEOUT,
                )?;
            }
            Ok(())
        })();
        let _ = std::fs::remove_dir_all(&stage);
        result
    }

    /// A uid no other VM of this state directory has.
    pub(super) fn pick_uid(&self) -> Result<u32> {
        let used = self.state.vms()?.iter().filter_map(|v| v.uid).collect();
        crate::confine::pick_uid(&used)
    }

    /// Starts QEMU for a recorded VM (tap and its guard first), records its
    /// process. QEMU runs as the VM's own uid under its seccomp filter
    /// ([`crate::confine`]).
    pub(super) fn spawn(&self, rec: &mut VmRecord) -> Result<()> {
        let dir = self.state.vm_dir(&rec.id);
        if !live_pids(rec, &dir).is_empty() {
            return Ok(());
        }
        self.require_bridge()?;
        let uid = match rec.uid {
            Some(uid) if crate::confine::is_vm_uid(uid) => uid,
            _ => {
                let _lock = self.state.lock()?;
                let uid = self.pick_uid()?;
                rec.uid = Some(uid);
                self.state.put_vm(rec)?;
                uid
            }
        };
        let gid = uid;
        let mut accel = self.cfg.accel.resolve();
        if accel == "kvm" && !crate::confine::kvm_usable() {
            // Root may open it; the VM's uid could not.
            if self.cfg.accel == Accel::Kvm {
                return Err(QemuError::invalid(
                    "accel",
                    "kvm",
                    "needs /dev/kvm readable and writable by its group (as udev's kvm group makes it) or by anyone: QEMU runs as the VM's own uid, not root",
                ));
            }
            tracing::warn!(id = %rec.id, "/dev/kvm is root's alone: the VM runs under TCG (its QEMU is not root)");
            accel = "tcg";
        }
        let groups: Vec<u32> = match accel {
            "kvm" => crate::confine::kvm_gid().into_iter().collect(),
            _ => Vec::new(),
        };
        let mut gids = groups.clone();
        gids.push(gid);
        for (field, file) in [
            ("image", &rec.boot.disk),
            ("image", &rec.boot.kernel),
            ("image", &rec.boot.initrd),
        ] {
            crate::confine::check_reachable(field, file, uid, &gids)?;
        }
        self.hand_over_files(rec, &dir, uid, gid)?;
        if !link_exists(&rec.tap) {
            run(
                "ip",
                &["tuntap", "add", "dev", &rec.tap, "mode", "tap"],
                CMD_TIMEOUT,
            )?;
        }
        // Guarded before the link joins the bridge: no frame passes unfiltered.
        self.guard_add(rec, &dir)?;
        run(
            "ip",
            &["link", "set", "dev", &rec.tap, "master", &rec.bridge],
            CMD_TIMEOUT,
        )?;
        run("ip", &["link", "set", "dev", &rec.tap, "up"], CMD_TIMEOUT)?;
        pause("tap");
        let tap = crate::confine::open_tap(&rec.tap)?;
        let args = qemu_args(rec, accel, tap.as_raw_fd());
        let log = dir.join("qemu.log");
        let log_file = std::fs::File::options()
            .create(true)
            .append(true)
            .open(&log)
            .ctx("cannot open", &log)?;
        let mut cmd = std::process::Command::new(&self.cfg.qemu);
        cmd.args(&args)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(log_file);
        crate::confine::Demote::new(&dir, uid, gid, groups, tap.as_raw_fd())?.install(&mut cmd);
        let mut child = cmd.spawn().map_err(|e| QemuError::Command {
            command: self.cfg.qemu.clone(),
            status: "not started".into(),
            stderr: if e.kind() == std::io::ErrorKind::NotFound {
                format!(
                    "{} is not installed (qemu-system-x86; `scripts/setup.sh --qemu` installs it)",
                    self.cfg.qemu
                )
            } else {
                e.to_string()
            },
        })?;
        // QEMU holds its own descriptor now; the tap lives as long as it does.
        drop(tap);
        let pid = child.id() as i32;
        // No -daemonize (its fork is what `spawn=deny` refuses): QEMU is set
        // up once its monitor answers, which happens only after every device
        // was made; exiting before that is a failed start.
        let deadline = Instant::now() + SPAWN_TIMEOUT;
        loop {
            match child.try_wait() {
                Ok(Some(status)) => {
                    let tail = std::fs::read_to_string(&log).unwrap_or_default();
                    let tail: Vec<&str> = tail.lines().rev().take(10).collect();
                    return Err(QemuError::Boot {
                        id: rec.id.clone(),
                        message: format!(
                            "{} exited with {status}: {}",
                            self.cfg.qemu,
                            tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
                        ),
                    });
                }
                Ok(None) => {}
                Err(e) => {
                    return Err(QemuError::Boot {
                        id: rec.id.clone(),
                        message: format!("waiting for QEMU (pid {pid}): {e}"),
                    })
                }
            }
            if agent::qmp(&qmp_socket(&dir), "query-status", None, QMP_READY_TIMEOUT).is_ok() {
                break;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(QemuError::Boot {
                    id: rec.id.clone(),
                    message: format!(
                        "QEMU's monitor did not answer within {} s",
                        SPAWN_TIMEOUT.as_secs()
                    ),
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        // QEMU outlives this call (and this process, as a daemon would);
        // while this process lives, a thread reaps it when it ends.
        let reaper = std::thread::Builder::new()
            .name(format!("qemu-{pid}"))
            .spawn(move || {
                let _ = child.wait();
            });
        if let Err(e) = reaper {
            tracing::warn!(id = %rec.id, pid, error = %e, "no thread to reap QEMU: it stays a zombie once it ends, until this process ends");
        }
        let process = owned_process(pid, &dir).ok_or_else(|| QemuError::Boot {
            id: rec.id.clone(),
            message: format!(
                "QEMU (pid {pid}) exited right after starting; see {}",
                dir.join("console.log").display()
            ),
        })?;
        rec.process = Some(process);
        rec.state = VmState::Running;
        rec.accel = Some(accel.to_string());
        self.state.put_vm(rec)?;
        tracing::info!(id = %rec.id, pid, uid, accel, ip = %rec.ip, "VM started");
        Ok(())
    }

    /// What QEMU opens, made the VM's: its directory searchable by its group
    /// only, its disks and seed its own (mode 0600), a fresh `run/` for its
    /// sockets, the console file; a snapshot it is an overlay on readable.
    /// Everything else in the directory (the record) stays root's.
    pub(super) fn hand_over_files(
        &self,
        rec: &VmRecord,
        dir: &Path,
        uid: u32,
        gid: u32,
    ) -> Result<()> {
        use crate::confine::{give, set_dir};
        // Left by earlier versions (root's QEMU wrote them here).
        for f in ["qmp.sock", "qga.sock", "qemu.pid"] {
            let _ = std::fs::remove_file(dir.join(f));
        }
        set_dir(dir, 0, gid, 0o710)?;
        let run_dir = dir.join(RUN_DIR);
        match std::fs::remove_dir_all(&run_dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(e).ctx("cannot remove", &run_dir)
            }
            _ => {}
        }
        std::fs::create_dir(&run_dir).ctx("cannot create", &run_dir)?;
        set_dir(&run_dir, uid, gid, 0o700)?;
        let console = dir.join("console.log");
        let _ = std::fs::remove_file(&console);
        write_private(&console, b"")?;
        give(&console, uid, gid, 0o600)?;
        give(&dir.join("system.qcow2"), uid, gid, 0o600)?;
        give(&dir.join("seed.img"), uid, gid, 0o600)?;
        for d in &rec.disks {
            give(&disk_file(dir, &d.id), uid, gid, 0o600)?;
            if let Some(s) = &d.snapshot {
                let snap = self.snapshot_file(s);
                give(&snap, 0, 0, 0o644)?;
                set_dir(&self.state.snapshot_dir(s), 0, 0, 0o711)?;
                // Disks of earlier versions name it by its absolute path,
                // which QEMU may not be able to reach.
                let (backing, f) = (snapshot_backing(s), disk_file(dir, &d.id));
                run(
                    "qemu-img",
                    &[
                        "rebase",
                        "-u",
                        "-F",
                        "qcow2",
                        "-b",
                        &backing,
                        &f.display().to_string(),
                    ],
                    CMD_TIMEOUT,
                )?;
            }
        }
        Ok(())
    }
}

pub(super) fn qmp_socket(dir: &Path) -> PathBuf {
    dir.join(RUN_DIR).join("qmp.sock")
}

pub(super) fn qga_socket(dir: &Path) -> PathBuf {
    dir.join(RUN_DIR).join("qga.sock")
}

pub(super) fn write_private(path: &Path, body: &[u8]) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::File::options()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(path)
        .ctx("cannot write", path)?;
    f.write_all(body).ctx("cannot write", path)
}

pub(super) fn set_mode(path: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).ctx("cannot chmod", path)
}

pub(super) fn meta_data(rec: &VmRecord) -> String {
    format!(
        "instance-id: {}-{}\nlocal-hostname: {}\n",
        rec.id, rec.generation, rec.hostname
    )
}

/// cloud-init network-config v2: the VM's address on the bridge's subnet,
/// matched by MAC, default route through the gateway.
pub(super) fn network_config(rec: &VmRecord) -> String {
    format!(
        "version: 2\nethernets:\n  eth0:\n    match:\n      macaddress: \"{mac}\"\n    set-name: eth0\n    addresses: [\"{ip}/{prefix}\"]\n    routes:\n    - to: 0.0.0.0/0\n      via: {gw}\n",
        mac = rec.mac,
        ip = rec.ip,
        prefix = rec.prefix,
        gw = rec.gateway
    )
}

/// QEMU's command line, run in the VM's directory (files by relative
/// paths), with the tap open as descriptor `tap_fd` and the seccomp filter
/// on. `init=` names systemd: the image need not carry
/// systemd-sysv's /sbin/init. PCI slots are fixed so device names are stable:
/// the system disk is `vda`; virtio data disks `vdb`, `vdc` … and NVMe ones
/// `nvme0n1` … in template order; the seed (last slot) comes after them.
pub(crate) fn qemu_args(rec: &VmRecord, accel: &str, tap_fd: RawFd) -> Vec<String> {
    let mut a: Vec<String> = Vec::new();
    let mut push = |items: &[&str]| a.extend(items.iter().map(|s| s.to_string()));
    push(&["-name", &format!("{},process=knit-{}", rec.id, rec.id)]);
    push(&["-machine", "pc"]);
    if accel == "tcg" {
        // QEMU's default translation cache under TCG is 1 GiB, most of it
        // resident after a boot: 256 MiB keeps a VM's RSS near its RAM.
        push(&["-accel", &format!("tcg,tb-size={TCG_TB_MIB}")]);
    } else {
        push(&["-accel", accel]);
    }
    if accel == "kvm" {
        push(&["-cpu", "host"]);
    }
    push(&[
        "-m",
        &rec.memory_mib.to_string(),
        "-smp",
        &rec.cpus.to_string(),
    ]);
    push(&["-nodefaults", "-no-user-config", "-display", "none"]);
    push(&["-sandbox", crate::confine::SANDBOX]);
    push(&["-serial", "file:console.log"]);
    push(&["-kernel", &rec.boot.kernel.display().to_string()]);
    push(&["-initrd", &rec.boot.initrd.display().to_string()]);
    push(&[
        "-append",
        "root=/dev/vda rw console=ttyS0 net.ifnames=0 init=/lib/systemd/systemd",
    ]);
    push(&[
        "-drive",
        "file=system.qcow2,if=none,id=sys,format=qcow2,discard=unmap",
        "-device",
        "virtio-blk-pci,drive=sys,addr=0x4,serial=system",
    ]);
    for (i, d) in rec.disks.iter().enumerate() {
        push(&[
            "-drive",
            &format!(
                "file={},if=none,id=d{i},format=qcow2,discard=unmap",
                disk_name(&d.id)
            ),
        ]);
        let device = match d.interface {
            Interface::Virtio => "virtio-blk-pci",
            Interface::Nvme => "nvme",
        };
        push(&[
            "-device",
            &format!("{device},drive=d{i},serial={},addr={:#x}", d.id, 5 + i),
        ]);
    }
    push(&[
        "-drive",
        "file=seed.img,if=none,id=seed,format=raw,readonly=on",
        "-device",
        "virtio-blk-pci,drive=seed,addr=0x1e,serial=cidata",
    ]);
    push(&[
        "-netdev",
        &format!("tap,id=net0,fd={tap_fd}"),
        "-device",
        &format!("virtio-net-pci,netdev=net0,mac={},addr=0x3", rec.mac),
    ]);
    push(&["-device", "virtio-rng-pci,addr=0x1c"]);
    push(&[
        "-chardev",
        &format!("socket,id=qmp,path={RUN_DIR}/qmp.sock,server=on,wait=off"),
        "-mon",
        "chardev=qmp,mode=control",
    ]);
    push(&[
        "-chardev",
        &format!("socket,id=qga0,path={RUN_DIR}/qga.sock,server=on,wait=off"),
        "-device",
        "virtio-serial-pci,addr=0x1d",
        "-device",
        "virtserialport,chardev=qga0,name=org.qemu.guest_agent.0",
    ]);
    a
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::BootFiles;

    fn record() -> VmRecord {
        VmRecord {
            id: "vm-0123456789ab".into(),
            name: "n1".into(),
            hostname: "n1".into(),
            state: VmState::Creating,
            boot: BootFiles {
                image: "/img".into(),
                disk: "/img/disk.raw".into(),
                kernel: "/img/vmlinuz".into(),
                initrd: "/img/initrd.img".into(),
            },
            system_disk_bytes: 4 << 30,
            memory_mib: 1024,
            cpus: 1,
            bridge: "br0".into(),
            tap: "kq0123456789ab".into(),
            mac: "52:54:00:aa:bb:cc".into(),
            ip: "10.9.0.254".into(),
            prefix: 24,
            gateway: "10.9.0.1".into(),
            disks: vec![
                DiskRecord {
                    id: "d-0000000001".into(),
                    interface: Interface::Nvme,
                    size_bytes: 1 << 30,
                    snapshot: None,
                },
                DiskRecord {
                    id: "d-0000000002".into(),
                    interface: Interface::Virtio,
                    size_bytes: 1 << 30,
                    snapshot: None,
                },
            ],
            generation: 1,
            tags: BTreeMap::new(),
            process: None,
            accel: None,
            created_at: 0,
            password_set_at: None,
            client_token: None,
            uid: None,
        }
    }

    #[test]
    fn command_line_puts_disks_on_their_interfaces_in_order() {
        let a = qemu_args(&record(), "tcg", 7).join(" ");
        assert!(
            a.contains("-device nvme,drive=d0,serial=d-0000000001,addr=0x5"),
            "{a}"
        );
        assert!(
            a.contains("-device virtio-blk-pci,drive=d1,serial=d-0000000002,addr=0x6"),
            "{a}"
        );
        assert!(a.contains("-netdev tap,id=net0,fd=7 "), "{a}");
        assert!(a.contains("-accel tcg,tb-size=256"), "{a}");
        assert!(!a.contains("-cpu host"));
        // Under its seccomp filter, not daemonised (that forks), every file
        // relative to the VM's directory (QEMU's working directory).
        assert!(
            a.contains(
                "-sandbox on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"
            ),
            "{a}"
        );
        assert!(!a.contains("-daemonize") && !a.contains("-runas"), "{a}");
        assert!(a.contains("file=system.qcow2,"), "{a}");
        assert!(a.contains("file=disk-d-0000000001.qcow2,"), "{a}");
        assert!(
            a.contains("path=run/qmp.sock,") && a.contains("path=run/qga.sock,"),
            "{a}"
        );
        assert!(!a.contains(" /s/") && !a.contains("=/s/"), "{a}");
        // The system disk's slot comes before every data disk's; the seed's after.
        assert!(a.find("addr=0x4").unwrap() < a.find("addr=0x5").unwrap());
        assert!(a.contains("virtio-blk-pci,drive=seed,addr=0x1e"));
    }

    #[test]
    fn seed_documents_name_the_vm_and_its_address() {
        let r = record();
        assert_eq!(
            meta_data(&r),
            "instance-id: vm-0123456789ab-1\nlocal-hostname: n1\n"
        );
        let n = network_config(&r);
        assert!(n.contains("macaddress: \"52:54:00:aa:bb:cc\""));
        assert!(n.contains("addresses: [\"10.9.0.254/24\"]"));
        assert!(n.contains("via: 10.9.0.1"));
    }
}
