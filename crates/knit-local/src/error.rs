//! The one error type of knit-local, with stable codes.

use knit_api::FieldError;
use std::path::PathBuf;

pub type Result<T, E = LocalError> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    /// Namespaces, loop devices and bridges need root.
    #[error("knit-local must run as root (running as uid {uid}): it creates loop devices, mounts, namespaces and a bridge")]
    NotRoot { uid: u32 },
    /// A template or argument could not be parsed at all.
    #[error("cannot parse {what}: {message}")]
    Parse { what: String, message: String },
    /// Parsed, but some fields break a rule; every one is listed.
    #[error("{} invalid field(s):\n{}", .0.len(), .0.iter().map(|e| format!("  - {e}")).collect::<Vec<_>>().join("\n"))]
    Invalid(Vec<FieldError>),
    #[error("{kind} {id:?} does not exist")]
    NotFound { kind: &'static str, id: String },
    #[error("instance {id} is {state}: {action} needs it {wanted}")]
    WrongState {
        id: String,
        state: String,
        action: &'static str,
        wanted: &'static str,
    },
    #[error("{what} is busy: {message}")]
    Busy { what: String, message: String },
    /// The per-type capacity (`knit local capacity`) is used up, as a
    /// cloud's zone runs out of a type (ECS: OperationDenied.NoStock).
    #[error("OutOfCapacity: instance type {instance_type} has no capacity left on this local cloud ({used} of {capacity} made; `knit local capacity` sets it)")]
    OutOfCapacity {
        instance_type: String,
        used: u64,
        capacity: u64,
    },
    /// A limit of the whole host (not of a type) would be passed by one
    /// more machine; the message starts as a cloud's capacity error does.
    #[error("OutOfCapacity: this host cannot carry another machine: {resource} {used} in use of {limit} ({detail})")]
    HostOutOfCapacity {
        resource: &'static str,
        used: u64,
        limit: u64,
        detail: String,
    },
    #[error("command `{command}` failed ({status}): {stderr}")]
    Command {
        command: String,
        status: String,
        stderr: String,
    },
    #[error("{context} {path}: {source}")]
    Io {
        context: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("state file {path} is corrupt: {message}")]
    State { path: PathBuf, message: String },
    #[error("instance {id} failed to boot: {message}")]
    Boot { id: String, message: String },
    #[error("{what}: {source}")]
    Sys {
        what: String,
        #[source]
        source: nix::Error,
    },
}

impl LocalError {
    /// Stable code for this error, printed by the CLI and kept across releases.
    pub fn code(&self) -> &'static str {
        match self {
            LocalError::NotRoot { .. } => "LocalNotRoot",
            LocalError::Parse { .. } => "LocalParse",
            LocalError::Invalid(_) => "LocalInvalid",
            LocalError::NotFound { .. } => "LocalNotFound",
            LocalError::WrongState { .. } => "LocalWrongState",
            LocalError::Busy { .. } => "LocalBusy",
            LocalError::OutOfCapacity { .. } => "LocalOutOfCapacity",
            LocalError::HostOutOfCapacity { .. } => "LocalHostOutOfCapacity",
            LocalError::Command { .. } => "LocalCommand",
            LocalError::Io { .. } => "LocalIo",
            LocalError::State { .. } => "LocalState",
            LocalError::Boot { .. } => "LocalBoot",
            LocalError::Sys { .. } => "LocalSys",
        }
    }

    pub(crate) fn invalid(
        field: impl Into<String>,
        value: impl std::fmt::Display,
        rule: impl Into<String>,
    ) -> Self {
        LocalError::Invalid(vec![FieldError {
            field: field.into(),
            value: value.to_string(),
            rule: rule.into(),
        }])
    }
}

/// knit-os's failures as the local cloud's own (same variants and codes
/// as before the helpers moved there).
impl From<knit_os::OsError> for LocalError {
    fn from(e: knit_os::OsError) -> LocalError {
        use knit_os::OsError;
        match e {
            OsError::Io {
                action,
                path,
                source,
            } => LocalError::Io {
                context: action,
                path,
                source,
            },
            OsError::NotStarted { command, source } => LocalError::Command {
                command,
                status: "not started".into(),
                stderr: source.to_string(),
            },
            OsError::TimedOut {
                command,
                after,
                stdout,
                stderr,
            } => LocalError::Command {
                command,
                status: format!("{TIMED_OUT} after {} s: killed", after.as_secs()),
                stderr: printed_so_far(&stdout, &stderr),
            },
            other => LocalError::Parse {
                what: other.code().to_string(),
                message: other.to_string(),
            },
        }
    }
}

/// How a [`LocalError::Command`]'s status starts when the command was
/// killed at its deadline.
pub const TIMED_OUT: &str = "timed out";

/// What a command killed at its deadline had written: its stderr, then its
/// stdout (each the end of it, as knit-os kept it).
fn printed_so_far(stdout: &str, stderr: &str) -> String {
    match (stderr.trim(), stdout.trim()) {
        (err, "") => err.to_string(),
        ("", out) => format!("stdout: {out}"),
        (err, out) => format!("{err}\nstdout: {out}"),
    }
}

/// Attaches a path and an action to an io::Error.
pub(crate) trait IoContext<T> {
    fn ctx(self, context: &'static str, path: impl Into<PathBuf>) -> Result<T>;
}

impl<T> IoContext<T> for std::io::Result<T> {
    fn ctx(self, context: &'static str, path: impl Into<PathBuf>) -> Result<T> {
        self.map_err(|source| LocalError::Io {
            context,
            path: path.into(),
            source,
        })
    }
}

/// Attaches what was being done to a raw syscall error.
pub(crate) trait SysContext<T> {
    fn sys(self, what: impl FnOnce() -> String) -> Result<T>;
}

impl<T> SysContext<T> for nix::Result<T> {
    fn sys(self, what: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|source| LocalError::Sys {
            what: what(),
            source,
        })
    }
}
