//! The ACS3-HMAC-SHA256 (V3) request signature of Alibaba Cloud's OpenAPI
//! gateway, written from the published specification ("Request syntax and
//! signature method V3"). The client signs with it and the fake ECS verifies
//! with it, so a mistake here could hide behind agreement: the unit test pins
//! it to the specification's own worked example.

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;

pub const ALGORITHM: &str = "ACS3-HMAC-SHA256";

/// Bytes RFC 3986 leaves as they are: letters, digits and `-_.~`.
const UNRESERVED: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// RFC 3986 percent-encoding: unreserved characters stay, every other byte
/// of the UTF-8 form becomes `%XX` (space `%20`, `*` `%2A`, `~` kept).
pub fn percent_encode(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, UNRESERVED).to_string()
}

/// Sorted `name=value` pairs, both encoded, joined by `&`.
pub fn canonical_query(query: &BTreeMap<String, String>) -> String {
    let mut pairs: Vec<(String, String)> = query
        .iter()
        .map(|(k, v)| (percent_encode(k), percent_encode(v)))
        .collect();
    pairs.sort();
    pairs
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("&")
}

pub fn sha256_hex(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

/// One request as it is signed.
pub struct SignInput<'a> {
    pub method: &'a str,
    /// `/` for RPC-style APIs such as ECS.
    pub path: &'a str,
    pub query: &'a BTreeMap<String, String>,
    /// Every header to sign (host, x-acs-*, content-type), any case.
    pub headers: &'a BTreeMap<String, String>,
    /// Hex SHA-256 of the body (`x-acs-content-sha256`).
    pub hashed_payload: &'a str,
}

/// The headers that take part in the signature: `host`, `content-type` and
/// every `x-acs-*`, lower-cased, sorted, values trimmed.
fn signed_headers(headers: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    headers
        .iter()
        .map(|(k, v)| (k.to_ascii_lowercase(), v.trim().to_string()))
        .filter(|(k, _)| k == "host" || k == "content-type" || k.starts_with("x-acs-"))
        .collect()
}

/// The canonical request and the `SignedHeaders` list.
pub fn canonical_request(input: &SignInput) -> (String, String) {
    let headers = signed_headers(input.headers);
    let canonical_headers: String = headers.iter().map(|(k, v)| format!("{k}:{v}\n")).collect();
    let names = headers.keys().cloned().collect::<Vec<_>>().join(";");
    let request = format!(
        "{}\n{}\n{}\n{}\n{}\n{}",
        input.method.to_ascii_uppercase(),
        input.path,
        canonical_query(input.query),
        canonical_headers,
        names,
        input.hashed_payload
    );
    (request, names)
}

/// Hex HMAC-SHA256 signature of the request with `secret`, and the
/// `SignedHeaders` list.
pub fn signature(input: &SignInput, secret: &[u8]) -> (String, String) {
    let (request, names) = canonical_request(input);
    let string_to_sign = format!("{ALGORITHM}\n{}", sha256_hex(request.as_bytes()));
    // HMAC takes a key of any length: new_from_slice cannot fail.
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(secret).expect("HMAC key of any length");
    mac.update(string_to_sign.as_bytes());
    (hex::encode(mac.finalize().into_bytes()), names)
}

/// The `Authorization` header value.
pub fn authorization(input: &SignInput, access_key_id: &str, secret: &[u8]) -> String {
    let (sig, names) = signature(input, secret);
    format!("{ALGORITHM} Credential={access_key_id},SignedHeaders={names},Signature={sig}")
}

/// The parts of an `Authorization` header.
#[derive(Debug, PartialEq, Eq)]
pub struct ParsedAuthorization {
    pub access_key_id: String,
    pub signed_headers: Vec<String>,
    pub signature: String,
}

pub fn parse_authorization(value: &str) -> Option<ParsedAuthorization> {
    let rest = value.strip_prefix(ALGORITHM)?.trim_start();
    let mut id = None;
    let mut names = None;
    let mut sig = None;
    for part in rest.split(',') {
        let (k, v) = part.trim().split_once('=')?;
        match k {
            "Credential" => id = Some(v.to_string()),
            "SignedHeaders" => names = Some(v.split(';').map(str::to_string).collect()),
            "Signature" => sig = Some(v.to_string()),
            _ => return None,
        }
    }
    Some(ParsedAuthorization {
        access_key_id: id?,
        signed_headers: names?,
        signature: sig?,
    })
}

/// Constant-time comparison of two signatures.
pub fn same_signature(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The worked example of Alibaba Cloud's "Request syntax and signature
    /// method V3": RunInstances on ecs.cn-shanghai.aliyuncs.com, POST, empty
    /// body, query ImageId + RegionId; it publishes the canonical headers,
    /// the hashed canonical request and the signature.
    #[test]
    fn published_v3_example() {
        let query: BTreeMap<String, String> = [
            (
                "ImageId",
                "win2019_1809_x64_dtc_zh-cn_40G_alibase_20230811.vhd",
            ),
            ("RegionId", "cn-shanghai"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let empty = sha256_hex(b"");
        assert_eq!(
            empty,
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        let headers: BTreeMap<String, String> = [
            ("host", "ecs.cn-shanghai.aliyuncs.com"),
            ("x-acs-action", "RunInstances"),
            ("x-acs-content-sha256", empty.as_str()),
            ("x-acs-date", "2023-10-26T10:22:32Z"),
            ("x-acs-signature-nonce", "3156853299f313e23d1673dc12e1703d"),
            ("x-acs-version", "2014-05-26"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let input = SignInput {
            method: "POST",
            path: "/",
            query: &query,
            headers: &headers,
            hashed_payload: &empty,
        };
        let (request, names) = canonical_request(&input);
        assert_eq!(
            names,
            "host;x-acs-action;x-acs-content-sha256;x-acs-date;x-acs-signature-nonce;x-acs-version"
        );
        assert_eq!(
            sha256_hex(request.as_bytes()),
            "7ea06492da5221eba5297e897ce16e55f964061054b7695beedaac1145b1e259"
        );
        assert_eq!(
            authorization(&input, "YourAccessKeyId", b"YourAccessKeySecret"),
            "ACS3-HMAC-SHA256 Credential=YourAccessKeyId,SignedHeaders=host;x-acs-action;x-acs-content-sha256;x-acs-date;x-acs-signature-nonce;x-acs-version,Signature=06563a9e1b43f5dfe96b81484da74bceab24a1d853912eee15083a6f0f3283c0"
        );
        let parsed = parse_authorization(&authorization(
            &input,
            "YourAccessKeyId",
            b"YourAccessKeySecret",
        ))
        .unwrap();
        assert_eq!(parsed.access_key_id, "YourAccessKeyId");
        assert_eq!(parsed.signed_headers.len(), 6);
    }

    #[test]
    fn encoding_follows_rfc3986() {
        assert_eq!(percent_encode("a b*c~d/e+f"), "a%20b%2Ac~d%2Fe%2Bf");
        assert_eq!(percent_encode("é"), "%C3%A9");
        assert_eq!(percent_encode("[\"i-1\"]"), "%5B%22i-1%22%5D");
    }
}
