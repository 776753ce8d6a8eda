//! knit's drain: what every removal of a node runs before its machine goes
//! (scale-in, `knit delete node`, pool delete, repair's replace, the
//! snapshot builder), against the embedded cluster and an external one
//! alike, through the Kubernetes API (the [`ClusterJoin`] seam):
//!
//! 1. cordon (`spec.unschedulable: true`);
//! 2. list the node's pods (`fieldSelector=spec.nodeName=NODE`);
//! 3. evict every pod but mirror pods and DaemonSet pods through the
//!    Eviction API (policy/v1), never a direct delete; a refusal (429: a
//!    PodDisruptionBudget) is retried with backoff, and the budget that
//!    refused is named;
//! 4. the node is drained when no pod that blocks is left. A pod being
//!    deleted on a node that is not Ready (its kubelet cannot confirm) no
//!    longer blocks 60 s after its deletion was due (the server's
//!    `--drain-skip-wait-seconds`), as Cluster API skips waiting for
//!    unreachable nodes. A pod that more than one budget selects cannot be
//!    evicted at all (kube-apiserver answers 500, "This pod has more than
//!    one PodDisruptionBudget…"): the drain is blocked by those budgets,
//!    named, until one goes or the timeout forces.
//!
//! Past the pool's `spec.drain.timeoutSeconds`, `onTimeout: wait` keeps
//! the node cordoned and the removal pending (evictions go on being
//! retried), `force` deletes the pods left.
//!
//! A drain never holds a worker while it waits: each call is one pass,
//! answering [`Progress::Wait`] with when to look again; its state is
//! stored (`store::DrainRecord`) beside the delete intent it belongs to, so
//! that a restarted server or the next leader resumes it with its timeout
//! counted from the first start. The decisions are pure functions
//! ([`classify`], [`advance`]), the calls to the cluster are in [`pass`].

use crate::bootstrap::ClusterJoin;
use crate::cluster::pods::{BudgetFacts, Eviction, PodFacts};
// The default is a setting's (`Settings::drain_skip_wait`).
use crate::cluster::seam::CLUSTER_CALL_TIMEOUT;
use crate::control::ControlPlane;
use crate::error::{Result, ServerError};
use crate::provider::within;
use crate::store::{now_ms, DrainRecord};
use knit_api::state::{DrainState, EventType};
use knit_api::DrainSpec;
use std::collections::BTreeMap;

/// Longest wait between two passes while evictions are refused.
pub const MAX_BACKOFF_MS: i64 = 30_000;
/// Wait between two passes while evicted pods terminate.
pub const POLL_MS: i64 = 2_000;

/// What the drain does with one pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodClass {
    /// A static pod's mirror: skipped.
    Mirror,
    /// A DaemonSet's pod: skipped (it would come back).
    DaemonSet,
    /// To be evicted (or, forced, deleted).
    Evict,
    /// Being deleted: waited for.
    Terminating,
    /// Being deleted for longer than the skip-wait (default
    /// [`crate::control::DEFAULT_SKIP_WAIT`]) past its due time on a node that is not Ready
    /// (or after a forced delete): no longer blocks.
    Abandoned,
}

/// Which of the drain's cases a pod is, at `now`; `skip_wait_ms`: how long
/// past its due time a deletion on a node that cannot confirm still blocks.
pub fn classify(
    pod: &PodFacts,
    now: i64,
    node_ready: bool,
    forced: bool,
    skip_wait_ms: i64,
) -> PodClass {
    if pod.mirror {
        return PodClass::Mirror;
    }
    if pod.daemon_set {
        return PodClass::DaemonSet;
    }
    match pod.deletion_ms {
        Some(due) if (!node_ready || forced) && now - due > skip_wait_ms => PodClass::Abandoned,
        Some(_) => PodClass::Terminating,
        None => PodClass::Evict,
    }
}

/// Wait before the next pass after `blocked_passes` passes in a row whose
/// evictions were all refused: 1 s doubling to [`MAX_BACKOFF_MS`].
pub fn backoff_ms(blocked_passes: i64) -> i64 {
    let exp = blocked_passes.clamp(0, 10) as u32;
    (1000i64 << exp).min(MAX_BACKOFF_MS)
}

