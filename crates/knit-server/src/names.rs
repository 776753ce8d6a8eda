//! Names that arrive in requests (URL path segments, report bodies) before
//! they reach a URL, a file path or SQL: checked against the Kubernetes
//! rules, with an error that names the field, the value and the rule.

use crate::error::{Result, ServerError};
use knit_api::{ApiError, FieldError};

/// The rule a pool name follows (a DNS-1123 label, as knit-api checks a
/// pool's `metadata.name`).
pub const POOL_NAME_RULE: &str =
    "must be a DNS-1123 label: 1 to 63 lowercase letters, digits or '-', alphanumeric at both ends";
/// The rule a node or instance name follows.
pub const NODE_NAME_RULE: &str = "must be a DNS-1123 subdomain: at most 253 lowercase letters, digits, '-' or '.', alphanumeric at both ends";

fn invalid(field: &str, value: &str, rule: &str) -> ServerError {
    ApiError::Invalid(vec![FieldError {
        field: field.into(),
        value: format!("{value:?}"),
        rule: rule.into(),
    }])
    .into()
}

/// Whether `s` is a DNS-1123 label.
pub fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// A pool name from a request, as `field`.
pub fn check_pool(field: &str, name: &str) -> Result<()> {
    if is_dns_label(name) {
        Ok(())
    } else {
        Err(invalid(field, name, POOL_NAME_RULE))
    }
}

/// A node or instance name from a request, as `field`.
pub fn check_node(field: &str, name: &str) -> Result<()> {
    if knit_api::validate::is_dns_subdomain(name) {
        Ok(())
    } else {
        Err(invalid(field, name, NODE_NAME_RULE))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_tricks_are_refused_with_field_value_and_rule() {
        for bad in ["../evil", "x/../victim", "", "A", "-a", "a_b", "a%2Fb"] {
            let e = check_pool("metadata.name", bad).unwrap_err();
            assert_eq!(e.http_status(), 422);
            let f = &e.field_errors()[0];
            assert_eq!(f.field, "metadata.name");
            assert_eq!(f.value, format!("{bad:?}"));
            assert!(f.rule.contains("DNS-1123"), "{}", f.rule);
        }
        for bad in ["../evil", "x/../victim", "a..b", "UPPER", "a b"] {
            assert!(check_node("node", bad).is_err(), "{bad}");
        }
        check_pool("metadata.name", "workers-1").unwrap();
        check_node("node", "local.i-0123456789ab").unwrap();
        check_node("node", "workers-abcde").unwrap();
    }
}
