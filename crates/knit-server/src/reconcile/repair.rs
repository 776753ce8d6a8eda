//! A node's health after it joined: the join timeout's bookkeeping and node
//! repair (a pool's `spec.repair`, as managed node pools' auto-repair and
//! Cluster API's MachineHealthCheck).
//!
//! The join timeout covers only the way to an instance's first Ready (its
//! first initialized, without a cluster); that moment is stored, and a node
//! the join timeout failed that becomes Ready later is Running again. After
//! that, only the repair policy acts on a node: a node not Ready for
//! `notReadyAfterSeconds` is unhealthy; its pool's `actions` are taken in
//! order (restart kubelet and containerd through the agent, reboot the
//! instance, replace it), waiting `waitAfterActionSeconds` after each, at
//! most `maxParallel` nodes at a time, and none at all while more than
//! `maxUnhealthy` of the pool are unhealthy. What to do is decided by the
//! pure [`decide_with`]; each step is stored before it is taken, so a restart
//! resumes at the same step and never takes one twice.

use crate::control::ControlPlane;
use crate::error::Result;
use crate::store::{InstanceHealth, InstanceRecord, NodeRecord};
use knit_api::state::{EventType, InstanceState, RepairAction};
use knit_api::RepairSpec;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

/// How long the agent may take to restart kubelet and containerd.
pub const RESTART_SERVICES_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a stop or a start of the instance may take, each.
pub const REBOOT_STEP_TIMEOUT: Duration = Duration::from_secs(300);

/// What [`decide_with`] sees of one Running instance of a pool.
#[derive(Debug, Clone)]
pub struct HealthView<'a> {
    pub instance: &'a str,
    /// Added by attach: never released by knit.
    pub added: bool,
    /// An intent or a repair runs on it now: counted, not acted on.
    pub busy: bool,
    pub health: &'a InstanceHealth,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RepairStep {
    /// Take `action`, the `index`-th of the policy, on `instance` now.
    Act {
        instance: String,
        action: RepairAction,
        index: usize,
    },
    /// Leave `instance` alone now; `reason` and `why` are its event (given
    /// once while the same).
    Hold {
        instance: String,
        reason: &'static str,
        why: String,
    },
}

/// Whether a joined node counts as unhealthy at `now`.
pub fn unhealthy(policy: &RepairSpec, h: &InstanceHealth, now: i64) -> bool {
    h.joined_ms.is_some()
        && h.unhealthy_since_ms
            .is_some_and(|since| now - since >= policy.not_ready_after_seconds * 1000)
}

