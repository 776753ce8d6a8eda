//! knit's way to Alibaba Cloud ECS: the ACS3-HMAC-SHA256 request signature
//! ([`sign`]), credentials that never show ([`Credentials`]), one client
//! through which every call goes ([`Client::call`]) with typed requests and
//! answers for the actions knit uses ([`api`]), and a stateful fake of the
//! API on loopback for tests (`fake`, with the feature of that name, which
//! only tests and examples turn on).

pub mod api;
pub mod client;
pub mod credentials;
pub mod error;
#[cfg(feature = "fake")]
pub mod fake;
pub mod sign;

pub use client::{Client, ClientConfig, Params, RetryPolicy};
pub use credentials::Credentials;
pub use error::EcsError;

/// The log filter directive a process using this crate adds: ureq prints
/// every request header but Authorization at debug, and an STS key's
/// `x-acs-security-token` is a header.
pub const LOG_DIRECTIVE: &str = "ureq=warn";
