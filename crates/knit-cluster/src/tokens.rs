//! Bootstrap tokens (kubeadm format) stored as `bootstrap-token-<id>`
//! Secrets in `kube-system`, their authentication, and the JWS signatures
//! of the `cluster-info` ConfigMap that token holders verify on discovery.

use std::time::Duration;

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine;
use ring::hmac;
use serde_json::{json, Map, Value};

use crate::error::{ApiStatus, ClusterError};
use crate::util;

pub const SECRET_TYPE: &str = "bootstrap.kubernetes.io/token";
pub const BOOTSTRAPPERS: &str = "system:bootstrappers";
/// Annotation binding a token to the one node name it may request a
/// certificate for (knit's addition; kubeadm tokens have no such binding).
pub const NODE_ANNOTATION: &str = "knit.dev/node-name";

/// A bootstrap token as handed to the node agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootstrapToken {
    pub id: String,
    pub secret: String,
    pub expires: time::OffsetDateTime,
    pub node_name: Option<String>,
}

impl BootstrapToken {
    /// `<id>.<secret>`, as kubelet's bootstrap kubeconfig carries it.
    pub fn token(&self) -> String {
        format!("{}.{}", self.id, self.secret)
    }
}

pub fn secret_name(id: &str) -> String {
    format!("bootstrap-token-{id}")
}

pub fn valid_extra_group(g: &str) -> bool {
    g.strip_prefix("system:bootstrappers:").is_some_and(|rest| {
        !rest.is_empty()
            && rest.len() <= 256
            && rest
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b':' || b == b'-')
            && rest
                .bytes()
                .last()
                .is_some_and(|b| b.is_ascii_alphanumeric())
    })
}

pub fn new_token(node_name: Option<&str>, ttl: Duration) -> Result<BootstrapToken, ClusterError> {
    Ok(BootstrapToken {
        id: util::random_alnum(6)?,
        secret: util::random_alnum(16)?,
        expires: util::now() + ttl,
        node_name: node_name.map(str::to_string),
    })
}

pub fn token_secret(t: &BootstrapToken, extra_groups: &[String]) -> Value {
    let mut data = Map::new();
    let mut put = |k: &str, v: &str| {
        data.insert(k.to_string(), Value::String(STANDARD.encode(v)));
    };
    put("token-id", &t.id);
    put("token-secret", &t.secret);
    put("expiration", &util::rfc3339(t.expires));
    put("usage-bootstrap-authentication", "true");
    put("usage-bootstrap-signing", "true");
    put("description", "knit node bootstrap token");
    if !extra_groups.is_empty() {
        put("auth-extra-groups", &extra_groups.join(","));
    }
    let mut annotations = Map::new();
    if let Some(n) = &t.node_name {
        annotations.insert(NODE_ANNOTATION.into(), Value::String(n.clone()));
    }
    json!({
        "kind": "Secret",
        "apiVersion": "v1",
        "metadata": {"name": secret_name(&t.id), "namespace": "kube-system", "annotations": annotations},
        "type": SECRET_TYPE,
        "data": data,
    })
}

/// A decoded `data` field of a token Secret.
pub fn data_field(secret: &Value, key: &str) -> Option<String> {
    let raw = secret["data"][key].as_str()?;
    String::from_utf8(STANDARD.decode(raw).ok()?).ok()
}

/// A token Secret that still authenticates: right type, not expired, usage
/// enabled. Returns why not, otherwise.
pub fn check_usable(secret: &Value, usage: &str) -> Result<(), String> {
    if secret["type"].as_str() != Some(SECRET_TYPE) {
        return Err("not a bootstrap token secret".into());
    }
    if data_field(secret, usage).as_deref() != Some("true") {
        return Err(format!("token is not enabled for {usage}"));
    }
    if let Some(exp) = data_field(secret, "expiration") {
        match util::parse_time(&exp) {
            Some(t) if t > util::now() => {}
            Some(_) => return Err(format!("token expired at {exp}")),
            None => return Err(format!("token has an unreadable expiration {exp:?}")),
        }
    }
    Ok(())
}

