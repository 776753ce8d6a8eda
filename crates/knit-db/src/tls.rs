//! TLS to PostgreSQL, with libpq's `sslmode` words so that a URL that works
//! with `psql` works here: `disable`, `prefer` (the default: TLS when the
//! server offers it), `require` (TLS or no connection), `verify-ca` (the
//! server's certificate signed by `sslrootcert`) and `verify-full` (also
//! naming the host the URL names). As in libpq, `prefer` and `require`
//! check the certificate against `sslrootcert` when one is given, and do
//! not check it otherwise: they encrypt, but do not prove whom to.
//! tokio-postgres knows only disable/prefer/require and no `sslrootcert`:
//! both are taken out of the URL here.

use std::path::PathBuf;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};

use crate::DbError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    fn parse(v: &str) -> Option<SslMode> {
        Some(match v {
            "disable" => SslMode::Disable,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            _ => return None,
        })
    }

    /// The word tokio-postgres takes for it.
    fn driver_word(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            _ => "require",
        }
    }
}

/// What a URL asks of TLS, and the URL as tokio-postgres takes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsSettings {
    pub mode: SslMode,
    pub root_cert: Option<PathBuf>,
    pub driver_url: String,
}

/// Takes `sslmode` and `sslrootcert` out of a postgres:// URL. `bad`
/// builds the error for a rule broken (the caller redacts the URL).
pub fn settings(url: &str, bad: impl Fn(String) -> DbError) -> Result<TlsSettings, DbError> {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, q),
        None => (url, ""),
    };
    let mut mode = SslMode::Prefer;
    let mut root_cert = None;
    let mut kept: Vec<String> = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let decoded = percent_encoding::percent_decode_str(value)
            .decode_utf8()
            .map_err(|_| bad(format!("{key}: not UTF-8 once percent-decoded")))?
            .to_string();
        match key {
            "sslmode" => {
                mode = SslMode::parse(&decoded).ok_or_else(|| {
                    bad(format!(
                        "sslmode={decoded}: must be disable, prefer, require, verify-ca or verify-full"
                    ))
                })?;
            }
            "sslrootcert" => {
                if decoded.is_empty() {
                    return Err(bad(
                        "sslrootcert: must name a PEM file of CA certificates".into()
                    ));
                }
                root_cert = Some(PathBuf::from(decoded));
            }
            _ => kept.push(pair.to_string()),
        }
    }
    if matches!(mode, SslMode::VerifyCa | SslMode::VerifyFull) && root_cert.is_none() {
        return Err(bad(format!(
            "sslmode={}: needs sslrootcert=<PEM file of the CA that signed the server's certificate>",
            if mode == SslMode::VerifyCa { "verify-ca" } else { "verify-full" }
        )));
    }
    kept.push(format!("sslmode={}", mode.driver_word()));
    Ok(TlsSettings {
        mode,
        root_cert,
        driver_url: format!("{base}?{}", kept.join("&")),
    })
}

/// The connector for `settings`; `None` when TLS is disabled.
pub fn connector(
    settings: &TlsSettings,
    bad: impl Fn(String) -> DbError,
) -> Result<Option<tokio_postgres_rustls::MakeRustlsConnect>, DbError> {
    if settings.mode == SslMode::Disable {
        return Ok(None);
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain = match &settings.root_cert {
        None => None,
        Some(path) => {
            let roots = read_roots(path).map_err(|why| {
                bad(format!(
                    "sslrootcert={}: {why}; must be a PEM file of CA certificates",
                    path.display()
                ))
            })?;
            let webpki =
                WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                    .build()
                    .map_err(|e| bad(format!("sslrootcert={}: {e}", path.display())))?;
            Some(webpki)
        }
    };
    let verifier: Arc<dyn ServerCertVerifier> = match chain {
        Some(webpki) if settings.mode == SslMode::VerifyFull => webpki,
        None if matches!(settings.mode, SslMode::VerifyFull | SslMode::VerifyCa) => {
            return Err(bad("sslmode=verify-*: needs sslrootcert".into()));
        }
        chain => Arc::new(Lenient {
            chain,
            provider: provider.clone(),
        }),
    };
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| DbError::Postgres(format!("TLS versions: {e}")))?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    Ok(Some(tokio_postgres_rustls::MakeRustlsConnect::new(config)))
}

