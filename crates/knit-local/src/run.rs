//! The one way knit-local runs host tools (ip, tc, losetup, mkfs, cp).

use crate::error::{LocalError, Result};
use std::process::{Command, Stdio};

/// Runs `program args…`, returns stdout; a non-zero exit is an error carrying stderr.
pub fn run(program: &str, args: &[&str]) -> Result<String> {
    let output = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| LocalError::Command {
            command: render(program, args),
            status: "not started".into(),
            stderr: e.to_string(),
        })?;
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
