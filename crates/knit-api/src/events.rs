//! What the agent reports to the control plane, one event per phase transition.

use crate::phase::{ErrorCode, PhaseName};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PhaseOutcome {
    Started,
    Done,
    Skipped,
    Failed,
}

/// One phase event. POSTed as JSON to `cluster.reportUrl` with the report
/// token as a bearer credential; also the journal's record of each phase.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PhaseEvent {
    /// Node name (the agent's computed node ID).
    pub node: String,
    pub instance_id: String,
    pub phase: PhaseName,
    pub outcome: PhaseOutcome,
    /// Why a phase was skipped, or the failure message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_code: Option<ErrorCode>,
    /// Unix time in milliseconds.
    pub at_ms: u64,
    /// Set on the end events (done, skipped, failed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
}
