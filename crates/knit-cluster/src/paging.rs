//! A list's `limit`, `continue`, `resourceVersion` and
//! `resourceVersionMatch`, as kube-apiserver reads them.
//!
//! The continue token is kube-apiserver's: base64url (no padding) of
//! `{"v":"meta.k8s.io/v1","rv":<list resourceVersion>,"start":"<key>\u0000"}`,
//! where the key is the last object's key under the list's prefix (its
//! name, or `namespace/name` in a list across namespaces). Every page of a
//! paging run is read at the first page's resourceVersion; a token older
//! than the history the store keeps is 410 Expired, with a token (rv -1)
//! that continues from the newest version instead, as kube-apiserver does.

use std::collections::HashMap;

use axum::http::StatusCode;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::error::ApiStatus;

const TOKEN_VERSION: &str = "meta.k8s.io/v1";

/// kube-apiserver's message when a continue token's version was compacted.
pub const INCONSISTENT_CONTINUE: &str = "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.";
/// kube-apiserver's message when a list's resourceVersion was compacted.
pub const EXPIRED: &str = "The resourceVersion for the provided list is too old.";

#[derive(Serialize, Deserialize)]
struct Token {
    #[serde(default)]
    v: String,
    #[serde(default)]
    rv: i64,
    #[serde(default)]
    start: String,
}

/// What one list request asks for.
#[derive(Debug, Default, PartialEq)]
pub struct ListOptions {
    /// At most this many objects (None: all of them).
    pub limit: Option<usize>,
    /// Read at this resourceVersion exactly (None: the newest).
    pub at: Option<u64>,
    /// The newest version, which must be at least this one.
    pub not_older_than: Option<u64>,
    /// Objects whose key is this or after ("" from the first).
    pub start: String,
    /// From a continue token: its start key (without the key prefix).
    pub continuing: Option<String>,
}

fn invalid(field: &str, message: String) -> ApiStatus {
    ApiStatus::invalid(
        "ListOptions.meta.k8s.io",
        "",
        vec![(field.to_string(), message)],
    )
}

pub(crate) fn parse_rv(s: &str) -> Result<u64, ApiStatus> {
    s.parse::<u64>().map_err(|e| {
        ApiStatus::bad_request(format!(
            "invalid resource version: {s:?} is not a resourceVersion ({e})"
        ))
    })
}

impl ListOptions {
    pub fn parse(query: &HashMap<String, String>) -> Result<ListOptions, ApiStatus> {
        let get = |k: &str| query.get(k).map(String::as_str).filter(|v| !v.is_empty());
        let rv = get("resourceVersion");
        let matching = get("resourceVersionMatch");
        let cont = get("continue");
        // kube-apiserver's ListOptions validation (422).
        if let Some(m) = matching {
            if rv.is_none() {
                return Err(invalid(
                    "resourceVersionMatch",
                    "Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided".into(),
                ));
            }
            if cont.is_some() {
                return Err(invalid(
                    "resourceVersionMatch",
                    "Forbidden: resourceVersionMatch is forbidden when continue is provided".into(),
                ));
            }
            if m != "Exact" && m != "NotOlderThan" {
                return Err(invalid(
                    "resourceVersionMatch",
                    format!("Unsupported value: {m:?}: supported values: \"Exact\", \"NotOlderThan\", \"\""),
                ));
            }
            if m == "Exact" && rv == Some("0") {
                return Err(invalid(
                    "resourceVersionMatch",
                    "Forbidden: resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"".into(),
                ));
            }
        }
        let limit = match get("limit") {
            None => None,
            Some(l) => {
                let n = l
                    .parse::<i64>()
                    .map_err(|e| ApiStatus::bad_request(format!("invalid limit {l:?}: {e}")))?;
                // As kube-apiserver: 0 or less is no limit.
                usize::try_from(n).ok().filter(|n| *n > 0)
            }
        };
        let mut opts = ListOptions {
            limit,
            ..ListOptions::default()
        };
        if let Some(token) = cont {
            let (start, rv_of_token) = decode(token)
                .map_err(|e| ApiStatus::bad_request(format!("invalid continue token: {e}")))?;
            if rv.is_some_and(|v| v != "0") {
                return Err(ApiStatus::bad_request(
                    "specifying resource version is not allowed when using continue",
                ));
            }
            // A negative version (from a 410's token) continues at the newest.
            opts.at = u64::try_from(rv_of_token).ok();
            opts.start = start.clone();
            opts.continuing = Some(start);
            return Ok(opts);
        }
        let Some(rv) = rv else {
            return Ok(opts);
        };
        let n = parse_rv(rv)?;
        match matching {
            Some("Exact") => opts.at = Some(n),
            Some(_) => opts.not_older_than = Some(n).filter(|n| *n > 0),
            // The legacy meaning: exact when paging, otherwise not older.
            None if opts.limit.is_some() && n > 0 => opts.at = Some(n),
            None => opts.not_older_than = Some(n).filter(|n| *n > 0),
        }
        Ok(opts)
    }
}

