//! The control plane's own CA (made at first start), its serving
//! certificate, and the secrets kept in the state directory.
//!
//! This CA is distinct from the cluster CA: nodes trust it for the package
//! mirror, the bootstrap endpoint and phase reports.

use crate::error::{Result, ServerError};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SanType,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::sync::Arc;

const CA_CN: &str = "knit control plane CA";

fn pki_err(e: impl std::fmt::Display) -> ServerError {
    ServerError::Pki(e.to_string())
}

/// Writes a file readable by its owner only (keys, tokens), durably.
pub fn write_secret(path: &Path, data: &[u8]) -> Result<()> {
    Ok(knit_os::durable::write(path, data, 0o600)?)
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path)
        .map_err(|e| ServerError::io(format!("read {}", path.display()), e))
}

/// 32 random bytes, hex: admin and report tokens.
pub fn random_hex(bytes: usize) -> Result<String> {
    let mut buf = vec![0u8; bytes];
    getrandom::getrandom(&mut buf).map_err(|e| ServerError::Internal(format!("random: {e}")))?;
    Ok(hex::encode(buf))
}

/// Random string over `[a-z0-9]`, as bootstrap tokens use.
pub fn random_lower_alnum(len: usize) -> Result<String> {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut out = String::with_capacity(len);
    let mut buf = [0u8; 64];
    while out.len() < len {
        getrandom::getrandom(&mut buf)
            .map_err(|e| ServerError::Internal(format!("random: {e}")))?;
        // Rejection sampling keeps the distribution uniform (252 = 7 * 36).
        for b in buf {
            if b < 252 && out.len() < len {
                out.push(ALPHABET[(b % 36) as usize] as char);
            }
        }
    }
    Ok(out)
}

/// Stored form of a bearer secret: only its hash is kept in the database.
pub fn token_hash(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// Equal-time comparison for secrets.
pub fn secrets_equal(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

pub struct Pki {
    pub ca_pem: String,
    ca_key: KeyPair,
}

fn ca_params() -> Result<CertificateParams> {
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(pki_err)?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, CA_CN);
    dn.push(DnType::OrganizationName, "knit");
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params.not_before = rcgen::date_time_ymd(2024, 1, 1);
    params.not_after = rcgen::date_time_ymd(2124, 1, 1);
    Ok(params)
}

impl Pki {
    /// Loads the CA from `dir`, creating it at first start. `state` lists
    /// files whose presence means this is not a first start (the store, the
    /// admin token): then a missing CA is refused, never made again, since
    /// every running node trusts the old one.
    pub fn load_or_create(dir: &Path, state: &[PathBuf]) -> Result<Pki> {
        let cert_path = dir.join("ca.pem");
        let key_path = dir.join("ca.key");
        let missing: Vec<&PathBuf> = [&cert_path, &key_path]
            .into_iter()
            .filter(|p| !p.exists())
            .collect();
        let existing: Vec<&PathBuf> = state.iter().filter(|p| p.exists()).collect();
        if missing.len() == 1 || (!missing.is_empty() && !existing.is_empty()) {
            return Err(ServerError::Pki(format!(
                "the control plane's CA is incomplete: {} missing{}; nodes trust the CA this state was made with, so knit will not make a new one. Restore {} from a backup of {}; or, to start over with a new CA (every node must then be re-bootstrapped), move {} away",
                missing
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(" and "),
                if existing.is_empty() {
                    String::new()
                } else {
                    format!(
                        " while {} exist(s)",
                        existing
                            .iter()
                            .map(|p| p.display().to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                },
                missing
                    .iter()
                    .filter_map(|p| p.file_name())
                    .map(|n| n.to_string_lossy().into_owned())
                    .collect::<Vec<_>>()
                    .join(" and "),
                dir.display(),
                dir.parent().unwrap_or(dir).display(),
            )));
        }
        std::fs::create_dir_all(dir)
            .map_err(|e| ServerError::io(format!("create {}", dir.display()), e))?;
        if missing.is_empty() {
            let ca_key = KeyPair::from_pem(&read(&key_path)?).map_err(pki_err)?;
            return Ok(Pki {
                ca_pem: read(&cert_path)?,
                ca_key,
            });
        }
        let ca_key = KeyPair::generate().map_err(pki_err)?;
        let cert = ca_params()?.self_signed(&ca_key).map_err(pki_err)?;
        write_secret(&key_path, ca_key.serialize_pem().as_bytes())?;
        knit_os::durable::write(&cert_path, cert.pem().as_bytes(), 0o644)?;
        Ok(Pki {
            ca_pem: cert.pem(),
            ca_key,
        })
    }

    /// A serving certificate for `hosts` (IP addresses or DNS names), signed
    /// by the CA. Made afresh at each start so that new addresses are covered.
    pub fn server_config(&self, hosts: &[String]) -> Result<Arc<rustls::ServerConfig>> {
        let (chain, key_der) = self.serving_certificate(hosts)?;
        let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(pki_err)?
        .with_no_client_auth()
        .with_single_cert(chain, key_der)
        .map_err(pki_err)?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }

    /// A serving configuration for `hosts` that requires a client
    /// certificate this CA issued (the autoscaler service: gRPC, so h2
    /// only).
    pub fn mutual_tls_config(&self, hosts: &[String]) -> Result<Arc<rustls::ServerConfig>> {
        let (chain, key_der) = self.serving_certificate(hosts)?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let roots = knit_os::pem::roots(self.ca_pem.as_bytes(), "the control-plane CA")?;
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::new(roots),
            provider.clone(),
        )
        .build()
        .map_err(pki_err)?;
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(pki_err)?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain, key_der)
            .map_err(pki_err)?;
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(Arc::new(config))
    }

    /// A client certificate (and its new key) for `common_name`, signed by
    /// the CA, good for client authentication only: PEM certificate, PEM
    /// PKCS#8 key.
    pub fn client_certificate(&self, common_name: &str) -> Result<(String, String)> {
        let issuer = ca_params()?.self_signed(&self.ca_key).map_err(pki_err)?;
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(pki_err)?;
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params
            .distinguished_name
            .push(DnType::OrganizationName, "knit");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let key = KeyPair::generate().map_err(pki_err)?;
        let cert = params
            .signed_by(&key, &issuer, &self.ca_key)
            .map_err(pki_err)?;
        Ok((cert.pem(), key.serialize_pem()))
    }

    fn serving_certificate(
        &self,
        hosts: &[String],
    ) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)> {
        // The issuer object is rebuilt from the same key and name; a
        // certificate it signs verifies against the stored CA certificate.
        let issuer = ca_params()?.self_signed(&self.ca_key).map_err(pki_err)?;
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(pki_err)?;
        params
            .distinguished_name
            .push(DnType::CommonName, "knit server");
        for host in hosts {
            let san = match host.parse::<std::net::IpAddr>() {
                Ok(ip) => SanType::IpAddress(ip),
                Err(_) => SanType::DnsName(host.clone().try_into().map_err(pki_err)?),
            };
            if !params.subject_alt_names.contains(&san) {
                params.subject_alt_names.push(san);
            }
        }
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let key = KeyPair::generate().map_err(pki_err)?;
        let cert = params
            .signed_by(&key, &issuer, &self.ca_key)
            .map_err(pki_err)?;
        let chain = vec![CertificateDer::from(cert.der().to_vec())];
        let key_der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        Ok((chain, key_der))
    }
}

