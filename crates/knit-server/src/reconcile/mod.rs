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

/// How soon the reconciler looks again after a pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pace {
    /// Something is under way or waiting on time (a create, a join timeout,
    /// a repair, a rollout, a user-data result): the next pass after the
    /// reconcile interval.
    Busy,
    /// Every pool settled, no intent, repair or user-data read pending:
    /// nothing changes without an event that wakes the loop (an API
    /// change, a Node's Ready change or deletion, an intent ending), so the
    /// next unprompted pass waits [`QUIET_FACTOR`] intervals. At 1,000 Ready
    /// nodes a pass reads every instance, node and health record.
    Settled,
}

/// A settled control plane's passes come this many intervals apart.
const QUIET_FACTOR: u32 = 5;

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
            let mut pace = Pace::Busy;
            if let Some(fence) = self.leadership.fence() {
                let epoch = fence.epoch;
                pace = crate::ha::fenced(fence, self.clone().reconcile_pass()).await;
                if last_epoch != Some(epoch) {
                    last_epoch = Some(epoch);
                    tracing::info!(epoch, "first reconcile pass as leader");
                }
            }
            // Without the cluster's Ready changes, only a pass finds them.
            let next = match (pace, readiness.is_some()) {
                (Pace::Settled, true) => self.settings.reconcile_interval * QUIET_FACTOR,
                _ => self.settings.reconcile_interval,
            };
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = self.wake.notified() => {}
                _ = readiness_changed(&mut readiness) => {}
                _ = tokio::time::sleep(next) => {}
            }
        }
    }

    /// One pass: plan, repair, dispatch, node statuses, user-data results;
    /// then whether anything is left under way.
    async fn reconcile_pass(self: Arc<Self>) -> Pace {
        let mut settled = match self.plan_all().await {
            Ok(settled) => settled,
            Err(e) => {
                tracing::error!(error = %e, "planning failed");
                false
            }
        };
        // In-place updates the rollout chose run in their own tasks.
        self.start_in_place_updates();
        // Repair actions run in their own tasks: not waited for here.
        if let Err(e) = self.repair_all_at(now_ms()).await {
            tracing::error!(error = %e, "node repair failed");
        }
        match self.dispatch() {
            Ok(pending) => settled &= !pending,
            Err(e) => {
                tracing::error!(error = %e, "dispatch failed");
                settled = false;
            }
        }
        if let Err(e) = self.sync_node_statuses().await {
            tracing::warn!(error = %e, "reading node statuses from the cluster failed");
        }
        if let Err(e) = self.sync_node_labels().await {
            tracing::warn!(error = %e, "updating node labels and taints in place failed");
        }
        match self.check_user_data().await {
            Ok(pending) => settled &= !pending,
            Err(e) => {
                tracing::warn!(error = %e, "checking user-data results failed");
                settled = false;
            }
        }
        // Intents or repairs running.
        settled &= self.in_flight.lock().is_ok_and(|s| s.is_empty());
        if settled {
            Pace::Settled
        } else {
            Pace::Busy
        }
    }
}
