//! The agent's one HTTP client: ureq over rustls, trusting either the
//! standard web roots or exactly the CA it was given.

use crate::error::{AgentError, Result};
use knit_api::ErrorCode;
use knit_os::OsError;
use std::sync::Arc;
use std::time::Duration;

/// A PEM that does not hold what it must: the node's configuration is wrong.
fn bad_pem(e: OsError) -> AgentError {
    AgentError::new(ErrorCode::FailConfig, e.to_string())
}

/// An HTTP agent; with `ca_pem`, only servers whose chain ends at that CA are trusted.
pub fn http_agent(ca_pem: Option<&str>, timeout: Duration) -> Result<ureq::Agent> {
    let builder = ureq::AgentBuilder::new()
        .timeout_connect(timeout)
        .timeout(timeout * 12);
    with_roots(builder, ca_pem)
}

/// An HTTP agent for large downloads: a connection that stalls for `idle`
/// fails, but a slow one that keeps moving may take up to `total`. A fixed
/// short deadline for the whole body failed a 51 MiB package on a slow link
/// (an emulated VM read 6 MB in two minutes, three times over).
pub fn download_agent(
    ca_pem: Option<&str>,
    connect: Duration,
    idle: Duration,
    total: Duration,
) -> Result<ureq::Agent> {
    let builder = ureq::AgentBuilder::new()
        .timeout_connect(connect)
        .timeout_read(idle)
        .timeout_write(idle)
        .timeout(total);
    with_roots(builder, ca_pem)
}

fn with_roots(builder: ureq::AgentBuilder, ca_pem: Option<&str>) -> Result<ureq::Agent> {
    let Some(pem) = ca_pem else {
        return Ok(builder.build());
    };
    let roots = knit_os::pem::roots(pem.as_bytes(), "the CA certificate").map_err(bad_pem)?;
    let config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| AgentError::new(ErrorCode::FailConfig, format!("TLS setup: {e}")))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(builder.tls_config(Arc::new(config)).build())
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// An HTTPS agent that trusts exactly `ca_pem` and authenticates with a
/// client certificate (the kubelet's, from its kubeconfig).
pub fn client_cert_agent(
    ca_pem: &str,
    cert_pem: &str,
    key_pem: &str,
    timeout: Duration,
) -> Result<ureq::Agent> {
    let certs = knit_os::pem::certificates(cert_pem.as_bytes(), "the client certificate")
        .map_err(bad_pem)?;
    let key = knit_os::pem::private_key(key_pem.as_bytes(), "the client key").map_err(bad_pem)?;
    let roots = knit_os::pem::roots(ca_pem.as_bytes(), "the CA certificate").map_err(bad_pem)?;
    let config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| AgentError::new(ErrorCode::FailConfig, format!("TLS setup: {e}")))?
        .with_root_certificates(roots)
        .with_client_auth_cert(certs, key)
        .map_err(|e| {
            AgentError::new(
                ErrorCode::FailConfig,
                format!("unusable client certificate: {e}"),
            )
        })?;
    Ok(ureq::AgentBuilder::new()
        .timeout_connect(timeout)
        .timeout(timeout * 6)
        .tls_config(Arc::new(config))
        .build())
}

/// `sha256:<hex>` of a certificate's SubjectPublicKeyInfo (kubeadm's CA pin).
pub fn spki_pin(der: &[u8]) -> Result<String> {
    use sha2::Digest;
    let (_, cert) = x509_parser::parse_x509_certificate(der)
        .map_err(|e| AgentError::new(ErrorCode::FailConfig, format!("invalid certificate: {e}")))?;
    let digest = sha2::Sha256::digest(cert.tbs_certificate.subject_pki.raw);
    Ok(format!("sha256:{}", hex::encode(digest)))
}

/// The certificate of `ca_pem` (a PEM bundle) whose public key has the pin,
/// alone, as PEM: the only trust anchor the node uses. Any other
/// certificate of the bundle is dropped, never trusted (kubeadm's
/// `--discovery-token-ca-cert-hash` names one CA).
pub fn check_ca_pin(ca_pem: &str, pin: &str, what: &str) -> Result<String> {
    let want = pin.trim().to_lowercase();
    let mut seen = Vec::new();
    for cert in knit_os::pem::certificates(ca_pem.as_bytes(), what).map_err(bad_pem)? {
        let got = spki_pin(&cert)?;
        if got == want {
            return Ok(knit_os::pem::encode("CERTIFICATE", &cert));
        }
        seen.push(got);
    }
    Err(AgentError::new(
        ErrorCode::FailJoin,
        format!(
            "{what} has public-key pin {}, but cluster.caPin is {want}: refusing to trust it \
             (check caPin against `knit cluster` output, or that the endpoint is the right cluster)",
            seen.join(", ")
        ),
    ))
}

