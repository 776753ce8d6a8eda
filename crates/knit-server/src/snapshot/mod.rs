//! Data-disk snapshots that make scale-out fast (docs/spec.md §3).
//!
//! `POST /api/v1/snapshots` starts a build that runs docs/spec.md §3.2's procedure,
//! in its order, as one managed operation:
//!
//! 1. `builder`: a builder pool (copy of the source pool: 1 node, fresh
//!    data disks, tainted `knit.dev/snapshot-builder=true:NoSchedule`);
//! 2. `ready`: its node initialized by the agent and Ready (the agent caches
//!    the Kubernetes package on the data disk, the kubelet stand-in pulls
//!    the system images into containerd, whose root is on that disk);
//! 3. `detach`: the node removed from the cluster, the instance kept and
//!    running (its kubelet stopped first so that it cannot register again;
//!    containerd keeps running); the instance leaves its pool (Detached);
//! 4. `package`: the package cache on the runtime disk checked file by
//!    file against its manifest's sha256;
//! 5. `images`: the system and business images pulled through CRI
//!    (the kubelet's `--ensure-images`);
//! 6. `clean`: the disk scrubbed down to the agent's keep-list (the image
//!    store and the package cache; containers deleted through containerd,
//!    containerd stopped), `sync`, `fstrim`;
//! 7. `stop`: the instance stopped;
//! 8. `snapshot`: its runtime disk ([`knit_api::disk`]: the disk the agent
//!    mounted) snapshotted and recorded (Kubernetes
//!    and containerd versions, images with digests, used bytes, pool, time);
//! 9. `release`: the builder instance released unless `keepBuilder`, the
//!    builder pool removed.
//!
//! Inside the builder, steps 3 to 6 are the agent's: the server runs
//! `knit-agent cache-manifest` and `knit-agent snapshot-prepare <step>`
//! through the provider's exec and reads their typed answers
//! ([`knit_api::agent`]); it knows none of the node's paths.
//!
//! Builds and every progress message are stored (SQLite), so a build is
//! visible after a restart. A build that was running when the server died
//! is not resumed (its waits and the builder's state are not safely
//! repeatable at every point): at start it is marked failed at the step it
//! had reached and its builder is cleaned up (see [`recover`]). One that had
//! already recorded its snapshot only had the release left: that is done
//! and the build succeeds.
//!
//! The rooms: [`build`] (the flow above), [`recover`] (builds cut off
//! by a restart), [`cleanup`] (what a failed build leaves behind); the HTTP
//! handlers (`crate::http::snapshots`) parse requests and call the typed
//! functions here.
//!
//! Pools name a snapshot in `dataDisks[].snapshotId`; creating or updating
//! such a pool while the snapshot holds another Kubernetes version than the
//! cluster answers with a warning (`?strict=true`: refused). Deleting a
//! snapshot a pool uses is refused.

mod build;
mod cleanup;
mod recover;

pub use build::start;
pub use recover::recover;

use crate::control::ControlPlane;
use crate::error::{Result, ServerError};
use crate::store::{SnapshotBuildRecord, SnapshotRecord};
use knit_api::state::EventType;
use knit_api::views::{
    BuildStepView, ImageCacheView, NodeCacheView, PackageCacheView, Snapshot, SnapshotBuildStatus,
    SnapshotBuildView, SnapshotDeleted, SnapshotView,
};
use knit_api::NodePool;
use std::sync::Arc;
use std::time::Duration;

type Cp = Arc<ControlPlane>;

/// A build as the API shows it: the stored record, its messages and, once
/// made, the snapshot.
fn status_of(cp: &ControlPlane, build: SnapshotBuildRecord) -> Result<SnapshotBuildStatus> {
    let steps = cp
        .store
        .snapshot_build_steps(&build.id)?
        .into_iter()
        .map(|s| BuildStepView {
            at_ms: s.at_ms,
            step: s.step,
            message: s.message,
        })
        .collect();
    let snapshot = match &build.snapshot_id {
        Some(sid) => cp.store.snapshots()?.into_iter().find(|s| &s.id == sid),
        None => None,
    };
    Ok(SnapshotBuildStatus {
        done: build.status != knit_api::state::BuildStatus::Running,
        build: build_view(build),
        steps,
        snapshot: snapshot.map(snapshot_view),
    })
}

