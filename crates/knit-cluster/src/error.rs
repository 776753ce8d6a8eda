//! The one error type of this crate, and the Kubernetes `Status` body that API
//! errors are rendered as.

use axum::http::StatusCode;
use serde_json::{json, Value};

/// Failures of the embedded cluster outside a single API request (start-up,
/// storage, certificates). Each has a stable code.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("I/O on {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// The datastore (SQLite or PostgreSQL) failed or could not be reached.
    #[error("storage: {0}")]
    Storage(#[from] knit_db::DbError),
    #[error("certificate: {0}")]
    Cert(String),
    #[error("TLS: {0}")]
    Tls(String),
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("stored object is corrupt: {0}")]
    Corrupt(String),
    #[error("{0}")]
    Api(#[from] ApiStatus),
}

impl ClusterError {
    /// Stable code for this error, used in logs and by callers.
    pub fn code(&self) -> &'static str {
        match self {
            ClusterError::Io { .. } => "ClusterIo",
            ClusterError::Storage(_) => "ClusterStorage",
            ClusterError::Cert(_) => "ClusterCert",
            ClusterError::Tls(_) => "ClusterTls",
            ClusterError::Config(_) => "ClusterConfig",
            ClusterError::Corrupt(_) => "ClusterCorrupt",
            ClusterError::Api(_) => "ClusterApi",
        }
    }

    pub(crate) fn io(path: impl AsRef<std::path::Path>, source: std::io::Error) -> Self {
        ClusterError::Io {
            path: path.as_ref().display().to_string(),
            source,
        }
    }
}

impl From<rcgen::Error> for ClusterError {
    fn from(e: rcgen::Error) -> Self {
        ClusterError::Cert(e.to_string())
    }
}

/// One API error: HTTP code, Kubernetes reason and message, rendered as a
/// `meta/v1 Status` body.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{code} {reason}: {message}")]
pub struct ApiStatus {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    /// `details` (name, group, kind, causes) as Kubernetes fills it.
    pub details: Option<Value>,
}

impl ApiStatus {
    pub fn new(code: StatusCode, reason: &'static str, message: impl Into<String>) -> Self {
        ApiStatus {
            code: code.as_u16(),
            reason,
            message: message.into(),
            details: None,
        }
    }
    pub fn bad_request(m: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "BadRequest", m)
    }
    pub fn unauthorized(m: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "Unauthorized", m)
    }
    pub fn forbidden(m: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "Forbidden", m)
    }
    pub fn not_found(m: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "NotFound", m)
    }
    pub fn method_not_allowed(m: impl Into<String>) -> Self {
        Self::new(StatusCode::METHOD_NOT_ALLOWED, "MethodNotAllowed", m)
    }
    pub fn already_exists(m: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "AlreadyExists", m)
    }
    pub fn conflict(m: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "Conflict", m)
    }
    pub fn gone(m: impl Into<String>) -> Self {
        Self::new(StatusCode::GONE, "Expired", m)
    }
    pub fn unsupported_media(m: impl Into<String>) -> Self {
        Self::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "UnsupportedMediaType",
            m,
        )
    }
    /// 429 as kube-apiserver's eviction answers it: `retryAfterSeconds`
    /// (also sent as `Retry-After` when above 0) and one cause.
    pub fn too_many_requests(
        m: impl Into<String>,
        retry_after_seconds: u32,
        cause: Option<(&str, String)>,
    ) -> Self {
        let mut details = json!({});
        if retry_after_seconds > 0 {
            details["retryAfterSeconds"] = json!(retry_after_seconds);
        }
        if let Some((reason, message)) = cause {
            details["causes"] = json!([{"reason": reason, "message": message}]);
        }
        Self::new(StatusCode::TOO_MANY_REQUESTS, "TooManyRequests", m).with_details(details)
    }
    pub fn internal(m: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "InternalError", m)
    }
    /// 422 with one cause per invalid field, as `kubectl` prints them.
    pub fn invalid(kind: &str, name: &str, causes: Vec<(String, String)>) -> Self {
        let message = format!(
            "{kind} \"{name}\" is invalid: {}",
            causes
                .iter()
                .map(|(f, m)| format!("{f}: {m}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        let causes: Vec<Value> = causes
            .into_iter()
            .map(|(field, message)| json!({"reason": "FieldValueInvalid", "message": message, "field": field}))
            .collect();
        ApiStatus {
            code: 422,
            reason: "Invalid",
            message,
            details: Some(json!({"name": name, "kind": kind.to_lowercase(), "causes": causes})),
        }
    }
    pub fn with_details(mut self, details: Value) -> Self {
        self.details = Some(details);
        self
    }

    /// The `Status` object body.
    pub fn body(&self) -> Value {
        let mut v = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if self.reason.is_empty() {
            // A Status with no reason, as kube-apiserver returns some.
            if let Some(o) = v.as_object_mut() {
                o.remove("reason");
            }
        }
        if let Some(d) = &self.details {
            v["details"] = d.clone();
        }
        v
    }
}

impl From<ClusterError> for ApiStatus {
    fn from(e: ClusterError) -> Self {
        match e {
            ClusterError::Api(s) => s,
            ClusterError::Storage(e) => ApiStatus::from(e),
            other => ApiStatus::internal(format!("{} ({})", other, other.code())),
        }
    }
}

/// A datastore that cannot be reached (or did not answer in time) is 503:
/// the client retries, as with an etcd that has no quorum. Writers that
/// kept colliding on PostgreSQL are 409, as a changed object is. Anything
/// else is 500 with the datastore's stable code.
impl From<knit_db::DbError> for ApiStatus {
    fn from(e: knit_db::DbError) -> Self {
        let code = e.code();
        if e.is_unavailable() {
            ApiStatus::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "ServiceUnavailable",
                format!("the datastore is unavailable, try again later: {e} ({code})"),
            )
        } else if matches!(e, knit_db::DbError::Conflict(_)) {
            ApiStatus::conflict(format!("{e} ({code}); please try again"))
        } else {
            ApiStatus::internal(format!("storage: {e} ({code})"))
        }
    }
}
