//! Long-running services (containerd, kubelet, snapshotters).
//!
//! On a live node whose PID 1 is systemd they are systemd units. Everywhere
//! else (containers, the local cloud's sandbox machines, `--root` trees) the
//! agent runs its own supervisor with the same unit semantics: one detached
//! `knit-agent supervise <name>` process per service that restarts it with
//! backoff, applies its resource limits and appends its output to a log file
//! (see `crate::supervise`).

use crate::error::{AgentError, Context, Result};
use crate::host::Host;
use knit_api::ErrorCode;
use knit_os::command;
use knit_os::proc::ProcRef;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

/// A long-running service, with systemd unit semantics.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceSpec {
    pub name: String,
    /// Program and arguments; paths as seen by this host (see `Host::host_path`).
    pub exec: Vec<String>,
    pub env: Vec<(String, String)>,
    /// `None` = infinity.
    pub limit_nofile: Option<u64>,
    pub limit_core: Option<u64>,
    pub limit_memlock: Option<u64>,
    /// Node-absolute log file.
    pub log_file: String,
}

/// Where the supervisor keeps a service's spec and pid files (node-absolute).
pub const RUN_DIR: &str = "/run/knit";
/// Overrides the executable started as `<exe> --root <root> supervise <name>`
/// (default: this executable). Used by tests, whose own executable is the
/// test harness.
pub const AGENT_EXE_ENV: &str = "KNIT_AGENT_EXE";
const SYSTEMD_UNIT_DIR: &str = "/etc/systemd/system";
const START_TIMEOUT: Duration = Duration::from_secs(10);
const STOP_TIMEOUT: Duration = Duration::from_secs(30);
/// `systemctl is-active` / `show`: answered from systemd's state at once.
const QUERY_TIMEOUT: Duration = Duration::from_secs(10);
/// What is kept of a query's or the supervisor's output (a PID, an error).
const QUERY_OUTPUT_CAP: usize = 64 << 10;

pub fn spec_file(name: &str) -> String {
    format!("{RUN_DIR}/{name}.json")
}

/// Holds the supervisor's pid.
pub fn pid_file(name: &str) -> String {
    format!("{RUN_DIR}/{name}.pid")
}

/// Holds the service process's pid (systemd's MainPID) and start time while it runs.
pub fn main_pid_file(name: &str) -> String {
    format!("{RUN_DIR}/{name}.main.pid")
}

/// True when services are systemd units: a live node booted by systemd.
pub fn uses_systemd(host: &Host) -> bool {
    host.is_live() && knit_os::proc::comm(1).as_deref() == Some("systemd")
}

/// Starts the service unless it already runs with this exact spec; a service
/// running with another spec is restarted (like a changed unit file).
pub fn ensure_running(host: &Host, spec: &ServiceSpec) -> Result<()> {
    check_name(&spec.name)?;
    if spec.exec.is_empty() {
        return Err(AgentError::new(
            ErrorCode::FailCommand,
            format!("service {}: empty command", spec.name),
        ));
    }
    // Recorded before it starts, so that an undo stops it.
    host.ledger().note_service(&spec.name)?;
    if uses_systemd(host) {
        systemd_ensure(host, spec)
    } else {
        supervisor_ensure(host, spec)
    }
}

pub fn is_running(host: &Host, name: &str) -> bool {
    if uses_systemd(host) {
        return systemctl_query(&["is-active", "--quiet", name]).is_some_and(|out| out.success());
    }
    supervisor_pid(host, name).is_some()
}

/// True if the service runs with exactly this definition.
pub fn runs_as(host: &Host, spec: &ServiceSpec) -> bool {
    if uses_systemd(host) {
        return host.read(&unit_path(&spec.name)).as_deref() == Some(render_unit(spec).as_str())
            && is_running(host, &spec.name);
    }
    supervisor_pid(host, &spec.name).is_some()
        && stored_spec(host, &spec.name).as_ref() == Some(spec)
}

fn stored_spec(host: &Host, name: &str) -> Option<ServiceSpec> {
    serde_json::from_str(&host.read(&spec_file(name))?).ok()
}

fn unit_path(name: &str) -> String {
    format!("{SYSTEMD_UNIT_DIR}/{name}.service")
}

/// The pid of the service process itself (not its supervisor), if it runs.
pub fn main_pid(host: &Host, name: &str) -> Option<i32> {
    if uses_systemd(host) {
        let out = systemctl_query(&["show", "--property=MainPID", "--value", name])?;
        return out.stdout_text().trim().parse().ok().filter(|pid| *pid > 0);
    }
    supervisor_pid(host, name)?;
    main_process(host, name)
        .filter(ProcRef::alive)
        .map(|p| p.pid)
}

