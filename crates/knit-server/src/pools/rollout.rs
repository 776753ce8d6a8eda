//! A pool's rollout as the API shows and steers it: its status (up to
//! date / total, state, reason), `knit rollout pause|resume|restart|undo`
//! and the pool's revisions. The replacing itself is the reconciler's
//! (`crate::reconcile::rollout`).

use crate::control::ControlPlane;
use crate::error::{Result, ServerError};
use crate::names;
use crate::pool_state::rollout_counts;
use crate::store::{InstanceRecord, NodeRecord, PoolRecord};
use knit_api::state::{EventType, InstanceState, NodeStatus};
use knit_api::update::{changed_fields, pool_template_hash, with_template_of};
use knit_api::views::{
    PoolRevisionView, PoolStatus, PoolView, RolloutView, ROLLOUT_COMPLETE, ROLLOUT_PAUSED,
    ROLLOUT_PROGRESSING, ROLLOUT_STOPPED, ROLLOUT_WAITING,
};
use knit_api::{ApiError, FieldError};
use std::collections::{HashMap, HashSet};

/// The pool's current template hash (what new machines are made from).
pub fn current_hash(cp: &ControlPlane, spec: &knit_api::NodePoolSpec) -> Result<String> {
    let version = cp.cluster_doc()?.spec.kubernetes_version;
    Ok(pool_template_hash(spec, &version))
}

/// Instances whose node is available: Running, initialized and (joining a
/// cluster) Ready.
pub fn available(
    cp: &ControlPlane,
    instances: &[InstanceRecord],
    nodes: &[NodeRecord],
) -> HashSet<String> {
    let attached = cp.cluster.attached();
    let by_instance = crate::store::nodes_by_instance(nodes);
    instances
        .iter()
        .filter(|i| i.state == InstanceState::Running)
        .filter(|i| {
            by_instance.get(i.name.as_str()).is_some_and(|mine| {
                mine.iter()
                    .any(|n| n.initialized() && (!attached || n.status == NodeStatus::Ready))
            })
        })
        .map(|i| i.name.clone())
        .collect()
}

/// The rollout part of a pool's status: observed generation, updated
/// replicas, the current hash and where the rollout stands.
pub fn status(cp: &ControlPlane, record: &PoolRecord) -> Result<PoolStatus> {
    let name = &record.pool.metadata.name;
    let instances = cp.store.instances(Some(name))?;
    status_of(cp, record, &instances, &cp.store.nodes()?)
}

/// [`status`] from the pool's instances and the nodes (of every pool) the
/// caller read: the reconciler's pass has them already.
pub fn status_of(
    cp: &ControlPlane,
    record: &PoolRecord,
    instances: &[InstanceRecord],
    nodes: &[NodeRecord],
) -> Result<PoolStatus> {
    let name = &record.pool.metadata.name;
    let spec = &record.pool.spec;
    let current = current_hash(cp, spec)?;
    let hashes = cp.store.instance_hashes(Some(name))?;
    let nodes: Vec<NodeRecord> = nodes.iter().filter(|n| &n.pool == name).cloned().collect();
    let available = available(cp, instances, &nodes);
    let c = rollout_counts(instances, &hashes, &current, &available);
    let desired = spec.replicas.max(0) as usize;
    let stop = cp
        .store
        .rollout_stop(name)?
        .filter(|s| s.template_hash == current);
    let complete = c.outdated == 0 && c.total == desired && c.updated_available >= desired;
    let (state, reason, message) = if complete {
        (ROLLOUT_COMPLETE, None, None)
    } else if let Some(s) = stop {
        (ROLLOUT_STOPPED, Some(s.reason), Some(s.message))
    } else if spec.paused {
        (
            ROLLOUT_PAUSED,
            Some("Paused".to_string()),
            Some(format!(
                "paused: nothing is replaced until knit rollout resume pool {name}"
            )),
        )
    } else if spec.update_strategy.on_delete() && c.outdated > 0 {
        (
            ROLLOUT_WAITING,
            Some("OnDelete".to_string()),
            Some(
                "updateStrategy OnDelete: an out-of-date node is replaced when it is removed"
                    .to_string(),
            ),
        )
    } else {
        (ROLLOUT_PROGRESSING, None, None)
    };
    let revision = cp
        .store
        .pool_revisions(name)?
        .last()
        .map_or(0, |r| r.revision);
    Ok(PoolStatus {
        observed_generation: record.observed_generation,
        updated_replicas: c.updated as i64,
        template_hash: Some(current),
        rollout: (!record.deleting).then(|| RolloutView {
            state: state.to_string(),
            updated: c.updated as i64,
            updated_available: c.updated_available as i64,
            outdated: c.outdated as i64,
            total: c.total as i64,
            available: c.available as i64,
            revision,
            reason,
            message,
        }),
        ..PoolStatus::default()
    })
}

