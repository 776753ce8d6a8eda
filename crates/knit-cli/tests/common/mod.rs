//! What every end-to-end suite of the `knit` binary shares: where the
//! binaries are, a free loopback port, the root check, and [`Env`] — one
//! knit server with a state directory, bridge and subnet of its own, the
//! local cloud behind it, and their cleanup on success, failure and panic.
//!
//! ```ignore
//! let mut env = Env::builder().cluster(true).registry(true).build();
//! env.build_package(true);
//! env.start_server();
//! env.knit_ok(&["get", "pools"]);
//! ```
//!
//! Cleanup (on drop, so also when a test panics) ends only what this `Env`
//! started, by PID (the server, the registry), deletes only the firewall
//! rules it inserted, and brings down only its own local cloud (its state
//! directory). The temporary directory is kept, and its path printed, when
//! anything under it could not be released. The same release runs when the
//! test process gets SIGTERM (nextest ending a test past its timeout), where
//! no destructor would run.

#![allow(dead_code)] // each suite uses its own part

pub mod browser;

use knit_local::{Cloud, Config, Template};
use knit_registry::Registry;
use serde_json::Value;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::{Mutex, Once};
use std::time::{Duration, Instant};

pub fn knit() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_knit"))
}

/// A workspace binary installed beside `knit` (knit-agent, knit-local, …).
pub fn sibling(name: &str) -> PathBuf {
    let p = knit().with_file_name(name);
    assert!(
        p.is_file(),
        "{} is missing: build the workspace first (cargo build --workspace)",
        p.display()
    );
    p
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Whether `bin` is an executable file on `PATH`.
pub fn on_path(bin: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(bin).is_file()))
        .unwrap_or(false)
}

/// The last `n` lines of `s`.
/// The local addresses (`IP:PORT`) of the host's TCP listeners on `port`
/// (`ss -Hltn`, this network namespace).
pub fn listeners(port: &str) -> Vec<String> {
    output("ss", &["-Hltn"])
        .lines()
        .filter_map(|l| l.split_whitespace().nth(3))
        .filter(|a| a.rsplit_once(':').is_some_and(|(_, p)| p == port))
        .map(str::to_string)
        .collect()
}

pub fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Networks the suites choose from: bridge `knite<N>`, subnet
/// `10.216.<20+N>.0/24`. The bridge prefix holds a letter that is no hex
/// digit, so it never meets other suites' `kt<hex pid>` bridges.
const NETWORKS: u32 = 200;

/// A network slot held for the life of an `Env`: an abstract unix socket
/// named after the slot. The kernel lets one process bind a name at a time
/// and frees it when the process dies, so tests running at once (nextest
/// runs each in its own process) never pick the same bridge or subnet, and
/// a killed test leaves no stale lease behind.
struct NetworkLease {
    _socket: UnixListener,
    bridge: String,
    third: u32,
}

impl NetworkLease {
    fn take() -> NetworkLease {
        let routes = output("ip", &["-4", "route", "show", "table", "all"]);
        let links = output("ip", &["-o", "link", "show"]);
        // Start where this process's id points, so parallel tests seldom race.
        let start = std::process::id() % NETWORKS;
        for i in 0..NETWORKS {
            let n = (start + i) % NETWORKS;
            let bridge = format!("knite{n}");
            let third = 20 + n;
            // A bridge or route left by something else (another suite, a
            // crashed run): not ours to reuse.
            if routes.contains(&format!("10.216.{third}."))
                || links.contains(&format!(": {bridge}:"))
                || links.contains(&format!(": {bridge}@"))
            {
                continue;
            }
            let Ok(addr) = SocketAddr::from_abstract_name(format!("knit-e2e-net-{n}")) else {
                continue;
            };
            if let Ok(socket) = UnixListener::bind_addr(&addr) {
                return NetworkLease {
                    _socket: socket,
                    bridge,
                    third,
                };
            }
        }
        panic!("no free network: every 10.216.20-219.0/24 is in use");
    }
}

