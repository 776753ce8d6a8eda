//! Node pools and the cluster spec as the API changes them: create, apply,
//! delete, scale, and the node quota every change is held to. The HTTP
//! handlers (`crate::http::pools`) parse requests into these calls.

use crate::control::ControlPlane;
use crate::error::{Result, ServerError};
use crate::metrics::PoolGauge;
use crate::names;
use crate::pool_state::counts_toward_pool;
use crate::store::PoolRecord;
use knit_api::state::{EventType, InstanceState};
use knit_api::views::{PoolStatus, PoolView};
use knit_api::{ApiError, Cluster, FieldError, NodePool};

pub mod rollout;

pub mod versions;

/// Whether a pool write made the pool or replaced it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    Created,
    Updated,
}

/// Sum of every pool's node count with `pool` replaced, against the quota.
pub fn check_quota(cp: &ControlPlane, pool: &NodePool) -> Result<()> {
    let cluster = cp.cluster_doc()?.spec;
    let quota = cluster.effective_node_quota();
    let others: i64 = cp
        .store
        .pools()?
        .iter()
        .filter(|p| !p.deleting && p.pool.metadata.name != pool.metadata.name)
        .map(|p| p.pool.spec.max_nodes())
        .sum();
    let requested = others + pool.spec.max_nodes();
    if requested > quota {
        return Err(ServerError::quota_exceeded(requested, &cluster));
    }
    Ok(())
}

/// Replaces the cluster spec; refused when the pools already hold more
/// nodes than its quota allows.
pub fn replace_cluster(cp: &ControlPlane, cluster: &Cluster) -> Result<()> {
    let used: i64 = cp
        .store
        .pools()?
        .iter()
        .filter(|p| !p.deleting)
        .map(|p| p.pool.spec.max_nodes())
        .sum();
    if used > cluster.spec.effective_node_quota() {
        return Err(ServerError::quota_exceeded(used, &cluster.spec));
    }
    let old = cp.cluster_doc()?;
    versions::check_cluster(cp, &old, cluster)?;
    versions::before_cluster_change(cp, &old)?;
    cp.store.put_cluster(cluster)?;
    versions::publish(cp)?;
    cp.store.add_event(
        EventType::Normal,
        "Cluster",
        &cluster.metadata.name,
        "Updated",
        "cluster spec replaced",
    )?;
    Ok(())
}

/// A pool's view: its document (password hidden) and its status.
pub fn view(cp: &ControlPlane, record: &PoolRecord) -> Result<PoolView> {
    let status = status(cp, record)?;
    let mut view = PoolView::new(record.pool.clone(), record.created_ms, status);
    view.metadata.generation = record.generation;
    Ok(view)
}

/// Every pool's view.
pub fn list(cp: &ControlPlane) -> Result<Vec<PoolView>> {
    cp.store.pools()?.iter().map(|r| view(cp, r)).collect()
}

/// The view of the pool named `name`.
pub fn get(cp: &ControlPlane, name: &str) -> Result<PoolView> {
    view(cp, &stored(cp, name)?)
}

/// A pool's instances by state and its nodes.
fn status(cp: &ControlPlane, record: &PoolRecord) -> Result<PoolStatus> {
    let counts = cp.store.pool_counts(&record.pool.metadata.name)?;
    let count = |s: InstanceState| counts.instances.get(&s).copied().unwrap_or(0);
    Ok(PoolStatus {
        desired: record.pool.spec.replicas,
        instances: counts
            .instances
            .iter()
            .filter(|(s, _)| counts_toward_pool(s))
            .map(|(_, n)| n)
            .sum(),
        pending: count(InstanceState::Pending) + count(InstanceState::Creating),
        running: count(InstanceState::Running),
        failed: count(InstanceState::Failed),
        deleting_instances: count(InstanceState::Deleting),
        initialized: counts.initialized,
        ready: counts.ready,
        draining: counts.draining,
        deleting: record.deleting,
        cluster_attached: cp.cluster.attached(),
        create_error: create_error(cp, &record.pool.metadata.name, count(InstanceState::Failed))?,
        ..rollout::status(cp, record)?
    })
}

