//! One error type with stable codes.

use std::path::Path;

pub type Result<T> = std::result::Result<T, QemuError>;

#[derive(Debug, thiserror::Error)]
pub enum QemuError {
    #[error("must run as root (taps, bridges and VM processes need it)")]
    NotRoot,
    /// A bad field: its name, the value, the rule.
    #[error("{field}: value {value} {rule}")]
    Invalid {
        field: String,
        value: String,
        rule: String,
    },
    #[error("{kind} {id:?} does not exist")]
    NotFound { kind: &'static str, id: String },
    #[error("{what}: {message}")]
    WrongState { what: String, message: String },
    #[error("{what}: {message}")]
    Busy { what: String, message: String },
    #[error("{command}: {status}: {stderr}")]
    Command {
        command: String,
        status: String,
        stderr: String,
    },
    #[error("{what} {path}: {source}")]
    Io {
        what: String,
        path: String,
        source: std::io::Error,
    },
    #[error("record {path}: {message}")]
    State { path: String, message: String },
    /// qemu-guest-agent did not answer, or answered with an error.
    #[error("guest agent of {id}: {message}")]
    Agent { id: String, message: String },
    /// QEMU's monitor (QMP) did not answer, or answered with an error.
    #[error("QMP of {id}: {message}")]
    Qmp { id: String, message: String },
    #[error("{what} did not finish within {secs} s")]
    Timeout { what: String, secs: u64 },
    /// QEMU exited while starting, or never became ready; see console.log.
    #[error("VM {id} did not start: {message}")]
    Boot { id: String, message: String },
}

/// knit-os's failures as QEMU's own (the variants and codes they had
/// before the helpers moved there).
impl From<knit_os::OsError> for QemuError {
    fn from(e: knit_os::OsError) -> QemuError {
        use knit_os::OsError;
        match e {
            OsError::Io {
                action,
                path,
                source,
            } => QemuError::Io {
                what: action.to_string(),
                path: path.display().to_string(),
                source,
            },
            OsError::NotStarted { command, source } => QemuError::Command {
                command,
                status: "not started".into(),
                stderr: source.to_string(),
            },
            OsError::TimedOut { command, after, .. } => QemuError::Timeout {
                what: command,
                secs: after.as_secs(),
            },
            other => QemuError::State {
                path: other.code().to_string(),
                message: other.to_string(),
            },
        }
    }
}

impl QemuError {
    /// Stable code for messages and scripts.
    pub fn code(&self) -> &'static str {
        match self {
            QemuError::NotRoot => "QemuNotRoot",
            QemuError::Invalid { .. } => "QemuInvalid",
            QemuError::NotFound { .. } => "QemuNotFound",
            QemuError::WrongState { .. } => "QemuWrongState",
            QemuError::Busy { .. } => "QemuBusy",
            QemuError::Command { .. } => "QemuCommand",
            QemuError::Io { .. } => "QemuIo",
            QemuError::State { .. } => "QemuState",
            QemuError::Agent { .. } => "QemuAgent",
            QemuError::Qmp { .. } => "QemuQmp",
            QemuError::Timeout { .. } => "QemuTimeout",
            QemuError::Boot { .. } => "QemuBoot",
        }
    }

    pub fn invalid(field: &str, value: impl std::fmt::Display, rule: impl Into<String>) -> Self {
        QemuError::Invalid {
            field: field.to_string(),
            value: value.to_string(),
            rule: rule.into(),
        }
    }
}

/// `.ctx("cannot write", path)` on io results.
pub trait IoContext<T> {
    fn ctx(self, what: &str, path: impl AsRef<Path>) -> Result<T>;
}

impl<T> IoContext<T> for std::io::Result<T> {
    fn ctx(self, what: &str, path: impl AsRef<Path>) -> Result<T> {
        self.map_err(|source| QemuError::Io {
            what: what.to_string(),
            path: path.as_ref().display().to_string(),
            source,
        })
    }
}
