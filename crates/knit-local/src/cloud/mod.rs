//! The local cloud's operations: create, start, stop, reboot, reimage,
//! delete, list, describe, exec, disks, snapshots and `down`.
//!
//! One file per job: `machine` (a machine's life, commands, name and
//! password), `disks` (disk files, data disks, snapshots), `network` (the
//! bridge, the metadata server, addresses, bandwidth); here the cloud
//! itself: opening it, capacity, listing and `down`.

mod disks;
mod machine;
mod network;

use crate::blockstore::BlockStore;
use crate::boot::{BootDisk, BootSpec};
use crate::error::{IoContext, LocalError, Result, SysContext};
use crate::host_limits::{bridge_ports, bridge_ports_full, BridgeLayout};
use crate::loopdev;
use crate::model::*;
use crate::net::{self, Subnet, Veth};
use crate::state::{self, new_id, now, StateDir};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::collections::BTreeSet;

/// Per-type capacities in the state directory (`Cloud::set_capacity`).
const CAPACITY_FILE: &str = "capacity.json";
use std::io::BufRead;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Where and how the local cloud lives on this host.
#[derive(Debug, Clone)]
pub struct Config {
    pub state_dir: PathBuf,
    pub bridge: String,
    pub subnet: String,
    /// Port of the metadata endpoint on the bridge's gateway address.
    pub metadata_port: u16,
    /// The `knit-local` binary (runs PID 1 and the metadata server); found
    /// next to the current executable when not given.
    pub helper: Option<PathBuf>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            state_dir: PathBuf::from("/var/lib/knit/local"),
            bridge: "knit0".into(),
            subnet: "10.213.0.0/24".into(),
            metadata_port: 80,
            helper: None,
        }
    }
}

/// How long create/start waits for PID 1 to report ready.
const BOOT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long stop waits for PID 1 to end its processes before killing them.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// What `down` released.
#[derive(Debug, Default, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DownReport {
    pub instances: usize,
    pub processes_killed: usize,
    pub loop_devices: usize,
    pub mounts: usize,
    pub links: usize,
    pub namespaces: usize,
    pub errors: Vec<String>,
}

pub struct Cloud {
    cfg: Config,
    subnet: Subnet,
    /// Ports per bridge (`host_limits::bridge_port_limit`).
    port_limit: u64,
    state: StateDir,
    store: BlockStore,
}

/// A base root with every link resolved (the image it names now); as
/// given when it cannot be resolved (validation reports that).
fn resolve_base_root(root: &Path) -> PathBuf {
    std::fs::canonicalize(root).unwrap_or_else(|_| root.to_path_buf())
}

impl Cloud {
    pub fn open(cfg: Config) -> Result<Cloud> {
        crate::run::require_root()?;
        let subnet = Subnet::parse(&cfg.subnet).ok_or_else(|| {
            LocalError::invalid(
                "subnet",
                format!("{:?}", cfg.subnet),
                "must be an IPv4 CIDR like 10.213.0.0/24",
            )
        })?;
        let dir = cfg.state_dir.to_string_lossy();
        if !cfg.state_dir.is_absolute() || dir.contains([',', ':', '\n']) {
            return Err(LocalError::invalid(
                "stateDir",
                format!("{dir:?}"),
                "must be an absolute path without ',', ':' or a newline (it appears in overlayfs options)",
            ));
        }
        let state = StateDir::open(&cfg.state_dir)?;
        let store = BlockStore::new(state.root());
        let cloud = Cloud {
            cfg,
            subnet,
            port_limit: crate::host_limits::bridge_port_limit()?,
            state,
            store,
        };
        // A store made before (and unmounted by a host reboot) is mounted
        // again at once, so that every disk file is where its link points;
        // a new one is made on the first disk. A failure here must not stop
        // `down` or `list`: the next disk operation reports it.
        if cloud.store.record().ok().flatten().is_some() {
            if let Err(e) = cloud.store() {
                tracing::warn!(store = %cloud.store.dir().display(), error = %e, "cannot mount the block store");
            }
        }
        Ok(cloud)
    }

