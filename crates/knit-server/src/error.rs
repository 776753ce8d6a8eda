//! The one error type of knit-server, with stable codes and HTTP statuses.

use knit_api::{ApiError, FieldError};

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("{0}")]
    Api(#[from] ApiError),
    #[error("{kind} {name:?} not found")]
    NotFound { kind: &'static str, name: String },
    #[error("{kind} {name:?} already exists")]
    AlreadyExists { kind: &'static str, name: String },
    #[error("{0}")]
    Conflict(String),
    #[error("missing or wrong credentials: {0}")]
    Unauthorized(String),
    #[error("bootstrap token refused: {0}")]
    TokenRefused(String),
    #[error("composed user data is {size} bytes, over the limit of {limit} bytes (pre-user-data {pre} bytes, knit stub {stub} bytes, user-data {user} bytes): shorten the pool's scripts")]
    UserDataTooLarge {
        size: usize,
        limit: usize,
        pre: usize,
        stub: usize,
        user: usize,
    },
    #[error(
        "cluster node quota exceeded: {requested} nodes requested across pools, quota is {quota} ({source_of_quota}). To raise it, set the Cluster's spec.nodeQuota (e.g. nodeQuota: {requested}) or spec.edition: pro (5000 nodes), then `knit apply -f cluster.yaml`; or lower the pools' counts"
    )]
    QuotaExceeded {
        requested: i64,
        quota: i64,
        /// Where the quota comes from: `nodeQuota` or the edition.
        source_of_quota: String,
    },
    #[error(
        "request body of {size} bytes is over the limit of {limit} bytes: send a smaller request"
    )]
    PayloadTooLarge { size: u64, limit: usize },
    #[error("bad request: {0}")]
    BadRequest(String),
    /// Over a rate: `what` names the allowance; retry after the time given
    /// (also sent as `Retry-After`).
    #[error("too many requests: {what}; retry in {retry_after_secs} s")]
    RateLimited { what: String, retry_after_secs: u64 },
    #[error("forbidden: {0}")]
    Forbidden(String),
    /// An API token whose role may not do this (`knit token create --role`).
    #[error("forbidden: {what} needs a token of role {needs} or higher; this token ({id}) has role {role}")]
    InsufficientRole {
        what: String,
        id: String,
        role: knit_api::state::TokenRole,
        needs: knit_api::state::TokenRole,
    },
    /// Revoking the last live admin token would leave nobody able to make
    /// or manage tokens.
    #[error("token {id} is the last admin token: create another admin token (knit token create --role admin) before revoking it")]
    LastAdminToken { id: String },
    /// The datastore (SQLite or PostgreSQL) failed or could not be reached.
    #[error("store: {0}")]
    Db(#[from] knit_db::DbError),
    /// A write of the leader's work from a server whose lease (epoch) is
    /// no longer the current one: another server leads now.
    #[error("not the leader any more: the lease of epoch {epoch} was lost; this server's leader work stops")]
    Fenced { epoch: i64 },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// A file, process, command, PEM or time helper (knit-os).
    #[error("{0}")]
    Os(#[from] knit_os::OsError),
    #[error("certificates: {0}")]
    Pki(String),
    /// The key that seals the secrets servers share in the datastore:
    /// missing, wrong, or its file refused.
    #[error("{0}")]
    Sealed(#[from] crate::sealed::SealError),
    /// A provider's failure, with the kind callers decide on
    /// (`provider_error::ProviderErrorKind`) and the provider's own code.
    #[error("{0}")]
    Provider(#[from] crate::provider_error::ProviderError),
    /// A provider call that outlived its limit (see `provider::CallLimits`).
    #[error("provider {provider}: {operation} of {instance} did not finish within {limit_secs} s")]
    ProviderTimeout {
        provider: String,
        /// The `Provider` operation (create, get, exec …).
        operation: String,
        /// The instance (or image, snapshot, name) it was about.
        instance: String,
        limit_secs: u64,
    },
    #[error("package: {0}")]
    Package(String),
    /// A value serde could not write (never sent or stored as empty).
    #[error("{0}")]
    Serialize(#[from] knit_api::ser::SerializeError),
    /// Asked for a part this binary was built without (a cargo feature).
    #[error("{0}")]
    FeatureMissing(#[from] crate::features::FeatureMissing),
    #[error("{0}")]
    Internal(String),
}

impl ServerError {
    /// Stable code shown to users and in API error bodies. Never rename one.
    pub fn code(&self) -> &'static str {
        match self {
            ServerError::Api(e) => e.code(),
            ServerError::NotFound { .. } => "NotFound",
            ServerError::AlreadyExists { .. } => "AlreadyExists",
            ServerError::Conflict(_) => "Conflict",
            ServerError::Unauthorized(_) => "Unauthorized",
            ServerError::TokenRefused(_) => "TokenRefused",
            ServerError::UserDataTooLarge { .. } => "UserDataTooLarge",
            ServerError::QuotaExceeded { .. } => "QuotaExceeded",
            ServerError::PayloadTooLarge { .. } => "PayloadTooLarge",
            ServerError::BadRequest(_) => "BadRequest",
            ServerError::RateLimited { .. } => "RateLimited",
            ServerError::Forbidden(_) => "Forbidden",
            ServerError::InsufficientRole { .. } => "InsufficientRole",
            ServerError::LastAdminToken { .. } => "LastAdminToken",
            ServerError::Db(e) if e.is_unavailable() => "StoreUnavailable",
            ServerError::Db(_) => "StoreError",
            ServerError::Fenced { .. } => "NotLeader",
            ServerError::Io { .. } => "IoError",
            ServerError::Os(e) => e.code(),
            ServerError::Pki(_) => "PkiError",
            ServerError::Sealed(e) => e.code(),
            ServerError::Provider(_) => "ProviderError",
            ServerError::ProviderTimeout { .. } => "ProviderTimeout",
            ServerError::Package(_) => "PackageError",
            ServerError::Serialize(e) => e.code(),
            ServerError::FeatureMissing(_) => crate::features::FeatureMissing::CODE,
            ServerError::Internal(_) => "InternalError",
        }
    }

    pub fn http_status(&self) -> u16 {
        match self {
            ServerError::Api(ApiError::Parse { .. }) => 400,
            ServerError::Api(ApiError::Invalid(_)) => 422,
            ServerError::UserDataTooLarge { .. } | ServerError::QuotaExceeded { .. } => 422,
            ServerError::NotFound { .. } => 404,
            ServerError::PayloadTooLarge { .. } => 413,
            ServerError::BadRequest(_) => 400,
            ServerError::Forbidden(_) | ServerError::InsufficientRole { .. } => 403,
            ServerError::LastAdminToken { .. } => 409,
            ServerError::RateLimited { .. } => 429,
            ServerError::AlreadyExists { .. } | ServerError::Conflict(_) => 409,
            ServerError::Unauthorized(_) | ServerError::TokenRefused(_) => 401,
            ServerError::ProviderTimeout { .. } => 504,
            // Unreachable or slow: worth retrying once it is back.
            ServerError::Db(e) if e.is_unavailable() => 503,
            ServerError::Fenced { .. } => 503,
            ServerError::FeatureMissing(_) => 501,
            _ => 500,
        }
    }

    /// The invalid fields, for 422 bodies.
    pub fn field_errors(&self) -> &[FieldError] {
        match self {
            ServerError::Api(ApiError::Invalid(list)) => list,
            _ => &[],
        }
    }

    /// The quota error for `requested` nodes against a cluster's quota.
    pub fn quota_exceeded(requested: i64, cluster: &knit_api::ClusterSpec) -> ServerError {
        ServerError::QuotaExceeded {
            requested,
            quota: cluster.effective_node_quota(),
            source_of_quota: match cluster.node_quota {
                Some(q) => format!("spec.nodeQuota: {q}"),
                None => format!("edition {}", cluster.edition),
            },
        }
    }

    /// The provider's kind of failure, when this is a provider's error
    /// (a call past its limit is [`Transient`]).
    ///
    /// [`Transient`]: crate::provider_error::ProviderErrorKind::Transient
    pub fn provider_kind(&self) -> Option<crate::provider_error::ProviderErrorKind> {
        match self {
            ServerError::Provider(e) => Some(e.kind),
            ServerError::ProviderTimeout { .. } => {
                Some(crate::provider_error::ProviderErrorKind::Transient)
            }
            _ => None,
        }
    }

    pub fn io(what: impl Into<String>, source: std::io::Error) -> ServerError {
        ServerError::Io {
            what: what.into(),
            source,
        }
    }
}

pub type Result<T> = std::result::Result<T, ServerError>;
