//! The agent's one error type: a stable code plus a message for humans.

use knit_api::ErrorCode;
use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentError {
    pub code: ErrorCode,
    pub message: String,
}

impl AgentError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> AgentError {
        AgentError {
            code,
            message: message.into(),
        }
    }
}

impl fmt::Display for AgentError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for AgentError {}

pub type Result<T> = std::result::Result<T, AgentError>;

/// Attach an error code and context to I/O and other foreign errors.
pub trait Context<T> {
    fn context(self, code: ErrorCode, what: impl FnOnce() -> String) -> Result<T>;
}

impl<T, E: fmt::Display> Context<T> for std::result::Result<T, E> {
    fn context(self, code: ErrorCode, what: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|e| AgentError::new(code, format!("{}: {e}", what())))
    }
}
