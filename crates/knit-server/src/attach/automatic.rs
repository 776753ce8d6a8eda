//! Automatic mode: the instance is re-imaged with the pool's image and
//! user data, then joins like a scaled-out node. [`attach`] adds instances
//! on request; [`resume`] rolls forward (or undoes) an attach a stopped
//! server left half way.

use super::{context, enroll, field_error, record, rename_target, undo, AttachRecord};
use crate::control::ControlPlane;
use crate::error::{Result, ServerError};
use crate::preflight::{self, InstanceFacts, Mode};
use crate::store::{now_ms, IntentRecord};
use crate::{pki, userdata};
use knit_api::routes::Route;
use knit_api::state::{EventType, InstanceState};
use knit_api::views::{
    AttachFailure, AttachOutcome, AttachRequest, AttachResponse, AttachedInstance, PreflightReport,
};
use knit_api::NodePool;

/// The `mode` of an automatic attach's answer.
const AUTOMATIC: &str = "automatic";

/// `POST /api/v1/pools/{pool}/attach`: checks the request and every
/// instance; unless a dry run or refused, adds each instance in turn.
pub async fn attach(
    cp: &ControlPlane,
    pool_name: &str,
    req: &AttachRequest,
) -> Result<AttachResponse> {
    if req.instances.is_empty() {
        return Err(field_error(
            "instances",
            "[]".into(),
            "must name at least one instance",
        ));
    }
    let mut seen = std::collections::BTreeSet::new();
    if let Some(dup) = req.instances.iter().find(|i| !seen.insert(i.as_str())) {
        return Err(field_error(
            "instances",
            format!("{dup:?}"),
            "must not name an instance twice",
        ));
    }
    if let Some(p) = &req.password {
        knit_api::check_password(p).map_err(|rule| {
            field_error("password", format!("<{} chars>", p.chars().count()), &rule)
        })?;
    }
    let record = cp.store.live_pool(pool_name)?;
    let provider = cp.provider()?.clone();
    // The re-image uses the pool's image: one the provider cannot use (an
    // image directory that does not exist) refuses the whole request here,
    // before any instance is touched.
    if let Err(e) = provider.check_image(&record.pool.spec.image).await {
        return Err(field_error(
            "pool.spec.image",
            format!("{:?}", record.pool.spec.image),
            &format!(
                "must be an image provider {} can re-image with: {e}",
                provider.name()
            ),
        ));
    }
    let cluster = cp.cluster_doc()?;
    let mut facts = Vec::new();
    for id in &req.instances {
        match provider.get(id).await? {
            Some(_) => facts.push(provider.facts(id).await?),
            None => {
                return Err(ServerError::NotFound {
                    kind: "instance",
                    name: id.clone(),
                })
            }
        }
    }
    let adding = req.instances.len() as i64;
    let account = provider.account_id().await?;
    let mut reports = Vec::new();
    for f in &facts {
        let mut ctx = context(cp, Mode::Automatic, adding, req.password.is_some(), &f.id)?;
        ctx.keep_instance_name = req.keep_instance_name;
        if let Some(a) = &account {
            ctx.account_id = a.clone();
        }
        reports.push(preflight::check(&cluster, &record.pool, f, &ctx));
    }
    let passed = reports.iter().all(PreflightReport::passed);
    if req.dry_run || !passed {
        if !passed && !req.dry_run {
            let failed: Vec<String> = reports
                .iter()
                .filter(|r| !r.passed())
                .map(|r| {
                    format!(
                        "{}: {}",
                        r.instance,
                        r.errors()
                            .map(|e| e.code.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                })
                .collect();
            cp.store.add_event(
                EventType::Warning,
                "NodePool",
                pool_name,
                "AttachRefused",
                &format!("preflight failed: {}", failed.join("; ")),
            )?;
        }
        return Ok(AttachResponse {
            pool: pool_name.to_string(),
            mode: AUTOMATIC.into(),
            dry_run: req.dry_run,
            passed,
            preflight: reports,
            attached: Vec::new(),
        });
    }
    let mut attached = Vec::new();
    let mut all_ok = true;
    for f in &facts {
        match attach_one(cp, &record.pool, f, req).await {
            Ok(added) => attached.push(AttachOutcome::Attached(added)),
            Err(e) => {
                all_ok = false;
                attached.push(AttachOutcome::Failed(AttachFailure {
                    provider_id: f.id.clone(),
                    error: e.to_string(),
                    code: e.code().to_string(),
                }));
            }
        }
    }
    cp.wake();
    Ok(AttachResponse {
        pool: pool_name.to_string(),
        mode: AUTOMATIC.into(),
        dry_run: false,
        passed: all_ok,
        preflight: reports,
        attached,
    })
}

/// Claims an instance for this task: the dispatcher leaves its intents
/// alone meanwhile. Dropped (even by a cancelled request) → released, and a
/// pending attach intent left behind is resumed by the reconciler.
struct Claim<'a> {
    cp: &'a ControlPlane,
    name: String,
}

impl<'a> Claim<'a> {
    fn take(cp: &'a ControlPlane, name: &str) -> Claim<'a> {
        cp.in_flight
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name.to_string());
        Claim {
            cp,
            name: name.to_string(),
        }
    }
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        self.cp
            .in_flight
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.name);
        self.cp.wake();
    }
}

