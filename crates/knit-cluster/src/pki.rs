//! The cluster CA: generated at first start, persisted in the data dir, and
//! used to sign the serving certificate, the admin credential and approved
//! kubelet CSRs.

use std::path::Path;
use std::time::Duration;

use rcgen::{
    BasicConstraints, Certificate, CertificateParams, CertificateSigningRequestParams, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose, SanType, SerialNumber,
};
use ring::digest;
use x509_parser::prelude::{FromDer, X509Certificate};

use crate::error::ClusterError;
use crate::util;

pub struct Ca {
    cert_pem: String,
    /// The CA as rcgen needs it for signing (same name, key and key id).
    issuer: Certificate,
    key: KeyPair,
    pin: String,
}

/// Subject of a parsed, signature-checked CSR.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CsrSubject {
    pub common_name: String,
    pub organizations: Vec<String>,
    /// DNS names, IPs or emails requested: kubelet client CSRs must have none.
    pub has_sans: bool,
}

impl Ca {
    pub fn load_or_create(dir: &Path) -> Result<Ca, ClusterError> {
        let cert_path = dir.join("ca.crt");
        let key_path = dir.join("ca.key");
        if cert_path.exists() != key_path.exists() {
            // Never replace half a CA: every node trusts the old one.
            return Err(ClusterError::Cert(format!(
                "{} and {} must both exist or both be absent; restore the missing one",
                cert_path.display(),
                key_path.display()
            )));
        }
        if cert_path.exists() {
            let cert_pem =
                std::fs::read_to_string(&cert_path).map_err(|e| ClusterError::io(&cert_path, e))?;
            let key_pem =
                std::fs::read_to_string(&key_path).map_err(|e| ClusterError::io(&key_path, e))?;
            let key = KeyPair::from_pem(&key_pem)?;
            let issuer = CertificateParams::from_ca_cert_pem(&cert_pem)?.self_signed(&key)?;
            let pin = spki_pin(&cert_pem)?;
            return Ok(Ca {
                cert_pem,
                issuer,
                key,
                pin,
            });
        }
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params
            .distinguished_name
            .push(DnType::CommonName, "kubernetes");
        params
            .distinguished_name
            .push(DnType::OrganizationName, "knit");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let now = util::now();
        params.not_before = now - time::Duration::minutes(5);
        params.not_after = now + time::Duration::days(3650);
        params.serial_number = Some(serial()?);
        let issuer = params.self_signed(&key)?;
        let cert_pem = issuer.pem();
        write_private(&key_path, &key.serialize_pem())?;
        write_durable(&cert_path, cert_pem.as_bytes(), 0o644)?;
        let pin = spki_pin(&cert_pem)?;
        Ok(Ca {
            cert_pem,
            issuer,
            key,
            pin,
        })
    }

    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// `sha256:<hex>` of the CA's SubjectPublicKeyInfo, as kubeadm pins it.
    pub fn pin(&self) -> &str {
        &self.pin
    }

