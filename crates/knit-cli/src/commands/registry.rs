//! `knit registry up|down|status`: the local OCI registry pools pull from.
//!
//! Debian's `docker-registry` (through the knit-registry library), started
//! in the background on the local cloud's bridge address, with its storage,
//! config, log and a record (`registry.json`, its PID) under
//! `<state-dir>/registry`. Instances may only pull: on its address (the
//! bridge, every address, or loopback) it runs in docker-registry's
//! read-only mode (push and delete answer 405), and a second
//! docker-registry over the same storage takes pushes on a loopback port,
//! from the host only and with the writer credential (`registry/writer-token`,
//! 0600; HTTP basic auth as `knit-writer`): a push without it is 401. `up --seed` pushes the
//! local package set's system images there (built here from random bytes,
//! no image from the internet); `up` prints the containerd mirror
//! configuration a pool needs. `down` (and `knit down`) stops both by their
//! recorded PIDs; the stored images stay.

use crate::error::{io, CliError, Result};
use clap::{Args, Subcommand};
use serde::{Deserialize, Serialize};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// `ip addr` answers at once; a host with thousands of addresses writes a
/// few hundred KiB.
const IP_TIMEOUT: Duration = Duration::from_secs(10);
const IP_OUTPUT_CAP: usize = 4 << 20;

/// The local package set's system images with the sizes `--seed` gives them.
const SEED: &[(&str, u64)] = &[
    ("registry.k8s.io/pause:3.10", 512 << 10),
    ("registry.k8s.io/kube-proxy:v1.31.4", 16 << 20),
    ("docker.io/flannel/flannel:v0.26.1", 16 << 20),
];

#[derive(Args, Clone)]
pub struct Place {
    /// The server's state directory; the registry lives in its `registry/`.
    #[arg(long, env = "KNIT_STATE_DIR", default_value = "/var/lib/knit/server")]
    state_dir: PathBuf,
    /// The local cloud's subnet: its first address is the bridge's, where
    /// instances reach the host.
    #[arg(long, env = "KNIT_LOCAL_SUBNET", default_value = "10.213.0.0/24")]
    local_subnet: String,
}

#[derive(Subcommand)]
pub enum RegistryAction {
    /// Start the registry (if not running) and print the containerd mirror
    /// configuration for a pool.
    Up {
        #[command(flatten)]
        place: Place,
        #[arg(long, default_value_t = 5000)]
        port: u16,
        /// Listen address. Default: the bridge's address when the bridge
        /// exists, else every address (the bridge is made with the local
        /// cloud's first instance; instances reach the registry there).
        #[arg(long)]
        address: Option<Ipv4Addr>,
        /// Push the local package set's system images (pause, kube-proxy,
        /// flannel; random layers built here).
        #[arg(long)]
        seed: bool,
        /// Also push REF=SIZE[xLAYERS] (e.g. docker.io/acme/web:1=300Mx6).
        #[arg(long = "image", value_name = "REF=SIZE[xLAYERS]")]
        images: Vec<String>,
    },
    /// Stop the registry started by `up` (its images stay on disk).
    Down {
        #[command(flatten)]
        place: Place,
    },
    /// Whether it runs, where, what it holds.
    Status {
        #[command(flatten)]
        place: Place,
        #[arg(short = 'o', long)]
        output: Option<String>,
    },
}

/// `<state-dir>/registry/registry.json`: what `up` started.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Record {
    pid: u32,
    /// `IP:PORT` it listens on.
    listen: String,
    /// `IP:PORT` instances use (pool registry mirrors).
    mirror: String,
    started_ms: i64,
    /// The loopback writer beside a pull-only `listen` (absent when
    /// `listen` is loopback itself, which takes pushes).
    #[serde(default)]
    push_pid: Option<u32>,
    #[serde(default)]
    push_listen: Option<String>,
}

impl Record {
    /// Where the host pushes, with the writer credential.
    fn push_url(&self, place: &Place) -> Result<String> {
        match &self.push_listen {
            Some(l) => Ok(knit_registry::credential_url(
                &format!("http://{l}"),
                &knit_registry::writer_token(&dir(place))?,
            )),
            // Recorded by an older knit: one listener, on loopback.
            None => Ok(local_url(&self.listen)),
        }
    }
}

fn dir(place: &Place) -> PathBuf {
    place.state_dir.join("registry")
}