/// Whether the timeout passed at `now` for a drain started at `started`.
pub fn timed_out(spec: &DrainSpec, started: i64, now: i64) -> bool {
    now - started >= spec.timeout_seconds.saturating_mul(1000)
}

/// A budget named with what it asks and what it allows:
/// `shop/web (minAvailable 2, 0 disruptions allowed)`.
pub fn budget_label(b: &BudgetFacts) -> String {
    let mut parts = Vec::new();
    if let Some(rule) = &b.rule {
        parts.push(rule.clone());
    }
    if let Some(n) = b.disruptions_allowed {
        parts.push(format!("{n} disruption(s) allowed"));
    }
    if parts.is_empty() {
        b.key()
    } else {
        format!("{} ({})", b.key(), parts.join(", "))
    }
}

/// The budgets of a pod's namespace that select it.
pub fn budgets_of<'a>(pod: &PodFacts, budgets: &'a [BudgetFacts]) -> Vec<&'a BudgetFacts> {
    budgets
        .iter()
        .filter(|b| b.namespace == pod.namespace && b.selects(&pod.labels))
        .collect()
}

/// One refused eviction: the pod, the API's message, the budgets that
/// select the pod (named with [`budget_label`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub pod: String,
    pub message: String,
    pub budgets: Vec<String>,
}

/// What one pass saw and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PassFacts {
    /// The Node exists (it was cordoned).
    pub registered: bool,
    pub node_ready: bool,
    /// Pods that block, as listed at the start of the pass (`ns/name`).
    pub blocking: Vec<String>,
    /// Skipped: mirror, DaemonSet, abandoned.
    pub skipped: BTreeMap<&'static str, usize>,
    /// Evicted in this pass (their deletion started).
    pub evicted: Vec<String>,
    pub refused: Vec<Refusal>,
    /// Deleted in this pass (forced).
    pub deleted: Vec<String>,
}

/// An event the drain records on the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DrainEvent {
    pub kind: EventType,
    pub reason: &'static str,
    pub message: String,
}

/// Where a drain stands after a pass, and what follows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Advance {
    pub record: DrainRecord,
    /// A step for the drain's timeline, when something changed.
    pub step: Option<String>,
    pub events: Vec<DrainEvent>,
    /// When to look again (ms); 0 once drained.
    pub delay_ms: i64,
}

fn list(names: &[String], max: usize) -> String {
    let mut text = names
        .iter()
        .take(max)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if names.len() > max {
        text.push_str(&format!(" and {} more", names.len() - max));
    }
    text
}

