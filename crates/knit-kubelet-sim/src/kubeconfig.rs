//! Reading kubeconfigs (the bootstrap one and kubelet.conf) and writing
//! kubelet.conf the way kubelet does after TLS bootstrap.

use std::path::{Path, PathBuf};

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use serde_json::{json, Value};

use crate::error::SimError;

/// The resolved current context: where and as whom.
#[derive(Debug, Clone)]
pub struct Kubeconfig {
    pub server: String,
    pub ca_pem: String,
    pub token: Option<String>,
    /// PEM of client certificate and key (may be one file holding both).
    pub client_cert_pem: Option<String>,
    pub client_key_pem: Option<String>,
}

impl Kubeconfig {
    pub fn load(path: &Path) -> Result<Kubeconfig, SimError> {
        let err = |message: String| SimError::Kubeconfig {
            path: path.display().to_string(),
            message,
        };
        let text = std::fs::read_to_string(path).map_err(|e| SimError::io(path, e))?;
        let doc: Value = serde_yaml_ng::from_str(&text).map_err(|e| err(e.to_string()))?;
        let base = path.parent().unwrap_or(Path::new("."));
        let named = |list: &str, name: &str| -> Option<Value> {
            doc[list]
                .as_array()?
                .iter()
                .find(|e| e["name"].as_str().unwrap_or("") == name)
                .cloned()
        };
        let ctx_name = doc["current-context"].as_str().unwrap_or("");
        let (cluster, user) = match named("contexts", ctx_name) {
            Some(ctx) => (
                named("clusters", ctx["context"]["cluster"].as_str().unwrap_or("")),
                named("users", ctx["context"]["user"].as_str().unwrap_or("")),
            ),
            // No context: the first cluster and user, as kubeadm's bootstrap files work.
            None => (
                doc["clusters"][0]
                    .as_object()
                    .map(|_| doc["clusters"][0].clone()),
                doc["users"][0].as_object().map(|_| doc["users"][0].clone()),
            ),
        };
        let cluster = cluster.ok_or_else(|| err("no cluster for the current context".into()))?;
        let c = &cluster["cluster"];
        let server = c["server"]
            .as_str()
            .ok_or_else(|| err("cluster has no server".into()))?
            .to_string();
        let ca_pem = inline_or_file(c, "certificate-authority", base)
            .map_err(err)?
            .ok_or_else(|| err("cluster has no certificate-authority(-data)".into()))?;
        let u = user.map(|u| u["user"].clone()).unwrap_or(Value::Null);
        Ok(Kubeconfig {
            server,
            ca_pem,
            token: u["token"].as_str().map(str::to_string),
            client_cert_pem: inline_or_file(&u, "client-certificate", base).map_err(err)?,
            client_key_pem: inline_or_file(&u, "client-key", base).map_err(err)?,
        })
    }
}

/// `<field>-data` (base64) or `<field>` (a path, relative to the file).
fn inline_or_file(v: &Value, field: &str, base: &Path) -> Result<Option<String>, String> {
    if let Some(d) = v[format!("{field}-data")].as_str() {
        let bytes = STANDARD
            .decode(d.trim())
            .map_err(|e| format!("{field}-data: {e}"))?;
        return String::from_utf8(bytes)
            .map(Some)
            .map_err(|e| format!("{field}-data: {e}"));
    }
    match v[field].as_str() {
        Some(p) => {
            let p = base.join(p);
            std::fs::read_to_string(&p)
                .map(Some)
                .map_err(|e| format!("{}: {e}", p.display()))
        }
        None => Ok(None),
    }
}

/// kubelet.conf after bootstrap: the bootstrap server and CA, and the
/// rotating client certificate file for both cert and key.
pub fn write_kubelet_conf(
    path: &Path,
    server: &str,
    ca_pem: &str,
    cert_file: &Path,
) -> Result<(), SimError> {
    let cert: PathBuf = cert_file.to_path_buf();
    let doc = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "default-cluster", "cluster": {"server": server, "certificate-authority-data": STANDARD.encode(ca_pem)}}],
        "contexts": [{"name": "default-context", "context": {"cluster": "default-cluster", "namespace": "default", "user": "default-auth"}}],
        "current-context": "default-context",
        "users": [{"name": "default-auth", "user": {"client-certificate": cert, "client-key": cert}}],
        "preferences": {},
    });
    let text = serde_yaml_ng::to_string(&doc).map_err(|e| SimError::Kubeconfig {
        path: path.display().to_string(),
        message: e.to_string(),
    })?;
    crate::files::write_private(path, text.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bootstrap_file_and_written_kubelet_conf_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let boot = dir.path().join("bootstrap-kubelet.conf");
        std::fs::write(&boot, format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://10.0.0.1:6443\n    certificate-authority-data: {}\ncontexts:\n- name: x\n  context: {{cluster: c, user: u}}\ncurrent-context: x\nusers:\n- name: u\n  user:\n    token: abcdef.0123456789abcdef\n",
            STANDARD.encode("CA PEM"))).unwrap();
        let k = Kubeconfig::load(&boot).unwrap();
        assert_eq!(
            (k.server.as_str(), k.ca_pem.as_str(), k.token.as_deref()),
            (
                "https://10.0.0.1:6443",
                "CA PEM",
                Some("abcdef.0123456789abcdef")
            )
        );
        let pem = dir.path().join("pki/kubelet-client-current.pem");
        std::fs::create_dir_all(pem.parent().unwrap()).unwrap();
        std::fs::write(&pem, "CERT AND KEY").unwrap();
        let conf = dir.path().join("kubelet.conf");
        write_kubelet_conf(&conf, &k.server, &k.ca_pem, &pem).unwrap();
        let k2 = Kubeconfig::load(&conf).unwrap();
        assert_eq!(k2.client_cert_pem.as_deref(), Some("CERT AND KEY"));
        assert_eq!(k2.token, None);
        assert!(Kubeconfig::load(&dir.path().join("missing")).is_err());
    }
}
