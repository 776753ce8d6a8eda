//! `knit up --ha N` (N ≥ 2): PostgreSQL, N knit servers sharing it and
//! HAProxy in front of them, for one machine; and the part of `knit down`
//! that stops them (docs/ha.md). A child module of `server`: it starts the
//! servers with the same options `knit up` was given.
//!
//! Everything lives under `<state>/ha`:
//! - `postgres/` (the postgres user's when root): `data/`, `run/` (its
//!   socket directory), `postgres.log`;
//! - `postgres-admin.password`: the password of `knit_admin`, the
//!   superuser `up` sets PostgreSQL up with (0600, root's);
//! - `postgres.password`: the `knit` role's password (0600, root's), and
//!   `knit.pgpass`, the same in libpq's password-file format, which the
//!   servers' datastore URL names (`?passfile=`);
//! - `secrets.key`: the key that seals the secrets the servers share in
//!   PostgreSQL (0600, root's; made once per deployment, unless `up` is
//!   given `--secrets-key-file`);
//! - `ha.json`: PostgreSQL's port and the number of servers, kept across runs;
//! - `server-<i>/`: server i's state directory, `server.log` in it; its
//!   `mirror` is a link to `<state>/mirror`, built once, so every server
//!   serves the same bytes;
//! - `haproxy.cfg`, `haproxy.log`;
//! - `pids/<name>.pid`: written by each process itself before it execs its
//!   program, so `knit down` finds everything `up` started even after `up`
//!   crashed half-way.
//!
//! Every server listens on the same ports as HAProxy, on an address of its
//! own (`127.0.2.<i>`): a server advertises its own port to nodes, so
//! HAProxy must hold the ports the servers advertise (the advertised host
//! is HAProxy's, the gateway by default).

use super::{gateway, is_our_server, listen_addrs, local_config, ServerOpts};
use crate::commands::config_path;
use crate::error::{io, CliError, Result};
use clap::Args;
use knit_client::{Client, ClientConfig};
use std::ffi::CString;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

/// The most servers `--ha` starts (their addresses are 127.0.2.1 … .N).
pub const MAX_SERVERS: u32 = 9;
/// How long a server, PostgreSQL or HAProxy may take to answer after start.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// PostgreSQL's superuser, for setting PostgreSQL up only; the servers
/// connect as `knit`, which is not one.
const ADMIN_ROLE: &str = "knit_admin";
/// How long each may take to stop after its signal.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Args, Clone)]
pub struct UpArgs {
    #[command(flatten)]
    pub opts: ServerOpts,
    /// Run N servers (N ≥ 2) on one PostgreSQL, behind HAProxy on the
    /// API and Kubernetes API ports (docs/ha.md); 1 or absent: one server
    /// on SQLite.
    #[arg(long, value_name = "N")]
    pub ha: Option<u32>,
}

/// What went wrong bringing up or stopping one part of the HA set.
#[derive(Debug, thiserror::Error)]
pub enum HaError {
    #[error("PostgreSQL: {0}")]
    Postgres(String),
    #[error("knit server {index}: {message}")]
    Server { index: u32, message: String },
    #[error("HAProxy: {0}")]
    Proxy(String),
}

impl HaError {
    pub fn code(&self) -> &'static str {
        match self {
            HaError::Postgres(_) => "HaPostgres",
            HaError::Server { .. } => "HaServer",
            HaError::Proxy(_) => "HaProxy",
        }
    }
}

/// `knit up`: one server, or the HA set with `--ha N`, N ≥ 2.
pub fn up(cli_config: &Option<PathBuf>, args: UpArgs) -> Result<ExitCode> {
    let n = args.ha.unwrap_or(1);
    let layout = Layout::new(&args.opts.state_dir);
    if n <= 1 {
        if args.ha == Some(0) {
            return Err(CliError::Usage(
                "--ha 0: the number of servers must be at least 1 (2 or more for high availability)".into(),
            ));
        }
        let running = layout.running();
        if !running.is_empty() {
            return Err(CliError::Failed(format!(
                "{} already runs the HA set started by `knit up --ha` ({}); `knit down` stops it",
                args.opts.state_dir.display(),
                describe(&running)
            )));
        }
        // Records of an HA set whose processes are all gone: `knit down`
        // would take this single server for it.
        layout.clear_records();
        return super::up(cli_config, args.opts);
    }
    if n > MAX_SERVERS {
        return Err(CliError::Usage(format!(
            "--ha {n}: at most {MAX_SERVERS} servers on one machine"
        )));
    }
    up_ha(cli_config, &args.opts, n)
}

/// Whether `state_dir` holds an HA set: `knit up --ha` recorded processes
/// there that `knit down` has not stopped (running or not).
pub fn present(state_dir: &Path) -> bool {
    !Layout::new(state_dir).pid_files().is_empty()
}

/// Whether any knit server of the HA set in `state_dir` runs.
pub fn any_server_running(state_dir: &Path) -> bool {
    Layout::new(state_dir)
        .running()
        .iter()
        .any(|p| p.name.starts_with("server-"))
}

/// Stops every process `knit up --ha` started in `state_dir` (recorded
/// PIDs, checked against their command lines): the servers first, then
/// HAProxy, then PostgreSQL (its data stays for the next `up`).
pub fn stop(state_dir: &Path) -> Result<()> {
    let layout = Layout::new(state_dir);
    let running = layout.running();
    let (servers, rest): (Vec<_>, Vec<_>) = running
        .into_iter()
        .partition(|p| p.name.starts_with("server-"));
    stop_group(&layout, &servers, libc::SIGTERM)?;
    let (postgres, proxy): (Vec<_>, Vec<_>) = rest.into_iter().partition(|p| p.name == "postgres");
    stop_group(&layout, &proxy, libc::SIGTERM)?;
    // SIGINT: PostgreSQL's fast shutdown (ends sessions, checkpoints).
    stop_group(&layout, &postgres, libc::SIGINT)?;
    // The records of processes that had died before.
    layout.clear_records();
    Ok(())
}

