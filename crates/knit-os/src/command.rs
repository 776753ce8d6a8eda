//! Commands with a deadline and an output cap: every program knit runs
//! and waits for is started with stdin closed (or fed a given input from a
//! thread, then closed), its stdout and stderr read in threads (so a
//! chatty program never blocks on a full pipe) up to a cap each, and
//! killed (our own child, by its PID, not yet reaped) when it outlives its
//! deadline. A child started with stdio of its own (a log file, a
//! long-running service) is waited for with [`wait_while`] and stopped
//! with [`terminate`] (SIGTERM, a grace, then SIGKILL).

use crate::error::{OsError, Result};
use std::io::{Read, Write};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// A running child is polled first after this long, then at twice the
/// pause each time up to [`POLL_MAX`]: a quick command is seen to end at
/// once, a long-running one costs 20 wake-ups a second.
const POLL_FIRST: Duration = Duration::from_millis(1);
const POLL_MAX: Duration = Duration::from_millis(50);

/// Of each stream of a command killed at its deadline, the last this many
/// bytes are kept in [`OsError::TimedOut`]: enough to see where it hung,
/// small enough to carry in an error.
pub const PRINTED_TAIL: usize = 4096;

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
/// deadline the child is killed and reaped: [`OsError::TimedOut`], with
/// the end of what it had written. A non-zero exit is not an error here:
/// the caller reads `status`.
pub fn run(cmd: &mut Command, timeout: Duration, cap: usize) -> Result<Output> {
    run_with_input(cmd, &[], timeout, cap)
}

