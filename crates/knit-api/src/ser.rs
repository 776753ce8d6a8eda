//! Serializing to text as an error, never as an empty string: every
//! `to_string(..)` of serde in knit goes through these, so a value that
//! cannot be written fails where it is written (naming what) instead of
//! writing an empty file or sending an empty body.

use serde::Serialize;

/// A value serde could not write: what it was, the format, serde's reason.
/// Stable code `SerializeFailed`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot write {what} as {format}: {reason}")]
pub struct SerializeError {
    pub what: String,
    /// `JSON` or `YAML`.
    pub format: &'static str,
    pub reason: String,
}

impl SerializeError {
    pub fn code(&self) -> &'static str {
        "SerializeFailed"
    }

    fn new(what: &str, format: &'static str, reason: impl std::fmt::Display) -> SerializeError {
        SerializeError {
            what: what.to_string(),
            format,
            reason: reason.to_string(),
        }
    }
}

/// `value` as YAML.
pub fn yaml<T: Serialize + ?Sized>(what: &str, value: &T) -> Result<String, SerializeError> {
    serde_yaml_ng::to_string(value).map_err(|e| SerializeError::new(what, "YAML", e))
}

/// `value` as compact JSON.
pub fn json<T: Serialize + ?Sized>(what: &str, value: &T) -> Result<String, SerializeError> {
    serde_json::to_string(value).map_err(|e| SerializeError::new(what, "JSON", e))
}

/// `value` as compact JSON bytes.
pub fn json_vec<T: Serialize + ?Sized>(what: &str, value: &T) -> Result<Vec<u8>, SerializeError> {
    serde_json::to_vec(value).map_err(|e| SerializeError::new(what, "JSON", e))
}

/// `value` as indented JSON.
pub fn json_pretty<T: Serialize + ?Sized>(what: &str, value: &T) -> Result<String, SerializeError> {
    serde_json::to_string_pretty(value).map_err(|e| SerializeError::new(what, "JSON", e))
}

/// A JSON value as indented JSON. Cannot fail, so no `Result`: a
/// `serde_json::Value` holds only string keys and finite numbers, and its
/// `Display` (`{:#}`: indented) writes it without serde's fallible path.
pub fn value_pretty(value: &serde_json::Value) -> String {
    format!("{value:#}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn a_value_serde_cannot_write_is_an_error_naming_it() {
        // JSON object keys must be strings: a map keyed by tuples is refused.
        let mut odd = BTreeMap::new();
        odd.insert((1, 2), "x");
        let e = json("the odd map", &odd).expect_err("refused");
        assert_eq!(e.code(), "SerializeFailed");
        assert!(
            e.to_string()
                .starts_with("cannot write the odd map as JSON: "),
            "{e}"
        );
        assert!(json_vec("the odd map", &odd).is_err());
        assert!(json_pretty("the odd map", &odd).is_err());
        assert_eq!(json("a list", &[1, 2]).as_deref(), Ok("[1,2]"));
        assert_eq!(
            yaml("a map", &BTreeMap::from([("a", 1)])).as_deref(),
            Ok("a: 1\n")
        );
    }

    #[test]
    fn a_json_value_is_written_as_serde_writes_it() {
        let v = serde_json::json!({"b": [1, 2.5, null], "a": {"c": "d"}});
        assert_eq!(
            value_pretty(&v),
            serde_json::to_string_pretty(&v).expect("a Value always serializes")
        );
    }
}