    /// The block store, made or mounted if needed (takes the state lock
    /// then: never call it with the lock held).
    fn store(&self) -> Result<PathBuf> {
        if self.store.ready() {
            return Ok(self.store.dir());
        }
        let _lock = self.state.lock()?;
        self.store.ensure()
    }

    /// Removes a disk's or snapshot's record directory and its file in the
    /// block store (`link` is the record's link to it).
    fn remove_with_file(&self, dir: &Path, link: &Path) -> Result<()> {
        if let Ok(target) = std::fs::read_link(link) {
            state::remove_file(&target)?;
        }
        state::remove_dir_all(dir)
    }

    pub fn state_dir(&self) -> &Path {
        self.state.root()
    }

    fn helper(&self) -> Result<PathBuf> {
        if let Some(h) = &self.cfg.helper {
            return Ok(h.clone());
        }
        let exe =
            std::env::current_exe().ctx("cannot find current executable", "/proc/self/exe")?;
        if exe.file_name().is_some_and(|n| n == "knit-local") {
            return Ok(exe);
        }
        let sibling = exe.with_file_name("knit-local");
        if sibling.exists() {
            return Ok(sibling);
        }
        Err(LocalError::invalid(
            "helper",
            format!("{:?}", sibling),
            "the knit-local binary must exist next to this program or be set in Config.helper",
        ))
    }

    /// How many instances of each type this cloud may hold at once (`knit
    /// local capacity`); a type not listed has no limit.
    pub fn capacity(&self) -> Result<std::collections::BTreeMap<String, u64>> {
        Ok(state::read_opt(&self.state.root().join(CAPACITY_FILE))?.unwrap_or_default())
    }

    /// Sets the capacity of `instance_type` (`None`: no limit). Instances
    /// already made stay; a create past the capacity is refused with
    /// [`LocalError::OutOfCapacity`].
    pub fn set_capacity(&self, instance_type: &str, capacity: Option<u64>) -> Result<()> {
        let _lock = self.state.lock()?;
        let mut all = self.capacity()?;
        match capacity {
            Some(n) => all.insert(instance_type.to_string(), n),
            None => all.remove(instance_type),
        };
        state::write_json(&self.state.root().join(CAPACITY_FILE), &all)
    }

    /// Refuses a create the host cannot carry (`host_limits`), counting
    /// this cloud's machines that are or will soon be running: each takes a
    /// port of one of the cloud's bridges, and one holding an inotify
    /// instance (a light machine runs no containerd and holds none) takes
    /// one of root's (`records`: every instance, read under the state lock).
    fn check_host_limits(&self, records: &[InstanceRecord], template: &Template) -> Result<()> {
        use crate::host_limits::{check_bridge_ports, inotify_holders, inotify_of, InotifyBudget};
        let layout = self.bridge_layout();
        let used = self.bridge_use(records, &layout);
        // Not stopped and not placed yet (being made): each takes a port soon.
        let pending = records
            .iter()
            .filter(|r| {
                r.state != InstanceState::Stopped
                    && r.bridge.is_none()
                    && !net::link_exists(&r.veth)
            })
            .count() as u64;
        check_bridge_ports(&self.cfg.bridge, &layout, &used, pending)?;
        if inotify_of(template) == 0 {
            return Ok(());
        }
        let holders = inotify_holders(records.iter().map(|r| (r.state, &r.template)));
        InotifyBudget::host().reserve_one(holders)
    }

    /// Refuses a create of `instance_type` when its capacity is used up
    /// (`records`: every instance, read under the state lock).
    fn check_capacity(&self, records: &[InstanceRecord], instance_type: &str) -> Result<()> {
        let Some(capacity) = self.capacity()?.get(instance_type).copied() else {
            return Ok(());
        };
        let used = records
            .iter()
            .filter(|r| r.template.instance_type == instance_type)
            .count() as u64;
        if used >= capacity {
            return Err(LocalError::OutOfCapacity {
                instance_type: instance_type.to_string(),
                used,
                capacity,
            });
        }
        Ok(())
    }

