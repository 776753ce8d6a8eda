//! TLS trust roots and identities from PEM text, through rustls-pki-types'
//! PEM reader (and PEM written, through the `pem` crate). Text outside `-----BEGIN …-----`/`-----END …-----` sections
//! (comments, a bundle's headings) is skipped; a broken section is an
//! error naming the text (`what`: "the CA bundle", "ca_cert in ~/.knit/config").

use crate::error::{OsError, Result};
use rustls_pki_types::pem::{self, PemObject};
use rustls_pki_types::{CertificateDer, CertificateSigningRequestDer, PrivateKeyDer};

fn invalid(what: &str, rule: impl Into<String>) -> OsError {
    OsError::Pem {
        what: what.to_string(),
        rule: rule.into(),
    }
}

fn explain(e: pem::Error) -> String {
    match e {
        pem::Error::NoItemsFound => "holds no PEM section".to_string(),
        other => format!("is not valid PEM ({other:?})"),
    }
}

/// Every certificate in `text`, in order; at least one.
pub fn certificates(text: &[u8], what: &str) -> Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_slice_iter(text)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| invalid(what, explain(e)))?;
    if certs.is_empty() {
        return Err(invalid(
            what,
            "holds no certificate (-----BEGIN CERTIFICATE-----)",
        ));
    }
    Ok(certs)
}

/// A root store trusting every certificate in `text` (at least one; each
/// must be a certificate rustls takes as a trust anchor).
pub fn roots(text: &[u8], what: &str) -> Result<rustls::RootCertStore> {
    let mut store = rustls::RootCertStore::empty();
    for (i, cert) in certificates(text, what)?.into_iter().enumerate() {
        store.add(cert).map_err(|e| {
            invalid(
                what,
                format!("certificate {} is not a trust anchor: {e}", i + 1),
            )
        })?;
    }
    Ok(store)
}

/// The private key in `text` (PKCS#8, PKCS#1 or SEC1: the first found).
pub fn private_key(text: &[u8], what: &str) -> Result<PrivateKeyDer<'static>> {
    PrivateKeyDer::from_pem_slice(text).map_err(|e| match e {
        pem::Error::NoItemsFound => {
            invalid(what, "holds no private key (-----BEGIN … PRIVATE KEY-----)")
        }
        other => invalid(what, explain(other)),
    })
}

/// The certificate signing request in `text` (the first one found).
pub fn certificate_request(
    text: &[u8],
    what: &str,
) -> Result<CertificateSigningRequestDer<'static>> {
    CertificateSigningRequestDer::from_pem_slice(text).map_err(|e| match e {
        pem::Error::NoItemsFound => invalid(
            what,
            "holds no certificate request (-----BEGIN CERTIFICATE REQUEST-----)",
        ),
        other => invalid(what, explain(other)),
    })
}

/// `der` as one PEM section labelled `label` ("CERTIFICATE",
/// "CERTIFICATE REQUEST", ...): base64 in 64-column lines, LF line ends.
pub fn encode(label: &str, der: &[u8]) -> String {
    ::pem::encode_config(
        &::pem::Pem::new(label, der),
        ::pem::EncodeConfig::new().set_line_ending(::pem::LineEnding::LF),
    )
}

