//! Commands with a deadline and an output cap: every program knit runs
//! and waits for is started with stdin closed, its stdout and stderr read
//! in threads (so a chatty program never blocks on a full pipe) up to a
//! cap each, and killed (our own child, by its PID, not yet reaped) when
//! it outlives its deadline. A child started with stdio of its own (a log
//! file, a long-running service) is waited for with [`wait_while`] and
//! stopped with [`terminate`] (SIGTERM, a grace, then SIGKILL).

use crate::error::{OsError, Result};
use std::io::Read;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// A running child is polled first after this long, then at twice the
/// pause each time up to [`POLL_MAX`]: a quick command is seen to end at
/// once, a long-running one costs 20 wake-ups a second.
const POLL_FIRST: Duration = Duration::from_millis(1);
const POLL_MAX: Duration = Duration::from_millis(50);

/// What a command left: its status and its output, each stream cut at the
/// cap (`*_truncated` says so).
#[derive(Debug)]
pub struct Output {
    pub status: ExitStatus,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
}

impl Output {
    pub fn success(&self) -> bool {
        self.status.success()
    }

    /// stdout as text (invalid UTF-8 replaced).
    pub fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    /// stderr as text (invalid UTF-8 replaced).
    pub fn stderr_text(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }
}

/// `cmd` as it is shown in errors: the program and its arguments.
pub fn display(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Runs `cmd` to its end within `timeout`, keeping at most `cap` bytes of
/// each of stdout and stderr (the rest is read and dropped). Past the
/// deadline the child is killed and reaped: [`OsError::TimedOut`]. A
/// non-zero exit is not an error here: the caller reads `status`.
pub fn run(cmd: &mut Command, timeout: Duration, cap: usize) -> Result<Output> {
    let shown = display(cmd);
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| OsError::NotStarted {
            command: shown.clone(),
            source,
        })?;
    let deadline = Instant::now() + timeout;
    let (done_tx, done_rx) = mpsc::channel();
    let out = Capture::start(child.stdout.take(), cap, done_tx.clone());
    let err = Capture::start(child.stderr.take(), cap, done_tx);
    let waited = wait_while(&mut child, &shown, || Instant::now() < deadline);
    let status = match waited {
        Ok(Some(status)) => status,
        other => {
            // Our own child, not reaped yet: its PID is still ours.
            let _ = child.kill();
            let _ = child.wait();
            return Err(match other {
                Err(e) => e,
                _ => OsError::TimedOut {
                    command: shown,
                    after: timeout,
                },
            });
        }
    };
    // The pipes close when the child ends, unless a process it left behind
    // holds them: wait for the readers no longer than the deadline.
    for _ in 0..2 {
        let left = deadline.saturating_duration_since(Instant::now());
        if done_rx.recv_timeout(left.max(POLL_MAX)).is_err() {
            break;
        }
    }
    let (stdout, stdout_truncated) = out.take();
    let (stderr, stderr_truncated) = err.take();
    Ok(Output {
        status,
        stdout,
        stderr,
        stdout_truncated,
        stderr_truncated,
    })
}

/// Waits for our own child while `keep_waiting()` holds (asked at every
/// poll): its status once it has ended, `None` when `keep_waiting` gave up
/// first (the child still runs and is the caller's to stop). `command`
/// names it in errors.
pub fn wait_while(
    child: &mut Child,
    command: &str,
    mut keep_waiting: impl FnMut() -> bool,
) -> Result<Option<ExitStatus>> {
    let mut pause = POLL_FIRST;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Ok(Some(status)),
            Ok(None) if keep_waiting() => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(POLL_MAX);
            }
            Ok(None) => return Ok(None),
            Err(source) => {
                return Err(OsError::NotStarted {
                    command: command.to_string(),
                    source,
                })
            }
        }
    }
}

/// How a child stopped by [`terminate`] ended.
#[derive(Debug)]
pub struct Stopped {
    pub status: ExitStatus,
    /// It was still running `grace` after SIGTERM and was killed (SIGKILL).
    pub killed: bool,
}

/// Stops our own child as a service manager does: SIGTERM, up to `grace`
/// for it to end, then SIGKILL; reaped either way. It is signalled only
/// while not reaped (its PID still ours), so no other process ever is.
pub fn terminate(child: &mut Child, command: &str, grace: Duration) -> Result<Stopped> {
    // Reaped already (std keeps the status): its PID may be another's now.
    if let Ok(Some(status)) = child.try_wait() {
        return Ok(Stopped {
            status,
            killed: false,
        });
    }
    if let Ok(pid) = i32::try_from(child.id()) {
        // Failing only for a PID that is not ours: SIGKILL follows anyway.
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGTERM,
        );
    }
    let until = Instant::now() + grace;
    let waited = wait_while(child, command, || Instant::now() < until);
    if let Ok(Some(status)) = waited {
        return Ok(Stopped {
            status,
            killed: false,
        });
    }
    let _ = child.kill();
    let status = child.wait().map_err(|source| OsError::NotStarted {
        command: command.to_string(),
        source,
    })?;
    waited?;
    Ok(Stopped {
        status,
        killed: true,
    })
}

/// One stream read in a thread into a shared buffer (so what was read is
/// there even when a reader is left behind).
struct Capture(Arc<Mutex<(Vec<u8>, bool)>>);