fn record_path(place: &Place) -> PathBuf {
    dir(place).join("registry.json")
}

fn load(place: &Place) -> Option<Record> {
    let text = std::fs::read_to_string(record_path(place)).ok()?;
    serde_json::from_str(&text).ok()
}

/// The bridge's address: the gateway the local cloud derives from its
/// subnet (the same rule the server listens by).
fn gateway(subnet: &str) -> Result<Ipv4Addr> {
    knit_server::provider::local::local_gateway(subnet).map_err(|_| {
        CliError::Usage(format!(
            "--local-subnet {subnet:?}: expected an IPv4 network such as 10.213.0.0/24"
        ))
    })
}

/// Whether an interface of this host holds `ip` (`ip -4 -o addr`); no
/// answer within the deadline counts as no.
fn host_has(ip: Ipv4Addr) -> bool {
    knit_os::command::run(
        std::process::Command::new("ip").args(["-4", "-o", "addr", "show"]),
        IP_TIMEOUT,
        IP_OUTPUT_CAP,
    )
    .is_ok_and(|o| o.stdout_text().contains(&format!("inet {ip}/")))
}

/// True when `pid` is a docker-registry serving one of this directory's
/// configs (so a recycled PID is never signalled).
fn is_ours(pid: u32, place: &Place) -> bool {
    let configs = [
        dir(place).join("config.yml"),
        dir(place).join("config-pull.yml"),
    ];
    knit_os::proc::cmdline(pid as i32).is_some_and(|args| {
        args.first()
            .is_some_and(|a| a.ends_with(b"docker-registry"))
            && args.iter().any(|a| {
                configs
                    .iter()
                    .any(|c| a.as_slice() == c.as_os_str().as_encoded_bytes())
            })
    })
}

/// Both of its processes run (the pull listener and, beside a pull-only
/// one, the loopback writer).
fn alive(r: &Record, place: &Place) -> bool {
    is_ours(r.pid, place) && r.push_pid.is_none_or(|p| is_ours(p, place))
}

fn local_url(listen: &str) -> String {
    match listen.strip_prefix("0.0.0.0:") {
        Some(port) => format!("http://127.0.0.1:{port}"),
        None => format!("http://{listen}"),
    }
}

/// The pool fragment that sends both registries' pulls to `mirror`.
fn mirror_config(mirror: &str) -> String {
    format!(
        "spec:\n  containerd:\n    registryMirrors:\n      registry.k8s.io: [\"http://{mirror}\"]\n      docker.io: [\"http://{mirror}\"]\n    insecureRegistries: [\"{mirror}\"]\n"
    )
}

pub fn run(action: RegistryAction) -> Result<ExitCode> {
    match action {
        RegistryAction::Up {
            place,
            port,
            address,
            seed,
            images,
        } => up(&place, port, address, seed, &images),
        RegistryAction::Down { place } => {
            stop(&place)?;
            Ok(ExitCode::SUCCESS)
        }
        RegistryAction::Status { place, output } => status(&place, output.as_deref()),
    }
}

fn up(
    place: &Place,
    port: u16,
    address: Option<Ipv4Addr>,
    seed: bool,
    images: &[String],
) -> Result<ExitCode> {
    // Checked before anything starts: a typo must not leave a registry up.
    let mut pushes: Vec<(String, usize, u64)> = Vec::new();
    if seed {
        pushes.extend(SEED.iter().map(|(r, b)| (r.to_string(), 1, *b)));
    }
    for arg in images {
        pushes.push(knit_registry::parse_image_arg(arg)?);
    }
    let gw = gateway(&place.local_subnet)?;
    let record = match load(place) {
        Some(r) if alive(&r, place) => {
            println!("registry already running (pid {}) on {}", r.pid, r.listen);
            r
        }
        Some(_) => {
            // Half of it is gone: the rest is stopped and both start again.
            stop(place)?;
            start(place, port, address, gw)?
        }
        None => start(place, port, address, gw)?,
    };
    let push = record.push_url(place)?;
    if !pushes.is_empty() {
        let work = dir(place).join("seed");
        for (reference, layers, bytes) in &pushes {
            let t = Instant::now();
            let img = knit_registry::seed(&push, &work, reference, *layers, *bytes)?;
            println!(
                "pushed {reference} ({} bytes in {layers} layer(s), {}) in {:.1}s",
                img.transfer_bytes(),
                img.manifest_digest,
                t.elapsed().as_secs_f64()
            );
        }
        let _ = std::fs::remove_dir_all(&work);
    }
    println!(
        "instances reach it at {}; a pool pulls through it with:\n{}",
        record.mirror,
        mirror_config(&record.mirror)
    );
    Ok(ExitCode::SUCCESS)
}

