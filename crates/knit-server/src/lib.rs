//! knit-server: the control plane. It stores node pools and the cluster spec
//! (SQLite), serves a REST API over TLS, reconciles pools into instances
//! through a [`provider::Provider`], composes each instance's user data,
//! exchanges one-time tokens for NodeConfigs, receives the agents' phase
//! reports, and serves the package mirror.

pub mod api_tokens;
pub mod attach;
pub mod autoscaler;
pub mod bootstrap;
pub mod cluster;
pub mod control;
pub mod drain;
pub mod error;
pub mod features;
pub mod ha;
pub mod http;
pub mod join;
pub mod kube_events;
pub mod metrics;
pub mod mirror;
pub mod names;
pub mod nodes;
pub mod pause;
pub mod pki;
pub mod pool_state;
pub mod pools;
pub mod preflight;
pub mod provider;
pub mod provider_error;
pub mod reconcile;
pub mod registry;
pub mod sealed;
pub mod server;
pub mod snapshot;
pub mod store;
pub mod userdata;

pub use control::{ControlPlane, Settings};
pub use error::{Result, ServerError};
pub use server::{start, Server};
