//! The stand-in's one HTTPS client to the API server: the cluster CA from
//! the kubeconfig as the only root, a bootstrap token or a client
//! certificate, and kubelet's client-side rate limit (kubeAPIQPS/Burst).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::error::{SimError, TransportFailure};
use crate::kubeconfig::Kubeconfig;

/// A watch read that waits longer than this ends (the server sends a
/// bookmark or ends the watch well within it).
pub const WATCH_READ_TIMEOUT: Duration = Duration::from_secs(90);
/// Longest watch event line read (the API stores objects of at most 1.5 MiB).
pub const MAX_LINE: usize = 4 * 1024 * 1024;

pub struct Client {
    agent: ureq::Agent,
    /// For watches: no overall deadline, a read timeout instead (the
    /// server ends each watch after its timeoutSeconds).
    watch_agent: ureq::Agent,
    server: String,
    token: Option<String>,
    limiter: Mutex<Bucket>,
}

/// Token bucket: `burst` requests at once, refilled at `qps` per second.
struct Bucket {
    qps: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl Bucket {
    fn take(&mut self) -> Duration {
        let now = Instant::now();
        self.tokens =
            (self.tokens + now.duration_since(self.last).as_secs_f64() * self.qps).min(self.burst);
        self.last = now;
        self.tokens -= 1.0;
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / self.qps)
        }
    }
}

/// Result of one call: status code and JSON body (a `Status` on errors).
pub struct Reply {
    pub code: u16,
    pub body: Value,
}

impl Reply {
    pub fn ok(&self) -> bool {
        (200..300).contains(&self.code)
    }
    /// This reply as an error, for `what`.
    pub fn error(&self, what: &str) -> SimError {
        SimError::Api {
            what: what.to_string(),
            code: self.code,
            message: self.body["message"]
                .as_str()
                .map(str::to_string)
                .unwrap_or_else(|| self.body.to_string()),
        }
    }
}