/// The token that continues a list read at `rv` after the object `key`.
pub fn encode(rv: i64, key: &str) -> String {
    encode_start(rv, &format!("{key}\u{0}"))
}

/// The token's JSON, compact, in its fields' order.
fn token_json(t: &Token) -> String {
    format!(
        "{{\"v\":{},\"rv\":{},\"start\":{}}}",
        Value::from(t.v.as_str()),
        t.rv,
        Value::from(t.start.as_str())
    )
}

/// The token that continues from `start` (a start key as decoded).
fn encode_start(rv: i64, start: &str) -> String {
    let token = Token {
        v: TOKEN_VERSION.into(),
        rv,
        start: start.to_string(),
    };
    // Fields in kube-apiserver's order, written as serde writes the struct
    // (a test holds them equal) but through Value's Display, which cannot
    // fail: no serde error to turn into an empty token.
    URL_SAFE_NO_PAD.encode(token_json(&token))
}

/// A token's start key and resourceVersion, checked as kube-apiserver's
/// DecodeContinue does (the key must be clean: no `..`, no empty segment).
pub fn decode(token: &str) -> Result<(String, i64), String> {
    const GENERIC: &str = "continue key is not valid";
    let data = URL_SAFE_NO_PAD
        .decode(token)
        .map_err(|e| format!("{GENERIC}: {e}"))?;
    let t: Token = serde_json::from_slice(&data).map_err(|e| format!("{GENERIC}: {e}"))?;
    if t.v != TOKEN_VERSION {
        return Err(format!(
            "{GENERIC}: server does not recognize this encoded version {}",
            t.v
        ));
    }
    if t.rv == 0 {
        return Err(format!(
            "{GENERIC}: incorrect encoded start resourceVersion (version {TOKEN_VERSION})"
        ));
    }
    if t.start.is_empty() {
        return Err(format!(
            "{GENERIC}: encoded start key empty (version {TOKEN_VERSION})"
        ));
    }
    let key = t.start.strip_prefix('/').unwrap_or(&t.start);
    let clean = key.is_empty()
        || (!key.ends_with('/')
            && key
                .split('/')
                .all(|s| !s.is_empty() && s != "." && s != ".."));
    if !clean {
        return Err(format!("{GENERIC}: {}", t.start));
    }
    Ok((key.to_string(), t.rv))
}

/// 410 for a list whose version is older than the store keeps: with
/// kube-apiserver's message and, for a continue token, a token that
/// continues from the newest version (an inconsistent list, said so).
pub fn expired(opts: &ListOptions) -> Value {
    match &opts.continuing {
        Some(start) => {
            let mut s = ApiStatus::gone(INCONSISTENT_CONTINUE).body();
            s["metadata"] = json!({"continue": encode_start(-1, start)});
            s
        }
        None => ApiStatus::gone(EXPIRED).body(),
    }
}

