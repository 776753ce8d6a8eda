//! Host commands, each with a deadline and bounded output.

use crate::error::{QemuError, Result};
use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Output kept from a command (stdout and stderr each).
const MAX_OUTPUT: u64 = 1 << 20;

/// Runs `program args…`, killing it after `timeout`; its stdout on
/// success, a [`QemuError::Command`] naming command, status and stderr
/// otherwise.
pub fn run(program: &str, args: &[&str], timeout: Duration) -> Result<String> {
    let out = run_status(program, args, timeout)?;
    if out.0 != Some(0) {
        return Err(QemuError::Command {
            command: format!("{program} {}", args.join(" ")),
            status: match out.0 {
                Some(c) => format!("exit status {c}"),
                None => "killed by a signal".into(),
            },
            stderr: out.2.trim().chars().take(4000).collect(),
        });
    }
    Ok(out.1)
}

/// Like [`run`] but a non-zero exit is returned, not an error:
/// (exit code, stdout, stderr).
pub fn run_status(
    program: &str,
    args: &[&str],
    timeout: Duration,
) -> Result<(Option<i32>, String, String)> {
    let command = format!("{program} {}", args.join(" "));
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| QemuError::Command {
            command: command.clone(),
            status: "not started".into(),
            stderr: if e.kind() == std::io::ErrorKind::NotFound {
                format!("{program} is not installed (`scripts/setup.sh --qemu` installs it)")
            } else {
                e.to_string()
            },
        })?;
    let readers = [
        child.stdout.take().map(boxed),
        child.stderr.take().map(boxed),
    ]
    .map(|pipe| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(p) = pipe {
                let _ = p.take(MAX_OUTPUT).read_to_end(&mut buf);
            }
            String::from_utf8_lossy(&buf).into_owned()
        })
    });
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Ok(None) => {
                // Our own child, not reaped yet.
                let _ = child.kill();
                let _ = child.wait();
                return Err(QemuError::Timeout {
                    what: command,
                    secs: timeout.as_secs(),
                });
            }
            Err(e) => {
                return Err(QemuError::Command {
                    command,
                    status: "wait failed".into(),
                    stderr: e.to_string(),
                })
            }
        }
    };
    let [out, err] = readers.map(|r| r.join().unwrap_or_default());
    Ok((status.code(), out, err))
}

fn boxed(r: impl Read + Send + 'static) -> Box<dyn Read + Send> {
    Box::new(r)
}

/// `program` on PATH.
pub fn find_program(program: &str) -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}
