//! kubelet's client certificate: TLS bootstrap (CSR with the bootstrap
//! token), the `kubelet-client-current.pem` layout in the cert dir, and
//! rotation before expiry (CSR with the current certificate).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use rcgen::{CertificateParams, DnType, KeyPair};
use serde_json::{json, Value};
use time::OffsetDateTime;

use crate::client::Client;
use crate::error::SimError;
use crate::files::write_private;

pub const SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";
pub const CURRENT: &str = "kubelet-client-current.pem";
const CSR_PATH: &str = "/apis/certificates.k8s.io/v1/certificatesigningrequests";

/// A client certificate with its key and validity.
#[derive(Debug, Clone)]
pub struct Credentials {
    pub cert_pem: String,
    pub key_pem: String,
    pub not_before: OffsetDateTime,
    pub not_after: OffsetDateTime,
}

impl Credentials {
    /// Parse a PEM bundle holding the certificate (the first one's
    /// validity counts; a chain after it is kept) and its key.
    pub fn from_bundle(pem: &str) -> Result<Credentials, SimError> {
        const WHAT: &str = "the client bundle";
        let cert_err = |e: knit_os::OsError| SimError::Cert(e.to_string());
        let certs = knit_os::pem::certificates(pem.as_bytes(), WHAT).map_err(cert_err)?;
        let key = knit_os::pem::private_key(pem.as_bytes(), WHAT).map_err(cert_err)?;
        // `certificates` returns at least one.
        let (_, cert) = x509_parser::parse_x509_certificate(certs[0].as_ref())
            .map_err(|e| SimError::Cert(format!("{WHAT}: {e}")))?;
        let validity = cert.validity();
        Ok(Credentials {
            cert_pem: certs
                .iter()
                .map(|c| knit_os::pem::encode("CERTIFICATE", c))
                .collect(),
            key_pem: knit_os::pem::encode_private_key(&key),
            not_before: validity.not_before.to_datetime(),
            not_after: validity.not_after.to_datetime(),
        })
    }

    pub fn valid_now(&self) -> bool {
        let now = OffsetDateTime::now_utc();
        self.not_before <= now && now < self.not_after
    }

    /// Like kubelet: rotate somewhere between 70 % and 90 % of the lifetime
    /// (jittered so a fleet does not rotate at once).
    pub fn rotation_deadline(&self, jitter: f64) -> OffsetDateTime {
        let life = self.not_after - self.not_before;
        self.not_before + life * (0.7 + 0.2 * jitter.clamp(0.0, 1.0))
    }
}

/// The current credentials in `cert_dir`, if present, parseable and valid.
pub fn load_current(cert_dir: &Path) -> Option<Credentials> {
    let pem = std::fs::read_to_string(cert_dir.join(CURRENT)).ok()?;
    Credentials::from_bundle(&pem)
        .ok()
        .filter(Credentials::valid_now)
}

/// Write `kubelet-client-<time>.pem` and point `kubelet-client-current.pem`
/// at it, as kubelet's certificate store does.
pub fn store(cert_dir: &Path, cert_pem: &str, key_pem: &str) -> Result<PathBuf, SimError> {
    let stamp = OffsetDateTime::now_utc()
        .format(time::macros::format_description!(
            "[year]-[month]-[day]-[hour]-[minute]-[second]-[subsecond digits:6]"
        ))
        .map_err(|e| SimError::Cert(e.to_string()))?;
    let file = cert_dir.join(format!("kubelet-client-{stamp}.pem"));
    write_private(&file, format!("{}{}", cert_pem, key_pem).as_bytes())?;
    let current = cert_dir.join(CURRENT);
    let tmp = cert_dir.join(format!(".{CURRENT}.tmp"));
    let _ = std::fs::remove_file(&tmp); // a leftover from a crash, if any
    std::os::unix::fs::symlink(&file, &tmp).map_err(|e| SimError::io(&tmp, e))?;
    std::fs::rename(&tmp, &current).map_err(|e| SimError::io(&current, e))?;
    Ok(current)
}

