//! The pool reconciler. Planning (desired vs actual → which instances to
//! create or remove) is a pure function; executing a plan writes intents to
//! the store first and only then calls the provider, with bounded
//! parallelism, retries with backoff, and an event for every outcome.

use crate::control::ControlPlane;
use crate::error::{Result, ServerError};
use crate::pki;
use crate::provider::{
    within, DiskTemplate, InstanceTemplate, ProviderInstance, CALL_TIMEOUT, CREATE_TIMEOUT,
    TAG_NAME, TAG_POOL,
};
use crate::store::{now_ms, state, InstanceHealth, InstanceRecord, IntentRecord, NodeRecord};
use crate::userdata;
use serde_json::Value;
use std::sync::Arc;
use std::time::Instant;

/// cloud-init's result record, written when the user-data runner finishes.
pub const USER_DATA_RESULT: &str = "/run/cloud-init/result.json";
/// Largest result record read (a few KiB in practice).
pub const USER_DATA_RESULT_MAX_BYTES: usize = 1 << 20;
/// How long reading the result record may take.
pub const USER_DATA_RESULT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// How a join timeout's message starts (also how an instance failed by one
/// before its time was stored is recognized).
pub const JOIN_TIMEOUT_MESSAGE_START: &str = "not initialized ";
/// How long a call to the cluster's API may take.
pub const CLUSTER_CALL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Nodes whose result record could not be read (too slow or too large),
/// with failures so far and when to try again: such a node is not read on
/// every pass. In memory: after a restart each is tried once more.
static UNREADABLE: std::sync::LazyLock<
    std::sync::Mutex<std::collections::HashMap<String, (u32, i64)>>,
> = std::sync::LazyLock::new(Default::default);

fn unreadable_due(node: &str, now: i64) -> bool {
    UNREADABLE
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(node)
        .is_none_or(|(_, next)| *next <= now)
}

/// Records one more failed read; returns the seconds until the next try
/// (30 s, longer than a read may take, doubling to at most 10 min).
fn note_unreadable(node: &str, now: i64) -> i64 {
    let mut all = UNREADABLE.lock().unwrap_or_else(|p| p.into_inner());
    let entry = all.entry(node.to_string()).or_insert((0, now));
    entry.0 += 1;
    let delay_s = (30i64 << (entry.0 - 1).min(5)).min(600);
    entry.1 = now + delay_s * 1000;
    delay_s
}

fn forget_unreadable(node: &str) {
    UNREADABLE
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(node);
}

/// The pool's user-data part (`03-user-data`) from a result record: knit's
/// runner lists each part's exit code; plain cloud-init lists errors.
pub fn user_data_outcome(result: &Value) -> std::result::Result<(), String> {
    if let Some(parts) = result["knit"]["parts"].as_array() {
        return match parts.iter().find(|p| p["filename"] == "03-user-data") {
            None => Ok(()),
            Some(p) if p["exitCode"] == 0 => Ok(()),
            Some(p) => Err(format!(
                "user data exited with {}{}",
                p["exitCode"]
                    .as_i64()
                    .map(|c| format!("code {c}"))
                    .unwrap_or_else(|| "no exit code".into()),
                p["error"]
                    .as_str()
                    .map(|e| format!(": {e}"))
                    .unwrap_or_default()
            )),
        };
    }
    let errors: Vec<String> = result["v1"]["errors"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            e.as_str()
                .map(str::to_string)
                .unwrap_or_else(|| e.to_string())
        })
        .collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("; "))
    }
}

/// What a pool needs now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    pub create: usize,
    /// Instances to remove, in the order chosen.
    pub delete: Vec<String>,
}

/// States that count toward a pool's actual size.
pub fn counts_toward_pool(s: &str) -> bool {
    matches!(
        s,
        state::PENDING | state::CREATING | state::RUNNING | state::FAILED
    )
}