/// Check a presented `<id>.<secret>` against its Secret; on success, the
/// token's extra groups.
pub fn verify(secret: Option<&Value>, presented_secret: &str) -> Result<Vec<String>, ApiStatus> {
    let denied = |why: &str| ApiStatus::unauthorized(format!("invalid bootstrap token: {why}"));
    let secret = secret.ok_or_else(|| denied("unknown token id"))?;
    let stored = data_field(secret, "token-secret").unwrap_or_default();
    // Constant-time comparison: the secret must not leak through timing.
    let same = stored.len() == presented_secret.len()
        && stored
            .bytes()
            .zip(presented_secret.bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0;
    if !same {
        return Err(denied("wrong secret"));
    }
    check_usable(secret, "usage-bootstrap-authentication").map_err(|e| denied(&e))?;
    Ok(data_field(secret, "auth-extra-groups")
        .map(|g| {
            g.split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect()
        })
        .unwrap_or_default())
}

pub fn bound_node(secret: &Value) -> Option<&str> {
    secret["metadata"]["annotations"][NODE_ANNOTATION].as_str()
}

/// kubeadm's detached JWS: HS256 keyed by the token secret over the
/// `cluster-info` kubeconfig, `<header>..<signature>`.
pub fn jws_detached(content: &str, id: &str, secret: &str) -> String {
    let header = URL_SAFE_NO_PAD.encode(format!(r#"{{"alg":"HS256","kid":"{id}"}}"#));
    let payload = URL_SAFE_NO_PAD.encode(content);
    let key = hmac::Key::new(hmac::HMAC_SHA256, secret.as_bytes());
    let sig = hmac::sign(&key, format!("{header}.{payload}").as_bytes());
    format!("{header}..{}", URL_SAFE_NO_PAD.encode(sig.as_ref()))
}

/// The `kubeconfig` entry of `cluster-info`: server and CA, no credentials.
pub fn cluster_info_kubeconfig(server: &str, ca_pem: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- cluster:\n    certificate-authority-data: {}\n    server: {}\n  name: \"\"\ncontexts: null\ncurrent-context: \"\"\npreferences: {{}}\nusers: null\n",
        STANDARD.encode(ca_pem),
        server
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_round_trip_and_expiry() {
        let t = new_token(Some("n1"), Duration::from_secs(60)).unwrap();
        assert!(knit_api::validate::is_bootstrap_token(&t.token()));
        let s = token_secret(&t, &["system:bootstrappers:knit:pool-a".into()]);
        assert_eq!(
            verify(Some(&s), &t.secret).unwrap(),
            vec!["system:bootstrappers:knit:pool-a"]
        );
        assert_eq!(verify(Some(&s), "0000000000000000").unwrap_err().code, 401);
        assert_eq!(verify(None, &t.secret).unwrap_err().code, 401);
        assert_eq!(bound_node(&s), Some("n1"));

        let mut expired = t.clone();
        expired.expires = util::now() - time::Duration::seconds(1);
        let s = token_secret(&expired, &[]);
        let err = verify(Some(&s), &t.secret).unwrap_err();
        assert!(err.message.contains("expired"), "{}", err.message);
    }

    #[test]
    fn extra_groups_follow_kubeadm_rules() {
        assert!(valid_extra_group("system:bootstrappers:knit:pool-a"));
        assert!(!valid_extra_group("system:masters"));
        assert!(!valid_extra_group("system:bootstrappers:"));
    }

    #[test]
    fn jws_matches_an_independent_hs256_computation() {
        // Header and signature recomputed by hand from RFC 7515's definition.
        let jws = jws_detached("hello", "abcdef", "0123456789abcdef");
        let (header, sig) = jws.split_once("..").unwrap();
        assert_eq!(
            String::from_utf8(URL_SAFE_NO_PAD.decode(header).unwrap()).unwrap(),
            r#"{"alg":"HS256","kid":"abcdef"}"#
        );
        let key = hmac::Key::new(hmac::HMAC_SHA256, b"0123456789abcdef");
        let signing_input = format!("{header}.{}", URL_SAFE_NO_PAD.encode("hello"));
        hmac::verify(
            &key,
            signing_input.as_bytes(),
            &URL_SAFE_NO_PAD.decode(sig).unwrap(),
        )
        .unwrap();
        assert_ne!(jws, jws_detached("hello!", "abcdef", "0123456789abcdef"));
    }
}