/// The drain's next state from the last one and what a pass saw: pure.
pub fn advance(prev: &DrainRecord, facts: &PassFacts, spec: &DrainSpec, now: i64) -> Advance {
    let mut record = prev.clone();
    let mut events = Vec::new();
    let mut steps: Vec<String> = Vec::new();
    let node = prev.node.clone();
    record.evicted += facts.evicted.len() as i64;
    record.pods_left = facts.blocking.len() as i64;
    if !facts.evicted.is_empty() {
        steps.push(format!("evicted {}", list(&facts.evicted, 10)));
    }
    if !facts.deleted.is_empty() {
        steps.push(format!(
            "deleted {} (onTimeout: force)",
            list(&facts.deleted, 10)
        ));
    }
    if facts.blocking.is_empty() {
        record.state = DrainState::Drained;
        record.reason = None;
        record.budget = None;
        record.blocked_passes = 0;
        let skipped: Vec<String> = facts
            .skipped
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(what, n)| format!("{n} {what}"))
            .collect();
        let message = format!(
            "node {node} drained{}: {} pod(s) evicted{}",
            if facts.registered {
                ""
            } else {
                " (not registered in the cluster)"
            },
            record.evicted,
            if skipped.is_empty() {
                String::new()
            } else {
                format!("; skipped {}", skipped.join(", "))
            }
        );
        if prev.state != DrainState::Drained {
            steps.push(message.clone());
            events.push(DrainEvent {
                kind: EventType::Normal,
                reason: "Drained",
                message,
            });
        }
        return Advance {
            record,
            step: (!steps.is_empty()).then(|| steps.join("; ")),
            events,
            delay_ms: 0,
        };
    }
    let out_of_time = timed_out(spec, prev.started_ms, now);
    if out_of_time && prev.timed_out_ms.is_none() {
        record.timed_out_ms = Some(now);
        let message = format!(
            "drain of node {node} did not end within {} s (spec.drain.timeoutSeconds): {} pod(s) left ({}); {}",
            spec.timeout_seconds,
            facts.blocking.len(),
            list(&facts.blocking, 5),
            if spec.forces() {
                "onTimeout force: deleting them"
            } else {
                "onTimeout wait: the node stays cordoned and its removal pending while evictions are retried"
            }
        );
        steps.push(message.clone());
        events.push(DrainEvent {
            kind: EventType::Warning,
            reason: "DrainTimeout",
            message,
        });
    }
    let forcing = out_of_time && spec.forces();
    let refused_budgets: Vec<String> = {
        let mut all: Vec<String> = facts
            .refused
            .iter()
            .flat_map(|r| r.budgets.iter().cloned())
            .collect();
        all.sort();
        all.dedup();
        all
    };
    if !facts.evicted.is_empty() || !facts.deleted.is_empty() {
        record.blocked_passes = 0;
    } else if !facts.refused.is_empty() {
        record.blocked_passes = prev.blocked_passes + 1;
    }
    let delay_ms = if facts.refused.is_empty() || !facts.evicted.is_empty() {
        POLL_MS
    } else {
        backoff_ms(record.blocked_passes)
    };
    if forcing {
        record.state = DrainState::Forcing;
        record.budget = None;
        record.reason = Some(format!(
            "onTimeout force: {} pod(s) deleted, waiting for them to go: {}",
            facts.blocking.len(),
            list(&facts.blocking, 5)
        ));
        if prev.state != DrainState::Forcing {
            events.push(DrainEvent {
                kind: EventType::Warning,
                reason: "DrainForced",
                message: format!(
                    "drain of node {node}: timeout of {} s passed, deleting the pods left (PodDisruptionBudgets not honoured): {}",
                    spec.timeout_seconds,
                    list(&facts.blocking, 10)
                ),
            });
        }
    } else if let Some(first) = facts.refused.first() {
        record.state = DrainState::Blocked;
        let budget = if refused_budgets.is_empty() {
            None
        } else {
            Some(refused_budgets.join("; "))
        };
        let by = match &budget {
            Some(b) if refused_budgets.len() > 1 => format!("PodDisruptionBudgets {b}"),
            Some(b) => format!("PodDisruptionBudget {b}"),
            None => "the API server".to_string(),
        };
        let reason = format!(
            "eviction of {} refused by {by}: {}; {} pod(s) left; retrying in {} s{}",
            list(
                &facts
                    .refused
                    .iter()
                    .map(|r| r.pod.clone())
                    .collect::<Vec<_>>(),
                5
            ),
            first.message,
            facts.blocking.len(),
            delay_ms / 1000,
            if out_of_time {
                " (timeout passed, onTimeout: wait)"
            } else {
                ""
            }
        );
        if prev.state != DrainState::Blocked || prev.budget != budget {
            steps.push(format!("blocked: {reason}"));
            events.push(DrainEvent {
                kind: EventType::Warning,
                reason: "DrainBlocked",
                message: format!(
                    "drain of node {node} waits: eviction of {} refused by {by}",
                    list(
                        &facts
                            .refused
                            .iter()
                            .map(|r| r.pod.clone())
                            .collect::<Vec<_>>(),
                        5
                    )
                ),
            });
        }
        record.budget = budget;
        record.reason = Some(reason);
    } else {
        record.state = DrainState::Draining;
        record.budget = None;
        record.reason = Some(format!(
            "waiting for {} pod(s) to terminate: {}{}",
            facts.blocking.len(),
            list(&facts.blocking, 5),
            if out_of_time {
                " (timeout passed, onTimeout: wait)"
            } else {
                ""
            }
        ));
        if prev.state != DrainState::Draining && steps.is_empty() {
            steps.push(format!(
                "evictions accepted; {}",
                record.reason.clone().unwrap_or_default()
            ));
        }
    }
    Advance {
        record,
        step: (!steps.is_empty()).then(|| steps.join("; ")),
        events,
        delay_ms,
    }
}

