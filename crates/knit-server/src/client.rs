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

/// `knit exec`'s default time limit for the command.
pub const EXEC_DEFAULT_TIMEOUT_SECONDS: u64 = 60;
/// The longest `timeoutSeconds` an exec request may ask for: `knit exec`
/// is for short commands; a request holds its connection that long.
pub const EXEC_MAX_TIMEOUT_SECONDS: u64 = 300;
/// Largest stdout, and largest stderr, `POST /api/v1/exec` answers: a
/// longer stream is cut there (`stdoutCut`/`stderrCut`). Smaller than the
/// provider's cap: it travels base64-encoded in one JSON answer.
pub const EXEC_API_OUTPUT_MAX_BYTES: usize = 4 << 20;
/// Largest exec answer the client reads (both streams base64 plus room).
const EXEC_ANSWER_MAX_BYTES: u64 = 12 << 20;

/// `POST /api/v1/exec`: run a command on one machine through its provider.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExecRequest {
    /// `node` (a node's name) or `instance` (knit's instance name).
    pub kind: String,
    pub name: String,
    /// The command and its arguments, run as given (no shell, no quoting).
    pub argv: Vec<String>,
    /// 1 ..= [`EXEC_MAX_TIMEOUT_SECONDS`]; default
    /// [`EXEC_DEFAULT_TIMEOUT_SECONDS`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<u64>,
}

/// The answer to an [`ExecRequest`]: the command's exit code and output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecResponse {
    /// knit's instance name and the provider's id of the machine.
    pub instance: String,
    pub provider_id: String,
    /// The command's exit status; -1 when it ended by a signal.
    pub exit_code: i32,
    /// base64 (standard alphabet) of the bytes the command wrote.
    pub stdout: String,
    pub stderr: String,
    /// The stream was longer than [`EXEC_API_OUTPUT_MAX_BYTES`] and was cut.
    pub stdout_cut: bool,
    pub stderr_cut: bool,
}

impl ExecResponse {
    /// Decoded stdout and stderr.
    pub fn output(&self) -> Result<(Vec<u8>, Vec<u8>)> {
        use base64::Engine;
        let decode = |field: &str, text: &str| {
            base64::engine::general_purpose::STANDARD
                .decode(text)
                .map_err(|e| {
                    ServerError::Client(format!("exec answer: {field} is not base64: {e}"))
                })
        };
        Ok((
            decode("stdout", &self.stdout)?,
            decode("stderr", &self.stderr)?,
        ))
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

    /// Runs a command on one machine (`POST /api/v1/exec`); waits as long
    /// as the command may run, plus time for the answer.
    pub fn exec(&self, request: &ExecRequest) -> Result<ExecResponse> {
        use std::io::Read;
        let path = "/api/v1/exec";
        let wait = request
            .timeout_seconds
            .unwrap_or(EXEC_DEFAULT_TIMEOUT_SECONDS)
            .min(EXEC_MAX_TIMEOUT_SECONDS)
            + 30;
        let body =
            serde_json::to_string(request).map_err(|e| ServerError::Internal(e.to_string()))?;
        let outcome = self
            .agent
            .post(&format!("{}{path}", self.base))
            .timeout(Duration::from_secs(wait))
            .set("Authorization", &format!("Bearer {}", self.token))
            .set("Content-Type", "application/json")
            .send_string(&body);
        let response = match outcome {
            Ok(r) => r,
            Err(ureq::Error::Status(_, r)) => r,
            Err(ureq::Error::Transport(t)) => {
                return Err(ServerError::Client(format!("{} {path}: {t}", self.base)))
            }
        };
        let status = response.status();
        let mut text = String::new();
        response
            .into_reader()
            .take(EXEC_ANSWER_MAX_BYTES)
            .read_to_string(&mut text)
            .map_err(|e| ServerError::Client(format!("reading the answer to {path}: {e}")))?;
        if !(200..300).contains(&status) {
            return Err(remote_error(status, &text));
        }
        serde_json::from_str(&text).map_err(|e| {
            ServerError::Client(format!("the answer to {path} is not an exec answer: {e}"))
        })
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
