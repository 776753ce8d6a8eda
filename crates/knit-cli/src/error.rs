//! The one error type of the CLI, with the stable code `knit` prints
//! (`error [CODE]: …`).

use knit_client::ClientError;
use knit_server::ServerError;

#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// A call to the knit server (the server's own code when it answered).
    #[error("{0}")]
    Client(#[from] ClientError),
    /// Running the server in this process (`knit server`, `knit up`).
    #[error("{0}")]
    Server(#[from] ServerError),
    #[error("{0}")]
    Usage(String),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Failed(String),
    #[error("{0}")]
    Registry(#[from] knit_registry::RegistryError),
    #[error("{0}")]
    Local(#[from] knit_local::LocalError),
    /// `knit up --ha`: PostgreSQL, a server or HAProxy.
    #[error("{0}")]
    Ha(#[from] crate::commands::server::ha::HaError),
    /// A file, process or command helper (knit-os).
    #[error("{0}")]
    Os(#[from] knit_os::OsError),
}

impl CliError {
    pub fn code(&self) -> String {
        match self {
            CliError::Client(e) => e.code().to_string(),
            CliError::Server(e) => e.code().to_string(),
            CliError::Usage(_) => "Usage".into(),
            CliError::Io { .. } => "IoError".into(),
            CliError::Failed(_) => "Failed".into(),
            CliError::Registry(e) => e.code().into(),
            CliError::Local(e) => e.code().into(),
            CliError::Ha(e) => e.code().into(),
            CliError::Os(e) => e.code().into(),
        }
    }
}

impl From<knit_server::features::FeatureMissing> for CliError {
    fn from(e: knit_server::features::FeatureMissing) -> CliError {
        CliError::Server(ServerError::FeatureMissing(e))
    }
}

pub type Result<T> = std::result::Result<T, CliError>;

/// Wraps an I/O error with what was being done.
pub fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> CliError {
    let what = what.into();
    move |source| CliError::Io { what, source }
}