/// What repair does now for one pool: `pool_size` instances count toward
/// it, `views` are its Running instances, and a rollout takes `taken_out`
/// of its nodes out of service (old ones being drained and released, ones
/// drained for an in-place update): they count against `maxUnhealthy` as
/// the unhealthy ones do, so that repair and rollout together never take
/// more of the pool than it allows. Pure: the caller stores and acts.
pub fn decide_with(
    policy: &RepairSpec,
    pool_size: usize,
    views: &[HealthView<'_>],
    taken_out: usize,
    now: i64,
) -> Vec<RepairStep> {
    if !policy.enabled {
        return Vec::new();
    }
    let mut sick: Vec<&HealthView<'_>> = views
        .iter()
        .filter(|v| unhealthy(policy, v.health, now))
        .collect();
    if sick.is_empty() {
        return Vec::new();
    }
    // A malformed value is refused by validation; here it allows nothing.
    let limit = policy.max_unhealthy.resolve(pool_size).unwrap_or(0);
    if sick.len() + taken_out > limit {
        let why = if taken_out == 0 {
            format!(
                "{} of the pool's {pool_size} nodes are unhealthy, more than maxUnhealthy {} ({limit}): no node is repaired until at most {limit} are (an outage of the control plane or the network must never repair a whole pool)",
                sick.len(),
                policy.max_unhealthy
            )
        } else {
            format!(
                "{} of the pool's {pool_size} nodes are unhealthy and a rollout takes {taken_out} out (replaced or drained for an in-place update), more than maxUnhealthy {} ({limit}) together: no node is repaired until the rollout's share and the unhealthy ones are at most {limit}",
                sick.len(),
                policy.max_unhealthy
            )
        };
        return sick
            .iter()
            .map(|v| RepairStep::Hold {
                instance: v.instance.to_string(),
                reason: "RepairPaused",
                why: why.clone(),
            })
            .collect();
    }
    let actions: Vec<RepairAction> = policy
        .actions
        .iter()
        .filter_map(|a| a.parse().ok())
        .collect();
    let wait_ms = policy.wait_after_action_seconds * 1000;
    let waiting = |v: &HealthView<'_>| {
        let h = v.health;
        v.busy || (h.repair_step > 0 && h.repair_at_ms.is_some_and(|at| now - at < wait_ms))
    };
    // Repairs under way (an action taken, its wait not over) hold a slot.
    let mut busy = sick.iter().filter(|v| waiting(v)).count();
    let max_parallel = policy.max_parallel.max(1) as usize;
    sick.sort_by(|a, b| {
        a.health
            .unhealthy_since_ms
            .cmp(&b.health.unhealthy_since_ms)
            .then(a.instance.cmp(b.instance))
    });
    let mut steps = Vec::new();
    for v in sick {
        if waiting(v) {
            continue;
        }
        let index = v.health.repair_step.max(0) as usize;
        let hold = |reason: &'static str, why: String| RepairStep::Hold {
            instance: v.instance.to_string(),
            reason,
            why,
        };
        let Some(&action) = actions.get(index) else {
            steps.push(hold(
                "RepairGaveUp",
                format!(
                    "every repair action was taken ({}) and the node is still not Ready: knit leaves it as it is",
                    policy.actions.join(", ")
                ),
            ));
            continue;
        };
        if action == RepairAction::Replace && v.added {
            steps.push(hold(
                "NotReplacing",
                "the next repair action is replace, but this instance was added by attach: knit never releases it; repair stops here (knit delete node NAME --release=false, then attach it again)".to_string(),
            ));
            continue;
        }
        if busy >= max_parallel {
            steps.push(hold(
                "RepairWaiting",
                format!("{busy} repair(s) under way, maxParallel {max_parallel}: waits its turn"),
            ));
            continue;
        }
        busy += 1;
        steps.push(RepairStep::Act {
            instance: v.instance.to_string(),
            action,
            index,
        });
    }
    steps
}

/// An instance's nodes: joined (Ready, or initialized without a cluster)
/// and Ready now.
fn node_state(mine: &[&NodeRecord], attached: bool) -> (bool, bool) {
    let mut joined = false;
    let mut ready = false;
    for n in mine {
        ready |= n.status == knit_api::state::NodeStatus::Ready;
        joined |= n.status == knit_api::state::NodeStatus::Ready || (!attached && n.initialized());
    }
    (joined, ready)
}

/// The health record of `instance` after what is seen `now`: the first
/// join, since when not Ready, the end of a repair episode. Pure.
pub fn observe(
    before: &InstanceHealth,
    joined_now: bool,
    ready_now: bool,
    attached: bool,
    now: i64,
) -> InstanceHealth {
    let mut h = before.clone();
    if joined_now && h.joined_ms.is_none() {
        h.joined_ms = Some(now);
    }
    if h.joined_ms.is_some() && attached {
        if ready_now {
            h.unhealthy_since_ms = None;
            h.repair_step = 0;
            h.repair_action = None;
            h.repair_at_ms = None;
            h.repair_note = None;
        } else if h.unhealthy_since_ms.is_none() {
            h.unhealthy_since_ms = Some(now);
        }
    }
    h
}

/// The last 400 characters of a command's stderr (its stdout when it
/// printed nothing there): events stay short, the end says what failed.
fn output_tail(stdout: &[u8], stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(if stderr.is_empty() { stdout } else { stderr });
    let chars: Vec<char> = text.trim().chars().collect();
    chars[chars.len().saturating_sub(400)..].iter().collect()
}

/// A repair action to take outside the plan lock.
pub struct RepairJob {
    pub instance: String,
    pub provider_id: String,
    pub action: RepairAction,
}

