//! Test client: a real HTTPS client (rustls) with the identities nodes and
//! admins use, against an EmbeddedCluster on an ephemeral 127.0.0.1 port.
#![allow(dead_code)] // each test binary uses a different part

use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use knit_cluster::{ClusterConfig, EmbeddedCluster};
use serde_json::Value;

pub async fn start(dir: &std::path::Path, grace: Duration) -> EmbeddedCluster {
    let mut cfg = ClusterConfig::new(dir, "127.0.0.1:0".parse().unwrap());
    cfg.node_grace_period = grace;
    cfg.bookmark_interval = Duration::from_millis(300);
    EmbeddedCluster::start(cfg).await.unwrap()
}

#[derive(Clone)]
pub struct Client {
    agent: ureq::Agent,
    base: String,
    token: Option<String>,
}

pub enum Who<'a> {
    Anonymous,
    Token(&'a str),
    Cert { cert_pem: &'a str, key_pem: &'a str },
}

impl Client {
    pub fn new(endpoint: &str, ca_pem: &str, who: Who<'_>) -> Client {
        let (identity, token) = match who {
            Who::Cert { cert_pem, key_pem } => (Some((cert_pem, key_pem)), None),
            Who::Token(t) => (None, Some(t.to_string())),
            Who::Anonymous => (None, None),
        };
        let cfg = knit_cluster::tls::client_config(ca_pem, identity).unwrap();
        let agent = ureq::AgentBuilder::new()
            .tls_config(Arc::new(cfg))
            .timeout(Duration::from_secs(30))
            .build();
        Client {
            agent,
            base: endpoint.to_string(),
            token,
        }
    }

    /// The admin identity from the admin kubeconfig the cluster wrote.
    pub fn admin(cluster: &EmbeddedCluster) -> Client {
        let kc: Value = serde_yaml_ng::from_str(
            &std::fs::read_to_string(cluster.admin_kubeconfig_path()).unwrap(),
        )
        .unwrap();
        let user = &kc["users"][0]["user"];
        let dec = |k: &str| {
            String::from_utf8(STANDARD.decode(user[k].as_str().unwrap()).unwrap()).unwrap()
        };
        let (cert, key) = (dec("client-certificate-data"), dec("client-key-data"));
        Client::new(
            cluster.endpoint(),
            cluster.ca_pem(),
            Who::Cert {
                cert_pem: &cert,
                key_pem: &key,
            },
        )
    }

    /// (status, body) of one request.
    pub fn call(
        &self,
        method: &str,
        path: &str,
        content_type: Option<&str>,
        body: Option<&Value>,
    ) -> (u16, Value) {
        let mut req = self
            .agent
            .request(method, &format!("{}{}", self.base, path));
        if let Some(t) = &self.token {
            req = req.set("Authorization", &format!("Bearer {t}"));
        }
        if let Some(ct) = content_type {
            req = req.set("Content-Type", ct);
        }
        let res = match body {
            // A string body is sent as is (YAML, raw text); anything else as JSON.
            Some(Value::String(raw)) => req.send_string(raw),
            Some(b) => req.send_string(&b.to_string()),
            None => req.call(),
        };
        let resp = match res {
            Ok(r) => r,
            Err(ureq::Error::Status(_, r)) => r,
            Err(e) => panic!("{method} {path}: transport error: {e}"),
        };
        let status = resp.status();
        let text = resp.into_string().unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    /// Like `call`, but returns the transport error instead of panicking.
    pub fn try_get(&self, path: &str) -> Result<u16, String> {
        match self.agent.get(&format!("{}{}", self.base, path)).call() {
            Ok(r) => Ok(r.status()),
            Err(ureq::Error::Status(c, _)) => Ok(c),
            Err(e) => Err(e.to_string()),
        }
    }

    pub fn get(&self, path: &str) -> (u16, Value) {
        self.call("GET", path, None, None)
    }
    pub fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        self.call("POST", path, Some("application/json"), Some(body))
    }
    pub fn put(&self, path: &str, body: &Value) -> (u16, Value) {
        self.call("PUT", path, Some("application/json"), Some(body))
    }
    pub fn patch(&self, path: &str, ct: &str, body: &Value) -> (u16, Value) {
        self.call("PATCH", path, Some(ct), Some(body))
    }

    /// Open a watch and read lines until `stop` says so (or the server's
    /// timeoutSeconds ends the stream).
    pub fn watch_lines(&self, path: &str, mut stop: impl FnMut(&Value) -> bool) -> Vec<Value> {
        use std::io::BufRead;
        let resp = self
            .agent
            .get(&format!("{}{}", self.base, path))
            .call()
            .unwrap();
        let mut out = Vec::new();
        for line in std::io::BufReader::new(resp.into_reader()).lines() {
            let v: Value = serde_json::from_str(&line.unwrap()).unwrap();
            let done = stop(&v);
            out.push(v);
            if done {
                break;
            }
        }
        out
    }
}

/// Poll until `f` returns Some, for up to `limit` (a bound, not an assert).
pub fn wait_for<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        if start.elapsed() > limit {
            panic!("gave up waiting for {what} after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A PEM CSR for `cn`/`orgs` and its key, as kubelet makes them.
pub fn csr(cn: &str, orgs: &[&str]) -> (String, String) {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    p.distinguished_name.push(rcgen::DnType::CommonName, cn);
    for o in orgs {
        p.distinguished_name
            .push(rcgen::DnType::OrganizationName, *o);
    }
    (
        p.serialize_request(&key).unwrap().pem().unwrap(),
        key.serialize_pem(),
    )
}

pub fn csr_object(pem: &str, signer: &str) -> Value {
    serde_json::json!({
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "CertificateSigningRequest",
        "metadata": {"generateName": "csr-"},
        "spec": {"request": STANDARD.encode(pem), "signerName": signer,
                 "usages": ["digital signature", "client auth"]}
    })
}

/// Run a blocking closure (HTTP client work) off the async runtime.
pub async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.unwrap()
}
