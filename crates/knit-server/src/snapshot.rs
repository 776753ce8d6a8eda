//! Data-disk snapshots that make scale-out fast (SPEC §3).
//!
//! `POST /api/v1/snapshots` starts a build that runs ACK's manual procedure
//! as one managed operation:
//!
//! 1. a builder pool (copy of the source pool: 1 node, fresh data disks) →
//!    its node initialized by the agent and Ready (the agent caches the
//!    Kubernetes package on the data disk, the kubelet stand-in pulls the
//!    system images into containerd, whose root is on that disk);
//! 2. the cache (`<mount>/ack/kubernetes/knit-cache.json`) checked, the
//!    listed images pulled through CRI (`kubelet --ensure-images`), digests
//!    and containerd version read, node-specific kubelet credentials removed
//!    from the disk, `sync`;
//! 3. the node removed from the cluster with the instance kept (the
//!    reconciler deletes the Node and stops the instance: Detached);
//! 4. the data disk snapshotted; recorded (Kubernetes and containerd
//!    versions, images with digests, used bytes, source pool, time);
//! 5. the builder instance released unless `keepBuilder`, the builder pool
//!    removed.
//!
//! Progress is kept in memory per build (`GET /api/v1/snapshot-builds/ID`).
//! Pools name a snapshot in `dataDisks[].snapshotId`; creating or updating
//! such a pool while the snapshot holds another Kubernetes version than the
//! cluster answers with a warning (`?strict=true`: refused). Deleting a
//! snapshot a pool uses is refused.

use crate::control::ControlPlane;
use crate::error::{Result, ServerError};
use crate::store::{now_ms, state, SnapshotRecord};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use knit_api::NodePool;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

type Cp = Arc<ControlPlane>;

