//! Kubernetes versions, control plane first: the Cluster's
//! `kubernetesVersion` is raised one minor at a time (never lowered); each
//! pool has its own `spec.kubernetesVersion` (the cluster's when the pool
//! is made without one), never newer than the cluster's nor more than
//! three minors older (the kubelet's version skew policy); a version the
//! package mirror holds no package of is refused. Raising the cluster's
//! version changes no pool: each pool is then raised on its own (by
//! replacement, the rollout of `crate::reconcile`).

use crate::control::ControlPlane;
use crate::error::Result;
use knit_api::state::EventType;
use knit_api::validate::parse_kube_version;
use knit_api::{ApiError, Cluster, FieldError, NodePool};

/// How many minors a kubelet may be older than the API server.
pub const MAX_KUBELET_SKEW: u32 = 3;
const FIELD: &str = "spec.kubernetesVersion";

fn minor_of(v: &str) -> Option<(u32, u32, u32)> {
    parse_kube_version(v)
}

/// A change of the Cluster's version from `old` to `new`: the same, a
/// later patch of the same minor, or the next minor; never lower, never a
/// minor skipped. The rule when it is refused.
pub fn cluster_change(old: &str, new: &str) -> std::result::Result<(), String> {
    let (Some(a), Some(b)) = (minor_of(old), minor_of(new)) else {
        // The validator names a malformed version.
        return Ok(());
    };
    if b < a {
        return Err(format!(
            "may not be lowered (the cluster runs {old}; downgrades are not supported)"
        ));
    }
    if b.0 != a.0 || b.1 > a.1 + 1 {
        return Err(format!(
            "may be raised one minor at a time: from {old} to {}.{}.x (the control plane upgrades minor by minor)",
            a.0,
            a.1 + 1
        ));
    }
    Ok(())
}

/// A pool's version against its cluster's: not newer, and at most
/// [`MAX_KUBELET_SKEW`] minors older. The rule when it is not.
pub fn pool_skew(pool: &str, cluster: &str) -> std::result::Result<(), String> {
    let (Some(p), Some(c)) = (minor_of(pool), minor_of(cluster)) else {
        return Ok(());
    };
    if p > c {
        return Err(format!(
            "may not be newer than the cluster's ({cluster}): upgrade the cluster first"
        ));
    }
    if p.0 != c.0 || c.1 - p.1 > MAX_KUBELET_SKEW {
        return Err(format!(
            "may not be more than {MAX_KUBELET_SKEW} minors older than the cluster's ({cluster}; the kubelet version skew policy)"
        ));
    }
    Ok(())
}

fn refused(field: &str, value: &str, rule: String) -> crate::error::ServerError {
    ApiError::Invalid(vec![FieldError {
        field: field.to_string(),
        value: format!("{value:?}"),
        rule,
    }])
    .into()
}

/// Whether the mirror can give nodes `version`'s package. A server whose
/// mirror holds no package at all (no `knit package build` yet) makes no
/// working node of any version and checks nothing.
pub fn check_package(cp: &ControlPlane, field: &str, version: &str) -> Result<()> {
    let held = crate::mirror::kubernetes_versions(&cp.mirror_dir)?;
    if held.is_empty() || held.iter().any(|v| v == version) {
        return Ok(());
    }
    Err(refused(
        field,
        version,
        format!(
            "the package mirror holds no Kubernetes {version} package (it holds {}); `knit package build --kubernetes-version {version}` adds one",
            held.join(", ")
        ),
    ))
}

/// A pool about to be written (created, or replacing `old`): its version
/// filled when it names none (the old pool's, else the cluster's), held
/// to the skew policy, and its package looked for when it changes.
pub fn settle_pool(cp: &ControlPlane, old: Option<&NodePool>, pool: &mut NodePool) -> Result<()> {
    let cluster = cp.cluster_doc()?.spec.kubernetes_version;
    let before = old
        .and_then(|o| o.spec.kubernetes_version.clone())
        .unwrap_or_else(|| cluster.clone());
    let version = pool
        .spec
        .kubernetes_version
        .get_or_insert_with(|| before.clone())
        .clone();
    if parse_kube_version(&version).is_none() {
        // The pool's validator names it.
        return Ok(());
    }
    if version == before {
        // Unchanged: a pool left behind by a cluster raised meanwhile may
        // still be written (the skew rule held when the cluster moved).
        return Ok(());
    }
    pool_skew(&version, &cluster).map_err(|rule| refused(FIELD, &version, rule))?;
    check_package(cp, FIELD, &version)
}

