//! knit-server: the control plane. It stores node pools and the cluster spec
//! (SQLite), serves a REST API over TLS, reconciles pools into instances
//! through a [`provider::Provider`], composes each instance's user data,
//! exchanges one-time tokens for NodeConfigs, receives the agents' phase
//! reports, and serves the package mirror.

// The public face: what `knit server` (the CLI), the tests and the bench
// use, and nothing more. `tests/layers.rs` holds it to this list, so a new
// room is sealed unless the face is widened here on purpose.
pub mod autoscaler;
pub mod features;
pub mod join;
pub mod mirror;
pub mod preflight;
pub mod provider;
pub mod sealed;
pub mod store;

// The rooms, sealed: reached from outside only through the face.
pub(crate) mod api_tokens;
pub(crate) mod attach;
pub(crate) mod bootstrap;
pub(crate) mod cluster;
pub(crate) mod control;
pub(crate) mod drain;
pub(crate) mod error;
pub(crate) mod ha;
pub(crate) mod http;
pub(crate) mod kube_events;
pub(crate) mod metrics;
pub(crate) mod names;
pub(crate) mod nodes;
pub(crate) mod pause;
pub(crate) mod pki;
pub(crate) mod pool_state;
pub(crate) mod pools;
pub(crate) mod provider_error;
pub(crate) mod reconcile;
pub(crate) mod registry;
pub(crate) mod server;
pub(crate) mod snapshot;
pub(crate) mod userdata;

// Single items of sealed rooms that the face carries.
#[cfg(feature = "external-cluster")]
pub use crate::cluster::external::ExternalJoin;
pub use crate::cluster::seam::{ClusterJoin, JoinMaterial, NoCluster};
pub use crate::cluster::EmbeddedJoin;
pub use crate::control::{
    ConnectionLimits, ConsoleSettings, ControlPlane, Settings, DEFAULT_CONSOLE_PORT, DEFAULT_PORT,
};
pub use crate::drain::Progress as DrainProgress;
pub use crate::error::{Result, ServerError};
pub use crate::http::auth::route_table;
pub use crate::kube_events::start as start_kube_events;
pub use crate::pki::token_hash;
pub use crate::reconcile::{plan as reconcile_plan, USER_DATA_RESULT, USER_DATA_RESULT_MAX_BYTES};
pub use crate::registry::ensure_layout as ensure_registry_layout;
pub use crate::server::{advertise_host, init_state, start, stored_cluster, Server};
