use std::path::PathBuf;
use std::time::Duration;

pub type Result<T, E = OsError> = std::result::Result<T, E>;

/// A failure of an OS helper, naming what was being done to what.
#[derive(Debug, thiserror::Error)]
pub enum OsError {
    /// A file system call failed (`action` is the verb: write, rename
    /// into, sync, read, ...).
    #[error("{action} {}: {source}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A command could not be started (not installed, not executable) or
    /// waited for.
    #[error("run `{command}`: {source}")]
    NotStarted {
        command: String,
        #[source]
        source: std::io::Error,
    },
    /// A command outlived its deadline and was killed. `stdout` and
    /// `stderr` are the end of what it had written by then (at most
    /// [`crate::command::PRINTED_TAIL`] bytes each): where a hung tool
    /// stopped.
    #[error("`{command}` still running after {} s: killed{}", after.as_secs(), so_far(stderr))]
    TimedOut {
        command: String,
        after: Duration,
        stdout: String,
        stderr: String,
    },
    /// PEM text that does not hold what it must (`what` names the text:
    /// "the CA bundle", "the client key", ...).
    #[error("{what}: {rule}")]
    Pem { what: String, rule: String },
    /// A time that is not in the form it must have.
    #[error("time {value:?}: {rule}")]
    Time { value: String, rule: &'static str },
    /// A value a shell word cannot carry.
    #[error("shell value {value:?}: {rule}")]
    Quote { value: String, rule: &'static str },
}

/// A timed-out command's stderr as the end of its message ("" if it wrote none).
fn so_far(stderr: &str) -> String {
    match stderr.trim() {
        "" => String::new(),
        text => format!("; its stderr so far: {text}"),
    }
}

impl OsError {
    /// Stable code (what API answers and the CLI print).
    pub fn code(&self) -> &'static str {
        match self {
            OsError::Io { .. } => "IoError",
            OsError::NotStarted { .. } => "CommandNotStarted",
            OsError::TimedOut { .. } => "CommandTimedOut",
            OsError::Pem { .. } => "PemInvalid",
            OsError::Time { .. } => "TimeInvalid",
            OsError::Quote { .. } => "QuoteInvalid",
        }
    }

    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(std::io::Error) -> OsError {
        let path = path.into();
        move |source| OsError::Io {
            action,
            path,
            source,
        }
    }
}
