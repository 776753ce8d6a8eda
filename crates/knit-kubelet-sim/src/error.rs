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
    Transport {
        what: String,
        message: String,
        /// Whether the server may just not be up yet, or TLS refused a
        /// certificate (which waiting does not mend).
        failure: TransportFailure,
    },
    #[error("certificate: {0}")]
    Cert(String),
    #[error("certificate signing request {name} was {outcome}: {message}")]
    CsrRejected {
        name: String,
        outcome: String,
        message: String,
    },
}

/// Why a request got no answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportFailure {
    /// No connection, a reset, a timeout, a cut stream: the server may not
    /// be up yet.
    Unreachable,
    /// The TLS handshake refused a certificate: the server's (not signed
    /// by the kubeconfig's CA, expired, another name) or ours (the server's
    /// alert). Retrying with the same files meets the same refusal.
    CertificateRejected,
}

impl TransportFailure {
    /// What `e`'s chain of sources says: a rustls certificate error (held
    /// directly or inside an `io::Error`, as rustls's streams wrap it) is
    /// [`TransportFailure::CertificateRejected`]; anything else is
    /// [`TransportFailure::Unreachable`].
    pub fn of(e: &(dyn std::error::Error + 'static)) -> TransportFailure {
        let mut next = Some(e);
        while let Some(err) = next {
            // io::Error's source() skips the error it wraps: look inside.
            let wrapped = err
                .downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
                .and_then(|inner| inner.downcast_ref::<rustls::Error>());
            if let Some(tls) = err.downcast_ref::<rustls::Error>().or(wrapped) {
                if certificate_rejection(tls) {
                    return TransportFailure::CertificateRejected;
                }
            }
            next = err.source();
        }
        TransportFailure::Unreachable
    }
}

/// Whether a TLS error is a refused certificate (ours or the peer's).
fn certificate_rejection(e: &rustls::Error) -> bool {
    use rustls::AlertDescription as A;
    match e {
        rustls::Error::InvalidCertificate(_)
        | rustls::Error::NoCertificatesPresented
        | rustls::Error::InvalidCertRevocationList(_) => true,
        rustls::Error::AlertReceived(alert) => matches!(
            alert,
            A::BadCertificate
                | A::UnsupportedCertificate
                | A::CertificateRevoked
                | A::CertificateExpired
                | A::CertificateUnknown
                | A::CertificateRequired
                | A::UnknownCA
        ),
        _ => false,
    }
}

impl SimError {
    /// A transport failure of `what`, its kind read from `e`'s sources.
    pub fn transport(what: impl Into<String>, e: &(dyn std::error::Error + 'static)) -> SimError {
        SimError::Transport {
            what: what.into(),
            message: e.to_string(),
            failure: TransportFailure::of(e),
        }
    }

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