impl ControlPlane {
    /// Records each Running or Failed instance's first join and whether it
    /// is Ready now; a node the join timeout failed that is Ready (joined)
    /// now is Running again. Runs under the plan lock.
    pub(crate) fn track_health(
        &self,
        instances: &[InstanceRecord],
        nodes: &[NodeRecord],
        health: &mut HashMap<String, InstanceHealth>,
        now: i64,
    ) -> Result<()> {
        let attached = self.cluster.attached();
        let by_instance = crate::store::nodes_by_instance(nodes);
        for i in instances
            .iter()
            .filter(|i| i.state == InstanceState::Running || i.state == InstanceState::Failed)
        {
            let mine = by_instance
                .get(i.name.as_str())
                .map_or(&[][..], Vec::as_slice);
            let (joined, ready) = node_state(mine, attached);
            let before = health.get(&i.name).cloned().unwrap_or(InstanceHealth {
                instance: i.name.clone(),
                ..InstanceHealth::default()
            });
            let mut after = observe(&before, joined, ready, attached, now);
            if attached && !i.added && before.joined_ms.is_none() && after.joined_ms.is_some() {
                self.metrics.node_startup(
                    crate::metrics::StartupStage::Ready,
                    &i.pool,
                    self.provider.as_ref().map_or("none", |p| p.name()),
                    i.created_ms,
                    now,
                );
            }
            if before.repair_step > 0 && after.repair_step == 0 {
                self.store.add_event(
                    EventType::Normal,
                    "Instance",
                    &i.name,
                    "Repaired",
                    &format!(
                        "node Ready again after repair action {} ({})",
                        before.repair_step,
                        before.repair_action.map_or("-", RepairAction::as_str)
                    ),
                )?;
            }
            // Failed by the join timeout: recorded, or (failed before the
            // time was stored) told by its message.
            let join_failed = after.join_failed_ms.is_some()
                || i.last_error
                    .as_deref()
                    .is_some_and(|e| e.starts_with(crate::reconcile::JOIN_TIMEOUT_MESSAGE_START));
            if i.state == InstanceState::Failed && join_failed && joined {
                after.join_failed_ms = None;
                self.store
                    .set_instance_state(&i.name, InstanceState::Running, None)?;
                self.store.add_event(
                    EventType::Normal,
                    "Instance",
                    &i.name,
                    "Recovered",
                    "its node is Ready after the join timeout marked it Failed: Running again",
                )?;
            }
            if after != before {
                self.store.put_instance_health(&after)?;
                health.insert(i.name.clone(), after);
            }
        }
        Ok(())
    }

