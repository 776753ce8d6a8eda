//! The `Host` seam: everything the agent asks of the machine goes through
//! here, with every absolute path resolved under `--root`. There is one
//! implementation, the real one; tests aim it at a tree and real loop devices.

use crate::error::{AgentError, Context, Result};
use crate::files::{under, write_atomic};
use crate::ledger::UndoLedger;
use crate::log::DeployLog;
use knit_api::ErrorCode;
use std::ffi::OsStr;
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

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

    /// Runs a command with a timeout, logging it and its outcome. A non-zero
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
        command
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(dir) = cwd {
            command.current_dir(dir.as_ref());
        }
        let mut child = command
            .spawn()
            .map_err(|e| AgentError::new(code, format!("cannot start `{shown}`: {e}")))?;
        let pid = child.id();
        // A watchdog kills the child at the deadline; finishing first cancels it.
        let (done_tx, done_rx) = mpsc::channel::<()>();
        let watchdog = std::thread::spawn(move || {
            if done_rx.recv_timeout(timeout).is_err() {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid as i32),
                    nix::sys::signal::Signal::SIGKILL,
                );
                return true;
            }
            false
        });
        let mut stdout = String::new();
        let mut stderr_pipe = child.stderr.take();
        let stderr_reader = std::thread::spawn(move || {
            let mut s = String::new();
            if let Some(pipe) = stderr_pipe.as_mut() {
                let _ = pipe.read_to_string(&mut s);
            }
            s
        });
        if let Some(mut pipe) = child.stdout.take() {
            let _ = pipe.read_to_string(&mut stdout);
        }
        let status = child.wait();
        let _ = done_tx.send(());
        let timed_out = watchdog.join().unwrap_or(false);
        let stderr = stderr_reader.join().unwrap_or_default();
        let elapsed = started.elapsed();
        if let Ok(mut total) = self.command_time.lock() {
            *total += elapsed;
        }
        let status = status.map_err(|e| {
            AgentError::new(code, format!("`{shown}` could not be waited for: {e}"))
        })?;
        if timed_out {
            return Err(AgentError::new(
                code,
                format!("`{shown}` timed out after {}s", timeout.as_secs()),
            ));
        }
        if !status.success() {
            let detail = stderr.trim();
            self.log
                .line("run", &format!("`{program}` failed ({status}): {detail}"));
            return Err(AgentError::new(
                code,
                format!("`{shown}` failed ({status}): {detail}"),
            ));
        }
        self.log.line(
            "run",
            &format!("`{program}` ok in {} ms", elapsed.as_millis()),
        );
        Ok(CommandOutput { stdout, stderr })
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