async fn bounded<T>(what: &str, call: impl std::future::Future<Output = Result<T>>) -> Result<T> {
    within("cluster", what, CLUSTER_CALL_TIMEOUT, call).await
}

/// One pass of a drain against the cluster: cordon, list, evict (or,
/// forced, delete). Every call bounded by [`CLUSTER_CALL_TIMEOUT`].
pub async fn pass(
    cluster: &dyn ClusterJoin,
    node: &str,
    forced: bool,
    now: i64,
    skip_wait_ms: i64,
) -> Result<PassFacts> {
    let registered = bounded("cordoning the node", cluster.cordon(node)).await?;
    let node_ready = registered
        && bounded("reading the node's status", cluster.node_status(node))
            .await?
            .as_deref()
            == Some("Ready");
    let pods = bounded("listing the node's pods", cluster.node_pods(node)).await?;
    let mut facts = PassFacts {
        registered,
        node_ready,
        ..PassFacts::default()
    };
    let mut budgets: BTreeMap<String, Vec<BudgetFacts>> = BTreeMap::new();
    for pod in &pods {
        let class = classify(pod, now, node_ready, forced, skip_wait_ms);
        match class {
            PodClass::Mirror => *facts.skipped.entry("mirror").or_default() += 1,
            PodClass::DaemonSet => *facts.skipped.entry("DaemonSet").or_default() += 1,
            PodClass::Abandoned => {
                *facts
                    .skipped
                    .entry("terminating on a node that cannot confirm")
                    .or_default() += 1
            }
            PodClass::Terminating => facts.blocking.push(pod.key()),
            PodClass::Evict => {
                facts.blocking.push(pod.key());
                if forced {
                    bounded(
                        "deleting a pod",
                        cluster.delete_pod(&pod.namespace, &pod.name),
                    )
                    .await?;
                    facts.deleted.push(pod.key());
                    continue;
                }
                match bounded(
                    "evicting a pod",
                    cluster.evict_pod(&pod.namespace, &pod.name),
                )
                .await?
                {
                    Eviction::Evicted => facts.evicted.push(pod.key()),
                    Eviction::Gone => {}
                    Eviction::Refused(message) => {
                        if !budgets.contains_key(&pod.namespace) {
                            let found = bounded(
                                "listing PodDisruptionBudgets",
                                cluster.budgets(&pod.namespace),
                            )
                            .await?;
                            budgets.insert(pod.namespace.clone(), found);
                        }
                        let names = budgets
                            .get(&pod.namespace)
                            .map(|b| budgets_of(pod, b).into_iter().map(budget_label).collect())
                            .unwrap_or_default();
                        facts.refused.push(Refusal {
                            pod: pod.key(),
                            message,
                            budgets: names,
                        });
                    }
                }
            }
        }
    }
    Ok(facts)
}

/// What the caller of a drain does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// Drained: the machine may go.
    Done,
    /// Not yet: look again in this many ms.
    Wait(i64),
}

impl ControlPlane {
    /// One pass of the drain of `node` (of `instance` in `pool`) for
    /// `intent_id`: started (stored) on the first call, resumed after. The
    /// pool's `spec.drain` applies (the default when the pool is gone).
    pub async fn drain_step(
        &self,
        intent_id: i64,
        instance: &str,
        node: &str,
        pool: &str,
    ) -> Result<Progress> {
        if !self.cluster.attached() {
            return Ok(Progress::Done);
        }
        let spec = self
            .store
            .pool(pool)?
            .map(|p| p.pool.spec.drain)
            .unwrap_or_default();
        let record = self.store.start_drain(intent_id, instance, node, pool)?;
        if record.state == DrainState::Drained {
            return Ok(Progress::Done);
        }
        let now = now_ms();
        let forced = spec.forces() && timed_out(&spec, record.started_ms, now);
        let skip_wait_ms = self.settings.drain_skip_wait.as_millis() as i64;
        let facts = match pass(self.cluster.as_ref(), node, forced, now, skip_wait_ms).await {
            Ok(facts) => facts,
            Err(e) => {
                let mut failed = record.clone();
                failed.reason = Some(format!("the cluster's API failed: {e}"));
                self.store.update_drain(&failed, None)?;
                return Err(e);
            }
        };
        let next = advance(&record, &facts, &spec, now_ms());
        self.store
            .update_drain(&next.record, next.step.as_deref())?;
        for e in &next.events {
            self.store
                .add_event(e.kind, "Node", node, e.reason, &e.message)?;
        }
        if record.timed_out_ms.is_none() && next.record.timed_out_ms.is_some() && !spec.forces() {
            self.stop_rollout_at_drain_timeout(&next.record, spec.timeout_seconds, now)?;
        }
        if next.record.state == DrainState::Drained {
            tracing::info!(node, instance, "node drained");
            Ok(Progress::Done)
        } else {
            tracing::info!(node, instance, state = %next.record.state, reason = next.record.reason.as_deref().unwrap_or(""), "node draining");
            Ok(Progress::Wait(next.delay_ms))
        }
    }