    /// Serving certificate for the API server with the given names/IPs.
    pub fn issue_server(
        &self,
        sans: &[String],
        ttl: Duration,
    ) -> Result<(String, String), ClusterError> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.subject_alt_names = sans
            .iter()
            .map(|s| match s.parse::<std::net::IpAddr>() {
                Ok(ip) => Ok(SanType::IpAddress(ip)),
                Err(_) => s.clone().try_into().map(SanType::DnsName),
            })
            .collect::<Result<_, _>>()?;
        params
            .distinguished_name
            .push(DnType::CommonName, "kube-apiserver");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        self.finish(params, ttl, &key)
            .map(|pem| (pem, key.serialize_pem()))
    }

    /// A client certificate and its new key (the admin credential).
    pub fn issue_client(
        &self,
        cn: &str,
        orgs: &[&str],
        ttl: Duration,
    ) -> Result<(String, String), ClusterError> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, cn);
        for o in orgs {
            params.distinguished_name.push(DnType::OrganizationName, *o);
        }
        client_usages(&mut params);
        self.finish(params, ttl, &key)
            .map(|pem| (pem, key.serialize_pem()))
    }

    /// Sign a CSR (PEM) for client authentication. The subject is taken from
    /// the request (already checked by the caller); everything else is ours.
    pub fn sign_client_csr(&self, csr_pem: &str, ttl: Duration) -> Result<String, ClusterError> {
        let csr = CertificateSigningRequestParams::from_pem(csr_pem)
            .map_err(|e| ClusterError::Cert(format!("CSR: {e}")))?;
        let subject = parse_csr(csr_pem)?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params
            .distinguished_name
            .push(DnType::CommonName, subject.common_name);
        for o in subject.organizations {
            params.distinguished_name.push(DnType::OrganizationName, o);
        }
        client_usages(&mut params);
        let (not_before, not_after) = validity(ttl);
        params.not_before = not_before;
        params.not_after = not_after;
        params.serial_number = Some(serial()?);
        params.use_authority_key_identifier_extension = true;
        let cert = params.signed_by(&csr.public_key, &self.issuer, &self.key)?;
        Ok(cert.pem())
    }

    fn finish(
        &self,
        mut params: CertificateParams,
        ttl: Duration,
        key: &KeyPair,
    ) -> Result<String, ClusterError> {
        let (not_before, not_after) = validity(ttl);
        params.not_before = not_before;
        params.not_after = not_after;
        params.serial_number = Some(serial()?);
        params.use_authority_key_identifier_extension = true;
        Ok(params.signed_by(key, &self.issuer, &self.key)?.pem())
    }
}

fn client_usages(params: &mut CertificateParams) {
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
}

/// Back-dated a little, as Kubernetes does, to absorb clock skew; at most a
/// quarter of the lifetime, so short test lifetimes still rotate in time.
fn validity(ttl: Duration) -> (time::OffsetDateTime, time::OffsetDateTime) {
    let now = util::now();
    let back = (ttl / 4).min(Duration::from_secs(300));
    (now - back, now + ttl)
}

fn serial() -> Result<SerialNumber, ClusterError> {
    let mut b = util::random_bytes::<16>()?;
    b[0] &= 0x7f; // positive
    Ok(SerialNumber::from_slice(&b))
}

/// Replaces `path` with `contents` readable by its owner only (keys,
/// kubeconfigs); see [`write_durable`].
pub(crate) fn write_private(path: &Path, contents: &str) -> Result<(), ClusterError> {
    write_durable(path, contents.as_bytes(), 0o600)
}

/// Replaces `path` with `contents` so that a crash leaves the old file or
/// the new one, never a torn key (knit-os's durable write).
fn write_durable(path: &Path, contents: &[u8], mode: u32) -> Result<(), ClusterError> {
    knit_os::durable::write(path, contents, mode).map_err(|e| match e {
        knit_os::OsError::Io {
            path: failed,
            source,
            ..
        } => ClusterError::io(failed, source),
        other => ClusterError::io(path, std::io::Error::other(other.to_string())),
    })
}

/// The first certificate in `pem`, as DER.
fn certificate_der(pem: &str, what: &str) -> Result<Vec<u8>, ClusterError> {
    let certs = knit_os::pem::certificates(pem.as_bytes(), what)
        .map_err(|e| ClusterError::Cert(e.to_string()))?;
    certs
        .into_iter()
        .next()
        .map(|c| c.to_vec())
        .ok_or_else(|| ClusterError::Cert(format!("{what}: holds no certificate")))
}

pub fn spki_pin(cert_pem: &str) -> Result<String, ClusterError> {
    let der = certificate_der(cert_pem, "certificate")?;
    let (_, cert) =
        X509Certificate::from_der(&der).map_err(|e| ClusterError::Cert(e.to_string()))?;
    Ok(format!(
        "sha256:{}",
        hex::encode(digest::digest(&digest::SHA256, cert.public_key().raw))
    ))
}

