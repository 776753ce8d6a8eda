//! The client's error: one variant per way a call to the knit server fails.
//! Every message but the server's own keeps the words the CLI has always
//! printed ("request to the knit server failed: …").

use knit_api::FieldError;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Neither `$KNIT_CONFIG` nor `$HOME` names a config file.
    #[error(
        "request to the knit server failed: HOME is not set; set KNIT_CONFIG to the config file"
    )]
    NoConfigPath,
    #[error("request to the knit server failed: cannot read {}: {source} (run `knit up` or `knit server init` first)", path.display())]
    ConfigUnreadable {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("request to the knit server failed: {} is not a knit config: {source}", path.display())]
    ConfigInvalid {
        path: PathBuf,
        #[source]
        source: serde_yaml_ng::Error,
    },
    /// Writing the config file (its directory, the file, the rename).
    #[error("{what}: {source}")]
    ConfigWrite {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// The config's CA cannot make a TLS setup.
    #[error("request to the knit server failed: {0}")]
    Tls(String),
    /// The server could not be reached, or the connection broke.
    #[error("request to the knit server failed: {url}: {source}")]
    Transport {
        url: String,
        #[source]
        source: Box<ureq::Transport>,
    },
    /// The call outlived its time limit.
    #[error("request to the knit server failed: {url}: {source}")]
    Timeout {
        url: String,
        #[source]
        source: Box<ureq::Transport>,
    },
    /// The answer's body broke off or timed out while being read.
    #[error("request to the knit server failed: reading the answer to {path}: {source}")]
    ReadAnswer {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// An error answer of the knit server: its status, stable code,
    /// message and invalid fields. The message alone: the code is
    /// [`ClientError::code`], which `knit` prints once (`error [CODE]: …`).
    #[error("{message}")]
    Api {
        status: u16,
        code: String,
        message: String,
        errors: Vec<FieldError>,
    },
    /// An answer that could not be read or is not the document expected.
    #[error("request to the knit server failed: {0}")]
    Decode(String),
}

impl ClientError {
    /// Stable code shown to users: the server's own for its answers.
    pub fn code(&self) -> &str {
        match self {
            ClientError::Api { code, .. } => code,
            ClientError::ConfigWrite { .. } => "IoError",
            _ => "ClientError",
        }
    }

    /// The HTTP status of a server's error answer (`None`: no answer).
    pub fn status(&self) -> Option<u16> {
        match self {
            ClientError::Api { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// A transport failure, told apart: a timeout or another one.
    pub(crate) fn transport(url: String, source: ureq::Transport) -> ClientError {
        let timed_out = std::error::Error::source(&source)
            .and_then(|e| e.downcast_ref::<std::io::Error>())
            .is_some_and(|e| {
                matches!(
                    e.kind(),
                    std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
                )
            });
        let source = Box::new(source);
        if timed_out {
            ClientError::Timeout { url, source }
        } else {
            ClientError::Transport { url, source }
        }
    }
}

pub type Result<T> = std::result::Result<T, ClientError>;