fn output(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{cmd} {args:?}: {e}"));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// What one `Env` holds on the host: enough to release it without the
/// `Env` itself (from the SIGTERM path).
#[derive(Clone)]
struct Holdings {
    dir: PathBuf,
    local: Config,
    /// Processes we started (server, registry), by PID.
    pids: Vec<u32>,
    /// iptables rules we inserted (the arguments after -D).
    firewall: Vec<Vec<String>>,
    /// The QEMU provider's VMs, with `provider("qemu")`.
    qemu: Option<knit_qemu::Config>,
}

/// The holdings of every live `Env` of this process, by id.
static LIVE: Mutex<BTreeMap<u64, Holdings>> = Mutex::new(BTreeMap::new());
static NEXT_ID: AtomicU64 = AtomicU64::new(0);
/// The write end of the pipe the SIGTERM handler wakes the releaser with.
static WAKE: AtomicI32 = AtomicI32::new(-1);

extern "C" fn on_sigterm(_: libc::c_int) {
    let fd = WAKE.load(Ordering::SeqCst);
    // SAFETY: write(2) is async-signal-safe; one byte from a static buffer.
    unsafe { libc::write(fd, b"x".as_ptr().cast(), 1) };
}

/// Once per process: on SIGTERM, release every live `Env`, then exit.
/// The handler only writes to a pipe; a thread does the work.
fn release_on_sigterm() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        let mut fds = [0; 2];
        // SAFETY: pipe(2) fills the two-element array.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0, "pipe");
        WAKE.store(fds[1], Ordering::SeqCst);
        std::thread::spawn(move || {
            let mut byte = 0u8;
            // SAFETY: read(2) into a one-byte buffer we own.
            unsafe { libc::read(fds[0], (&mut byte as *mut u8).cast(), 1) };
            eprintln!("SIGTERM: releasing what the test environment made");
            let live = LIVE.lock().map(|l| l.clone()).unwrap_or_default();
            for h in live.values() {
                // As on drop: a tree with something left in it stays.
                if release(h) {
                    let _ = std::fs::remove_dir_all(&h.dir);
                } else {
                    eprintln!("kept {} (not fully released)", h.dir.display());
                }
            }
            std::process::exit(143);
        });
        // SAFETY: the handler is async-signal-safe (see on_sigterm).
        unsafe {
            libc::signal(
                libc::SIGTERM,
                on_sigterm as extern "C" fn(libc::c_int) as libc::sighandler_t,
            )
        };
    });
}

/// Whether `pid` runs with `dir` on its command line (so a recycled PID is
/// never taken for ours).
fn runs_under(pid: u32, dir: &Path) -> bool {
    let dir = dir.to_string_lossy().into_owned();
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|raw| String::from_utf8_lossy(&raw).contains(&dir))
        .unwrap_or(false)
}

/// Ends our processes still running, deletes our firewall rules and
/// brings our local cloud down; whether everything was released.
fn release(h: &Holdings) -> bool {
    for pid in &h.pids {
        if runs_under(*pid, &h.dir) {
            // SAFETY: kill(2) on a process we started, checked just above.
            unsafe { libc::kill(*pid as i32, libc::SIGKILL) };
        }
    }
    for rule in &h.firewall {
        let _ = Command::new("iptables").arg("-D").args(rule).status();
    }
    let mut clean = true;
    // VMs first: their taps are ports of the local cloud's bridge.
    if let Some(q) = h.qemu.as_ref().filter(|q| q.state_dir.exists()) {
        match knit_qemu::Machines::open(q.clone()).and_then(|m| m.down()) {
            Ok(_) => {}
            Err(e) => {
                clean = false;
                eprintln!("VMs down: {e}");
            }
        }
    }
    if h.local.state_dir.exists() {
        match Cloud::open(h.local.clone()).map(|c| c.down()) {
            Ok(Ok(report)) if report.errors.is_empty() => {}
            Ok(Ok(report)) => {
                clean = false;
                eprintln!("local cloud down: {:?}", report.errors);
            }
            Ok(Err(e)) | Err(e) => {
                clean = false;
                eprintln!("local cloud down: {e}");
            }
        }
    }
    let mounts = mounts_under(&h.dir);
    if !mounts.is_empty() {
        clean = false;
        eprintln!("still mounted: {mounts:?}");
    }
    clean
}

