//! The client configuration file (`~/.knit/config`): where the server is,
//! the admin token, the server's CA.

use crate::error::{ClientError, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// What the CLI needs to reach a server: URL, admin token, CA.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClientConfig {
    pub server: String,
    pub token: String,
    /// PEM of the server's CA.
    pub ca_cert: String,
    /// State directory and PID of a server started by `knit up`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_dir: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
}

impl ClientConfig {
    /// `$KNIT_CONFIG`, else `$HOME/.knit/config`.
    pub fn default_path() -> Result<PathBuf> {
        if let Some(p) = std::env::var_os("KNIT_CONFIG") {
            return Ok(PathBuf::from(p));
        }
        let home = std::env::var_os("HOME").ok_or(ClientError::NoConfigPath)?;
        Ok(PathBuf::from(home).join(".knit").join("config"))
    }

    pub fn load(path: &Path) -> Result<ClientConfig> {
        let text =
            std::fs::read_to_string(path).map_err(|source| ClientError::ConfigUnreadable {
                path: path.to_path_buf(),
                source,
            })?;
        serde_yaml_ng::from_str(&text).map_err(|source| ClientError::ConfigInvalid {
            path: path.to_path_buf(),
            source,
        })
    }

    /// Written with mode 0600 (it holds the admin token), whole: a
    /// temporary file flushed and renamed into place, so a crash leaves the
    /// old config or the new one.
    pub fn save(&self, path: &Path) -> Result<()> {
        let text = serde_yaml_ng::to_string(self).map_err(|e| ClientError::ConfigWrite {
            what: format!("render {}", path.display()),
            source: std::io::Error::other(e),
        })?;
        // 0600: the file holds the API token.
        knit_os::durable::write(path, text.as_bytes(), 0o600).map_err(|e| match e {
            knit_os::OsError::Io {
                action,
                path,
                source,
            } => ClientError::ConfigWrite {
                what: format!("{action} {}", path.display()),
                source,
            },
            other => ClientError::ConfigWrite {
                what: path.display().to_string(),
                source: std::io::Error::other(other.to_string()),
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// The file format is the one `knit up` has always written: camelCase
    /// keys, optional ones left out, mode 0600.
    #[test]
    fn saves_and_loads_the_same_document() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/config");
        let config = ClientConfig {
            server: "https://127.0.0.1:7443".into(),
            token: "t0k".into(),
            ca_cert: "PEM".into(),
            state_dir: None,
            pid: Some(42),
        };
        config.save(&path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(
            text,
            "server: https://127.0.0.1:7443\ntoken: t0k\ncaCert: PEM\npid: 42\n"
        );
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(ClientConfig::load(&path).unwrap(), config);
        let err = ClientConfig::load(&dir.path().join("none")).unwrap_err();
        assert!(matches!(err, ClientError::ConfigUnreadable { .. }), "{err}");
    }
}
