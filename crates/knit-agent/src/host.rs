//! The `Host` seam: everything the agent asks of the machine goes through
//! here, with every absolute path resolved under `--root`. There is one
//! implementation, the real one; tests aim it at a tree and real loop devices.

use crate::error::{AgentError, Context, Result};
use crate::files::{under, write_atomic};
use crate::ledger::UndoLedger;
use crate::log::DeployLog;
use knit_api::ErrorCode;
use knit_os::OsError;
use std::ffi::OsStr;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The most of each of a command's stdout and stderr kept (package
/// listings and installers' chatter stay far below it).
const OUTPUT_CAP: usize = 16 << 20;

pub struct Host {
    root: PathBuf,
    pub log: DeployLog,
    /// Wall time spent inside external commands, for the overhead benchmark.
    command_time: Mutex<Duration>,
    /// The undo ledger every change to the machine is written to first.
    ledger: UndoLedger,
}

/// What a finished command left behind.
#[derive(Debug)]
pub struct CommandOutput {
    pub stdout: String,
    pub stderr: String,
}

impl Host {
    pub fn new(root: impl Into<PathBuf>) -> Host {
        let root = root.into();
        let log = DeployLog::open(&root);
        Host {
            ledger: UndoLedger::new(&root),
            root,
            log,
            command_time: Mutex::new(Duration::ZERO),
        }
    }

