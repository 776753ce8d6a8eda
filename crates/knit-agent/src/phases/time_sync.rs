//! `time-sync`: keep the node clock on NTP with chronyd (docs/spec.md §1.3.1).
//!
//! chronyd steers the clock only when this node owns it: it may set it
//! (CAP_SYS_TIME) and runs in the initial PID namespace. The clock is not
//! namespaced, so in a container or a local-cloud sandbox chronyd runs with
//! `-x`: it tracks NTP and never touches the host's clock.

use crate::error::{AgentError, Result};
use crate::host::Host;
use crate::phase::{Ctx, Decision, Phase};
use crate::services::{self, ServiceSpec};
use knit_api::{ErrorCode, PhaseName};
use std::os::unix::fs::MetadataExt;
use std::time::{Duration, Instant};

pub struct TimeSync;

const SERVICE: &str = "chronyd";
pub const LOG_FILE: &str = "/var/log/chronyd.log";
/// Written by chronyd once it has read its configuration and started.
const PID_FILE: &str = "/run/chrony/chronyd.pid";
const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// chronyd writes its pid file within tens of milliseconds; read at 100 ms,
/// the phase (on every node's path to Ready) waited 100-200 ms for it.
const PID_POLL: Duration = Duration::from_millis(10);
/// Debian's own unit for chronyd (`chronyd.service` is its alias), enabled
/// when the image was built. On a machine booted by systemd it has already
/// started chronyd: knit configures and restarts that one. A second chronyd
/// (a unit of knit's named `chronyd`, which the alias shadows) would find
/// the pid file and port taken and exit, and under systemd its words go to
/// the journal, not to [`LOG_FILE`].
const DISTRO_UNIT: &str = "chrony";
const DISTRO_UNIT_FILES: [&str; 2] = [
    "/lib/systemd/system/chrony.service",
    "/usr/lib/systemd/system/chrony.service",
];
/// Bound on each `systemctl` call for the distribution's unit.
const SYSTEMCTL_TIMEOUT: Duration = Duration::from_secs(60);
const KNIT_CONF: &str = "/etc/chrony/conf.d/knit.conf";
/// PROC_PID_INIT_INO: the inode of the initial PID namespace (include/linux/proc_ns.h).
const INIT_PID_NS_INODE: u64 = 0xEFFF_FFFC;

/// Whether this process may set the system clock (CAP_SYS_TIME, bit 25).
fn can_set_clock() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << 25) != 0)
}

/// Why chronyd must not steer the clock here, or `None` when it may.
pub fn clock_not_ours() -> Option<&'static str> {
    if !can_set_clock() {
        return Some("without CAP_SYS_TIME");
    }
    let initial =
        std::fs::metadata("/proc/self/ns/pid").is_ok_and(|m| m.ino() == INIT_PID_NS_INODE);
    if !initial {
        return Some("in a container or sandbox, whose clock is the host's");
    }
    None
}

/// A chronyd this agent did not start (the distribution's service), if one runs.
fn foreign_chronyd(host: &Host) -> Option<i32> {
    let pid: i32 = host.read(PID_FILE)?.trim().parse().ok()?;
    let comm = knit_os::proc::comm(pid)?;
    (comm == "chronyd" && services::main_pid(host, SERVICE) != Some(pid)).then_some(pid)
}

/// Whether the distribution's chrony unit runs chronyd here (systemd is PID 1
/// and the image ships the unit).
fn distro_unit(host: &Host) -> bool {
    services::uses_systemd(host) && DISTRO_UNIT_FILES.iter().any(|f| host.path(f).exists())
}

/// The servers knit adds to chrony's configuration, one line each.
fn knit_conf(ctx: &Ctx) -> String {
    ctx.config
        .time_sync
        .servers
        .iter()
        .map(|s| format!("server {s} iburst\n"))
        .collect()
}

fn log_len(host: &Host) -> u64 {
    std::fs::metadata(host.path(LOG_FILE)).map_or(0, |m| m.len())
}

/// The log written since `offset`, bounded to its last lines.
fn log_since(host: &Host, offset: u64) -> String {
    let text = std::fs::read(host.path(LOG_FILE)).unwrap_or_default();
    let new = String::from_utf8_lossy(text.get(offset as usize..).unwrap_or_default()).into_owned();
    let lines: Vec<&str> = new.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(5)..].join(" | ")
}

/// chronyd in the foreground under the service manager; `-x` (never touch
/// the clock) unless this node owns it.
fn spec(host: &Host) -> ServiceSpec {
    let program = host
        .find_program("chronyd")
        .unwrap_or_else(|| "chronyd".to_string());
    let mut exec = vec![program, "-d".to_string()];
    if clock_not_ours().is_some() {
        exec.push("-x".to_string());
    }
    ServiceSpec {
        name: SERVICE.to_string(),
        exec,
        env: vec![],
        limit_nofile: None,
        limit_core: None,
        limit_memlock: None,
        log_file: LOG_FILE.to_string(),
    }
}

