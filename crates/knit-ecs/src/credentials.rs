//! Where the AccessKey comes from: the environment variables Alibaba's own
//! tools read, or a credentials file only its owner can read. The secret
//! never reaches argv (knit takes no key flag), a log, an error or Debug.

use crate::error::EcsError;
use secrecy::{ExposeSecret, SecretString};
use std::path::{Path, PathBuf};

pub const ENV_ACCESS_KEY_ID: &str = "ALIBABA_CLOUD_ACCESS_KEY_ID";
pub const ENV_ACCESS_KEY_SECRET: &str = "ALIBABA_CLOUD_ACCESS_KEY_SECRET";
pub const ENV_SECURITY_TOKEN: &str = "ALIBABA_CLOUD_SECURITY_TOKEN";
/// Path of a credentials file (the SDKs' variable).
pub const ENV_CREDENTIALS_FILE: &str = "ALIBABA_CLOUD_CREDENTIALS_FILE";

#[derive(Clone)]
pub struct Credentials {
    access_key_id: String,
    access_key_secret: SecretString,
    security_token: Option<SecretString>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("access_key_id", &self.access_key_id)
            .field("access_key_secret", &"[redacted]")
            .field(
                "security_token",
                &self.security_token.as_ref().map(|_| "[redacted]"),
            )
            .finish()
    }
}

impl Credentials {
    pub fn new(id: &str, secret: &str, token: Option<&str>) -> Result<Credentials, EcsError> {
        if id.trim().is_empty() || secret.trim().is_empty() {
            return Err(EcsError::Credentials(
                "the AccessKey id and secret must both be non-empty".into(),
            ));
        }
        Ok(Credentials {
            access_key_id: id.trim().to_string(),
            access_key_secret: SecretString::from(secret.trim().to_string()),
            security_token: token
                .filter(|t| !t.trim().is_empty())
                .map(|t| SecretString::from(t.trim().to_string())),
        })
    }

    pub fn access_key_id(&self) -> &str {
        &self.access_key_id
    }

    pub(crate) fn secret(&self) -> &[u8] {
        self.access_key_secret.expose_secret().as_bytes()
    }

    pub(crate) fn security_token(&self) -> Option<&str> {
        self.security_token.as_ref().map(|t| t.expose_secret())
    }

    /// The environment's key, else the credentials file named by
    /// `ALIBABA_CLOUD_CREDENTIALS_FILE`, else `~/.alibabacloud/credentials`.
    pub fn discover() -> Result<Credentials, EcsError> {
        if let Some(c) = Credentials::from_env()? {
            return Ok(c);
        }
        let file = std::env::var_os(ENV_CREDENTIALS_FILE)
            .map(PathBuf::from)
            .or_else(|| {
                std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".alibabacloud/credentials"))
            });
        match file {
            Some(path) if path.exists() => Credentials::from_file(&path),
            _ => Err(EcsError::Credentials(format!(
                "no credentials: set {ENV_ACCESS_KEY_ID} and {ENV_ACCESS_KEY_SECRET} \
                 (and {ENV_SECURITY_TOKEN} for STS), or write a credentials file with mode 0600 \
                 named by {ENV_CREDENTIALS_FILE} or at ~/.alibabacloud/credentials"
            ))),
        }
    }

    pub fn from_env() -> Result<Option<Credentials>, EcsError> {
        let id = std::env::var(ENV_ACCESS_KEY_ID).ok();
        let secret = std::env::var(ENV_ACCESS_KEY_SECRET).ok();
        match (id, secret) {
            (None, None) => Ok(None),
            (Some(id), Some(secret)) => {
                let token = std::env::var(ENV_SECURITY_TOKEN).ok();
                Credentials::new(&id, &secret, token.as_deref()).map(Some)
            }
            _ => Err(EcsError::Credentials(format!(
                "{ENV_ACCESS_KEY_ID} and {ENV_ACCESS_KEY_SECRET} must be set together"
            ))),
        }
    }

    /// An INI file as Alibaba's SDKs read it: the `[default]` section's
    /// `access_key_id`, `access_key_secret` and optional `security_token`.
    /// Refused unless only its owner can read or write it (mode 0600 or
    /// stricter): a key others can read is a key others have.
    pub fn from_file(path: &Path) -> Result<Credentials, EcsError> {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(path).map_err(|e| {
            EcsError::Credentials(format!("credentials file {}: {e}", path.display()))
        })?;
        let mode = meta.mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(EcsError::Credentials(format!(
                "credentials file {}: mode {mode:04o} lets others read it; the rule is mode 0600 \
                 (chmod 600 {})",
                path.display(),
                path.display()
            )));
        }
        if meta.len() > 64 << 10 {
            return Err(EcsError::Credentials(format!(
                "credentials file {}: larger than 64 KiB",
                path.display()
            )));
        }
        let text = std::fs::read_to_string(path).map_err(|e| {
            EcsError::Credentials(format!("credentials file {}: {e}", path.display()))
        })?;
        let mut section = String::new();
        let (mut id, mut secret, mut token) = (None, None, None);
        for line in text.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
                continue;
            }
            if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
                section = name.trim().to_string();
                continue;
            }
            if section != "default" {
                continue;
            }
            if let Some((k, v)) = line.split_once('=') {
                let v = v.trim().trim_matches('"').to_string();
                match k.trim() {
                    "access_key_id" => id = Some(v),
                    "access_key_secret" => secret = Some(v),
                    "security_token" => token = Some(v),
                    _ => {}
                }
            }
        }
        match (id, secret) {
            (Some(id), Some(secret)) => Credentials::new(&id, &secret, token.as_deref()),
            _ => Err(EcsError::Credentials(format!(
                "credentials file {}: the [default] section needs access_key_id and access_key_secret",
                path.display()
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn file_must_be_private() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("credentials");
        std::fs::write(
            &path,
            "[other]\naccess_key_id = x\n[default]\naccess_key_id = LTAIid\naccess_key_secret = s3cr3t-value\n",
        )
        .unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = Credentials::from_file(&path).unwrap_err().to_string();
        assert!(e.contains("0644") && e.contains("0600"), "{e}");
        assert!(!e.contains("s3cr3t-value"));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let c = Credentials::from_file(&path).unwrap();
        assert_eq!(c.access_key_id(), "LTAIid");
        assert_eq!(c.secret(), b"s3cr3t-value");
        let shown = format!("{c:?}");
        assert!(!shown.contains("s3cr3t-value"), "{shown}");
    }

    #[test]
    fn debug_redacts_token() {
        let c = Credentials::new("id", "the-secret", Some("the-token")).unwrap();
        let shown = format!("{c:?}");
        assert!(!shown.contains("the-secret") && !shown.contains("the-token"));
    }
}