/// 504 for a version the cluster has not reached, as kube-apiserver's
/// "Too large resource version" (the client retries).
pub fn too_large(wanted: u64, current: u64) -> ApiStatus {
    ApiStatus::new(
        StatusCode::GATEWAY_TIMEOUT,
        "Timeout",
        format!("Timeout: Too large resource version: {wanted}, current: {current}"),
    )
    .with_details(json!({
        "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
        "retryAfterSeconds": 1,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_is_written_as_serde_writes_it() {
        for (rv, start) in [(7, "a\u{0}"), (-1, "quote\" and \\ back"), (0, "")] {
            let t = Token {
                v: TOKEN_VERSION.into(),
                rv,
                start: start.into(),
            };
            assert_eq!(
                token_json(&t),
                serde_json::to_string(&t).expect("a Token serializes")
            );
        }
    }

    fn q(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn tokens_are_kube_apiservers() {
        let t = encode(42, "default/web-1");
        // The exact bytes kube-apiserver's EncodeContinue makes.
        assert_eq!(
            String::from_utf8(URL_SAFE_NO_PAD.decode(&t).unwrap()).unwrap(),
            r#"{"v":"meta.k8s.io/v1","rv":42,"start":"default/web-1\u0000"}"#
        );
        assert_eq!(decode(&t).unwrap(), ("default/web-1\u{0}".to_string(), 42));
        // One kube-apiserver issued (rv 12345, start "pod-1\0").
        let kube =
            URL_SAFE_NO_PAD.encode(r#"{"v":"meta.k8s.io/v1","rv":12345,"start":"pod-1\u0000"}"#);
        assert_eq!(decode(&kube).unwrap(), ("pod-1\u{0}".to_string(), 12345));
    }

    #[test]
    fn bad_tokens_are_refused() {
        let enc = |s: &str| URL_SAFE_NO_PAD.encode(s);
        for (token, needle) in [
            ("%%%".to_string(), "continue key is not valid"),
            (enc("not json"), "continue key is not valid"),
            (
                enc(r#"{"v":"v2","rv":1,"start":"a"}"#),
                "does not recognize",
            ),
            (
                enc(r#"{"v":"meta.k8s.io/v1","rv":0,"start":"a"}"#),
                "resourceVersion",
            ),
            (
                enc(r#"{"v":"meta.k8s.io/v1","rv":3,"start":""}"#),
                "start key empty",
            ),
            (
                enc(r#"{"v":"meta.k8s.io/v1","rv":3,"start":"a/../../b"}"#),
                "not valid",
            ),
            (
                enc(r#"{"v":"meta.k8s.io/v1","rv":3,"start":"a//b"}"#),
                "not valid",
            ),
        ] {
            let err = decode(&token).unwrap_err();
            assert!(err.contains(needle), "{token}: {err}");
            let err = ListOptions::parse(&q(&[("continue", &token)])).unwrap_err();
            assert_eq!(err.code, 400);
            assert!(
                err.message.starts_with("invalid continue token: "),
                "{}",
                err.message
            );
        }
    }

    #[test]
    fn options_as_kube_apiserver_reads_them() {
        let parse = |p: &[(&str, &str)]| ListOptions::parse(&q(p));
        assert_eq!(parse(&[]).unwrap(), ListOptions::default());
        assert_eq!(parse(&[("limit", "0")]).unwrap().limit, None);
        assert_eq!(parse(&[("limit", "-3")]).unwrap().limit, None);
        assert_eq!(parse(&[("limit", "5")]).unwrap().limit, Some(5));
        assert_eq!(parse(&[("limit", "x")]).unwrap_err().code, 400);
        // resourceVersion: exact when paging (legacy), not older otherwise.
        let o = parse(&[("limit", "5"), ("resourceVersion", "7")]).unwrap();
        assert_eq!((o.at, o.not_older_than), (Some(7), None));
        let o = parse(&[("resourceVersion", "7")]).unwrap();
        assert_eq!((o.at, o.not_older_than), (None, Some(7)));
        let o = parse(&[("resourceVersion", "0"), ("limit", "5")]).unwrap();
        assert_eq!((o.at, o.not_older_than), (None, None));
        let o = parse(&[("resourceVersion", "7"), ("resourceVersionMatch", "Exact")]).unwrap();
        assert_eq!(o.at, Some(7));
        let o = parse(&[
            ("resourceVersion", "7"),
            ("resourceVersionMatch", "NotOlderThan"),
            ("limit", "2"),
        ])
        .unwrap();
        assert_eq!((o.at, o.not_older_than), (None, Some(7)));
        assert_eq!(parse(&[("resourceVersion", "x")]).unwrap_err().code, 400);
        // What kube-apiserver refuses.
        let token = encode(9, "a");
        for (p, code) in [
            (vec![("resourceVersionMatch", "Exact")], 422),
            (
                vec![("resourceVersion", "3"), ("resourceVersionMatch", "Newest")],
                422,
            ),
            (
                vec![("resourceVersion", "0"), ("resourceVersionMatch", "Exact")],
                422,
            ),
            (
                vec![
                    ("resourceVersion", "9"),
                    ("resourceVersionMatch", "Exact"),
                    ("continue", &token),
                ],
                422,
            ),
            (vec![("resourceVersion", "9"), ("continue", &token)], 400),
        ] {
            assert_eq!(parse(&p).unwrap_err().code, code, "{p:?}");
        }
        let o = parse(&[("continue", &token), ("resourceVersion", "0")]).unwrap();
        assert_eq!((o.at, o.start.as_str()), (Some(9), "a\u{0}"));
        // The token a 410 hands out continues at the newest version.
        let again = expired(&o);
        assert_eq!(again["code"], 410);
        assert_eq!(again["reason"], "Expired");
        assert_eq!(again["message"], INCONSISTENT_CONTINUE);
        let next = again["metadata"]["continue"].as_str().unwrap();
        let o = parse(&[("continue", next)]).unwrap();
        assert_eq!((o.at, o.start.as_str()), (None, "a\u{0}"));
    }
}
