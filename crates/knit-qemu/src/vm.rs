//! The VM lifecycle over the state directory.

use crate::agent::{self, ExecOutput, Guest};
use crate::error::{IoContext, QemuError, Result};
use crate::run::run;
use crate::state::{
    now, random_hex, DiskRecord, Interface, Process, SnapshotRecord, State, VmRecord, VmState,
};
use base64::Engine;
use knit_local::net::Subnet;
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

const CMD_TIMEOUT: Duration = Duration::from_secs(60);
/// `qemu-img convert` of a whole data disk (snapshots).
const COPY_TIMEOUT: Duration = Duration::from_secs(1800);
/// How long QEMU may take until its monitor answers (every device made).
const SPAWN_TIMEOUT: Duration = Duration::from_secs(60);
const QMP_TIMEOUT: Duration = Duration::from_secs(10);
/// One try of QEMU's monitor while it starts.
const QMP_READY_TIMEOUT: Duration = Duration::from_secs(2);
/// QEMU's own directory in a VM's (its uid's): its sockets.
const RUN_DIR: &str = "run";
/// Most data disks a VM takes (PCI slots 5 … 20).
const MAX_DISKS: usize = 16;
const MAX_DISK_BYTES: u64 = 16 << 40;
/// TCG's translation cache (MiB).
const TCG_TB_MIB: u32 = 256;

/// Which accelerator QEMU runs the guest with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accel {
    /// KVM when `/dev/kvm` can run guests, TCG otherwise.
    Auto,
    Kvm,
    Tcg,
}

impl Accel {
    pub fn parse(s: &str) -> Option<Accel> {
        match s {
            "auto" => Some(Accel::Auto),
            "kvm" => Some(Accel::Kvm),
            "tcg" => Some(Accel::Tcg),
            _ => None,
        }
    }

    /// `kvm` or `tcg`. Auto takes KVM only when `/dev/kvm` opens and the
    /// CPU shows hardware virtualisation (vmx/svm): a nested host can
    /// expose a `/dev/kvm` whose guests never run (this build host does).
    pub fn resolve(self) -> &'static str {
        match self {
            Accel::Kvm => "kvm",
            Accel::Tcg => "tcg",
            Accel::Auto => {
                let opens = std::fs::File::options()
                    .read(true)
                    .write(true)
                    .open("/dev/kvm")
                    .is_ok();
                let flags = std::fs::read_to_string("/proc/cpuinfo")
                    .map(|c| {
                        c.lines()
                            .filter(|l| l.starts_with("flags"))
                            .any(|l| l.split_whitespace().any(|f| f == "vmx" || f == "svm"))
                    })
                    .unwrap_or(false);
                if opens && flags {
                    "kvm"
                } else {
                    "tcg"
                }
            }
        }
    }
}

/// Addresses of the subnet used by others (the local cloud's instances).
pub type Reserved = Arc<dyn Fn() -> Vec<Ipv4Addr> + Send + Sync>;