fn start(place: &Place, port: u16, address: Option<Ipv4Addr>, gw: Ipv4Addr) -> Result<Record> {
    let bridge_up = host_has(gw);
    let ip = address.unwrap_or(if bridge_up { gw } else { Ipv4Addr::UNSPECIFIED });
    if address.is_none() && !bridge_up {
        println!(
            "the local cloud's bridge ({gw}) does not exist yet (it is made with the first instance): listening on every address"
        );
    }
    let listen = format!("{ip}:{port}");
    let mirror = if ip.is_unspecified() {
        format!("{gw}:{port}")
    } else {
        listen.clone()
    };
    let dir = dir(place);
    let log_path = dir.join("registry.log");
    // Killed (by the handle of the child just started) if anything below
    // fails: nothing may run without a record to stop it.
    let end = |children: &mut Vec<std::process::Child>| {
        for c in children.iter_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    };
    // Pulls on `listen` (no credential), pushes on a loopback writer that
    // asks for one.
    let mut children = vec![spawn(
        &dir,
        &listen,
        knit_registry::Access::PullOnly,
        &log_path,
    )?];
    let mut push_listen = None;
    let mut waited = wait_answers(&mut children[0], &listen, &log_path);
    if waited.is_ok() {
        waited = knit_registry::free_loopback_addr()
            .map_err(CliError::from)
            .and_then(|at| {
                let child = spawn(&dir, &at, knit_registry::Access::ReadWrite, &log_path)?;
                children.push(child);
                push_listen = Some(at.clone());
                wait_answers(&mut children[1], &at, &log_path)
            });
    }
    if let Err(e) = waited {
        end(&mut children);
        return Err(e);
    }
    let pid = children[0].id();
    let record = Record {
        pid,
        listen: listen.clone(),
        mirror,
        started_ms: knit_os::time::now_ms(),
        push_pid: children.get(1).map(std::process::Child::id),
        push_listen,
    };
    let text = serde_json::to_string_pretty(&record)
        .map_err(|e| CliError::Failed(format!("encode the registry record: {e}")))?;
    if let Err(e) = std::fs::write(record_path(place), text) {
        // Without its record nothing could stop them later.
        end(&mut children);
        return Err(io(format!("write {}", record_path(place).display()))(e));
    }
    match &record.push_listen {
        Some(push) => println!(
            "registry running (pid {pid}) on {listen}; pull only there, pushes from this host on {push} (pid {}); storage {}; log {}",
            record.push_pid.unwrap_or_default(),
            dir.join("storage").display(),
            log_path.display()
        ),
        None => println!(
            "registry running (pid {pid}) on {listen}; storage {}; log {}",
            dir.join("storage").display(),
            log_path.display()
        ),
    }
    Ok(record)
}

/// Starts one docker-registry for `listen` in its own session (it outlives
/// this command), logging to `log_path`.
fn spawn(
    dir: &Path,
    listen: &str,
    access: knit_registry::Access,
    log_path: &Path,
) -> Result<std::process::Child> {
    let (bin, config) = knit_registry::prepare(dir, listen, access)?;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log_path)
        .map_err(io(format!("open {}", log_path.display())))?;
    let log2 = log.try_clone().map_err(io("dup the registry log"))?;
    let mut cmd = std::process::Command::new(bin);
    cmd.arg("serve")
        .arg(&config)
        .stdin(std::process::Stdio::null())
        .stdout(log)
        .stderr(log2);
    // SAFETY: setsid is async-signal-safe and touches no memory of ours.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    cmd.spawn().map_err(io("start docker-registry"))
}