/// Parse a PEM CSR and check its self-signature.
pub fn parse_csr(pem: &str) -> Result<CsrSubject, ClusterError> {
    use x509_parser::certification_request::X509CertificationRequest;
    let der = knit_os::pem::certificate_request(pem.as_bytes(), "CSR")
        .map_err(|e| ClusterError::Cert(e.to_string()))?;
    let (_, csr) = X509CertificationRequest::from_der(&der)
        .map_err(|e| ClusterError::Cert(format!("CSR: {e}")))?;
    csr.verify_signature()
        .map_err(|e| ClusterError::Cert(format!("CSR signature does not verify: {e}")))?;
    let subject = &csr.certification_request_info.subject;
    let common_name = subject
        .iter_common_name()
        .next()
        .and_then(|c| c.as_str().ok())
        .unwrap_or("")
        .to_string();
    let organizations = subject
        .iter_organization()
        .filter_map(|o| o.as_str().ok().map(str::to_string))
        .collect();
    let has_sans = csr.requested_extensions().into_iter().flatten().any(|e| {
        matches!(
            e,
            x509_parser::extensions::ParsedExtension::SubjectAlternativeName(_)
        )
    });
    Ok(CsrSubject {
        common_name,
        organizations,
        has_sans,
    })
}

/// What the server uses of a (TLS-verified) client certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientCert {
    pub common_name: String,
    pub organizations: Vec<String>,
    /// Serial number, lowercase hex: what revocation records.
    pub serial: String,
    /// Expiry, Unix seconds: a revocation is kept no longer than this.
    pub not_after: i64,
}

/// CN, O, serial and expiry of a DER certificate.
pub fn cert_identity(der: &[u8]) -> Option<ClientCert> {
    let (_, cert) = X509Certificate::from_der(der).ok()?;
    let subject = cert.subject();
    let cn = subject
        .iter_common_name()
        .next()?
        .as_str()
        .ok()?
        .to_string();
    let orgs = subject
        .iter_organization()
        .filter_map(|o| o.as_str().ok().map(str::to_string))
        .collect();
    Some(ClientCert {
        common_name: cn,
        organizations: orgs,
        serial: hex::encode(cert.raw_serial()),
        not_after: cert.validity().not_after.timestamp(),
    })
}

/// Like `cert_identity`, for a PEM certificate (as CSRs hold them).
pub fn pem_cert_identity(pem: &str) -> Option<ClientCert> {
    let der = certificate_der(pem, "certificate").ok()?;
    cert_identity(&der)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ca_persists_and_signs_csrs_it_can_verify() {
        let dir = tempfile::tempdir().unwrap();
        let ca = Ca::load_or_create(dir.path()).unwrap();
        let again = Ca::load_or_create(dir.path()).unwrap();
        assert_eq!(ca.cert_pem(), again.cert_pem());
        assert_eq!(ca.pin(), again.pin());
        std::fs::remove_file(dir.path().join("ca.key")).unwrap();
        assert!(
            Ca::load_or_create(dir.path()).is_err(),
            "half a CA is not silently replaced"
        );
        assert!(knit_api::validate::is_ca_pin(ca.pin()));

        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name
            .push(DnType::CommonName, "system:node:n1");
        p.distinguished_name
            .push(DnType::OrganizationName, "system:nodes");
        let csr = p.serialize_request(&key).unwrap().pem().unwrap();
        let subject = parse_csr(&csr).unwrap();
        assert_eq!(subject.common_name, "system:node:n1");
        assert_eq!(subject.organizations, vec!["system:nodes".to_string()]);
        assert!(!subject.has_sans);

        // Signed by the reloaded CA; verified against the original CA cert.
        let pem = again
            .sign_client_csr(&csr, Duration::from_secs(60))
            .unwrap();
        let der = certificate_der(&pem, "cert").unwrap();
        let (_, cert) = X509Certificate::from_der(&der).unwrap();
        let ca_der = certificate_der(ca.cert_pem(), "ca").unwrap();
        let (_, ca_cert) = X509Certificate::from_der(&ca_der).unwrap();
        cert.verify_signature(Some(ca_cert.public_key())).unwrap();
        assert_eq!(cert_identity(&der).unwrap().common_name, "system:node:n1");
    }

    #[test]
    fn tampered_csr_is_rejected() {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name
            .push(DnType::CommonName, "system:node:n1");
        let csr = p.serialize_request(&key).unwrap();
        let mut der = csr.der().to_vec();
        let n = der.len();
        der[n - 3] ^= 0xff; // inside the signature
        let pem = knit_os::pem::encode("CERTIFICATE REQUEST", &der);
        let err = parse_csr(&pem).unwrap_err().to_string();
        assert!(err.contains("CSR signature does not verify"), "{err}");
    }
}