    /// A host for read-only commands (`plan`, `status`): no log file is created.
    pub fn without_log(root: impl Into<PathBuf>) -> Host {
        let root = root.into();
        Host {
            ledger: UndoLedger::new(&root),
            root,
            log: DeployLog::disabled(),
            command_time: Mutex::new(Duration::ZERO),
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// True when the agent works on the machine it runs on (no `--root`).
    /// Anything host-wide (clock, kernel parameters, hostname, package
    /// manager) is only touched then.
    pub fn is_live(&self) -> bool {
        self.root == Path::new("/")
    }

    pub fn path(&self, abs: &str) -> PathBuf {
        under(&self.root, abs)
    }

    /// The node-absolute path rendered for a config file read by a process
    /// on this host: unchanged when live, prefixed by the root otherwise.
    pub fn host_path(&self, abs: &str) -> String {
        self.path(abs).to_string_lossy().into_owned()
    }

    pub fn exists(&self, abs: &str) -> bool {
        self.path(abs).exists()
    }

    pub fn read(&self, abs: &str) -> Option<String> {
        fs::read_to_string(self.path(abs)).ok()
    }

    /// The undo ledger of this tree, where a change is noted before it is
    /// made (mounts, services, kernel settings; files and directories are
    /// noted by `write_file` and `create_dir` themselves).
    pub fn ledger(&self) -> &UndoLedger {
        &self.ledger
    }

    pub fn command_time(&self) -> Duration {
        self.command_time.lock().map(|d| *d).unwrap_or_default()
    }

    /// Writes a file atomically (temp + fsync + rename), creating parents;
    /// recorded in the undo ledger first.
    pub fn write_file(&self, abs: &str, contents: &[u8], mode: u32) -> Result<()> {
        self.ledger.note_file(abs)?;
        write_atomic(&self.path(abs), contents, mode)
    }

    /// Creates a directory and its parents; recorded in the undo ledger
    /// first (only what did not exist).
    pub fn create_dir(&self, abs: &str) -> Result<()> {
        self.ledger.note_dir(abs)?;
        let path = self.path(abs);
        fs::create_dir_all(&path).context(ErrorCode::FailCommand, || {
            format!("create directory {}", path.display())
        })
    }

    /// Runs a command with a timeout and an output cap (knit-os's
    /// [`knit_os::command::run`]), logging it and its outcome. A non-zero
    /// exit is an error carrying `code` and the command's stderr.
    pub fn run(
        &self,
        code: ErrorCode,
        program: &str,
        args: &[&str],
        timeout: Duration,
    ) -> Result<CommandOutput> {
        self.run_in(code, program, args, timeout, None::<&Path>)
    }

    pub fn run_in(
        &self,
        code: ErrorCode,
        program: &str,
        args: &[&str],
        timeout: Duration,
        cwd: Option<impl AsRef<OsStr>>,
    ) -> Result<CommandOutput> {
        let shown = format!("{program} {}", args.join(" "));
        self.log.line("run", &shown);
        let started = Instant::now();
        let mut command = Command::new(program);
        command.args(args);
        if let Some(dir) = cwd {
            command.current_dir(dir.as_ref());
        }
        let output = knit_os::command::run(&mut command, timeout, OUTPUT_CAP);
        let elapsed = started.elapsed();
        if let Ok(mut total) = self.command_time.lock() {
            *total += elapsed;
        }
        let output = output.map_err(|e| match e {
            OsError::TimedOut { .. } => AgentError::new(
                code,
                format!("`{shown}` timed out after {}s", timeout.as_secs()),
            ),
            OsError::NotStarted { source, .. } => {
                AgentError::new(code, format!("cannot start `{shown}`: {source}"))
            }
            other => AgentError::new(code, format!("`{shown}`: {other}")),
        })?;
        let stderr = output.stderr_text();
        if !output.success() {
            let detail = stderr.trim();
            let status = output.status;
            self.log
                .line("run", &format!("`{program}` failed ({status}): {detail}"));
            return Err(AgentError::new(
                code,
                format!("`{shown}` failed ({status}): {detail}"),
            ));
        }
        // What callers parse must be whole: a cut listing would read as a
        // shorter one.
        if output.stdout_truncated {
            return Err(AgentError::new(
                code,
                format!(
                    "`{shown}` printed more than {} MiB on stdout",
                    OUTPUT_CAP >> 20
                ),
            ));
        }
        self.log.line(
            "run",
            &format!("`{program}` ok in {} ms", elapsed.as_millis()),
        );
        Ok(CommandOutput {
            stdout: output.stdout_text(),
            stderr,
        })
    }

    /// Finds an executable by name in the node's standard directories.
    pub fn find_program(&self, name: &str) -> Option<String> {
        [
            "/usr/local/sbin",
            "/usr/local/bin",
            "/usr/sbin",
            "/usr/bin",
            "/sbin",
            "/bin",
        ]
        .iter()
        .map(|dir| format!("{dir}/{name}"))
        .find(|abs| self.path(abs).is_file())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host() -> (tempfile::TempDir, Host) {
        let dir = tempfile::tempdir().unwrap();
        let host = Host::without_log(dir.path());
        (dir, host)
    }

    #[test]
    fn run_gives_stdout_and_names_a_failure_a_timeout_and_a_missing_program() {
        let (_dir, host) = host();
        let code = ErrorCode::FailCommand;
        let out = host
            .run(
                code,
                "sh",
                &["-c", "echo out; echo err >&2"],
                Duration::from_secs(30),
            )
            .unwrap();
        assert_eq!(
            (out.stdout.as_str(), out.stderr.as_str()),
            ("out\n", "err\n")
        );
        let err = host
            .run(
                code,
                "sh",
                &["-c", "echo broke >&2; exit 3"],
                Duration::from_secs(30),
            )
            .unwrap_err();
        assert_eq!(err.code, code);
        assert!(
            err.message.contains("failed (exit status: 3): broke"),
            "{err}"
        );
        let err = host
            .run(code, "sleep", &["300"], Duration::from_secs(1))
            .unwrap_err();
        assert_eq!(err.message, "`sleep 300` timed out after 1s");
        let err = host
            .run(code, "/nonexistent/knit-none", &[], Duration::from_secs(5))
            .unwrap_err();
        assert!(
            err.message
                .starts_with("cannot start `/nonexistent/knit-none `"),
            "{err}"
        );
        assert!(host.command_time() >= Duration::from_secs(1));
    }

    #[test]
    fn stdout_past_the_cap_is_an_error_not_a_shorter_listing() {
        let (_dir, host) = host();
        let bytes = (OUTPUT_CAP + 1).to_string();
        let err = host
            .run(
                ErrorCode::FailCommand,
                "head",
                &["-c", &bytes, "/dev/zero"],
                Duration::from_secs(60),
            )
            .unwrap_err();
        assert!(
            err.message.contains("printed more than 16 MiB on stdout"),
            "{err}"
        );
    }
}
