//! The TLS settings of both ends of the embedded API, in one place: trust is
//! the cluster CA's PEM alone, the crypto is ring's, versions rustls's safe
//! defaults.

use std::sync::Arc;

use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::error::ClusterError;

fn tls_err(e: impl std::fmt::Display) -> ClusterError {
    ClusterError::Tls(e.to_string())
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The trust anchors in `ca_pem` (every certificate in it; at least one).
pub(crate) fn roots_from_pem(ca_pem: &str) -> Result<rustls::RootCertStore, ClusterError> {
    knit_os::pem::roots(ca_pem.as_bytes(), "the CA PEM").map_err(tls_err)
}

/// The certificate chain in `cert_pem` and the private key in `key_pem`;
/// `role` ("serving", "client") names them in errors.
fn identity_from_pem(
    cert_pem: &str,
    key_pem: &str,
    role: &str,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), ClusterError> {
    let certs =
        knit_os::pem::certificates(cert_pem.as_bytes(), &format!("the {role} certificate PEM"))
            .map_err(tls_err)?;
    let key = knit_os::pem::private_key(key_pem.as_bytes(), &format!("the {role} key PEM"))
        .map_err(tls_err)?;
    Ok((certs, key))
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
    let (certs, key) = identity_from_pem(cert_pem, key_pem, "serving")?;
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
    let (certs, key) = identity_from_pem(cert_pem, key_pem, "client")?;
    builder.with_client_auth_cert(certs, key).map_err(tls_err)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(r: Result<impl Sized, ClusterError>) -> String {
        match r {
            Err(ClusterError::Tls(m)) => m,
            Err(e) => panic!("not a TLS error: {e}"),
            Ok(_) => panic!("accepted"),
        }
    }

    #[test]
    fn identity_from_pem_names_the_part_that_is_wrong() {
        let key = rcgen::KeyPair::generate().expect("key");
        let cert = rcgen::CertificateParams::new(vec!["knit.test".into()])
            .expect("params")
            .self_signed(&key)
            .expect("cert");
        let (cert_pem, key_pem) = (cert.pem(), key.serialize_pem());

        let (chain, _) = identity_from_pem(&cert_pem, &key_pem, "serving").expect("valid pair");
        assert_eq!(chain.len(), 1);
        let m = message(identity_from_pem(&cert_pem, &cert_pem, "serving"));
        assert!(
            m.starts_with("the serving key PEM: holds no private key"),
            "{m}"
        );
        let m = message(identity_from_pem(&key_pem, &key_pem, "client"));
        assert!(
            m.starts_with("the client certificate PEM: holds no certificate"),
            "{m}"
        );
        let m = message(roots_from_pem("no PEM here"));
        assert!(m.starts_with("the CA PEM: holds no certificate"), "{m}");
        let cut = &cert_pem[..cert_pem.len() / 2];
        let m = message(identity_from_pem(cut, &key_pem, "client"));
        assert!(m.starts_with("the client certificate PEM: "), "{m}");
        let m = message(roots_from_pem(cut));
        assert!(m.starts_with("the CA PEM: "), "{m}");
        let cut_key = &key_pem[..key_pem.len() / 2];
        let m = message(identity_from_pem(&cert_pem, cut_key, "serving"));
        assert!(m.starts_with("the serving key PEM: "), "{m}");
    }
}