/// Largest CA file read (a bundle of every public CA is about 200 KiB).
const MAX_ROOTS_BYTES: u64 = 4 * 1024 * 1024;

fn read_roots(path: &PathBuf) -> Result<RootCertStore, String> {
    use std::io::Read;
    let mut pem = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_ROOTS_BYTES + 1).read_to_end(&mut pem))
        .map_err(|e| format!("cannot read: {e}"))?;
    if pem.len() as u64 > MAX_ROOTS_BYTES {
        return Err(format!("larger than {} MiB", MAX_ROOTS_BYTES >> 20));
    }
    // The caller names the file: the rule alone goes into its message.
    knit_os::pem::roots(&pem, "sslrootcert").map_err(|e| match e {
        knit_os::OsError::Pem { rule, .. } => rule,
        other => other.to_string(),
    })
}

/// Every mode short of `verify-full`, as libpq: with a root (`verify-ca`,
/// or `prefer`/`require` given one) the chain is checked and the name is
/// not; without one (`prefer`/`require`) any certificate is taken. The
/// handshake's signatures are checked either way.
#[derive(Debug)]
struct Lenient {
    chain: Option<Arc<WebPkiServerVerifier>>,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for Lenient {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Some(chain) = &self.chain else {
            return Ok(ServerCertVerified::assertion());
        };
        match chain.verify_server_cert(end_entity, intermediates, server_name, ocsp, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bad(rule: String) -> DbError {
        DbError::BadDatastore {
            value: "url".into(),
            rule,
        }
    }

    #[test]
    fn sslmode_and_root_are_taken_out_of_the_url() {
        let s = settings(
            "postgres://k@db:5432/knit?application_name=x&sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem",
            bad,
        )
        .unwrap();
        assert_eq!(s.mode, SslMode::VerifyFull);
        assert_eq!(s.root_cert, Some(PathBuf::from("/etc/ca.pem")));
        assert_eq!(
            s.driver_url,
            "postgres://k@db:5432/knit?application_name=x&sslmode=require"
        );
        let d = settings("postgres://k@db/knit", bad).unwrap();
        assert_eq!((d.mode, d.root_cert), (SslMode::Prefer, None));
        assert_eq!(d.driver_url, "postgres://k@db/knit?sslmode=prefer");
    }

    #[test]
    fn bad_tls_settings_say_the_rule() {
        let e = settings("postgres://k@db/knit?sslmode=allow-maybe", bad)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("sslmode=allow-maybe") && e.contains("verify-full"),
            "{e}"
        );
        let e = settings("postgres://k@db/knit?sslmode=verify-ca", bad)
            .unwrap_err()
            .to_string();
        assert!(e.contains("needs sslrootcert"), "{e}");
        let s = settings(
            "postgres://k@db/knit?sslmode=require&sslrootcert=/nonexistent/ca.pem",
            bad,
        )
        .unwrap();
        let e = connector(&s, bad).err().unwrap().to_string();
        assert!(
            e.contains("sslrootcert=/nonexistent/ca.pem") && e.contains("cannot read"),
            "{e}"
        );
        let dir = tempfile::tempdir().unwrap();
        let words = dir.path().join("words.pem");
        std::fs::write(&words, "not a certificate\n").unwrap();
        let s = settings(
            &format!(
                "postgres://k@db/knit?sslmode=verify-ca&sslrootcert={}",
                words.display()
            ),
            bad,
        )
        .unwrap();
        let e = connector(&s, bad).err().unwrap().to_string();
        assert!(
            e.contains(&format!(
                "sslrootcert={}: holds no certificate",
                words.display()
            )) && e.contains("must be a PEM file of CA certificates"),
            "{e}"
        );
    }
}
