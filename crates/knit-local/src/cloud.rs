//! The local cloud's operations: create, start, stop, reboot, reimage,
//! delete, list, describe, exec, disks, snapshots and `down`.

use crate::blockstore::BlockStore;
use crate::boot::{BootDisk, BootSpec};
use crate::error::{IoContext, LocalError, Result, SysContext};
use crate::loopdev;
use crate::model::*;
use crate::net::{self, Subnet, Veth};
use crate::state::{self, new_id, now, proc_ref, StateDir};
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
    state: StateDir,
    store: BlockStore,
}

/// A base root with every link resolved (the image it names now); as
/// given when it cannot be resolved (validation reports that).
fn resolve_base_root(root: &Path) -> PathBuf {
    std::fs::canonicalize(root).unwrap_or_else(|_| root.to_path_buf())
}

pub fn require_root() -> Result<()> {
    let uid = nix::unistd::geteuid();
    if uid.is_root() {
        Ok(())
    } else {
        Err(LocalError::NotRoot { uid: uid.as_raw() })
    }
}

impl Cloud {
    pub fn open(cfg: Config) -> Result<Cloud> {
        require_root()?;
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

    /// Test fault injection: `KNIT_LOCAL_PAUSE_AFTER=step` stops here until killed.
    pub(crate) fn checkpoint(step: &str) {
        crate::pause::hold_if_set("KNIT_LOCAL_PAUSE_AFTER", step, "knit-local: paused after");
    }

    // ---- network -------------------------------------------------------

    /// The state directory's network (bridge with the gateway address,
    /// metadata server), made now if missing, as the first instance would
    /// make it: so that a host service (e.g. a registry) can listen on the
    /// bridge address alone before any instance exists. `down` removes it.
    pub fn network_up(&self) -> Result<NetworkRecord> {
        let _lock = self.state.lock()?;
        self.ensure_network()
    }

    fn ensure_network(&self) -> Result<NetworkRecord> {
        let mut rec = match self.state.network()? {
            Some(n) if n.bridge != self.cfg.bridge || n.subnet != self.subnet.to_string() => {
                return Err(LocalError::invalid(
                    "bridge/subnet",
                    format!("{} {}", self.cfg.bridge, self.subnet),
                    format!("must match the state directory's network ({} {}); run `down` first to change it", n.bridge, n.subnet),
                ));
            }
            Some(n) => n,
            None => {
                net::check_network(&self.cfg.bridge, &self.cfg.subnet)?;
                if net::link_exists(&self.cfg.bridge) {
                    return Err(LocalError::Busy {
                        what: format!("bridge {}", self.cfg.bridge),
                        message: format!(
                            "it exists but is not managed by {}; pick another bridge name",
                            self.state.root().display()
                        ),
                    });
                }
                let gateway = self.gateway()?;
                let n = NetworkRecord {
                    bridge: self.cfg.bridge.clone(),
                    subnet: self.subnet.to_string(),
                    gateway: gateway.to_string(),
                    metadata_port: self.cfg.metadata_port,
                    metadata: None,
                };
                self.state.put_network(&n)?;
                n
            }
        };
        if !net::link_exists(&rec.bridge) {
            net::create_bridge(&rec.bridge, self.gateway()?, self.subnet.prefix)?;
        }
        if !rec.metadata.is_some_and(|m| m.alive()) {
            rec.metadata = Some(self.spawn_metadata(&rec)?);
            self.state.put_network(&rec)?;
        }
        Ok(rec)
    }

    fn gateway(&self) -> Result<std::net::Ipv4Addr> {
        self.subnet.host(1).ok_or_else(|| {
            LocalError::invalid(
                "subnet",
                format!("{:?}", self.cfg.subnet),
                "must hold at least a gateway and one instance",
            )
        })
    }

    fn spawn_metadata(&self, n: &NetworkRecord) -> Result<ProcRef> {
        let listen = format!("{}:{}", n.gateway, n.metadata_port);
        let log = self.state.root().join("metadata.log");
        let log_file = std::fs::File::options()
            .create(true)
            .append(true)
            .open(&log)
            .ctx("cannot open", &log)?;
        let mut cmd = Command::new(self.helper()?);
        cmd.arg("__metadata")
            .arg("--state-dir")
            .arg(self.state.root())
            .arg("--listen")
            .arg(&listen)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file);
        // SAFETY: setsid is async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                libc::setsid();
                Ok(())
            });
        }
        let mut child = cmd
            .spawn()
            .ctx("cannot start metadata server", self.helper()?)?;
        let pid = child.id() as i32;
        let addr: std::net::SocketAddr = listen.parse().map_err(|_| {
            LocalError::invalid("metadataPort", n.metadata_port, "must form a valid address")
        })?;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                break;
            }
            if let Ok(Some(status)) = child.try_wait() {
                return Err(LocalError::Boot {
                    id: "metadata".into(),
                    message: format!("metadata server exited ({status}); see {}", log.display()),
                });
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(LocalError::Boot {
                    id: "metadata".into(),
                    message: format!("metadata server not listening on {listen} after 10s"),
                });
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let r = proc_ref(pid).ok_or_else(|| LocalError::Boot {
            id: "metadata".into(),
            message: "metadata server vanished".into(),
        })?;
        std::thread::spawn(move || child.wait());
        Ok(r)
    }

    // ---- create ----------------------------------------------------------

    pub fn create(&self, tpl: &Template) -> Result<Instance> {
        tpl.validate()?;
        self.check_snapshots(&tpl.disks)?;
        // The instance keeps the image it was made from: a link such as
        // the images directory's `debian-12` moves with the next build.
        let mut resolved = tpl.clone();
        resolved.base_root = resolve_base_root(&tpl.base_root);
        let tpl = &resolved;
        let os = tpl
            .attributes
            .os
            .clone()
            .unwrap_or_else(|| OsInfo::from_root(&tpl.base_root));

        let mut rec = {
            let _lock = self.state.lock()?;
            if let Some(existing) = self.by_client_token(tpl.client_token.as_deref())? {
                tracing::info!(id = %existing.id, "create repeated with the same client token: the instance it made");
                return self.view(existing);
            }
            self.check_capacity(&tpl.instance_type)?;
            self.ensure_network()?;
            let id = new_id("i-")?;
            let ip = self.pick_ip(tpl.private_ip.as_deref())?;
            let o = ip.octets();
            let mut rec = InstanceRecord {
                hostname: tpl
                    .hostname
                    .clone()
                    .or_else(|| tpl.name.clone())
                    .unwrap_or_else(|| id.clone()),
                state: InstanceState::Creating,
                template: redacted(tpl),
                os,
                private_ip: ip.to_string(),
                mac: format!("02:00:{:02x}:{:02x}:{:02x}:{:02x}", o[0], o[1], o[2], o[3]),
                veth: format!("kv{}", &id[2..]),
                netns: format!("knit-{id}"),
                system_disk_size: tpl.system_disk_size.bytes().unwrap_or(0),
                disks: Vec::new(),
                init: None,
                shim: None,
                created_at: now(),
                boots: 0,
                last_boot_ms: None,
                password_set_at: None,
                cgroups: Vec::new(),
                id,
            };
            self.state.put_instance(&rec)?;
            let mut used = BTreeSet::new();
            for d in &tpl.disks {
                let disk = self.new_disk_record(d, Some((&rec.id, &mut used)))?;
                self.state.put_disk(&disk)?;
                rec.disks.push(disk.id);
            }
            self.state.put_instance(&rec)?;
            rec
        };
        Self::checkpoint("record");
        let made = self.make_disks(&rec, tpl).and_then(|_| {
            Self::checkpoint("disks");
            self.boot(&mut rec)
        });
        if let Err(e) = made {
            if let Err(undo) = self.destroy(&rec.id) {
                tracing::warn!(id = %rec.id, error = %undo, "rollback of a failed create left something; `down` will release it");
            }
            return Err(e);
        }
        self.view(rec)
    }

    /// The instance an earlier create with this client token made, if it
    /// still exists. Called under the state lock.
    fn by_client_token(&self, token: Option<&str>) -> Result<Option<InstanceRecord>> {
        let Some(token) = token else { return Ok(None) };
        Ok(self
            .state
            .instances()?
            .into_iter()
            .find(|r| r.template.client_token.as_deref() == Some(token)))
    }

    /// Disks from snapshots: the snapshot exists and the disk is not smaller.
    fn check_snapshots(&self, disks: &[DiskSpec]) -> Result<()> {
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

    /// The requested address if it is usable, else the next free one.
    fn pick_ip(&self, want: Option<&str>) -> Result<std::net::Ipv4Addr> {
        let used: BTreeSet<String> = self
            .state
            .instances()?
            .into_iter()
            .map(|r| r.private_ip)
            .collect();
        if let Some(want) = want {
            let ok = (2..)
                .map_while(|n| self.subnet.host(n))
                .any(|ip| ip.to_string() == want);
            if !ok {
                return Err(LocalError::invalid(
                    "privateIp",
                    format!("{want:?}"),
                    format!(
                        "must be a host address of {} other than the gateway",
                        self.subnet
                    ),
                ));
            }
            if used.contains(want) {
                return Err(LocalError::invalid(
                    "privateIp",
                    format!("{want:?}"),
                    "is already used by another instance",
                ));
            }
            return want.parse().map_err(|_| {
                LocalError::invalid("privateIp", format!("{want:?}"), "must be an IPv4 address")
            });
        }
        (2..)
            .map_while(|n| self.subnet.host(n))
            .find(|ip| !used.contains(&ip.to_string()))
            .ok_or_else(|| LocalError::Busy {
                what: format!("subnet {}", self.subnet),
                message: "no free address left".into(),
            })
    }

    fn new_disk_record(
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

    fn make_disks(&self, rec: &InstanceRecord, tpl: &Template) -> Result<()> {
        self.make_system_disk(rec)?;
        for (id, spec) in rec.disks.iter().zip(&tpl.disks) {
            self.make_disk_file(&self.state.disk(id)?, spec)?;
        }
        Ok(())
    }

    fn make_system_disk(&self, rec: &InstanceRecord) -> Result<()> {
        let file = self.state.system_disk_file(&rec.id);
        state::remove_file(&file)?;
        loopdev::create_sparse(&file, rec.system_disk_size)?;
        loopdev::mkfs(&file, "ext4")
    }

    /// The disk's file is made in the block store; `disks/<id>/disk.img` is a
    /// link to it, made first, so that a crash leaves nothing unfindable and
    /// the link survives reimage's renaming of the disk's directory.
    fn make_disk_file(&self, disk: &DiskRecord, spec: &DiskSpec) -> Result<()> {
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

    // ---- boot / halt -------------------------------------------------------

    fn boot(&self, rec: &mut InstanceRecord) -> Result<()> {
        let size = crate::bounds::Size::of(&rec.template.instance_type)?;
        let n = {
            let _lock = self.state.lock()?;
            self.ensure_network()?
        };
        let system_disk = loopdev::attach(&self.state.system_disk_file(&rec.id))?;
        let mut disks: Vec<BootDisk> = Vec::new();
        let mut devs = vec![crate::bounds::Dev {
            major: system_disk.major,
            minor: system_disk.minor,
        }];
        for id in &rec.disks {
            let d = self.state.disk(id)?;
            let dev = loopdev::attach(&self.state.disk_file(id))?;
            devs.push(crate::bounds::Dev {
                major: dev.major,
                minor: dev.minor,
            });
            disks.push(BootDisk::new(&dev, &d));
        }
        Self::checkpoint("loops");
        // Its cgroups: recorded, then made (size, device allow-list).
        rec.cgroups = crate::bounds::plan(&rec.id)?;
        {
            let _lock = self.state.lock()?;
            // Not written back when deleted meanwhile (see the end of boot).
            self.state.instance(&rec.id)?;
            self.state.put_instance(rec)?;
        }
        crate::bounds::create(&rec.cgroups, &size, &devs)?;
        let entry = crate::bounds::Entry::new(&rec.cgroups)?;
        Self::checkpoint("cgroups");
        net::netns_add(&rec.netns)?;
        let ip = rec.private_ip.parse().map_err(|_| LocalError::State {
            path: self.state.instance_dir(&rec.id),
            message: format!("bad privateIp {}", rec.private_ip),
        })?;
        Veth {
            host: &rec.veth,
            netns: &rec.netns,
            bridge: &n.bridge,
            mac: &rec.mac,
            ip,
            prefix: self.subnet.prefix,
            gateway: self.gateway()?,
        }
        .create()?;
        if let Some(mbit) = rec.template.bandwidth_mbit {
            net::shape(&rec.veth, &rec.netns, Some(mbit))?;
        }
        Self::checkpoint("network");

        let dir = self.state.instance_dir(&rec.id);
        let spec = BootSpec {
            id: rec.id.clone(),
            hostname: rec.hostname.clone(),
            private_ip: rec.private_ip.clone(),
            base_root: rec.template.base_root.clone(),
            instance_dir: dir.clone(),
            hide: vec![self.state.root().to_path_buf()],
            system_disk,
            disks,
            user_data: rec.template.user_data.clone(),
            runner: rec.template.user_data_runner,
            os_override: rec.template.attributes.os.clone(),
            swap: rec.template.attributes.swap,
        };
        let spec_path = dir.join("boot.json");
        state::write_json(&spec_path, &spec)?;
        let console = dir.join("console.log");
        let console_file = std::fs::File::options()
            .create(true)
            .append(true)
            .open(&console)
            .ctx("cannot open", &console)?;
        let netns = std::fs::File::open(net::netns_path(&rec.netns))
            .ctx("cannot open", net::netns_path(&rec.netns))?;
        let netns_fd = netns.as_raw_fd();
        let mut cmd = Command::new(self.helper()?);
        cmd.arg("__boot")
            .arg(&spec_path)
            .current_dir("/")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(console_file);
        // PID 1 and its shim are never the out-of-memory victim (the user-data
        // runner sets its own score back to 0).
        let oom_adj = c"/proc/self/oom_score_adj";
        // SAFETY: only raw syscalls between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setsid() < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // Its cgroups first: the new cgroup namespace is rooted there.
                entry.join()?;
                if libc::setns(netns_fd, libc::CLONE_NEWNET) != 0
                    || libc::unshare(
                        libc::CLONE_NEWUTS
                            | libc::CLONE_NEWIPC
                            | libc::CLONE_NEWPID
                            | libc::CLONE_NEWCGROUP,
                    ) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                let fd = libc::open(oom_adj.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd >= 0 {
                    libc::write(fd, b"-1000".as_ptr().cast(), 5);
                    libc::close(fd);
                }
                // Last: the bounding set and the seccomp filter bind the
                // machine's first process from its exec on.
                entry.confine()
            });
        }
        let started = Instant::now();
        let mut child = cmd
            .spawn()
            .ctx("cannot start instance init", self.helper()?)?;
        drop(netns);
        rec.shim = proc_ref(child.id() as i32);
        let stdout = child.stdout.take();
        // Reap the shim whenever it ends, success or not: no zombies in a long-lived caller.
        std::thread::spawn(move || child.wait());
        let (tx, rx) = mpsc::channel::<Option<String>>();
        std::thread::spawn(move || {
            if let Some(out) = stdout {
                for line in std::io::BufReader::new(out).lines() {
                    let Ok(line) = line else { break };
                    if tx.send(Some(line)).is_err() {
                        return;
                    }
                }
            }
            let _ = tx.send(None);
        });
        let fail = |message: String| LocalError::Boot {
            id: rec.id.clone(),
            message: format!("{message} (console: {})", console.display()),
        };
        let mut init = None;
        loop {
            let left = BOOT_TIMEOUT.saturating_sub(started.elapsed());
            match rx.recv_timeout(left) {
                Ok(Some(line)) => {
                    if let Some(pid) = line
                        .strip_prefix("pid ")
                        .and_then(|p| p.trim().parse().ok())
                    {
                        init = proc_ref(pid);
                    } else if line == "ready" {
                        break;
                    } else if let Some(msg) = line.strip_prefix("error ") {
                        return Err(fail(msg.to_string()));
                    }
                }
                Ok(None) => return Err(fail("init exited before it was ready".into())),
                Err(_) => return Err(fail(format!("not ready after {}s", BOOT_TIMEOUT.as_secs()))),
            }
        }
        rec.init = init;
        rec.state = InstanceState::Running;
        rec.boots += 1;
        rec.last_boot_ms = Some(started.elapsed().as_millis() as u64);
        {
            let _lock = self.state.lock()?;
            // Released meanwhile by another process (a create that was
            // frozen, then its instance deleted by the next leader): the
            // record is not written back, what this boot started ends.
            if self.state.instance(&rec.id).is_err() {
                drop(_lock);
                if let Err(e) = self.halt(rec) {
                    tracing::warn!(id = %rec.id, error = %e, "ending a boot whose instance was deleted meanwhile");
                }
                return Err(LocalError::NotFound {
                    kind: "instance",
                    id: rec.id.clone(),
                });
            }
            self.state.put_instance(rec)?;
        }
        tracing::info!(id = %rec.id, ip = %rec.private_ip, boot_ms = rec.last_boot_ms, "instance ready");
        Self::checkpoint("spawn");
        Ok(())
    }

    /// Ends every process of the instance and releases its network and loop
    /// devices; the files (disks, system layer) stay.
    fn halt(&self, rec: &mut InstanceRecord) -> Result<usize> {
        if let Some(init) = rec.init.filter(|i| i.alive()) {
            let _ = kill(Pid::from_raw(init.pid), Signal::SIGTERM);
            let deadline = Instant::now() + STOP_TIMEOUT;
            while init.alive() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        // Whatever is still in the instance's network namespace is ours.
        let mut killed = BTreeSet::new();
        for _ in 0..100 {
            let pids = net::pids_in_netns(&rec.netns);
            if pids.is_empty() {
                break;
            }
            for pid in pids {
                if kill(Pid::from_raw(pid), Signal::SIGKILL).is_ok() {
                    killed.insert(pid);
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // In case the namespace's name was removed behind our back.
        for p in [rec.init, rec.shim]
            .into_iter()
            .flatten()
            .filter(|p| p.alive())
        {
            if kill(Pid::from_raw(p.pid), Signal::SIGKILL).is_ok() {
                killed.insert(p.pid);
            }
        }
        // A process that left the network namespace is still in the cgroup.
        for _ in 0..100 {
            let pids = crate::bounds::pids(&rec.cgroups);
            if pids.is_empty() {
                break;
            }
            for pid in pids {
                if kill(Pid::from_raw(pid), Signal::SIGKILL).is_ok() {
                    killed.insert(pid);
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        crate::bounds::remove(&rec.cgroups)?;
        rec.cgroups.clear();
        net::delete_veth(&rec.veth)?;
        net::netns_del(&rec.netns)?;
        loopdev::detach_file(&self.state.system_disk_file(&rec.id))?;
        for id in &rec.disks {
            loopdev::detach_file(&self.state.disk_file(id))?;
        }
        rec.init = None;
        rec.shim = None;
        Ok(killed.len())
    }

    // ---- lifecycle ---------------------------------------------------------

    fn running(&self, id: &str, action: &'static str) -> Result<InstanceRecord> {
        let rec = self.state.instance(id)?;
        if rec.state != InstanceState::Running || !rec.init.is_some_and(|i| i.alive()) {
            return Err(LocalError::WrongState {
                id: id.into(),
                state: if rec.state == InstanceState::Running {
                    "running (but its init is gone)".into()
                } else {
                    rec.state.to_string()
                },
                action,
                wanted: "running",
            });
        }
        Ok(rec)
    }

    pub fn start(&self, id: &str) -> Result<Instance> {
        let mut rec = self.state.instance(id)?;
        if rec.init.is_some_and(|i| i.alive()) {
            return Err(LocalError::WrongState {
                id: id.into(),
                state: rec.state.to_string(),
                action: "start",
                wanted: "stopped",
            });
        }
        // Leftovers of an instance whose init died on its own.
        self.halt(&mut rec)?;
        if let Err(e) = self.boot(&mut rec) {
            if let Err(undo) = self.halt(&mut rec) {
                tracing::warn!(id = %rec.id, error = %undo, "cleanup after a failed start");
            }
            rec.state = InstanceState::Stopped;
            if let Err(undo) = self.state.put_instance(&rec) {
                tracing::warn!(id = %rec.id, error = %undo, "cannot record the instance as stopped");
            }
            return Err(e);
        }
        self.view(rec)
    }

    pub fn stop(&self, id: &str) -> Result<Instance> {
        let mut rec = self.state.instance(id)?;
        if rec.state == InstanceState::Stopped {
            return Err(LocalError::WrongState {
                id: id.into(),
                state: rec.state.to_string(),
                action: "stop",
                wanted: "running",
            });
        }
        self.halt(&mut rec)?;
        rec.state = InstanceState::Stopped;
        self.state.put_instance(&rec)?;
        tracing::info!(id = %rec.id, "instance stopped");
        self.view(rec)
    }

    pub fn reboot(&self, id: &str) -> Result<Instance> {
        self.running(id, "reboot")?;
        self.stop(id)?;
        self.start(id)
    }

    /// New system layer from the base root, data disks kept under new ids,
    /// new user data (when given); the instance is booted afterwards.
    pub fn reimage(&self, id: &str, user_data: Option<String>) -> Result<Instance> {
        self.reimage_from(id, user_data, None)
    }

    /// `reimage` onto another image: the new system layer lies over
    /// `base_root` (an image directory, or `/` for the host's root) instead
    /// of the instance's current one. The image is checked before the
    /// instance is stopped; its os-release becomes the instance's OS unless
    /// the `os` attribute overrides it.
    pub fn reimage_from(
        &self,
        id: &str,
        user_data: Option<String>,
        base_root: Option<&Path>,
    ) -> Result<Instance> {
        let mut rec = self.state.instance(id)?;
        let base_root = base_root.map(resolve_base_root);
        let base_root = base_root.as_deref();
        if let Some(root) = base_root {
            // The whole recorded template against the new root: baseRoot's
            // rule, and cloud-init present when that runner is used.
            let mut t = rec.template.clone();
            t.base_root = root.to_path_buf();
            t.validate()?;
        }
        self.halt(&mut rec)?;
        rec.state = InstanceState::Stopped;
        if user_data.is_some() {
            rec.template.user_data = user_data;
        }
        if let Some(root) = base_root {
            rec.template.base_root = root.to_path_buf();
            rec.os = rec
                .template
                .attributes
                .os
                .clone()
                .unwrap_or_else(|| OsInfo::from_root(root));
        }
        // The new system layer has the image's /etc/shadow: a password set
        // before is gone with the old one.
        rec.password_set_at = None;
        self.state.put_instance(&rec)?;
        self.make_system_disk(&rec)?;
        let mut renamed = Vec::new();
        for old in &rec.disks {
            let mut d = self.state.disk(old)?;
            let new = new_id("d-")?;
            std::fs::rename(self.state.disk_dir(old), self.state.disk_dir(&new))
                .ctx("cannot rename", self.state.disk_dir(old))?;
            d.serial = new[2..].to_string();
            d.id = new.clone();
            self.state.put_disk(&d)?;
            renamed.push(new);
        }
        rec.disks = renamed;
        self.state.put_instance(&rec)?;
        self.start(id)
    }

    pub fn delete(&self, id: &str) -> Result<()> {
        self.state.instance(id)?;
        self.destroy(id).map(|_| ())
    }

    /// Releases everything of an instance, whatever its state.
    fn destroy(&self, id: &str) -> Result<usize> {
        let mut rec = self.state.instance(id)?;
        let killed = self.halt(&mut rec)?;
        for d in &rec.disks {
            self.remove_with_file(&self.state.disk_dir(d), &self.state.disk_file(d))?;
        }
        state::remove_dir_all(&self.state.instance_dir(id))?;
        tracing::info!(id, killed, "instance deleted");
        Ok(killed)
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

    /// Refuses a create of `instance_type` when its capacity is used up
    /// (called under the state lock).
    fn check_capacity(&self, instance_type: &str) -> Result<()> {
        let Some(capacity) = self.capacity()?.get(instance_type).copied() else {
            return Ok(());
        };
        let used = self
            .state
            .instances()?
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

    /// A command that runs `argv` inside the instance (all its namespaces, its
    /// root, a clean environment); the caller decides about stdio.
    pub fn exec_command(&self, id: &str, argv: &[String]) -> Result<Command> {
        let rec = self.running(id, "exec")?;
        let pid = rec.init.map(|i| i.pid).unwrap_or(0).to_string();
        let entry = crate::bounds::Entry::new(&rec.cgroups)?;
        let mut cmd = Command::new("nsenter");
        // The command is bound as the machine's own processes are: its
        // cgroups (and cgroup namespace), bounding set and seccomp filter.
        // SAFETY: only raw syscalls between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                entry.join()?;
                entry.confine()
            });
        }
        cmd.args([
            "-t",
            &pid,
            "-m",
            "-u",
            "-i",
            "-n",
            "-p",
            "-C",
            "-r",
            "-w",
            "--",
            "/usr/bin/env",
            "-i",
        ])
        .arg(format!("PATH={}", crate::userdata::PATH_ENV))
        .args(["HOME=/root", "LANG=C.UTF-8", "TERM=xterm"])
        .args(argv);
        Ok(cmd)
    }

    /// Runs `argv` inside the instance and returns its output.
    pub fn exec(&self, id: &str, argv: &[String]) -> Result<std::process::Output> {
        let mut cmd = self.exec_command(id, argv)?;
        cmd.stdin(Stdio::null())
            .output()
            .ctx("cannot run nsenter", "nsenter")
    }

    /// The user-data runner's result record, once it has finished.
    pub fn user_data_result(&self, id: &str) -> Result<Option<serde_json::Value>> {
        let rec = self.running(id, "read user-data result")?;
        let path = PathBuf::from(format!(
            "/proc/{}/root{}",
            rec.init.map(|i| i.pid).unwrap_or(0),
            crate::userdata::RESULT
        ));
        state::read_opt(&path)
    }

    /// Waits for the user-data runner to finish and returns its result record.
    pub fn wait_user_data(&self, id: &str, timeout: Duration) -> Result<serde_json::Value> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(v) = self.user_data_result(id)? {
                return Ok(v);
            }
            if Instant::now() > deadline {
                return Err(LocalError::Boot {
                    id: id.into(),
                    message: format!("user data still running after {}s", timeout.as_secs()),
                });
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Changes (or with `None` removes) the shaping of a running instance's link.
    pub fn set_bandwidth(&self, id: &str, mbit: Option<u32>) -> Result<()> {
        if mbit == Some(0) {
            return Err(LocalError::invalid(
                "bandwidthMbit",
                0,
                "must be > 0 (omit it for an unshaped link)",
            ));
        }
        let mut rec = self.running(id, "shape")?;
        net::shape(&rec.veth, &rec.netns, mbit)?;
        rec.template.bandwidth_mbit = mbit;
        self.state.put_instance(&rec)
    }

    // ---- name and password (adding existing instances) ---------------------

    /// Renames an instance: its name attribute and its hostname, which the
    /// metadata endpoint serves from the record. A running instance takes
    /// the new hostname at once (sethostname in its UTS namespace,
    /// `/etc/hostname` and its `/etc/hosts` entry rewritten inside); every
    /// later boot sets it from the record, as for any instance.
    pub fn rename(&self, id: &str, name: &str) -> Result<Instance> {
        check_instance_name(name)
            .map_err(|rule| LocalError::invalid("name", format!("{name:?}"), rule))?;
        let (rec, old) = {
            let _lock = self.state.lock()?;
            let mut rec = self.state.instance(id)?;
            let old = std::mem::replace(&mut rec.hostname, name.to_string());
            rec.template.name = Some(name.to_string());
            rec.template.hostname = Some(name.to_string());
            self.state.put_instance(&rec)?;
            (rec, old)
        };
        if rec.state == InstanceState::Running && rec.init.is_some_and(|i| i.alive()) {
            self.apply_hostname(&rec, &old)?;
        }
        tracing::info!(id, name, old = %old, "instance renamed");
        self.view(rec)
    }

    /// The record's hostname inside a running instance, at once.
    fn apply_hostname(&self, rec: &InstanceRecord, old: &str) -> Result<()> {
        let pid = rec.init.map(|i| i.pid).unwrap_or(0);
        let ns = PathBuf::from(format!("/proc/{pid}/ns/uts"));
        let uts = std::fs::File::open(&ns).ctx("cannot open", &ns)?;
        let name = rec.hostname.clone();
        // setns(CLONE_NEWUTS) moves only the calling thread: a thread of its
        // own enters the instance's UTS namespace and ends with it.
        std::thread::spawn(move || -> Result<()> {
            nix::sched::setns(&uts, nix::sched::CloneFlags::CLONE_NEWUTS)
                .sys(|| format!("setns into the UTS namespace of {pid}"))?;
            nix::unistd::sethostname(&name).sys(|| format!("sethostname {name}"))
        })
        .join()
        .map_err(|_| LocalError::Boot {
            id: rec.id.clone(),
            message: "the thread setting the hostname panicked".into(),
        })??;
        // The files are rewritten by the instance's own shell, in its own
        // mount namespace: nothing of the host is written, whatever links
        // the instance holds.
        let script = hostname_script(&rec.hostname, &rec.private_ip, old)?;
        let out = self.exec(&rec.id, &["/bin/sh".into(), "-c".into(), script])?;
        if !out.status.success() {
            return Err(LocalError::Command {
                command: format!(
                    "sh (rewrite /etc/hostname and /etc/hosts) inside {}",
                    rec.id
                ),
                status: out.status.to_string(),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        Ok(())
    }

    /// Sets root's password inside a running instance: `chpasswd -c SHA512`
    /// runs in the instance's own namespaces and root and reads
    /// `root:<password>` on its stdin (never argv), so only the instance's
    /// `/etc/shadow` changes (copied up into its system layer), never the
    /// base root's. The record keeps that and when a password was set, never
    /// the password or its hash; errors never carry it.
    pub fn set_password(&self, id: &str, password: &str) -> Result<Instance> {
        check_password(password)?;
        self.running(id, "set the root password")?;
        let argv = ["chpasswd".to_string(), "-c".into(), "SHA512".into()];
        let mut cmd = self.exec_command(id, &argv)?;
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().ctx("cannot run nsenter", "nsenter")?;
        let written = match child.stdin.take() {
            Some(mut stdin) => {
                use std::io::Write;
                stdin.write_all(format!("root:{password}\n").as_bytes())
            }
            None => Err(std::io::Error::other("no stdin pipe")),
        };
        let out = child
            .wait_with_output()
            .ctx("cannot wait for nsenter", "nsenter")?;
        let command = format!("chpasswd -c SHA512 inside {id}");
        if !out.status.success() {
            let mut stderr = String::from_utf8_lossy(&out.stderr)
                .replace(password, "(redacted)")
                .trim()
                .to_string();
            if out.status.code() == Some(127) {
                stderr.push_str(
                    " (the instance's image has no chpasswd: it needs the passwd package)",
                );
            }
            return Err(LocalError::Command {
                command,
                status: out.status.to_string(),
                stderr,
            });
        }
        if let Err(e) = written {
            return Err(LocalError::Command {
                command,
                status: "its stdin could not be written".into(),
                stderr: e.to_string(),
            });
        }
        let rec = {
            let _lock = self.state.lock()?;
            let mut rec = self.state.instance(id)?;
            rec.password_set_at = Some(now());
            // The attribute says the instance logs in by password; its value
            // is never kept.
            rec.template.attributes.login.password = Some(REDACTED.into());
            self.state.put_instance(&rec)?;
            rec
        };
        tracing::info!(id, "root password set");
        self.view(rec)
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
        Self::checkpoint("snapshot-record");
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
    fn machine_devs(
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
        let mut mounts: Vec<String> = crate::blockstore::mount_points()
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

/// A password chpasswd can take as one `root:<password>` line. The error
/// names its length, never its value.
fn check_password(p: &str) -> Result<()> {
    let value = format!("<{} characters>", p.chars().count());
    if p.is_empty() || p.len() > 256 {
        return Err(LocalError::invalid(
            "password",
            value,
            "must be 1 to 256 bytes",
        ));
    }
    if p.contains(['\n', '\r', '\0']) {
        return Err(LocalError::invalid(
            "password",
            value,
            "must not contain a newline, carriage return or NUL (chpasswd reads one root:password line)",
        ));
    }
    Ok(())
}

/// knit's guest-hostname routine for a running instance: `/etc/hostname`
/// and its `/etc/hosts` entry; the running name is set with sethostname
/// before (an image directory may have no hostname tool).
fn hostname_script(name: &str, ip: &str, old: &str) -> Result<String> {
    let hosts = knit_api::shell::HostsEntry { ip, old };
    knit_api::shell::guest_hostname(name, Some(hosts), knit_api::shell::LiveHostname::Skip)
        .map_err(|e| LocalError::invalid("hostname", format!("{name:?}"), e.rule))
}

/// First free cloud device name for the interface.
fn device_name(iface: DiskInterface, used: &BTreeSet<String>) -> Option<String> {
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

    /// The rename's script parses with any name (the routine itself is run
    /// with awkward values in knit-api's tests), and a NUL is refused.
    #[test]
    fn hostname_script_parses_with_awkward_values() {
        for v in ["it's", "a b", "$x `y` $(z)", "l1\nl2", "'\\'"] {
            let script = hostname_script(v, "10.0.0.1", v).unwrap();
            let out = std::process::Command::new("/bin/sh")
                .args(["-n", "-c", &script])
                .output()
                .unwrap();
            assert!(out.status.success(), "{v:?}: {out:?}");
            assert!(script.contains("live='skip'"), "{script}");
        }
        let e = hostname_script("a\0b", "10.0.0.1", "old").unwrap_err();
        assert!(e.to_string().contains("NUL"), "{e}");
    }

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