/// The destructive part of an automatic attach: a fresh join token and the
/// pool's composed user data, stop (when running), re-image (new system
/// disk, data disks kept under new ids, the new user data), which boots it.
/// Safe to run again: a resumed attach re-images once more.
async fn reimage_for_pool(
    cp: &ControlPlane,
    pool: &NodePool,
    name: &str,
    provider_id: &str,
    live: bool,
) -> Result<InstanceFacts> {
    let provider = cp.provider()?.clone();
    let pool_name = &pool.metadata.name;
    let agent_sha256 = cp.mirror_sha256("bin/knit-agent")?.ok_or_else(|| {
        ServerError::Package(format!(
            "the package mirror ({}) has no bin/knit-agent: run `knit package build`",
            cp.mirror_dir.display()
        ))
    })?;
    let token = cp.issue_join_token(name, pool_name)?;
    let stub = userdata::agent_stub(&userdata::StubParams {
        mirror_url: &format!("{}{}", cp.advertise_url, Route::Mirror.prefix()),
        agent_sha256: &agent_sha256,
        bootstrap_url: &format!("{}{}", cp.advertise_url, Route::Bootstrap.path()),
        join_token: &token,
        ca_pem: &cp.ca_pem,
    })?;
    let user_data = userdata::compose(&pool.spec.pre_user_data, &stub, &pool.spec.user_data)?;
    // Before anything is stopped: the pool's image must be usable, and an
    // instance that does not keep its name takes its node name (the pool's
    // rule), so the new system boots with it as its hostname.
    provider.check_image(&pool.spec.image).await?;
    if let Some(node_name) = rename_target(cp, pool, name)? {
        provider.rename(provider_id, &node_name).await?;
    }
    let running = provider
        .get(provider_id)
        .await?
        .is_some_and(|i| i.state.eq_ignore_ascii_case("running"));
    if running {
        provider.stop(provider_id).await?;
    }
    if live {
        crate::pause::pause_at("attach-after-stop").await;
    }
    provider
        .reimage(provider_id, &pool.spec.image, &user_data)
        .await?;
    provider.facts(provider_id).await
}

/// Bookkeeping after the re-image: new disk ids, instance `Running`, the
/// intent done, event `Attached`.
fn finish_attach(
    cp: &ControlPlane,
    rec: &mut AttachRecord,
    after: &InstanceFacts,
    intent: Option<i64>,
    how: &str,
) -> Result<()> {
    rec.new_disks = after.data_disks.iter().map(|d| d.id.clone()).collect();
    rec.reimaged_ms.get_or_insert_with(now_ms);
    cp.store.put_attach_record(rec)?;
    cp.store
        .set_attached_running(&rec.instance, after.ip.as_deref())?;
    if let Some(id) = intent {
        cp.store
            .finish_intent(id, knit_api::state::IntentStatus::Done, None)?;
    }
    let disks = rec
        .old_disks
        .iter()
        .zip(&rec.new_disks)
        .map(|(a, b)| format!("{a} -> {b}"))
        .collect::<Vec<_>>();
    cp.store.add_event(
        EventType::Normal,
        "Instance",
        &rec.instance,
        "Attached",
        &format!(
            "{} re-imaged with pool {}'s image and user data{how}; data disks kept: {}",
            rec.provider_id,
            rec.pool,
            if disks.is_empty() {
                "none".to_string()
            } else {
                disks.join(", ")
            }
        ),
    )?;
    Ok(())
}

