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
//!
//! One file per part: `postgres`, `servers` and `haproxy` (its
//! configuration from `haproxy.cfg`); here the plan, bringing the set up in
//! order, the processes it records and `knit down`'s stop.

mod haproxy;
mod postgres;
mod servers;
mod template;

// What one part's file uses of another's.
use haproxy::{haproxy_bin, proxy_up};
use postgres::{postgres_bindir, postgres_up};
use servers::{secrets_key, server_up};

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
    /// A value for haproxy.cfg that is not one plain word of it.
    #[error("HAProxy: haproxy.cfg's {field} {value:?} {rule}")]
    ProxyConfig {
        field: String,
        value: String,
        rule: &'static str,
    },
}

impl HaError {
    pub fn code(&self) -> &'static str {
        match self {
            HaError::Postgres(_) => "HaPostgres",
            HaError::Server { .. } => "HaServer",
            HaError::Proxy(_) => "HaProxy",
            HaError::ProxyConfig { .. } => "HaProxyConfig",
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
    knit_server::features::require(
        knit_server::features::Feature::Postgres,
        &format!("--ha {n}"),
    )?;
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
    knit_os::proc::cmdline(pid as i32).is_some_and(|args| args.iter().any(|a| a == want))
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

impl Plan {
    /// The ports HAProxy listens on.
    fn front_ports(&self) -> Vec<u16> {
        std::iter::once(self.port)
            .chain(self.cluster_port)
            .collect()
    }
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
        None => Some(knit_server::DEFAULT_CONSOLE_PORT),
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
    super::clouds::record(&opts.state_dir, opts.provider, &local_config(opts))?;
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
    let datastore = postgres_up(layout, n, &plan.front_ports())?;
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

/// Runs `cmd` to completion within `limit` (killed past it), its output
/// capped.
fn run_bounded(cmd: &mut Command, limit: Duration) -> knit_os::Result<knit_os::command::Output> {
    knit_os::command::run(cmd, limit, 1 << 20)
}

fn append_log(path: &Path) -> Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(io(format!("open {}", path.display())))
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

    pub(super) fn plan_of(args: &[&str]) -> Result<Plan> {
        let mut argv = vec!["knit"];
        argv.extend_from_slice(args);
        let cli = Cli::try_parse_from(argv).map_err(|e| CliError::Usage(e.to_string()))?;
        plan(&cli.up.opts, cli.up.ha.unwrap_or(2))
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