/// `systemctl <args>` asking systemd's state; `None` when it could not be
/// run or did not answer in time.
fn systemctl_query(args: &[&str]) -> Option<command::Output> {
    command::run(
        Command::new("systemctl").args(args),
        QUERY_TIMEOUT,
        QUERY_OUTPUT_CAP,
    )
    .ok()
}

/// Stops the service and its supervisor (or the systemd unit); waits until
/// they are gone. Stopping a service that does not run is not an error.
pub fn stop(host: &Host, name: &str) -> Result<()> {
    check_name(name)?;
    if uses_systemd(host) {
        host.run(
            ErrorCode::FailCommand,
            "systemctl",
            &["stop", name],
            STOP_TIMEOUT,
        )?;
        return Ok(());
    }
    let Some(pid) = supervisor_pid(host, name) else {
        remove_run_files(host, name);
        return Ok(());
    };
    host.log.line(
        "service",
        &format!("stopping {name} (supervisor pid {pid})"),
    );
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGTERM,
    );
    let deadline = Instant::now() + STOP_TIMEOUT;
    while is_supervisor(pid, name) {
        if Instant::now() > deadline {
            return Err(AgentError::new(
                ErrorCode::FailCommand,
                format!(
                    "service {name}: supervisor pid {pid} did not stop within {}s",
                    STOP_TIMEOUT.as_secs()
                ),
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    remove_run_files(host, name);
    Ok(())
}

fn check_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(AgentError::new(
            ErrorCode::FailCommand,
            format!("invalid service name {name:?} (lowercase letters, digits, '-')"),
        ))
    }
}

/// The supervisor's pid file: its pid.
fn read_pid(host: &Host, abs: &str) -> Option<i32> {
    host.read(abs)?.trim().parse().ok()
}

/// The service process the main pid file names: `<pid> <start time>`, the
/// start time making a reused pid another process (see [`ProcRef`]).
pub(crate) fn main_process(host: &Host, name: &str) -> Option<ProcRef> {
    let text = host.read(&main_pid_file(name))?;
    let mut words = text.split_whitespace();
    Some(ProcRef {
        pid: words.next()?.parse().ok()?,
        start_time: words.next()?.parse().ok()?,
    })
}

/// What the main pid file holds for `process`.
pub(crate) fn main_pid_text(process: ProcRef) -> String {
    format!("{} {}\n", process.pid, process.start_time)
}

/// True if `pid` is a live supervisor of `name` (guards against pid reuse).
fn is_supervisor(pid: i32, name: &str) -> bool {
    if !knit_os::proc::stat(pid).is_some_and(|s| s.running()) {
        return false;
    }
    knit_os::proc::cmdline(pid).is_some_and(|args| {
        args.windows(2)
            .any(|w| w[0] == b"supervise" && w[1] == name.as_bytes())
    })
}

fn supervisor_pid(host: &Host, name: &str) -> Option<i32> {
    read_pid(host, &pid_file(name)).filter(|pid| is_supervisor(*pid, name))
}

fn remove_run_files(host: &Host, name: &str) {
    for file in [spec_file(name), pid_file(name), main_pid_file(name)] {
        let _ = std::fs::remove_file(host.path(&file));
    }
}

fn agent_exe() -> Result<PathBuf> {
    if let Some(exe) = std::env::var_os(AGENT_EXE_ENV) {
        return Ok(PathBuf::from(exe));
    }
    std::env::current_exe().context(ErrorCode::FailCommand, || {
        "cannot find the knit-agent executable to start a supervisor".to_string()
    })
}

fn supervisor_ensure(host: &Host, spec: &ServiceSpec) -> Result<()> {
    let name = &spec.name;
    let spec_path = spec_file(name);
    if let Some(pid) = supervisor_pid(host, name) {
        if stored_spec(host, name).as_ref() == Some(spec) {
            host.log.line(
                "service",
                &format!("{name} already running (supervisor pid {pid})"),
            );
            return Ok(());
        }
        host.log.line(
            "service",
            &format!("{name}: definition changed, restarting"),
        );
        stop(host, name)?;
    }
    let text = serde_json::to_vec_pretty(spec)
        .context(ErrorCode::FailCommand, || format!("encode service {name}"))?;
    host.write_file(&spec_path, &text, 0o600)?;
    let _ = std::fs::remove_file(host.path(&pid_file(name)));
    let exe = agent_exe()?;
    let root = host.root().to_string_lossy().into_owned();
    host.log.line(
        "service",
        &format!("starting {name}: {}", spec.exec.join(" ")),
    );
    // The supervisor forks into the background and this first process exits
    // at once, so nothing is left for the agent to reap.
    let output = command::run(
        Command::new(&exe).args(["--root", root.as_str(), "supervise", name.as_str()]),
        START_TIMEOUT,
        QUERY_OUTPUT_CAP,
    )
    .context(ErrorCode::FailCommand, || {
        format!("cannot start the supervisor {} for {name}", exe.display())
    })?;
    if !output.success() {
        return Err(AgentError::new(
            ErrorCode::FailCommand,
            format!(
                "supervisor `{} supervise {name}` failed ({}): {}",
                exe.display(),
                output.status,
                output.stderr_text().trim()
            ),
        ));
    }
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        if let Some(pid) = supervisor_pid(host, name) {
            host.log
                .line("service", &format!("{name} supervised by pid {pid}"));
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(AgentError::new(
                ErrorCode::FailCommand,
                format!(
                    "supervisor for {name} did not write {} within {}s; see {}",
                    host.host_path(&pid_file(name)),
                    START_TIMEOUT.as_secs(),
                    host.host_path(&spec.log_file)
                ),
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The systemd unit for a spec; limits as systemd spells them. Output goes
/// to journald (`journalctl -u <name>`), as for any unit; the spec's log file
/// is the supervisor's, used where systemd is not PID 1.
pub fn render_unit(spec: &ServiceSpec) -> String {
    let limit = |v: Option<u64>| v.map_or("infinity".to_string(), |n| n.to_string());
    let mut unit = format!(
        "# Managed by knit-agent; changes are overwritten.\n\
         [Unit]\n\
         Description={name} (knit)\n\
         Wants=network-online.target\n\
         After=network-online.target\n\n\
         [Service]\n\
         ExecStart={exec}\n",
        name = spec.name,
        exec = spec
            .exec
            .iter()
            .map(|a| systemd_quote(a))
            .collect::<Vec<_>>()
            .join(" "),
    );
    for (key, value) in &spec.env {
        unit.push_str(&format!(
            "Environment={}\n",
            systemd_quote(&format!("{key}={value}"))
        ));
    }
    unit.push_str(&format!(
        "Restart=always\n\
         RestartSec=5\n\
         StartLimitInterval=0\n\
         Delegate=yes\n\
         KillMode=process\n\
         LimitNOFILE={}\n\
         LimitCORE={}\n\
         LimitMEMLOCK={}\n\
         StandardOutput=journal\n\
         StandardError=journal\n\
         SyslogIdentifier={name}\n\n\
         [Install]\n\
         WantedBy=multi-user.target\n",
        limit(spec.limit_nofile),
        limit(spec.limit_core),
        limit(spec.limit_memlock),
        name = spec.name,
    ));
    unit
}

/// Quotes one word for a unit file (`%` and `$` are specifiers there).
fn systemd_quote(word: &str) -> String {
    let escaped = word
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('%', "%%")
        .replace('$', "$$");
    if escaped.contains(char::is_whitespace) || escaped.is_empty() {
        format!("\"{escaped}\"")
    } else {
        escaped
    }
}

fn systemd_ensure(host: &Host, spec: &ServiceSpec) -> Result<()> {
    let name = &spec.name;
    let unit_path = unit_path(name);
    let unit = render_unit(spec);
    let changed = host.read(&unit_path).as_deref() != Some(unit.as_str());
    if !changed && is_running(host, name) {
        host.log
            .line("service", &format!("{name} already active (systemd)"));
        return Ok(());
    }
    host.write_file(&unit_path, unit.as_bytes(), 0o644)?;
    let t = Duration::from_secs(120);
    host.run(ErrorCode::FailCommand, "systemctl", &["daemon-reload"], t)?;
    host.run(ErrorCode::FailCommand, "systemctl", &["enable", name], t)?;
    let verb = if changed { "restart" } else { "start" };
    host.run(ErrorCode::FailCommand, "systemctl", &[verb, name], t)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_quotes_and_limits() {
        let spec = ServiceSpec {
            name: "kubelet".into(),
            exec: vec!["/usr/local/bin/kubelet".into(), "--x=a b".into()],
            env: vec![("A".into(), "1$".into())],
            limit_nofile: Some(1_048_576),
            limit_core: None,
            limit_memlock: None,
            log_file: "/var/log/knit/kubelet.log".into(),
        };
        let unit = render_unit(&spec);
        assert!(unit.contains("ExecStart=/usr/local/bin/kubelet \"--x=a b\"\n"));
        assert!(unit.contains("Environment=A=1$$\n"));
        assert!(unit.contains("LimitNOFILE=1048576\nLimitCORE=infinity\nLimitMEMLOCK=infinity\n"));
        // journald, so that `journalctl -u kubelet` shows the kubelet's output.
        assert!(unit.contains("StandardOutput=journal\nStandardError=journal\n"));
        assert!(!unit.contains("append:"), "{unit}");
        assert!(unit.contains("SyslogIdentifier=kubelet\n"));
    }

    #[test]
    fn rejects_bad_names() {
        assert!(check_name("containerd").is_ok());
        assert!(check_name("../x").is_err());
        assert!(check_name("").is_err());
    }
}
