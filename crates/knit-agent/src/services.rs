//! Scaffold, being written in this session: services under systemd or the
//! agent's own supervisor.

use crate::error::{AgentError, Result};
use crate::host::Host;
use knit_api::ErrorCode;

/// A long-running service, with systemd unit semantics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceSpec {
    pub name: String,
    /// Program and arguments; paths as seen by this host (see `Host::host_path`).
    pub exec: Vec<String>,
    pub env: Vec<(String, String)>,
    /// `None` = infinity.
    pub limit_nofile: Option<u64>,
    pub limit_core: Option<u64>,
    pub limit_memlock: Option<u64>,
    /// Node-absolute log file.
    pub log_file: String,
}

pub fn ensure_running(_host: &Host, spec: &ServiceSpec) -> Result<()> {
    Err(AgentError::new(
        ErrorCode::FailCommand,
        format!(
            "cannot start service {}: supervisor not implemented yet",
            spec.name
        ),
    ))
}

pub fn is_running(_host: &Host, _name: &str) -> bool {
    false
}