/// Why a pool's creates fail, if they do: the newest create being retried
/// (its attempt and last error), else an instance whose create failed for
/// good. What the reconciler logs, where `knit get pools` and `knit
/// describe pool` show it.
fn create_error(cp: &ControlPlane, pool: &str, failed: i64) -> Result<Option<String>> {
    let retrying = cp
        .store
        .pending_intents()?
        .into_iter()
        .filter(|i| i.pool == pool && i.action == knit_api::state::IntentAction::Create)
        .filter_map(|i| i.last_error.map(|e| (i.id, i.attempts, e)))
        .max_by_key(|(id, _, _)| *id);
    if let Some((_, attempts, error)) = retrying {
        return Ok(Some(format!(
            "create attempt {attempts} failed, retrying: {error}"
        )));
    }
    if failed == 0 {
        return Ok(None);
    }
    Ok(cp
        .store
        .instances(Some(pool))?
        .into_iter()
        .filter(|i| i.state == InstanceState::Failed)
        .filter_map(|i| i.last_error.map(|e| (i.updated_ms, i.name, e)))
        .max_by_key(|(at, _, _)| *at)
        .map(|(_, name, error)| format!("instance {name} failed: {error}")))
}

fn stored(cp: &ControlPlane, name: &str) -> Result<PoolRecord> {
    names::check_pool("metadata.name", name)?;
    cp.store.pool(name)?.ok_or_else(|| ServerError::NotFound {
        kind: "pool",
        name: name.to_string(),
    })
}

/// The view after a write, with the write's warnings.
fn written(cp: &ControlPlane, name: &str, warnings: Vec<String>) -> Result<PoolView> {
    let mut view = view(cp, &stored(cp, name)?)?;
    view.warnings = Some(warnings);
    Ok(view)
}

fn record_created(cp: &ControlPlane, pool: &NodePool) -> Result<()> {
    cp.store.insert_pool(pool)?;
    cp.store.add_event(
        EventType::Normal,
        "NodePool",
        &pool.metadata.name,
        "Created",
        &format!("pool created with {} replica(s)", pool.spec.replicas),
    )
}

/// A pool's `spec.image`, when it names a cloud image or `host` (not
/// knit's own `debian-12` or a path, which are resolved at create as
/// before), asked of the provider that will make its instances: an ECS image
/// id is valid on ECS and refused on the local cloud and QEMU, `host` is
/// refused by the local cloud unless the server runs with its unsafe
/// switch, the field named. Without a provider nothing is made and nothing
/// is asked.
pub async fn check_image(cp: &ControlPlane, pool: &NodePool) -> Result<()> {
    let image = &pool.spec.image;
    let knit_name = image == knit_api::DEFAULT_IMAGE || image.starts_with('/');
    let Some(provider) = cp.provider.as_ref().filter(|_| !knit_name) else {
        return Ok(());
    };
    provider.check_image(image).await.map_err(|e| {
        ApiError::Invalid(vec![FieldError {
            field: "spec.image".into(),
            value: format!("{image:?}"),
            rule: format!("not usable by this server's provider: {e}"),
        }])
        .into()
    })
}

/// How long a pool write waits for the provider's answer about its
/// instance types: a user is waiting, and a cloud API that is down must
/// not hold every pool write.
pub const INSTANCE_TYPE_CHECK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(15);