fn build_view(b: SnapshotBuildRecord) -> SnapshotBuildView {
    SnapshotBuildView {
        id: b.id,
        name: b.name,
        pool: b.pool,
        builder_pool: b.builder_pool,
        builder_instance: b.builder_instance,
        images: b.images,
        keep_builder: b.keep_builder,
        status: b.status,
        step: b.step,
        error: b.error,
        snapshot_id: b.snapshot_id,
        started_ms: b.started_ms,
        finished_ms: b.finished_ms,
    }
}

fn snapshot_view(s: SnapshotRecord) -> Snapshot {
    Snapshot {
        id: s.id,
        pool: s.pool,
        kubernetes_version: s.kubernetes_version,
        containerd_version: s.containerd_version,
        images: s.images,
        size_bytes: s.size_bytes,
        created_ms: s.created_ms,
    }
}

/// Records a progress message; the build's current step becomes `step`.
fn note(cp: &ControlPlane, id: &str, step: &str, message: impl Into<String>) -> Result<()> {
    let message = message.into();
    tracing::info!(build = id, step, "{message}");
    cp.store.add_snapshot_build_step(id, step, &message, true)
}

/// Records the message that ends `step`, then the test hook
/// `KNIT_SERVER_PAUSE_AT=snapshot-<step>`.
async fn progress(
    cp: &ControlPlane,
    id: &str,
    step: &str,
    message: impl Into<String>,
) -> Result<()> {
    note(cp, id, step, message)?;
    crate::pause::pause_at(&format!("snapshot-{step}")).await;
    Ok(())
}

/// A message that does not move the build's step (the end, clean-up).
fn remark(cp: &ControlPlane, id: &str, step: &str, message: &str) {
    tracing::info!(build = id, step, "{message}");
    if let Err(e) = cp.store.add_snapshot_build_step(id, step, message, false) {
        tracing::warn!(build = id, error = %e, "cannot record a build message");
    }
}

fn invalid(field: &str, value: &str, rule: &str) -> ServerError {
    knit_api::ApiError::Invalid(vec![knit_api::FieldError {
        field: field.into(),
        value: format!("{value:?}"),
        rule: rule.into(),
    }])
    .into()
}

/// Snapshot records with `stale` (another Kubernetes version than the
/// cluster's) and the pools that use each.
pub fn list(cp: &ControlPlane) -> Result<Vec<SnapshotView>> {
    let cluster_version = cp.cluster_doc()?.spec.kubernetes_version;
    let pools = cp.store.pools()?;
    Ok(cp
        .store
        .snapshots()?
        .into_iter()
        .map(|s| {
            let used_by: Vec<String> = pools
                .iter()
                .filter(|p| uses(&p.pool, &s.id))
                .map(|p| p.pool.metadata.name.clone())
                .collect();
            SnapshotView {
                stale: s.kubernetes_version != cluster_version,
                cluster_kubernetes_version: cluster_version.clone(),
                used_by,
                snapshot: snapshot_view(s),
            }
        })
        .collect())
}

fn uses(pool: &NodePool, snapshot: &str) -> bool {
    pool.spec
        .data_disks
        .iter()
        .any(|d| d.snapshot_id.as_deref() == Some(snapshot))
}

