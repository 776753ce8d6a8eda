//! The VM lifecycle over the state directory.
//!
//! One file per job: `machine` (create, start, stop, reboot, reimage,
//! delete), `qemu` (the seed, QEMU's command line, spawning it), `guest`
//! (the guest agent: exec, files, password, name), `disks` (overlay, data
//! disks, snapshots), `network` (bridge, address, TAP and its guard) and
//! `process` (QEMU's processes); here the types, opening the state, views
//! and `down`.

mod disks;
mod guest;
mod machine;
mod network;
mod process;
mod qemu;

// What one job's file uses of another's.
use disks::{disk_file, disk_name, snapshot_backing};
use guest::detached_systemctl;
use machine::valid_name;
use network::{colon_hex, link_exists, valid_link_name};
use process::{live_pids, owned_process, pids_naming, wait_gone};
use qemu::{qga_socket, qmp_socket, write_private};

use crate::agent::{self, ExecOutput, Guest};
use crate::error::{IoContext, QemuError, Result};
use crate::run::run;
use crate::state::{
    random_hex, DiskRecord, Interface, Process, SnapshotRecord, State, VmRecord, VmState,
};
use base64::Engine;
use knit_local::net::Subnet;
use knit_os::time::now_secs;
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
}