/// Reads the admin token from `path`, creating it (mode 0600) if absent.
pub fn load_or_create_token(path: &Path) -> Result<String> {
    Ok(knit_os::durable::read_or_create_token(path)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn ca_is_made_once_and_token_file_is_private() {
        let dir = tempfile::tempdir().unwrap();
        let a = Pki::load_or_create(dir.path(), &[]).unwrap();
        let b = Pki::load_or_create(dir.path(), &[]).unwrap();
        assert_eq!(a.ca_pem, b.ca_pem);
        assert!(b
            .server_config(&["127.0.0.1".into(), "localhost".into()])
            .is_ok());
        let mode = std::fs::metadata(dir.path().join("ca.key"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);

        let token_path = dir.path().join("admin-token");
        let t1 = load_or_create_token(&token_path).unwrap();
        let t2 = load_or_create_token(&token_path).unwrap();
        assert_eq!(t1, t2);
        assert_eq!(t1.len(), 64);
        let mode = std::fs::metadata(&token_path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn a_missing_ca_is_refused_once_other_state_exists() {
        let dir = tempfile::tempdir().unwrap();
        let pki = dir.path().join("pki");
        let db = dir.path().join("knit.db");
        // First start: nothing there, the CA is made.
        Pki::load_or_create(&pki, std::slice::from_ref(&db)).unwrap();
        std::fs::write(&db, b"").unwrap();
        // The CA lost, the store kept: refused, nothing made.
        std::fs::remove_file(pki.join("ca.pem")).unwrap();
        std::fs::remove_file(pki.join("ca.key")).unwrap();
        let e = Pki::load_or_create(&pki, std::slice::from_ref(&db))
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("ca.pem") && e.contains("ca.key") && e.contains("knit.db"),
            "{e}"
        );
        assert!(e.contains("Restore") && e.contains("move"), "{e}");
        assert!(!pki.join("ca.pem").exists(), "no new CA was made");
        // Half a CA: refused even without other state.
        Pki::load_or_create(&pki, &[]).unwrap();
        std::fs::remove_file(pki.join("ca.key")).unwrap();
        let e = Pki::load_or_create(&pki, &[]).err().unwrap().to_string();
        assert!(e.contains("ca.key missing"), "{e}");
    }

    #[test]
    fn random_tokens_have_the_bootstrap_shape() {
        let id = random_lower_alnum(6).unwrap();
        let secret = random_lower_alnum(16).unwrap();
        assert!(knit_api::validate::is_bootstrap_token(&format!(
            "{id}.{secret}"
        )));
        assert_ne!(random_hex(16).unwrap(), random_hex(16).unwrap());
        assert!(secrets_equal("abc", "abc"));
        assert!(!secrets_equal("abc", "abd"));
        assert!(!secrets_equal("abc", "abcd"));
    }
}