    /// Every instance; one being deleted meanwhile (its disks already gone) is left out.
    pub fn list(&self) -> Result<Vec<Instance>> {
        let mut out = Vec::new();
        for r in self.state.instances()? {
            match self.view(r) {
                Ok(i) => out.push(i),
                Err(LocalError::NotFound { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    pub fn describe(&self, id: &str) -> Result<Instance> {
        self.view(self.state.instance(id)?)
    }

    fn view(&self, record: InstanceRecord) -> Result<Instance> {
        let data_disks = record
            .disks
            .iter()
            .map(|d| self.state.disk(d))
            .collect::<Result<Vec<_>>>()?;
        Ok(Instance {
            alive: record.init.is_some_and(|i| i.alive()),
            record,
            data_disks,
        })
    }

    // ---- down ---------------------------------------------------------------

    /// Removes everything this state directory ever made: processes, loop
    /// devices, veths, namespaces, the bridge, the metadata server, and the
    /// state itself. Safe after a crash at any point.
    pub fn down(&self) -> Result<DownReport> {
        let root = self.state.root().to_path_buf();
        let _lock = self.state.lock()?;
        let mut report = DownReport {
            loop_devices: loopdev::backed_under(&root).len(),
            ..DownReport::default()
        };
        for mut rec in self.state.instances()? {
            report.instances += 1;
            report.links += usize::from(net::link_exists(&rec.veth));
            report.namespaces += usize::from(net::netns_path(&rec.netns).exists());
            match self.halt(&mut rec) {
                Ok(k) => report.processes_killed += k,
                Err(e) => report.errors.push(format!("{}: {e}", rec.id)),
            }
        }
        // Attached but never recorded (a crash right after losetup). The
        // block store's own device goes after its unmount below.
        let store_file = self.store.backing_file();
        for (dev, file) in loopdev::backed_under(&root) {
            if file == store_file {
                continue;
            }
            if let Err(e) = loopdev::detach(&dev) {
                report.errors.push(e.to_string());
            }
        }
        // The block store is knit-local's only host mount; anything else
        // under the state directory was left by hand or by a foreign tool.
        // Deepest first, so the store goes after what was mounted inside it.
        let mut mounts: Vec<String> = crate::mounts::mount_points()
            .into_iter()
            .filter(|m| Path::new(m).starts_with(&root))
            .collect();
        mounts.sort_by_key(|m| std::cmp::Reverse(m.len()));
        for m in mounts {
            report.mounts += 1;
            if let Err(e) = nix::mount::umount2(m.as_str(), nix::mount::MntFlags::MNT_DETACH) {
                report.errors.push(format!("umount {m}: {e}"));
            }
        }
        match self.store.release() {
            Ok(n) => report.mounts += n,
            Err(e) => report.errors.push(e.to_string()),
        }
        if let Some(n) = self.state.network()? {
            if let Some(m) = n.metadata.filter(|m| m.alive()) {
                let _ = kill(Pid::from_raw(m.pid), Signal::SIGKILL);
                report.processes_killed += 1;
            }
            if net::link_exists(&n.bridge) {
                report.links += 1;
                if let Err(e) = net::delete_link(&n.bridge) {
                    report.errors.push(e.to_string());
                }
            }
            for name in &n.overflow {
                let o = net::Overflow::named(name.clone());
                report.links += usize::from(net::link_exists(&o.bridge));
                if let Err(e) = o.delete() {
                    report.errors.push(e.to_string());
                }
            }
            // Its ports' guards (QEMU VMs' too), gone with the bridge.
            if let Err(e) = net::guard_table_del(&n.bridge) {
                report.errors.push(e.to_string());
            }
        }
        // After the instances' namespaces are gone.
        match net::release_netns_dir() {
            Ok(n) => report.mounts += n,
            Err(e) => report.errors.push(e.to_string()),
        }
        if report.errors.is_empty() {
            state::remove_dir_all(&root)?;
        }
        tracing::info!(state_dir = %root.display(), ?report, "down");
        Ok(report)
    }
}

/// What a recorded password attribute holds instead of the password.
const REDACTED: &str = "(redacted)";

/// The template as recorded: a login password is an attribute (whether one
/// is set), never stored or shown.
fn redacted(tpl: &Template) -> Template {
    let mut t = tpl.clone();
    if t.attributes.login.password.is_some() {
        t.attributes.login.password = Some(REDACTED.into());
    }
    t
}