/// Mount points under `dir`, in the host's view.
fn mounts_under(dir: &Path) -> Vec<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    info.lines()
        .filter_map(|l| l.split_whitespace().nth(4))
        .filter(|m| Path::new(m).starts_with(dir))
        .map(str::to_string)
        .collect()
}

/// What differs between the suites' environments.
#[derive(Default)]
pub struct EnvBuilder {
    cluster: bool,
    parallelism: Option<usize>,
    registry: bool,
    provider: Option<&'static str>,
    env: Vec<(OsString, OsString)>,
}

impl EnvBuilder {
    /// Serve the embedded cluster nodes join (default: none, nodes join no
    /// cluster).
    pub fn cluster(mut self, on: bool) -> Self {
        self.cluster = on;
        self
    }

    /// The server's `--parallelism` (default: the server's own).
    pub fn parallelism(mut self, n: usize) -> Self {
        self.parallelism = Some(n);
        self
    }

    /// Start a `docker-registry` with the server, on the bridge's address
    /// alone (the local cloud's network is made first, see
    /// [`Env::network_up`]): instances and the test reach it there
    /// ([`Env::registry_mirror`], [`Env::registry_push_url`]).
    pub fn registry(mut self, on: bool) -> Self {
        self.registry = on;
        self
    }

    /// The server's `--provider` (default: the local cloud). With `qemu`
    /// the VMs' state lives under this environment's directory and is
    /// brought down with it.
    pub fn provider(mut self, name: &'static str) -> Self {
        self.provider = Some(name);
        self
    }

    /// An environment variable for the server and every `knit` command.
    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    pub fn build(self) -> Env {
        assert!(
            is_root(),
            "this test needs root (it creates namespaces, loop devices and a bridge)"
        );
        ensure_node_image();
        let dir = tempfile::Builder::new()
            .prefix("knit-e2e-")
            .tempdir()
            .unwrap();
        let lease = NetworkLease::take();
        release_on_sigterm();
        let env = Env {
            id: NEXT_ID.fetch_add(1, Ordering::SeqCst),
            dir: Some(dir),
            bridge: lease.bridge.clone(),
            subnet: format!("10.216.{}.0/24", lease.third),
            gateway: format!("10.216.{}.1", lease.third),
            port: free_port(),
            cluster_port: self.cluster.then(free_port),
            server: None,
            up_pid: None,
            adopted: Vec::new(),
            registry: None,
            firewall: Vec::new(),
            opts: self,
            _lease: lease,
        };
        env.publish();
        env
    }
}

/// Instances run on the node image (pools' default `debian-12`, the local
/// cloud's default base root): built once, here if scripts/test.sh did not
/// (minutes; concurrent builds wait on its lock and find it built).
fn ensure_node_image() {
    static IMAGE: Once = Once::new();
    IMAGE.call_once(|| {
        let dir = knit_local::image::images_dir();
        if knit_local::image::current(&dir).unwrap().is_none() {
            knit_local::image::build(&dir, &mut |line| eprintln!("{line}"))
                .expect("knit image build");
        }
    });
}

/// One knit server, its local cloud and (optionally) a registry, under one
/// temporary directory.
pub struct Env {
    /// Its key in `LIVE`.
    id: u64,
    dir: Option<tempfile::TempDir>,
    pub bridge: String,
    pub subnet: String,
    /// The bridge's address: where instances reach the host.
    pub gateway: String,
    pub port: u16,
    /// The embedded cluster's port; `None`: nodes join no cluster.
    pub cluster_port: Option<u16>,
    server: Option<Child>,
    /// The server `knit up` started (not our child: it runs in its own
    /// session); ended by PID on drop if still running.
    up_pid: Option<u32>,
    /// Other processes a test's `knit` command started here (`knit up
    /// --ha`: PostgreSQL, servers, HAProxy), ended by PID on drop.
    adopted: Vec<u32>,
    registry: Option<Registry>,
    /// iptables rules to delete on drop (the arguments after -D).
    firewall: Vec<Vec<String>>,
    opts: EnvBuilder,
    _lease: NetworkLease,
}