async fn attach_one(
    cp: &ControlPlane,
    pool: &NodePool,
    f: &InstanceFacts,
    req: &AttachRequest,
) -> Result<AttachedInstance> {
    let pool_name = &pool.metadata.name;
    // Refused here, before anything changes, rather than half way.
    if cp.mirror_sha256("bin/knit-agent")?.is_none() {
        return Err(ServerError::Package(format!(
            "the package mirror ({}) has no bin/knit-agent: run `knit package build`",
            cp.mirror_dir.display()
        )));
    }
    userdata::compose(&pool.spec.pre_user_data, "", &pool.spec.user_data)?;
    let name = format!("{pool_name}-{}", pki::random_lower_alnum(5)?);
    // Held until this attach ends: the reconciler resumes the intent only
    // when nobody works on it (after a restart or a dropped request).
    let _claim = Claim::take(cp, &name);
    let mut rec = AttachRecord {
        instance: name.clone(),
        provider_id: f.id.clone(),
        pool: pool_name.clone(),
        mode: Mode::Automatic,
        instance_name: f.name.clone(),
        keep_instance_name: req.keep_instance_name,
        format_data_disk: req.format_data_disk,
        old_disks: f.data_disks.iter().map(|d| d.id.clone()).collect(),
        new_disks: Vec::new(),
        at_ms: now_ms(),
        reimaged_ms: None,
        new_password: req.password.is_some(),
    };
    // The record and the intent are written with the instance row and the
    // count, before the first destructive step: a resumed attach always
    // finds its record.
    let intent = enroll(cp, pool_name, &name, f, InstanceState::Creating, &rec, true).await?;
    let outcome = async {
        let after = reimage_for_pool(cp, pool, &name, &f.id, true).await?;
        // The new system disk has the image's root password; the new one is
        // set inside now. It is never stored (see `resume`).
        if let Some(password) = &req.password {
            cp.provider()?.set_password(&f.id, password).await?;
        }
        Ok::<_, ServerError>(after)
    }
    .await;
    match outcome {
        Ok(after) => {
            finish_attach(cp, &mut rec, &after, intent, "")?;
            Ok(AttachedInstance {
                provider_id: f.id.clone(),
                instance: name,
                ip: after.ip,
                // Kept, or renamed to the pool rule's node name.
                node_name: after.name.to_lowercase(),
                old_disks: rec.old_disks,
                new_disks: rec.new_disks,
            })
        }
        Err(e) => {
            undo(cp, &name, &format!("attach of {} failed: {e}", f.id)).await?;
            Err(e)
        }
    }
}