impl Client {
    pub fn new(kc: &Kubeconfig, qps: f64, burst: u32) -> Result<Client, SimError> {
        let tls = |e: &dyn std::fmt::Display| SimError::Tls(e.to_string());
        let roots = knit_os::pem::roots(
            kc.ca_pem.as_bytes(),
            "the kubeconfig's certificate authority",
        )
        .map_err(|e| tls(&e))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| tls(&e))?
            .with_root_certificates(roots);
        let config = match (&kc.client_cert_pem, &kc.client_key_pem) {
            (Some(cert), Some(key)) => {
                let certs = knit_os::pem::certificates(cert.as_bytes(), "the client certificate")
                    .map_err(|e| tls(&e))?;
                let key = knit_os::pem::private_key(key.as_bytes(), "the client key")
                    .map_err(|e| tls(&e))?;
                builder
                    .with_client_auth_cert(certs, key)
                    .map_err(|e| tls(&e))?
            }
            _ => builder.with_no_client_auth(),
        };
        let config = Arc::new(config);
        let agent = ureq::AgentBuilder::new()
            .tls_config(config.clone())
            .timeout_connect(Duration::from_secs(10))
            .timeout(Duration::from_secs(30))
            .build();
        let watch_agent = ureq::AgentBuilder::new()
            .tls_config(config)
            .timeout_connect(Duration::from_secs(10))
            .timeout_read(WATCH_READ_TIMEOUT)
            .timeout_write(Duration::from_secs(30))
            .build();
        Ok(Client {
            agent,
            watch_agent,
            server: kc.server.trim_end_matches('/').to_string(),
            token: kc.token.clone(),
            limiter: Mutex::new(Bucket {
                qps,
                burst: burst as f64,
                tokens: burst as f64,
                last: Instant::now(),
            }),
        })
    }

    pub fn server(&self) -> &str {
        &self.server
    }

    fn pace(&self) {
        let wait = self
            .limiter
            .lock()
            .map(|mut b| b.take())
            .unwrap_or_default();
        if !wait.is_zero() {
            std::thread::sleep(wait);
        }
    }

    /// A watch (or any streamed GET): each line of the answer is given to
    /// `on_line` (at most [`MAX_LINE`] bytes) until it returns false or
    /// the server ends the stream. A read that waits longer than
    /// [`WATCH_READ_TIMEOUT`] ends it with an error.
    pub fn stream(
        &self,
        path: &str,
        mut on_line: impl FnMut(Value) -> bool,
    ) -> Result<(), SimError> {
        use std::io::{BufRead, Read};
        self.pace();
        let what = format!("GET {path}");
        // A failure after the answer began: the stream was cut or bad.
        let transport = |m: String| SimError::Transport {
            what: what.clone(),
            message: m,
            failure: TransportFailure::Unreachable,
        };
        let mut req = self
            .watch_agent
            .get(&format!("{}{}", self.server, path))
            .set("Accept", "application/json")
            .set(
                "User-Agent",
                concat!("knit-kubelet-sim/", env!("CARGO_PKG_VERSION")),
            );
        if let Some(t) = &self.token {
            req = req.set("Authorization", &format!("Bearer {t}"));
        }
        let resp = match req.call() {
            Ok(r) => r,
            Err(ureq::Error::Status(code, r)) => {
                let body = r.into_string().unwrap_or_default();
                let v: Value = serde_json::from_str(&body).unwrap_or(Value::String(body));
                return Err(Reply { code, body: v }.error(&what));
            }
            Err(ureq::Error::Transport(t)) => return Err(SimError::transport(what, &t)),
        };
        let mut reader = std::io::BufReader::new(resp.into_reader());
        let mut buf = Vec::new();
        loop {
            buf.clear();
            let n = reader
                .by_ref()
                .take(MAX_LINE as u64 + 1)
                .read_until(b'\n', &mut buf)
                .map_err(|e| transport(e.to_string()))?;
            if n == 0 {
                return Ok(());
            }
            if buf.len() > MAX_LINE {
                return Err(transport(format!(
                    "a watch event longer than {MAX_LINE} bytes"
                )));
            }
            let line = String::from_utf8_lossy(&buf);
            if line.trim().is_empty() {
                continue;
            }
            let v: Value = serde_json::from_str(line.trim())
                .map_err(|e| transport(format!("a watch event is not JSON: {e}")))?;
            if !on_line(v) {
                return Ok(());
            }
        }
    }

    /// One request. HTTP error codes are a `Reply`; only transport failures
    /// (refused connection, TLS verification) are `Err`.
    pub fn call(
        &self,
        method: &str,
        path: &str,
        content_type: Option<&str>,
        body: Option<&Value>,
    ) -> Result<Reply, SimError> {
        self.pace();
        let mut req = self
            .agent
            .request(method, &format!("{}{}", self.server, path))
            .set("Accept", "application/json")
            .set(
                "User-Agent",
                concat!("knit-kubelet-sim/", env!("CARGO_PKG_VERSION")),
            );
        if let Some(t) = &self.token {
            req = req.set("Authorization", &format!("Bearer {t}"));
        }
        if let Some(ct) = content_type {
            req = req.set("Content-Type", ct);
        }
        let result = match body {
            Some(b) => req.send_string(&b.to_string()),
            None => req.call(),
        };
        let resp = match result {
            Ok(r) => r,
            Err(ureq::Error::Status(_, r)) => r,
            Err(ureq::Error::Transport(t)) => {
                return Err(SimError::transport(format!("{method} {path}"), &t))
            }
        };
        let code = resp.status();
        let text = resp
            .into_string()
            .map_err(|e| SimError::transport(format!("{method} {path}"), &e))?;
        Ok(Reply {
            code,
            body: serde_json::from_str(&text).unwrap_or(Value::String(text)),
        })
    }

    pub fn get(&self, path: &str) -> Result<Reply, SimError> {
        self.call("GET", path, None, None)
    }
    pub fn post(&self, path: &str, body: &Value) -> Result<Reply, SimError> {
        self.call("POST", path, Some("application/json"), Some(body))
    }
    pub fn put(&self, path: &str, body: &Value) -> Result<Reply, SimError> {
        self.call("PUT", path, Some("application/json"), Some(body))
    }
    pub fn delete(&self, path: &str, body: &Value) -> Result<Reply, SimError> {
        self.call("DELETE", path, Some("application/json"), Some(body))
    }
    pub fn patch(&self, path: &str, body: &Value) -> Result<Reply, SimError> {
        self.call(
            "PATCH",
            path,
            Some("application/strategic-merge-patch+json"),
            Some(body),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_allows_burst_then_paces() {
        let mut b = Bucket {
            qps: 5.0,
            burst: 2.0,
            tokens: 2.0,
            last: Instant::now(),
        };
        assert!(b.take().is_zero());
        assert!(b.take().is_zero());
        let wait = b.take();
        assert!(
            wait > Duration::from_millis(100) && wait <= Duration::from_millis(200),
            "{wait:?}"
        );
    }
}
