//! knit-client: the HTTPS client of the knit API (used by the CLI and the
//! tests), and the client configuration file (`~/.knit/config`).
//!
//! Every call has a connect timeout and an overall timeout, and every
//! answer is read up to a size cap.

mod api;
mod config;
mod error;
mod exec;

pub use api::Document;
pub use config::ClientConfig;
pub use error::{ClientError, Result};
pub use exec::{
    exec_output, ExecRequest, ExecResponse, EXEC_API_OUTPUT_MAX_BYTES,
    EXEC_DEFAULT_TIMEOUT_SECONDS, EXEC_MAX_TIMEOUT_SECONDS,
};

use knit_api::FieldError;
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::io::Read;
use std::sync::Arc;
use std::time::Duration;

/// Time to open a connection to the server.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Time a call (but exec) may take in all.
const CALL_TIMEOUT: Duration = Duration::from_secs(120);
/// Largest answer read (lists of events, pools, nodes): a longer one is an
/// error rather than unbounded memory (ureq's own cap on a text answer).
const ANSWER_MAX_BYTES: u64 = 10 << 20;
/// Largest exec answer the client reads (both streams base64 plus room).
const EXEC_ANSWER_MAX_BYTES: u64 = 12 << 20;

pub struct Client {
    agent: ureq::Agent,
    base: String,
    token: String,
}

fn tls_config(ca_pem: &str) -> Result<Arc<rustls::ClientConfig>> {
    let roots = knit_os::pem::roots(ca_pem.as_bytes(), "the config's CA certificate")
        .map_err(|e| ClientError::Tls(e.to_string()))?;
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| ClientError::Tls(e.to_string()))?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(Arc::new(config))
}