impl Phase for TimeSync {
    fn name(&self) -> PhaseName {
        PhaseName::TimeSync
    }

    fn inspect(&self, ctx: &Ctx) -> Result<Decision> {
        if !ctx.config.time_sync.enabled {
            return Ok(Decision::Skip("timeSync.enabled is false".to_string()));
        }
        if !ctx.host.is_live() {
            return Ok(Decision::Skip(
                "the clock belongs to the host: time sync runs only without --root".to_string(),
            ));
        }
        if ctx.host.find_program("chronyd").is_none() {
            return Ok(Decision::Skip(
                "chronyd is not installed in this image (package chrony)".to_string(),
            ));
        }
        if distro_unit(ctx.host) {
            let configured = ctx.config.time_sync.servers.is_empty()
                || ctx.host.read(KNIT_CONF).as_deref() == Some(knit_conf(ctx).as_str());
            return Ok(
                if configured && services::is_running(ctx.host, DISTRO_UNIT) {
                    Decision::Done("chronyd is running (the system's chrony service)".to_string())
                } else {
                    Decision::Run("the system's chrony service is to be configured".to_string())
                },
            );
        }
        if services::runs_as(ctx.host, &spec(ctx.host)) {
            return Ok(Decision::Done("chronyd is running".to_string()));
        }
        if services::is_running(ctx.host, SERVICE) {
            // E.g. started without -x by an older agent: restarted as wanted.
            return Ok(Decision::Run(
                "chronyd runs with another command line".to_string(),
            ));
        }
        if let Some(pid) = foreign_chronyd(ctx.host) {
            return Ok(Decision::Done(format!(
                "chronyd already runs (pid {pid}, started by the system)"
            )));
        }
        Ok(Decision::Run("chronyd is not running".to_string()))
    }

    fn run(&self, ctx: &mut Ctx) -> Result<String> {
        let note = match clock_not_ours() {
            Some(why) => format!(" ({why}: tracking only, the clock is left alone)"),
            None => String::new(),
        };
        if !ctx.config.time_sync.servers.is_empty() {
            ctx.host
                .write_file(KNIT_CONF, knit_conf(ctx).as_bytes(), 0o644)
                .map_err(|e| AgentError::new(ErrorCode::FailSyncTime, e.message))?;
        }
        if distro_unit(ctx.host) {
            restart_distro_unit(ctx.host)?;
            return Ok(format!("the system's chrony service restarted{note}"));
        }
        let offset = log_len(ctx.host);
        services::ensure_running(ctx.host, &spec(ctx.host)).map_err(|e| {
            AgentError::new(
                ErrorCode::FailSyncTime,
                format!("cannot start chronyd: {}", e.message),
            )
        })?;
        wait_started(ctx.host, offset)?;
        Ok(format!("chronyd started{note}"))
    }
}

/// Enables and restarts Debian's chrony unit (it reads [`KNIT_CONF`]), then
/// waits until its chronyd has written the pid file.
fn restart_distro_unit(host: &Host) -> Result<()> {
    for verb in ["enable", "restart"] {
        host.run(
            ErrorCode::FailSyncTime,
            "systemctl",
            &[verb, DISTRO_UNIT],
            SYSTEMCTL_TIMEOUT,
        )?;
    }
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        let main = services::main_pid(host, DISTRO_UNIT);
        let written: Option<i32> = host.read(PID_FILE).and_then(|t| t.trim().parse().ok());
        if main.is_some() && main == written {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(AgentError::new(
                ErrorCode::FailSyncTime,
                format!(
                    "chronyd could not be started: the chrony service did not start within {}s; see `journalctl -u {DISTRO_UNIT}`",
                    READY_TIMEOUT.as_secs()
                ),
            ));
        }
        std::thread::sleep(PID_POLL);
    }
}

/// Waits until chronyd has written its pid file (configuration read, sockets
/// open); a fatal error in its log, or no start by the deadline, stops it and
/// fails the phase with what chronyd said.
fn wait_started(host: &Host, offset: u64) -> Result<()> {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        let main = services::main_pid(host, SERVICE);
        let written: Option<i32> = host.read(PID_FILE).and_then(|t| t.trim().parse().ok());
        if main.is_some() && main == written {
            return Ok(());
        }
        let said = log_since(host, offset);
        let fatal = said.contains("Fatal error");
        if fatal || Instant::now() > deadline {
            let _ = services::stop(host, SERVICE);
            let why = if fatal {
                "it exited".to_string()
            } else {
                format!("it did not start within {}s", READY_TIMEOUT.as_secs())
            };
            let log = if services::uses_systemd(host) {
                "`journalctl -u chronyd`".to_string()
            } else {
                format!(
                    "its log {LOG_FILE} says: {}",
                    if said.is_empty() { "nothing" } else { &said }
                )
            };
            return Err(AgentError::new(
                ErrorCode::FailSyncTime,
                format!("chronyd could not be started: {why}; see {log}"),
            ));
        }
        std::thread::sleep(PID_POLL);
    }
}
