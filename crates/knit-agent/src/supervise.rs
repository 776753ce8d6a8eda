//! The agent's own service supervisor (`knit-agent supervise <name>`), used
//! where systemd does not run the node. One supervisor per service: it runs
//! the service from the spec `services::ensure_running` wrote, restarts it
//! with backoff when it exits (`Restart=always`), applies its resource
//! limits, appends its output to the log file, and on SIGTERM stops the
//! service and exits.

use crate::error::{AgentError, Context, Result};
use crate::host::Host;
use crate::log::rfc3339_now;
use crate::services::{
    main_pid_file, main_pid_text, main_process, pid_file, spec_file, ServiceSpec,
};
use knit_api::ErrorCode;
use knit_os::command::terminate;
use knit_os::proc::ProcRef;
use nix::sys::resource::{getrlimit, setrlimit, Resource, RLIM_INFINITY};
use nix::sys::signal::{kill, SigSet, Signal};
use nix::unistd::{fork, setsid, ForkResult, Pid};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// A stop signal was taken.
static STOP: AtomicBool = AtomicBool::new(false);

/// A run this long resets the restart backoff (the service was healthy).
const HEALTHY_RUN: Duration = Duration::from_secs(10);
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// Time the service gets between SIGTERM and SIGKILL (systemd's TimeoutStopSec).
const STOP_GRACE: Duration = Duration::from_secs(10);
const POLL: Duration = Duration::from_millis(50);

/// The signals the supervisor waits for: the stop signals and SIGCHLD,
/// blocked and taken synchronously, so that it sleeps until one comes
/// instead of polling (a thousand machines' supervisors, two each, woke 20
/// times a second each: most of a host's CPU at that size). A service
/// starts with an empty signal mask ([`start`] clears it).
fn waited_signals() -> SigSet {
    let mut set = SigSet::empty();
    for signal in [
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGHUP,
        Signal::SIGCHLD,
    ] {
        set.add(signal);
    }
    set
}

/// The next of `set`'s (blocked) signals; `None` once `timeout` passed, or
/// when the wait was interrupted.
fn next_signal(set: &SigSet, timeout: Option<Duration>) -> Option<Signal> {
    let ts = timeout.map(|t| libc::timespec {
        tv_sec: libc::time_t::try_from(t.as_secs()).unwrap_or(libc::time_t::MAX),
        tv_nsec: libc::c_long::from(t.subsec_nanos()),
    });
    let ts_ptr = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: a valid signal set, no siginfo asked for, a valid or null timeout.
    let taken = unsafe { libc::sigtimedwait(set.as_ref(), std::ptr::null_mut(), ts_ptr) };
    Signal::try_from(taken).ok()
}

/// Records a stop signal; true when `signal` is one.
fn is_stop(signal: Option<Signal>) -> bool {
    let stop = signal.is_some_and(|s| s != Signal::SIGCHLD);
    if stop {
        STOP.store(true, Ordering::SeqCst);
    }
    stop
}

/// Waits for the service to end (its status), or for a stop signal (`None`:
/// the service still runs).
fn wait_service(child: &mut Child, signals: &SigSet) -> std::io::Result<Option<ExitStatus>> {
    loop {
        // A SIGCHLD sent before this check stays pending: the wait below
        // returns at once.
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        if is_stop(next_signal(signals, None)) {
            return Ok(None);
        }
    }
}