/// Desired vs actual for one pool. Scale-in removes instances knit created
/// before instances added by attach (the user's machines), and within each,
/// in this order: not yet created, failed, being created, then running ones
/// newest first (SPEC: newest first unless the user names the node).
pub fn plan(desired: usize, instances: &[InstanceRecord]) -> Plan {
    let active: Vec<&InstanceRecord> = instances
        .iter()
        .filter(|i| counts_toward_pool(&i.state))
        .collect();
    if active.len() < desired {
        return Plan {
            create: desired - active.len(),
            delete: Vec::new(),
        };
    }
    let excess = active.len() - desired;
    if excess == 0 {
        return Plan::default();
    }
    let rank = |s: &str| match s {
        state::PENDING => 0,
        state::FAILED => 1,
        state::CREATING => 2,
        _ => 3,
    };
    let mut victims = active;
    victims.sort_by(|a, b| {
        a.added
            .cmp(&b.added)
            .then(rank(&a.state).cmp(&rank(&b.state)))
            .then(b.created_ms.cmp(&a.created_ms))
            .then(b.name.cmp(&a.name))
    });
    Plan {
        create: 0,
        delete: victims
            .into_iter()
            .take(excess)
            .map(|i| i.name.clone())
            .collect(),
    }
}

/// `<pool>-<5 random chars>`: unique, short, a valid hostname label.
fn new_instance_name(pool: &str) -> Result<String> {
    Ok(format!("{pool}-{}", pki::random_lower_alnum(5)?))
}

fn backoff_ms(attempts: i64) -> i64 {
    let exp = attempts.clamp(0, 6) as u32;
    (1000i64 << exp).min(60_000)
}

impl ControlPlane {
    /// Plans every pool and writes the resulting intents. Serialized with the
    /// API's own planning so two planners never double-count.
    pub async fn plan_all(&self) -> Result<()> {
        self.plan_all_at(now_ms()).await
    }