/// A Cluster spec about to replace `old`: its version raised by the
/// rules of [`cluster_change`] and kept within the skew policy of every
/// pool, with a package in the mirror. A cluster without pools may be set
/// to any version (the first `knit apply` of a cluster document).
pub fn check_cluster(cp: &ControlPlane, old: &Cluster, new: &Cluster) -> Result<()> {
    let (from, to) = (&old.spec.kubernetes_version, &new.spec.kubernetes_version);
    if from == to || parse_kube_version(to).is_none() {
        return Ok(());
    }
    let pools: Vec<NodePool> = cp
        .store
        .pools()?
        .into_iter()
        .filter(|p| !p.deleting)
        .map(|p| p.pool)
        .collect();
    if !pools.is_empty() {
        cluster_change(from, to).map_err(|rule| refused(FIELD, to, rule))?;
        for pool in &pools {
            let version = crate::bootstrap::node_kubernetes_version(old, pool);
            if pool_skew(&version, to).is_err() {
                return Err(refused(
                    FIELD,
                    to,
                    format!(
                        "pool {:?} runs {version}, which would be more than {MAX_KUBELET_SKEW} minors older (the kubelet version skew policy): raise the pool first",
                        pool.metadata.name
                    ),
                ));
            }
        }
    }
    check_package(cp, FIELD, to)
}

/// Pools stored before pools had their own version (knit upgraded) get
/// the cluster's, once, so that a later raise of the cluster's version
/// rolls nothing by itself. An event per pool filled.
pub fn fill_pool_versions(cp: &ControlPlane) -> Result<()> {
    fill_pool_versions_with(cp, &cp.cluster_doc()?.spec.kubernetes_version)
}

fn fill_pool_versions_with(cp: &ControlPlane, version: &str) -> Result<()> {
    if cp
        .store
        .pools()?
        .iter()
        .all(|p| p.pool.spec.kubernetes_version.is_some())
    {
        return Ok(());
    }
    for name in cp.store.fill_pool_kubernetes_versions(version)? {
        cp.store.add_event(
            EventType::Normal,
            "NodePool",
            &name,
            "KubernetesVersionRecorded",
            &format!(
                "{FIELD} set to {version}, the cluster's: the pool keeps it when the cluster's version is raised"
            ),
        )?;
    }
    Ok(())
}

/// Before the cluster's version changes from `old`'s: pools without their
/// own version keep the one they ran.
pub fn before_cluster_change(cp: &ControlPlane, old: &Cluster) -> Result<()> {
    fill_pool_versions_with(cp, &old.spec.kubernetes_version)
}

/// The embedded API reports the cluster's version (`/version`).
pub fn publish(cp: &ControlPlane) -> Result<()> {
    knit_cluster::set_served_version(&cp.cluster_doc()?.spec.kubernetes_version);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cluster_is_raised_one_minor_at_a_time() {
        assert_eq!(cluster_change("1.31.4", "1.31.4"), Ok(()));
        assert_eq!(cluster_change("1.31.4", "1.31.9"), Ok(()));
        assert_eq!(cluster_change("1.31.4", "1.32.0"), Ok(()));
        let skip = cluster_change("1.31.4", "1.33.0").unwrap_err();
        assert!(
            skip.contains("one minor at a time") && skip.contains("1.32.x"),
            "{skip}"
        );
        let down = cluster_change("1.31.4", "1.30.8").unwrap_err();
        assert!(down.contains("may not be lowered"), "{down}");
        assert!(cluster_change("1.31.4", "1.31.3")
            .unwrap_err()
            .contains("lowered"));
        assert!(cluster_change("1.31.4", "2.0.0").is_err());
    }

    #[test]
    fn a_pool_is_never_newer_than_its_cluster_nor_more_than_three_minors_older() {
        assert_eq!(pool_skew("1.31.4", "1.31.4"), Ok(()));
        assert_eq!(pool_skew("1.28.0", "1.31.4"), Ok(()));
        assert_eq!(pool_skew("1.31.0", "1.31.4"), Ok(()));
        let old = pool_skew("1.27.9", "1.31.4").unwrap_err();
        assert!(old.contains("more than 3 minors older"), "{old}");
        let new = pool_skew("1.32.0", "1.31.4").unwrap_err();
        assert!(new.contains("newer than the cluster's"), "{new}");
        assert!(pool_skew("1.31.5", "1.31.4").is_err());
    }
}