#[derive(Clone)]
pub struct Config {
    pub state_dir: PathBuf,
    /// Where base disks made from OS images are kept (see [`crate::base`]).
    pub cache_dir: PathBuf,
    /// The bridge every VM's tap joins; it must exist.
    pub bridge: String,
    /// The bridge's subnet; its first host is the gateway.
    pub subnet: String,
    pub accel: Accel,
    pub memory_mib: u32,
    pub cpus: u32,
    pub qemu: String,
    /// Never given to a VM.
    pub reserved: Option<Reserved>,
    /// How long a stop waits for the guest to power off before QEMU is
    /// told to quit.
    pub stop_timeout: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            state_dir: "/var/lib/knit/qemu".into(),
            cache_dir: crate::base::DEFAULT_CACHE.into(),
            bridge: "knit0".into(),
            subnet: "10.213.0.0/24".into(),
            accel: Accel::Auto,
            memory_mib: 1024,
            cpus: 1,
            qemu: "qemu-system-x86_64".into(),
            reserved: None,
            stop_timeout: Duration::from_secs(120),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskSpec {
    /// Bytes; `None` only for a disk from a snapshot (the snapshot's size).
    pub size_bytes: Option<u64>,
    pub interface: Interface,
    pub snapshot: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct VmTemplate {
    /// Lower-case DNS name, at most 64 characters; also the hostname.
    pub name: String,
    /// An OS image directory (`knit image build`).
    pub image: PathBuf,
    pub system_disk_bytes: u64,
    pub disks: Vec<DiskSpec>,
    pub user_data: String,
    pub tags: BTreeMap<String, String>,
    pub memory_mib: Option<u32>,
    pub cpus: Option<u32>,
    pub ip: Option<Ipv4Addr>,
    /// Idempotency key, as a cloud's client token: a create with the token
    /// of a VM that exists returns that VM (a create repeated by a paused
    /// server or by the next leader must not make two machines).
    pub client_token: Option<String>,
}

/// A VM as seen now: its record and whether its QEMU process lives.
#[derive(Debug, Clone)]
pub struct Vm {
    pub record: VmRecord,
    pub alive: bool,
    pub dir: PathBuf,
}

/// What [`Machines::down`] released.
#[derive(Debug, Default, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DownReport {
    pub vms: Vec<String>,
    pub processes: Vec<i32>,
    pub taps: Vec<String>,
    pub snapshots: Vec<String>,
}

pub struct Machines {
    cfg: Config,
    state: State,
    subnet: Subnet,
    gateway: Ipv4Addr,
}

/// Test hook: stop here until killed (crash tests).
fn pause(step: &str) {
    knit_local::pause::hold_if_set("KNIT_QEMU_PAUSE_AFTER", step, "paused after");
}

impl Machines {
    pub fn open(cfg: Config) -> Result<Machines> {
        crate::require_root()?;
        let subnet = Subnet::parse(&cfg.subnet)
            .filter(|s| s.prefix <= 30)
            .ok_or_else(|| {
                QemuError::invalid(
                    "subnet",
                    format!("{:?}", cfg.subnet),
                    "must be an IPv4 network in CIDR form with room for a gateway and a VM (prefix at most /30)",
                )
            })?;
        let gateway = subnet.host(1).ok_or_else(|| {
            QemuError::invalid("subnet", &cfg.subnet, "must hold a gateway address")
        })?;
        valid_link_name("bridge", &cfg.bridge)?;
        let state = State::open(&cfg.state_dir)?;
        Ok(Machines {
            cfg,
            state,
            subnet,
            gateway,
        })
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    pub fn gateway(&self) -> Ipv4Addr {
        self.gateway
    }

    pub fn state_dir(&self) -> &Path {
        self.state.root()
    }

    fn view(&self, record: VmRecord) -> Vm {
        let dir = self.state.vm_dir(&record.id);
        let alive = !live_pids(&record, &dir).is_empty();
        Vm { record, alive, dir }
    }

    pub fn describe(&self, id: &str) -> Result<Vm> {
        Ok(self.view(self.state.vm(id)?))
    }

    pub fn list(&self) -> Result<Vec<Vm>> {
        Ok(self
            .state
            .vms()?
            .into_iter()
            .map(|r| self.view(r))
            .collect())
    }

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
                created_at: now(),
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

    fn validate(&self, t: &VmTemplate) -> Result<()> {
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

    fn require_bridge(&self) -> Result<()> {
        if !Path::new("/sys/class/net")
            .join(&self.cfg.bridge)
            .join("bridge")
            .is_dir()
        {
            return Err(QemuError::invalid(
                "bridge",
                &self.cfg.bridge,
                "must be an existing bridge (the local cloud's, made by `knit local network-up`)",
            ));
        }
        Ok(())
    }

    /// The requested address if free, else the highest free one (the local
    /// cloud hands out addresses from the bottom of the subnet).
    fn pick_ip(&self, want: Option<Ipv4Addr>) -> Result<Ipv4Addr> {
        let mut used: BTreeSet<Ipv4Addr> = self
            .state
            .vms()?
            .iter()
            .filter_map(|r| r.ip.parse().ok())
            .collect();
        if let Some(reserved) = &self.cfg.reserved {
            used.extend(reserved());
        }
        let size = 1u64 << (32 - self.subnet.prefix);
        let hosts = (2..size.saturating_sub(1) as u32).filter_map(|n| self.subnet.host(n));
        if let Some(want) = want {
            if !hosts.clone().any(|h| h == want) {
                return Err(QemuError::invalid(
                    "ip",
                    want,
                    format!(
                        "must be a host address of {} other than the gateway",
                        self.subnet
                    ),
                ));
            }
            if used.contains(&want) {
                return Err(QemuError::invalid("ip", want, "is already in use"));
            }
            return Ok(want);
        }
        hosts
            .rev()
            .find(|h| !used.contains(h))
            .ok_or_else(|| QemuError::Busy {
                what: format!("subnet {}", self.subnet),
                message: "no free address left".into(),
            })
    }

    fn system_overlay(&self, rec: &VmRecord) -> Result<()> {
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

    fn snapshot_file(&self, id: &str) -> PathBuf {
        self.state.snapshot_dir(id).join("snapshot.qcow2")
    }

    /// The NoCloud seed: a vfat image labelled CIDATA holding meta-data,
    /// network-config and (when given) user-data. The user data (it holds a
    /// bootstrap token) lives only in the seed, mode 0600, never in a record.
    fn write_seed(&self, rec: &VmRecord, user_data: Option<&str>) -> Result<()> {
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
    fn pick_uid(&self) -> Result<u32> {
        let used = self.state.vms()?.iter().filter_map(|v| v.uid).collect();
        crate::confine::pick_uid(&used)
    }

    /// Starts QEMU for a recorded VM (tap and its guard first), records its
    /// process. QEMU runs as the VM's own uid under its seccomp filter
    /// ([`crate::confine`]).
    fn spawn(&self, rec: &mut VmRecord) -> Result<()> {
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
    fn hand_over_files(&self, rec: &VmRecord, dir: &Path, uid: u32, gid: u32) -> Result<()> {
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

    /// The anti-spoofing guard of the local cloud's instances
    /// (`knit_local::net::guard_rules`) on the VM's tap: only IPv4 from its
    /// address and ARP for it, from its MAC, leave the VM.
    fn guard_add(&self, rec: &VmRecord, dir: &Path) -> Result<()> {
        let ip: Ipv4Addr = rec.ip.parse().map_err(|_| QemuError::State {
            path: dir.join("vm.json").display().to_string(),
            message: format!("ip {:?} is not an IPv4 address", rec.ip),
        })?;
        let rules = knit_local::net::guard_rules(&rec.tap, &rec.mac, ip);
        let file = dir.join("guard.nft");
        write_private(&file, rules.as_bytes())?;
        let applied = run("nft", &["-f", &file.display().to_string()], CMD_TIMEOUT);
        let _ = std::fs::remove_file(&file);
        match applied {
            Err(QemuError::Command { status, .. }) if status == "not started" => {
                Err(QemuError::Command {
                    command: "nft".into(),
                    status: "not installed".into(),
                    stderr: "nft (Debian package nftables) guards every VM's tap against address \
                             spoofing; install it (scripts/setup.sh)"
                        .into(),
                })
            }
            other => other.map(|_| ()),
        }
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
        self.release_tap(&rec)?;
        rec.process = None;
        if rec.state == VmState::Running {
            rec.state = VmState::Stopped;
        }
        self.state.put_vm(&rec)?;
        Ok(self.view(rec))
    }

    /// QMP quit, then SIGKILL to what is still ours.
    fn end_process(&self, rec: &VmRecord, dir: &Path) {
        let _ = agent::qmp(&qmp_socket(dir), "quit", None, QMP_TIMEOUT);
        if !wait_gone(rec, dir, Duration::from_secs(10)) {
            for pid in live_pids(rec, dir) {
                // Checked just now to be this VM's QEMU (cmdline names its dir).
                // SAFETY: kill(2) on a PID we identified as ours.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            wait_gone(rec, dir, Duration::from_secs(10));
        }
    }

    /// The tap and its guard (the kernel keeps an nftables table when its
    /// link goes).
    fn release_tap(&self, rec: &VmRecord) -> Result<()> {
        if link_exists(&rec.tap) {
            run("ip", &["link", "delete", "dev", &rec.tap], CMD_TIMEOUT)?;
        }
        guard_del(&rec.tap)
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

    /// The guest's `/proc/sys/kernel/random/boot_id`.
    pub fn boot_id(&self, id: &str, timeout: Duration) -> Result<String> {
        let bytes = self.read_file(id, "/proc/sys/kernel/random/boot_id", 64, timeout)?;
        Ok(String::from_utf8_lossy(&bytes).trim().to_string())
    }

    /// Waits until the guest agent answers (the guest has booted far
    /// enough to run commands).
    pub fn wait_agent(&self, id: &str, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let socket = qga_socket(&self.state.vm_dir(id));
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match Guest::connect(&socket, left.min(Duration::from_secs(5)))
                .and_then(|mut g| g.call("guest-ping", None))
            {
                Ok(_) => return Ok(()),
                Err(e) if left.is_zero() => {
                    return Err(QemuError::Timeout {
                        what: format!("the guest agent of {id} ({})", e.0),
                        secs: timeout.as_secs(),
                    })
                }
                Err(_) => std::thread::sleep(Duration::from_millis(500)),
            }
        }
    }

    fn guest(&self, id: &str, timeout: Duration) -> Result<Guest> {
        let vm = self.describe(id)?;
        if !vm.alive {
            return Err(QemuError::WrongState {
                what: format!("VM {id}"),
                message: "is not running".into(),
            });
        }
        Guest::connect(&qga_socket(&vm.dir), timeout).map_err(|e| QemuError::Agent {
            id: id.to_string(),
            message: e.0,
        })
    }

    /// Runs `argv` inside through qemu-guest-agent: exit code and output
    /// (each at most [`agent::EXEC_MAX_OUTPUT`]); killed inside after
    /// `timeout`.
    pub fn exec(&self, id: &str, argv: &[String], timeout: Duration) -> Result<ExecOutput> {
        if argv.is_empty() || argv[0].is_empty() {
            return Err(QemuError::invalid("argv", "[]", "must name a command"));
        }
        let mut g = self.guest(id, timeout)?;
        g.exec(argv, None).map_err(|e| QemuError::Agent {
            id: id.to_string(),
            message: format!("{}: {}", argv[0], e.0),
        })
    }

    /// A file from inside, refused when larger than `max_bytes`.
    pub fn read_file(
        &self,
        id: &str,
        path: &str,
        max_bytes: usize,
        timeout: Duration,
    ) -> Result<Vec<u8>> {
        let mut g = self.guest(id, timeout)?;
        g.read_file(path, max_bytes).map_err(|e| QemuError::Agent {
            id: id.to_string(),
            message: e.0,
        })
    }

    /// Root's password, set by the guest agent (guest-set-user-password).
    /// The password goes only over the VM's socket: never into argv, a
    /// record, a log or an error.
    pub fn set_password(&self, id: &str, password: &str) -> Result<()> {
        if password.is_empty() || password.len() > 256 || password.contains(['\n', '\r', '\0', ':'])
        {
            return Err(QemuError::invalid(
                "password",
                format!("({} characters)", password.chars().count()),
                "must be 1 to 256 bytes without newline, NUL or ':'",
            ));
        }
        let mut g = self.guest(id, Duration::from_secs(60))?;
        let b64 = base64::engine::general_purpose::STANDARD.encode(password);
        g.call(
            "guest-set-user-password",
            Some(json!({"username": "root", "password": b64, "crypted": false})),
        )
        .map_err(|e| QemuError::Agent {
            id: id.to_string(),
            // qemu-ga's message never holds the password (it is sent base64 to chpasswd's stdin).
            message: e.0,
        })?;
        let _lock = self.state.lock()?;
        let mut rec = self.state.vm(id)?;
        rec.password_set_at = Some(now());
        self.state.put_vm(&rec)
    }

    /// New name and hostname: in the record and the seed's meta-data (the
    /// next boot's cloud-init), and at once inside a running guest.
    pub fn rename(&self, id: &str, name: &str) -> Result<Vm> {
        valid_name(name)?;
        let rec = {
            let _lock = self.state.lock()?;
            let mut rec = self.state.vm(id)?;
            rec.name = name.to_string();
            rec.hostname = name.to_string();
            self.state.put_vm(&rec)?;
            rec
        };
        self.write_seed(&rec, None)?;
        let vm = self.view(rec);
        if vm.alive {
            let script = knit_local::shell::guest_hostname(
                name,
                None,
                knit_local::shell::LiveHostname::Required,
            )
            .map_err(|e| QemuError::invalid("name", format!("{name:?}"), e.rule))?;
            let argv = vec!["sh".to_string(), "-c".to_string(), script];
            let out = self.exec(id, &argv, Duration::from_secs(60))?;
            if out.code != 0 {
                return Err(QemuError::Agent {
                    id: id.to_string(),
                    message: format!(
                        "setting the hostname: {}",
                        String::from_utf8_lossy(&out.stderr).trim()
                    ),
                });
            }
        }
        Ok(vm)
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
            self.release_tap(&rec)?;
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
            created_at: now(),
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

    /// Removes every VM, tap, process, snapshot and file of this state
    /// directory, then the directory. The bridge and the base-disk cache
    /// are not ours to remove here.
    pub fn down(&self) -> Result<DownReport> {
        crate::require_root()?;
        let mut report = DownReport::default();
        for id in self.state.vm_dirs()? {
            let dir = self.state.vm_dir(&id);
            if let Some(rec) = crate::state::read_opt::<VmRecord>(&dir.join("vm.json"))? {
                report.processes.extend(live_pids(&rec, &dir));
                if link_exists(&rec.tap) {
                    report.taps.push(rec.tap.clone());
                }
            } else {
                report.processes.extend(pids_naming(&dir));
            }
            if crate::state::valid_id(&id, "vm-") {
                self.delete(&id)?;
            } else {
                std::fs::remove_dir_all(&dir).ctx("cannot remove", &dir)?;
            }
            report.vms.push(id);
        }
        for s in self.state.snapshots()? {
            report.snapshots.push(s.id);
        }
        let root = self.state.root().to_path_buf();
        match std::fs::remove_dir_all(&root) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(e).ctx("cannot remove", &root)
            }
            _ => {}
        }
        Ok(report)
    }

    /// PIDs of QEMU processes of this VM that are alive now.
    pub fn qemu_pids(&self, id: &str) -> Vec<i32> {
        match self.state.vm(id) {
            Ok(rec) => live_pids(&rec, &self.state.vm_dir(id)),
            Err(_) => Vec::new(),
        }
    }
}

/// `systemctl VERB` two seconds after it returns, so the guest agent
/// answers first.
const DETACHED_SYSTEMCTL: &str = include_str!("scripts/detached-systemctl.sh");

/// The guest-agent argv running [`DETACHED_SYSTEMCTL`] for `verb`.
fn detached_systemctl(verb: &str) -> Result<Vec<String>> {
    let script = knit_local::shell::render(DETACHED_SYSTEMCTL, &[("verb", verb)], &[])
        .map_err(|e| QemuError::invalid("verb", format!("{verb:?}"), e.rule))?;
    Ok(vec!["sh".to_string(), "-c".to_string(), script])
}

fn disk_file(dir: &Path, disk_id: &str) -> PathBuf {
    dir.join(disk_name(disk_id))
}

fn disk_name(disk_id: &str) -> String {
    format!("disk-{disk_id}.qcow2")
}

fn qmp_socket(dir: &Path) -> PathBuf {
    dir.join(RUN_DIR).join("qmp.sock")
}

fn qga_socket(dir: &Path) -> PathBuf {
    dir.join(RUN_DIR).join("qga.sock")
}

/// A snapshot as the backing file of a data disk, relative to the disk's
/// directory (`<state>/vms/<id>/`): QEMU reaches it without searching the
/// state directory's parents.
fn snapshot_backing(snapshot: &str) -> String {
    format!("../../snapshots/{snapshot}/snapshot.qcow2")
}

/// Removes the guard of `tap`, if any.
fn guard_del(tap: &str) -> Result<()> {
    let table = knit_local::net::guard_table(tap);
    match run("nft", &["delete", "table", "netdev", &table], CMD_TIMEOUT) {
        Ok(_) => Ok(()),
        Err(QemuError::Command { stderr, .. }) if stderr.contains("No such file or directory") => {
            Ok(())
        }
        // Without nft no guard can have been made.
        Err(QemuError::Command { status, .. }) if status == "not started" => Ok(()),
        Err(e) => Err(e),
    }
}

fn colon_hex(hex: &str) -> String {
    hex.as_bytes()
        .chunks(2)
        .map(|c| String::from_utf8_lossy(c).into_owned())
        .collect::<Vec<_>>()
        .join(":")
}

fn write_private(path: &Path, body: &[u8]) -> Result<()> {
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

fn set_mode(path: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).ctx("cannot chmod", path)
}

fn meta_data(rec: &VmRecord) -> String {
    format!(
        "instance-id: {}-{}\nlocal-hostname: {}\n",
        rec.id, rec.generation, rec.hostname
    )
}

/// cloud-init network-config v2: the VM's address on the bridge's subnet,
/// matched by MAC, default route through the gateway.
fn network_config(rec: &VmRecord) -> String {
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

fn link_exists(name: &str) -> bool {
    Path::new("/sys/class/net").join(name).exists()
}

fn valid_link_name(field: &str, name: &str) -> Result<()> {
    if name.is_empty()
        || name.len() > 15
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    {
        return Err(QemuError::invalid(
            field,
            format!("{name:?}"),
            "must be a link name: 1-15 letters, digits, '-', '_' or '.'",
        ));
    }
    Ok(())
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

/// (start time, state) from /proc/PID/stat.
fn proc_stat(pid: i32) -> Option<(u64, char)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let state = fields.first()?.chars().next()?;
    Some((fields.get(19)?.parse().ok()?, state))
}

/// This VM's QEMU processes: those whose working directory is the VM's
/// and whose command line names the QMP socket there (or, started by an
/// earlier version, names it by its absolute path): the only QEMU
/// processes we ever signal (a PID alone could have been reused).
fn pids_naming(dir: &Path) -> Vec<i32> {
    let legacy = format!("path={},", dir.join("qmp.sock").display());
    let ours = format!("path={RUN_DIR}/qmp.sock,");
    let has = |args: &[u8], needle: &str| {
        args.split(|b| *b == 0)
            .any(|arg| arg.windows(needle.len()).any(|w| w == needle.as_bytes()))
    };
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let Ok(args) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
                return false;
            };
            has(&args, &legacy)
                || (has(&args, &ours)
                    && std::fs::read_link(format!("/proc/{pid}/cwd")).is_ok_and(|c| c == dir))
        })
        .filter(|pid| proc_stat(*pid).is_some_and(|(_, s)| s != 'Z'))
        .collect()
}

/// `pid` when it is alive and is this VM's QEMU.
fn owned_process(pid: i32, dir: &Path) -> Option<Process> {
    let (start_time, state) = proc_stat(pid)?;
    (state != 'Z' && pids_naming(dir).contains(&pid)).then_some(Process { pid, start_time })
}

fn live_pids(rec: &VmRecord, dir: &Path) -> Vec<i32> {
    let mut pids = pids_naming(dir);
    if let Some(p) = rec.process {
        if proc_stat(p.pid).is_some_and(|(t, s)| t == p.start_time && s != 'Z')
            && !pids.contains(&p.pid)
        {
            pids.push(p.pid);
        }
    }
    pids
}

fn wait_gone(rec: &VmRecord, dir: &Path, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if live_pids(rec, dir).is_empty() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::BootFiles;

    /// The detached systemctl script runs with the verb as it is: stand-in
    /// `sleep` and `systemctl` in a scratch PATH record what they got.
    #[test]
    fn detached_systemctl_passes_the_verb_unchanged() {
        use std::os::unix::fs::PermissionsExt;
        for verb in ["reboot", "it's $HOME `x` $(y)", "a b\nc"] {
            let dir = tempfile::tempdir().unwrap();
            let log = dir.path().join("systemctl.log");
            for (tool, body) in [
                ("sleep", "exit 0".to_string()),
                (
                    "systemctl",
                    format!(
                        "printf '%s|' \"$@\" > {}.tmp && mv {0}.tmp {0}",
                        knit_local::shell::quote(&log.display().to_string())
                    ),
                ),
            ] {
                let p = dir.path().join(tool);
                std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
                std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
            }
            let argv = detached_systemctl(verb).unwrap();
            assert_eq!(argv[..2], ["sh", "-c"]);
            let status = std::process::Command::new("/bin/sh")
                .args(&argv[1..])
                .env("PATH", format!("{}:/usr/bin:/bin", dir.path().display()))
                .status()
                .unwrap();
            assert!(status.success());
            // Detached: its stand-in systemctl writes a moment later.
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            while !log.exists() && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            assert_eq!(std::fs::read_to_string(&log).unwrap(), format!("{verb}|"));
        }
        assert!(detached_systemctl("a\0b").is_err());
    }

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

    #[test]
    fn names_follow_the_dns_rule() {
        assert!(valid_name("workers-abcde").is_ok());
        for bad in ["", "Upper", "-x", "a_b", &"a".repeat(65)] {
            let e = valid_name(bad).unwrap_err().to_string();
            assert!(e.starts_with("name: value"), "{e}");
        }
    }
}