/// Sends `signal` to each process, then waits for all of them; a process
/// that outlives the wait is an error naming it (nothing after it is
/// stopped: the servers must not outlive the database under them).
fn stop_group(layout: &Layout, procs: &[Running], signal: i32) -> Result<()> {
    for p in procs {
        // SAFETY: kill(2); `p.pid` ran our program with our paths a moment ago.
        unsafe { libc::kill(p.pid as i32, signal) };
    }
    let deadline = Instant::now() + STOP_TIMEOUT;
    for p in procs {
        while layout.is_ours(p) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        if layout.is_ours(p) {
            return Err(CliError::Failed(format!(
                "{} (pid {}) did not stop within {} s; nothing after it was stopped",
                p.what(),
                p.pid,
                STOP_TIMEOUT.as_secs()
            )));
        }
        let _ = std::fs::remove_file(layout.pid_file(&p.name));
        println!("{} (pid {}) stopped", p.what(), p.pid);
    }
    Ok(())
}

fn describe(procs: &[Running]) -> String {
    procs
        .iter()
        .map(|p| format!("{} pid {}", p.what(), p.pid))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Where the HA set keeps its parts.
struct Layout {
    state_dir: PathBuf,
    root: PathBuf,
}

/// A process the HA set started that still runs.
struct Running {
    name: String,
    pid: u32,
}

impl Running {
    fn what(&self) -> String {
        match self.name.as_str() {
            "postgres" => "PostgreSQL".into(),
            "haproxy" => "HAProxy".into(),
            other => format!("knit {}", other.replace('-', " ")),
        }
    }
}

#[derive(serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Recorded {
    postgres_port: u16,
}

impl Layout {
    fn new(state_dir: &Path) -> Layout {
        Layout {
            state_dir: state_dir.to_path_buf(),
            root: state_dir.join("ha"),
        }
    }
    fn postgres_dir(&self) -> PathBuf {
        self.root.join("postgres")
    }
    fn postgres_data(&self) -> PathBuf {
        self.postgres_dir().join("data")
    }
    fn password_file(&self) -> PathBuf {
        self.root.join("postgres.password")
    }
    fn admin_password_file(&self) -> PathBuf {
        self.root.join("postgres-admin.password")
    }
    fn pgpass_file(&self) -> PathBuf {
        self.root.join("knit.pgpass")
    }
    fn secrets_key_file(&self) -> PathBuf {
        self.root.join("secrets.key")
    }
    fn recorded_file(&self) -> PathBuf {
        self.root.join("ha.json")
    }
    fn server_dir(&self, i: u32) -> PathBuf {
        self.root.join(format!("server-{i}"))
    }
    fn haproxy_cfg(&self) -> PathBuf {
        self.root.join("haproxy.cfg")
    }
    fn pid_file(&self, name: &str) -> PathBuf {
        self.root.join("pids").join(format!("{name}.pid"))
    }

    /// The argument that marks process `name` as ours on its command line.
    fn marker(&self, name: &str) -> PathBuf {
        match name {
            "postgres" => self.postgres_data(),
            "haproxy" => self.haproxy_cfg(),
            server => self.root.join(server),
        }
    }

    /// Whether `p` still runs our program (not a recycled PID, not a zombie).
    fn is_ours(&self, p: &Running) -> bool {
        runs_with_arg(p.pid, &self.marker(&p.name))
    }

    /// The pid files: (process name, path).
    fn pid_files(&self) -> Vec<(String, PathBuf)> {
        std::fs::read_dir(self.root.join("pids"))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let file = e.file_name().to_str()?.to_string();
                Some((file.strip_suffix(".pid")?.to_string(), e.path()))
            })
            .collect()
    }

    /// Removes every pid file (their processes are gone).
    fn clear_records(&self) {
        for (_, path) in self.pid_files() {
            let _ = std::fs::remove_file(path);
        }
    }

    /// The recorded processes that still run, by their pid files.
    fn running(&self) -> Vec<Running> {
        let mut out: Vec<Running> = self
            .pid_files()
            .into_iter()
            .filter_map(|(name, path)| {
                let pid = std::fs::read_to_string(path).ok()?.trim().parse().ok()?;
                let p = Running { name, pid };
                self.is_ours(&p).then_some(p)
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    fn running_one(&self, name: &str) -> Option<u32> {
        let pid = std::fs::read_to_string(self.pid_file(name))
            .ok()?
            .trim()
            .parse()
            .ok()?;
        self.is_ours(&Running {
            name: name.to_string(),
            pid,
        })
        .then_some(pid)
    }
}

/// Whether `pid`'s command line has `arg` as one of its arguments.
fn runs_with_arg(pid: u32, arg: &Path) -> bool {
    let want = arg.as_os_str().as_bytes();
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|raw| raw.split(|b| *b == 0).any(|a| a == want))
        .unwrap_or(false)
}

/// Server i's own address: HAProxy holds the ports on the addresses
/// clients and nodes use.
fn server_ip(i: u32) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 2, i as u8))
}

/// What the HA set listens on and advertises, from `knit up`'s options.
struct Plan {
    n: u32,
    /// HAProxy's addresses (on `port` and `cluster_port`).
    front: Vec<IpAddr>,
    port: u16,
    cluster_port: Option<u16>,
    /// The host nodes reach HAProxy at.
    advertise: String,
    /// The URL a CLI on this machine uses (HAProxy).
    client_url: String,
    console_port: Option<u16>,
}

