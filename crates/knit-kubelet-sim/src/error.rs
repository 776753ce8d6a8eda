//! The one error type of the stand-in, with stable codes.

#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("flags: {0}")]
    Flags(String),
    #[error("kubelet configuration {path}: {message}")]
    Config { path: String, message: String },
    #[error("kubeconfig {path}: {message}")]
    Kubeconfig { path: String, message: String },
    #[error("I/O on {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("TLS setup: {0}")]
    Tls(String),
    #[error("API server refused {what}: HTTP {code}: {message}")]
    Api {
        what: String,
        code: u16,
        message: String,
    },
    #[error("cannot reach the API server for {what}: {message}")]
    Transport { what: String, message: String },
    #[error("certificate: {0}")]
    Cert(String),
    #[error("certificate signing request {name} was {outcome}: {message}")]
    CsrRejected {
        name: String,
        outcome: String,
        message: String,
    },
}

impl SimError {
    pub fn code(&self) -> &'static str {
        match self {
            SimError::Flags(_) => "SimFlags",
            SimError::Config { .. } => "SimConfig",
            SimError::Kubeconfig { .. } => "SimKubeconfig",
            SimError::Io { .. } => "SimIo",
            SimError::Tls(_) => "SimTls",
            SimError::Api { .. } => "SimApiRefused",
            SimError::Transport { .. } => "SimApiUnreachable",
            SimError::Cert(_) => "SimCert",
            SimError::CsrRejected { .. } => "SimCsrRejected",
        }
    }

    pub(crate) fn io(path: impl AsRef<std::path::Path>, source: std::io::Error) -> Self {
        SimError::Io {
            path: path.as_ref().display().to_string(),
            source,
        }
    }
}

impl From<rcgen::Error> for SimError {
    fn from(e: rcgen::Error) -> Self {
        SimError::Cert(e.to_string())
    }
}