    /// The drain of an out-of-date node (one a rollout replaces) that
    /// passed its timeout with `onTimeout: wait`: the rollout cannot go on,
    /// as a Deployment past its progress deadline. It is stopped
    /// (`ProgressDeadlineExceeded`, the node and what holds it named), so
    /// no other node is replaced; this drain goes on waiting, the node
    /// cordoned. Once, when the timeout passes: a resumed rollout is not
    /// stopped again by the same drain.
    fn stop_rollout_at_drain_timeout(
        &self,
        drain: &DrainRecord,
        timeout_seconds: i64,
        now: i64,
    ) -> Result<()> {
        let (Some(record), Some(instance)) = (
            self.store.pool(&drain.pool)?,
            self.store.instance(&drain.instance)?,
        ) else {
            return Ok(());
        };
        let spec = &record.pool.spec;
        if spec.update_strategy.on_delete() {
            return Ok(());
        }
        let current = crate::pools::rollout::current_hash(self, spec)?;
        let hashes = self.store.instance_hashes(Some(&drain.pool))?;
        if crate::pool_state::up_to_date(&instance, &hashes, &current) {
            return Ok(());
        }
        let pool = &drain.pool;
        let message = format!(
            "out-of-date node {} (instance {}) was not drained within spec.drain.timeoutSeconds ({timeout_seconds} s): {}; the rollout is stopped and no other node is replaced, this node stays cordoned while its drain goes on (knit rollout resume pool {pool} goes on, knit rollout undo pool {pool} goes back)",
            drain.node,
            drain.instance,
            drain.reason.as_deref().unwrap_or("pods left")
        );
        let stop = crate::store::RolloutStop {
            template_hash: current,
            reason: crate::pool_state::ROLLOUT_STOPPED_REASON.to_string(),
            message: message.clone(),
            stopped_ms: now,
        };
        if self.store.stop_rollout(pool, &stop)? {
            self.store.add_event(
                EventType::Warning,
                "NodePool",
                pool,
                crate::pool_state::ROLLOUT_STOPPED_REASON,
                &message,
            )?;
        }
        Ok(())
    }

    /// Drains `node` to the end, pass after pass, for a caller that has no
    /// intent to come back to (the snapshot builder). Past the pool's
    /// timeout with `onTimeout: wait` it gives up with the drain's reason:
    /// such a caller cannot keep a removal pending.
    pub async fn drain_to_end(&self, instance: &str, node: &str, pool: &str) -> Result<()> {
        loop {
            match self.drain_step(0, instance, node, pool).await? {
                Progress::Done => return Ok(()),
                Progress::Wait(ms) => {
                    let spec = self
                        .store
                        .pool(pool)?
                        .map(|p| p.pool.spec.drain)
                        .unwrap_or_default();
                    if let Some(d) = self.store.drain(instance)? {
                        if !spec.forces() && d.timed_out_ms.is_some() {
                            return Err(ServerError::Conflict(format!(
                                "node {node} was not drained within {} s: {}",
                                spec.timeout_seconds,
                                d.reason.unwrap_or_default()
                            )));
                        }
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(ms.max(100) as u64)).await;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