fn plan(opts: &ServerOpts, n: u32) -> Result<Plan> {
    if opts.datastore.trim() != "sqlite" {
        return Err(CliError::Usage(format!(
            "--datastore {} (or KNIT_DATASTORE): knit up --ha runs a PostgreSQL of its own for its servers; to use yours, run `knit server --datastore postgres://…` on each machine (docs/ha.md)",
            knit_db::Datastore::parse(&opts.datastore, Path::new("knit.db"))
                .map(|d| d.redacted())
                .unwrap_or_else(|_| "(not shown)".into())
        )));
    }
    if opts.lease_ttl < 3 {
        return Err(CliError::Usage(format!(
            "--lease-ttl {}: must be at least 3 seconds (the lease is renewed every third of it)",
            opts.lease_ttl
        )));
    }
    let addrs = listen_addrs(opts)?;
    let port = addrs[0].port();
    if port == 0 {
        return Err(CliError::Usage(
            "--listen: knit up --ha needs a fixed port".into(),
        ));
    }
    if let Some(a) = addrs.iter().find(|a| a.ip().is_unspecified()) {
        return Err(CliError::Usage(format!(
            "--listen {a}: with --ha, HAProxy holds the port on the addresses clients and nodes use and each server holds it on an address of its own, so it cannot listen on every address; name them (e.g. 127.0.0.1:{port},10.213.0.1:{port})"
        )));
    }
    if let Some(a) = addrs.iter().find(|a| !a.ip().is_ipv4()) {
        return Err(CliError::Usage(format!(
            "--listen {a}: with --ha only IPv4 addresses are supported"
        )));
    }
    let front: Vec<IpAddr> = addrs.iter().map(SocketAddr::ip).collect();
    let gw = gateway(opts)?;
    let advertise = match (&opts.advertise_address, gw) {
        (Some(a), _) => a.clone(),
        (None, Some(g)) if front.contains(&g) => g.to_string(),
        _ => front[0].to_string(),
    };
    let loopback = front
        .iter()
        .find(|ip| ip.is_loopback())
        .copied()
        .unwrap_or(front[0]);
    let cluster_port = (opts.cluster == "embedded").then_some(opts.cluster_port);
    if cluster_port == Some(port) {
        return Err(CliError::Usage(format!(
            "--cluster-port {port}: the same port as the API"
        )));
    }
    let console_port = match opts.console_listen.as_deref().map(str::trim) {
        Some("off") => None,
        Some(text) => Some(
            text.parse::<SocketAddr>()
                .map_err(|_| {
                    CliError::Usage(format!(
                        "--console-listen {text:?}: must be ADDRESS:PORT or off"
                    ))
                })?
                .port(),
        ),
        None => Some(knit_server::control::DEFAULT_CONSOLE_PORT),
    };
    Ok(Plan {
        n,
        front,
        port,
        cluster_port,
        advertise,
        client_url: format!("https://{loopback}:{port}"),
        console_port,
    })
}

fn up_ha(cli_config: &Option<PathBuf>, opts: &ServerOpts, n: u32) -> Result<ExitCode> {
    let path = config_path(cli_config)?;
    if let Ok(existing) = ClientConfig::load(&path) {
        if let Some(pid) = existing.pid.filter(|p| is_our_server(*p)) {
            return Err(CliError::Failed(format!(
                "a single knit server is running (pid {pid}, config {}); `knit down` stops it before `knit up --ha`",
                path.display()
            )));
        }
    }
    let plan = plan(opts, n)?;
    // What --ha runs is checked before anything starts, not half-way.
    postgres_bindir()?;
    haproxy_bin()?;
    let layout = Layout::new(&opts.state_dir);
    let result = bring_up(&path, opts, &plan, &layout);
    if result.is_err() {
        let running = layout.running();
        if !running.is_empty() {
            eprintln!(
                "started so far: {}; `knit up --ha {n}` again starts what is missing, `knit down --keep-instances` stops them",
                describe(&running)
            );
        }
    }
    result
}