impl Env {
    pub fn builder() -> EnvBuilder {
        EnvBuilder::default()
    }

    /// What this `Env` holds now.
    fn holdings(&self) -> Holdings {
        let pids = self
            .server
            .as_ref()
            .map(Child::id)
            .into_iter()
            .chain(self.up_pid)
            .chain(self.adopted.iter().copied())
            .chain(self.registry.iter().flat_map(Registry::pids))
            .collect();
        Holdings {
            dir: self.dir().to_path_buf(),
            local: self.local_config(),
            pids,
            firewall: self.firewall.clone(),
            qemu: (self.opts.provider == Some("qemu")).then(|| {
                let local = self.local_config();
                knit_qemu::Config {
                    state_dir: self.path("qemu"),
                    bridge: local.bridge,
                    subnet: local.subnet,
                    ..knit_qemu::Config::default()
                }
            }),
        }
    }

    /// Records what this `Env` holds now, for the SIGTERM path.
    fn publish(&self) {
        if let Ok(mut live) = LIVE.lock() {
            live.insert(self.id, self.holdings());
        }
    }

    pub fn dir(&self) -> &Path {
        self.dir.as_ref().map(|d| d.path()).unwrap_or(Path::new(""))
    }

    pub fn path(&self, p: &str) -> PathBuf {
        self.dir().join(p)
    }

    /// The server's state directory (`--state-dir`).
    pub fn state_dir(&self) -> PathBuf {
        self.path("server")
    }

    pub fn local_config(&self) -> Config {
        Config {
            state_dir: self.path("local"),
            bridge: self.bridge.clone(),
            subnet: self.subnet.clone(),
            metadata_port: 80,
            helper: Some(sibling("knit-local")),
        }
    }

    pub fn cloud(&self) -> Cloud {
        Cloud::open(self.local_config()).unwrap()
    }

    /// `knit` with this environment's client config and extra variables.
    pub fn cmd(&self) -> Command {
        let mut c = Command::new(knit());
        c.env("KNIT_CONFIG", self.path("config"));
        for (k, v) in &self.opts.env {
            c.env(k, v);
        }
        c
    }

    /// Sets (`None`: removes) an environment variable of the next server
    /// start and of every later `knit` command (e.g. another pause point
    /// after a restart).
    pub fn set_env(&mut self, key: &str, value: Option<&str>) {
        self.opts.env.retain(|(k, _)| k.as_os_str() != key);
        if let Some(v) = value {
            self.opts.env.push((key.into(), v.into()));
        }
    }

    /// Runs `knit args…`: (success, stdout, stderr).
    pub fn knit(&self, args: &[&str]) -> (bool, String, String) {
        let out = self.cmd().args(args).stdin(Stdio::null()).output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    }

    /// Runs `knit args…`, which must succeed: its stdout.
    pub fn knit_ok(&self, args: &[&str]) -> String {
        let (ok, out, err) = self.knit(args);
        assert!(
            ok,
            "knit {args:?} failed:\n{out}\n{err}\nserver log (tail):\n{}",
            self.server_log_tail()
        );
        out
    }