/// Warnings at pool create and update (`warnings` in the answer, printed
/// by the CLI as `Warning: …`): data disks from snapshots unknown to knit,
/// holding another Kubernetes version than the cluster, or on a disk the
/// agent does not mount; user data that touches an initialization marker
/// too late (`UserDataMarkerTooLate`). With `strict` a version mismatch is
/// refused.
pub fn check_pool(cp: &ControlPlane, pool: &NodePool, strict: bool) -> Result<Vec<String>> {
    // The version the pool's nodes run (its own, issue 24), which the
    // snapshot's package cache must hold to be used.
    let cluster = cp.cluster_doc()?;
    let node_version = crate::bootstrap::node_kubernetes_version(&cluster, pool);
    let runs = if node_version == cluster.spec.kubernetes_version {
        format!("the cluster runs {node_version}")
    } else {
        format!("the pool's nodes run {node_version}")
    };
    let known = cp.store.snapshots()?;
    let mut warnings = Vec::new();
    let runtime = knit_api::disk::runtime_data_disk(&pool.spec.data_disks).map(|(i, _)| i);
    for (i, d) in pool.spec.data_disks.iter().enumerate() {
        let Some(id) = &d.snapshot_id else { continue };
        if let Some(r) = runtime.filter(|r| *r != i) {
            warnings.push(format!(
                "spec.dataDisks[{i}].snapshotId: snapshot {id} is on data disk #{i}, but the \
                 runtime disk (the one the agent mounts: the last data disk, NVMe preferred) is \
                 #{r}: nodes will not use its caches; name the snapshot on spec.dataDisks[{r}]"
            ));
        }
        match known.iter().find(|s| &s.id == id) {
            None => warnings.push(format!(
                "spec.dataDisks[{i}].snapshotId: snapshot {id} was not built by knit: \
                 its content (Kubernetes version, images) is unknown"
            )),
            Some(s) if s.kubernetes_version != node_version => {
                let msg = format!(
                    "spec.dataDisks[{i}].snapshotId: snapshot {id} holds Kubernetes {}, {runs}: \
                     nodes will not use its package cache and will download the package; \
                     build a new snapshot (knit snapshot create --pool {})",
                    s.kubernetes_version, pool.metadata.name
                );
                if strict {
                    return Err(ServerError::Conflict(format!(
                        "stale snapshot refused (strict): {msg}"
                    )));
                }
                warnings.push(msg);
            }
            Some(_) => {}
        }
    }
    let spec = &pool.spec;
    for w in knit_api::validate::userdata_marker_warnings(&spec.user_data)
        .into_iter()
        .chain(knit_api::validate::pre_user_data_runcmd_warnings(
            &spec.pre_user_data,
        ))
    {
        warnings.push(format!("{}: {} ({})", w.field, w.message, w.code));
    }
    Ok(warnings)
}

/// Deletes a snapshot no pool uses, at the provider and in the records.
pub async fn delete(cp: &ControlPlane, id: String) -> Result<SnapshotDeleted> {
    let users: Vec<String> = cp
        .store
        .pools()?
        .iter()
        .filter(|p| uses(&p.pool, &id))
        .map(|p| p.pool.metadata.name.clone())
        .collect();
    if !users.is_empty() {
        return Err(ServerError::Conflict(format!(
            "snapshot {id} is used by pool(s) {}: change their dataDisks[].snapshotId first",
            users.join(", ")
        )));
    }
    if !cp.store.snapshots()?.iter().any(|s| s.id == id) {
        return Err(ServerError::NotFound {
            kind: "snapshot",
            name: id,
        });
    }
    cp.provider()?.snapshot_delete(&id).await?;
    cp.store.delete_snapshot(&id)?;
    cp.store.add_event(
        EventType::Normal,
        "Snapshot",
        &id,
        "Deleted",
        "snapshot deleted",
    )?;
    Ok(SnapshotDeleted { id, deleted: true })
}

/// Every build, newest last, without their messages.
pub fn builds(cp: &ControlPlane) -> Result<Vec<SnapshotBuildView>> {
    Ok(cp
        .store
        .snapshot_builds()?
        .into_iter()
        .map(build_view)
        .collect())
}

/// One build with its messages.
pub fn build_status(cp: &ControlPlane, id: String) -> Result<SnapshotBuildStatus> {
    let build = cp.store.snapshot_build(&id)?.ok_or(ServerError::NotFound {
        kind: "snapshot build",
        name: id,
    })?;
    status_of(cp, build)
}