fn bring_up(path: &Path, opts: &ServerOpts, plan: &Plan, layout: &Layout) -> Result<ExitCode> {
    let n = plan.n;
    // Until the servers made the CA and token: a config that names the
    // state directory, so `knit down` finds what a failed `up` started
    // (one of an earlier `up --ha` here is kept).
    let ours = opts.state_dir.display().to_string();
    let complete = ClientConfig::load(path)
        .is_ok_and(|c| c.state_dir.as_deref() == Some(ours.as_str()) && !c.token.is_empty());
    if !complete {
        ClientConfig {
            server: plan.client_url.clone(),
            token: String::new(),
            ca_cert: String::new(),
            state_dir: Some(ours),
            pid: None,
        }
        .save(path)?;
    }
    for d in [&layout.state_dir, &layout.root, &layout.root.join("pids")] {
        std::fs::create_dir_all(d).map_err(io(format!("create {}", d.display())))?;
    }
    // Before anything runs: `knit down` removes the clouds it made.
    super::clouds::record(&opts.state_dir, &opts.provider, &local_config(opts))?;
    super::ensure_mirror(opts)?;
    // HAProxy listens on the gateway: the bridge that holds it first.
    if let Some(g) = gateway(opts)?.filter(|g| plan.front.contains(g)) {
        knit_local::Cloud::open(local_config(opts))
            .and_then(|c| c.network_up())
            .map_err(|e| {
                CliError::Failed(format!(
                    "the local cloud's network ({} on {}), needed to listen on {g}: {e}",
                    opts.local_bridge, opts.local_subnet
                ))
            })?;
    }
    let datastore = postgres_up(layout, n)?;
    let key = secrets_key(opts, layout)?;
    for i in 1..=n {
        server_up(layout, opts, plan, i, &datastore, &key)?;
    }
    proxy_up(layout, plan)?;
    // The client config: HAProxy's address, the servers' shared CA and token.
    let first = layout.server_dir(1);
    let config = ClientConfig {
        server: plan.client_url.clone(),
        token: read_trimmed(&first.join("admin-token"))?,
        ca_cert: read_trimmed(&first.join("pki/ca.pem"))? + "\n",
        state_dir: Some(opts.state_dir.display().to_string()),
        pid: None,
    };
    let client = Client::new(&config)?;
    let deadline = Instant::now() + START_TIMEOUT;
    while !client.healthy() {
        if Instant::now() > deadline {
            return Err(HaError::Proxy(format!(
                "{} did not answer through HAProxy within {} s; see {}",
                plan.client_url,
                START_TIMEOUT.as_secs(),
                layout.root.join("haproxy.log").display()
            ))
            .into());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    config.save(path)?;
    println!(
        "{n} knit servers behind HAProxy at {} (nodes use https://{}:{}); config {}",
        plan.client_url,
        plan.advertise,
        plan.port,
        path.display()
    );
    if plan.cluster_port.is_some() {
        println!(
            "admin kubeconfig {}",
            first.join("cluster/admin.kubeconfig").display()
        );
    }
    println!("logs: {}/server-*/server.log, {}/haproxy.log, {}/postgres.log; `knit get servers` lists them; `knit down` stops them",
        layout.root.display(), layout.root.display(), layout.postgres_dir().display());
    Ok(ExitCode::SUCCESS)
}

/// The key that seals the secrets the servers share: `--secrets-key-file`
/// when `up` was given one, else the deployment's own, made at the first
/// `up` (0600) and kept.
fn secrets_key(opts: &ServerOpts, layout: &Layout) -> Result<PathBuf> {
    if let Some(path) = &opts.secrets_key_file {
        return Ok(path.clone());
    }
    let path = layout.secrets_key_file();
    if !path.exists() {
        let text =
            knit_server::sealed::new_key_text().map_err(|e| CliError::Failed(e.to_string()))?;
        knit_server::durable::write(&path, text.as_bytes(), 0o600)?;
        println!(
            "secrets key made: {} (0600; every server gets it)",
            path.display()
        );
    }
    // Checked here (mode, size) so a bad file stops `up` before any server.
    knit_server::sealed::SecretsKey::load(&path).map_err(|e| CliError::Failed(e.to_string()))?;
    Ok(path)
}

fn read_trimmed(path: &Path) -> Result<String> {
    Ok(std::fs::read_to_string(path)
        .map_err(io(format!("read {}", path.display())))?
        .trim()
        .to_string())
}

/// Starts `cmd` in a session of its own (it outlives `knit up`); the child
/// writes its PID to `pid_file` before it execs, then becomes `user` when
/// given, so the PID is on disk before the program runs.
fn spawn_recorded(cmd: &mut Command, pid_file: &Path, user: Option<(u32, u32)>) -> Result<Child> {
    let path = CString::new(pid_file.as_os_str().as_bytes())
        .map_err(|_| CliError::Failed(format!("{}: a NUL in the path", pid_file.display())))?;
    // SAFETY: the closure runs in the forked child before exec and only
    // makes system calls on memory it owns (no allocation).
    unsafe {
        cmd.pre_exec(move || {
            libc::setsid();
            let mut digits = [0u8; 12];
            let mut pid = libc::getpid() as u32;
            let mut at = digits.len() - 1;
            digits[at] = b'\n';
            loop {
                at -= 1;
                digits[at] = b'0' + (pid % 10) as u8;
                pid /= 10;
                if pid == 0 {
                    break;
                }
            }
            let fd = libc::open(
                path.as_ptr(),
                libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_CLOEXEC,
                0o600,
            );
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let len = digits.len() - at;
            let wrote = libc::write(fd, digits[at..].as_ptr().cast(), len);
            let synced = libc::fsync(fd);
            libc::close(fd);
            if wrote != len as isize || synced != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if let Some((uid, gid)) = user {
                if libc::setgroups(0, std::ptr::null()) != 0
                    || libc::setgid(gid) != 0
                    || libc::setuid(uid) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    cmd.stdin(Stdio::null())
        .spawn()
        .map_err(io(format!("start {:?}", cmd.get_program())))
}

/// The uid/gid PostgreSQL runs as: `postgres` when we are root (it
/// refuses to run as root); `None` otherwise (it runs as us).
fn postgres_user() -> Result<Option<(u32, u32)>> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(None);
    }
    let name = CString::new("postgres").map_err(|e| CliError::Failed(e.to_string()))?;
    // SAFETY: getpwnam reads a static entry, copied out at once.
    let pw = unsafe { libc::getpwnam(name.as_ptr()) };
    if pw.is_null() {
        return Err(HaError::Postgres(
            "no `postgres` user: install Debian's postgresql package (scripts/setup.sh --ha)"
                .into(),
        )
        .into());
    }
    // SAFETY: non-null entry from getpwnam.
    Ok(Some(unsafe { ((*pw).pw_uid, (*pw).pw_gid) }))
}

/// The directory of `initdb` and `postgres`: `KNIT_PG_BINDIR`, else the
/// newest version under /usr/lib/postgresql (Debian's layout).
fn postgres_bindir() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("KNIT_PG_BINDIR") {
        return Ok(PathBuf::from(dir));
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let v: u32 = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("postgres").is_file().then_some((v, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, p)| p).ok_or_else(|| {
        HaError::Postgres(
            "no server binaries under /usr/lib/postgresql: install Debian's postgresql package (scripts/setup.sh --ha), or set KNIT_PG_BINDIR".into(),
        )
        .into()
    })
}

fn free_loopback_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(io("find a free loopback port"))?
        .port())
}

/// PostgreSQL for the HA set: initdb once (the superuser `knit_admin`, a
/// password kept in a root-only file, password authentication), then
/// started on its own loopback port, as the postgres user when root;
/// reused when it already runs. The servers' role `knit` owns database
/// `knit` and nothing more (no SUPERUSER, CREATEDB, CREATEROLE). Returns
/// the datastore URL, which names the password file (`passfile=`).
fn postgres_up(layout: &Layout, n: u32) -> Result<String> {
    let bin = postgres_bindir()?;
    let user = postgres_user()?;
    let dir = layout.postgres_dir();
    let data = layout.postgres_data();
    let run = dir.join("run");
    let pg = |m: String| CliError::from(HaError::Postgres(m));
    for d in [&dir, &run] {
        std::fs::create_dir_all(d).map_err(io(format!("create {}", d.display())))?;
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o700))
            .map_err(io(format!("chmod {}", d.display())))?;
        if let Some((uid, gid)) = user {
            std::os::unix::fs::chown(d, Some(uid), Some(gid))
                .map_err(io(format!("chown {}", d.display())))?;
        }
    }
    if user.is_some() {
        // The postgres user must pass through the state directory to its
        // own: search (x) only, nothing listed or read.
        for d in [&layout.state_dir, &layout.root] {
            let mode = std::fs::metadata(d)
                .map_err(io(format!("stat {}", d.display())))?
                .permissions()
                .mode();
            if mode & 0o001 == 0 {
                std::fs::set_permissions(d, std::fs::Permissions::from_mode(mode | 0o011))
                    .map_err(io(format!("chmod {}", d.display())))?;
            }
        }
    }
    let password = knit_server::pki::load_or_create_token(&layout.password_file())?;
    let admin_password = knit_server::pki::load_or_create_token(&layout.admin_password_file())?;
    let mut recorded: Option<Recorded> = std::fs::read(layout.recorded_file())
        .ok()
        .and_then(|raw| serde_json::from_slice(&raw).ok());
    if !data.join("PG_VERSION").is_file() {
        println!("PostgreSQL: initdb {} ({})", data.display(), bin.display());
        // A data directory an interrupted initdb left: initdb wants it empty.
        if data.exists() {
            std::fs::remove_dir_all(&data).map_err(io(format!("remove {}", data.display())))?;
        }
        let pwfile = dir.join("initdb.pw");
        std::fs::write(&pwfile, format!("{admin_password}\n"))
            .and_then(|_| std::fs::set_permissions(&pwfile, std::fs::Permissions::from_mode(0o600)))
            .map_err(io(format!("write {}", pwfile.display())))?;
        if let Some((uid, gid)) = user {
            std::os::unix::fs::chown(&pwfile, Some(uid), Some(gid))
                .map_err(io(format!("chown {}", pwfile.display())))?;
        }
        let mut initdb = Command::new(bin.join("initdb"));
        initdb
            .arg("-D")
            .arg(&data)
            .args([
                "-U",
                ADMIN_ROLE,
                "--auth-host=scram-sha-256",
                "--auth-local=scram-sha-256",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-instructions",
            ])
            .arg(format!("--pwfile={}", pwfile.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if let Some((uid, gid)) = user {
            initdb.uid(uid).gid(gid);
        }
        let out = run_bounded(&mut initdb, Duration::from_secs(120));
        let _ = std::fs::remove_file(&pwfile);
        let out = out.map_err(|e| pg(format!("initdb: {e}")))?;
        if !out.status.success() {
            return Err(pg(format!(
                "initdb failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
    }
    let port = match &recorded {
        Some(r) => r.postgres_port,
        None => {
            let r = Recorded {
                postgres_port: free_loopback_port()?,
            };
            let raw = serde_json::to_vec_pretty(&r).map_err(|e| CliError::Failed(e.to_string()))?;
            knit_server::durable::write(&layout.recorded_file(), &raw, 0o600)?;
            let port = r.postgres_port;
            recorded = Some(r);
            port
        }
    };
    let _ = recorded;
    let url = |db: &str| format!("postgres://{ADMIN_ROLE}:{admin_password}@127.0.0.1:{port}/{db}");
    // A data directory an older `up` made: its superuser is `knit`.
    let legacy_url = format!("postgres://knit:{password}@127.0.0.1:{port}/postgres");
    let log_path = dir.join("postgres.log");
    if let Some(pid) = layout.running_one("postgres") {
        println!("PostgreSQL already running (pid {pid}) on 127.0.0.1:{port}");
    } else {
        let log = append_log(&log_path)?;
        // Each server holds a pool of connections, its embedded cluster another.
        let max_connections = (40 * n + 20).max(100);
        let mut server = Command::new(bin.join("postgres"));
        server
            .arg("-D")
            .arg(&data)
            .args(["-p", &port.to_string(), "-k"])
            .arg(&run)
            .args(["-c", "listen_addresses=127.0.0.1"])
            .args(["-c", &format!("max_connections={max_connections}")])
            .stdout(log.try_clone().map_err(io("dup log"))?)
            .stderr(log);
        let mut child = spawn_recorded(&mut server, &layout.pid_file("postgres"), user)?;
        let pid = child.id();
        println!(
            "PostgreSQL (pid {pid}) starting on 127.0.0.1:{port}; data {}; log {}",
            data.display(),
            log_path.display()
        );
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(pg(format!(
                    "exited ({status}) at start; see {}",
                    log_path.display()
                )));
            }
            if open_db(&url("postgres")).is_ok() || open_db(&legacy_url).is_ok() {
                break;
            }
            if Instant::now() > deadline {
                return Err(pg(format!(
                    "did not accept connections within {} s (pid {pid} left running for `knit down`); see {}",
                    START_TIMEOUT.as_secs(),
                    log_path.display()
                )));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    let admin = admin_connection(&url("postgres"), &legacy_url, &admin_password)?;
    // A `knit` that is a superuser (made by an older `up` as initdb's own
    // role): renamed out of the way, and a plain `knit` made in its place.
    if knit_db::roles::retire_superuser(&admin, "knit", "knit_bootstrap")
        .map_err(|e| pg(format!("retire the superuser knit: {e}")))?
    {
        println!("PostgreSQL: the superuser role knit of an older `up` renamed knit_bootstrap (no login); knit is made again without SUPERUSER");
    }
    knit_db::roles::ensure_owner(&admin, "knit", &password, "knit")
        .map_err(|e| pg(format!("knit's role and database: {e}")))?;
    let admin_on_knit = open_db(&url("knit")).map_err(|e| pg(format!("connect: {e}")))?;
    knit_db::roles::give_objects(&admin_on_knit, "knit")
        .map_err(|e| pg(format!("give knit's tables to its role: {e}")))?;
    // The servers read the password from this file (libpq's format), so
    // it is in no URL, command line or environment.
    let pgpass = layout.pgpass_file();
    knit_server::durable::write(
        &pgpass,
        format!("127.0.0.1:{port}:knit:knit:{password}\n").as_bytes(),
        0o600,
    )?;
    Ok(format!(
        "postgres://knit@127.0.0.1:{port}/knit?sslmode=disable&passfile={}",
        url_encoded(&pgpass)
    ))
}

/// A path as a URL query value: bytes other than letters, digits and
/// `/._-` percent-encoded.
fn url_encoded(path: &Path) -> String {
    path.as_os_str()
        .as_bytes()
        .iter()
        .map(|&b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'/' | b'.' | b'_' | b'-' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The administrative connection: as `knit_admin`, or, on a data directory
/// an older `up` made (whose superuser is `knit`), as `knit` once to make
/// `knit_admin`.
fn admin_connection(
    admin_url: &str,
    legacy_url: &str,
    admin_password: &str,
) -> Result<knit_db::Db> {
    let pg = |m: String| CliError::from(HaError::Postgres(m));
    let first = match open_db(admin_url) {
        Ok(db) => return Ok(db),
        Err(e) => e,
    };
    let Ok(legacy) = open_db(legacy_url) else {
        return Err(pg(format!("connect as {ADMIN_ROLE}: {first}")));
    };
    knit_db::roles::ensure_admin(&legacy, ADMIN_ROLE, admin_password)
        .map_err(|e| pg(format!("create role {ADMIN_ROLE}: {e}")))?;
    println!("PostgreSQL: administrative role {ADMIN_ROLE} made");
    open_db(admin_url).map_err(|e| pg(format!("connect as {ADMIN_ROLE}: {e}")))
}

fn open_db(url: &str) -> std::result::Result<knit_db::Db, knit_db::DbError> {
    knit_db::Db::open(
        &knit_db::Datastore::Postgres(url.to_string()),
        knit_db::Limits::default(),
    )
}

/// Runs `cmd` to completion within `limit` (killed past it).
fn run_bounded(cmd: &mut Command, limit: Duration) -> std::io::Result<std::process::Output> {
    let mut child = cmd.spawn()?;
    let deadline = Instant::now() + limit;
    loop {
        if child.try_wait()?.is_some() {
            return child.wait_with_output();
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("still running after {} s", limit.as_secs()),
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn append_log(path: &Path) -> Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(io(format!("open {}", path.display())))
}

/// Copies `from` to `to` when `to` is missing (0600).
fn copy_missing(from: &Path, to: &Path) -> Result<()> {
    if to.exists() || !from.exists() {
        return Ok(());
    }
    let data = std::fs::read(from).map_err(io(format!("read {}", from.display())))?;
    if let Some(parent) = to.parent() {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(parent)
            .map_err(io(format!("create {}", parent.display())))?;
    }
    knit_server::durable::write(to, &data, 0o600)?;
    Ok(())
}

/// Server i: its state directory, the shared mirror, server 1's cluster
/// CA, then started with the datastore in its environment and waited for.
fn server_up(
    layout: &Layout,
    opts: &ServerOpts,
    plan: &Plan,
    i: u32,
    datastore: &str,
    secrets_key: &Path,
) -> Result<()> {
    let srv = |message: String| CliError::from(HaError::Server { index: i, message });
    let dir = layout.server_dir(i);
    std::fs::create_dir_all(&dir).map_err(io(format!("create {}", dir.display())))?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
        .map_err(io(format!("chmod {}", dir.display())))?;
    let mirror = dir.join("mirror");
    if std::fs::symlink_metadata(&mirror).is_err() {
        std::os::unix::fs::symlink(opts.state_dir.join("mirror"), &mirror)
            .map_err(io(format!("link {}", mirror.display())))?;
    }
    // The API's CA and the admin token come from the datastore (the
    // first server to start stores its own). The embedded Kubernetes
    // API's CA is its own, in its data directory: server 1's, copied
    // before the others' first start, so that every server presents the
    // same CA to nodes and accepts the client certificates any of them
    // signed.
    if i > 1 {
        let first = layout.server_dir(1);
        for f in ["cluster/pki/ca.crt", "cluster/pki/ca.key"] {
            copy_missing(&first.join(f), &dir.join(f))?;
        }
    }
    let ip = server_ip(i);
    let url = format!("https://{ip}:{}", plan.port);
    let name = format!("server-{i}");
    let log_path = dir.join("server.log");
    let mut child = None;
    if let Some(pid) = layout.running_one(&name) {
        println!("knit server {i} already running (pid {pid}) at {url}");
    } else {
        let log = append_log(&log_path)?;
        let exe = std::env::current_exe().map_err(io("find the knit executable"))?;
        let mut cmd = Command::new(exe);
        cmd.arg("server")
            .arg("--state-dir")
            .arg(&dir)
            .args(["--listen", &format!("{ip}:{}", plan.port)])
            .args(["--advertise-address", &plan.advertise])
            .args(["--provider", &opts.provider])
            .args(["--cluster", &opts.cluster])
            .args(["--cluster-port", &opts.cluster_port.to_string()])
            .args(["--parallelism", &opts.parallelism.to_string()])
            .args(["--lease-ttl", &opts.lease_ttl.to_string()])
            .arg("--secrets-key-file")
            .arg(secrets_key)
            .args(["--join-token-ttl", &opts.join_token_ttl.to_string()])
            .arg("--local-state-dir")
            .arg(&opts.local_state_dir)
            .args(["--local-bridge", &opts.local_bridge])
            .args(["--local-subnet", &opts.local_subnet])
            .args([
                "--local-metadata-port",
                &opts.local_metadata_port.to_string(),
            ])
            .args([
                "--console-listen",
                &match plan.console_port {
                    Some(p) => format!("{ip}:{p}"),
                    None => "off".to_string(),
                },
            ])
            .args([
                "--console-session-ttl",
                &opts.console_session_ttl.to_string(),
            ])
            // The URL names the password file (never the password), and
            // goes where an operator's URL with a password would go: the
            // environment (root's to read), not the command line.
            .env("KNIT_DATASTORE", datastore)
            .stdout(log.try_clone().map_err(io("dup log"))?)
            .stderr(log);
        for (flag, value) in [
            ("--region", &opts.region),
            ("--ecs-endpoint", &opts.ecs_endpoint),
            ("--ecs-vswitch", &opts.ecs_vswitch),
            ("--ecs-image", &opts.ecs_image),
        ] {
            if let Some(v) = value {
                cmd.args([flag, v]);
            }
        }
        if !opts.ecs_security_group.is_empty() {
            cmd.args(["--ecs-security-group", &opts.ecs_security_group.join(",")]);
        }
        let c = spawn_recorded(&mut cmd, &layout.pid_file(&name), None)?;
        println!(
            "knit server {i} (pid {}) starting at {url}; log {}",
            c.id(),
            log_path.display()
        );
        child = Some(c);
    }
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        if let Some(Ok(Some(status))) = child.as_mut().map(Child::try_wait) {
            return Err(srv(format!(
                "exited ({status}) at start; see {}",
                log_path.display()
            )));
        }
        if let (Ok(ca), Ok(token)) = (
            std::fs::read_to_string(dir.join("pki/ca.pem")),
            std::fs::read_to_string(dir.join("admin-token")),
        ) {
            let config = ClientConfig {
                server: url.clone(),
                token: token.trim().to_string(),
                ca_cert: ca,
                state_dir: None,
                pid: None,
            };
            if let Ok(c) = Client::new(&config) {
                if c.healthy() {
                    return Ok(());
                }
            }
        }
        if Instant::now() > deadline {
            return Err(srv(format!(
                "did not answer at {url} within {} s; see {}",
                START_TIMEOUT.as_secs(),
                log_path.display()
            )));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// HAProxy's configuration: TCP mode (TLS goes through to the servers,
/// client certificates included) on the API and Kubernetes API ports,
/// each server checked over TLS against the shared CA every second; when
/// every check fails, the servers unchecked as backups.
fn haproxy_config(layout: &Layout, plan: &Plan) -> String {
    let first = layout.server_dir(1);
    let mut cfg = format!(
        "# Written by `knit up --ha {n}`; rewritten by each `knit up --ha`.\n\
         global\n\
         \x20   log stderr format raw local0 info\n\
         \x20   maxconn 4096\n\
         \n\
         defaults\n\
         \x20   mode tcp\n\
         \x20   log global\n\
         \x20   option tcplog\n\
         \x20   option dontlognull\n\
         \x20   # A connection that fails goes to another server at its first retry.\n\
         \x20   option redispatch 1\n\
         \x20   retries 3\n\
         \x20   timeout connect 3s\n\
         \x20   timeout check 3s\n\
         \x20   # Watches and long polls stay open: idle connections last an hour.\n\
         \x20   timeout client 1h\n\
         \x20   timeout server 1h\n\
         \x20   default-server inter 1s fall 2 rise 2 on-marked-down shutdown-sessions\n",
        n = plan.n
    );
    let mut section = |name: &str, port: u16, ca: PathBuf| {
        cfg.push_str(&format!("\nfrontend {name}\n"));
        for ip in &plan.front {
            cfg.push_str(&format!("    bind {ip}:{port}\n"));
        }
        cfg.push_str(&format!(
            "    default_backend {name}\n\nbackend {name}\n    balance roundrobin\n    option httpchk GET /healthz\n    http-check expect status 200\n    option allbackups\n"
        ));
        for i in 1..=plan.n {
            cfg.push_str(&format!(
                "    server server-{i} {}:{port} check check-ssl verify required ca-file {}\n",
                server_ip(i),
                ca.display()
            ));
        }
        // Fail open: when every health check fails at once (a loaded host
        // can time them all out), clients are still sent to the servers,
        // as Envoy's panic threshold does, instead of every connection
        // being closed; a server that is really gone refuses the connect
        // and `redispatch` tries the next.
        for i in 1..=plan.n {
            cfg.push_str(&format!(
                "    server server-{i}-fail-open {}:{port} backup\n",
                server_ip(i)
            ));
        }
    };
    section("knit-api", plan.port, first.join("pki/ca.pem"));
    if let Some(cp) = plan.cluster_port {
        section("kubernetes-api", cp, first.join("cluster/pki/ca.crt"));
    }
    cfg
}

/// HAProxy's program, or the package to install.
fn haproxy_bin() -> Result<PathBuf> {
    super::package::which("haproxy").ok_or_else(|| {
        HaError::Proxy(
            "haproxy is not installed: install Debian's haproxy package (scripts/setup.sh --ha)"
                .into(),
        )
        .into()
    })
}

/// HAProxy in front of the servers; restarted when its configuration
/// changed (another N, other addresses).
fn proxy_up(layout: &Layout, plan: &Plan) -> Result<()> {
    let px = |m: String| CliError::from(HaError::Proxy(m));
    let bin = haproxy_bin()?;
    let cfg_path = layout.haproxy_cfg();
    let cfg = haproxy_config(layout, plan);
    let same = std::fs::read_to_string(&cfg_path).is_ok_and(|old| old == cfg);
    if let Some(pid) = layout.running_one("haproxy") {
        if same {
            println!("HAProxy already running (pid {pid})");
            return Ok(());
        }
        stop_group(
            layout,
            &[Running {
                name: "haproxy".into(),
                pid,
            }],
            libc::SIGTERM,
        )?;
    }
    knit_server::durable::write(&cfg_path, cfg.as_bytes(), 0o600)?;
    let check = run_bounded(
        Command::new(&bin)
            .arg("-c")
            .arg("-f")
            .arg(&cfg_path)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
        Duration::from_secs(20),
    )
    .map_err(|e| px(format!("haproxy -c: {e}")))?;
    if !check.status.success() {
        return Err(px(format!(
            "{} refused by haproxy -c: {}{}",
            cfg_path.display(),
            String::from_utf8_lossy(&check.stdout).trim(),
            String::from_utf8_lossy(&check.stderr).trim()
        )));
    }
    let log_path = layout.root.join("haproxy.log");
    let log = append_log(&log_path)?;
    let mut cmd = Command::new(&bin);
    // -db: in the foreground (no fork), so the recorded PID is HAProxy's.
    cmd.arg("-db")
        .arg("-f")
        .arg(&cfg_path)
        .stdout(log.try_clone().map_err(io("dup log"))?)
        .stderr(log);
    let mut child = spawn_recorded(&mut cmd, &layout.pid_file("haproxy"), None)?;
    let fronts: Vec<String> = plan
        .front
        .iter()
        .flat_map(|ip| {
            std::iter::once(format!("{ip}:{}", plan.port))
                .chain(plan.cluster_port.map(|cp| format!("{ip}:{cp}")))
        })
        .collect();
    println!(
        "HAProxy (pid {}) on {} → servers {}; log {}",
        child.id(),
        fronts.join(", "),
        (1..=plan.n)
            .map(|i| server_ip(i).to_string())
            .collect::<Vec<_>>()
            .join(", "),
        log_path.display()
    );
    // Bound: every front address accepts a connection.
    let deadline = Instant::now() + START_TIMEOUT;
    for addr in &fronts {
        let addr: SocketAddr = addr
            .parse()
            .map_err(|_| px(format!("{addr}: not an address")))?;
        while std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_err() {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(px(format!(
                    "exited ({status}) at start; see {}",
                    log_path.display()
                )));
            }
            if Instant::now() > deadline {
                return Err(px(format!(
                    "not listening on {addr} within {} s; see {}",
                    START_TIMEOUT.as_secs(),
                    log_path.display()
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        up: UpArgs,
    }

    fn plan_of(args: &[&str]) -> Result<Plan> {
        let mut argv = vec!["knit"];
        argv.extend_from_slice(args);
        let cli = Cli::try_parse_from(argv).map_err(|e| CliError::Usage(e.to_string()))?;
        plan(&cli.up.opts, cli.up.ha.unwrap_or(2))
    }

    #[test]
    fn haproxy_holds_the_listen_addresses_and_nodes_use_the_gateway() {
        let p = plan_of(&["--ha", "2"]).unwrap();
        assert_eq!(p.port, 7443);
        assert_eq!(p.cluster_port, Some(6443));
        assert_eq!(p.advertise, "10.213.0.1");
        assert_eq!(p.client_url, "https://127.0.0.1:7443");
        assert_eq!(
            p.front,
            vec![
                "127.0.0.1".parse::<IpAddr>().unwrap(),
                "10.213.0.1".parse().unwrap()
            ]
        );
        let layout = Layout::new(Path::new("/s"));
        let cfg = haproxy_config(&layout, &p);
        for line in [
            "bind 127.0.0.1:7443",
            "bind 10.213.0.1:7443",
            "bind 10.213.0.1:6443",
            "server server-1 127.0.2.1:7443 check check-ssl verify required ca-file /s/ha/server-1/pki/ca.pem",
            "server server-2 127.0.2.2:6443 check check-ssl verify required ca-file /s/ha/server-1/cluster/pki/ca.crt",
            "server server-1-fail-open 127.0.2.1:7443 backup",
            "server server-2-fail-open 127.0.2.2:6443 backup",
            "option allbackups",
            "mode tcp",
        ] {
            assert!(cfg.contains(line), "{line:?} not in:\n{cfg}");
        }
    }

    #[test]
    fn every_address_is_refused_with_the_rule() {
        let Err(e) = plan_of(&["--ha", "2", "--listen", "0.0.0.0:7443"]) else {
            panic!("0.0.0.0 accepted");
        };
        let text = e.to_string();
        assert!(
            text.contains("--listen 0.0.0.0:7443") && text.contains("name them"),
            "{text}"
        );
        assert!(plan_of(&["--listen", "127.0.0.1:0"]).is_err());
        assert!(plan_of(&["--cluster-port", "7443"]).is_err());
    }

    #[test]
    fn a_datastore_or_a_short_lease_is_refused_with_the_rule() {
        let Err(e) = plan_of(&[
            "--ha",
            "2",
            "--datastore",
            "postgres://knit:secret@db.internal/knit",
        ]) else {
            panic!("--datastore accepted with --ha");
        };
        let text = e.to_string();
        assert!(
            text.contains("runs a PostgreSQL of its own") && text.contains("knit:***@"),
            "{text}"
        );
        assert!(!text.contains("secret"), "the password is shown: {text}");
        let Err(e) = plan_of(&["--ha", "2", "--lease-ttl", "2"]) else {
            panic!("--lease-ttl 2 accepted");
        };
        assert!(e.to_string().contains("at least 3 seconds"), "{e}");
        assert!(plan_of(&["--ha", "2", "--lease-ttl", "4"]).is_ok());
    }

    #[test]
    fn the_child_records_its_pid_before_its_program_runs() {
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("sleep.pid");
        let mut cmd = Command::new("sleep");
        cmd.arg("30");
        let mut child = spawn_recorded(&mut cmd, &pid_file, None).unwrap();
        let recorded: u32 = std::fs::read_to_string(&pid_file)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert_eq!(recorded, child.id());
        child.kill().unwrap();
        child.wait().unwrap();
    }

    #[test]
    fn a_recycled_pid_is_not_ours() {
        let layout = Layout::new(Path::new("/nonexistent-state"));
        let me = Running {
            name: "server-1".into(),
            pid: std::process::id(),
        };
        assert!(!layout.is_ours(&me));
        assert!(layout.running().is_empty());
    }
}
