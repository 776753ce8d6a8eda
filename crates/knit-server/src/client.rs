//! The HTTPS client of the knit API (used by the CLI and the tests), and the
//! client configuration file (`~/.knit/config`).

use crate::error::{Result, ServerError};
use crate::pki::write_secret;
use knit_api::FieldError;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

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
        let home = std::env::var_os("HOME").ok_or_else(|| {
            ServerError::Client("HOME is not set; set KNIT_CONFIG to the config file".into())
        })?;
        Ok(PathBuf::from(home).join(".knit").join("config"))
    }

    pub fn load(path: &Path) -> Result<ClientConfig> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            ServerError::Client(format!(
                "cannot read {}: {e} (run `knit up` or `knit server init` first)",
                path.display()
            ))
        })?;
        serde_yaml::from_str(&text).map_err(|e| {
            ServerError::Client(format!("{} is not a knit config: {e}", path.display()))
        })
    }

    /// Written with mode 0600: it holds the admin token.
    pub fn save(&self, path: &Path) -> Result<()> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)
                .map_err(|e| ServerError::io(format!("create {}", dir.display()), e))?;
        }
        let text = serde_yaml::to_string(self).map_err(|e| ServerError::Internal(e.to_string()))?;
        write_secret(path, text.as_bytes())
    }
}

pub struct Client {
    agent: ureq::Agent,
    base: String,
    token: String,
}

fn tls_config(ca_pem: &str) -> Result<Arc<rustls::ClientConfig>> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile::certs(&mut ca_pem.as_bytes()) {
        let cert = cert.map_err(|e| ServerError::Client(format!("CA certificate: {e}")))?;
        roots
            .add(cert)
            .map_err(|e| ServerError::Client(format!("CA certificate: {e}")))?;
    }
    if roots.is_empty() {
        return Err(ServerError::Client(
            "the config holds no CA certificate".into(),
        ));
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| ServerError::Client(e.to_string()))?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(Arc::new(config))
}

impl Client {
    pub fn new(config: &ClientConfig) -> Result<Client> {
        let agent = ureq::AgentBuilder::new()
            .tls_config(tls_config(&config.ca_cert)?)
            .timeout_connect(Duration::from_secs(5))
            .timeout(Duration::from_secs(120))
            .build();
        Ok(Client {
            agent,
            base: config.server.trim_end_matches('/').to_string(),
            token: config.token.clone(),
        })
    }

    /// Same server, another bearer token (tests of refusal; bootstrap calls).
    pub fn with_token(&self, token: &str) -> Client {
        Client {
            agent: self.agent.clone(),
            base: self.base.clone(),
            token: token.to_string(),
        }
    }

    /// Any request; returns status and body for every HTTP status.
    pub fn raw(&self, method: &str, path: &str, body: Option<&str>) -> Result<(u16, String)> {
        let mut request = self.agent.request(method, &format!("{}{path}", self.base));
        if !self.token.is_empty() {
            request = request.set("Authorization", &format!("Bearer {}", self.token));
        }
        let outcome = match body {
            Some(b) => request
                .set("Content-Type", "application/yaml")
                .send_string(b),
            None => request.call(),
        };
        let response = match outcome {
            Ok(r) => r,
            Err(ureq::Error::Status(_, r)) => r,
            Err(ureq::Error::Transport(t)) => {
                return Err(ServerError::Client(format!("{} {path}: {t}", self.base)))
            }
        };
        let status = response.status();
        let text = response
            .into_string()
            .map_err(|e| ServerError::Client(format!("reading the answer to {path}: {e}")))?;
        Ok((status, text))
    }

    /// A request whose answer must be 2xx; JSON bodies are decoded.
    pub fn call(&self, method: &str, path: &str, body: Option<&str>) -> Result<Value> {
        let (status, text) = self.raw(method, path, body)?;
        if (200..300).contains(&status) {
            if text.trim().is_empty() {
                return Ok(Value::Null);
            }
            return serde_json::from_str(&text).or(Ok(Value::String(text)));
        }
        Err(remote_error(status, &text))
    }

    pub fn get(&self, path: &str) -> Result<Value> {
        self.call("GET", path, None)
    }

    /// A text answer (logs), checked for 2xx.
    pub fn get_text(&self, path: &str) -> Result<String> {
        let (status, text) = self.raw("GET", path, None)?;
        if (200..300).contains(&status) {
            return Ok(text);
        }
        Err(remote_error(status, &text))
    }
}

/// A non-2xx answer as an error: the server's JSON error body when there
/// is one, the raw text otherwise.
fn remote_error(status: u16, text: &str) -> ServerError {
    let parsed: Value = serde_json::from_str(text).unwrap_or(Value::Null);
    ServerError::Remote {
        status,
        code: parsed["code"].as_str().unwrap_or("HTTPError").to_string(),
        message: parsed["message"]
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| format!("HTTP {status}: {}", text.trim())),
        errors: serde_json::from_value::<Vec<FieldError>>(parsed["errors"].clone())
            .unwrap_or_default(),
    }
}

/// One path segment of an API URL, percent-encoded: a name never adds a
/// path level (`../evil` is sent as `..%2Fevil` and refused by the server
/// with the field and rule, instead of reaching another route).
pub fn segment(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