/// The builder's runtime disk: its index among the pool's data disks (the
/// provider's disk order) and its mount target. The same rule picks the
/// disk the agent formats and mounts ([`knit_api::disk`]), so the snapshot
/// holds what the node wrote.
fn runtime_disk(pool: &NodePool) -> Result<(usize, String)> {
    let (index, disk) =
        knit_api::disk::runtime_data_disk(&pool.spec.data_disks).ok_or_else(|| {
            invalid(
                "pool",
                &pool.metadata.name,
                "the pool has no data disk: a snapshot is made of the runtime disk",
            )
        })?;
    let mount = disk
        .mount_target
        .clone()
        .unwrap_or_else(|| knit_api::config::DEFAULT_DATA_DISK_MOUNT.to_string());
    Ok((index, mount))
}

/// The Node annotation in which the kubelet (stand-in) publishes its image
/// report: `hit=N miss=N bytes=N[ failed=N]`.
pub const IMAGE_CACHE_ANNOTATION: &str = "knit.dev/image-cache";

/// The report's file beside the kubelet's state, with each image's outcome.
const IMAGE_REPORT_FILE: &str = "/var/lib/kubelet/knit-images.json";

/// Bound on each look at the cluster or into the instance for a describe.
const DESCRIBE_READ_TIMEOUT: Duration = Duration::from_secs(5);

/// `hit=N miss=N bytes=N[ failed=N]` as the report's counters
/// (`hit`, `miss`, `bytesPulled`, `failed`); `None` when malformed.
pub fn parse_image_annotation(text: &str) -> Option<ImageCacheView> {
    let mut out = ImageCacheView::default();
    for part in text.split_whitespace() {
        let (k, v) = part.split_once('=')?;
        let v: u64 = v.parse().ok()?;
        match k {
            "hit" => out.hit = v,
            "miss" => out.miss = v,
            "failed" => out.failed = v,
            "bytes" => out.bytes_pulled = v,
            _ => continue,
        }
    }
    Some(out)
}