/// Like [`run`], with `input` written to the command's stdin and stdin
/// then closed (an empty `input`: stdin closed from the start). The input
/// is written from a thread of its own, so a command that answers before
/// it has read everything (its stdout filling while its stdin is full) is
/// drained meanwhile and never deadlocks with us. A command that ends
/// without reading all of its input is judged by its status alone, as in
/// a shell pipe.
pub fn run_with_input(
    cmd: &mut Command,
    input: &[u8],
    timeout: Duration,
    cap: usize,
) -> Result<Output> {
    let shown = display(cmd);
    let stdin = if input.is_empty() {
        Stdio::null()
    } else {
        Stdio::piped()
    };
    let mut child = cmd
        .stdin(stdin)
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
    feed(child.stdin.take(), input);
    let waited = wait_while(&mut child, &shown, || Instant::now() < deadline);
    let status = match waited {
        Ok(Some(status)) => status,
        other => {
            // Our own child, not reaped yet: its PID is still ours.
            let _ = child.kill();
            let _ = child.wait();
            // A wait that failed is the error; else the deadline passed.
            other?;
            // Its last writes are in the pipes: a moment for the readers.
            wait_for_readers(&done_rx, Instant::now());
            return Err(OsError::TimedOut {
                command: shown,
                after: timeout,
                stdout: printed_tail(&out.take().0),
                stderr: printed_tail(&err.take().0),
            });
        }
    };
    // The pipes close when the child ends, unless a process it left behind
    // holds them: wait for the readers no longer than the deadline.
    wait_for_readers(&done_rx, deadline);
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

/// Writes `input` to the child's stdin from a thread, then closes it. The
/// thread ends when all is written or the pipe breaks (the child ended or
/// was killed without reading it all, and left no process holding it):
/// nobody waits for it, so a pipe held unread never holds the caller.
fn feed(stdin: Option<ChildStdin>, input: &[u8]) {
    if let Some(mut stdin) = stdin {
        let input = input.to_vec();
        std::thread::spawn(move || {
            // A broken pipe is the child's choice; its status tells.
            let _ = stdin.write_all(&input);
        });
    }
}

/// Waits until both stream readers are done, until `until` (at least
/// [`POLL_MAX`] each, so that the last bytes of an ended child are read).
fn wait_for_readers(done: &mpsc::Receiver<()>, until: Instant) {
    for _ in 0..2 {
        let left = until.saturating_duration_since(Instant::now());
        if done.recv_timeout(left.max(POLL_MAX)).is_err() {
            break;
        }
    }
}

/// The last [`PRINTED_TAIL`] bytes of a stream, as text (invalid UTF-8,
/// a character cut at the start included, replaced): what an error keeps.
pub fn printed_tail(bytes: &[u8]) -> String {
    let from = bytes.len().saturating_sub(PRINTED_TAIL);
    String::from_utf8_lossy(&bytes[from..]).into_owned()
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
        // The child writes its PID and a line on each stream first, then
        // sleeps far past the deadline.
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("pid");
        let script = format!(
            "echo $$ > {}; echo begun; echo waiting >&2; exec sleep 300",
            pid_file.display()
        );
        let err = run(&mut sh(&script), Duration::from_secs(2), 1024).unwrap_err();
        assert_eq!(err.code(), "CommandTimedOut");
        assert!(err.to_string().contains("sleep 300"), "{err}");
        assert!(
            err.to_string().ends_with("its stderr so far: waiting"),
            "{err}"
        );
        let OsError::TimedOut {
            after,
            stdout,
            stderr,
            ..
        } = err
        else {
            panic!("not a timeout: {err}")
        };
        assert_eq!(after, Duration::from_secs(2));
        assert_eq!((stdout.as_str(), stderr.as_str()), ("begun\n", "waiting\n"));
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

    /// 1 MiB of numbered lines: more than a pipe holds, each part different.
    fn big_input() -> Vec<u8> {
        (0..100_000)
            .flat_map(|i| format!("line {i:06}\n").into_bytes())
            .collect()
    }

    #[test]
    fn input_is_delivered_while_the_output_is_drained() {
        // cat writes as it reads: its stdout fills long before its stdin
        // is written, which deadlocks a runner writing before it reads.
        let input = big_input();
        let out = run_with_input(
            &mut Command::new("cat"),
            &input,
            Duration::from_secs(60),
            2 << 20,
        )
        .unwrap();
        assert!(out.success());
        assert!(!out.stdout_truncated);
        assert!(out.stdout == input, "{} bytes back", out.stdout.len());
        // Small input, read to its end: the stream is closed after it.
        let out =
            run_with_input(&mut sh("wc -l"), b"a\nb\n", Duration::from_secs(30), 100).unwrap();
        assert_eq!(out.stdout_text().trim(), "2");
    }

    #[test]
    fn a_command_that_never_reads_its_input_is_killed_at_the_deadline() {
        // Sleeps without reading: the writer blocks on the full pipe until
        // the kill breaks it; the runner returns all the same.
        let err = run_with_input(
            &mut sh("echo waiting >&2; exec sleep 300"),
            &big_input(),
            Duration::from_secs(2),
            1024,
        )
        .unwrap_err();
        assert_eq!(err.code(), "CommandTimedOut");
        assert!(
            err.to_string().contains("its stderr so far: waiting"),
            "{err}"
        );
    }

    #[test]
    fn output_of_an_input_over_the_cap_is_cut_and_a_command_may_leave_input_unread() {
        let out = run_with_input(
            &mut Command::new("cat"),
            &big_input(),
            Duration::from_secs(60),
            1000,
        )
        .unwrap();
        assert!(out.success());
        assert_eq!(out.stdout, big_input()[..1000]);
        assert!(out.stdout_truncated);
        // Ends at once without reading: the broken pipe is not an error,
        // its status is the answer.
        let out =
            run_with_input(&mut sh("exit 5"), &big_input(), Duration::from_secs(30), 10).unwrap();
        assert_eq!(out.status.code(), Some(5));
    }

    #[test]
    fn an_error_keeps_the_end_of_a_stream() {
        assert_eq!(printed_tail(b"short"), "short");
        let long = big_input();
        let kept = printed_tail(&long);
        assert_eq!(kept.len(), PRINTED_TAIL);
        assert!(kept.ends_with("line 099999\n"), "{kept}");
        // A character cut at the start is replaced, not an error.
        let mut cut = "é".repeat(PRINTED_TAIL).into_bytes();
        cut.truncate(PRINTED_TAIL * 2 - 1);
        assert!(printed_tail(&cut).starts_with('\u{FFFD}'));
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