/// How long the builder node may take to become Ready.
const READY_TIMEOUT: Duration = Duration::from_secs(15 * 60);
/// How long the reconciler may take to detach the builder.
const DETACH_TIMEOUT: Duration = Duration::from_secs(5 * 60);
/// Where the agent installs the package's binaries (the kubelet stand-in).
const KUBELET: &str = "/usr/local/bin/kubelet";

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BuildRequest {
    pub pool: String,
    #[serde(default)]
    pub images: Vec<String>,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub keep_builder: bool,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Step {
    pub at_ms: i64,
    pub step: String,
    pub message: String,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BuildStatus {
    pub id: String,
    pub name: String,
    pub pool: String,
    pub builder_pool: String,
    pub builder_instance: Option<String>,
    pub steps: Vec<Step>,
    pub done: bool,
    pub error: Option<String>,
    pub snapshot: Option<SnapshotRecord>,
    pub started_ms: i64,
    pub finished_ms: Option<i64>,
}

fn builds() -> &'static Mutex<BTreeMap<String, BuildStatus>> {
    static BUILDS: OnceLock<Mutex<BTreeMap<String, BuildStatus>>> = OnceLock::new();
    BUILDS.get_or_init(|| Mutex::new(BTreeMap::new()))
}

fn with_build(id: &str, f: impl FnOnce(&mut BuildStatus)) {
    let mut map = builds().lock().unwrap_or_else(|p| p.into_inner());
    if let Some(b) = map.get_mut(id) {
        f(b);
    }
}

fn progress(id: &str, step: &str, message: impl Into<String>) {
    let message = message.into();
    tracing::info!(build = id, step, "{message}");
    with_build(id, |b| {
        b.steps.push(Step {
            at_ms: now_ms(),
            step: step.to_string(),
            message,
        })
    });
}

/// A short random suffix (names of builds and builder pools).
fn suffix() -> String {
    let mut b = [0u8; 3];
    if getrandom(&mut b).is_err() {
        let n = now_ms() as u32;
        b = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
    }
    hex::encode(b)
}

fn getrandom(buf: &mut [u8]) -> std::io::Result<()> {
    use std::io::Read;
    std::fs::File::open("/dev/urandom")?.read_exact(buf)
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
pub async fn list(State(cp): State<Cp>) -> Result<Json<Value>> {
    let cluster_version = cp.cluster_doc()?.spec.kubernetes_version;
    let pools = cp.store.pools()?;
    let items: Vec<Value> = cp
        .store
        .snapshots()?
        .into_iter()
        .map(|s| {
            let used_by: Vec<String> = pools
                .iter()
                .filter(|p| uses(&p.pool, &s.id))
                .map(|p| p.pool.metadata.name.clone())
                .collect();
            let mut v = serde_json::to_value(&s).unwrap_or(Value::Null);
            v["stale"] = json!(s.kubernetes_version != cluster_version);
            v["clusterKubernetesVersion"] = json!(cluster_version);
            v["usedBy"] = json!(used_by);
            v
        })
        .collect();
    Ok(Json(json!({ "items": items })))
}

fn uses(pool: &NodePool, snapshot: &str) -> bool {
    pool.spec
        .data_disks
        .iter()
        .any(|d| d.snapshot_id.as_deref() == Some(snapshot))
}

/// Warnings for a pool whose data disks come from snapshots: unknown to
/// knit, or holding another Kubernetes version than the cluster. With
/// `strict` a version mismatch is refused.
pub fn check_pool(cp: &ControlPlane, pool: &NodePool, strict: bool) -> Result<Vec<String>> {
    let cluster_version = cp.cluster_doc()?.spec.kubernetes_version;
    let known = cp.store.snapshots()?;
    let mut warnings = Vec::new();
    for (i, d) in pool.spec.data_disks.iter().enumerate() {
        let Some(id) = &d.snapshot_id else { continue };
        match known.iter().find(|s| &s.id == id) {
            None => warnings.push(format!(
                "spec.dataDisks[{i}].snapshotId: snapshot {id} was not built by knit: \
                 its content (Kubernetes version, images) is unknown"
            )),
            Some(s) if s.kubernetes_version != cluster_version => {
                let msg = format!(
                    "spec.dataDisks[{i}].snapshotId: snapshot {id} holds Kubernetes {}, the cluster runs {cluster_version}: \
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
    Ok(warnings)
}

pub async fn delete(
    State(cp): State<Cp>,
    Path(id): Path<String>,
) -> Result<(StatusCode, Json<Value>)> {
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
    cp.store
        .add_event("Normal", "Snapshot", &id, "Deleted", "snapshot deleted")?;
    Ok((StatusCode::OK, Json(json!({ "id": id, "deleted": true }))))
}

pub async fn build_status(Path(id): Path<String>) -> Result<Json<BuildStatus>> {
    builds()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&id)
        .cloned()
        .map(Json)
        .ok_or(ServerError::NotFound {
            kind: "snapshot build",
            name: id,
        })
}

pub async fn create(
    State(cp): State<Cp>,
    body: axum::body::Bytes,
) -> Result<(StatusCode, Json<BuildStatus>)> {
    let req: BuildRequest =
        serde_json::from_slice(&body).map_err(|e| knit_api::ApiError::Parse {
            what: "snapshot request".into(),
            message: e.to_string(),
        })?;
    cp.provider()?;
    let record = cp
        .store
        .pool(&req.pool)?
        .ok_or_else(|| ServerError::NotFound {
            kind: "pool",
            name: req.pool.clone(),
        })?;
    if record.pool.spec.data_disks.is_empty() {
        return Err(invalid(
            "pool",
            &req.pool,
            "the pool has no data disk: a snapshot is made of the first data disk, the runtime's home",
        ));
    }
    for img in &req.images {
        if img.is_empty() || img.contains(',') || img.chars().any(char::is_whitespace) {
            return Err(invalid(
                "images",
                img,
                "an image reference without spaces or commas",
            ));
        }
    }
    let id = format!("build-{}", suffix());
    let name = req
        .name
        .clone()
        .unwrap_or_else(|| format!("{}-{}", req.pool, &id[6..]));
    // Pool names are DNS labels of at most 63 characters.
    let mut builder_pool = format!("{}-snap-{}", req.pool, &id[6..]);
    if builder_pool.len() > 63 {
        builder_pool = format!("snap-{}", &id[6..]);
    }
    let status = BuildStatus {
        id: id.clone(),
        name,
        pool: req.pool.clone(),
        builder_pool,
        builder_instance: None,
        steps: Vec::new(),
        done: false,
        error: None,
        snapshot: None,
        started_ms: now_ms(),
        finished_ms: None,
    };
    builds()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(id.clone(), status.clone());
    let task_cp = cp.clone();
    tokio::spawn(async move {
        let result = run(&task_cp, &id, &req).await;
        let end = now_ms();
        match result {
            Ok(snap) => {
                progress(&id, "done", format!("snapshot {} ready", snap.id));
                with_build(&id, |b| {
                    b.snapshot = Some(snap);
                    b.done = true;
                    b.finished_ms = Some(end);
                });
            }
            Err(e) => {
                let msg = format!("{e} [{}]", e.code());
                progress(&id, "failed", msg.clone());
                let _ = task_cp
                    .store
                    .add_event("Warning", "Snapshot", &id, "BuildFailed", &msg);
                with_build(&id, |b| {
                    b.error = Some(msg);
                    b.done = true;
                    b.finished_ms = Some(end);
                });
            }
        }
    });
    Ok((StatusCode::ACCEPTED, Json(status)))
}

fn build_field(id: &str, f: impl Fn(&BuildStatus) -> String) -> String {
    builds()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(id)
        .map(f)
        .unwrap_or_default()
}

/// `sh -c` inside the builder; the output on success.
async fn sh(cp: &ControlPlane, provider_id: &str, script: &str) -> Result<String> {
    let (code, out, err) = cp
        .provider()?
        .exec(
            provider_id,
            &["sh".to_string(), "-c".to_string(), script.to_string()],
        )
        .await?;
    if code != 0 {
        return Err(ServerError::Provider {
            provider: cp.provider()?.name().to_string(),
            message: format!(
                "in the builder, `{script}` exited {code}: {}{}",
                String::from_utf8_lossy(&err).trim(),
                String::from_utf8_lossy(&out).trim()
            ),
        });
    }
    Ok(String::from_utf8_lossy(&out).to_string())
}

fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

async fn run(cp: &Cp, id: &str, req: &BuildRequest) -> Result<SnapshotRecord> {
    let builder_pool = build_field(id, |b| b.builder_pool.clone());
    let name = build_field(id, |b| b.name.clone());
    let source = cp
        .store
        .pool(&req.pool)?
        .ok_or_else(|| ServerError::NotFound {
            kind: "pool",
            name: req.pool.clone(),
        })?
        .pool;
    let cluster_version = cp.cluster_doc()?.spec.kubernetes_version;

    // 1. Builder pool: the source's configuration, one node, fresh disks.
    let mut pool = source.clone();
    pool.metadata.name = builder_pool.clone();
    pool.spec.replicas = 1;
    pool.spec.scaling = None;
    for d in &mut pool.spec.data_disks {
        d.snapshot_id = None;
        d.auto_format = true;
        d.size_gib = d.size_gib.max(40);
    }
    pool.validate()?;
    cp.store.insert_pool(&pool)?;
    cp.store.add_event(
        "Normal",
        "NodePool",
        &builder_pool,
        "Created",
        &format!("snapshot builder for pool {} ({id})", req.pool),
    )?;
    cp.wake();
    progress(
        id,
        "builder",
        format!(
            "builder pool {builder_pool} created from pool {} (1 node)",
            req.pool
        ),
    );
    let result = build_on(cp, id, req, &builder_pool, &name, &pool, &cluster_version).await;
    // The builder pool goes in every case; a kept builder is Detached and
    // is no longer the pool's.
    if let Some(instance) = build_field_opt(id) {
        if result.is_err() && !req.keep_builder {
            release(cp, &instance).await;
        }
    }
    let _ = cp.store.mark_pool_deleting(&builder_pool);
    cp.wake();
    result
}

fn build_field_opt(id: &str) -> Option<String> {
    builds()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(id)
        .and_then(|b| b.builder_instance.clone())
}

async fn release(cp: &Cp, instance: &str) {
    if let Ok(Some(rec)) = cp.store.instance(instance) {
        if let (Some(pid), Ok(provider)) = (&rec.provider_id, cp.provider()) {
            if rec.state == state::DETACHED {
                if let Err(e) = provider.delete(pid).await {
                    tracing::warn!(instance, error = %e, "cannot release the snapshot builder");
                    return;
                }
                let _ = cp.store.remove_instance(instance);
            }
        }
    }
}

async fn wait_until<T>(
    what: &str,
    limit: Duration,
    mut probe: impl FnMut() -> Result<Option<T>>,
) -> Result<T> {
    let start = Instant::now();
    loop {
        if let Some(v) = probe()? {
            return Ok(v);
        }
        if start.elapsed() > limit {
            return Err(ServerError::Conflict(format!(
                "{what}: not done within {}s",
                limit.as_secs()
            )));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[allow(clippy::too_many_arguments)]
async fn build_on(
    cp: &Cp,
    id: &str,
    req: &BuildRequest,
    builder_pool: &str,
    name: &str,
    pool: &NodePool,
    cluster_version: &str,
) -> Result<SnapshotRecord> {
    let started = Instant::now();
    // The builder's instance: the one instance of the builder pool.
    let instance = wait_until("builder instance", READY_TIMEOUT, || {
        Ok(cp
            .store
            .instances(Some(builder_pool))?
            .into_iter()
            .next()
            .map(|i| i.name))
    })
    .await?;
    with_build(id, |b| b.builder_instance = Some(instance.clone()));
    progress(
        id,
        "builder",
        format!("builder instance {instance} requested"),
    );
    let attached = cp.cluster.attached();
    wait_until("builder node Ready", READY_TIMEOUT, || {
        if let Some(i) = cp.store.instance(&instance)? {
            if i.state == state::FAILED {
                return Err(ServerError::Conflict(format!(
                    "builder instance {instance} failed: {}",
                    i.last_error.unwrap_or_default()
                )));
            }
        }
        let node = cp
            .store
            .nodes()?
            .into_iter()
            .find(|n| n.instance == instance);
        if let Some(n) = node
            .as_ref()
            .filter(|n| n.phase_outcome.as_deref() == Some("failed"))
        {
            return Err(ServerError::Conflict(format!(
                "builder node {instance} failed in phase {}: {} {}",
                n.phase.clone().unwrap_or_default(),
                n.error_code.clone().unwrap_or_default(),
                n.error.clone().unwrap_or_default()
            )));
        }
        Ok(node.filter(|n| {
            if attached {
                n.status == "Ready"
            } else {
                crate::api::node_initialized(n)
            }
        }))
    })
    .await?;
    progress(
        id,
        "ready",
        format!(
            "builder node {instance} {} after {:.1}s",
            if attached { "Ready" } else { "initialized" },
            started.elapsed().as_secs_f64()
        ),
    );
    let provider_id = cp
        .store
        .instance(&instance)?
        .and_then(|i| i.provider_id)
        .ok_or_else(|| ServerError::Internal(format!("builder {instance} has no provider id")))?;

    // 2. Package cache, images, versions.
    let mount = pool.spec.data_disks[0]
        .mount_target
        .clone()
        .unwrap_or_else(|| knit_api::config::DEFAULT_DATA_DISK_MOUNT.to_string());
    let cache = format!("{mount}/ack/kubernetes");
    let manifest = sh(cp, &provider_id, &format!("cat {}", quote(&format!("{cache}/knit-cache.json"))))
        .await
        .map_err(|e| {
            ServerError::Conflict(format!(
                "the builder has no package cache at {cache} (is the first data disk mounted there?): {e}"
            ))
        })?;
    let manifest: Value = serde_json::from_str(&manifest)
        .map_err(|e| ServerError::Conflict(format!("{cache}/knit-cache.json: {e}")))?;
    let kubernetes_version = manifest["version"].as_str().unwrap_or_default().to_string();
    progress(
        id,
        "package",
        format!(
            "Kubernetes {kubernetes_version} package cached in {cache} ({} files with sha256)",
            manifest["files"].as_object().map_or(0, |f| f.len())
        ),
    );
    let system: Vec<String> = sh(
        cp,
        &provider_id,
        "cat /etc/kubernetes/images.txt 2>/dev/null || true",
    )
    .await?
    .lines()
    .map(str::trim)
    .filter(|l| !l.is_empty() && !l.starts_with('#'))
    .map(str::to_string)
    .collect();
    let mut all: Vec<String> = system.clone();
    for i in &req.images {
        if !all.contains(i) {
            all.push(i.clone());
        }
    }
    let mut images: Vec<String> = Vec::new();
    if !all.is_empty() {
        progress(
            id,
            "images",
            format!(
                "pulling {} image(s) into containerd through CRI: {}",
                all.len(),
                all.join(", ")
            ),
        );
        let t = Instant::now();
        let out = sh(
            cp,
            &provider_id,
            &format!(
                "{KUBELET} --ensure-images={} 2>/var/log/knit/snapshot-images.log",
                quote(&all.join(","))
            ),
        )
        .await?;
        let report: Value = serde_json::from_str(out.trim())
            .map_err(|e| ServerError::Internal(format!("image report {out:?}: {e}")))?;
        for img in report["images"].as_array().into_iter().flatten() {
            let r = img["image"].as_str().unwrap_or_default();
            let digest = img["repoDigests"][0]
                .as_str()
                .and_then(|d| d.rsplit_once('@'))
                .map(|(_, d)| d.to_string())
                .unwrap_or_default();
            images.push(format!("{r}@{digest}"));
        }
        progress(
            id,
            "images",
            format!(
                "{} image(s) present ({} already there, {} pulled, {} bytes) in {:.1}s",
                images.len(),
                report["hit"],
                report["miss"],
                report["bytesPulled"],
                t.elapsed().as_secs_f64()
            ),
        );
    }
    let containerd_version = sh(cp, &provider_id, "containerd --version")
        .await
        .map(|v| v.split_whitespace().nth(2).unwrap_or_default().to_string())
        .unwrap_or_default();
    // The builder's identity must not travel: kubelet credentials and the
    // stand-in's report are per node.
    let used = sh(
        cp,
        &provider_id,
        &format!(
            "rm -rf /var/lib/kubelet/pki /var/lib/kubelet/knit-images.json; sync; df -B1 --output=used {} | tail -1",
            quote(&mount)
        ),
    )
    .await?;
    let used: i64 = used.trim().parse().unwrap_or(0);
    progress(
        id,
        "clean",
        format!("builder credentials removed, disk synced ({used} bytes used)"),
    );

    // 3. Out of the cluster, instance kept (Detached, stopped).
    {
        let _guard = cp.plan_lock.lock().await;
        if let Some(record) = cp.store.pool(builder_pool)? {
            let mut p = record.pool;
            p.spec.replicas = 0;
            cp.store.update_pool(&p)?;
        }
        cp.store
            .add_delete_intents(builder_pool, std::slice::from_ref(&instance), false)?;
    }
    cp.wake();
    wait_until("builder detached", DETACH_TIMEOUT, || {
        Ok(cp
            .store
            .instance(&instance)?
            .filter(|i| i.state == state::DETACHED)
            .map(|_| ()))
    })
    .await?;
    progress(
        id,
        "detach",
        format!("node {instance} removed from the cluster; instance kept and stopped"),
    );

    // 4. Snapshot of the first data disk.
    let t = Instant::now();
    let snap = cp
        .provider()?
        .snapshot_create(&provider_id, 0, name)
        .await?;
    progress(
        id,
        "snapshot",
        format!(
            "data disk snapshotted as {} in {:.1}s",
            snap.id,
            t.elapsed().as_secs_f64()
        ),
    );
    if kubernetes_version != cluster_version {
        progress(
            id,
            "snapshot",
            format!("warning: the snapshot holds Kubernetes {kubernetes_version}, the cluster runs {cluster_version}"),
        );
    }
    let record = SnapshotRecord {
        id: snap.id.clone(),
        pool: req.pool.clone(),
        kubernetes_version,
        containerd_version,
        images,
        size_bytes: if used > 0 {
            used
        } else {
            snap.size_bytes as i64
        },
        created_ms: now_ms(),
    };
    cp.store.add_snapshot(&record)?;
    cp.store.add_event(
        "Normal",
        "Snapshot",
        &snap.id,
        "Created",
        &format!(
            "{name}: from pool {} in {:.1}s",
            req.pool,
            started.elapsed().as_secs_f64()
        ),
    )?;

    // 5. Release the builder unless kept.
    if req.keep_builder {
        progress(
            id,
            "release",
            format!("builder instance {instance} kept (stopped)"),
        );
    } else {
        release(cp, &instance).await;
        progress(
            id,
            "release",
            format!("builder instance {instance} released"),
        );
    }
    Ok(record)
}

/// What a node took from caches (for `knit describe node`): the package
/// (from the agent's kubernetes-components report) and the system images
/// (the kubelet stand-in's report on the node, read through the provider).
pub async fn node_cache(
    cp: &ControlPlane,
    node: &crate::store::NodeRecord,
    instance: Option<&crate::store::InstanceRecord>,
) -> Value {
    let mut out = json!({});
    let timeline = cp.store.timeline(&node.name).unwrap_or_default();
    if let Some(reason) = timeline
        .iter()
        .rev()
        .find(|t| t.phase == "kubernetes-components" && t.outcome == "done")
        .and_then(|t| t.reason.clone())
    {
        let hit = reason.contains("from the data-disk cache");
        let bytes = reason
            .split(" bytes)")
            .next()
            .and_then(|s| s.rsplit('(').next())
            .and_then(|s| s.trim().parse::<u64>().ok())
            .unwrap_or(0);
        out["package"] = json!({"cacheHit": hit, "bytesDownloaded": if hit { 0 } else { bytes }});
    }
    let Some(pid) = instance.and_then(|i| i.provider_id.clone()) else {
        return out;
    };
    let Ok(provider) = cp.provider() else {
        return out;
    };
    if let Ok(bytes) = provider
        .read_file(&pid, "/var/lib/kubelet/knit-images.json")
        .await
    {
        if let Ok(report) = serde_json::from_slice::<Value>(&bytes) {
            out["images"] = report;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_and_unknown_snapshots_warn_and_strict_refuses() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::Store::open(&dir.path().join("k.db")).unwrap();
        let cp = ControlPlane::new(
            store,
            None,
            Arc::new(crate::bootstrap::NoCluster),
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
        assert!(uses(&pool("s-old"), "s-old") && !uses(&pool("s-old"), "s-fresh"));
    }
}