impl Capture {
    fn start(
        pipe: Option<impl Read + Send + 'static>,
        cap: usize,
        done: mpsc::Sender<()>,
    ) -> Capture {
        let shared = Arc::new(Mutex::new((Vec::new(), false)));
        let buf = Arc::clone(&shared);
        std::thread::spawn(move || {
            if let Some(mut pipe) = pipe {
                let mut chunk = [0u8; 8192];
                loop {
                    let n = match pipe.read(&mut chunk) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => n,
                    };
                    let Ok(mut b) = buf.lock() else { break };
                    let room = cap.saturating_sub(b.0.len());
                    b.0.extend_from_slice(&chunk[..n.min(room)]);
                    if n > room {
                        b.1 = true;
                    }
                }
            }
            let _ = done.send(());
        });
        Capture(shared)
    }

    fn take(self) -> (Vec<u8>, bool) {
        match self.0.lock() {
            Ok(mut b) => (std::mem::take(&mut b.0), b.1),
            Err(_) => (Vec::new(), false),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Command {
        let mut c = Command::new("sh");
        c.arg("-c").arg(script);
        c
    }

    #[test]
    fn a_command_gives_its_status_and_both_streams() {
        let out = run(
            &mut sh("echo out; echo err >&2; exit 3"),
            Duration::from_secs(30),
            1024,
        )
        .unwrap();
        assert_eq!(out.status.code(), Some(3));
        assert!(!out.success());
        assert_eq!(out.stdout_text(), "out\n");
        assert_eq!(out.stderr_text(), "err\n");
        assert!(!out.stdout_truncated && !out.stderr_truncated);
    }

    #[test]
    fn a_command_that_outlives_its_deadline_is_killed_and_reported() {
        // The child writes its PID first, then sleeps far past the deadline.
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("pid");
        let script = format!("echo $$ > {}; exec sleep 300", pid_file.display());
        let err = run(&mut sh(&script), Duration::from_secs(2), 1024).unwrap_err();
        assert_eq!(err.code(), "CommandTimedOut");
        assert!(err.to_string().contains("sleep 300"), "{err}");
        let pid: i32 = std::fs::read_to_string(&pid_file)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        // Killed and reaped: no such process (or a new one with that PID).
        assert!(crate::proc::cmdline(pid).is_none_or(|a| a != [b"sleep".to_vec(), b"300".to_vec()]));
    }

    #[test]
    fn output_over_the_cap_is_cut_and_reported_and_the_command_still_ends() {
        // 1 MiB on stdout, far more than a pipe holds: the reader drains it.
        let out = run(
            &mut sh("head -c 1048576 /dev/zero; echo done >&2"),
            Duration::from_secs(60),
            1000,
        )
        .unwrap();
        assert!(out.success());
        assert_eq!(out.stdout.len(), 1000);
        assert!(out.stdout_truncated);
        assert_eq!(out.stderr_text(), "done\n");
        assert!(!out.stderr_truncated);
    }

    /// Starts `script` with a `ready` file it writes once its traps are
    /// set, and waits for that file.
    fn started(script: &str) -> (Child, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let child = sh(script)
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while !dir.path().join("ready").exists() {
            assert!(Instant::now() < deadline, "{script} never got ready");
            std::thread::sleep(POLL_MAX);
        }
        (child, dir)
    }

    #[test]
    fn wait_while_gives_the_status_or_gives_up_when_told() {
        let mut done = sh("exit 4").spawn().unwrap();
        let status = wait_while(&mut done, "exit 4", || true).unwrap();
        assert_eq!(status.and_then(|s| s.code()), Some(4));
        // Reaped already: not signalled (its PID may be another's), its status kept.
        let stopped = terminate(&mut done, "exit 4", Duration::from_secs(30)).unwrap();
        assert!(!stopped.killed);
        assert_eq!(stopped.status.code(), Some(4));
        let (mut running, _dir) = started("touch ready; exec sleep 300");
        let mut asked = 0;
        let gave_up = wait_while(&mut running, "sleep 300", || {
            asked += 1;
            asked < 3
        })
        .unwrap();
        assert!(gave_up.is_none());
        assert_eq!(asked, 3);
        // Still running: given up on, not stopped.
        assert_eq!(running.try_wait().unwrap(), None);
        let stopped = terminate(&mut running, "sleep 300", Duration::from_secs(30)).unwrap();
        assert!(!stopped.killed);
    }

    #[test]
    fn terminate_lets_a_child_end_on_sigterm_and_kills_one_that_ignores_it() {
        use std::os::unix::process::ExitStatusExt;
        // Ends on SIGTERM with its own status (7), its sleep taken along.
        let (mut polite, _a) =
            started("trap 'kill $!; exit 7' TERM; sleep 300 & touch ready; wait");
        let stopped = terminate(&mut polite, "polite", Duration::from_secs(30)).unwrap();
        assert!(!stopped.killed);
        assert_eq!(stopped.status.code(), Some(7));
        // An ignored SIGTERM stays ignored across exec: SIGKILL after the grace.
        let (mut stubborn, _b) = started("trap '' TERM; touch ready; exec sleep 300");
        let pid = stubborn.id() as i32;
        let began = Instant::now();
        let stopped = terminate(&mut stubborn, "stubborn", Duration::from_secs(1)).unwrap();
        assert!(stopped.killed);
        assert_eq!(stopped.status.signal(), Some(9));
        assert!(began.elapsed() >= Duration::from_secs(1));
        // Reaped: nothing of it is left under its PID.
        assert!(crate::proc::cmdline(pid).is_none_or(|a| a != [b"sleep".to_vec(), b"300".to_vec()]));
    }

    #[test]
    fn a_program_that_is_not_there_is_not_started() {
        let err = run(
            &mut Command::new("/nonexistent/knit-no-such-program"),
            Duration::from_secs(5),
            10,
        )
        .unwrap_err();
        assert_eq!(err.code(), "CommandNotStarted");
        assert!(err.to_string().contains("knit-no-such-program"), "{err}");
    }
}