    /// Decides the repairs of one pool and stores them (each step before it
    /// is taken; a replace is a delete intent). Runs under the plan lock;
    /// the returned jobs run outside it.
    pub(crate) fn plan_repairs(
        &self,
        pool: &knit_api::NodePool,
        instances: &[InstanceRecord],
        health: &HashMap<String, InstanceHealth>,
        busy: &HashSet<String>,
        now: i64,
    ) -> Result<Vec<RepairJob>> {
        let policy = &pool.spec.repair;
        if !policy.enabled {
            return Ok(Vec::new());
        }
        let pool_size = instances
            .iter()
            .filter(|i| crate::pool_state::counts_toward_pool(&i.state))
            .count();
        let running: Vec<&InstanceRecord> = instances
            .iter()
            .filter(|i| i.state == InstanceState::Running && health.contains_key(&i.name))
            .collect();
        let views: Vec<HealthView<'_>> = running
            .iter()
            .map(|i| HealthView {
                instance: &i.name,
                added: i.added,
                busy: busy.contains(&i.name),
                health: &health[&i.name],
            })
            .collect();
        let mut jobs = Vec::new();
        let mut paused_noted = false;
        // The nodes a rollout takes out now: out-of-date ones being
        // removed, and ones updated in place. Only asked with a node
        // unhealthy (without one nothing is decided), not every pass.
        let taken_out = if views.iter().any(|v| unhealthy(policy, v.health, now)) {
            let current = crate::pools::rollout::current_hash(self, &pool.spec)?;
            let hashes = self.store.instance_hashes(Some(&pool.metadata.name))?;
            let updating = crate::reconcile::in_place::updating();
            instances
                .iter()
                .filter(|i| {
                    (i.state == InstanceState::Deleting
                        && !crate::pool_state::up_to_date(i, &hashes, &current))
                        || (crate::pool_state::counts_toward_pool(&i.state)
                            && updating.contains(&i.name))
                })
                .count()
        } else {
            0
        };
        for step in decide_with(policy, pool_size, &views, taken_out, now) {
            match step {
                RepairStep::Hold {
                    instance,
                    reason,
                    why,
                } => {
                    let mut h = health[&instance].clone();
                    let note = format!("{reason}: {why}");
                    if h.repair_note.as_deref() == Some(note.as_str()) {
                        continue;
                    }
                    h.repair_note = Some(note);
                    self.store.put_instance_health(&h)?;
                    // One pool event for a pause, not one per node.
                    if reason == "RepairPaused" {
                        if !paused_noted {
                            paused_noted = true;
                            self.store.add_event(
                                EventType::Warning,
                                "NodePool",
                                &pool.metadata.name,
                                reason,
                                &why,
                            )?;
                        }
                    } else {
                        self.store.add_event(
                            EventType::Warning,
                            "Instance",
                            &instance,
                            reason,
                            &why,
                        )?;
                    }
                }
                RepairStep::Act {
                    instance,
                    action,
                    index,
                } => {
                    let record = running
                        .iter()
                        .find(|i| i.name == instance)
                        .copied()
                        .cloned();
                    let Some(record) = record else { continue };
                    let mut h = health[&instance].clone();
                    let since = h.unhealthy_since_ms.unwrap_or(now);
                    h.repair_step = index as i64 + 1;
                    h.repair_action = Some(action);
                    h.repair_at_ms = Some(now);
                    h.repair_note = None;
                    self.store.put_instance_health(&h)?;
                    self.store.add_event(
                        EventType::Warning,
                        "Instance",
                        &instance,
                        "Repairing",
                        &format!(
                            "node not Ready for {} s (notReadyAfterSeconds {}): repair action {}/{}: {}",
                            (now - since) / 1000,
                            policy.not_ready_after_seconds,
                            index + 1,
                            policy.actions.len(),
                            action.as_str()
                        ),
                    )?;
                    if action == RepairAction::Replace {
                        // `decide_with` never replaces an added instance; checked
                        // again here because releasing one is irreversible.
                        if record.added {
                            continue;
                        }
                        self.store.add_delete_intents(
                            &pool.metadata.name,
                            std::slice::from_ref(&instance),
                            true,
                        )?;
                        self.store.add_event(
                            EventType::Normal,
                            "Instance",
                            &instance,
                            "RepairReplacing",
                            "repair: releasing it; a new instance follows",
                        )?;
                        continue;
                    }
                    match record.provider_id {
                        Some(provider_id) => jobs.push(RepairJob {
                            instance,
                            provider_id,
                            action,
                        }),
                        None => self.store.add_event(
                            EventType::Warning,
                            "Instance",
                            &instance,
                            "RepairActionFailed",
                            &format!("{}: the instance has no provider id", action.as_str()),
                        )?,
                    }
                }
            }
        }
        Ok(jobs)
    }