    pub fn json(&self, args: &[&str]) -> Value {
        let out = self.knit_ok(args);
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("knit {args:?}: {e}:\n{out}"))
    }

    pub fn server_log(&self) -> String {
        // `knit up` logs into the state directory.
        let path = match self.up_pid {
            Some(_) => self.state_dir().join("server.log"),
            None => self.path("server.log"),
        };
        std::fs::read_to_string(path).unwrap_or_default()
    }

    pub fn server_log_tail(&self) -> String {
        tail(&self.server_log(), 60)
    }

    /// `knit package build` into the server's state directory; `full`:
    /// with the container runtime (containerd, runc), which nodes need to
    /// get Ready.
    pub fn build_package(&self, full: bool) -> String {
        let state = self.state_dir();
        let mut args = vec!["package", "build", "--state-dir", state.to_str().unwrap()];
        if !full {
            args.push("--no-runtime");
        }
        self.knit_ok(&args)
    }

    /// Builds the package, then starts the server.
    pub fn start(&mut self, full_package: bool) {
        self.build_package(full_package);
        self.start_server();
    }

    /// Starts (or restarts) the server and waits until it answers; its
    /// output is appended to `server.log`, so a restart keeps the history.
    /// Starts the registry too when asked for and not yet running.
    pub fn start_server(&mut self) {
        assert!(self.server.is_none(), "the server is already running");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.path("server.log"))
            .unwrap();
        // A config from a previous run would answer for a dead server.
        let _ = std::fs::remove_file(self.path("config"));
        let mut cmd = self.cmd();
        cmd.args(["server", "--write-config", "--state-dir"])
            .arg(self.state_dir());
        match self.cluster_port {
            Some(p) => cmd.args(["--cluster", "embedded", "--cluster-port", &p.to_string()]),
            None => cmd.args(["--cluster", "none"]),
        };
        if let Some(n) = self.opts.parallelism {
            cmd.args(["--parallelism", &n.to_string()]);
        }
        if let Some(provider) = self.opts.provider {
            cmd.args(["--provider", provider]);
            cmd.env("KNIT_QEMU_STATE_DIR", self.path("qemu"));
        }
        let child = cmd
            .args([
                "--listen",
                &format!("0.0.0.0:{}", self.port),
                "--advertise-address",
                &self.gateway,
                "--local-bridge",
                &self.bridge,
                "--local-subnet",
                &self.subnet,
            ])
            .arg("--local-state-dir")
            .arg(self.path("local"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        self.server = Some(child);
        self.publish();
        let deadline = Instant::now() + Duration::from_secs(30);
        while !(self.path("config").exists() && self.knit(&["get", "clusters"]).0) {
            if let Some(Ok(Some(status))) = self.server.as_mut().map(Child::try_wait) {
                self.server = None;
                panic!("the server exited ({status}):\n{}", self.server_log_tail());
            }
            assert!(
                Instant::now() < deadline,
                "server did not start:\n{}",
                self.server_log_tail()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        if self.opts.registry && self.registry.is_none() {
            // Only where instances must reach it: the bridge's address.
            self.network_up();
            let addr = format!("{}:{}", self.gateway, free_port());
            let reg = Registry::start(&self.path("registry"), &addr)
                .unwrap_or_else(|e| panic!("docker-registry: {e}"));
            self.registry = Some(reg);
            self.publish();
        }
    }

    /// SIGKILL to the server this `Env` started (by PID), then reaped.
    pub fn kill_server(&mut self) {
        if let Some(mut child) = self.server.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if let Some(pid) = self.up_pid.take() {
            if self.runs_here(pid) {
                // SAFETY: kill has no memory preconditions; `pid` is the
                // server `knit up` started here, checked just above.
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
                // Not our child: init reaps it.
                let deadline = Instant::now() + Duration::from_secs(10);
                while self.runs_here(pid) && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
    }

    /// `knit up` with this environment's places (the server runs on in
    /// its own session); the package is built first if missing.
    pub fn up(&mut self) -> String {
        let up_running = self.up_pid.is_some_and(|pid| self.runs_here(pid));
        assert!(
            self.server.is_none() && !up_running,
            "the server is already running"
        );
        let state = self.state_dir();
        let local = self.path("local");
        let listen = format!("0.0.0.0:{}", self.port);
        let mut args = vec![
            "up",
            "--state-dir",
            state.to_str().unwrap(),
            "--listen",
            &listen,
            "--advertise-address",
            &self.gateway,
            "--local-state-dir",
            local.to_str().unwrap(),
            "--local-bridge",
            &self.bridge,
            "--local-subnet",
            &self.subnet,
        ];
        let cluster_port = self.cluster_port.map(|p| p.to_string());
        match &cluster_port {
            Some(p) => args.extend(["--cluster", "embedded", "--cluster-port", p]),
            None => args.extend(["--cluster", "none"]),
        }
        let parallelism = self.opts.parallelism.map(|n| n.to_string());
        if let Some(n) = &parallelism {
            args.extend(["--parallelism", n]);
        }
        let out = self.knit_ok(&args);
        let config = std::fs::read_to_string(self.path("config")).unwrap();
        let pid = config
            .lines()
            .find_map(|l| l.strip_prefix("pid:"))
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or_else(|| panic!("no server pid in the config:\n{config}"));
        self.up_pid = Some(pid);
        self.publish();
        out
    }

    /// Ends `pid` (a process a `knit` command started, with this
    /// environment's directory on its command line) with the rest on drop.
    pub fn adopt(&mut self, pid: u32) {
        if !self.adopted.contains(&pid) {
            self.adopted.push(pid);
            self.publish();
        }
    }

    /// The PID of the server `knit up` started, if any.
    pub fn up_pid(&self) -> Option<u32> {
        self.up_pid
    }

    /// Whether `pid` runs with this environment's directory on its
    /// command line (so a recycled PID is never taken for ours).
    pub fn runs_here(&self, pid: u32) -> bool {
        runs_under(pid, self.dir())
    }

    /// Processes whose command line names this environment's directory:
    /// servers, instances' init, the metadata server.
    pub fn processes_here(&self) -> Vec<(u32, String)> {
        let dir = self.dir().to_string_lossy().into_owned();
        let me = std::process::id();
        std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .filter(|pid| *pid != me)
            .filter_map(|pid| {
                let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
                let cmd = String::from_utf8_lossy(&raw).replace('\0', " ");
                cmd.contains(&dir).then_some((pid, cmd))
            })
            .collect()
    }

    /// Whether a network link of this name exists.
    pub fn link_exists(name: &str) -> bool {
        Command::new("ip")
            .args(["link", "show", "dev", name])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    }

    /// Loop devices whose backing file is under this environment's directory.
    pub fn loop_devices_here(&self) -> Vec<String> {
        let dir = self.dir().to_string_lossy().into_owned();
        output("losetup", &["-a"])
            .lines()
            .filter(|l| l.contains(&dir))
            .map(str::to_string)
            .collect()
    }

    /// The registry ([`EnvBuilder::registry`]), running once the server is.
    pub fn registry(&self) -> &Registry {
        self.registry
            .as_ref()
            .expect("no registry: Env::builder().registry(true), then start_server()")
    }

    fn registry_port(&self) -> &str {
        let addr = self.registry().addr();
        addr.rsplit_once(':').map_or(addr, |(_, port)| port)
    }

    /// Where the test itself pushes images: the registry's loopback
    /// writer (on the bridge's address it is pull-only).
    pub fn registry_push_url(&self) -> String {
        self.registry().push_url()
    }

    /// `knit local network-up` for this environment's local cloud: its
    /// bridge with the gateway address (and metadata server) before any
    /// instance, so that host services can listen on the bridge address
    /// alone. The local cloud's `down` (on drop) removes it.
    pub fn network_up(&self) {
        let out = self
            .cmd()
            .env("KNIT_LOCAL_STATE_DIR", self.path("local"))
            .env("KNIT_LOCAL_BRIDGE", &self.bridge)
            .env("KNIT_LOCAL_SUBNET", &self.subnet)
            .env("KNIT_LOCAL_METADATA_PORT", "80")
            .args(["local", "network-up"])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "knit local network-up: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(Env::link_exists(&self.bridge), "no bridge {}", self.bridge);
    }

    /// `host:port` instances reach the registry at (pool registry mirrors).
    pub fn registry_mirror(&self) -> String {
        format!("{}:{}", self.gateway, self.registry_port())
    }

    /// Inserts an iptables rule (the arguments after -I), deleted on drop.
    pub fn iptables_insert(&mut self, rule: Vec<String>) {
        let ok = Command::new("iptables")
            .arg("-I")
            .args(&rule)
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        assert!(ok, "iptables -I {rule:?} failed");
        self.firewall.push(rule);
        self.publish();
    }

    /// Writes `yaml` to `<name>.yaml` here and runs `knit create -f` on it.
    pub fn create(&self, name: &str, yaml: &str) -> String {
        let file = self.path(&format!("{name}.yaml"));
        std::fs::write(&file, yaml).unwrap();
        self.knit_ok(&["create", "-f", file.to_str().unwrap()])
    }

    /// `knit scale pool POOL --replicas N --wait` (300 s at most): its output.
    pub fn scale_wait(&self, pool: &str, replicas: u32) -> String {
        let replicas = replicas.to_string();
        self.knit_ok(&[
            "scale",
            "pool",
            pool,
            "--replicas",
            &replicas,
            "--wait",
            "--timeout",
            "300",
        ])
    }

    /// The store's instances (`knit get instances`).
    pub fn store_instances(&self) -> Vec<Value> {
        self.json(&["get", "instances", "-o", "json"])["items"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// knit names of the instances the local cloud holds, sorted.
    pub fn provider_names(&self) -> Vec<String> {
        let cloud = self.cloud();
        // A list racing a delete may see a half-removed instance: ask again.
        let list = (0..20)
            .find_map(|_| {
                cloud.list().ok().or_else(|| {
                    std::thread::sleep(Duration::from_millis(50));
                    None
                })
            })
            .expect("the local cloud's list kept failing");
        let mut names: Vec<String> = list
            .into_iter()
            .map(|i| {
                i.record
                    .template
                    .name
                    .clone()
                    .unwrap_or(i.record.id.clone())
            })
            .collect();
        names.sort();
        names
    }

    /// The nodes of `pool` (`knit get nodes`).
    pub fn nodes_of(&self, pool: &str) -> Vec<Value> {
        self.json(&["get", "nodes", "-o", "json"])["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|n| n["pool"] == pool)
            .cloned()
            .collect()
    }

    /// The pool `workers`.
    pub fn pool(&self) -> Value {
        self.json(&["get", "pools", "workers", "-o", "json"])
    }

    /// An existing instance, made directly at the local cloud (not by knit),
    /// once its own user data ran: its id.
    pub fn instance(&self, yaml: &str) -> String {
        let t = Template::parse(yaml).unwrap();
        let cloud = self.cloud();
        let i = cloud.create(&t).unwrap();
        cloud
            .wait_user_data(&i.record.id, Duration::from_secs(60))
            .unwrap();
        i.record.id
    }

    /// `bash -c script` inside instance `id`: (success, stdout + stderr).
    pub fn exec(&self, id: &str, script: &str) -> (bool, String) {
        let out = self
            .cloud()
            .exec(id, &["bash".into(), "-c".into(), script.into()])
            .unwrap();
        (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    }

    /// A file inside the instance knit named `name`.
    pub fn node_file(&self, name: &str, path: &str) -> String {
        let cloud = self.cloud();
        let inst = cloud
            .list()
            .unwrap()
            .into_iter()
            .find(|i| i.record.template.name.as_deref() == Some(name))
            .unwrap_or_else(|| panic!("no instance {name}"));
        let out = cloud
            .exec(&inst.record.id, &["cat".into(), path.into()])
            .unwrap();
        String::from_utf8_lossy(&out.stdout).to_string()
    }

    /// Mount points under this environment's directory, in the host's view.
    pub fn mounts_under_dir(&self) -> Vec<String> {
        mounts_under(self.dir())
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        // A failed assertion says what the test saw; the server's side of
        // it is in its log, which goes with the directory.
        if std::thread::panicking() {
            let log = self.server_log_tail();
            if !log.is_empty() {
                eprintln!("server log (tail):\n{log}");
            }
        }
        // Our children first, reaped; then the rest, as on SIGTERM.
        self.kill_server();
        if let Some(mut reg) = self.registry.take() {
            reg.stop();
        }
        if let Ok(mut live) = LIVE.lock() {
            live.remove(&self.id);
        }
        let clean = release(&self.holdings());
        // Removing a tree with something still mounted or attached in it
        // would reach into that: keep it for a look instead.
        if !clean {
            if let Some(dir) = self.dir.take() {
                eprintln!("kept {} (not fully released)", dir.keep().display());
            }
        }
    }
}
