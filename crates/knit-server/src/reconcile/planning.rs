//! Planning every pool under the plan lock: the join timeout, the pool's
//! plan turned into intents, scale requests.

use crate::control::ControlPlane;
use crate::error::{Result, ServerError};
use crate::pki;
use crate::store::{now_ms, InstanceHealth, InstanceRecord, NodeRecord};
use knit_api::state::{EventType, InstanceState};
use std::time::Instant;

use super::plan::{plan, NodeFacts, Plan};
use super::rollout::{plan_rollout, Mode, RolloutInput, RolloutPlan};
use crate::cluster::pods::PodFacts;
use crate::pool_state::{counts_toward_pool, up_to_date, ROLLOUT_STOPPED_REASON};
use crate::store::RolloutStop;
use std::collections::{HashMap, HashSet};

/// The reason of the event a completed rollout gives.
pub const ROLLOUT_COMPLETE_REASON: &str = "RolloutComplete";

/// Pools whose rollout this process saw under way (to the template hash),
/// until it completes.
static ROLLING: std::sync::LazyLock<std::sync::Mutex<HashMap<String, String>>> =
    std::sync::LazyLock::new(Default::default);

/// Whether this process saw `pool`'s rollout under way (and has not yet
/// said it completed).
fn rollout_seen(pool: &str) -> bool {
    ROLLING
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .contains_key(pool)
}

/// Pods a drain would evict (not mirror, not DaemonSet, not already
/// being deleted), counted by node.
pub fn evictable_by_node(pods: &[PodFacts]) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for p in pods {
        if !p.mirror && !p.daemon_set && p.deletion_ms.is_none() && !p.node.is_empty() {
            *counts.entry(p.node.clone()).or_insert(0) += 1;
        }
    }
    counts
}

/// What scale-in knows of each instance's node: Ready (as last read from
/// the cluster) and, when the pods were listed, how many it would evict.
fn node_facts(
    nodes: &[NodeRecord],
    pods: Option<&HashMap<String, usize>>,
) -> HashMap<String, NodeFacts> {
    let mut facts: HashMap<String, NodeFacts> = HashMap::new();
    for n in nodes {
        let f = facts.entry(n.instance.clone()).or_default();
        f.ready |= n.status == knit_api::state::NodeStatus::Ready;
        if let Some(counts) = pods {
            let here = counts.get(&n.name).copied().unwrap_or(0);
            f.evictable_pods = Some(f.evictable_pods.unwrap_or(0) + here);
        }
    }
    facts
}
use super::JOIN_TIMEOUT_MESSAGE_START;

/// A pool with nothing for the planner to do until something changes: its
/// size reached, every instance Running with its node Ready (or detached),
/// none of them unhealthy, failed to join or being repaired.
fn pool_settled(
    desired: usize,
    instances: &[InstanceRecord],
    facts: &HashMap<String, NodeFacts>,
    health: &HashMap<String, InstanceHealth>,
) -> bool {
    let live: Vec<&InstanceRecord> = instances
        .iter()
        .filter(|i| i.state != InstanceState::Detached)
        .collect();
    live.len() == desired
        && live.iter().all(|i| {
            i.state == InstanceState::Running
                && facts.get(&i.name).is_some_and(|f| f.ready)
                && health.get(&i.name).is_none_or(|h| {
                    h.unhealthy_since_ms.is_none()
                        && h.join_failed_ms.is_none()
                        && h.repair_action.is_none()
                })
        })
}

/// `<pool>-<5 random chars>`: unique, short, a valid hostname label.
fn new_instance_name(pool: &str) -> Result<String> {
    Ok(format!("{pool}-{}", pki::random_lower_alnum(5)?))
}

impl ControlPlane {
    /// Plans every pool and writes the resulting intents. Serialized with the
    /// API's own planning so two planners never double-count. True when
    /// every pool is settled (see `pool_settled`): nothing for the planner
    /// to do until something changes.
    pub async fn plan_all(&self) -> Result<bool> {
        self.plan_all_at(now_ms()).await
    }

    /// [`ControlPlane::plan_all`] as if the time were `now` (ms): the join
    /// timeout and the node health it records are judged at `now`.
    pub async fn plan_all_at(&self, now: i64) -> Result<bool> {
        let started = Instant::now();
        // Asked of the cluster before the plan lock (no lock across I/O),
        // and only when some pool has more instances than it wants.
        let pods = if self.scale_in_pending()? {
            self.evictable_pod_counts().await
        } else {
            None
        };
        let _guard = self.plan_lock.lock().await;
        self.store.prune_instance_health()?;
        let nodes = self.store.nodes()?;
        let facts = node_facts(&nodes, pods.as_ref());
        let mut health = self.store.instance_health()?;
        let mut settled = true;
        for record in self.store.pools()? {
            let name = record.pool.metadata.name.clone();
            let desired = if record.deleting {
                0
            } else {
                record.pool.spec.replicas.max(0) as usize
            };
            let mut instances = self.store.instances(Some(&name))?;
            self.track_health(&instances, &nodes, &mut health, now)?;
            if self.check_join_timeouts(&record.pool, &instances, &nodes, &mut health, now)? {
                instances = self.store.instances(Some(&name))?;
            }
            if record.deleting {
                let p = plan(desired, &instances, &facts);
                self.apply_plan(&record.pool, &p, true)?;
            } else {
                let (rp, outdated) =
                    self.rollout_plan(&record.pool, &instances, &nodes, &facts, &health, now)?;
                self.apply_rollout(&record.pool, &rp, true)?;
                // From what this pass read: what it just changed shows in
                // the next pass's (a completion is noted a pass later).
                // Only while a rollout is under way or was seen so: the
                // status it needs reads the pool's nodes and revisions.
                if outdated || rollout_seen(&name) {
                    self.note_rollout_progress(&record, &instances, &nodes)?;
                }
                settled &= !outdated
                    && !rollout_seen(&name)
                    && pool_settled(desired, &instances, &facts, &health);
                if record.observed_generation != record.generation {
                    self.store
                        .set_observed_generation(&name, record.generation)?;
                }
            }
            settled &= !record.deleting;
            if record.deleting && instances.iter().all(|i| i.state == InstanceState::Detached) {
                self.store.remove_pool(&name)?;
                self.store.add_event(
                    EventType::Normal,
                    "NodePool",
                    &name,
                    "Deleted",
                    "pool deleted: no instances left",
                )?;
            }
        }
        self.metrics
            .reconcile_duration(started.elapsed().as_secs_f64());
        Ok(settled)
    }