    /// Every pool's repairs at `now`: decided and stored under the plan
    /// lock, then each action runs in its own task (never two for the same
    /// instance, never beside an intent on it), so one slow instance holds
    /// up no other. The handles let a caller wait for them.
    pub async fn repair_all_at(
        self: &Arc<Self>,
        now: i64,
    ) -> Result<Vec<tokio::task::JoinHandle<()>>> {
        if self.provider.is_none() {
            return Ok(Vec::new());
        }
        let mut jobs = Vec::new();
        {
            let _guard = self.plan_lock.lock().await;
            let nodes = self.store.nodes()?;
            let mut health = self.store.instance_health()?;
            for record in self.store.pools()? {
                if record.deleting {
                    continue;
                }
                let instances = self.store.instances(Some(&record.pool.metadata.name))?;
                self.track_health(&instances, &nodes, &mut health, now)?;
                // An instance with an intent or a repair under way is left
                // for a later pass.
                let busy: HashSet<String> = self
                    .in_flight
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .clone();
                jobs.extend(self.plan_repairs(&record.pool, &instances, &health, &busy, now)?);
            }
        }
        let mut handles = Vec::new();
        for job in jobs {
            {
                let mut in_flight = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
                if !in_flight.insert(job.instance.clone()) {
                    continue;
                }
            }
            let cp = Arc::clone(self);
            handles.push(crate::ha::spawn(async move {
                cp.run_repair(&job).await;
                cp.in_flight
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&job.instance);
            }));
        }
        Ok(handles)
    }

    /// Runs `knit-agent init` again after a reboot: it finds every phase
    /// done and starts the services that are not running (services under
    /// the agent's own supervisor, as on the local cloud, do not come back
    /// by themselves; systemd units do, and init leaves them be).
    async fn restart_after_reboot(
        &self,
        provider: &dyn crate::provider::Provider,
        job: &RepairJob,
    ) -> std::result::Result<String, String> {
        let dir = crate::userdata::BOOTSTRAP_DIR;
        let argv = vec![
            "/bin/sh".to_string(),
            "-c".to_string(),
            format!("exec {dir}/knit-agent init --config {dir}/node-config.yaml"),
        ];
        let rebooted = format!("instance {} rebooted", job.provider_id);
        match tokio::time::timeout(REBOOT_STEP_TIMEOUT, provider.exec(&job.provider_id, &argv))
            .await
        {
            Err(_) => Err(format!(
                "{rebooted}; knit-agent init did not finish within {} s",
                REBOOT_STEP_TIMEOUT.as_secs()
            )),
            Ok(Err(e)) => Err(format!("{rebooted}; cannot run knit-agent init: {e}")),
            Ok(Ok((0, _, _))) => Ok(format!("{rebooted}; knit-agent init ran again")),
            Ok(Ok((code, stdout, stderr))) => Err(format!(
                "{rebooted}; knit-agent init exited with {code}: {}",
                output_tail(&stdout, &stderr)
            )),
        }
    }

    async fn run_repair(&self, job: &RepairJob) {
        let Ok(provider) = self.provider() else {
            return;
        };
        let outcome: std::result::Result<String, String> = match job.action {
            RepairAction::RestartServices => {
                let argv = vec![
                    "/bin/sh".to_string(),
                    "-c".to_string(),
                    format!(
                        "exec {}/knit-agent restart-services",
                        crate::userdata::BOOTSTRAP_DIR
                    ),
                ];
                match tokio::time::timeout(
                    RESTART_SERVICES_TIMEOUT,
                    provider.exec(&job.provider_id, &argv),
                )
                .await
                {
                    Err(_) => Err(format!(
                        "knit-agent restart-services did not finish within {} s",
                        RESTART_SERVICES_TIMEOUT.as_secs()
                    )),
                    Ok(Err(e)) => Err(format!("cannot run knit-agent restart-services: {e}")),
                    Ok(Ok((0, _, _))) => Ok("kubelet and containerd restarted by the agent".into()),
                    Ok(Ok((code, stdout, stderr))) => Err(format!(
                        "knit-agent restart-services exited with {code}: {}",
                        output_tail(&stdout, &stderr)
                    )),
                }
            }
            RepairAction::Reboot => {
                match tokio::time::timeout(
                    REBOOT_STEP_TIMEOUT * 2,
                    provider.reboot(&job.provider_id),
                )
                .await
                {
                    Err(_) => Err(format!(
                        "the reboot did not finish within {} s",
                        (REBOOT_STEP_TIMEOUT * 2).as_secs()
                    )),
                    Ok(Err(e)) => Err(format!("reboot failed: {e}")),
                    Ok(Ok(())) => self.restart_after_reboot(provider.as_ref(), job).await,
                }
            }
            // Replacing is a delete intent, written under the plan lock.
            RepairAction::Replace => return,
        };
        let (kind, reason, message) = match outcome {
            Ok(m) => (EventType::Normal, "RepairActionDone", m),
            Err(m) => (EventType::Warning, "RepairActionFailed", m),
        };
        let message = format!(
            "{}: {message}; waiting for the node to be Ready before the next action",
            job.action.as_str()
        );
        if let Err(e) = self
            .store
            .add_event(kind, "Instance", &job.instance, reason, &message)
        {
            tracing::warn!(instance = %job.instance, error = %e, "recording a repair outcome failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use knit_api::IntOrPercent;

    const MIN: i64 = 60_000;

    /// [`decide_with`] with no rollout under way.
    fn decide(
        policy: &RepairSpec,
        pool_size: usize,
        views: &[HealthView<'_>],
        now: i64,
    ) -> Vec<RepairStep> {
        decide_with(policy, pool_size, views, 0, now)
    }

    fn policy() -> RepairSpec {
        RepairSpec {
            enabled: true,
            not_ready_after_seconds: 600,
            max_unhealthy: IntOrPercent::Text("50%".into()),
            max_parallel: 1,
            wait_after_action_seconds: 300,
            actions: vec!["restart-services".into(), "reboot".into(), "replace".into()],
        }
    }

    /// Joined at 0, not Ready since `since` (minutes), `step` actions
    /// taken, the last at `at` (minutes).
    fn health(since: Option<i64>, step: i64, at: Option<i64>) -> InstanceHealth {
        InstanceHealth {
            instance: String::new(),
            joined_ms: Some(0),
            unhealthy_since_ms: since.map(|m| m * MIN),
            repair_step: step,
            repair_at_ms: at.map(|m| m * MIN),
            ..InstanceHealth::default()
        }
    }

    fn view<'a>(name: &'a str, h: &'a InstanceHealth) -> HealthView<'a> {
        HealthView {
            instance: name,
            added: false,
            busy: false,
            health: h,
        }
    }

    fn act(name: &str, action: RepairAction, index: usize) -> RepairStep {
        RepairStep::Act {
            instance: name.into(),
            action,
            index,
        }
    }

    fn reasons(steps: &[RepairStep]) -> Vec<&'static str> {
        steps
            .iter()
            .map(|s| match s {
                RepairStep::Act { .. } => "Act",
                RepairStep::Hold { reason, .. } => reason,
            })
            .collect()
    }

    #[test]
    fn actions_go_in_order_with_a_wait_after_each() {
        let p = policy();
        let healthy = health(None, 0, None);
        let fresh = health(Some(100), 0, None);
        // Not Ready 5 min: not yet unhealthy.
        assert_eq!(
            decide(&p, 2, &[view("a", &fresh), view("b", &healthy)], 105 * MIN),
            vec![]
        );
        assert_eq!(
            decide(&p, 2, &[view("a", &fresh), view("b", &healthy)], 110 * MIN),
            vec![act("a", RepairAction::RestartServices, 0)]
        );
        let restarted = health(Some(100), 1, Some(110));
        assert_eq!(decide(&p, 2, &[view("a", &restarted)], 114 * MIN), vec![]);
        assert_eq!(
            decide(&p, 2, &[view("a", &restarted)], 115 * MIN),
            vec![act("a", RepairAction::Reboot, 1)]
        );
        let rebooted = health(Some(100), 2, Some(115));
        assert_eq!(
            decide(&p, 2, &[view("a", &rebooted)], 120 * MIN),
            vec![act("a", RepairAction::Replace, 2)]
        );
        let mut short = policy();
        short.actions = vec!["reboot".into()];
        let done = health(Some(100), 1, Some(110));
        assert_eq!(
            reasons(&decide(&short, 2, &[view("a", &done)], 120 * MIN)),
            vec!["RepairGaveUp"]
        );
    }

    #[test]
    fn never_before_the_first_join_and_never_when_off() {
        let p = policy();
        let mut never_joined = health(Some(0), 0, None);
        never_joined.joined_ms = None;
        assert_eq!(
            decide(&p, 1, &[view("a", &never_joined)], 999 * MIN),
            vec![]
        );
        let sick = health(Some(0), 0, None);
        let off = RepairSpec {
            enabled: false,
            ..policy()
        };
        assert_eq!(decide(&off, 1, &[view("a", &sick)], 999 * MIN), vec![]);
    }

    #[test]
    fn a_rollout_s_removals_count_against_max_unhealthy() {
        let p = policy(); // 50%
        let sick = health(Some(0), 0, None);
        let ok = health(None, 0, None);
        let one_of_four = [
            view("a", &sick),
            view("b", &ok),
            view("c", &ok),
            view("d", &ok),
        ];
        // Alone, one of four is repaired.
        assert_eq!(
            reasons(&decide_with(&p, 4, &one_of_four, 0, 60 * MIN)),
            vec!["Act"]
        );
        // A rollout taking one out: two of four, within 50%.
        assert_eq!(
            reasons(&decide_with(&p, 4, &one_of_four, 1, 60 * MIN)),
            vec!["Act"]
        );
        // Taking two out: three of four together, more than 50%: paused,
        // the message says why.
        let steps = decide_with(&p, 4, &one_of_four, 2, 60 * MIN);
        assert_eq!(reasons(&steps), vec!["RepairPaused"]);
        match &steps[0] {
            RepairStep::Hold { why, .. } => {
                assert!(why.contains("a rollout takes 2 out"), "{why}")
            }
            other => panic!("{other:?}"),
        }
        // Nothing sick: nothing to hold, whatever the rollout does.
        assert_eq!(decide_with(&p, 4, &[view("b", &ok)], 4, 60 * MIN), vec![]);
    }

    #[test]
    fn more_unhealthy_than_max_unhealthy_pauses_every_repair() {
        let p = policy(); // 50%
        let sick = health(Some(0), 0, None);
        let ok = health(None, 0, None);
        let three_of_four = [
            view("a", &sick),
            view("b", &sick),
            view("c", &sick),
            view("d", &ok),
        ];
        let steps = decide(&p, 4, &three_of_four, 60 * MIN);
        assert_eq!(reasons(&steps), vec!["RepairPaused"; 3]);
        match &steps[0] {
            RepairStep::Hold { why, .. } => {
                assert!(why.contains("3 of the pool's 4"), "{why}")
            }
            other => panic!("{other:?}"),
        }
        // Two of four is within 50%: one at a time (maxParallel 1).
        let two_of_four = [view("a", &sick), view("b", &sick), view("d", &ok)];
        assert_eq!(
            reasons(&decide(&p, 4, &two_of_four, 60 * MIN)),
            vec!["Act", "RepairWaiting"]
        );
        let mut count = policy();
        count.max_unhealthy = IntOrPercent::Count(0);
        assert_eq!(
            reasons(&decide(&count, 4, &[view("a", &sick)], 60 * MIN)),
            vec!["RepairPaused"]
        );
    }

    #[test]
    fn max_parallel_counts_repairs_under_way() {
        let mut p = policy();
        p.max_unhealthy = IntOrPercent::Text("100%".into());
        p.max_parallel = 2;
        let waiting = health(Some(0), 1, Some(55));
        let sick = health(Some(1), 0, None);
        let later = health(Some(2), 0, None);
        let steps = decide(
            &p,
            3,
            &[view("c", &later), view("a", &waiting), view("b", &sick)],
            58 * MIN,
        );
        // a holds one slot; b (not Ready longer than c) takes the other.
        assert_eq!(
            steps,
            vec![
                act("b", RepairAction::RestartServices, 0),
                RepairStep::Hold {
                    instance: "c".into(),
                    reason: "RepairWaiting",
                    why: "2 repair(s) under way, maxParallel 2: waits its turn".into()
                }
            ]
        );
    }

    #[test]
    fn an_added_instance_is_never_replaced() {
        let p = policy();
        let rebooted = health(Some(0), 2, Some(10));
        let v = HealthView {
            instance: "mine",
            added: true,
            busy: false,
            health: &rebooted,
        };
        assert_eq!(
            reasons(&decide(&p, 2, &[v], 60 * MIN)),
            vec!["NotReplacing"]
        );
        let fresh = health(Some(0), 0, None);
        let v = HealthView {
            instance: "mine",
            added: true,
            busy: false,
            health: &fresh,
        };
        assert_eq!(
            decide(&p, 2, &[v], 60 * MIN),
            vec![act("mine", RepairAction::RestartServices, 0)],
            "restart and reboot are fine on an added instance"
        );
    }

    #[test]
    fn observe_records_the_first_join_and_ends_an_episode_when_ready() {
        let start = InstanceHealth::default();
        let h = observe(&start, false, false, true, 5);
        assert_eq!(h, start, "nothing before the first join");
        let h = observe(&h, true, true, true, 10);
        assert_eq!((h.joined_ms, h.unhealthy_since_ms), (Some(10), None));
        let h = observe(&h, false, false, true, 20);
        assert_eq!(h.unhealthy_since_ms, Some(20));
        let h = observe(&h, false, false, true, 30);
        assert_eq!(h.unhealthy_since_ms, Some(20), "kept from the first sight");
        let mut h = h;
        h.repair_step = 2;
        h.repair_action = Some(RepairAction::Reboot);
        let h = observe(&h, true, true, true, 40);
        assert_eq!(
            (h.joined_ms, h.unhealthy_since_ms, h.repair_step),
            (Some(10), None, 0)
        );
        // Without a cluster there is no Ready to lose.
        let alone = observe(&InstanceHealth::default(), true, false, false, 50);
        assert_eq!(
            (alone.joined_ms, alone.unhealthy_since_ms),
            (Some(50), None)
        );
    }
}
