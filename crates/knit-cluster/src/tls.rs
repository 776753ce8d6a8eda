//! The TLS settings of both ends of the embedded API, in one place: trust is
//! the cluster CA's PEM alone, the crypto is ring's, versions rustls's safe
//! defaults.

use std::sync::Arc;

use crate::error::ClusterError;

fn tls_err(e: impl std::fmt::Display) -> ClusterError {
    ClusterError::Tls(e.to_string())
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The trust anchors in `ca_pem` (every certificate in it).
pub(crate) fn roots_from_pem(ca_pem: &str) -> Result<rustls::RootCertStore, ClusterError> {
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pemfile::certs(&mut ca_pem.as_bytes()) {
        roots.add(c.map_err(tls_err)?).map_err(tls_err)?;
    }
    Ok(roots)
}

/// The serving side: `cert_pem`/`key_pem` as the server's identity, client
/// certificates optional (bootstrap tokens and anonymous discovery come
/// without one) but, when presented, chained to the CA; h2 and http/1.1.
pub(crate) fn server_config(
    ca_pem: &str,
    cert_pem: &str,
    key_pem: &str,
) -> Result<Arc<rustls::ServerConfig>, ClusterError> {
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots_from_pem(ca_pem)?),
        provider(),
    )
    .allow_unauthenticated()
    .build()
    .map_err(tls_err)?;
    let certs = rustls_pemfile::certs(&mut cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(tls_err)?;
    let key = rustls_pemfile::private_key(&mut key_pem.as_bytes())
        .map_err(tls_err)?
        .ok_or_else(|| ClusterError::Tls("no private key in serving key PEM".into()))?;
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(tls_err)?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key)
        .map_err(tls_err)?;
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

/// A client of the embedded API that trusts only the CA in `ca_pem`, with
/// a client certificate (`(cert_pem, key_pem)`) when one is given.
pub fn client_config(
    ca_pem: &str,
    identity: Option<(&str, &str)>,
) -> Result<rustls::ClientConfig, ClusterError> {
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(tls_err)?
        .with_root_certificates(roots_from_pem(ca_pem)?);
    let Some((cert_pem, key_pem)) = identity else {
        return Ok(builder.with_no_client_auth());
    };
    let certs = rustls_pemfile::certs(&mut cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(tls_err)?;
    let key = rustls_pemfile::private_key(&mut key_pem.as_bytes())
        .map_err(tls_err)?
        .ok_or_else(|| ClusterError::Tls("no private key in the client key PEM".into()))?;
    builder.with_client_auth_cert(certs, key).map_err(tls_err)
}