    /// A running instance whose node is not initialized (or Ready) within the
    /// pool's join timeout is marked Failed with its last phase; with
    /// `autoReplace` it is released and the planner makes a new one. Only
    /// the way to the first Ready: an instance whose node joined once is
    /// never failed here (node repair, `spec.repair`, is what applies then).
    fn check_join_timeouts(
        &self,
        pool: &knit_api::NodePool,
        instances: &[InstanceRecord],
        nodes: &[NodeRecord],
        health: &mut std::collections::HashMap<String, InstanceHealth>,
        now: i64,
    ) -> Result<bool> {
        let timeout_ms = pool.spec.join_timeout_seconds * 1000;
        let late: Vec<&InstanceRecord> = instances
            .iter()
            .filter(|i| {
                i.state == InstanceState::Running
                    && now - i.created_ms > timeout_ms
                    && health.get(&i.name).is_none_or(|h| h.joined_ms.is_none())
            })
            .collect();
        if late.is_empty() {
            return Ok(false);
        }
        let mut changed = false;
        for i in late {
            let node = nodes.iter().find(|n| n.instance == i.name);
            // Joining a cluster, a node is done when Ready; otherwise when
            // the agent finished.
            let attached = self.cluster.attached();
            if node.is_some_and(|n| {
                n.status == knit_api::state::NodeStatus::Ready || (!attached && n.initialized())
            }) {
                continue;
            }
            let last = match node {
                Some(n) => format!(
                    "last phase {} {}{}",
                    n.phase.map_or("-", |p| p.as_str()),
                    n.phase_outcome.map_or("-", |o| o.as_str()),
                    n.error.as_deref().map(|e| format!(": {e}")).unwrap_or_default()
                ),
                None => "the agent never reported (check the instance's user-data log: knit logs node NAME --file user-data)".to_string(),
            };
            let message = format!(
                "{JOIN_TIMEOUT_MESSAGE_START}{} s after creation; {last}",
                pool.spec.join_timeout_seconds
            );
            let message = crate::attach::diagnose(self, &i.name, message);
            self.store
                .set_instance_state(&i.name, InstanceState::Failed, Some(&message))?;
            // Remembered, so that the node Ready later is Running again.
            let mut h = health.get(&i.name).cloned().unwrap_or(InstanceHealth {
                instance: i.name.clone(),
                ..InstanceHealth::default()
            });
            h.join_failed_ms = Some(now);
            self.store.put_instance_health(&h)?;
            health.insert(i.name.clone(), h);
            self.store.add_event(
                EventType::Warning,
                "Instance",
                &i.name,
                "JoinTimeout",
                &message,
            )?;
            if pool.spec.auto_replace && i.added {
                self.store.add_event(
                    EventType::Normal,
                    "Instance",
                    &i.name,
                    "NotReplacing",
                    "autoReplace does not apply to an instance added by attach: knit never releases it; it stays Failed (knit delete node NAME --release=false, then attach it again)",
                )?;
            } else if pool.spec.auto_replace {
                self.store.add_delete_intents(
                    &pool.metadata.name,
                    std::slice::from_ref(&i.name),
                    true,
                )?;
                self.store.add_event(
                    EventType::Normal,
                    "Instance",
                    &i.name,
                    "Replacing",
                    "autoReplace: releasing it; a new instance follows",
                )?;
            }
            changed = true;
        }
        Ok(changed)
    }

    /// Plans one pool now (after a scale request) with the caller's choice
    /// of releasing or keeping removed instances.
    pub async fn plan_pool(&self, pool_name: &str, release: bool) -> Result<Plan> {
        let pods = match self.store.pool(pool_name)? {
            Some(r) if self.shrinks(pool_name, r.pool.spec.replicas)? => {
                self.evictable_pod_counts().await
            }
            _ => None,
        };
        let _guard = self.plan_lock.lock().await;
        let facts = node_facts(&self.store.nodes()?, pods.as_ref());
        let record = self
            .store
            .pool(pool_name)?
            .ok_or_else(|| ServerError::NotFound {
                kind: "pool",
                name: pool_name.to_string(),
            })?;
        let instances = self.store.instances(Some(pool_name))?;
        let p = plan(
            record.pool.spec.replicas.max(0) as usize,
            &instances,
            &facts,
        );
        self.apply_plan(&record.pool, &p, release)?;
        self.wake.notify_one();
        Ok(p)
    }

    /// Sets a pool's desired count and plans it with the caller's choice of
    /// releasing removed instances, all under the plan lock: the reconciler
    /// can never plan the new count first with its own choice (release).
    /// `check` sees the changed pool before it is stored (quota). Returns
    /// the count before.
    pub async fn scale_pool(
        &self,
        pool_name: &str,
        replicas: i64,
        release: bool,
        check: impl FnOnce(&knit_api::NodePool) -> Result<()>,
    ) -> Result<(i64, Plan)> {
        let pods = if self.shrinks(pool_name, replicas)? {
            self.evictable_pod_counts().await
        } else {
            None
        };
        let _guard = self.plan_lock.lock().await;
        let facts = node_facts(&self.store.nodes()?, pods.as_ref());
        let mut pool = self.store.live_pool(pool_name)?.pool;
        let from = pool.spec.replicas;
        pool.spec.replicas = replicas;
        pool.validate()?;
        check(&pool)?;
        self.store.update_pool(&pool)?;
        self.store.add_event(
            EventType::Normal,
            "NodePool",
            pool_name,
            "Scaled",
            &format!("replicas {from} -> {replicas}"),
        )?;
        let instances = self.store.instances(Some(pool_name))?;
        let nodes = self.store.nodes()?;
        let health = self.store.instance_health()?;
        let (rp, _) = self.rollout_plan(&pool, &instances, &nodes, &facts, &health, now_ms())?;
        self.apply_rollout(&pool, &rp, release)?;
        // In-place updates wait for the reconciler's pass (it starts them).
        self.wake.notify_one();
        let p = Plan {
            create: rp.create,
            delete: rp.scale_in.iter().chain(&rp.replace).cloned().collect(),
        };
        Ok((from, p))
    }

