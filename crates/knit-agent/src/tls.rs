//! The agent's one HTTP client: ureq over rustls, trusting either the
//! standard web roots or exactly the CA it was given.

use crate::error::{AgentError, Result};
use knit_api::ErrorCode;
use std::sync::Arc;
use std::time::Duration;

/// Parses every certificate of a PEM bundle.
pub fn parse_pem_certs(pem: &str) -> Result<Vec<rustls::pki_types::CertificateDer<'static>>> {
    let certs: std::result::Result<Vec<_>, _> =
        rustls_pemfile::certs(&mut pem.as_bytes()).collect();
    let certs = certs.map_err(|e| {
        AgentError::new(
            ErrorCode::FailConfig,
            format!("invalid PEM certificate: {e}"),
        )
    })?;
    if certs.is_empty() {
        return Err(AgentError::new(
            ErrorCode::FailConfig,
            "PEM holds no certificate",
        ));
    }
    Ok(certs)
}

/// An HTTP agent; with `ca_pem`, only servers whose chain ends at that CA are trusted.
pub fn http_agent(ca_pem: Option<&str>, timeout: Duration) -> Result<ureq::Agent> {
    let builder = ureq::AgentBuilder::new()
        .timeout_connect(timeout)
        .timeout(timeout * 12);
    let Some(pem) = ca_pem else {
        return Ok(builder.build());
    };
    let mut roots = rustls::RootCertStore::empty();
    for cert in parse_pem_certs(pem)? {
        roots.add(cert).map_err(|e| {
            AgentError::new(
                ErrorCode::FailConfig,
                format!("unusable CA certificate: {e}"),
            )
        })?;
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| AgentError::new(ErrorCode::FailConfig, format!("TLS setup: {e}")))?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(builder.tls_config(Arc::new(config)).build())
}