/// Entry point of `knit-agent --root <root> supervise <name>`. Must be called
/// while the process is single-threaded (first thing in `main`): it forks.
pub fn run(root: &Path, name: &str) -> Result<()> {
    let host = Host::without_log(root);
    let spec_path = spec_file(name);
    let text = host.read(&spec_path).ok_or_else(|| {
        AgentError::new(
            ErrorCode::FailCommand,
            format!(
                "no service definition at {} (services are started by `knit-agent init`)",
                host.host_path(&spec_path)
            ),
        )
    })?;
    let spec: ServiceSpec = serde_json::from_str(&text).context(ErrorCode::FailCommand, || {
        format!("service definition {}", host.host_path(&spec_path))
    })?;
    // SAFETY: the caller guarantees a single-threaded process, so the child
    // may keep running Rust code after fork.
    match unsafe { fork() }.context(ErrorCode::FailCommand, || "fork".to_string())? {
        ForkResult::Parent { .. } => return Ok(()),
        ForkResult::Child => {}
    }
    // A session of its own: no controlling terminal, no signals from the
    // agent's process group; and no hold on the agent's working directory.
    let _ = setsid();
    let _ = std::env::set_current_dir("/");
    detach_fds();
    let code = match supervise(&host, &spec) {
        Ok(()) => 0,
        Err(e) => {
            log_line(&host, &spec, &format!("supervisor failed: {e}"));
            1
        }
    };
    remove(&host, &pid_file(&spec.name));
    std::process::exit(code);
}

/// Lets go of every descriptor inherited from whoever started the agent (the
/// starter reads our stderr until EOF; a boot script may wait on its pipes):
/// stdio goes to /dev/null, everything else is closed.
fn detach_fds() {
    if let Ok(null) = OpenOptions::new().read(true).write(true).open("/dev/null") {
        for fd in 0..=2 {
            let _ = nix::unistd::dup2(null.as_raw_fd(), fd);
        }
    }
    let inherited: Vec<i32> = std::fs::read_dir("/proc/self/fd")
        .map(|dir| {
            dir.flatten()
                .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse().ok()))
                .filter(|fd| *fd > 2)
                .collect()
        })
        .unwrap_or_default();
    for fd in inherited {
        // Includes the (now closed) directory handle: EBADF is fine.
        let _ = nix::unistd::close(fd);
    }
}