    /// Whether `pool` has more instances than `replicas`: only then does
    /// planning ask the cluster for pods (scale-in's choice).
    fn shrinks(&self, pool: &str, replicas: i64) -> Result<bool> {
        Ok(more_than(&self.store.instances(Some(pool))?, replicas))
    }

    /// Whether some pool has more instances than it wants (or is deleted),
    /// or has out-of-date ones (a rollout picks which goes as scale-in does).
    fn scale_in_pending(&self) -> Result<bool> {
        let version = self.cluster_doc()?.spec.kubernetes_version;
        for record in self.store.pools()? {
            let current = knit_api::update::pool_template_hash(&record.pool.spec, &version);
            let counts = self
                .store
                .instance_template_counts(&record.pool.metadata.name, &current)?;
            let (counted, out_of_date) = counts
                .iter()
                .filter(|(state, _)| counts_toward_pool(state))
                .fold((0, 0), |(n, old), (_, c)| {
                    (n + c.instances, old + c.out_of_date)
                });
            let desired = if record.deleting {
                0
            } else {
                record.pool.spec.replicas.max(0)
            };
            if out_of_date > 0 || counted > desired {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Pods a drain would evict, by node name, from one list of the
    /// cluster's pods; `None` without a cluster or when its API does not
    /// answer (scale-in then goes by readiness and age alone).
    async fn evictable_pod_counts(&self) -> Option<HashMap<String, usize>> {
        if !self.cluster.attached() {
            return None;
        }
        let pods = crate::provider::within(
            "cluster",
            "listing pods",
            crate::cluster::seam::CLUSTER_CALL_TIMEOUT,
            self.cluster.pods(),
        )
        .await;
        match pods {
            Ok(pods) => Some(evictable_by_node(&pods)),
            Err(e) => {
                tracing::warn!(error = %e, "listing pods for scale-in failed; choosing by readiness and age");
                None
            }
        }
    }

    /// The pool's plan with its rollout: the template hash new machines
    /// get, whether a rollout may go on (strategy, `spec.paused`, a stop
    /// by its progress deadline, recorded here when a replacement failed),
    /// which instances are available (Ready and initialized, no repair
    /// under way: rollouts and repair share the unavailable budget); and
    /// whether some instance counting toward the pool is out of date.
    fn rollout_plan(
        &self,
        pool: &knit_api::NodePool,
        instances: &[InstanceRecord],
        nodes: &[NodeRecord],
        facts: &HashMap<String, NodeFacts>,
        health: &HashMap<String, InstanceHealth>,
        now: i64,
    ) -> Result<(RolloutPlan, bool)> {
        let name = &pool.metadata.name;
        let spec = &pool.spec;
        let desired = spec.replicas.max(0) as usize;
        let version = self.cluster_doc()?.spec.kubernetes_version;
        let current = knit_api::update::pool_template_hash(spec, &version);
        let hashes = self.store.instance_hashes(Some(name))?;
        let attached = self.cluster.attached();
        let repairing: HashSet<String> = self
            .in_flight
            .lock()
            .map(|s| s.clone())
            .unwrap_or_else(|p| p.into_inner().clone());
        let by_instance = crate::store::nodes_by_instance(nodes);
        let available: HashSet<String> = instances
            .iter()
            .filter(|i| i.state == InstanceState::Running && !repairing.contains(&i.name))
            .filter(|i| {
                health
                    .get(&i.name)
                    .is_none_or(|h| h.unhealthy_since_ms.is_none())
            })
            .filter(|i| {
                by_instance.get(i.name.as_str()).is_some_and(|mine| {
                    mine.iter().any(|n| {
                        n.initialized()
                            && (!attached || n.status == knit_api::state::NodeStatus::Ready)
                    })
                })
            })
            .map(|i| i.name.clone())
            .collect();
        let outdated = instances
            .iter()
            .filter(|i| counts_toward_pool(&i.state))
            .any(|i| !up_to_date(i, &hashes, &current));
        let mut stop = self.store.rollout_stop(name)?;
        if stop.as_ref().is_some_and(|s| s.template_hash != current) {
            // A stop of an earlier template: a new rollout begins.
            self.store.clear_rollout_stop(name)?;
            stop = None;
        }
        let on_delete = spec.update_strategy.on_delete();
        if stop.is_none() && outdated && !on_delete && !spec.paused {
            let failed = instances.iter().find(|i| {
                hashes.get(&i.name).and_then(|h| h.as_deref()) == Some(current.as_str())
                    && (i.state == InstanceState::Failed
                        || (i.state == InstanceState::Deleting
                            && health
                                .get(&i.name)
                                .is_some_and(|h| h.join_failed_ms.is_some())))
            });
            if let Some(f) = failed {
                let message = format!(
                    "replacement {} did not come up (joinTimeoutSeconds {}): {}; the rollout is stopped and the out-of-date nodes are left alone (knit rollout resume pool {name} tries again, knit rollout undo pool {name} goes back)",
                    f.name,
                    spec.join_timeout_seconds,
                    f.last_error.as_deref().unwrap_or("failed")
                );
                let s = RolloutStop {
                    template_hash: current.clone(),
                    reason: ROLLOUT_STOPPED_REASON.to_string(),
                    message: message.clone(),
                    stopped_ms: now,
                };
                if self.store.stop_rollout(name, &s)? {
                    self.store.add_event(
                        EventType::Warning,
                        "NodePool",
                        name,
                        ROLLOUT_STOPPED_REASON,
                        &message,
                    )?;
                }
                stop = Some(s);
            }
        }
        let mode = if on_delete {
            Mode::OnDelete
        } else if spec.paused || stop.is_some() {
            Mode::Hold
        } else {
            Mode::Rolling
        };
        let updates = if mode == Mode::Rolling && outdated {
            self.in_place_candidates(pool, instances, &hashes, &current, &version)?
        } else {
            HashMap::new()
        };
        let in_place: HashMap<String, bool> =
            updates.iter().map(|(k, u)| (k.clone(), u.drain)).collect();
        let updating = super::in_place::updating();
        let plan = plan_rollout(&RolloutInput {
            desired,
            limits: spec.update_strategy.limits(desired),
            mode,
            current_hash: &current,
            instances,
            hashes: &hashes,
            facts,
            available: &available,
            removing: instances
                .iter()
                .filter(|i| i.state == InstanceState::Deleting)
                .count(),
            in_place: &in_place,
            updating: &updating,
        });
        if !plan.update_in_place.is_empty() {
            self.queue_in_place(
                pool,
                &plan.update_in_place,
                &updates,
                instances,
                nodes,
                &hashes,
                &current,
            )?;
        }
        Ok((plan, outdated))
    }

    /// Says when a pool's rollout is complete: an event (`RolloutComplete`)
    /// once every node is made from (or updated to) the current template
    /// and available, after a pass that saw the rollout under way. What
    /// is under way is this process's own: a rollout that completes while
    /// no server runs is not announced (its state, `knit rollout status`,
    /// says so all the same).
    fn note_rollout_progress(
        &self,
        record: &crate::store::PoolRecord,
        instances: &[InstanceRecord],
        nodes: &[NodeRecord],
    ) -> Result<()> {
        let name = &record.pool.metadata.name;
        let status = crate::pools::rollout::status_of(self, record, instances, nodes)?;
        let (Some(rollout), Some(current)) = (status.rollout, status.template_hash) else {
            return Ok(());
        };
        let mut rolling = ROLLING.lock().unwrap_or_else(|p| p.into_inner());
        if rollout.state != knit_api::views::ROLLOUT_COMPLETE {
            if rollout.outdated > 0 {
                rolling.insert(name.clone(), current);
            }
            return Ok(());
        }
        if rolling.remove(name).is_some() {
            self.store.add_event(
                EventType::Normal,
                "NodePool",
                name,
                ROLLOUT_COMPLETE_REASON,
                &format!(
                    "rollout complete: {} node(s) made from or updated to template {current}, all available",
                    rollout.updated
                ),
            )?;
        }
        Ok(())
    }

    /// Writes a rollout plan: creates and scale-in as any plan, and each
    /// replaced instance through its delete intent (drained first).
    fn apply_rollout(
        &self,
        pool: &knit_api::NodePool,
        rp: &RolloutPlan,
        release: bool,
    ) -> Result<()> {
        let p = Plan {
            create: rp.create,
            delete: rp.scale_in.clone(),
        };
        self.apply_plan(pool, &p, release)?;
        if rp.replace.is_empty() {
            return Ok(());
        }
        let name = &pool.metadata.name;
        let added = self.store.add_delete_intents(name, &rp.replace, true)?;
        if added > 0 {
            self.store.add_event(
                EventType::Normal,
                "NodePool",
                name,
                "RollingUpdate",
                &format!(
                    "replacing out-of-date instance(s) (drained, then released): {}",
                    rp.replace.join(", ")
                ),
            )?;
        }
        Ok(())
    }

    fn apply_plan(&self, pool: &knit_api::NodePool, p: &Plan, release: bool) -> Result<()> {
        let name = &pool.metadata.name;
        if p.create > 0 {
            let instance_type = pool
                .spec
                .instance_types
                .first()
                .cloned()
                .unwrap_or_default();
            let mut names = Vec::with_capacity(p.create);
            for _ in 0..p.create {
                names.push((new_instance_name(name)?, instance_type.clone()));
            }
            self.store.add_create_intents(name, &names)?;
            self.store.add_event(
                EventType::Normal,
                "NodePool",
                name,
                "ScaleOut",
                &format!(
                    "creating {} instance(s): {}",
                    p.create,
                    names
                        .iter()
                        .map(|n| n.0.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )?;
        }
        if !p.delete.is_empty() {
            // Instances added by attach are the user's machines: removed from
            // the pool and kept, never released by knit on its own.
            let users: std::collections::HashSet<String> = self
                .store
                .instances(Some(name))?
                .into_iter()
                .filter(|i| i.added)
                .map(|i| i.name)
                .collect();
            let (kept, ours): (Vec<String>, Vec<String>) =
                p.delete.iter().cloned().partition(|n| users.contains(n));
            if !kept.is_empty() && self.store.add_delete_intents(name, &kept, false)? > 0 {
                self.store.add_event(
                    EventType::Normal,
                    "NodePool",
                    name,
                    "KeepingAdded",
                    &format!(
                        "removing instance(s) added by attach from the pool: {}; they are kept, never released by knit (manual mode: put back as before the attach and left running; automatic mode: stopped); knit delete node NAME --release releases one explicitly",
                        kept.join(", ")
                    ),
                )?;
            }
            if ours.is_empty() {
                return Ok(());
            }
            let added = self.store.add_delete_intents(name, &ours, release)?;
            if added > 0 {
                self.store.add_event(
                    EventType::Normal,
                    "NodePool",
                    name,
                    "ScaleIn",
                    &format!(
                        "{} instance(s): {}",
                        if release {
                            "releasing"
                        } else {
                            "detaching (instance kept)"
                        },
                        ours.join(", ")
                    ),
                )?;
            }
        }
        Ok(())
    }
}

/// Whether more of `instances` count toward their pool than `replicas`.
fn more_than(instances: &[InstanceRecord], replicas: i64) -> bool {
    instances
        .iter()
        .filter(|i| counts_toward_pool(&i.state))
        .count()
        > replicas.max(0) as usize
}

#[cfg(test)]
mod tests {
    use super::super::plan::{plan, NodeFacts, Plan};
    use crate::control::ControlPlane;
    use knit_api::state::InstanceState;
    use std::collections::HashMap;
    use std::sync::Arc;

    /// Settled only at its size with every instance Running, Ready and
    /// healthy: anything short of that keeps the reconciler at its
    /// interval (a join timeout or a repair waits on time, not on events).
    #[test]
    fn a_pool_is_settled_only_at_its_size_with_every_node_ready_and_healthy() {
        let instance = crate::store::InstanceRecord::example;
        let ready = |names: &[&str]| -> HashMap<String, NodeFacts> {
            names
                .iter()
                .map(|n| {
                    let facts = NodeFacts {
                        ready: true,
                        evictable_pods: None,
                    };
                    (n.to_string(), facts)
                })
                .collect()
        };
        let none = HashMap::new();
        let two = [
            instance("p-a", InstanceState::Running),
            instance("p-b", InstanceState::Running),
        ];
        assert!(super::pool_settled(2, &two, &ready(&["p-a", "p-b"]), &none));
        let mut with_detached = two.to_vec();
        with_detached.push(instance("p-old", InstanceState::Detached));
        assert!(
            super::pool_settled(2, &with_detached, &ready(&["p-a", "p-b"]), &none),
            "a detached instance is history"
        );
        assert!(
            !super::pool_settled(3, &two, &ready(&["p-a", "p-b"]), &none),
            "short of its size"
        );
        assert!(
            !super::pool_settled(1, &two, &ready(&["p-a", "p-b"]), &none),
            "over its size"
        );
        assert!(
            !super::pool_settled(2, &two, &ready(&["p-a"]), &none),
            "a node not Ready"
        );
        let creating = [
            instance("p-a", InstanceState::Running),
            instance("p-b", InstanceState::Creating),
        ];
        assert!(!super::pool_settled(
            2,
            &creating,
            &ready(&["p-a", "p-b"]),
            &none
        ));
        let unhealthy = HashMap::from([(
            "p-b".to_string(),
            crate::store::InstanceHealth {
                instance: "p-b".into(),
                unhealthy_since_ms: Some(1),
                ..Default::default()
            },
        )]);
        assert!(!super::pool_settled(
            2,
            &two,
            &ready(&["p-a", "p-b"]),
            &unhealthy
        ));
    }

    fn control_plane(dir: &std::path::Path) -> Arc<ControlPlane> {
        let store = crate::store::Store::open(&dir.join("k.db")).unwrap();
        Arc::new(ControlPlane::new(
            store,
            None,
            Arc::new(crate::cluster::seam::NoCluster),
            crate::control::Settings::new(dir.to_path_buf()),
            String::new(),
            String::new(),
            String::new(),
        ))
    }

    /// Two instances knit made and one the user added, in a pool of 3.
    fn pool_with_an_added_instance(cp: &ControlPlane) -> knit_api::NodePool {
        let mut pool = knit_api::NodePool::new("p", knit_api::NodePoolSpec::default());
        pool.spec.replicas = 2;
        cp.store.insert_pool(&pool).unwrap();
        cp.store
            .add_create_intents("p", &[("p-ours1".into(), "t".into())])
            .unwrap();
        cp.store
            .add_create_intents("p", &[("p-ours2".into(), "t".into())])
            .unwrap();
        for (i, name) in ["p-ours1", "p-ours2"].iter().enumerate() {
            cp.store
                .set_instance_created(name, &format!("i-{i}"), None)
                .unwrap();
        }
        for intent in cp.store.pending_intents().unwrap() {
            cp.store
                .finish_intent(intent.id, knit_api::state::IntentStatus::Done, None)
                .unwrap();
        }
        pool.spec.replicas = 3;
        cp.store
            .enroll_attached(
                &crate::store::Enrollment {
                    name: "p-mine",
                    pool: &pool,
                    provider_id: "i-user",
                    ip: None,
                    instance_type: "t",
                    state: InstanceState::Running,
                    record: None,
                },
                false,
            )
            .unwrap();
        pool
    }

    fn pending_deletes(cp: &ControlPlane) -> Vec<(String, bool)> {
        cp.store
            .pending_intents()
            .unwrap()
            .into_iter()
            .filter(|i| i.action == knit_api::state::IntentAction::Delete)
            .map(|i| (i.instance, i.release))
            .collect()
    }

    #[tokio::test]
    async fn scale_in_removes_created_instances_first() {
        let dir = tempfile::tempdir().unwrap();
        let cp = control_plane(dir.path());
        let mut pool = pool_with_an_added_instance(&cp);
        assert!(cp.store.instance("p-mine").unwrap().unwrap().added);
        pool.spec.replicas = 1;
        cp.store.update_pool(&pool).unwrap();
        cp.plan_pool("p", true).await.unwrap();
        let mut deletes = pending_deletes(&cp);
        deletes.sort();
        assert_eq!(
            deletes,
            vec![("p-ours1".to_string(), true), ("p-ours2".to_string(), true)]
        );
        assert_eq!(
            cp.store.instance("p-mine").unwrap().unwrap().state,
            InstanceState::Running
        );
    }

    #[tokio::test]
    async fn an_added_instance_is_kept_when_its_pool_is_deleted() {
        let dir = tempfile::tempdir().unwrap();
        let cp = control_plane(dir.path());
        pool_with_an_added_instance(&cp);
        cp.store.mark_pool_deleting("p").unwrap();
        cp.plan_all().await.unwrap();
        let mut deletes = pending_deletes(&cp);
        deletes.sort();
        assert_eq!(
            deletes,
            vec![
                ("p-mine".to_string(), false),
                ("p-ours1".to_string(), true),
                ("p-ours2".to_string(), true)
            ],
            "knit's instances released, the added one kept"
        );
        let events = cp.store.events(50).unwrap();
        let kept = events
            .iter()
            .find(|e| e.reason == "KeepingAdded")
            .expect("an event says the added instance is kept");
        assert!(
            kept.message.contains("p-mine") && kept.message.contains("never released"),
            "{}",
            kept.message
        );
    }

    /// The reconciler's pass waits on the plan lock when `scale --replicas 1
    /// --release=false` arrives: whichever plans first, nothing is released.
    #[tokio::test]
    async fn scale_with_release_false_never_releases_when_the_reconciler_plans_first() {
        let dir = tempfile::tempdir().unwrap();
        let cp = control_plane(dir.path());
        let mut pool = knit_api::NodePool::new("p", knit_api::NodePoolSpec::default());
        pool.spec.replicas = 3;
        cp.store.insert_pool(&pool).unwrap();
        for (i, name) in ["p-a", "p-b", "p-c"].iter().enumerate() {
            cp.store
                .add_create_intents("p", &[(name.to_string(), "t".into())])
                .unwrap();
            cp.store
                .set_instance_created(name, &format!("i-{i}"), None)
                .unwrap();
        }
        for intent in cp.store.pending_intents().unwrap() {
            cp.store
                .finish_intent(intent.id, knit_api::state::IntentStatus::Done, None)
                .unwrap();
        }
        let held = cp.plan_lock.lock().await;
        let reconciler = tokio::spawn({
            let cp = Arc::clone(&cp);
            async move {
                cp.plan_all().await.unwrap();
            }
        });
        // Queued on the lock first (tokio's mutex is fair: first come,
        // first served).
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        let scale = tokio::spawn({
            let cp = Arc::clone(&cp);
            async move { cp.scale_pool("p", 1, false, |_| Ok(())).await.unwrap() }
        });
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        drop(held);
        reconciler.await.unwrap();
        let (from, _) = scale.await.unwrap();
        assert_eq!(from, 3);
        cp.plan_all().await.unwrap();
        let deletes = pending_deletes(&cp);
        assert_eq!(deletes.len(), 2, "{deletes:?}");
        assert!(
            deletes.iter().all(|(_, release)| !release),
            "release: false kept: {deletes:?}"
        );
        assert_eq!(cp.store.pool("p").unwrap().unwrap().pool.spec.replicas, 1);
    }

    /// Makes every pending instance of `pool` created, its node
    /// initialized (no cluster: initialized is available).
    fn bring_up(cp: &ControlPlane, pool: &str) {
        for intent in cp.store.pending_intents().unwrap() {
            if intent.action == knit_api::state::IntentAction::Create {
                cp.store
                    .set_instance_created(
                        &intent.instance,
                        &format!("id-{}", intent.instance),
                        None,
                    )
                    .unwrap();
                cp.store
                    .finish_intent(intent.id, knit_api::state::IntentStatus::Done, None)
                    .unwrap();
            }
        }
        for i in cp.store.instances(Some(pool)).unwrap() {
            if i.state != InstanceState::Running
                || cp.store.node(&format!("n-{}", i.name)).unwrap().is_some()
            {
                continue;
            }
            let event = knit_api::PhaseEvent {
                node: format!("n-{}", i.name),
                instance_id: format!("id-{}", i.name),
                phase: knit_api::PhaseName::Hardening,
                outcome: knit_api::PhaseOutcome::Done,
                reason: None,
                error_code: None,
                at_ms: 1,
                duration_ms: None,
            };
            cp.store.record_phase_event(&i, &event).unwrap();
        }
    }

    /// Delete intents pending, by instance.
    fn deleting(cp: &ControlPlane) -> Vec<String> {
        pending_deletes(cp).into_iter().map(|(n, _)| n).collect()
    }

    #[tokio::test]
    async fn a_kubelet_setting_updates_one_node_at_a_time_in_place_then_completes() {
        let dir = tempfile::tempdir().unwrap();
        let cp = control_plane(dir.path());
        let mut pool = knit_api::NodePool::new("kq", knit_api::NodePoolSpec::default());
        pool.spec.replicas = 3;
        cp.store.insert_pool(&pool).unwrap();
        cp.plan_all().await.unwrap();
        bring_up(&cp, "kq");
        cp.plan_all().await.unwrap();
        let before: Vec<String> = cp
            .store
            .instances(Some("kq"))
            .unwrap()
            .into_iter()
            .map(|i| i.name)
            .collect();
        pool.spec.kubelet.event_record_qps = 8;
        cp.store.update_pool(&pool).unwrap();
        let mut updated = Vec::new();
        for _ in 0..3 {
            cp.plan_all().await.unwrap();
            let jobs = super::super::in_place::finish_queued(&cp, "kq");
            assert_eq!(jobs.len(), 1, "one node at a time: {jobs:?}");
            assert!(!jobs[0].update.drain, "a restart-kubelet field");
            assert_eq!(
                jobs[0]
                    .node_update
                    .kubelet
                    .as_ref()
                    .map(|k| k.event_record_qps),
                Some(8)
            );
            updated.push(jobs[0].instance.clone());
            assert!(deleting(&cp).is_empty(), "nothing removed");
            assert_eq!(
                cp.store.instances(Some("kq")).unwrap().len(),
                3,
                "no surge machine"
            );
        }
        updated.sort();
        let mut want = before.clone();
        want.sort();
        assert_eq!(updated, want, "each node once");
        cp.plan_all().await.unwrap();
        assert!(super::super::in_place::finish_queued(&cp, "kq").is_empty());
        let view = crate::pools::get(&cp, "kq").unwrap();
        let r = view.status.rollout.unwrap();
        assert_eq!(
            (r.state.as_str(), r.updated, r.outdated),
            ("Complete", 3, 0)
        );
        let events = cp.store.events(100).unwrap();
        let complete: Vec<_> = events
            .iter()
            .filter(|e| e.reason == super::ROLLOUT_COMPLETE_REASON && e.object_name == "kq")
            .collect();
        assert_eq!(complete.len(), 1, "one RolloutComplete: {complete:?}");
        assert_eq!(
            events
                .iter()
                .filter(|e| e.reason == "UpdatedInPlace")
                .count(),
            3
        );
        // Another pass announces nothing more.
        cp.plan_all().await.unwrap();
        let again = cp.store.events(100).unwrap();
        assert_eq!(
            again
                .iter()
                .filter(|e| e.reason == super::ROLLOUT_COMPLETE_REASON && e.object_name == "kq")
                .count(),
            1
        );
    }

    #[tokio::test]
    async fn a_failed_in_place_update_stops_the_rollout_naming_the_node() {
        let dir = tempfile::tempdir().unwrap();
        // No provider: the agent cannot be asked, the update fails.
        let cp = control_plane(dir.path());
        let mut pool = knit_api::NodePool::new("kf", knit_api::NodePoolSpec::default());
        pool.spec.replicas = 2;
        cp.store.insert_pool(&pool).unwrap();
        cp.plan_all().await.unwrap();
        bring_up(&cp, "kf");
        cp.plan_all().await.unwrap();
        pool.spec.kubelet.max_pods = 50;
        pool.spec.update_strategy.max_unavailable = knit_api::IntOrPercent::Count(1);
        cp.store.update_pool(&pool).unwrap();
        cp.plan_all().await.unwrap();
        let handles = super::super::in_place::start_queued(&cp, "kf");
        assert_eq!(handles.len(), 1);
        for h in handles {
            h.await.unwrap();
        }
        let node = cp
            .store
            .events(100)
            .unwrap()
            .into_iter()
            .find(|e| e.reason == "UpdatingInPlace")
            .map(|e| e.object_name)
            .expect("an UpdatingInPlace event");
        let view = crate::pools::get(&cp, "kf").unwrap();
        let r = view.status.rollout.unwrap();
        assert_eq!(r.state, "Stopped", "{r:?}");
        assert_eq!(
            r.reason.as_deref(),
            Some(super::super::in_place::IN_PLACE_FAILED_REASON)
        );
        let message = r.message.unwrap_or_default();
        assert!(message.contains(&node), "{message}");
        assert!(
            message.contains("left cordoned"),
            "kubelet.maxPods drains: {message}"
        );
        let events = cp.store.events(100).unwrap();
        assert!(events.iter().any(|e| e.reason == "InPlaceUpdateFailed"
            && e.object_name == "kf"
            && e.message.contains(&node)));
        // Stopped: nothing more is updated nor replaced.
        cp.plan_all().await.unwrap();
        assert!(super::super::in_place::start_queued(&cp, "kf").is_empty());
        assert!(deleting(&cp).is_empty());
        assert_eq!(cp.store.instances(Some("kf")).unwrap().len(), 2);
    }

    #[tokio::test]
    async fn a_changed_instance_type_rolls_one_node_at_a_time_through_delete_intents() {
        let dir = tempfile::tempdir().unwrap();
        let cp = control_plane(dir.path());
        let mut pool = knit_api::NodePool::new("p", knit_api::NodePoolSpec::default());
        pool.spec.replicas = 3;
        cp.store.insert_pool(&pool).unwrap();
        cp.plan_all().await.unwrap();
        bring_up(&cp, "p");
        let old: Vec<String> = cp
            .store
            .instances(Some("p"))
            .unwrap()
            .into_iter()
            .map(|i| i.name)
            .collect();
        assert_eq!(old.len(), 3);
        let record = cp.store.pool("p").unwrap().unwrap();
        assert_eq!(record.observed_generation, record.generation);
        pool.spec.instance_types = vec!["bigger".into()];
        cp.store.update_pool(&pool).unwrap();
        cp.plan_all().await.unwrap();
        let record = cp.store.pool("p").unwrap().unwrap();
        assert_eq!((record.generation, record.observed_generation), (2, 2));
        let active = |cp: &ControlPlane| {
            cp.store
                .instances(Some("p"))
                .unwrap()
                .into_iter()
                .filter(|i| crate::pool_state::counts_toward_pool(&i.state))
                .count()
        };
        assert_eq!(active(&cp), 4, "one surge instance");
        assert!(deleting(&cp).is_empty(), "no old one goes before it is up");
        cp.plan_all().await.unwrap();
        assert_eq!(active(&cp), 4, "still one surge instance");
        bring_up(&cp, "p");
        cp.plan_all().await.unwrap();
        let gone = deleting(&cp);
        assert_eq!(gone.len(), 1, "{gone:?}");
        assert!(old.contains(&gone[0]));
        let events = cp.store.events(50).unwrap();
        assert!(events.iter().any(|e| e.reason == "RollingUpdate"));
        // A restarted planner (everything from the store) makes no extra:
        // the old machine, being drained, still holds the surge.
        let again = control_plane(dir.path());
        again.plan_all().await.unwrap();
        again.plan_all().await.unwrap();
        assert_eq!(active(&again), 3);
        assert_eq!(
            again.store.pending_intents().unwrap().len(),
            1,
            "the delete only"
        );
        let view = crate::pools::get(&again, "p").unwrap();
        let r = view.status.rollout.unwrap();
        assert_eq!(
            (r.state.as_str(), r.updated, r.outdated),
            ("Progressing", 1, 2)
        );
        // Released: the next replacement is made.
        again.store.remove_instance(&gone[0]).unwrap();
        for intent in again.store.pending_intents().unwrap() {
            again
                .store
                .finish_intent(intent.id, knit_api::state::IntentStatus::Done, None)
                .unwrap();
        }
        again.plan_all().await.unwrap();
        assert_eq!(active(&again), 4);
    }

    #[tokio::test]
    async fn a_replacement_that_never_comes_up_stops_the_rollout_and_leaves_the_old_nodes() {
        let dir = tempfile::tempdir().unwrap();
        let cp = control_plane(dir.path());
        let mut pool = knit_api::NodePool::new("p", knit_api::NodePoolSpec::default());
        pool.spec.replicas = 2;
        pool.spec.join_timeout_seconds = 60;
        cp.store.insert_pool(&pool).unwrap();
        cp.plan_all().await.unwrap();
        bring_up(&cp, "p");
        pool.spec.image = "/srv/other".into();
        cp.store.update_pool(&pool).unwrap();
        cp.plan_all().await.unwrap();
        // The surge instance is created but its node never reports.
        for intent in cp.store.pending_intents().unwrap() {
            cp.store
                .set_instance_created(&intent.instance, "id-x", None)
                .unwrap();
            cp.store
                .finish_intent(intent.id, knit_api::state::IntentStatus::Done, None)
                .unwrap();
        }
        let later = crate::store::now_ms() + 120_000;
        cp.plan_all_at(later).await.unwrap();
        cp.plan_all_at(later + 1000).await.unwrap();
        assert!(deleting(&cp).is_empty(), "no old node removed");
        let stop = cp.store.rollout_stop("p").unwrap().expect("stopped");
        assert_eq!(stop.reason, super::ROLLOUT_STOPPED_REASON);
        let events = cp.store.events(50).unwrap();
        assert_eq!(
            events
                .iter()
                .filter(|e| e.reason == super::ROLLOUT_STOPPED_REASON)
                .count(),
            1
        );
        let view = crate::pools::get(&cp, "p").unwrap();
        assert_eq!(view.status.rollout.unwrap().state, "Stopped");
        // Resume: the failed replacement is released and the stop cleared.
        crate::pools::rollout::set_paused(&cp, "p", false)
            .await
            .unwrap();
        assert_eq!(cp.store.rollout_stop("p").unwrap(), None);
        assert_eq!(deleting(&cp).len(), 1);
    }

    #[tokio::test]
    async fn pause_holds_restart_replaces_and_undo_goes_back() {
        let dir = tempfile::tempdir().unwrap();
        let cp = control_plane(dir.path());
        let mut pool = knit_api::NodePool::new("p", knit_api::NodePoolSpec::default());
        pool.spec.replicas = 1;
        pool.spec.labels.insert("tier".into(), "a".into());
        cp.store.insert_pool(&pool).unwrap();
        cp.plan_all().await.unwrap();
        bring_up(&cp, "p");
        crate::pools::rollout::set_paused(&cp, "p", true)
            .await
            .unwrap();
        let view = crate::pools::rollout::restart(&cp, "p").await.unwrap();
        assert_eq!(view.status.rollout.unwrap().state, "Paused");
        cp.plan_all().await.unwrap();
        assert_eq!(
            cp.store.pending_intents().unwrap().len(),
            0,
            "paused: nothing made"
        );
        let err = crate::pools::rollout::undo(&cp, "p", None)
            .await
            .unwrap_err();
        assert_eq!(err.code(), "Conflict");
        crate::pools::rollout::set_paused(&cp, "p", false)
            .await
            .unwrap();
        cp.plan_all().await.unwrap();
        assert_eq!(cp.store.pending_intents().unwrap().len(), 1, "the surge");
        // Undo: back to revision 1's template (no restart), labels too.
        let mut p = cp.store.pool("p").unwrap().unwrap().pool;
        p.spec.labels.insert("tier".into(), "b".into());
        cp.store.update_pool(&p).unwrap();
        let view = crate::pools::rollout::undo(&cp, "p", Some(1))
            .await
            .unwrap();
        assert_eq!(view.spec.spec.restarted_at, None);
        assert_eq!(
            view.spec.spec.labels.get("tier").map(String::as_str),
            Some("a")
        );
        let r = view.status.rollout.unwrap();
        assert_eq!(
            (r.updated, r.outdated),
            (1, 1),
            "the old node is current again, the surge is not"
        );
        let revisions = crate::pools::rollout::revisions(&cp, "p").unwrap();
        assert_eq!(
            revisions.last().unwrap().template_hash,
            view.status.template_hash.unwrap()
        );
        assert!(crate::pools::rollout::undo(&cp, "p", Some(99))
            .await
            .is_err());
    }

    #[test]
    fn scale_in_facts_count_only_pods_a_drain_would_evict() {
        use super::{evictable_by_node, node_facts};
        use crate::cluster::pods::PodFacts;
        let pod = |node: &str| PodFacts {
            name: "p".into(),
            node: node.into(),
            ..PodFacts::default()
        };
        let pods = vec![
            pod("n1"),
            pod("n1"),
            PodFacts {
                daemon_set: true,
                ..pod("n1")
            },
            PodFacts {
                mirror: true,
                ..pod("n2")
            },
            PodFacts {
                deletion_ms: Some(1),
                ..pod("n2")
            },
            pod(""),
        ];
        let counts = evictable_by_node(&pods);
        assert_eq!(counts.get("n1"), Some(&2));
        assert_eq!(counts.get("n2"), None);
        let node = |name: &str, instance: &str, status| crate::store::NodeRecord {
            name: name.into(),
            instance: instance.into(),
            pool: "p".into(),
            status,
            phase: None,
            phase_outcome: None,
            error_code: None,
            error: None,
            created_ms: 0,
            updated_ms: 0,
            user_data: None,
        };
        use knit_api::state::NodeStatus;
        let nodes = vec![
            node("n1", "p-a", NodeStatus::Ready),
            node("n2", "p-b", NodeStatus::NotReady),
        ];
        let facts = node_facts(&nodes, Some(&counts));
        assert!(facts["p-a"].ready && facts["p-a"].evictable_pods == Some(2));
        assert!(!facts["p-b"].ready && facts["p-b"].evictable_pods == Some(0));
        let blind = node_facts(&nodes, None);
        assert_eq!(
            blind["p-a"].evictable_pods, None,
            "pods not listed: unknown"
        );
    }

    #[test]
    fn a_failed_attach_is_undone_once() {
        let dir = tempfile::tempdir().unwrap();
        let cp = control_plane(dir.path());
        pool_with_an_added_instance(&cp);
        let replicas = |cp: &ControlPlane| cp.store.pool("p").unwrap().unwrap().pool.spec.replicas;
        assert_eq!(replicas(&cp), 3);
        assert_eq!(
            cp.store.undo_attach("p-mine", "why").unwrap(),
            Some(("p".to_string(), 3, 2))
        );
        let mine = cp.store.instance("p-mine").unwrap().unwrap();
        assert_eq!(
            (mine.state, mine.last_error.as_deref()),
            (InstanceState::Detached, Some("why"))
        );
        assert_eq!(cp.store.undo_attach("p-mine", "again").unwrap(), None);
        assert_eq!(replicas(&cp), 2, "the count drops once");
        assert_eq!(
            plan(2, &cp.store.instances(Some("p")).unwrap(), &HashMap::new()),
            Plan::default()
        );
    }
}