/// Checks kubeadm's detached JWS of `cluster-info`'s kubeconfig
/// (`jws-kubeconfig-<token-id>`: HS256 keyed with the token secret), which
/// proves the kubeconfig comes from a server that knows the node's
/// bootstrap token.
pub fn verify_cluster_info_jws(
    kubeconfig: &str,
    jws: &str,
    token: &str,
) -> std::result::Result<(), String> {
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use base64::Engine;
    let (id, secret) = token
        .split_once('.')
        .ok_or("the bootstrap token is not <id>.<secret>")?;
    let (header_b64, rest) = jws
        .split_once('.')
        .ok_or("not a detached JWS (header..signature)")?;
    let sig_b64 = rest
        .strip_prefix('.')
        .ok_or("not a detached JWS (header..signature)")?;
    let header: serde_json::Value = URL_SAFE_NO_PAD
        .decode(header_b64)
        .ok()
        .and_then(|h| serde_json::from_slice(&h).ok())
        .ok_or("the JWS header is not base64url JSON")?;
    if header["alg"] != "HS256" {
        return Err(format!("JWS algorithm {} is not HS256", header["alg"]));
    }
    if header["kid"] != id {
        return Err(format!(
            "JWS key id {} is not the token id {id:?}",
            header["kid"]
        ));
    }
    let sig = URL_SAFE_NO_PAD
        .decode(sig_b64)
        .map_err(|_| "the JWS signature is not base64url")?;
    let signed = format!("{header_b64}.{}", URL_SAFE_NO_PAD.encode(kubeconfig));
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret.as_bytes());
    // Constant-time comparison.
    ring::hmac::verify(&key, signed.as_bytes(), &sig)
        .map_err(|_| "the signature does not match the bootstrap token".to_string())
}

/// Trusts any server: only for fetching `cluster-info`, whose CA is then
/// accepted solely if it matches the pin.
#[derive(Debug)]
struct AcceptAnyServer(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AcceptAnyServer {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> std::result::Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> std::result::Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> std::result::Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

pub const CLUSTER_INFO_PATH: &str = "/api/v1/namespaces/kube-public/configmaps/cluster-info";

/// Discovers the cluster CA from the `cluster-info` ConfigMap (anonymous,
/// unverified TLS) as kubeadm does: the kubeconfig there is trusted only if
/// its `jws-kubeconfig-<token-id>` signature verifies with the bootstrap
/// `token`, and of its CA bundle only the certificate with the pinned key is
/// kept; then the endpoint must really serve a certificate of that CA.
/// Returns the pinned CA certificate (PEM).
pub fn discover_ca(endpoint: &str, pin: &str, token: &str, timeout: Duration) -> Result<String> {
    use base64::Engine;
    let url = format!("{}{CLUSTER_INFO_PATH}", endpoint.trim_end_matches('/'));
    let join_error = |what: String| AgentError::new(ErrorCode::FailJoin, what);
    let provider = provider();
    let config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| join_error(format!("TLS setup: {e}")))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AcceptAnyServer(provider)))
        .with_no_client_auth();
    let insecure = ureq::AgentBuilder::new()
        .timeout_connect(timeout)
        .timeout(timeout * 6)
        .tls_config(Arc::new(config))
        .build();
    let body: serde_json::Value = insecure
        .get(&url)
        .call()
        .map_err(|e| e.to_string())
        .and_then(|r| r.into_json().map_err(|e| e.to_string()))
        .map_err(|e| {
            join_error(format!(
                "cannot read cluster-info from {url} to discover the cluster CA: {e}; \
                 check the endpoint and that the node reaches it (or set cluster.caCert)"
            ))
        })?;
    let kubeconfig = body["data"]["kubeconfig"].as_str().ok_or_else(|| {
        join_error(format!(
            "{url}: the cluster-info ConfigMap has no data.kubeconfig"
        ))
    })?;
    let token_id = token.split_once('.').map_or(token, |(id, _)| id);
    let jws_key = format!("jws-kubeconfig-{token_id}");
    let jws = body["data"][&jws_key].as_str().ok_or_else(|| {
        join_error(format!(
            "{url}: cluster-info has no {jws_key} signature for this node's bootstrap token: \
             refusing to trust its kubeconfig (the token is unknown to the server, or expired)"
        ))
    })?;
    verify_cluster_info_jws(kubeconfig, jws, token).map_err(|why| {
        join_error(format!(
            "{url}: the {jws_key} signature of cluster-info does not verify ({why}): \
             refusing to trust its kubeconfig"
        ))
    })?;
    let kubeconfig: serde_yaml_ng::Value = serde_yaml_ng::from_str(kubeconfig)
        .map_err(|e| join_error(format!("{url}: data.kubeconfig is not a kubeconfig: {e}")))?;
    let ca_data = kubeconfig["clusters"][0]["cluster"]["certificate-authority-data"]
        .as_str()
        .ok_or_else(|| {
            join_error(format!(
                "{url}: data.kubeconfig has no clusters[0].cluster.certificate-authority-data"
            ))
        })?;
    let ca_pem = base64::engine::general_purpose::STANDARD
        .decode(ca_data.trim())
        .ok()
        .and_then(|bytes| String::from_utf8(bytes).ok())
        .ok_or_else(|| {
            join_error(format!(
                "{url}: certificate-authority-data is not base64 PEM"
            ))
        })?;
    let ca_pem = check_ca_pin(&ca_pem, pin, &format!("the CA served by {url}"))?;
    // The pinned CA must also be the one the endpoint's certificate chains to.
    http_agent(Some(&ca_pem), timeout)?
        .get(&url)
        .call()
        .map_err(|e| {
            join_error(format!(
                "{endpoint} does not present a certificate of the pinned CA: {e}"
            ))
        })?;
    Ok(ca_pem)
}
