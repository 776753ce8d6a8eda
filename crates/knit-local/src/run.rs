//! The one way knit-local runs host tools (ip, tc, losetup, mkfs, cp).

use crate::error::{LocalError, Result};
use std::process::{Command, Stdio};

/// Runs `program args…`, returns stdout; a non-zero exit is an error carrying stderr.
pub fn run(program: &str, args: &[&str]) -> Result<String> {
    run_input(program, args, "")
}

/// Like [`run`], with `input` on stdin.
pub fn run_input(program: &str, args: &[&str], input: &str) -> Result<String> {
    let failed = |e: std::io::Error| LocalError::Command {
        command: render(program, args),
        status: "not started".into(),
        stderr: e.to_string(),
    };
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(failed)?;
    if let Some(mut stdin) = child.stdin.take() {
        // Small inputs only (ip batches): fits the pipe, no deadlock.
        std::io::Write::write_all(&mut stdin, input.as_bytes()).map_err(failed)?;
    }
    let output = child.wait_with_output().map_err(failed)?;
    if !output.status.success() {
        return Err(LocalError::Command {
            command: render(program, args),
            status: output.status.to_string(),
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// Like [`run`] for cleanup paths: a failure whose stderr matches one of
/// `absent` means the thing is already gone, which is success.
pub fn run_absent_ok(program: &str, args: &[&str], absent: &[&str]) -> Result<()> {
    match run(program, args) {
        Ok(_) => Ok(()),
        Err(LocalError::Command { stderr, .. }) if absent.iter().any(|a| stderr.contains(a)) => {
            Ok(())
        }
        Err(e) => Err(e),
    }
}

fn render(program: &str, args: &[&str]) -> String {
    let mut s = program.to_string();
    for a in args {
        s.push(' ');
        s.push_str(a);
    }
    s
}

/// Finds `name` on `PATH` (the usual system directories when unset).
pub(crate) fn find_program(name: &str) -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/sbin:/usr/bin:/sbin:/bin".into());
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// The local cloud changes the host (mounts, devices, namespaces): root only.
pub fn require_root() -> Result<()> {
    let uid = nix::unistd::geteuid();
    if uid.is_root() {
        Ok(())
    } else {
        Err(LocalError::NotRoot { uid: uid.as_raw() })
    }
}