/// What a node took from caches (for `knit describe node`): the package
/// (from the agent's kubernetes-components report) and the system images.
/// The images come from the node's own published report (the kubelet's
/// Node annotation, read from the cluster: what the node's credential
/// wrote); each image's outcome (failed pulls with their error) is added
/// from the report file inside the instance when the provider can read it
/// (a file that does not read as a report is left out: it is the node's).
pub async fn node_cache(
    cp: &ControlPlane,
    node: &crate::store::NodeRecord,
    instance: Option<&crate::store::InstanceRecord>,
) -> NodeCacheView {
    let mut out = NodeCacheView::default();
    let timeline = cp.store.timeline(&node.name).unwrap_or_default();
    if let Some(reason) = timeline
        .iter()
        .rev()
        .find(|t| {
            t.phase == knit_api::PhaseName::KubernetesComponents
                && t.outcome == knit_api::PhaseOutcome::Done
        })
        .and_then(|t| t.reason.clone())
    {
        let hit = reason.contains("from the data-disk cache");
        let preloaded = reason.contains("from the node image");
        let bytes = reason
            .split(" bytes)")
            .next()
            .and_then(|s| s.rsplit('(').next())
            .and_then(|s| s.trim().parse::<u64>().ok())
            .unwrap_or(0);
        out.package = Some(PackageCacheView {
            cache_hit: hit,
            preloaded,
            bytes_downloaded: if hit || preloaded { 0 } else { bytes },
        });
    }
    let published = tokio::time::timeout(
        DESCRIBE_READ_TIMEOUT,
        cp.cluster
            .node_annotation(&node.name, IMAGE_CACHE_ANNOTATION),
    )
    .await;
    if let Ok(Ok(Some(text))) = published {
        if let Some(summary) = parse_image_annotation(&text) {
            out.images = Some(ImageCacheView {
                source: "node annotation".into(),
                ..summary
            });
        }
    }
    let detail = async {
        let pid = instance.and_then(|i| i.provider_id.clone())?;
        let provider = cp.provider().ok()?;
        let bytes = tokio::time::timeout(
            DESCRIBE_READ_TIMEOUT,
            provider.read_file(&pid, IMAGE_REPORT_FILE),
        )
        .await
        .ok()?
        .ok()?;
        match serde_json::from_slice::<ImageCacheView>(&bytes) {
            Ok(report) => Some(report),
            Err(e) => {
                tracing::warn!(node = %node.name, error = %e, "the node's image report does not read");
                None
            }
        }
    };
    if let Some(report) = detail.await {
        match &mut out.images {
            // No cluster to publish to (or not published yet): the file.
            None => {
                out.images = Some(ImageCacheView {
                    source: "report file".into(),
                    ..report
                })
            }
            Some(published) => {
                if report.images.is_some() {
                    published.images = report.images;
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn stale_and_unknown_snapshots_warn_and_strict_refuses() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::Store::open(&dir.path().join("k.db")).unwrap();
        let cp = ControlPlane::new(
            store,
            None,
            Arc::new(crate::cluster::seam::NoCluster),
            crate::control::Settings::new(dir.path().to_path_buf()),
            String::new(),
            String::new(),
            String::new(),
        );
        let cluster_version = cp.cluster_doc().unwrap().spec.kubernetes_version;
        let snap = |id: &str, v: &str| SnapshotRecord {
            id: id.into(),
            pool: "p".into(),
            kubernetes_version: v.into(),
            containerd_version: "1.6.20".into(),
            images: vec![],
            size_bytes: 1,
            created_ms: 1,
        };
        cp.store
            .add_snapshot(&snap("s-fresh", &cluster_version))
            .unwrap();
        cp.store.add_snapshot(&snap("s-old", "1.30.1")).unwrap();
        let pool = |id: &str| {
            NodePool::from_yaml(&format!(
                "apiVersion: knit.dev/v1alpha1\nkind: NodePool\nmetadata: {{name: p}}\nspec:\n  dataDisks: [{{snapshotId: {id}}}]\n"
            ))
            .unwrap()
        };
        assert!(check_pool(&cp, &pool("s-fresh"), true).unwrap().is_empty());
        let w = check_pool(&cp, &pool("s-old"), false).unwrap();
        assert!(
            w[0].contains("1.30.1") && w[0].contains(&cluster_version),
            "{w:?}"
        );
        let e = check_pool(&cp, &pool("s-old"), true).unwrap_err();
        assert!(e.to_string().contains("strict"), "{e}");
        let w = check_pool(&cp, &pool("s-other"), true).unwrap();
        assert!(w[0].contains("not built by knit"), "{w:?}");
        // The pool's own version decides: its nodes run 1.30.1.
        let mut older = pool("s-old");
        older.spec.kubernetes_version = Some("1.30.1".into());
        assert!(check_pool(&cp, &older, true).unwrap().is_empty());
        let mut older = pool("s-fresh");
        older.spec.kubernetes_version = Some("1.30.1".into());
        let w = check_pool(&cp, &older, false).unwrap();
        assert!(w[0].contains("the pool's nodes run 1.30.1"), "{w:?}");
        assert!(uses(&pool("s-old"), "s-old") && !uses(&pool("s-old"), "s-fresh"));
    }

    /// Two data disks: the builder snapshots the disk the agent mounted
    /// (the last one; before, it took the first, an empty disk), and the
    /// node's configuration names that disk's mount target.
    #[test]
    fn the_builder_snapshots_the_disk_the_agent_mounts() {
        let pool = NodePool::from_yaml(
            "apiVersion: knit.dev/v1alpha1\nkind: NodePool\nmetadata: {name: p}\nspec:\n  dataDisks:\n  - {sizeGiB: 50}\n  - {mountTarget: /var/lib/container}\n",
        )
        .unwrap();
        let (index, mount) = runtime_disk(&pool).unwrap();
        assert_eq!((index, mount.as_str()), (1, "/var/lib/container"));
        let instance = crate::store::InstanceRecord {
            name: "p-abcde".into(),
            pool: "p".into(),
            provider_id: Some("i-1".into()),
            state: knit_api::state::InstanceState::Running,
            ip: None,
            instance_type: "ecs.g7.large".into(),
            report_token_hash: None,
            last_error: None,
            last_error_kind: None,
            created_ms: 0,
            updated_ms: 0,
            added: false,
        };
        let config = crate::bootstrap::node_config(crate::bootstrap::NodeConfigInput {
            cluster: &knit_api::Cluster::default(),
            pool: &pool,
            instance: &instance,
            join: None,
            package: crate::bootstrap::PackageRef {
                url: "https://10.213.0.1:7443/mirror/pkg/kubernetes/".into(),
                sha256: None,
            },
            report_url: "https://10.213.0.1:7443/report/v1/events".into(),
            report_token: "t".into(),
            control_plane_ca_pem: "pem".into(),
            default_zone: None,
        });
        assert_eq!(config.data_disk.mount_target, mount);
        // Inside the instance the disks are vdb, vdc: the agent's rule
        // picks the device of the same index.
        assert_eq!(knit_api::disk::runtime_device(&["vdb", "vdc"]), Some("vdc"));
        let none = NodePool::from_yaml(
            "apiVersion: knit.dev/v1alpha1\nkind: NodePool\nmetadata: {name: p}\nspec: {}\n",
        )
        .unwrap();
        assert!(runtime_disk(&none).is_err());
    }

    /// A node whose kubelet published a report of 3 failed pulls (its Node
    /// annotation, in a real embedded cluster): `describe node` gets the
    /// counters from the cluster (before: only the file inside the
    /// instance was read, so "no report from the kubelet yet").
    #[test]
    fn describe_reads_the_image_report_the_node_published() {
        assert_eq!(
            parse_image_annotation("hit=2 miss=1 bytes=42 failed=3").unwrap(),
            ImageCacheView {
                hit: 2,
                miss: 1,
                bytes_pulled: 42,
                failed: 3,
                ..ImageCacheView::default()
            }
        );
        assert!(parse_image_annotation("hit=x").is_none());
        let rt = tokio::runtime::Runtime::new().unwrap();
        let dir = tempfile::tempdir().unwrap();
        rt.block_on(async {
            let cluster = crate::cluster::test_cluster(dir.path()).await;
            let join =
                crate::cluster::EmbeddedJoin::new(cluster, Duration::from_secs(600)).unwrap();
            let node_doc = json!({
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": "n-1",
                    "annotations": {IMAGE_CACHE_ANNOTATION: "hit=0 miss=0 bytes=0 failed=3"}
                }
            });
            join.call_with("POST", "/api/v1/nodes".into(), Some(node_doc))
                .await
                .unwrap()
                .expect("node created");
            let join = Arc::new(join);
            let store = crate::store::Store::open(&dir.path().join("k.db")).unwrap();
            let cp = ControlPlane::new(
                store,
                None,
                join.clone(),
                crate::control::Settings::new(dir.path().to_path_buf()),
                String::new(),
                String::new(),
                String::new(),
            );
            let node = crate::store::NodeRecord {
                name: "n-1".into(),
                instance: "p-abcde".into(),
                pool: "p".into(),
                status: knit_api::state::NodeStatus::Ready,
                phase: None,
                phase_outcome: None,
                error_code: None,
                error: None,
                created_ms: 0,
                updated_ms: 0,
                user_data: None,
            };
            let cache = node_cache(&cp, &node, None).await;
            let images = cache.images.as_ref().expect("images");
            assert_eq!(images.failed, 3, "{cache:?}");
            assert_eq!(images.source, "node annotation", "{cache:?}");
            // A node that published nothing: no report.
            let other = crate::store::NodeRecord {
                name: "n-2".into(),
                ..node
            };
            assert!(node_cache(&cp, &other, None).await.images.is_none());
            join.stop();
        });
    }
}