/// Send a kubelet client CSR for `node` and wait for the certificate.
pub fn request(client: &Client, node: &str, limit: Duration) -> Result<(String, String), SimError> {
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params
        .distinguished_name
        .push(DnType::CommonName, format!("system:node:{node}"));
    params
        .distinguished_name
        .push(DnType::OrganizationName, "system:nodes");
    let csr_pem = params.serialize_request(&key)?.pem()?;
    let body = json!({
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "CertificateSigningRequest",
        "metadata": {"generateName": "csr-"},
        "spec": {
            "request": STANDARD.encode(&csr_pem),
            "signerName": SIGNER,
            "usages": ["digital signature", "client auth"],
        },
    });
    let created = client.post(CSR_PATH, &body)?;
    if !created.ok() {
        return Err(created.error("creating the certificate signing request"));
    }
    let name = created.body["metadata"]["name"]
        .as_str()
        .unwrap_or("")
        .to_string();
    tracing::info!(csr = %name, node, "certificate signing request sent; waiting for approval");
    let start = Instant::now();
    let mut csr = created.body;
    loop {
        if let Some(pem) = issued(&name, &csr)? {
            tracing::info!(csr = %name, "client certificate issued");
            return Ok((pem, key.serialize_pem()));
        }
        let left = limit.saturating_sub(start.elapsed());
        if left.is_zero() {
            return Err(SimError::Cert(format!(
                "CSR {name} not approved within {limit:?}"
            )));
        }
        // Watched from the version last read, so the approver's and the
        // signer's writes arrive as they happen instead of a poll later.
        let rv = csr["metadata"]["resourceVersion"]
            .as_str()
            .unwrap_or("")
            .to_string();
        let watched = if rv.is_empty() {
            // Watching from "now" could miss a write made before it began.
            Err(None)
        } else {
            watch_csr(client, &name, &rv, left).map_err(Some)
        };
        match watched {
            Ok(Some(next)) => {
                csr = next;
                continue;
            }
            // The watch ended (its timeout, a 410) without news: read it.
            Ok(None) => {}
            Err(e) => {
                if let Some(e) = e {
                    tracing::warn!(csr = %name, code = e.code(), error = %e, "watching the certificate signing request failed; reading it again");
                }
                std::thread::sleep(CSR_POLL.min(left));
            }
        }
        let r = client.get(&format!("{CSR_PATH}/{name}"))?;
        if !r.ok() {
            return Err(r.error("reading the certificate signing request"));
        }
        csr = r.body;
    }
}

/// How long after a failed watch the CSR is read again.
const CSR_POLL: Duration = Duration::from_millis(500);
/// Longest one watch of the CSR runs before it is read and watched again.
const CSR_WATCH: Duration = Duration::from_secs(60);

/// The certificate (PEM) when the CSR was issued one; an error when it
/// was denied or failed; `None` while it is pending.
fn issued(name: &str, csr: &Value) -> Result<Option<String>, SimError> {
    let status = &csr["status"];
    for c in status["conditions"].as_array().into_iter().flatten() {
        if c["type"] == "Denied" || c["type"] == "Failed" {
            return Err(SimError::CsrRejected {
                name: name.to_string(),
                outcome: c["type"].as_str().unwrap_or("").to_lowercase(),
                message: c["message"].as_str().unwrap_or("").to_string(),
            });
        }
    }
    let Some(cert) = status["certificate"].as_str().filter(|c| !c.is_empty()) else {
        return Ok(None);
    };
    STANDARD
        .decode(cert)
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .map(Some)
        .ok_or_else(|| SimError::Cert(format!("CSR {name}: certificate is not base64 PEM")))
}

/// Watch the CSR `name` from `rv` until a change decides it (issued,
/// denied, failed) or the watch ends; the CSR as last seen, `None` when
/// nothing changed.
fn watch_csr(
    client: &Client,
    name: &str,
    rv: &str,
    left: Duration,
) -> Result<Option<Value>, SimError> {
    let seconds = CSR_WATCH.min(left).as_secs().max(1);
    let path = format!(
        "{CSR_PATH}?fieldSelector=metadata.name%3D{name}&watch=true&resourceVersion={rv}&timeoutSeconds={seconds}"
    );
    let mut last = None;
    client.stream(&path, |ev| match ev["type"].as_str() {
        Some("ADDED" | "MODIFIED") if ev["object"]["metadata"]["name"] == name => {
            let object = ev["object"].clone();
            // Pending: watch on for the next write.
            let pending = matches!(issued(name, &object), Ok(None));
            last = Some(object);
            pending
        }
        Some("ADDED" | "MODIFIED" | "BOOKMARK") => true,
        // DELETED (read again: the GET says it is gone), ERROR (410 Gone).
        _ => false,
    })?;
    Ok(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_points_current_at_the_newest_bundle() {
        let dir = tempfile::tempdir().unwrap();
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.not_before = OffsetDateTime::now_utc() - time::Duration::minutes(1);
        p.not_after = OffsetDateTime::now_utc() + time::Duration::hours(1);
        let cert = p.self_signed(&key).unwrap();
        store(dir.path(), &cert.pem(), &key.serialize_pem()).unwrap();
        let creds = load_current(dir.path()).unwrap();
        assert_eq!(creds.cert_pem.trim(), cert.pem().trim());
        assert_eq!(creds.key_pem.trim(), key.serialize_pem().trim());
        let d = creds.rotation_deadline(0.5);
        assert!(d > creds.not_before && d < creds.not_after);
        assert!(std::fs::symlink_metadata(dir.path().join(CURRENT))
            .unwrap()
            .file_type()
            .is_symlink());
    }

    #[test]
    fn a_bundle_without_its_key_or_certificate_is_a_certificate_error_naming_it() {
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(Vec::<String>::new())
            .unwrap()
            .self_signed(&key)
            .unwrap();
        for (bundle, missing) in [
            (cert.pem(), "holds no private key"),
            (key.serialize_pem(), "holds no certificate"),
        ] {
            let err = Credentials::from_bundle(&bundle).unwrap_err();
            assert!(matches!(err, SimError::Cert(_)), "{err}");
            assert!(
                err.to_string()
                    .starts_with(&format!("certificate: the client bundle: {missing}")),
                "{err}"
            );
        }
    }
}
