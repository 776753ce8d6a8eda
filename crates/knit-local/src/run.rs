//! The one way knit-local runs host tools (ip, tc, nft, losetup, mkfs, cp…):
//! through `knit_os::command`, each with a deadline set by what the tool's
//! time grows with ([`Tool`]) and its output capped, so a hung tool fails
//! the call instead of hanging the local cloud.

use crate::error::{LocalError, Result};
use std::process::Command;
use std::time::Duration;

/// What a host tool's running time grows with, which sets its deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tool {
    /// Changes or lists kernel objects (ip, tc, nft, losetup, sysctl) or
    /// reads a few small files (sha256sum of a key, dpkg-query): seconds,
    /// even with a thousand machines on a busy host.
    Quick,
    /// Writes or reads the bytes of a disk or an image (mkfs, cp of a
    /// disk file, du of a root tree): minutes for a big one.
    Bulk,
}

impl Tool {
    /// The class of `program`: the tools whose time grows with bytes are
    /// named; every other is [`Tool::Quick`].
    fn of(program: &str) -> Tool {
        match program {
            "mkfs.xfs" | "mkfs.ext4" | "cp" | "du" => Tool::Bulk,
            _ => Tool::Quick,
        }
    }

    /// How long a tool of this class may run before it is killed: a margin
    /// wide enough that a slow host never meets it, only a hung tool.
    fn deadline(self) -> Duration {
        match self {
            Tool::Quick => Duration::from_secs(60),
            Tool::Bulk => Duration::from_secs(3600),
        }
    }
}

/// Output kept of each stream: the largest are `ip -j route` and the nft
/// set listings, a few hundred bytes a machine.
const OUTPUT_CAP: usize = 8 << 20;

/// Runs `program args…`, returns stdout; a non-zero exit is an error carrying stderr.
pub fn run(program: &str, args: &[&str]) -> Result<String> {
    run_input(program, args, "")
}

/// Like [`run`], with `input` on stdin.
pub fn run_input(program: &str, args: &[&str], input: &str) -> Result<String> {
    run_within(
        program,
        args,
        input,
        Tool::of(program).deadline(),
        OUTPUT_CAP,
    )
}

/// Runs `program args…` with `input` on stdin, killed after `deadline`,
/// keeping `cap` bytes of each stream: its stdout; a non-zero exit, a
/// deadline passed or stdout over the cap is a [`LocalError::Command`].
pub(crate) fn run_within(
    program: &str,
    args: &[&str],
    input: &str,
    deadline: Duration,
    cap: usize,
) -> Result<String> {
    let mut cmd = Command::new(program);
    cmd.args(args);
    let out = knit_os::command::run_with_input(&mut cmd, input.as_bytes(), deadline, cap)?;
    let failed = |status: String| LocalError::Command {
        command: knit_os::command::display(&cmd),
        status,
        stderr: knit_os::command::printed_tail(&out.stderr)
            .trim()
            .to_string(),
    };
    if !out.success() {
        return Err(failed(out.status.to_string()));
    }
    // Cut output is not what the tool said: no caller parses half of it.
    if out.stdout_truncated {
        return Err(failed(format!("printed more than {cap} bytes")));
    }
    Ok(out.stdout_text())
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::TIMED_OUT;

    fn command_error(e: LocalError) -> (String, String, String) {
        match e {
            LocalError::Command {
                command,
                status,
                stderr,
            } => (command, status, stderr),
            other => panic!("not a command error: {other}"),
        }
    }

    #[test]
    fn a_tool_past_its_deadline_is_killed_and_reported_with_what_it_printed() {
        let err = run_within("sleep", &["300"], "", Duration::from_secs(1), 1024).unwrap_err();
        assert_eq!(err.code(), "LocalCommand");
        let (command, status, stderr) = command_error(err);
        assert_eq!(command, "sleep 300");
        assert!(status.starts_with(TIMED_OUT), "{status}");
        assert_eq!(status, "timed out after 1 s: killed");
        assert_eq!(stderr, "");
        // What it printed before it hung is in the error, stderr first.
        let script = "echo step 1; echo formatting >&2; exec sleep 300";
        let err = run_within("sh", &["-c", script], "", Duration::from_secs(1), 1024).unwrap_err();
        let (_, status, stderr) = command_error(err);
        assert!(status.starts_with(TIMED_OUT), "{status}");
        assert_eq!(stderr, "formatting\nstdout: step 1");
    }

    #[test]
    fn a_tool_gets_its_input_and_a_failure_carries_its_stderr() {
        assert_eq!(run_input("cat", &[], "a\nb\n").unwrap(), "a\nb\n");
        let err = run("sh", &["-c", "echo out; echo bad >&2; exit 3"]).unwrap_err();
        let (command, status, stderr) = command_error(err);
        assert_eq!(command, "sh -c echo out; echo bad >&2; exit 3");
        assert_eq!(status, "exit status: 3");
        assert_eq!(stderr, "bad");
    }

    #[test]
    fn a_missing_tool_is_not_started() {
        // net.rs tells a missing nft by this status.
        let err = run("/nonexistent/knit-no-such-tool", &["x"]).unwrap_err();
        let (command, status, _) = command_error(err);
        assert_eq!(command, "/nonexistent/knit-no-such-tool x");
        assert_eq!(status, "not started");
    }

    #[test]
    fn stdout_over_the_cap_is_an_error_not_half_an_answer() {
        let err = run_within(
            "head",
            &["-c", "5000", "/dev/zero"],
            "",
            Duration::from_secs(30),
            1000,
        )
        .unwrap_err();
        let (_, status, _) = command_error(err);
        assert_eq!(status, "printed more than 1000 bytes");
        let out = run_within(
            "head",
            &["-c", "1000", "/dev/zero"],
            "",
            Duration::from_secs(30),
            1000,
        )
        .unwrap();
        assert_eq!(out.len(), 1000);
    }

    #[test]
    fn an_absent_thing_is_success_only_when_stderr_says_so() {
        let gone = ["-c", "echo 'Cannot find device \"x\"' >&2; exit 1"];
        run_absent_ok("sh", &gone, &["Cannot find device"]).unwrap();
        let err = run_absent_ok("sh", &gone, &["No such file"]).unwrap_err();
        assert!(command_error(err).2.contains("Cannot find device"));
    }

    #[test]
    fn tools_that_move_bytes_get_the_long_deadline() {
        for bulk in ["mkfs.xfs", "mkfs.ext4", "cp", "du"] {
            assert_eq!(Tool::of(bulk), Tool::Bulk, "{bulk}");
        }
        for quick in ["ip", "tc", "nft", "losetup", "sysctl"] {
            assert_eq!(Tool::of(quick), Tool::Quick, "{quick}");
        }
        assert!(Tool::Bulk.deadline() > Tool::Quick.deadline());
    }
}
