//! A rollout's in-place updates: an out-of-date node that reaches its
//! pool's current template without a new machine (a kubelet setting, or
//! the Kubernetes version with `updateStrategy.inPlace`; which is
//! `knit_api::update::in_place_update`'s answer) is updated on the same
//! machine. The planner (`rollout.rs`, pure) picks which and when, one
//! node at a time within `maxUnavailable`; here each update runs in its
//! own task:
//!
//! 1. drained first when the change needs it (cordon, evictions through
//!    the Eviction API, PodDisruptionBudgets honoured: the pool's
//!    `spec.drain`; the drain is stored as any drain, under the intent id
//!    [`IN_PLACE_INTENT`]);
//! 2. `knit-agent update` on the machine: the NodeConfig gets the new
//!    kubelet settings and package (from the server's mirror, checked by
//!    sha256), `init` re-renders, reinstalls and restarts the kubelet;
//! 3. the Node Ready again (within the pool's join timeout), uncordoned;
//! 4. the instance's template hash set to the current one: up to date.
//!
//! A failure stops the pool's rollout (`InPlaceUpdateFailed`, the node
//! and the reason named; the node is left cordoned when it was drained),
//! as a replacement that does not come up does (its progress deadline).
//! A server that stops midway leaves the instance out of date: the next
//! leader's pass picks it again (every step is idempotent; a finished
//! drain is found finished).

use crate::control::ControlPlane;
use crate::error::Result;
use crate::store::{now_ms, InstanceRecord, NodeRecord, RolloutStop};
use knit_api::agent::{NodeUpdate, NodeUpdated};
use knit_api::routes::Route;
use knit_api::state::EventType;
use knit_api::update::{in_place_update, template_hash, InPlaceUpdate};
use knit_api::NodePool;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

/// The intent id an in-place update's drain is stored under (a removal's
/// drain has its delete intent's, a snapshot builder's 0).
pub const IN_PLACE_INTENT: i64 = -1;
/// The reason (event and rollout state) of a rollout stopped by a failed
/// in-place update.
pub const IN_PLACE_FAILED_REASON: &str = "InPlaceUpdateFailed";
/// How long `knit-agent update` may take: a package download from the
/// mirror, the kubelet's restart and its registration.
pub const AGENT_UPDATE_TIMEOUT: Duration = Duration::from_secs(900);

/// One node's in-place update, decided under the plan lock.
#[derive(Debug, Clone)]
pub struct InPlaceJob {
    pub pool: String,
    pub instance: String,
    pub provider_id: String,
    pub node: String,
    pub from_hash: String,
    pub to_hash: String,
    pub update: InPlaceUpdate,
    pub node_update: NodeUpdate,
    pub join_timeout_seconds: i64,
}

/// Instances whose in-place update runs in this process, and the jobs
/// decided but not started yet. A process's own: a server that stops
/// loses them and the next pass decides again.
static UPDATING: LazyLock<Mutex<HashSet<String>>> = LazyLock::new(Default::default);
static QUEUE: LazyLock<Mutex<Vec<InPlaceJob>>> = LazyLock::new(Default::default);