/// Waits until the registry on `listen` answers `/v2/` (30 s at most).
fn wait_answers(child: &mut std::process::Child, listen: &str, log_path: &Path) -> Result<()> {
    let url = local_url(listen);
    let deadline = Instant::now() + Duration::from_secs(30);
    let log_tail = || {
        let text = std::fs::read_to_string(log_path).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(5)..].join("\n")
    };
    while !knit_registry::answers(&url) {
        if let Ok(Some(st)) = child.try_wait() {
            return Err(CliError::Failed(format!(
                "docker-registry exited ({st}) on {listen}:\n{}",
                log_tail()
            )));
        }
        if Instant::now() > deadline {
            return Err(CliError::Failed(format!(
                "docker-registry did not answer on {listen} within 30 s:\n{}",
                log_tail()
            )));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// Stops the registry `up` started for this state directory, if it runs.
/// Whether one was stopped.
pub fn stop_in(state_dir: &Path) -> Result<bool> {
    let place = Place {
        state_dir: state_dir.to_path_buf(),
        local_subnet: String::new(),
    };
    if load(&place).is_none() {
        return Ok(false);
    }
    stop(&place)
}

fn stop(place: &Place) -> Result<bool> {
    let Some(record) = load(place) else {
        println!("no registry started by `knit registry up` here");
        return Ok(false);
    };
    let mut stopped = false;
    for pid in std::iter::once(record.pid).chain(record.push_pid) {
        // Waited for by its start time, not its command line: an exiting
        // process drops its command line before it has ended.
        let process = knit_os::proc::ProcRef::of(pid as i32).filter(|_| is_ours(pid, place));
        let Some(process) = process else {
            println!("registry (pid {pid}) is not running");
            continue;
        };
        // SAFETY: the recorded registry process, checked above.
        unsafe { libc::kill(pid as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while process.alive() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        if process.alive() {
            // SAFETY: as above; it ignored SIGTERM for 10 s.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            while process.alive() {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        println!("registry (pid {pid}) stopped");
        stopped = true;
    }
    let path = record_path(place);
    std::fs::remove_file(&path).map_err(io(format!("remove {}", path.display())))?;
    Ok(stopped)
}

fn status(place: &Place, output: Option<&str>) -> Result<ExitCode> {
    let record = load(place);
    let running = record.as_ref().is_some_and(|r| alive(r, place));
    let url = record.as_ref().map(|r| local_url(&r.listen));
    let answers = running && url.as_deref().is_some_and(knit_registry::answers);
    let repositories = match (&url, answers) {
        (Some(u), true) => knit_registry::catalog(u)?,
        _ => Vec::new(),
    };
    if output == Some("json") {
        let v = serde_json::json!({
            "running": running,
            "answers": answers,
            "pid": record.as_ref().map(|r| r.pid),
            "listen": record.as_ref().map(|r| r.listen.clone()),
            "mirror": record.as_ref().map(|r| r.mirror.clone()),
            // The writer's address, never its credential.
            "push": record.as_ref().map(|r| match &r.push_listen {
                Some(l) => format!("http://{l}"),
                None => local_url(&r.listen),
            }),
            "pushCredential": dir(place).join(knit_registry::WRITER_TOKEN_FILE),
            "pushPid": record.as_ref().and_then(|r| r.push_pid),
            "repositories": repositories,
            "dir": dir(place),
        });
        println!("{}", knit_api::ser::value_pretty(&v));
        return Ok(ExitCode::SUCCESS);
    }
    match (&record, running) {
        (Some(r), true) => {
            println!(
                "Registry:      running (pid {}), {}",
                r.pid,
                if answers {
                    "answers /v2/"
                } else {
                    "does not answer /v2/"
                }
            );
            println!("Listen:        {}", r.listen);
            println!("Mirror:        {} (for instances)", r.mirror);
            match &r.push_listen {
                Some(p) => println!(
                    "Access:        pull only on {}; pushes on {p} (this host only, with the credential in {})",
                    r.listen,
                    dir(place).join(knit_registry::WRITER_TOKEN_FILE).display()
                ),
                None => println!("Access:        pull and push on {}", r.listen),
            }
            println!("Repositories:  {}", repositories.join(", "));
            println!("Storage:       {}", dir(place).join("storage").display());
            print!("{}", mirror_config(&r.mirror));
        }
        _ => println!("Registry:      not running (knit registry up)"),
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_has_sees_loopback_and_not_an_address_no_host_holds() {
        // The host's lo holds 127.0.0.1 (tests run in its namespace);
        // 192.0.2.0/24 is for documentation only.
        assert!(host_has(Ipv4Addr::LOCALHOST));
        assert!(!host_has(Ipv4Addr::new(192, 0, 2, 1)));
    }
}