/// An instance's template hash and whether it is its pool's current one
/// (`None`: added by attach, or its pool is gone).
pub type Currency = (Option<String>, Option<bool>);

/// Each instance's [`Currency`], by instance name.
pub fn instance_currency(cp: &ControlPlane) -> Result<HashMap<String, Currency>> {
    let version = cp.cluster_doc()?.spec.kubernetes_version;
    let current: HashMap<String, String> = cp
        .store
        .pools()?
        .into_iter()
        .map(|p| {
            let hash = pool_template_hash(&p.pool.spec, &version);
            (p.pool.metadata.name, hash)
        })
        .collect();
    let pools: HashMap<String, String> = cp
        .store
        .instances(None)?
        .into_iter()
        .map(|i| (i.name, i.pool))
        .collect();
    Ok(cp
        .store
        .instance_hashes(None)?
        .into_iter()
        .map(|(name, hash)| {
            let now = pools.get(&name).and_then(|p| current.get(p));
            let fresh = match (&hash, now) {
                (Some(h), Some(c)) => Some(h == c),
                _ => None,
            };
            (name, (hash, fresh))
        })
        .collect())
}

/// The pool (not being deleted) changed by `change` under the plan lock,
/// so that a scale or the reconciler never interleaves with it.
async fn change_pool(
    cp: &ControlPlane,
    name: &str,
    change: impl FnOnce(&mut knit_api::NodePool) -> Result<Option<(&'static str, String)>>,
) -> Result<PoolView> {
    names::check_pool("metadata.name", name)?;
    {
        let _guard = cp.plan_lock.lock().await;
        let mut pool = cp.store.live_pool(name)?.pool;
        if let Some((reason, message)) = change(&mut pool)? {
            pool.validate()?;
            super::check_quota(cp, &pool)?;
            cp.store.update_pool(&pool)?;
            cp.store
                .add_event(EventType::Normal, "NodePool", name, reason, &message)?;
        }
    }
    cp.wake();
    super::get(cp, name)
}

/// `knit rollout pause|resume`: sets `spec.paused`. A resume also lets a
/// rollout stopped by its progress deadline try again: the replacements
/// that failed are released and made anew.
pub async fn set_paused(cp: &ControlPlane, name: &str, paused: bool) -> Result<PoolView> {
    if !paused {
        resume_stopped(cp, name)?;
    }
    change_pool(cp, name, |pool| {
        if pool.spec.paused == paused {
            return Ok(None);
        }
        pool.spec.paused = paused;
        Ok(Some(if paused {
            (
                "RolloutPaused",
                "rollout paused: nothing is replaced until resumed".to_string(),
            )
        } else {
            ("RolloutResumed", "rollout resumed".to_string())
        }))
    })
    .await
}

fn resume_stopped(cp: &ControlPlane, name: &str) -> Result<()> {
    let Some(stop) = cp.store.rollout_stop(name)? else {
        return Ok(());
    };
    let hashes = cp.store.instance_hashes(Some(name))?;
    let failed: Vec<String> = cp
        .store
        .instances(Some(name))?
        .into_iter()
        .filter(|i| i.state == InstanceState::Failed && !i.added)
        .filter(|i| hashes.get(&i.name).and_then(|h| h.as_deref()) == Some(&stop.template_hash))
        .map(|i| i.name)
        .collect();
    if !failed.is_empty() {
        cp.store.add_delete_intents(name, &failed, true)?;
    }
    if cp.store.clear_rollout_stop(name)? {
        cp.store.add_event(
            EventType::Normal,
            "NodePool",
            name,
            "RolloutResumed",
            &format!(
                "the stopped rollout tries again{}",
                if failed.is_empty() {
                    String::new()
                } else {
                    format!(
                        " (releasing the failed replacement(s) {})",
                        failed.join(", ")
                    )
                }
            ),
        )?;
    }
    Ok(())
}

/// Now in RFC 3339 with milliseconds, UTC (`2026-12-03T13:45:00.123Z`),
/// as `restartedAt` has always been written.
fn rfc3339_ms_now() -> Result<String> {
    Ok(knit_os::time::rfc3339_millis(knit_os::time::now_ms()))
}

/// `knit rollout restart`: every node replaced (a new `restartedAt`, part
/// of the template hash).
pub async fn restart(cp: &ControlPlane, name: &str) -> Result<PoolView> {
    let at = rfc3339_ms_now()?;
    change_pool(cp, name, |pool| {
        pool.spec.restarted_at = Some(at.clone());
        Ok(Some((
            "RolloutRestart",
            format!("restart at {at}: every node is replaced"),
        )))
    })
    .await
}

/// `knit rollout undo [--to-revision N]`: the template (and labels and
/// taints) of an earlier revision, the size and knit's settings kept.
/// Without a revision, the newest one whose template is not the current.
pub async fn undo(cp: &ControlPlane, name: &str, to_revision: Option<i64>) -> Result<PoolView> {
    names::check_pool("metadata.name", name)?;
    let revisions = cp.store.pool_revisions(name)?;
    let record = cp.store.live_pool(name)?;
    if record.pool.spec.paused {
        return Err(ServerError::Conflict(format!(
            "pool {name:?} is paused: knit rollout resume pool {name} first"
        )));
    }
    let current = current_hash(cp, &record.pool.spec)?;
    let target = match to_revision {
        Some(n) => revisions.iter().find(|r| r.revision == n).ok_or_else(|| {
            ServerError::from(ApiError::Invalid(vec![FieldError {
                field: "toRevision".into(),
                value: n.to_string(),
                rule: format!(
                    "no such revision of pool {name:?} (kept: {})",
                    revisions
                        .iter()
                        .map(|r| r.revision.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            }]))
        })?,
        None => revisions
            .iter()
            .rev()
            .find(|r| r.template_hash != current)
            .ok_or_else(|| {
                ServerError::Conflict(format!(
                    "pool {name:?} has no earlier revision to go back to"
                ))
            })?,
    };
    let revision = target.revision;
    let spec = target.spec.clone();
    change_pool(cp, name, move |pool| {
        pool.spec = with_template_of(&pool.spec, &spec);
        Ok(Some((
            "RolledBack",
            format!("rolled back to the template of revision {revision}"),
        )))
    })
    .await
}

/// The pool's kept revisions, oldest first, each with what changed from
/// the one before.
pub fn revisions(cp: &ControlPlane, name: &str) -> Result<Vec<PoolRevisionView>> {
    names::check_pool("metadata.name", name)?;
    cp.store.live_pool(name)?;
    let revisions = cp.store.pool_revisions(name)?;
    Ok(revisions
        .iter()
        .enumerate()
        .map(|(i, r)| PoolRevisionView {
            revision: r.revision,
            generation: r.generation,
            template_hash: r.template_hash.clone(),
            created_ms: r.created_ms,
            change: match i.checked_sub(1).map(|p| &revisions[p]) {
                Some(before) => changed_fields(&before.spec, &r.spec)
                    .iter()
                    .map(|c| format!("spec.{}", c.field))
                    .collect::<Vec<_>>()
                    .join(", "),
                None => String::new(),
            },
        })
        .collect())
}

#[cfg(test)]
mod time_tests {
    #[test]
    fn the_restart_time_is_rfc3339_with_milliseconds_in_utc() {
        let at = super::rfc3339_ms_now().unwrap();
        // 2026-12-03T13:45:00.123Z
        assert_eq!(at.len(), 24, "{at}");
        assert!(at.ends_with('Z') && at.as_bytes()[19] == b'.', "{at}");
        assert!(crate::cluster::pods::rfc3339_ms(&at).is_some(), "{at}");
    }
}