/// `key` as PEM under the label of its form: `PRIVATE KEY` (PKCS#8),
/// `RSA PRIVATE KEY` (PKCS#1) or `EC PRIVATE KEY` (SEC1).
pub fn encode_private_key(key: &PrivateKeyDer<'_>) -> String {
    let label = match key {
        PrivateKeyDer::Pkcs1(_) => "RSA PRIVATE KEY",
        PrivateKeyDer::Sec1(_) => "EC PRIVATE KEY",
        // PKCS#8, and any form added later: PKCS#8 is the general one.
        _ => "PRIVATE KEY",
    };
    encode(label, key.secret_der())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cert(cn: &str) -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec![cn.to_string()]).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let c = params.self_signed(&key).unwrap();
        (c.pem(), key.serialize_pem())
    }

    #[test]
    fn two_certificates_among_other_text_are_both_read_in_order() {
        let (a, _) = cert("a.example");
        let (b, _) = cert("b.example");
        let bundle =
            format!("# knit CA bundle\nsome heading\n{a}\nbetween: not PEM\n{b}trailing words\n");
        let certs = certificates(bundle.as_bytes(), "the bundle").unwrap();
        assert_eq!(certs.len(), 2);
        assert_eq!(
            certs[0],
            CertificateDer::from_pem_slice(a.as_bytes()).unwrap()
        );
        assert_eq!(
            certs[1],
            CertificateDer::from_pem_slice(b.as_bytes()).unwrap()
        );
        assert_eq!(roots(bundle.as_bytes(), "the bundle").unwrap().len(), 2);
    }

    #[test]
    fn garbage_no_certificate_and_a_cut_certificate_are_errors_naming_the_text() {
        let (a, key) = cert("a.example");
        let err = certificates(b"just some words\n", "ca_cert in config").unwrap_err();
        assert_eq!(err.code(), "PemInvalid");
        assert!(
            err.to_string()
                .starts_with("ca_cert in config: holds no certificate"),
            "{err}"
        );
        // A key is PEM but not a certificate.
        let err = roots(key.as_bytes(), "the CA bundle").unwrap_err();
        assert!(err.to_string().contains("holds no certificate"), "{err}");
        // A section that never ends.
        let cut = &a[..a.len() / 2];
        let err = certificates(cut.as_bytes(), "the CA bundle").unwrap_err();
        assert!(
            err.to_string()
                .starts_with("the CA bundle: is not valid PEM"),
            "{err}"
        );
        // A section whose body is not base64.
        let garbled = "-----BEGIN CERTIFICATE-----\n!!!not base64!!!\n-----END CERTIFICATE-----\n";
        let err = certificates(garbled.as_bytes(), "the CA bundle").unwrap_err();
        assert!(err.to_string().contains("is not valid PEM"), "{err}");
        // DER that is not a certificate is refused as a trust anchor.
        let junk = "-----BEGIN CERTIFICATE-----\naGVsbG8gd29ybGQ=\n-----END CERTIFICATE-----\n";
        let err = roots(junk.as_bytes(), "the CA bundle").unwrap_err();
        assert!(
            err.to_string()
                .contains("certificate 1 is not a trust anchor"),
            "{err}"
        );
    }

    #[test]
    fn a_certificate_written_as_pem_reads_back_the_same() {
        let (a, _) = cert("a.example");
        let der = CertificateDer::from_pem_slice(a.as_bytes()).unwrap();
        let text = encode("CERTIFICATE", &der);
        assert!(text.starts_with("-----BEGIN CERTIFICATE-----\n"), "{text}");
        assert!(text.ends_with("-----END CERTIFICATE-----\n"), "{text}");
        assert!(!text.contains('\r'), "{text}");
        assert!(text.lines().all(|l| l.len() <= 64), "{text}");
        assert_eq!(
            certificates(text.as_bytes(), "the copy").unwrap(),
            vec![der]
        );
    }

    #[test]
    fn a_certificate_request_is_read_and_a_certificate_is_not_one() {
        let key = rcgen::KeyPair::generate().unwrap();
        let params = rcgen::CertificateParams::new(vec!["n1.example".to_string()]).unwrap();
        let csr = params.serialize_request(&key).unwrap();
        let text = csr.pem().unwrap();
        let read = certificate_request(text.as_bytes(), "the CSR").unwrap();
        assert_eq!(read.as_ref(), csr.der().as_ref());
        // Written and read back through encode.
        let again = encode("CERTIFICATE REQUEST", csr.der());
        let read = certificate_request(again.as_bytes(), "the CSR").unwrap();
        assert_eq!(read.as_ref(), csr.der().as_ref());
        let (a, _) = cert("a.example");
        let err = certificate_request(a.as_bytes(), "spec.request").unwrap_err();
        assert_eq!(err.code(), "PemInvalid");
        assert!(
            err.to_string()
                .starts_with("spec.request: holds no certificate request"),
            "{err}"
        );
    }

    #[test]
    fn a_private_key_is_read_and_a_certificate_is_not_one() {
        let (a, key) = cert("a.example");
        assert!(matches!(
            private_key(key.as_bytes(), "the key").unwrap(),
            PrivateKeyDer::Pkcs8(_)
        ));
        // Written back under its own label, it reads back the same.
        let sec1 = PrivateKeyDer::Sec1(
            private_key(key.as_bytes(), "the key")
                .unwrap()
                .secret_der()
                .to_vec()
                .into(),
        );
        for read in [private_key(key.as_bytes(), "the key").unwrap(), sec1] {
            let text = encode_private_key(&read);
            let label = match read {
                PrivateKeyDer::Sec1(_) => "EC PRIVATE KEY",
                _ => "PRIVATE KEY",
            };
            assert!(
                text.starts_with(&format!("-----BEGIN {label}-----\n")),
                "{text}"
            );
            assert_eq!(private_key(text.as_bytes(), "the copy").unwrap(), read);
        }
        let err = private_key(a.as_bytes(), "the client key").unwrap_err();
        assert!(
            err.to_string()
                .starts_with("the client key: holds no private key"),
            "{err}"
        );
    }
}
