//! Small helpers over JSON objects, time and randomness.

use ring::rand::{SecureRandom, SystemRandom};
use serde_json::{Map, Value};
use time::OffsetDateTime;

/// Kubernetes `Time`: RFC 3339 in UTC, whole seconds (knit-os's, as every
/// knit crate writes it).
pub use knit_os::time::rfc3339;

use crate::error::ClusterError;

pub fn name_of(obj: &Value) -> &str {
    obj["metadata"]["name"].as_str().unwrap_or("")
}

pub fn namespace_of(obj: &Value) -> &str {
    obj["metadata"]["namespace"].as_str().unwrap_or("")
}

pub fn rv_of(obj: &Value) -> Option<u64> {
    obj["metadata"]["resourceVersion"].as_str()?.parse().ok()
}

/// `metadata` as a map, created (and replacing a non-object) if needed.
pub fn meta_mut(obj: &mut Value) -> &mut Map<String, Value> {
    field_mut(obj, "metadata")
}

/// `obj[key]` as a map, created if missing or not an object.
pub fn field_mut<'a>(obj: &'a mut Value, key: &str) -> &'a mut Map<String, Value> {
    if !obj.is_object() {
        *obj = Value::Object(Map::new());
    }
    let map = match obj {
        Value::Object(m) => m,
        _ => unreachable!("made an object above"),
    };
    let slot = map
        .entry(key.to_string())
        .or_insert_with(|| Value::Object(Map::new()));
    if !slot.is_object() {
        *slot = Value::Object(Map::new());
    }
    match slot {
        Value::Object(m) => m,
        _ => unreachable!("made an object above"),
    }
}

pub fn random_bytes<const N: usize>() -> Result<[u8; N], ClusterError> {
    let mut b = [0u8; N];
    SystemRandom::new()
        .fill(&mut b)
        .map_err(|_| ClusterError::Cert("the operating system's random source failed".into()))?;
    Ok(b)
}

/// Random string over `[a-z0-9]`, as bootstrap tokens and generated names use.
pub fn random_alnum(n: usize) -> Result<String, ClusterError> {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut out = String::with_capacity(n);
    while out.len() < n {
        for b in random_bytes::<32>()? {
            // 252 = 7 * 36: reject the tail so every character is equally likely.
            if b < 252 && out.len() < n {
                out.push(ALPHABET[(b % 36) as usize] as char);
            }
        }
    }
    Ok(out)
}

/// A random (version 4) UUID for `metadata.uid`, from the system's
/// secure random source.
pub fn new_uid() -> Result<String, ClusterError> {
    let bytes = random_bytes::<16>()?;
    Ok(uuid::Builder::from_random_bytes(bytes)
        .into_uuid()
        .to_string())
}

pub fn now() -> OffsetDateTime {
    OffsetDateTime::now_utc()
}

pub fn now_rfc3339() -> String {
    rfc3339(now())
}

/// An RFC 3339 time; `None` for anything else (a field a client garbled
/// is treated as absent).
pub fn parse_time(s: &str) -> Option<OffsetDateTime> {
    knit_os::time::parse_rfc3339(s).ok()
}

/// kubectl's short age format: `42s`, `5m10s`, `3h4m`, `2d3h`, `400d`.
pub fn human_age(from: Option<OffsetDateTime>) -> String {
    let Some(from) = from else {
        return "<unknown>".into();
    };
    let s = (now() - from).whole_seconds().max(0);
    match s {
        0..=119 => format!("{s}s"),
        120..=599 => format!("{}m{}s", s / 60, s % 60),
        600..=10_799 => format!("{}m", s / 60),
        10_800..=172_799 => format!("{}h{}m", s / 3600, (s % 3600) / 60),
        172_800..=31_535_999 => format!("{}d{}h", s / 86_400, (s % 86_400) / 3600),
        _ => format!("{}d", s / 86_400),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_use_the_bootstrap_alphabet() {
        let t = random_alnum(16).unwrap();
        assert_eq!(t.len(), 16);
        assert!(t
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()));
        assert_ne!(random_alnum(16).unwrap(), t);
    }

    #[test]
    fn uids_are_v4() {
        let u = new_uid().unwrap();
        assert_eq!(u.len(), 36);
        assert_eq!(&u[14..15], "4");
    }
}