    /// [`ControlPlane::plan_all`] as if the time were `now` (ms): the join
    /// timeout and the node health it records are judged at `now`.
    pub async fn plan_all_at(&self, now: i64) -> Result<()> {
        let started = Instant::now();
        let _guard = self.plan_lock.lock().await;
        self.store.prune_instance_health()?;
        let nodes = self.store.nodes()?;
        let mut health = self.store.instance_health()?;
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
            let p = plan(desired, &instances);
            self.apply_plan(&record.pool, &p, true)?;
            if record.deleting && instances.iter().all(|i| i.state == state::DETACHED) {
                self.store.remove_pool(&name)?;
                self.store.add_event(
                    "Normal",
                    "NodePool",
                    &name,
                    "Deleted",
                    "pool deleted: no instances left",
                )?;
            }
        }
        self.metrics
            .reconcile_duration(started.elapsed().as_secs_f64());
        Ok(())
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
                i.state == state::RUNNING
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
            if node.is_some_and(|n| n.status == "Ready" || (!attached && n.initialized())) {
                continue;
            }
            let last = match node {
                Some(n) => format!(
                    "last phase {} {}{}",
                    n.phase.as_deref().unwrap_or("-"),
                    n.phase_outcome.as_deref().unwrap_or("-"),
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
                .set_instance_state(&i.name, state::FAILED, Some(&message))?;
            // Remembered, so that the node Ready later is Running again.
            let mut h = health.get(&i.name).cloned().unwrap_or(InstanceHealth {
                instance: i.name.clone(),
                ..InstanceHealth::default()
            });
            h.join_failed_ms = Some(now);
            self.store.put_instance_health(&h)?;
            health.insert(i.name.clone(), h);
            self.store
                .add_event("Warning", "Instance", &i.name, "JoinTimeout", &message)?;
            if pool.spec.auto_replace && i.added {
                self.store.add_event(
                    "Normal",
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
                    "Normal",
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
        let _guard = self.plan_lock.lock().await;
        let record = self
            .store
            .pool(pool_name)?
            .ok_or_else(|| ServerError::NotFound {
                kind: "pool",
                name: pool_name.to_string(),
            })?;
        let instances = self.store.instances(Some(pool_name))?;
        let p = plan(record.pool.spec.replicas.max(0) as usize, &instances);
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
        let _guard = self.plan_lock.lock().await;
        let mut pool = self.store.live_pool(pool_name)?.pool;
        let from = pool.spec.replicas;
        pool.spec.replicas = replicas;
        pool.validate()?;
        check(&pool)?;
        self.store.update_pool(&pool)?;
        self.store.add_event(
            "Normal",
            "NodePool",
            pool_name,
            "Scaled",
            &format!("replicas {from} -> {replicas}"),
        )?;
        let instances = self.store.instances(Some(pool_name))?;
        let p = plan(replicas.max(0) as usize, &instances);
        self.apply_plan(&pool, &p, release)?;
        self.wake.notify_one();
        Ok((from, p))
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
                "Normal",
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
                    "Normal",
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
                    "Normal",
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

    /// Starts every pending intent that is due, at most `parallelism` at a
    /// time, never two for the same instance.
    pub fn dispatch(self: &Arc<Self>) -> Result<()> {
        let Some(_provider) = &self.provider else {
            return Ok(());
        };
        let now = now_ms();
        let intents = self.store.pending_intents()?;
        for intent in intents {
            if intent.next_attempt_ms > now {
                continue;
            }
            {
                let mut in_flight = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
                if in_flight.contains(&intent.instance) {
                    continue;
                }
                in_flight.insert(intent.instance.clone());
            }
            let cp = Arc::clone(self);
            tokio::spawn(async move {
                // The permit bounds provider calls across all pools.
                let permit = cp.parallelism.clone().acquire_owned().await;
                let instance = intent.instance.clone();
                if let Err(e) = cp.run_intent(&intent).await {
                    tracing::warn!(instance = %instance, error = %e, "intent failed");
                }
                drop(permit);
                cp.in_flight
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&instance);
                cp.wake.notify_one();
            });
        }
        Ok(())
    }

    async fn run_intent(&self, intent: &IntentRecord) -> Result<()> {
        // Re-read: the intent may have been cancelled while it waited.
        if self.store.intent_status(intent.id)?.as_deref() != Some("pending") {
            return Ok(());
        }
        match intent.action.as_str() {
            "create" => self.run_create(intent).await,
            "delete" => self.run_delete(intent).await,
            "attach" => crate::attach::resume(self, intent).await,
            other => self.store.finish_intent(
                intent.id,
                "failed",
                Some(&format!("unknown action {other}")),
            ),
        }
    }

    async fn run_create(&self, intent: &IntentRecord) -> Result<()> {
        let provider = self.provider()?;
        let Some(instance) = self.store.instance(&intent.instance)? else {
            return self
                .store
                .finish_intent(intent.id, "cancelled", Some("instance record gone"));
        };
        let Some(pool) = self.store.pool(&intent.pool)? else {
            return self
                .store
                .finish_intent(intent.id, "cancelled", Some("pool gone"));
        };
        self.store
            .set_instance_state(&instance.name, state::CREATING, None)?;
        // Restart safety: an instance made before a crash is adopted, not
        // made twice.
        if let Some(existing) = within(
            provider.name(),
            "finding the instance",
            CALL_TIMEOUT,
            provider.find_by_name(&instance.name),
        )
        .await?
        {
            if existing.state.eq_ignore_ascii_case("running") {
                self.adopt(
                    intent,
                    &instance,
                    &existing,
                    "Adopted",
                    "found at the provider after a restart",
                )?;
                return Ok(());
            }
            // Half-made when the server died: release it and make it again.
            within(
                provider.name(),
                "releasing a half-made instance",
                CALL_TIMEOUT,
                provider.delete(&existing.id),
            )
            .await?;
            self.store.add_event(
                "Normal",
                "Instance",
                &instance.name,
                "Recreating",
                &format!(
                    "{} was left {} by an interrupted create; released",
                    existing.id, existing.state
                ),
            )?;
        }
        let outcome = match self.instance_template(&pool.pool, &instance).await {
            Ok(template) => {
                within(
                    provider.name(),
                    "creating the instance",
                    CREATE_TIMEOUT,
                    provider.create(&template),
                )
                .await
            }
            Err(e) => Err(e),
        };
        match outcome {
            Ok(created) => {
                if self.store.intent_status(intent.id)?.as_deref() != Some("pending") {
                    // Cancelled by a scale-in meanwhile: the delete intent
                    // that cancelled it will find the instance by name.
                    self.store
                        .set_instance_state(&instance.name, state::DELETING, None)?;
                    return Ok(());
                }
                self.adopt(intent, &instance, &created, "Created", "created")?;
                self.metrics.instance_created(&intent.pool);
                Ok(())
            }
            Err(e) => {
                self.metrics.instance_create_failed(&intent.pool);
                let message = e.to_string();
                // Nothing half-made stays behind.
                if let Ok(Some(partial)) = within(
                    provider.name(),
                    "finding the instance",
                    CALL_TIMEOUT,
                    provider.find_by_name(&instance.name),
                )
                .await
                {
                    let _ = within(
                        provider.name(),
                        "releasing a half-made instance",
                        CALL_TIMEOUT,
                        provider.delete(&partial.id),
                    )
                    .await;
                }
                let attempts = intent.attempts + 1;
                if attempts >= self.settings.max_create_attempts {
                    self.store
                        .set_instance_state(&instance.name, state::FAILED, Some(&message))?;
                    self.store
                        .finish_intent(intent.id, "failed", Some(&message))?;
                    self.store.add_event(
                        "Warning",
                        "Instance",
                        &instance.name,
                        "CreateFailed",
                        &format!("gave up after {attempts} attempt(s): {message}"),
                    )?;
                } else {
                    let delay = backoff_ms(attempts);
                    self.store.set_instance_state(
                        &instance.name,
                        state::PENDING,
                        Some(&message),
                    )?;
                    self.store
                        .retry_intent(intent.id, attempts, now_ms() + delay, &message)?;
                    self.store.add_event(
                        "Warning",
                        "Instance",
                        &instance.name,
                        "CreateRetry",
                        &format!(
                            "attempt {attempts} failed, retrying in {} s: {message}",
                            delay / 1000
                        ),
                    )?;
                }
                Err(e)
            }
        }
    }

    fn adopt(
        &self,
        intent: &IntentRecord,
        instance: &InstanceRecord,
        found: &ProviderInstance,
        reason: &str,
        what: &str,
    ) -> Result<()> {
        self.store
            .set_instance_created(&instance.name, &found.id, found.ip.as_deref())?;
        self.store.finish_intent(intent.id, "done", None)?;
        self.store.add_event(
            "Normal",
            "Instance",
            &instance.name,
            reason,
            &format!(
                "{what}: {} ({}) at provider {}",
                found.id,
                found.ip.as_deref().unwrap_or("no IP yet"),
                self.provider.as_ref().map(|p| p.name()).unwrap_or("none")
            ),
        )?;
        Ok(())
    }

    async fn instance_template(
        &self,
        pool: &knit_api::NodePool,
        instance: &InstanceRecord,
    ) -> Result<InstanceTemplate> {
        let cluster = self.cluster_doc()?;
        let agent_sha256 = self.mirror_sha256("bin/knit-agent")?.ok_or_else(|| {
            ServerError::Package(format!(
                "the package mirror ({}) has no bin/knit-agent: run `knit package build`",
                self.mirror_dir.display()
            ))
        })?;
        let token = self.issue_join_token(&instance.name, &pool.metadata.name)?;
        let mirror_url = format!("{}/mirror", self.advertise_url);
        let bootstrap_url = format!("{}/bootstrap/v1/config", self.advertise_url);
        let stub = userdata::agent_stub(&userdata::StubParams {
            mirror_url: &mirror_url,
            agent_sha256: &agent_sha256,
            bootstrap_url: &bootstrap_url,
            join_token: &token,
            ca_pem: &self.ca_pem,
        });
        let user_data = userdata::compose(&pool.spec.pre_user_data, &stub, &pool.spec.user_data)?;
        let mut tags = std::collections::BTreeMap::new();
        tags.insert(TAG_POOL.to_string(), pool.metadata.name.clone());
        tags.insert(TAG_NAME.to_string(), instance.name.clone());
        Ok(InstanceTemplate {
            name: instance.name.clone(),
            instance_type: instance.instance_type.clone(),
            image: pool.spec.image.clone(),
            system_disk_gib: pool.spec.system_disk.size_gib,
            data_disks: pool
                .spec
                .data_disks
                .iter()
                .map(|d| DiskTemplate {
                    size_gib: d.size_gib,
                    interface: d.interface.clone(),
                    snapshot_id: d.snapshot_id.clone(),
                })
                .collect(),
            user_data,
            region: cluster.spec.region.clone(),
            zone: pool.spec.zone.clone(),
            vpc: cluster.spec.vpc.clone(),
            tags,
        })
    }

    /// A one-time token bound to one instance; only its hash is stored.
    pub fn issue_join_token(&self, instance: &str, pool: &str) -> Result<String> {
        let token_id = pki::random_lower_alnum(6)?;
        let token = format!("{token_id}{}", pki::random_hex(16)?);
        let ttl = self.settings.join_token_ttl.as_millis() as i64;
        self.store
            .add_join_token(&pki::token_hash(&token), &token_id, instance, pool, ttl)?;
        Ok(token)
    }

    async fn run_delete(&self, intent: &IntentRecord) -> Result<()> {
        let provider = self.provider()?;
        let instance = self.store.instance(&intent.instance)?;
        let found = match instance.as_ref().and_then(|i| i.provider_id.clone()) {
            Some(id) => match within(
                provider.name(),
                "describing the instance",
                CALL_TIMEOUT,
                provider.get(&id),
            )
            .await?
            {
                Some(found) => Some(found),
                None => {
                    within(
                        provider.name(),
                        "finding the instance",
                        CALL_TIMEOUT,
                        provider.find_by_name(&intent.instance),
                    )
                    .await?
                }
            },
            None => {
                within(
                    provider.name(),
                    "finding the instance",
                    CALL_TIMEOUT,
                    provider.find_by_name(&intent.instance),
                )
                .await?
            }
        };
        let added = instance.as_ref().is_some_and(|i| i.added);
        // A manual-mode machine keeps its own OS and services: it is put
        // back as before the attach and left running. Otherwise (and when
        // that cannot be done) it is stopped, so that its kubelet cannot
        // register the Node again.
        let manual = if added && !intent.release {
            crate::attach::added_manually(self, &intent.instance)
        } else {
            Ok(false)
        };
        let mut left_running = false;
        let outcome = match &found {
            Some(found) if intent.release => {
                within(
                    provider.name(),
                    "releasing the instance",
                    CALL_TIMEOUT,
                    provider.delete(&found.id),
                )
                .await
            }
            Some(found) => {
                let stopped = found.state.eq_ignore_ascii_case("stopped");
                let undone = match (manual, stopped) {
                    (Ok(false), _) => None,
                    (Ok(true), true) => Some(Err(
                        "it is stopped, so nothing can run inside it".to_string()
                    )),
                    (Ok(true), false) => {
                        Some(crate::attach::undo_inside(provider.as_ref(), &found.id).await)
                    }
                    (Err(why), _) => Some(Err(why)),
                };
                if let Some(Err(why)) = &undone {
                    self.store.add_event(
                        "Warning",
                        "Instance",
                        &intent.instance,
                        "UndoFailed",
                        &format!(
                            "{} cannot be put back as before the attach (manual mode) and left running: {why}; {}. Before starting it again, run {}/knit-agent reset --undo on it, or its kubelet registers the node again",
                            found.id,
                            if stopped { "it stays stopped" } else { "stopping it instead" },
                            crate::userdata::BOOTSTRAP_DIR
                        ),
                    )?;
                }
                match undone {
                    Some(Ok(())) => {
                        left_running = true;
                        Ok(())
                    }
                    // Stopping a stopped instance is refused by providers.
                    _ if stopped => Ok(()),
                    _ => {
                        within(
                            provider.name(),
                            "stopping the instance",
                            CALL_TIMEOUT,
                            provider.stop(&found.id),
                        )
                        .await
                    }
                }
            }
            None => Ok(()),
        };
        if let Err(e) = outcome {
            let attempts = intent.attempts + 1;
            let delay = backoff_ms(attempts);
            self.store
                .retry_intent(intent.id, attempts, now_ms() + delay, &e.to_string())?;
            self.store.add_event(
                "Warning",
                "Instance",
                &intent.instance,
                "DeleteRetry",
                &format!(
                    "attempt {attempts} failed, retrying in {} s: {e}",
                    delay / 1000
                ),
            )?;
            return Err(e);
        }
        // After the instance is stopped, gone or its kubelet stopped by the
        // undo, so that the kubelet cannot register the Node again. knit's
        // nodes run no pods: nothing to drain.
        for node in self
            .store
            .nodes()?
            .into_iter()
            .filter(|n| n.instance == intent.instance)
        {
            within(
                "cluster",
                "removing the node",
                CLUSTER_CALL_TIMEOUT,
                self.cluster.remove_node(&node.name),
            )
            .await?;
        }
        if intent.release {
            self.store.remove_instance(&intent.instance)?;
            self.store.add_event(
                "Normal",
                "Instance",
                &intent.instance,
                "Released",
                &match found {
                    Some(f) => format!("instance {} released", f.id),
                    None => "never created at the provider; record removed".to_string(),
                },
            )?;
        } else {
            self.store
                .set_instance_state(&intent.instance, state::DETACHED, None)?;
            self.store.add_event(
                "Normal",
                "Instance",
                &intent.instance,
                "Detached",
                if left_running {
                    "removed from the pool and the cluster; added by attach (manual mode), so knit keeps it running: knit's services, mounts, kernel settings and files undone inside it (knit-agent reset --undo), its own files and services untouched"
                } else if added {
                    "removed from the pool and the cluster; added by attach, so knit keeps it: stopped, not released (its disks and the agent's files stay)"
                } else {
                    "removed from the pool; instance stopped and kept"
                },
            )?;
        }
        self.store.finish_intent(intent.id, "done", None)?;
        self.metrics.instance_deleted(&intent.pool);
        Ok(())
    }

    /// The reconcile loop: plan, dispatch, sleep until woken or the interval.
    pub async fn run_reconciler(self: Arc<Self>, mut shutdown: tokio::sync::watch::Receiver<bool>) {
        if self.provider.is_none() {
            tracing::warn!("no provider configured: pools are stored but no instance is created");
            return;
        }
        if let Err(e) = crate::attach::mark_added_from_records(&self) {
            tracing::warn!(error = %e, "marking added instances from their attach records failed");
        }
        loop {
            if let Err(e) = self.plan_all().await {
                tracing::error!(error = %e, "planning failed");
            }
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
            if let Err(e) = self.check_user_data().await {
                tracing::warn!(error = %e, "checking user-data results failed");
            }
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = self.wake.notified() => {}
                _ = tokio::time::sleep(self.settings.reconcile_interval) => {}
            }
        }
    }

    /// Records each node's user-data outcome once its runner has finished,
    /// and lifts the pool's scheduling gate when it succeeded (SPEC §5). At
    /// most 20 nodes are looked at per pass: each look reads a file inside
    /// the instance through the provider, all at once, each bounded in time
    /// and size, so one instance (a FIFO, /dev/zero, a hung disk) holds up
    /// no other; it is skipped with an event and tried again later.
    pub async fn check_user_data(&self) -> Result<()> {
        let Some(provider) = &self.provider else {
            return Ok(());
        };
        let now = now_ms();
        let mut reads = tokio::task::JoinSet::new();
        let candidates: Vec<NodeRecord> = self
            .store
            .nodes()?
            .into_iter()
            .filter(|n| n.user_data.is_none() && n.initialized())
            .filter(|n| unreadable_due(&n.name, now))
            .take(20)
            .collect();
        for node in candidates {
            let Some(instance) = self.store.instance(&node.instance)? else {
                continue;
            };
            let (Some(id), true) = (
                instance.provider_id.clone(),
                instance.state == state::RUNNING,
            ) else {
                continue;
            };
            let Some(pool) = self.store.pool(&node.pool)? else {
                continue;
            };
            let provider = Arc::clone(provider);
            reads.spawn(async move {
                let raw = provider
                    .read_file_limited(
                        &id,
                        USER_DATA_RESULT,
                        USER_DATA_RESULT_MAX_BYTES,
                        USER_DATA_RESULT_TIMEOUT,
                    )
                    .await;
                (node, pool, raw)
            });
        }
        while let Some(done) = reads.join_next().await {
            let Ok((node, pool, raw)) = done else {
                continue;
            };
            let raw = match raw {
                Ok(raw) => {
                    forget_unreadable(&node.name);
                    raw
                }
                Err(e) if crate::provider::is_limit_error(&e) => {
                    // From now, not the pass's start: the read took its time.
                    let retry_s = note_unreadable(&node.name, now_ms());
                    self.store.add_event(
                        "Warning",
                        "Node",
                        &node.name,
                        "UserDataUnreadable",
                        &format!("{e}; skipped, tried again in {retry_s} s"),
                    )?;
                    continue;
                }
                // Absent until the runner has run every part.
                Err(_) => continue,
            };
            let Ok(result) = serde_json::from_slice::<Value>(&raw) else {
                continue;
            };
            self.record_user_data(&node, &pool, &result).await?;
        }
        Ok(())
    }

    async fn record_user_data(
        &self,
        node: &NodeRecord,
        pool: &crate::store::PoolRecord,
        result: &Value,
    ) -> Result<()> {
        let gate = pool.pool.spec.user_data_scheduling_gate && self.cluster.attached();
        match user_data_outcome(result) {
            Ok(()) => {
                if gate {
                    let removed = crate::provider::within(
                        "cluster",
                        "removing the scheduling gate taint",
                        CLUSTER_CALL_TIMEOUT,
                        self.cluster
                            .remove_taint(&node.name, knit_api::USER_DATA_GATE_TAINT),
                    )
                    .await?;
                    if !removed {
                        return Ok(()); // not registered yet: next pass
                    }
                    self.store.add_event(
                        "Normal",
                        "Node",
                        &node.name,
                        "SchedulingGateRemoved",
                        &format!(
                            "user data succeeded: taint {} removed",
                            knit_api::USER_DATA_GATE_TAINT
                        ),
                    )?;
                }
                self.store.set_node_user_data(&node.name, "succeeded")?;
                self.store.add_event(
                    "Normal",
                    "Node",
                    &node.name,
                    "UserDataSucceeded",
                    "the pool's user data ran successfully",
                )?;
            }
            Err(why) => {
                self.store
                    .set_node_user_data(&node.name, &format!("failed: {why}"))?;
                let kept = if gate {
                    "; the scheduling gate taint stays"
                } else {
                    ""
                };
                self.store.add_event(
                    "Warning",
                    "Node",
                    &node.name,
                    "UserDataFailed",
                    &format!("{why}{kept}"),
                )?;
            }
        }
        Ok(())
    }

    /// Copies each node's Ready condition from the cluster; every change
    /// is an event.
    pub async fn sync_node_statuses(&self) -> Result<()> {
        let statuses: std::collections::HashMap<String, String> = crate::provider::within(
            "cluster",
            "listing node statuses",
            CLUSTER_CALL_TIMEOUT,
            self.cluster.node_statuses(),
        )
        .await?
        .into_iter()
        .collect();
        if statuses.is_empty() {
            return Ok(());
        }
        for node in self.store.nodes()? {
            let Some(status) = statuses.get(&node.name) else {
                continue;
            };
            if *status != node.status {
                self.store.set_node_status(&node.name, status)?;
                let kind = if status == "Ready" {
                    "Normal"
                } else {
                    "Warning"
                };
                self.store.add_event(
                    kind,
                    "Node",
                    &node.name,
                    &format!("Node{status}"),
                    &format!("{} -> {status}", node.status),
                )?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inst(name: &str, st: &str, created_ms: i64) -> InstanceRecord {
        InstanceRecord {
            name: name.into(),
            pool: "p".into(),
            provider_id: None,
            state: st.into(),
            ip: None,
            instance_type: "t".into(),
            report_token_hash: None,
            last_error: None,
            created_ms,
            updated_ms: created_ms,
            added: false,
        }
    }

    #[test]
    fn scale_out_counts_pending_and_failed() {
        let list = vec![
            inst("a", state::RUNNING, 1),
            inst("b", state::PENDING, 2),
            inst("c", state::FAILED, 3),
        ];
        assert_eq!(
            plan(5, &list),
            Plan {
                create: 2,
                delete: vec![]
            }
        );
        assert_eq!(plan(3, &list), Plan::default());
    }

    #[test]
    fn deleting_and_detached_do_not_count() {
        let list = vec![inst("a", state::DELETING, 1), inst("b", state::DETACHED, 2)];
        assert_eq!(plan(1, &list).create, 1);
    }

    #[test]
    fn scale_in_prefers_uncreated_then_failed_then_newest() {
        let list = vec![
            inst("old", state::RUNNING, 1),
            inst("new", state::RUNNING, 9),
            inst("mid", state::RUNNING, 5),
            inst("bad", state::FAILED, 2),
            inst("wait", state::PENDING, 3),
        ];
        assert_eq!(plan(1, &list).delete, vec!["wait", "bad", "new", "mid"]);
        assert_eq!(plan(3, &list).delete, vec!["wait", "bad"]);
        assert_eq!(plan(0, &list).delete.len(), 5);
    }

    #[test]
    fn scale_in_takes_instances_knit_created_before_added_ones() {
        let added = |name: &str, st: &str, created_ms: i64| InstanceRecord {
            added: true,
            ..inst(name, st, created_ms)
        };
        let list = vec![
            added("mine-new", state::RUNNING, 9),
            added("mine-bad", state::FAILED, 8),
            inst("ours-old", state::RUNNING, 1),
            inst("ours-new", state::RUNNING, 5),
        ];
        assert_eq!(plan(3, &list).delete, vec!["ours-new"]);
        assert_eq!(plan(2, &list).delete, vec!["ours-new", "ours-old"]);
        assert_eq!(
            plan(1, &list).delete,
            vec!["ours-new", "ours-old", "mine-bad"]
        );
    }

    fn control_plane(dir: &std::path::Path) -> Arc<ControlPlane> {
        let store = crate::store::Store::open(&dir.join("k.db")).unwrap();
        Arc::new(ControlPlane::new(
            store,
            None,
            Arc::new(crate::bootstrap::NoCluster),
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
            cp.store.finish_intent(intent.id, "done", None).unwrap();
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
                    state: state::RUNNING,
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
            .filter(|i| i.action == "delete")
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
            state::RUNNING
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
            cp.store.finish_intent(intent.id, "done", None).unwrap();
        }
        let held = cp.plan_lock.lock().await;
        let reconciler = tokio::spawn({
            let cp = Arc::clone(&cp);
            async move { cp.plan_all().await.unwrap() }
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
            (mine.state.as_str(), mine.last_error.as_deref()),
            (state::DETACHED, Some("why"))
        );
        assert_eq!(cp.store.undo_attach("p-mine", "again").unwrap(), None);
        assert_eq!(replicas(&cp), 2, "the count drops once");
        assert_eq!(
            plan(2, &cp.store.instances(Some("p")).unwrap()),
            Plan::default()
        );
    }

    #[test]
    fn user_data_outcome_from_result_records() {
        let knit = |code: i64| {
            serde_json::json!({"v1": {"errors": []}, "knit": {"parts": [
                {"filename": "02-knit-init", "exitCode": 0},
                {"filename": "03-user-data", "exitCode": code, "error": null}
            ]}})
        };
        assert_eq!(user_data_outcome(&knit(0)), Ok(()));
        assert_eq!(
            user_data_outcome(&knit(3)),
            Err("user data exited with code 3".to_string())
        );
        let no_user_part =
            serde_json::json!({"knit": {"parts": [{"filename": "02-knit-init", "exitCode": 0}]}});
        assert_eq!(user_data_outcome(&no_user_part), Ok(()));
        let cloud_init = serde_json::json!({"v1": {"errors": ["script 03-user-data failed"]}});
        assert_eq!(
            user_data_outcome(&cloud_init),
            Err("script 03-user-data failed".to_string())
        );
        assert_eq!(
            user_data_outcome(&serde_json::json!({"v1": {"errors": []}})),
            Ok(())
        );
    }

    #[test]
    fn backoff_grows_and_caps() {
        assert_eq!(backoff_ms(1), 2000);
        assert_eq!(backoff_ms(2), 4000);
        assert_eq!(backoff_ms(10), 60_000);
    }
}