fn supervise(host: &Host, spec: &ServiceSpec) -> Result<()> {
    let signals = waited_signals();
    signals.thread_block().context(ErrorCode::FailCommand, || {
        "block the signals the supervisor waits for".to_string()
    })?;
    apply_limits(host, spec);
    stop_leftover(host, spec);
    host.write_file(
        &pid_file(&spec.name),
        format!("{}\n", std::process::id()).as_bytes(),
        0o644,
    )?;
    let mut backoff = Duration::from_secs(1);
    while !STOP.load(Ordering::SeqCst) {
        let started = Instant::now();
        match start(host, spec) {
            Ok(mut child) => {
                let pid = child.id();
                // Gone already when it has no stat: it is reaped below.
                if let Some(process) = i32::try_from(pid).ok().and_then(ProcRef::of) {
                    let _ = host.write_file(
                        &main_pid_file(&spec.name),
                        main_pid_text(process).as_bytes(),
                        0o644,
                    );
                }
                log_line(host, spec, &format!("started {} (pid {pid})", spec.name));
                let status = match wait_service(&mut child, &signals) {
                    Ok(Some(status)) => status.to_string(),
                    Ok(None) => {
                        stop(host, spec, &mut child);
                        remove(host, &main_pid_file(&spec.name));
                        return Ok(());
                    }
                    Err(e) => format!("cannot be waited for: {e}"),
                };
                remove(host, &main_pid_file(&spec.name));
                log_line(host, spec, &format!("{} exited: {status}", spec.name));
            }
            Err(e) => log_line(host, spec, &format!("cannot start {}: {e}", spec.name)),
        }
        if started.elapsed() >= HEALTHY_RUN {
            backoff = Duration::from_secs(1);
        }
        log_line(
            host,
            spec,
            &format!("restarting {} in {}s", spec.name, backoff.as_secs()),
        );
        let until = Instant::now() + backoff;
        while let Some(left) = until
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
        {
            if is_stop(next_signal(&signals, Some(left))) {
                break;
            }
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
    Ok(())
}

fn open_log(host: &Host, spec: &ServiceSpec) -> std::io::Result<File> {
    let path = host.path(&spec.log_file);
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    OpenOptions::new().create(true).append(true).open(path)
}

fn log_line(host: &Host, spec: &ServiceSpec, message: &str) {
    if let Ok(mut file) = open_log(host, spec) {
        let _ = writeln!(file, "{} [knit-supervise] {message}", rfc3339_now());
    }
}

fn start(host: &Host, spec: &ServiceSpec) -> std::io::Result<Child> {
    use std::os::unix::process::CommandExt;
    let out = open_log(host, spec)?;
    let err = out.try_clone()?;
    let mut command = Command::new(&spec.exec[0]);
    command
        .args(&spec.exec[1..])
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err);
    // SAFETY: between fork and exec only sigprocmask runs (async-signal-safe):
    // the service must not inherit the signals the supervisor blocks.
    unsafe {
        command.pre_exec(|| {
            let empty = SigSet::empty();
            if libc::sigprocmask(libc::SIG_SETMASK, empty.as_ref(), std::ptr::null_mut()) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    command.spawn()
}

/// Limits are set on the supervisor and inherited by the service. Raising a
/// hard limit needs privilege; a limit that cannot be set is logged and the
/// nearest allowed value used, and the service still starts.
fn apply_limits(host: &Host, spec: &ServiceSpec) {
    for (resource, name, value) in [
        (Resource::RLIMIT_NOFILE, "LimitNOFILE", spec.limit_nofile),
        (Resource::RLIMIT_CORE, "LimitCORE", spec.limit_core),
        (Resource::RLIMIT_MEMLOCK, "LimitMEMLOCK", spec.limit_memlock),
    ] {
        let limit = match value {
            Some(v) => v,
            // The kernel caps open files at fs.nr_open; systemd maps infinity to it.
            None if resource == Resource::RLIMIT_NOFILE => {
                std::fs::read_to_string("/proc/sys/fs/nr_open")
                    .ok()
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(1_048_576)
            }
            None => RLIM_INFINITY,
        };
        if let Err(e) = setrlimit(resource, limit, limit) {
            // Without CAP_SYS_RESOURCE a hard limit cannot be raised: get as
            // close as allowed.
            let shown = value.map_or("infinity".to_string(), |v| v.to_string());
            let capped = getrlimit(resource).map(|(_, hard)| hard.min(limit));
            let applied = capped.and_then(|c| setrlimit(resource, c, c).map(|()| c));
            let outcome = match applied {
                Ok(c) => format!("using {c}"),
                Err(e) => format!("left unchanged ({e})"),
            };
            log_line(
                host,
                spec,
                &format!("cannot apply {name}={shown} ({e}): {outcome}"),
            );
        }
    }
}

/// A service process left running by a supervisor that was killed (its pid
/// file survived) is stopped first, so two copies never fight over a socket.
/// It is recognized by pid and start time, never by pid alone.
fn stop_leftover(host: &Host, spec: &ServiceSpec) {
    let Some(leftover) = main_process(host, &spec.name).filter(ProcRef::alive) else {
        return;
    };
    let pid = leftover.pid;
    log_line(
        host,
        spec,
        &format!("stopping leftover {} (pid {pid})", spec.name),
    );
    // Not our child (the killed supervisor's): signalled only while it is
    // still the process the file names.
    let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
    let deadline = Instant::now() + STOP_GRACE;
    while leftover.alive() && Instant::now() < deadline {
        std::thread::sleep(POLL);
    }
    if leftover.alive() {
        let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
    }
}

/// Stops the service (SIGTERM, [`STOP_GRACE`], SIGKILL), logging how it went.
fn stop(host: &Host, spec: &ServiceSpec, child: &mut Child) {
    log_line(
        host,
        spec,
        &format!("stopping {} (pid {})", spec.name, child.id()),
    );
    let outcome = match terminate(child, &spec.name, STOP_GRACE) {
        Ok(stopped) if stopped.killed => format!(
            "{} ignored SIGTERM for {}s: killed",
            spec.name,
            STOP_GRACE.as_secs()
        ),
        Ok(_) => format!("{} stopped", spec.name),
        Err(e) => format!("{} could not be stopped: {e}", spec.name),
    };
    log_line(host, spec, &outcome);
}

fn remove(host: &Host, abs: &str) {
    let _ = std::fs::remove_file(host.path(abs));
}
