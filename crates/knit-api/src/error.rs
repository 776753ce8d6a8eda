//! The one error type of this crate.

use std::fmt;

/// One invalid field: where it is, what it holds, and the rule it breaks.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FieldError {
    /// Dotted path from the document root, e.g. `kubelet.eventBurst`.
    pub field: String,
    /// The offending value, rendered as the user wrote it (JSON form).
    pub value: String,
    /// The rule, in words, e.g. `must be in [1, 100]`.
    pub rule: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: value {} {}", self.field, self.value, self.rule)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The document could not be parsed at all (syntax, unknown field, wrong type).
    #[error("cannot parse {what}: {message}")]
    Parse { what: String, message: String },
    /// The document parsed but some fields are invalid; every one is listed.
    #[error("{} invalid field(s):\n{}", .0.len(), .0.iter().map(|e| format!("  - {e}")).collect::<Vec<_>>().join("\n"))]
    Invalid(Vec<FieldError>),
}

impl ApiError {
    /// Stable code for this error, used by every binary in its output.
    pub fn code(&self) -> &'static str {
        match self {
            ApiError::Parse { .. } => "ConfigParse",
            ApiError::Invalid(_) => "ConfigInvalid",
        }
    }
}