/// Resumes an automatic attach whose server stopped half way (its intent
/// is still pending): roll forward — re-image again unless the re-image
/// had finished, then it is an ordinary node (join timeout, readiness) —
/// or, when that cannot be done, undo the add with the reason. The desired
/// count was raised once, by the enrollment, and is not touched again
/// unless undone.
pub async fn resume(cp: &ControlPlane, intent: &IntentRecord) -> Result<()> {
    let Some(instance) = cp.store.instance(&intent.instance)? else {
        return cp.store.finish_intent(
            intent.id,
            knit_api::state::IntentStatus::Cancelled,
            Some("instance record gone"),
        );
    };
    if instance.state != InstanceState::Creating {
        // Removed (or finished) meanwhile: nothing to roll forward.
        return cp.store.finish_intent(
            intent.id,
            knit_api::state::IntentStatus::Cancelled,
            Some(&format!("instance is {}", instance.state)),
        );
    }
    let Some(mut rec) = record(cp, &instance.name)? else {
        return undo(
            cp,
            &instance.name,
            "the attach was interrupted and its record is missing, so it cannot resume",
        )
        .await;
    };
    let Some(pool) = cp.store.pool(&intent.pool)?.filter(|p| !p.deleting) else {
        return undo(
            cp,
            &instance.name,
            "the attach was interrupted and its pool is gone or being deleted",
        )
        .await;
    };
    let provider = cp.provider()?.clone();
    if rec.reimaged_ms.is_some() {
        // Re-imaged before the server stopped: only the bookkeeping is left.
        let after = provider.facts(&rec.provider_id).await?;
        return finish_attach(
            cp,
            &mut rec,
            &after,
            Some(intent.id),
            " (resumed after a server restart)",
        );
    }
    if rec.new_password {
        return undo(
            cp,
            &instance.name,
            "the attach was interrupted before its re-image and the new password is never stored, so it cannot resume; nothing more was changed (the instance may be stopped)",
        )
        .await;
    }
    if provider.get(&rec.provider_id).await?.is_none() {
        return undo(
            cp,
            &instance.name,
            &format!(
                "the attach was interrupted and instance {} no longer exists at provider {}",
                rec.provider_id,
                provider.name()
            ),
        )
        .await;
    }
    cp.store.add_event(
        EventType::Normal,
        "Instance",
        &instance.name,
        "AttachResuming",
        &format!(
            "the server stopped during the attach of {}; resuming it (re-image with the pool's image and user data)",
            rec.provider_id
        ),
    )?;
    match reimage_for_pool(cp, &pool.pool, &instance.name, &rec.provider_id, false).await {
        Ok(after) => finish_attach(
            cp,
            &mut rec,
            &after,
            Some(intent.id),
            " (resumed after a server restart)",
        ),
        Err(e) => {
            let attempts = intent.attempts + 1;
            if attempts >= cp.settings.max_create_attempts {
                undo(
                    cp,
                    &instance.name,
                    &format!(
                        "resuming the attach of {} failed {attempts} time(s): {e}",
                        rec.provider_id
                    ),
                )
                .await?;
            } else {
                let delay = (1000i64 << attempts.clamp(0, 6)).min(60_000);
                cp.store
                    .retry_intent(intent.id, attempts, now_ms() + delay, &e)?;
                cp.store.add_event(
                    EventType::Warning,
                    "Instance",
                    &instance.name,
                    "AttachRetry",
                    &format!(
                        "resume attempt {attempts} failed, retrying in {} s: {e}",
                        delay / 1000
                    ),
                )?;
            }
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_attach_request_never_shows_its_password() {
        let req: AttachRequest =
            serde_json::from_str(r#"{"instances": ["i-1"], "password": "N3w-pass!x7"}"#).unwrap();
        let shown = format!("{req:?}");
        assert!(!shown.contains("N3w-pass!x7"), "{shown}");
        assert!(shown.contains("(redacted)"), "{shown}");
    }

    /// The answer's JSON as the server sent it when it built it by hand.
    #[test]
    fn the_answer_keeps_its_json() {
        let answer = AttachResponse {
            pool: "workers".into(),
            mode: AUTOMATIC.into(),
            dry_run: false,
            passed: false,
            preflight: Vec::new(),
            attached: vec![
                AttachOutcome::Attached(AttachedInstance {
                    provider_id: "i-1".into(),
                    instance: "workers-abcde".into(),
                    ip: None,
                    node_name: "own-db".into(),
                    old_disks: vec!["d-1".into()],
                    new_disks: vec!["d-2".into()],
                }),
                AttachOutcome::Failed(AttachFailure {
                    provider_id: "i-2".into(),
                    error: "boom".into(),
                    code: "Provider".into(),
                }),
            ],
        };
        assert_eq!(
            serde_json::to_value(&answer).unwrap(),
            serde_json::json!({
                "pool": "workers", "mode": "automatic", "dryRun": false,
                "passed": false, "preflight": [], "attached": [
                    {"providerId": "i-1", "instance": "workers-abcde", "ip": null,
                     "nodeName": "own-db", "oldDisks": ["d-1"], "newDisks": ["d-2"]},
                    {"providerId": "i-2", "error": "boom", "code": "Provider"},
                ],
            })
        );
    }
}