/// A pool's `spec.instanceTypes` (its fallback list, every entry) asked of
/// the provider that will make its instances: a type it does not know is
/// refused, naming the entry, the value and a few types it knows. On an
/// update only the types the stored pool does not already list are asked,
/// so that a pool whose type a cloud retired can still be scaled down or
/// deleted. When the provider cannot answer (an error, or no answer within
/// [`INSTANCE_TYPE_CHECK_TIMEOUT`]) the write is accepted with a warning:
/// a cloud API outage must not block pool writes, and a create of an
/// unknown type still fails then, with the cloud's own error, in the
/// pool's events. Returns the warnings.
pub async fn check_instance_types(cp: &ControlPlane, pool: &NodePool) -> Result<Vec<String>> {
    let Some(provider) = cp.provider.as_ref() else {
        return Ok(Vec::new());
    };
    let stored = cp
        .store
        .pool(&pool.metadata.name)?
        .filter(|p| !p.deleting)
        .map(|p| p.pool.spec.instance_types)
        .unwrap_or_default();
    let asked: Vec<String> = pool
        .spec
        .instance_types
        .iter()
        .filter(|t| !stored.contains(t))
        .cloned()
        .collect();
    if asked.is_empty() {
        return Ok(Vec::new());
    }
    let answer = crate::provider::within(
        provider.name(),
        "asking about the pool's instance types",
        INSTANCE_TYPE_CHECK_TIMEOUT,
        provider.check_instance_types(&asked),
    )
    .await;
    let check = match answer {
        Ok(Some(check)) => check,
        Ok(None) => return Ok(Vec::new()),
        Err(e) => {
            tracing::warn!(pool = %pool.metadata.name, error = %e, "instance types not checked");
            return Ok(vec![format!(
                "spec.instanceTypes {asked:?} not checked: provider {} did not answer ({e}); an unknown type fails at create",
                provider.name()
            )]);
        }
    };
    let errors: Vec<FieldError> = pool
        .spec
        .instance_types
        .iter()
        .enumerate()
        .filter(|(_, t)| check.unknown.contains(t))
        .map(|(i, t)| FieldError {
            field: format!("spec.instanceTypes[{i}]"),
            value: format!("{t:?}"),
            rule: format!(
                "not an instance type of provider {}{}",
                provider.name(),
                match check.examples.as_slice() {
                    [] => String::new(),
                    known => format!(" (it knows {}, …)", known.join(", ")),
                }
            ),
        })
        .collect();
    if errors.is_empty() {
        Ok(Vec::new())
    } else {
        Err(ApiError::Invalid(errors).into())
    }
}

/// Creates a pool. `strict`: refuse one whose snapshot is stale (else a
/// warning in the view).
pub fn create(cp: &ControlPlane, pool: NodePool, strict: bool) -> Result<PoolView> {
    create_checked(cp, pool, strict, false)
}

/// What [`create`] would answer, every check made, nothing stored
/// (`?dryRun=All`).
pub fn create_dry_run(cp: &ControlPlane, pool: NodePool, strict: bool) -> Result<PoolView> {
    create_checked(cp, pool, strict, true)
}

fn create_checked(
    cp: &ControlPlane,
    mut pool: NodePool,
    strict: bool,
    dry_run: bool,
) -> Result<PoolView> {
    versions::settle_pool(cp, None, &mut pool)?;
    check_quota(cp, &pool)?;
    let warnings = crate::snapshot::check_pool(cp, &pool, strict)?;
    if dry_run {
        if cp.store.pool(&pool.metadata.name)?.is_some() {
            return Err(ServerError::Conflict(format!(
                "pool {:?} already exists",
                pool.metadata.name
            )));
        }
        return Ok(unstored(pool, crate::store::now_ms(), warnings));
    }
    record_created(cp, &pool)?;
    cp.wake();
    written(cp, &pool.metadata.name, warnings)
}

/// The view a dry run answers: the pool as it would be stored, created at
/// `created_ms`, its status its desired count alone.
fn unstored(pool: NodePool, created_ms: i64, warnings: Vec<String>) -> PoolView {
    let status = PoolStatus {
        desired: pool.spec.replicas,
        ..PoolStatus::default()
    };
    let mut view = PoolView::new(pool, created_ms, status);
    view.warnings = Some(warnings);
    view
}

/// Creates or replaces the pool named `name` (`knit apply`).
pub fn apply(
    cp: &ControlPlane,
    name: &str,
    pool: NodePool,
    strict: bool,
) -> Result<(Applied, PoolView)> {
    apply_checked(cp, name, pool, strict, false)
}

