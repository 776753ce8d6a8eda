//! Host commands, each with a deadline and bounded output.

use crate::error::{QemuError, Result};
use std::process::Command;
use std::time::Duration;

/// Output kept from a command (stdout and stderr each).
const MAX_OUTPUT: usize = 1 << 20;

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
    let out = knit_os::command::run(Command::new(program).args(args), timeout, MAX_OUTPUT)
        .map_err(|e| match e {
            knit_os::OsError::NotStarted { command, source }
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                QemuError::Command {
                    command,
                    status: "not started".into(),
                    stderr: format!(
                        "{program} is not installed (`scripts/setup.sh --qemu` installs it)"
                    ),
                }
            }
            e => e.into(),
        })?;
    Ok((out.status.code(), out.stdout_text(), out.stderr_text()))
}

/// `program` on PATH.
pub fn find_program(program: &str) -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}