/// The instances whose in-place update is under way.
pub fn updating() -> HashSet<String> {
    UPDATING.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

/// The Kubernetes version a node made from `spec` with `hash` runs: the
/// spec's own, or the cluster's now, whichever gives that hash; `None`
/// when neither does (then it is replaced: knit cannot tell).
fn version_of(spec: &knit_api::NodePoolSpec, hash: &str, cluster: &str) -> Option<String> {
    [spec.kubernetes_version.as_deref(), Some(cluster)]
        .into_iter()
        .flatten()
        .find(|v| template_hash(spec, v) == hash)
        .map(str::to_string)
}

impl ControlPlane {
    /// The out-of-date instances of `pool` that reach `current` in place:
    /// each instance's template found among the pool's kept revisions by
    /// its hash (one not kept is replaced).
    pub(crate) fn in_place_candidates(
        &self,
        pool: &NodePool,
        instances: &[InstanceRecord],
        hashes: &HashMap<String, Option<String>>,
        current: &str,
        cluster_version: &str,
    ) -> Result<HashMap<String, InPlaceUpdate>> {
        let mut found = HashMap::new();
        let outdated: Vec<(&InstanceRecord, &str)> = instances
            .iter()
            .filter(|i| !i.added && crate::pool_state::counts_toward_pool(&i.state))
            .filter_map(|i| match hashes.get(&i.name) {
                Some(Some(h)) if h != current => Some((i, h.as_str())),
                _ => None,
            })
            .collect();
        if outdated.is_empty() {
            return Ok(found);
        }
        let revisions = self.store.pool_revisions(&pool.metadata.name)?;
        let new_version =
            knit_api::update::effective_kubernetes_version(&pool.spec, cluster_version);
        for (i, hash) in outdated {
            let Some(rev) = revisions.iter().find(|r| r.template_hash == hash) else {
                continue;
            };
            let Some(old_version) = version_of(&rev.spec, hash, cluster_version) else {
                continue;
            };
            if let Some(u) = in_place_update(&rev.spec, &old_version, &pool.spec, new_version) {
                found.insert(i.name.clone(), u);
            }
        }
        Ok(found)
    }

    /// Queues the in-place updates the planner chose (under the plan
    /// lock): each instance marked busy (no repair beside it), an event
    /// per node. Started by [`ControlPlane::start_in_place_updates`].
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn queue_in_place(
        &self,
        pool: &NodePool,
        chosen: &[String],
        updates: &HashMap<String, InPlaceUpdate>,
        instances: &[InstanceRecord],
        nodes: &[NodeRecord],
        hashes: &HashMap<String, Option<String>>,
        current: &str,
    ) -> Result<()> {
        let name = &pool.metadata.name;
        for instance in chosen {
            let (Some(u), Some(record)) = (
                updates.get(instance),
                instances.iter().find(|i| &i.name == instance),
            ) else {
                continue;
            };
            let Some(provider_id) = record.provider_id.clone() else {
                continue;
            };
            let Some(node) = nodes.iter().find(|n| &n.instance == instance) else {
                continue;
            };
            let Some(Some(from)) = hashes.get(instance) else {
                continue;
            };
            {
                let mut busy = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
                if !busy.insert(instance.clone()) {
                    continue;
                }
            }
            UPDATING
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(instance.clone());
            let kubernetes = match &u.kubernetes_version {
                Some(version) => {
                    let tarball = format!("pkg/kubernetes/kubernetes-{version}-linux-amd64.tar.gz");
                    Some(knit_api::config::KubernetesPackage {
                        version: version.clone(),
                        url: Some(format!(
                            "{}{}",
                            self.advertise_url,
                            Route::Mirror.fill(&[&tarball])
                        )),
                        sha256: self.mirror_sha256(&tarball)?,
                        ..knit_api::config::KubernetesPackage::default()
                    })
                }
                None => None,
            };
            let node_update = NodeUpdate {
                kubelet: u.kubelet.then(|| pool.spec.kubelet.clone()),
                kubernetes,
            };
            self.store.add_event(
                EventType::Normal,
                "Node",
                &node.name,
                "UpdatingInPlace",
                &format!(
                    "pool {name}: {} changed: {}the kubelet restarted on the same machine{}",
                    u.fields.join(", "),
                    if u.drain {
                        "cordoned and drained, "
                    } else {
                        "not drained (its pods keep running), "
                    },
                    u.kubernetes_version
                        .as_deref()
                        .map(|v| format!(", Kubernetes {v} installed from the mirror"))
                        .unwrap_or_default()
                ),
            )?;
            QUEUE
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(InPlaceJob {
                    pool: name.clone(),
                    instance: instance.clone(),
                    provider_id,
                    node: node.name.clone(),
                    from_hash: from.clone(),
                    to_hash: current.to_string(),
                    update: u.clone(),
                    node_update,
                    join_timeout_seconds: pool.spec.join_timeout_seconds,
                });
        }
        Ok(())
    }

    /// Starts every queued in-place update in its own task (not waited
    /// for by the pass); the handles let a caller wait.
    pub fn start_in_place_updates(self: &Arc<Self>) -> Vec<tokio::task::JoinHandle<()>> {
        let jobs = std::mem::take(&mut *QUEUE.lock().unwrap_or_else(|p| p.into_inner()));
        self.start_jobs(jobs)
    }

    fn start_jobs(self: &Arc<Self>, jobs: Vec<InPlaceJob>) -> Vec<tokio::task::JoinHandle<()>> {
        jobs.into_iter()
            .map(|job| {
                let cp = Arc::clone(self);
                crate::ha::spawn(async move {
                    cp.run_in_place(&job).await;
                    cp.in_flight
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .remove(&job.instance);
                    UPDATING
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .remove(&job.instance);
                    cp.wake.notify_one();
                })
            })
            .collect()
    }

    async fn run_in_place(&self, job: &InPlaceJob) {
        let outcome = self.update_in_place(job).await;
        let recorded = match outcome {
            Ok(message) => self.in_place_done(job, &message),
            Err(why) => self.in_place_failed(job, &why),
        };
        if let Err(e) = recorded {
            tracing::warn!(instance = %job.instance, error = %e, "recording an in-place update failed");
        }
    }

    fn in_place_done(&self, job: &InPlaceJob, message: &str) -> Result<()> {
        self.store.forget_drain(&job.instance, IN_PLACE_INTENT)?;
        let set = self
            .store
            .set_instance_hash(&job.instance, &job.from_hash, &job.to_hash)?;
        let message = if set {
            format!("{message}; template {} (up to date)", job.to_hash)
        } else {
            format!("{message}; its template changed meanwhile: the rollout looks at it again")
        };
        tracing::info!(node = %job.node, instance = %job.instance, "updated in place");
        self.store.add_event(
            EventType::Normal,
            "Node",
            &job.node,
            "UpdatedInPlace",
            &message,
        )
    }

    fn in_place_failed(&self, job: &InPlaceJob, why: &str) -> Result<()> {
        let message = format!(
            "in-place update of node {} (instance {}) failed: {why}; the rollout is stopped{} (knit rollout resume pool {} tries again, knit rollout undo pool {} goes back)",
            job.node,
            job.instance,
            if job.update.drain {
                " and the node left cordoned"
            } else {
                ""
            },
            job.pool,
            job.pool
        );
        tracing::warn!(node = %job.node, instance = %job.instance, %why, "in-place update failed");
        self.store.add_event(
            EventType::Warning,
            "Node",
            &job.node,
            IN_PLACE_FAILED_REASON,
            &message,
        )?;
        let stop = RolloutStop {
            template_hash: job.to_hash.clone(),
            reason: IN_PLACE_FAILED_REASON.to_string(),
            message: message.clone(),
            stopped_ms: now_ms(),
        };
        if self.store.stop_rollout(&job.pool, &stop)? {
            self.store.add_event(
                EventType::Warning,
                "NodePool",
                &job.pool,
                IN_PLACE_FAILED_REASON,
                &message,
            )?;
        }
        Ok(())
    }

    /// Drain (when needed), the agent's update, Ready again, uncordon.
    async fn update_in_place(&self, job: &InPlaceJob) -> std::result::Result<String, String> {
        let attached = self.cluster.attached();
        if job.update.drain && attached {
            self.drain_for_update(job).await?;
        }
        let provider = self.provider().map_err(|e| e.to_string())?;
        let arg = knit_update_arg(&job.node_update).map_err(|e| e.to_string())?;
        let config = format!("{}/node-config.yaml", crate::userdata::BOOTSTRAP_DIR);
        let answer = crate::userdata::agent::ask::<NodeUpdated>(
            provider.as_ref(),
            &job.provider_id,
            &["update", "--config", &config, "--update", &arg],
            AGENT_UPDATE_TIMEOUT,
        )
        .await;
        let updated = match answer {
            Ok(Ok(a)) => a,
            Ok(Err(f)) => {
                return Err(format!(
                    "knit-agent update: {}",
                    crate::userdata::agent::describe(&f)
                ))
            }
            Err(e) => return Err(format!("knit-agent update could not run: {e}")),
        };
        if let Some(want) = &job.update.kubernetes_version {
            if &updated.kubernetes_version != want
                || !reports_version(&updated.kubelet_version, want)
            {
                return Err(format!(
                    "the agent installed Kubernetes {}, and the kubelet reports {:?}, not v{want}",
                    updated.kubernetes_version, updated.kubelet_version
                ));
            }
        }
        if !updated.kubelet_restarted {
            return Err(
                "the agent applied the change but the kubelet was not restarted".to_string(),
            );
        }
        if attached {
            self.wait_ready(job).await?;
            if job.update.drain {
                let uncordon = serde_json::json!({"spec": {"unschedulable": null}});
                crate::provider::within(
                    "cluster",
                    "uncordoning the node",
                    crate::cluster::seam::CLUSTER_CALL_TIMEOUT,
                    self.cluster.patch_node(&job.node, &uncordon),
                )
                .await
                .map_err(|e| format!("uncordoning the node: {e}"))?;
            }
        }
        Ok(format!(
            "updated in place ({}): {}the kubelet restarted{}",
            job.update.fields.join(", "),
            if job.update.drain { "drained, " } else { "" },
            job.update
                .kubernetes_version
                .as_deref()
                .map(|v| format!(", Kubernetes {v}"))
                .unwrap_or_default()
        ))
    }

    async fn drain_for_update(&self, job: &InPlaceJob) -> std::result::Result<(), String> {
        loop {
            let progress = self
                .drain_step(IN_PLACE_INTENT, &job.instance, &job.node, &job.pool)
                .await
                .map_err(|e| format!("draining the node: {e}"))?;
            let ms = match progress {
                crate::drain::Progress::Done => return Ok(()),
                crate::drain::Progress::Wait(ms) => ms,
            };
            let spec = self
                .store
                .pool(&job.pool)
                .map_err(|e| e.to_string())?
                .map(|p| p.pool.spec.drain)
                .unwrap_or_default();
            let drain = self.store.drain(&job.instance).map_err(|e| e.to_string())?;
            if let Some(d) = drain {
                if !spec.forces() && d.timed_out_ms.is_some() {
                    return Err(format!(
                        "node {} was not drained within {} s: {}",
                        job.node,
                        spec.timeout_seconds,
                        d.reason.unwrap_or_default()
                    ));
                }
            }
            tokio::time::sleep(Duration::from_millis(ms.clamp(100, 5_000) as u64)).await;
        }
    }

    /// The node Ready within the pool's join timeout.
    async fn wait_ready(&self, job: &InPlaceJob) -> std::result::Result<(), String> {
        let limit = Duration::from_secs(job.join_timeout_seconds.max(1) as u64);
        let deadline = tokio::time::Instant::now() + limit;
        let mut last;
        loop {
            match crate::provider::within(
                "cluster",
                "reading the node's status",
                crate::cluster::seam::CLUSTER_CALL_TIMEOUT,
                self.cluster.node_status(&job.node),
            )
            .await
            {
                Ok(Some(s)) if s == "Ready" => return Ok(()),
                Ok(Some(s)) => last = s,
                Ok(None) => last = "not registered".to_string(),
                Err(e) => last = e.to_string(),
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(format!(
                    "the node is not Ready within {} s (joinTimeoutSeconds) after the kubelet's restart: {last}",
                    limit.as_secs()
                ));
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
}

/// Tests: the queued jobs of `pool` taken and finished as if each update
/// succeeded (the hash set, the event given, the marks cleared); their
/// instances.
#[cfg(test)]
pub(crate) fn finish_queued(cp: &ControlPlane, pool: &str) -> Vec<InPlaceJob> {
    let mut queue = QUEUE.lock().unwrap_or_else(|p| p.into_inner());
    let (mine, others): (Vec<InPlaceJob>, Vec<InPlaceJob>) =
        queue.drain(..).partition(|j| j.pool == pool);
    *queue = others;
    drop(queue);
    for job in &mine {
        cp.in_place_done(job, "updated in place (test)").unwrap();
        cp.in_flight.lock().unwrap().remove(&job.instance);
        UPDATING.lock().unwrap().remove(&job.instance);
    }
    mine
}

/// Tests: the queued jobs of `pool` started (and only those: tests share
/// the process's queue).
#[cfg(test)]
pub(crate) fn start_queued(cp: &Arc<ControlPlane>, pool: &str) -> Vec<tokio::task::JoinHandle<()>> {
    let mut queue = QUEUE.lock().unwrap_or_else(|p| p.into_inner());
    let (mine, others): (Vec<InPlaceJob>, Vec<InPlaceJob>) =
        queue.drain(..).partition(|j| j.pool == pool);
    *queue = others;
    drop(queue);
    cp.start_jobs(mine)
}

/// Whether `kubelet --version`'s line names `version` (`Kubernetes
/// v1.32.0`, a stand-in's with more after it).
fn reports_version(line: &str, version: &str) -> bool {
    line.split_whitespace()
        .any(|w| w.strip_prefix('v') == Some(version))
}

/// `--update`'s value: base64 of the update's JSON (the agent's
/// `knit_agent::update::decode` reads it).
pub fn knit_update_arg(update: &NodeUpdate) -> Result<String> {
    use base64::Engine as _;
    let json = knit_api::ser::json_vec("the NodeUpdate", update)?;
    Ok(base64::engine::general_purpose::STANDARD.encode(json))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_s_version_is_the_one_that_gives_its_hash() {
        let mut spec = knit_api::NodePoolSpec {
            kubernetes_version: Some("1.31.4".into()),
            ..knit_api::NodePoolSpec::default()
        };
        let h = template_hash(&spec, "1.31.4");
        assert_eq!(version_of(&spec, &h, "1.32.0").as_deref(), Some("1.31.4"));
        // A pool without its own version: the cluster's, when it gives
        // the hash; else unknown (replaced).
        spec.kubernetes_version = None;
        let h = template_hash(&spec, "1.31.4");
        assert_eq!(version_of(&spec, &h, "1.31.4").as_deref(), Some("1.31.4"));
        assert_eq!(version_of(&spec, &h, "1.32.0"), None);
    }

    #[test]
    fn the_kubelet_s_version_line_is_read_exactly() {
        assert!(reports_version("Kubernetes v1.32.0", "1.32.0"));
        assert!(reports_version(
            "Kubernetes v1.32.0 (knit-kubelet-sim 0.1.0: knit's kubelet stand-in)",
            "1.32.0"
        ));
        assert!(!reports_version("Kubernetes v1.32.10", "1.32.1"));
        assert!(!reports_version("Kubernetes v1.31.4", "1.32.0"));
        assert!(!reports_version("", "1.32.0"));
    }

    #[test]
    fn the_update_argument_is_base64_json() {
        use base64::Engine as _;
        let u = NodeUpdate {
            kubelet: Some(knit_api::config::KubeletConfig::default()),
            kubernetes: None,
        };
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(knit_update_arg(&u).unwrap())
            .unwrap();
        let back: NodeUpdate = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(back, u);
    }
}