impl Client {
    pub fn new(config: &ClientConfig) -> Result<Client> {
        let agent = ureq::AgentBuilder::new()
            .tls_config(tls_config(&config.ca_cert)?)
            .timeout_connect(CONNECT_TIMEOUT)
            .timeout(CALL_TIMEOUT)
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

    /// Sends a request; answers of every HTTP status are returned.
    fn send(
        &self,
        request: ureq::Request,
        path: &str,
        body: Option<(&str, &str)>,
    ) -> Result<ureq::Response> {
        let mut request = request;
        if !self.token.is_empty() {
            request = request.set("Authorization", &format!("Bearer {}", self.token));
        }
        let outcome = match body {
            Some((content_type, b)) => request.set("Content-Type", content_type).send_string(b),
            None => request.call(),
        };
        match outcome {
            Ok(r) => Ok(r),
            Err(ureq::Error::Status(_, r)) => Ok(r),
            Err(ureq::Error::Transport(t)) => {
                Err(ClientError::transport(format!("{} {path}", self.base), t))
            }
        }
    }

    /// The answer's status and body; a body over `cap` bytes is an error.
    fn read(response: ureq::Response, path: &str, cap: u64) -> Result<(u16, String)> {
        let status = response.status();
        let mut text = String::new();
        response
            .into_reader()
            .take(cap + 1)
            .read_to_string(&mut text)
            .map_err(|source| ClientError::ReadAnswer {
                path: path.to_string(),
                source,
            })?;
        if text.len() as u64 > cap {
            return Err(ClientError::Decode(format!(
                "the answer to {path} is over {cap} bytes"
            )));
        }
        Ok((status, text))
    }

    /// Any request; returns status and body for every HTTP status. A body
    /// is sent as YAML (JSON is YAML too).
    pub fn raw(&self, method: &str, path: &str, body: Option<&str>) -> Result<(u16, String)> {
        let request = self.agent.request(method, &format!("{}{path}", self.base));
        let response = self.send(request, path, body.map(|b| ("application/yaml", b)))?;
        Self::read(response, path, ANSWER_MAX_BYTES)
    }

    /// A request whose answer must be 2xx; JSON bodies are decoded.
    pub fn call(&self, method: &str, path: &str, body: Option<&str>) -> Result<Value> {
        let (status, text) = self.raw(method, path, body)?;
        if (200..300).contains(&status) {
            if text.trim().is_empty() {
                return Ok(Value::Null);
            }
            return Ok(serde_json::from_str(&text).unwrap_or(Value::String(text)));
        }
        Err(api_error(status, &text))
    }

    pub fn get(&self, path: &str) -> Result<Value> {
        self.call("GET", path, None)
    }

    /// A request whose 2xx answer is the JSON document `T`.
    pub fn call_typed<T: DeserializeOwned>(
        &self,
        method: &str,
        path: &str,
        body: Option<&str>,
    ) -> Result<T> {
        let (status, text) = self.raw(method, path, body)?;
        if !(200..300).contains(&status) {
            return Err(api_error(status, &text));
        }
        serde_json::from_str(&text).map_err(|e| {
            ClientError::Decode(format!(
                "the answer to {method} {path} is not the document expected: {e}"
            ))
        })
    }

    /// A text answer (logs), checked for 2xx.
    pub fn get_text(&self, path: &str) -> Result<String> {
        let (status, text) = self.raw("GET", path, None)?;
        if (200..300).contains(&status) {
            return Ok(text);
        }
        Err(api_error(status, &text))
    }

    /// Runs a command on one machine (`POST /api/v1/exec`); waits as long
    /// as the command may run, plus time for the answer.
    pub fn exec(&self, request: &ExecRequest) -> Result<ExecResponse> {
        let path = knit_api::routes::Route::Exec.path();
        let wait = request
            .timeout_seconds
            .unwrap_or(EXEC_DEFAULT_TIMEOUT_SECONDS)
            .min(EXEC_MAX_TIMEOUT_SECONDS)
            + 30;
        let body = serde_json::to_string(request)
            .map_err(|e| ClientError::Decode(format!("exec request: {e}")))?;
        let call = self
            .agent
            .post(&format!("{}{path}", self.base))
            .timeout(Duration::from_secs(wait));
        let response = self.send(call, path, Some(("application/json", &body)))?;
        let (status, text) = Self::read(response, path, EXEC_ANSWER_MAX_BYTES)?;
        if !(200..300).contains(&status) {
            return Err(api_error(status, &text));
        }
        serde_json::from_str(&text).map_err(|e| {
            ClientError::Decode(format!("the answer to {path} is not an exec answer: {e}"))
        })
    }
}

/// The JSON error body the server answers with (`code`, `message`,
/// `errors`); every field optional, an answer from a proxy has none.
#[derive(Default, serde::Deserialize)]
struct ErrorBody {
    code: Option<String>,
    message: Option<String>,
    #[serde(default)]
    errors: Vec<FieldError>,
}

/// A non-2xx answer as an error: the server's JSON error body when there
/// is one, the raw text otherwise.
fn api_error(status: u16, text: &str) -> ClientError {
    let body: ErrorBody = serde_json::from_str(text).unwrap_or_default();
    ClientError::Api {
        status,
        code: body.code.unwrap_or_else(|| "HTTPError".to_string()),
        message: body
            .message
            .unwrap_or_else(|| format!("HTTP {status}: {}", text.trim())),
        errors: body.errors,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_answers_keep_code_message_and_fields() {
        let e = api_error(
            422,
            r#"{"code":"Invalid","message":"bad pool","errors":[{"field":"spec.replicas","value":"-1","rule":"must be >= 0"}]}"#,
        );
        match &e {
            ClientError::Api {
                status,
                code,
                errors,
                ..
            } => {
                assert_eq!((*status, code.as_str()), (422, "Invalid"));
                assert_eq!(errors[0].field, "spec.replicas");
            }
            other => panic!("{other}"),
        }
        // The code is not in the message: `knit` prints it once, beside it.
        assert_eq!(e.to_string(), "bad pool");
        let proxy = api_error(502, "bad gateway\n");
        assert_eq!(proxy.to_string(), "HTTP 502: bad gateway");
        assert_eq!(proxy.code(), "HTTPError");
    }

    #[test]
    fn segments_are_percent_encoded() {
        assert_eq!(segment("../evil"), "..%2Fevil");
        assert_eq!(segment("pool-1"), "pool-1");
    }
}
