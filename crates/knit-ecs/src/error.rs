//! Errors of the ECS client. An API error carries ECS's own Code, Message
//! and RequestId; none carries a request's parameters (passwords, user data)
//! or a credential.

#[derive(Debug, thiserror::Error)]
pub enum EcsError {
    /// An error answer of the API.
    #[error("{action}: {message} [{code}] (HTTP {status}, RequestId {request_id})")]
    Api {
        action: String,
        status: u16,
        code: String,
        message: String,
        request_id: String,
    },
    /// No answer (connection refused or reset, timeout) after the retries.
    #[error("{action}: no answer from {endpoint}: {reason}")]
    Transport {
        action: String,
        endpoint: String,
        reason: String,
    },
    /// An answer that is not what the API documents.
    #[error("{action}: unexpected answer: {reason}")]
    Decode { action: String, reason: String },
    #[error("credentials: {0}")]
    Credentials(String),
    /// A bad argument, naming the field, the value and the rule.
    #[error("{0}")]
    Invalid(String),
    /// A wait for a state that did not come in time.
    #[error("{0}")]
    Timeout(String),
}

impl EcsError {
    /// Stable code: ECS's own for API errors, else knit's.
    pub fn code(&self) -> &str {
        match self {
            EcsError::Api { code, .. } => code,
            EcsError::Transport { .. } => "EcsUnreachable",
            EcsError::Decode { .. } => "EcsBadAnswer",
            EcsError::Credentials(_) => "EcsCredentials",
            EcsError::Invalid(_) => "EcsInvalidArgument",
            EcsError::Timeout(_) => "EcsTimeout",
        }
    }

    /// The API said the resource named in the request does not exist
    /// (`InvalidInstanceId.NotFound` …); an unknown key or action is not
    /// that.
    pub fn is_not_found(&self) -> bool {
        matches!(self, EcsError::Api { code, .. }
            if code.ends_with("NotFound")
                && !code.starts_with("InvalidAccessKeyId")
                && !code.starts_with("InvalidAction"))
    }

    /// Safe to send again: throttling, a server error, no answer.
    pub fn is_retryable(&self) -> bool {
        match self {
            EcsError::Api { code, status, .. } => {
                code.starts_with("Throttling")
                    || code == "ServiceUnavailable"
                    || code == "InternalError"
                    || *status >= 500
            }
            EcsError::Transport { .. } => true,
            _ => false,
        }
    }
}
