//! The pool reconciler. Planning (desired vs actual → which instances to
//! create or remove) is a pure function; executing a plan writes intents to
//! the store first and only then calls the provider, with bounded
//! parallelism, retries with backoff, and an event for every outcome.

pub mod in_place;
mod intents;
pub mod node_sync;
mod nodes;
mod plan;
mod planning;
pub mod repair;
pub mod rollout;
mod user_data;

pub use plan::plan;

use crate::control::ControlPlane;
use crate::store::now_ms;
use std::sync::Arc;

/// cloud-init's result record, written when the user-data runner finishes.
pub const USER_DATA_RESULT: &str = "/run/cloud-init/result.json";
/// Largest result record read (a few KiB in practice).
pub const USER_DATA_RESULT_MAX_BYTES: usize = 1 << 20;
/// How long reading the result record may take.
pub const USER_DATA_RESULT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// How a join timeout's message starts (also how an instance failed by one
/// before its time was stored is recognized).
pub const JOIN_TIMEOUT_MESSAGE_START: &str = "not initialized ";

/// Resolves when the cluster tells of a Ready change; never without a
/// follower (or once it ended).
async fn readiness_changed(readiness: &mut Option<tokio::sync::watch::Receiver<()>>) {
    if let Some(rx) = readiness {
        if rx.changed().await.is_ok() {
            return;
        }
        *readiness = None;
    }
    std::future::pending::<()>().await
}

impl ControlPlane {
    /// The reconcile loop: on the leader, a pass; then sleep until woken or
    /// the interval.
    pub async fn run_reconciler(self: Arc<Self>, mut shutdown: tokio::sync::watch::Receiver<bool>) {
        // Every server's embedded API reports the cluster's version.
        let _ = crate::pools::versions::publish(&self);
        if self.provider.is_none() {
            tracing::warn!("no provider configured: pools are stored but no instance is created");
            return;
        }
        // The epoch of the last pass, to log the first pass of a new lease
        // (bench/ha-failover.sh times a failover up to this line).
        let mut last_epoch = None;
        // A Node's Ready changed: a pass now records it (the node's status,
        // `knit scale --wait`) rather than up to an interval later.
        let mut readiness = self.cluster.readiness_changes();
        loop {
            let _ = crate::pools::versions::publish(&self);
            // Only the leader reconciles; its writes carry its lease.
            if let Some(fence) = self.leadership.fence() {
                let epoch = fence.epoch;
                crate::ha::fenced(fence, self.clone().reconcile_pass()).await;
                if last_epoch != Some(epoch) {
                    last_epoch = Some(epoch);
                    tracing::info!(epoch, "first reconcile pass as leader");
                }
            }
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = self.wake.notified() => {}
                _ = readiness_changed(&mut readiness) => {}
                _ = tokio::time::sleep(self.settings.reconcile_interval) => {}
            }
        }
    }

    /// One pass: plan, repair, dispatch, node statuses, user-data results.
    async fn reconcile_pass(self: Arc<Self>) {
        if let Err(e) = self.plan_all().await {
            tracing::error!(error = %e, "planning failed");
        }
        // In-place updates the rollout chose run in their own tasks.
        self.start_in_place_updates();
        // Repair actions run in their own tasks: not waited for here.
        if let Err(e) = self.repair_all_at(now_ms()).await {
            tracing::error!(error = %e, "node repair failed");
        }
        if let Err(e) = self.dispatch() {
            tracing::error!(error = %e, "dispatch failed");
        }
        if let Err(e) = self.sync_node_statuses().await {
            tracing::warn!(error = %e, "reading node statuses from the cluster failed");
        }
        if let Err(e) = self.sync_node_labels().await {
            tracing::warn!(error = %e, "updating node labels and taints in place failed");
        }
        if let Err(e) = self.check_user_data().await {
            tracing::warn!(error = %e, "checking user-data results failed");
        }
    }
}