/// What [`apply`] would answer, every check made, nothing stored
/// (`?dryRun=All`, `knit apply --dry-run=server`, `knit diff`).
pub fn apply_dry_run(
    cp: &ControlPlane,
    name: &str,
    pool: NodePool,
    strict: bool,
) -> Result<(Applied, PoolView)> {
    apply_checked(cp, name, pool, strict, true)
}

fn apply_checked(
    cp: &ControlPlane,
    name: &str,
    mut pool: NodePool,
    strict: bool,
    dry_run: bool,
) -> Result<(Applied, PoolView)> {
    names::check_pool("metadata.name", name)?;
    if pool.metadata.name != name {
        return Err(ApiError::Invalid(vec![FieldError {
            field: "metadata.name".into(),
            value: format!("{:?}", pool.metadata.name),
            rule: format!("must match the name in the URL ({name:?})"),
        }])
        .into());
    }
    let existing = cp.store.pool(name)?.filter(|p| !p.deleting);
    versions::settle_pool(cp, existing.as_ref().map(|p| &p.pool), &mut pool)?;
    check_quota(cp, &pool)?;
    let warnings = crate::snapshot::check_pool(cp, &pool, strict)?;
    let applied = match cp.store.pool(name)? {
        Some(old) if old.deleting => {
            return Err(ServerError::Conflict(format!(
                "pool {name:?} is being deleted"
            )))
        }
        Some(old) => {
            crate::attach::check_pool_update(&old.pool, &mut pool)?;
            // Set by `knit rollout restart` only: an apply without it keeps
            // it (else every apply of the user's file would roll the pool).
            if pool.spec.restarted_at.is_none() {
                pool.spec
                    .restarted_at
                    .clone_from(&old.pool.spec.restarted_at);
            }
            pool.validate_update(&old.pool)?;
            if dry_run {
                return Ok((Applied::Updated, unstored(pool, old.created_ms, warnings)));
            }
            cp.store.update_pool(&pool)?;
            cp.store.add_event(
                EventType::Normal,
                "NodePool",
                name,
                "Updated",
                "pool spec replaced",
            )?;
            Applied::Updated
        }
        None if dry_run => {
            let created_ms = crate::store::now_ms();
            return Ok((Applied::Created, unstored(pool, created_ms, warnings)));
        }
        None => {
            record_created(cp, &pool)?;
            Applied::Created
        }
    };
    cp.wake();
    Ok((applied, written(cp, name, warnings)?))
}

/// Marks the pool for deletion: the reconciler scales it to 0, then
/// removes it.
pub fn delete(cp: &ControlPlane, name: &str) -> Result<()> {
    names::check_pool("metadata.name", name)?;
    cp.store.mark_pool_deleting(name)?;
    cp.store.add_event(
        EventType::Normal,
        "NodePool",
        name,
        "Deleting",
        "scaling to 0, then removing the pool",
    )?;
    cp.wake();
    Ok(())
}

/// Sets the pool's desired count; `release` says whether instances removed
/// by a scale-in are released or kept (detached).
pub async fn scale(
    cp: &ControlPlane,
    name: &str,
    replicas: i64,
    release: bool,
) -> Result<PoolView> {
    names::check_pool("metadata.name", name)?;
    // The count and the release choice change under the plan lock at once.
    cp.scale_pool(name, replicas, release, |pool| check_quota(cp, pool))
        .await?;
    get(cp, name)
}

/// Each pool's desired, actual (counted toward the pool) and ready counts,
/// for `/metrics`.
pub fn gauges(cp: &ControlPlane) -> Result<Vec<PoolGauge>> {
    let nodes = cp.store.nodes()?;
    let mut gauges = Vec::new();
    for record in cp.store.pools()? {
        let name = record.pool.metadata.name.clone();
        let actual = cp
            .store
            .instances(Some(&name))?
            .iter()
            .filter(|i| counts_toward_pool(&i.state))
            .count() as i64;
        let ready = nodes
            .iter()
            .filter(|n| n.pool == name && n.status == knit_api::state::NodeStatus::Ready)
            .count() as i64;
        gauges.push(PoolGauge {
            pool: name,
            desired: record.pool.spec.replicas,
            actual,
            ready,
        });
    }
    Ok(gauges)
}
