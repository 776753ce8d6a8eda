//! Carrying out intents: each create and delete is written before the
//! provider is called, then run with bounded parallelism, retried with
//! backoff, and ended with an event.

use crate::cluster::seam::CLUSTER_CALL_TIMEOUT;
use crate::control::ControlPlane;
use crate::error::{Result, ServerError};
use crate::pki;
use crate::provider::{
    fallback, within, DiskTemplate, InstanceTemplate, Provider, ProviderInstance, CALL_TIMEOUT,
    TAG_NAME, TAG_POOL,
};
use crate::store::{now_ms, InstanceRecord, IntentRecord};
use crate::userdata;
use knit_api::routes::Route;
use knit_api::state::{EventType, InstanceState};
use std::sync::Arc;

fn backoff_ms(attempts: i64) -> i64 {
    let exp = attempts.clamp(0, 6) as u32;
    (1000i64 << exp).min(60_000)
}

impl ControlPlane {
    /// Starts every pending intent that is due, at most `parallelism` at a
    /// time, never two for the same instance. True while any intent is
    /// pending (started now, running or waiting for its retry).
    pub fn dispatch(self: &Arc<Self>) -> Result<bool> {
        let Some(_provider) = &self.provider else {
            return Ok(false);
        };
        let now = now_ms();
        let intents = self.store.pending_intents()?;
        let pending = !intents.is_empty();
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
            // Carries the leader's fence: a lost lease refuses its writes.
            crate::ha::spawn(async move {
                // The permit bounds provider calls across all pools.
                let permit = cp.parallelism.clone().acquire_owned().await;
                let instance = intent.instance.clone();
                if let Err(e) = cp.run_intent(&intent).await {
                    tracing::warn!(instance = %instance, error = %e, "intent failed");
                    if let Err(e) = cp.defer_failed_intent(&intent, &e) {
                        tracing::error!(instance = %instance, error = %e, "deferring a failed intent failed");
                    }
                }
                drop(permit);
                cp.in_flight
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&instance);
                cp.wake.notify_one();
            });
        }
        Ok(pending)
    }

    /// An intent whose run failed before it set its own retry (an error
    /// from the store or the cluster returned early) is retried after the
    /// same backoff, never at once: the loop is woken after every run, so
    /// such a failure was retried in a tight loop (160,000 times in twenty
    /// minutes against an API server that refused connections).
    fn defer_failed_intent(&self, intent: &IntentRecord, error: &ServerError) -> Result<()> {
        let Some(current) = self
            .store
            .pending_intents()?
            .into_iter()
            .find(|i| i.id == intent.id)
        else {
            return Ok(()); // finished or cancelled meanwhile
        };
        if current.attempts > intent.attempts || current.next_attempt_ms > now_ms() {
            return Ok(()); // its own path set the retry
        }
        let attempts = intent.attempts + 1;
        let delay = backoff_ms(attempts);
        self.store
            .retry_intent(intent.id, attempts, now_ms() + delay, error)?;
        self.store.add_event(
            EventType::Warning,
            "Instance",
            &intent.instance,
            "IntentRetry",
            &format!(
                "{} attempt {attempts} failed, retrying in {} s: {error}",
                intent.action.as_str(),
                delay / 1000
            ),
        )
    }

    async fn run_intent(&self, intent: &IntentRecord) -> Result<()> {
        // Re-read: the intent may have been cancelled while it waited.
        if self.store.intent_status(intent.id)? != Some(knit_api::state::IntentStatus::Pending) {
            return Ok(());
        }
        match intent.action {
            knit_api::state::IntentAction::Create => self.run_create(intent).await,
            knit_api::state::IntentAction::Delete => self.run_delete(intent).await,
            knit_api::state::IntentAction::Attach => crate::attach::resume(self, intent).await,
        }
    }

    async fn run_create(&self, intent: &IntentRecord) -> Result<()> {
        let provider = self.provider()?;
        let Some(instance) = self.store.instance(&intent.instance)? else {
            return self.store.finish_intent(
                intent.id,
                knit_api::state::IntentStatus::Cancelled,
                Some("instance record gone"),
            );
        };
        let Some(pool) = self.store.pool(&intent.pool)? else {
            return self.store.finish_intent(
                intent.id,
                knit_api::state::IntentStatus::Cancelled,
                Some("pool gone"),
            );
        };
        self.store
            .set_instance_state(&instance.name, InstanceState::Creating, None)?;
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
            self.store.prove_lease()?;
            within(
                provider.name(),
                "releasing a half-made instance",
                CALL_TIMEOUT,
                provider.delete(&existing.id),
            )
            .await?;
            self.store.add_event(
                EventType::Normal,
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
                self.create_with_fallback(provider.as_ref(), &template, &pool.pool)
                    .await
            }
            Err(e) => Err(e),
        };
        match outcome {
            Ok(created) => {
                crate::pause::delay_at("create-provider-returned").await;
                if self.store.intent_status(intent.id)?
                    != Some(knit_api::state::IntentStatus::Pending)
                {
                    // Cancelled by a scale-in meanwhile: the delete intent
                    // that cancelled it will find the instance by name.
                    self.store
                        .set_instance_state(&instance.name, InstanceState::Deleting, None)?;
                    return Ok(());
                }
                self.adopt(intent, &instance, &created, "Created", "created")?;
                self.metrics.instance_created(&intent.pool);
                Ok(())
            }
            Err(e) => {
                self.metrics.instance_create_failed(&intent.pool);
                let message = e.to_string();
                // Nothing half-made stays behind; but what is found by this
                // name may be another leader's, made after this one lost
                // its lease (paused mid-create): then it is left alone.
                self.store.prove_lease()?;
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
                        .set_instance_failure(&instance.name, InstanceState::Failed, &e)?;
                    self.store.finish_intent(
                        intent.id,
                        knit_api::state::IntentStatus::Failed,
                        Some(&message),
                    )?;
                    self.store.add_event(
                        EventType::Warning,
                        "Instance",
                        &instance.name,
                        "CreateFailed",
                        &format!("gave up after {attempts} attempt(s): {message}"),
                    )?;
                } else {
                    let delay = backoff_ms(attempts);
                    self.store
                        .set_instance_failure(&instance.name, InstanceState::Pending, &e)?;
                    self.store
                        .retry_intent(intent.id, attempts, now_ms() + delay, &e)?;
                    self.store.add_event(
                        EventType::Warning,
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
        self.store.record_instance_created(
            &instance.name,
            &found.id,
            found.ip.as_deref(),
            intent.id,
            reason,
            &format!(
                "{what}: {} ({}) at provider {}",
                found.id,
                found.ip.as_deref().unwrap_or("no IP yet"),
                self.provider.as_ref().map(|p| p.name()).unwrap_or("none")
            ),
        )?;
        if !instance.added {
            self.metrics.node_startup(
                crate::metrics::StartupStage::Running,
                &instance.pool,
                self.provider.as_ref().map_or("none", |p| p.name()),
                instance.created_ms,
                crate::store::now_ms(),
            );
        }
        Ok(())
    }

    /// Creates `template`'s instance with the pool's instance types in
    /// order, the next on a capacity error (`provider::fallback`): each
    /// move an `InstanceTypeFallback` event on the instance, and the type
    /// it was made with recorded when it is not the one planned.
    async fn create_with_fallback(
        &self,
        provider: &dyn Provider,
        template: &InstanceTemplate,
        pool: &knit_api::NodePool,
    ) -> Result<ProviderInstance> {
        let types = fallback::order(&template.instance_type, &pool.spec.instance_types);
        let (created, made_with) = fallback::create(provider, template, &types, &mut |no_room| {
            self.store.add_event(
                EventType::Warning,
                "Instance",
                no_room.instance,
                "InstanceTypeFallback",
                &no_room.message(),
            )
        })
        .await?;
        if made_with != template.instance_type {
            self.store.set_instance_type(&template.name, &made_with)?;
        }
        Ok(created)
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
        let mirror_url = format!("{}{}", self.advertise_url, Route::Mirror.prefix());
        let bootstrap_url = format!("{}{}", self.advertise_url, Route::Bootstrap.path());
        let stub = userdata::agent_stub(&userdata::StubParams {
            mirror_url: &mirror_url,
            agent_sha256: &agent_sha256,
            bootstrap_url: &bootstrap_url,
            join_token: &token,
            ca_pem: &self.ca_pem,
        })?;
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
            light: pool.spec.runtime == knit_api::config::RUNTIME_NONE,
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
        // The drain comes first (crate::drain): no machine is released,
        // stopped or put back while pods that have not been evicted run on
        // it. A drain that waits (a PodDisruptionBudget, pods terminating)
        // leaves the intent pending and comes back later; its state is
        // stored, so a restart or a new leader resumes it.
        let nodes: Vec<String> = self
            .store
            .nodes()?
            .into_iter()
            .filter(|n| n.instance == intent.instance)
            .map(|n| n.name)
            .collect();
        for node in &nodes {
            match self
                .drain_step(intent.id, &intent.instance, node, &intent.pool)
                .await?
            {
                crate::drain::Progress::Done => {}
                crate::drain::Progress::Wait(ms) => {
                    self.store.defer_intent(intent.id, now_ms() + ms)?;
                    return Ok(());
                }
            }
        }
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
        // A leader paused past its lease must not act on a machine another
        // leader now owns.
        self.store.prove_lease()?;
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
                        EventType::Warning,
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
                .retry_intent(intent.id, attempts, now_ms() + delay, &e)?;
            self.store.add_event(
                EventType::Warning,
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
        // Drained above; the Node object goes after the instance is
        // stopped, gone or its kubelet stopped by the undo, so that the
        // kubelet cannot register it again.
        for node in &nodes {
            within(
                "cluster",
                "removing the node",
                CLUSTER_CALL_TIMEOUT,
                self.cluster.remove_node(node),
            )
            .await?;
        }
        // The instance is gone from the pool: the bootstrap tokens of its
        // node (the one it registered, or the one it was to be, if it never
        // did) are revoked, so the machine cannot get a certificate again.
        let mut named = nodes.clone();
        if let Some(i) = instance.as_ref() {
            // The name join.rs binds its token to: the kept instance name
            // of an added instance, else the pool's rule.
            let kept = crate::attach::node_name(self, i)?;
            let by_rule = match (&kept, self.store.pool(&intent.pool)?) {
                (None, Some(pool)) => crate::bootstrap::expected_node_name(
                    &self.cluster_doc()?.spec.region,
                    i,
                    &pool.pool,
                ),
                _ => None,
            };
            named.extend(kept.into_iter().chain(by_rule));
        }
        named.sort();
        named.dedup();
        for node in &named {
            within(
                "cluster",
                "revoking the node's bootstrap tokens",
                CLUSTER_CALL_TIMEOUT,
                self.cluster.revoke_join(node),
            )
            .await?;
        }
        if intent.release {
            self.store.remove_instance(&intent.instance)?;
            self.store.add_event(
                EventType::Normal,
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
                .set_instance_state(&intent.instance, InstanceState::Detached, None)?;
            self.store.add_event(
                EventType::Normal,
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
        self.store
            .finish_intent(intent.id, knit_api::state::IntentStatus::Done, None)?;
        self.metrics.instance_deleted(&intent.pool);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::bootstrap::{ClusterJoin, JoinMaterial};
    use crate::provider::{Provider, ProviderSnapshot};
    use async_trait::async_trait;
    use knit_api::{PhaseEvent, PhaseName, PhaseOutcome};
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A cloud that has no instance (the one being deleted is gone).
    struct EmptyCloud;

    fn refused() -> ServerError {
        ServerError::from(crate::provider::ProviderError::failed(
            "empty",
            "not in this test",
        ))
    }

    #[async_trait]
    impl Provider for EmptyCloud {
        fn name(&self) -> &str {
            "empty"
        }
        async fn create(&self, _: &InstanceTemplate) -> Result<ProviderInstance> {
            Err(refused())
        }
        async fn get(&self, _: &str) -> Result<Option<ProviderInstance>> {
            Ok(None)
        }
        async fn list(&self) -> Result<Vec<ProviderInstance>> {
            Ok(Vec::new())
        }
        async fn start(&self, _: &str) -> Result<()> {
            Err(refused())
        }
        async fn stop(&self, _: &str) -> Result<()> {
            Err(refused())
        }
        async fn reimage(&self, _: &str, _: &str, _: &str) -> Result<()> {
            Err(refused())
        }
        async fn check_image(&self, _: &str) -> Result<()> {
            Ok(())
        }
        async fn rename(&self, _: &str, _: &str) -> Result<()> {
            Err(refused())
        }
        async fn set_password(&self, _: &str, _: &str) -> Result<()> {
            Err(refused())
        }
        async fn delete(&self, _: &str) -> Result<()> {
            Err(refused())
        }
        async fn read_file(&self, _: &str, _: &str) -> Result<Vec<u8>> {
            Err(refused())
        }
        async fn snapshot_create(&self, _: &str, _: usize, _: &str) -> Result<ProviderSnapshot> {
            Err(refused())
        }
        async fn snapshot_delete(&self, _: &str) -> Result<()> {
            Err(refused())
        }
    }

    /// An API server that refuses every node removal, counting them.
    #[derive(Default)]
    struct RefusingCluster(AtomicUsize);

    #[async_trait]
    impl ClusterJoin for RefusingCluster {
        async fn join_material(&self, _: &str, _: &str) -> Result<Option<JoinMaterial>> {
            Ok(None)
        }
        async fn remove_node(&self, _: &str) -> Result<()> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Err(ServerError::Internal("connection refused".into()))
        }
        async fn node_status(&self, _: &str) -> Result<Option<String>> {
            Ok(None)
        }
        async fn node_statuses(&self) -> Result<Vec<(String, String)>> {
            Ok(Vec::new())
        }
        fn attached(&self) -> bool {
            true
        }
        async fn remove_taint(&self, _: &str, _: &str) -> Result<bool> {
            Ok(false)
        }
    }

    #[tokio::test]
    async fn an_intent_that_fails_early_waits_its_backoff() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::Store::open(&dir.path().join("k.db")).unwrap();
        let cluster = Arc::new(RefusingCluster::default());
        let cp = Arc::new(ControlPlane::new(
            store,
            Some(Arc::new(EmptyCloud)),
            cluster.clone(),
            crate::control::Settings::new(dir.path().to_path_buf()),
            String::new(),
            String::new(),
            String::new(),
        ));
        let pool = knit_api::NodePool::new("p", knit_api::NodePoolSpec::default());
        cp.store.insert_pool(&pool).unwrap();
        cp.store
            .add_create_intents("p", &[("p-a".into(), "t".into())])
            .unwrap();
        let instance = cp.store.instance("p-a").unwrap().unwrap();
        let event = PhaseEvent {
            node: "local.i-1".into(),
            instance_id: "i-1".into(),
            phase: PhaseName::TimeSync,
            outcome: PhaseOutcome::Done,
            reason: None,
            error_code: None,
            at_ms: 1,
            duration_ms: Some(1),
        };
        cp.store.record_phase_event(&instance, &event).unwrap();
        cp.store
            .add_delete_intents("p", &["p-a".into()], true)
            .unwrap();
        // Dispatch as the loop does when woken, many times over.
        for _ in 0..20 {
            cp.dispatch().unwrap();
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        assert_eq!(
            cluster.0.load(Ordering::SeqCst),
            1,
            "retried before its backoff"
        );
        let pending = cp.store.pending_intents().unwrap();
        let delete = pending.iter().find(|i| i.instance == "p-a").unwrap();
        assert_eq!(delete.attempts, 1);
        assert!(delete.next_attempt_ms > now_ms() + 1000);
        assert!(delete
            .last_error
            .as_deref()
            .unwrap_or("")
            .contains("connection refused"));
    }

    #[test]
    fn backoff_grows_and_caps() {
        assert_eq!(backoff_ms(1), 2000);
        assert_eq!(backoff_ms(2), 4000);
        assert_eq!(backoff_ms(10), 60_000);
    }
}
