//! Data-disk snapshots that make scale-out fast (SPEC §3).
//!
//! `POST /api/v1/snapshots` starts a build that runs SPEC §3's procedure,
//! in its order, as one managed operation:
//!
//! 1. `builder`: a builder pool (copy of the source pool: 1 node, fresh
//!    data disks);
//! 2. `ready`: its node initialized by the agent and Ready (the agent caches
//!    the Kubernetes package on the data disk, the kubelet stand-in pulls
//!    the system images into containerd, whose root is on that disk);
//! 3. `detach`: the node removed from the cluster, the instance kept and
//!    running (its kubelet stopped first so that it cannot register again;
//!    containerd keeps running); the instance leaves its pool (Detached);
//! 4. `package`: the package cache (`<mount>/ack/kubernetes`) checked file
//!    by file against its manifest's sha256;
//! 5. `images`: the system and business images pulled through CRI
//!    (`kubelet --ensure-images`, run through the provider's exec);
//! 6. `clean`: per-node credentials removed from the disk, `sync`;
//! 7. `stop`: the instance stopped;
//! 8. `snapshot`: its runtime disk ([`knit_api::disk`]: the disk the agent
//!    mounted) snapshotted and recorded (Kubernetes
//!    and containerd versions, images with digests, used bytes, pool, time);
//! 9. `release`: the builder instance released unless `keepBuilder`, the
//!    builder pool removed.
//!
//! Builds and every progress message are stored (SQLite), so a build is
//! visible after a restart. A build that was running when the server died
//! is not resumed (its waits and the builder's state are not safely
//! repeatable at every point): at start it is marked failed at the step it
//! had reached and its builder is cleaned up (see [`recover`]). One that had
//! already recorded its snapshot only had the release left: that is done
//! and the build succeeds.
//!
//! Pools name a snapshot in `dataDisks[].snapshotId`; creating or updating
//! such a pool while the snapshot holds another Kubernetes version than the
//! cluster answers with a warning (`?strict=true`: refused). Deleting a
//! snapshot a pool uses is refused.

use crate::control::ControlPlane;
use crate::error::{Result, ServerError};
use crate::store::{build_state, now_ms, state, BuildStep, SnapshotBuildRecord, SnapshotRecord};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use knit_api::NodePool;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};

type Cp = Arc<ControlPlane>;

/// How long the builder node may take to become Ready.
const READY_TIMEOUT: Duration = Duration::from_secs(15 * 60);
/// Where the agent installs the package's binaries (the kubelet stand-in).
const KUBELET: &str = "/usr/local/bin/kubelet";
/// The `images` step's deadline (the pulls' own retries against an
/// unreachable registry run for tens of minutes); the request's
/// `imagesTimeoutSeconds` overrides it.
const IMAGES_TIMEOUT: Duration = Duration::from_secs(10 * 60);
/// How often the `images` step says it is still pulling, and what.
const IMAGES_PROGRESS_EVERY: Duration = Duration::from_secs(15);
/// The pulls' log in the builder (the kubelet stand-in's stderr).
const IMAGES_LOG: &str = "/var/log/knit/snapshot-images.log";
/// What to do when the builder cannot pull.
const REGISTRY_FIX: &str = "the nodes cannot pull from the registry: give the pool registry \
     mirrors its nodes reach (spec.containerd.registryMirrors, e.g. \
     {\"docker.io\": [\"http://10.213.0.1:5000\"]}, and insecureRegistries for plain HTTP), \
     or run `knit registry up --seed` (and `--image` for your own) and name it there; \
     see docs/snapshots.md";
/// Provider calls of a clean-up are retried this many times.
const CLEANUP_ATTEMPTS: u32 = 5;
/// The `cleanup` message that ends a complete clean-up; a failed build
/// without it is cleaned up again at the next start.
const CLEANUP_DONE: &str = "clean-up complete";

/// Stops the builder's kubelet and waits until it is gone: under systemd
/// the unit, else the agent's supervisor (SIGTERM stops the service too).
/// containerd keeps running.
const STOP_KUBELET: &str = r#"
if [ -d /run/systemd/system ] && command -v systemctl >/dev/null; then systemctl stop kubelet; exit $?; fi
alive() { [ -n "$1" ] && [ -r "/proc/$1/stat" ] && ! grep -q ') Z ' "/proc/$1/stat"; }
sup=$(awk '{print $1}' /run/knit/kubelet.pid 2>/dev/null)
main=$(awk '{print $1}' /run/knit/kubelet.main.pid 2>/dev/null)
alive "$sup" && kill -TERM "$sup"
i=0
while alive "$sup" || alive "$main"; do
  i=$((i+1))
  if [ "$i" -eq 450 ] && alive "$main"; then kill -KILL "$main"; fi
  if [ "$i" -gt 600 ]; then echo "the kubelet (supervisor $sup, process $main) still runs after 60s" >&2; exit 1; fi
  sleep 0.1
done
"#;

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
    /// Deadline of the `images` step (default 600 s).
    #[serde(default)]
    pub images_timeout_seconds: Option<u64>,
}

/// A build as the API shows it: the stored record, its messages and, once
/// made, the snapshot.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BuildStatus {
    #[serde(flatten)]
    pub build: SnapshotBuildRecord,
    pub steps: Vec<BuildStep>,
    /// No longer running (succeeded or failed).
    pub done: bool,
    pub snapshot: Option<SnapshotRecord>,
}

fn status_of(cp: &ControlPlane, build: SnapshotBuildRecord) -> Result<BuildStatus> {
    let steps = cp.store.snapshot_build_steps(&build.id)?;
    let snapshot = match &build.snapshot_id {
        Some(sid) => cp.store.snapshots()?.into_iter().find(|s| &s.id == sid),
        None => None,
    };
    Ok(BuildStatus {
        done: build.status != build_state::RUNNING,
        build,
        steps,
        snapshot,
    })
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

/// Warnings at pool create and update (`warnings` in the answer, printed
/// by the CLI as `Warning: …`): data disks from snapshots unknown to knit,
/// holding another Kubernetes version than the cluster, or on a disk the
/// agent does not mount; user data that touches an initialization marker
/// too late (`UserDataMarkerTooLate`). With `strict` a version mismatch is
/// refused.
pub fn check_pool(cp: &ControlPlane, pool: &NodePool, strict: bool) -> Result<Vec<String>> {
    let cluster_version = cp.cluster_doc()?.spec.kubernetes_version;
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
    for w in knit_api::validate::userdata_marker_warnings(&pool.spec.user_data) {
        warnings.push(format!("{}: {} ({})", w.field, w.message, w.code));
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

/// `GET /api/v1/snapshot-builds`: every build, newest last, without their
/// messages.
pub async fn builds(State(cp): State<Cp>) -> Result<Json<Value>> {
    let items = cp.store.snapshot_builds()?;
    Ok(Json(json!({ "items": items })))
}

/// `GET /api/v1/snapshot-builds/{id}`: one build with its messages.
pub async fn build_status(
    State(cp): State<Cp>,
    Path(id): Path<String>,
) -> Result<Json<BuildStatus>> {
    let build = cp.store.snapshot_build(&id)?.ok_or(ServerError::NotFound {
        kind: "snapshot build",
        name: id,
    })?;
    Ok(Json(status_of(&cp, build)?))
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
            "the pool has no data disk: a snapshot is made of the runtime disk (the last data disk, NVMe preferred), the runtime's home",
        ));
    }
    if let Some(t) = req
        .images_timeout_seconds
        .filter(|t| !(1..=86_400).contains(t))
    {
        return Err(invalid(
            "imagesTimeoutSeconds",
            &t.to_string(),
            "1 to 86400 seconds",
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
    let build = SnapshotBuildRecord {
        id: id.clone(),
        name,
        pool: req.pool.clone(),
        builder_pool,
        builder_instance: None,
        images: req.images.clone(),
        keep_builder: req.keep_builder,
        status: build_state::RUNNING.to_string(),
        step: "builder".to_string(),
        error: None,
        snapshot_id: None,
        started_ms: now_ms(),
        finished_ms: None,
    };
    cp.store.insert_snapshot_build(&build)?;
    let task_cp = cp.clone();
    tokio::spawn(async move {
        let result = run(&task_cp, &id, &req).await;
        finish(&task_cp, &id, result).await;
    });
    Ok((StatusCode::ACCEPTED, Json(status_of(&cp, build)?)))
}

/// Ends a build: success recorded, or the failure recorded after the
/// builder was cleaned up (so that a finished build leaves nothing behind).
async fn finish(cp: &Cp, id: &str, result: Result<SnapshotRecord>) {
    let outcome = match result {
        Ok(snap) => {
            remark(cp, id, "done", &format!("snapshot {} ready", snap.id));
            cp.store
                .finish_snapshot_build(id, build_state::SUCCEEDED, None)
        }
        Err(e) => {
            let step = cp
                .store
                .snapshot_build(id)
                .ok()
                .flatten()
                .map(|b| b.step)
                .unwrap_or_default();
            let msg = format!("step {step}: {e} [{}]", e.code());
            if let Ok(Some(b)) = cp.store.snapshot_build(id) {
                clean_up(cp, &b).await;
            }
            remark(cp, id, "failed", &msg);
            let _ = cp
                .store
                .add_event("Warning", "Snapshot", id, "BuildFailed", &msg);
            cp.store
                .finish_snapshot_build(id, build_state::FAILED, Some(&msg))
        }
    };
    if let Err(e) = outcome {
        tracing::error!(build = id, error = %e, "cannot record the end of the build");
    }
}

/// At server start: every build still recorded as running was cut off by
/// the server's end. One whose snapshot was recorded only lacked the
/// release: it is released and the build succeeds. Any other is marked
/// failed at its step now, and its builder cleaned up in the background
/// (instance released unless `keepBuilder`, then stopped; builder pool
/// removed; a provider snapshot not yet recorded deleted).
pub fn recover(cp: &Cp) -> Result<()> {
    let interrupted: Vec<SnapshotBuildRecord> = cp
        .store
        .snapshot_builds()?
        .into_iter()
        .filter(|b| b.status == build_state::RUNNING)
        .collect();
    // Failed builds whose clean-up did not end (the server died during it,
    // or a provider call kept failing): once more.
    let mut unclean = Vec::new();
    for b in cp.store.snapshot_builds()? {
        if b.status == build_state::FAILED
            && !cp
                .store
                .snapshot_build_steps(&b.id)?
                .iter()
                .any(|s| s.step == "cleanup" && s.message == CLEANUP_DONE)
        {
            unclean.push(b);
        }
    }
    if interrupted.is_empty() && unclean.is_empty() {
        return Ok(());
    }
    let recorded = cp.store.snapshots()?;
    let mut failed = Vec::new();
    let mut completed = Vec::new();
    for b in interrupted {
        let snapshot_recorded = b
            .snapshot_id
            .as_ref()
            .is_some_and(|sid| recorded.iter().any(|s| &s.id == sid));
        if snapshot_recorded {
            completed.push(b);
            continue;
        }
        let msg = format!(
            "interrupted at step {}: the knit server stopped during the build (builds are not resumed; run knit snapshot create again)",
            b.step
        );
        remark(cp, &b.id, "failed", &msg);
        cp.store
            .finish_snapshot_build(&b.id, build_state::FAILED, Some(&msg))?;
        cp.store
            .add_event("Warning", "Snapshot", &b.id, "BuildInterrupted", &msg)?;
        tracing::warn!(build = %b.id, step = %b.step, "snapshot build interrupted by a restart: failed, cleaning up its builder");
        failed.push(b);
    }
    failed.extend(unclean);
    let task_cp = cp.clone();
    tokio::spawn(async move {
        for b in failed {
            clean_up(&task_cp, &b).await;
        }
        for b in completed {
            let id = b.id.clone();
            let result = complete_release(&task_cp, &b).await;
            finish(&task_cp, &id, result).await;
        }
    });
    Ok(())
}

/// The last step of a build whose snapshot was recorded before a restart.
async fn complete_release(cp: &Cp, b: &SnapshotBuildRecord) -> Result<SnapshotRecord> {
    let sid = b.snapshot_id.clone().unwrap_or_default();
    let snap = cp
        .store
        .snapshots()?
        .into_iter()
        .find(|s| s.id == sid)
        .ok_or_else(|| ServerError::NotFound {
            kind: "snapshot",
            name: sid.clone(),
        })?;
    let what = release_builder(cp, b).await?;
    let _ = cp.store.mark_pool_deleting(&b.builder_pool);
    cp.wake();
    progress(
        cp,
        &b.id,
        "release",
        format!("{what} (after a server restart)"),
    )
    .await?;
    Ok(snap)
}

/// What happens to a builder that left its pool (Detached): released, or
/// with `keepBuilder` stopped and kept. A builder still in its pool goes
/// with the pool. Returns what was done.
async fn release_builder(cp: &Cp, b: &SnapshotBuildRecord) -> Result<String> {
    let Some(instance) = &b.builder_instance else {
        return Ok("no builder instance yet".to_string());
    };
    let Some(rec) = cp.store.instance(instance)? else {
        return Ok(format!("builder instance {instance} already gone"));
    };
    if rec.state != state::DETACHED {
        return Ok(format!(
            "builder instance {instance} ({}) released with its pool {}",
            rec.state, b.builder_pool
        ));
    }
    let provider = cp.provider()?;
    let found = match &rec.provider_id {
        Some(pid) => provider.get(pid).await?,
        None => provider.find_by_name(instance).await?,
    };
    if b.keep_builder {
        if let Some(f) = found
            .iter()
            .find(|f| !f.state.eq_ignore_ascii_case("stopped"))
        {
            provider.stop(&f.id).await?;
        }
        return Ok(format!("builder instance {instance} kept (stopped)"));
    }
    if let Some(f) = &found {
        provider.delete(&f.id).await?;
    }
    cp.store.remove_instance(instance)?;
    cp.store.add_event(
        "Normal",
        "Instance",
        instance,
        "Released",
        &format!("snapshot builder of {} released", b.id),
    )?;
    Ok(format!("builder instance {instance} released"))
}

/// Leaves nothing of a failed build behind: the provider snapshot if it
/// was made but not recorded, the builder instance (see
/// [`release_builder`]), the builder pool. Provider calls are retried;
/// what still fails is logged, recorded on the build and as an event, and
/// tried again at the next server start. Repeating it is harmless.
async fn clean_up(cp: &Cp, b: &SnapshotBuildRecord) {
    let mut complete = true;
    if let Some(sid) = &b.snapshot_id {
        let recorded = cp
            .store
            .snapshots()
            .map(|s| s.iter().any(|s| &s.id == sid))
            .unwrap_or(true);
        if !recorded {
            match retry(|| async {
                let provider = cp.provider()?;
                provider.snapshot_delete(sid).await
            })
            .await
            {
                Ok(()) => remark(
                    cp,
                    &b.id,
                    "cleanup",
                    &format!("unrecorded snapshot {sid} deleted"),
                ),
                Err(e) => {
                    complete = false;
                    leaked(cp, b, &format!("snapshot {sid} could not be deleted: {e}"))
                }
            }
        }
    }
    // Snapshots named after the build that no record uses: the one whose
    // id never came back (the server died during the provider call).
    match retry(|| async { cp.provider()?.snapshots_named(&b.id).await }).await {
        Ok(ids) => {
            let recorded: Vec<String> = match cp.store.snapshots() {
                Ok(s) => s.into_iter().map(|s| s.id).collect(),
                Err(e) => {
                    complete = false;
                    leaked(cp, b, &format!("snapshots named {}: {e}", b.id));
                    ids.clone()
                }
            };
            for sid in ids.iter().filter(|sid| !recorded.contains(sid)) {
                match retry(|| async { cp.provider()?.snapshot_delete(sid).await }).await {
                    Ok(()) => remark(
                        cp,
                        &b.id,
                        "cleanup",
                        &format!("unrecorded snapshot {sid} (named {}) deleted", b.id),
                    ),
                    Err(e) => {
                        complete = false;
                        leaked(cp, b, &format!("snapshot {sid} could not be deleted: {e}"))
                    }
                }
            }
        }
        Err(e) => {
            complete = false;
            leaked(cp, b, &format!("snapshots named {}: {e}", b.id))
        }
    }
    match retry(|| release_builder(cp, b)).await {
        Ok(what) => remark(cp, &b.id, "cleanup", &what),
        Err(e) => {
            complete = false;
            leaked(cp, b, &format!("builder instance: {e}"))
        }
    }
    match cp.store.mark_pool_deleting(&b.builder_pool) {
        Ok(()) => remark(
            cp,
            &b.id,
            "cleanup",
            &format!("builder pool {} deleted", b.builder_pool),
        ),
        Err(ServerError::NotFound { .. }) => {}
        Err(e) => {
            complete = false;
            leaked(cp, b, &format!("builder pool {}: {e}", b.builder_pool))
        }
    }
    if complete {
        remark(cp, &b.id, "cleanup", CLEANUP_DONE);
    }
    cp.wake();
}

fn leaked(cp: &ControlPlane, b: &SnapshotBuildRecord, what: &str) {
    let msg = format!("clean-up incomplete, remove by hand: {what}");
    tracing::error!(build = %b.id, "{msg}");
    remark(cp, &b.id, "cleanup", &msg);
    let _ = cp
        .store
        .add_event("Warning", "Snapshot", &b.id, "CleanupFailed", &msg);
}

async fn retry<T, F, Fut>(mut f: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let mut attempt = 1;
    loop {
        match f().await {
            Ok(v) => return Ok(v),
            Err(e) if attempt >= CLEANUP_ATTEMPTS => return Err(e),
            Err(e) => {
                tracing::warn!(attempt, error = %e, "snapshot clean-up: retrying");
                tokio::time::sleep(Duration::from_secs(1 << attempt)).await;
                attempt += 1;
            }
        }
    }
}

/// `sh -c` inside the builder: exit code, stdout, stderr.
async fn sh_status(
    cp: &ControlPlane,
    provider_id: &str,
    script: &str,
) -> Result<(i32, String, String)> {
    let (code, out, err) = cp
        .provider()?
        .exec(
            provider_id,
            &["sh".to_string(), "-c".to_string(), script.to_string()],
        )
        .await?;
    Ok((
        code,
        String::from_utf8_lossy(&out).to_string(),
        String::from_utf8_lossy(&err).to_string(),
    ))
}

/// The last line of the pulls' log in the builder (for progress and
/// errors); empty when it cannot be read.
async fn last_pull_line(cp: &ControlPlane, provider_id: &str) -> String {
    let Ok(provider) = cp.provider() else {
        return String::new();
    };
    let read = tokio::time::timeout(
        Duration::from_secs(5),
        provider.read_file(provider_id, IMAGES_LOG),
    )
    .await;
    let Ok(Ok(bytes)) = read else {
        return String::new();
    };
    let text = String::from_utf8_lossy(&bytes);
    let line = text
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    line.chars().take(400).collect()
}

/// Why the pulls failed, from the stand-in's report (stdout): each failed
/// image with its registry's error.
pub fn pull_failures(report: &str) -> Vec<String> {
    let Ok(report) = serde_json::from_str::<Value>(report.trim()) else {
        return Vec::new();
    };
    report["images"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|i| {
            i["error"]
                .as_str()
                .map(|e| format!("{}: {e}", i["image"].as_str().unwrap_or("?")))
        })
        .collect()
}

/// Pulls `images` through CRI in the builder with a deadline (`timeout`
/// in the builder, and the same bound here should the exec itself hang),
/// noting progress every few seconds. A pull that fails or does not finish
/// fails the build with the registry's error and the fix.
async fn pull_images(
    cp: &ControlPlane,
    id: &str,
    provider_id: &str,
    images: &[String],
    limit: Duration,
) -> Result<String> {
    let secs = limit.as_secs().max(1);
    let script = format!(
        "mkdir -p /var/log/knit; timeout -k 10 {secs} {KUBELET} --ensure-images={} 2>{IMAGES_LOG}",
        quote(&images.join(","))
    );
    let started = Instant::now();
    let pull = sh_status(cp, provider_id, &script);
    tokio::pin!(pull);
    let backstop = tokio::time::sleep(limit + Duration::from_secs(30));
    tokio::pin!(backstop);
    let mut tick = tokio::time::interval(IMAGES_PROGRESS_EVERY);
    tick.tick().await;
    let outcome = loop {
        tokio::select! {
            r = &mut pull => break Some(r?),
            _ = &mut backstop => break None,
            _ = tick.tick() => {
                let last = last_pull_line(cp, provider_id).await;
                note(cp, id, "images", format!(
                    "still pulling after {}s (deadline {secs}s){}",
                    started.elapsed().as_secs(),
                    if last.is_empty() { String::new() } else { format!(": {last}") }
                ))?;
            }
        }
    };
    let timed_out = |last: String| {
        ServerError::Conflict(format!(
            "images: not all of {} image(s) pulled within the deadline of {secs}s{}; {REGISTRY_FIX}",
            images.len(),
            if last.is_empty() { String::new() } else { format!(" (last: {last})") }
        ))
    };
    match outcome {
        None => Err(timed_out(last_pull_line(cp, provider_id).await)),
        // `timeout` exits 124 (137 after its KILL).
        Some((124 | 137, _, _)) => Err(timed_out(last_pull_line(cp, provider_id).await)),
        Some((0, out, _)) => Ok(out),
        Some((code, out, err)) => {
            let failures = pull_failures(&out);
            let why = if failures.is_empty() {
                format!(
                    "the pull exited {code}: {}",
                    if err.trim().is_empty() {
                        last_pull_line(cp, provider_id).await
                    } else {
                        err.trim().chars().take(400).collect()
                    }
                )
            } else {
                format!(
                    "{} image(s) could not be pulled: {}",
                    failures.len(),
                    failures.join("; ")
                )
            };
            Err(ServerError::Conflict(format!(
                "images: {why}; {REGISTRY_FIX}"
            )))
        }
    }
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
                "in the builder, `{}` exited {code}: {}{}",
                script.trim(),
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
    let build = cp
        .store
        .snapshot_build(id)?
        .ok_or_else(|| ServerError::Internal(format!("snapshot build {id} is not recorded")))?;
    let builder_pool = build.builder_pool.clone();
    let source = cp
        .store
        .pool(&req.pool)?
        .ok_or_else(|| ServerError::NotFound {
            kind: "pool",
            name: req.pool.clone(),
        })?
        .pool;
    let cluster_version = cp.cluster_doc()?.spec.kubernetes_version;

    // Builder pool: the source's configuration, one node, fresh disks.
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
    note(
        cp,
        id,
        "builder",
        format!(
            "builder pool {builder_pool} created from pool {} (1 node)",
            req.pool
        ),
    )?;
    let record = build_on(cp, &build, req, &pool, &cluster_version).await?;
    // The builder left its pool at `detach`: the empty pool goes.
    let _ = cp.store.mark_pool_deleting(&builder_pool);
    cp.wake();
    Ok(record)
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

async fn build_on(
    cp: &Cp,
    build: &SnapshotBuildRecord,
    req: &BuildRequest,
    pool: &NodePool,
    cluster_version: &str,
) -> Result<SnapshotRecord> {
    let id = build.id.as_str();
    let builder_pool = build.builder_pool.as_str();
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
    cp.store.set_snapshot_build_instance(id, &instance)?;
    progress(
        cp,
        id,
        "builder",
        format!("builder instance {instance} requested"),
    )
    .await?;

    // Ready: system images on the disk, package cached by the agent.
    let attached = cp.cluster.attached();
    let node = wait_until("builder node Ready", READY_TIMEOUT, || {
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
                n.initialized()
            }
        }))
    })
    .await?;
    progress(
        cp,
        id,
        "ready",
        format!(
            "builder node {} {} after {:.1}s",
            node.name,
            if attached { "Ready" } else { "initialized" },
            started.elapsed().as_secs_f64()
        ),
    )
    .await?;
    let provider_id = cp
        .store
        .instance(&instance)?
        .and_then(|i| i.provider_id)
        .ok_or_else(|| ServerError::Internal(format!("builder {instance} has no provider id")))?;

    // Out of the cluster, instance kept and running. The kubelet goes
    // first so that it cannot register the Node again; containerd stays
    // for the pulls.
    note(
        cp,
        id,
        "detach",
        format!(
            "stopping the kubelet on {instance}, then removing node {} from the cluster",
            node.name
        ),
    )?;
    sh(cp, &provider_id, STOP_KUBELET).await?;
    if attached {
        cp.cluster.remove_node(&node.name).await?;
    }
    {
        // The pool drops to 0 with its instance Detached, in the planner's
        // lock, so that it neither replaces nor releases the builder.
        let _guard = cp.plan_lock.lock().await;
        if let Some(record) = cp.store.pool(builder_pool)? {
            let mut p = record.pool;
            p.spec.replicas = 0;
            cp.store.update_pool(&p)?;
        }
        cp.store
            .set_instance_state(&instance, state::DETACHED, None)?;
    }
    cp.store.add_event(
        "Normal",
        "Instance",
        &instance,
        "Detached",
        &format!("snapshot build {id}: removed from the cluster, instance kept running"),
    )?;
    progress(
        cp,
        id,
        "detach",
        format!(
            "node {} removed from the cluster; instance {instance} kept (running, Detached)",
            node.name
        ),
    )
    .await?;

    // The package cache, verified file by file, on the disk the agent
    // mounted (the runtime disk).
    let (disk_index, mount) = runtime_disk(pool)?;
    let cache = format!("{mount}/ack/kubernetes");
    let manifest = sh(cp, &provider_id, &format!("cat {}", quote(&format!("{cache}/knit-cache.json"))))
        .await
        .map_err(|e| {
            ServerError::Conflict(format!(
                "the builder has no package cache at {cache} (is the runtime disk, data disk #{disk_index}, mounted there?): {e}"
            ))
        })?;
    let manifest: Value = serde_json::from_str(&manifest)
        .map_err(|e| ServerError::Conflict(format!("{cache}/knit-cache.json: {e}")))?;
    let kubernetes_version = manifest["version"].as_str().unwrap_or_default().to_string();
    let files = manifest["files"].as_object().cloned().unwrap_or_default();
    if kubernetes_version.is_empty() || !files.contains_key("bin/kubelet") {
        return Err(ServerError::Conflict(format!(
            "{cache}/knit-cache.json names no version or no bin/kubelet"
        )));
    }
    let mut sums = String::new();
    for (rel, sum) in &files {
        let sum = sum.as_str().unwrap_or_default();
        let safe = !rel.starts_with('/')
            && !rel.split('/').any(|c| c == ".." || c.is_empty())
            && !rel.contains('\n');
        if !safe || sum.len() != 64 || !sum.chars().all(|c| c.is_ascii_hexdigit()) {
            return Err(ServerError::Conflict(format!(
                "{cache}/knit-cache.json: bad entry {rel:?}: {sum:?}"
            )));
        }
        sums.push_str(&format!("{sum}  {rel}\n"));
    }
    sh(
        cp,
        &provider_id,
        &format!(
            "cd {} && printf '%s' {} | sha256sum --check --quiet --strict",
            quote(&cache),
            quote(&sums)
        ),
    )
    .await
    .map_err(|e| {
        ServerError::Conflict(format!(
            "the package cache in {cache} does not match its manifest: {e}"
        ))
    })?;
    progress(
        cp,
        id,
        "package",
        format!(
            "Kubernetes {kubernetes_version} package cached in {cache}: {} files match their sha256",
            files.len()
        ),
    )
    .await?;

    // System and business images, through CRI on the instance's containerd.
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
    if all.is_empty() {
        progress(cp, id, "images", "no image to pull").await?;
    } else {
        note(
            cp,
            id,
            "images",
            format!(
                "pulling {} image(s) into containerd through CRI: {}",
                all.len(),
                all.join(", ")
            ),
        )?;
        let t = Instant::now();
        let limit = req
            .images_timeout_seconds
            .map(Duration::from_secs)
            .unwrap_or(IMAGES_TIMEOUT);
        let out = pull_images(cp, id, &provider_id, &all, limit).await?;
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
            cp,
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
        )
        .await?;
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
        cp,
        id,
        "clean",
        format!("builder credentials removed, disk synced ({used} bytes used)"),
    )
    .await?;

    // Stopped: the disk is quiet for the snapshot.
    cp.provider()?.stop(&provider_id).await?;
    progress(cp, id, "stop", format!("instance {instance} stopped")).await?;

    // Snapshot of the runtime disk; its id is stored before anything
    // else so that an interrupted build can delete it. It is named after
    // the build (its id: unique, unlike the build's name), so that the
    // clean-up finds one whose id never came back (server killed mid-call).
    let t = Instant::now();
    let snap = cp
        .provider()?
        .snapshot_create(&provider_id, disk_index, &build.id)
        .await?;
    cp.store.set_snapshot_build_snapshot(id, &snap.id)?;
    let record = SnapshotRecord {
        id: snap.id.clone(),
        pool: req.pool.clone(),
        kubernetes_version: kubernetes_version.clone(),
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
            "{}: from pool {} in {:.1}s",
            build.name,
            req.pool,
            started.elapsed().as_secs_f64()
        ),
    )?;
    if kubernetes_version != cluster_version {
        note(
            cp,
            id,
            "snapshot",
            format!("warning: the snapshot holds Kubernetes {kubernetes_version}, the cluster runs {cluster_version}"),
        )?;
    }
    progress(
        cp,
        id,
        "snapshot",
        format!(
            "data disk snapshotted as {} in {:.1}s",
            snap.id,
            t.elapsed().as_secs_f64()
        ),
    )
    .await?;

    // Release the builder unless kept.
    let mut kept = build.clone();
    kept.builder_instance = Some(instance.clone());
    let what = release_builder(cp, &kept).await?;
    progress(cp, id, "release", what).await?;
    Ok(record)
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
pub fn parse_image_annotation(text: &str) -> Option<Value> {
    let mut out = json!({"hit": 0, "miss": 0, "bytesPulled": 0, "failed": 0});
    for part in text.split_whitespace() {
        let (k, v) = part.split_once('=')?;
        let v: u64 = v.parse().ok()?;
        let key = match k {
            "hit" | "miss" | "failed" => k,
            "bytes" => "bytesPulled",
            _ => continue,
        };
        out[key] = json!(v);
    }
    Some(out)
}

/// What a node took from caches (for `knit describe node`): the package
/// (from the agent's kubernetes-components report) and the system images.
/// The images come from the node's own published report (the kubelet's
/// Node annotation, read from the cluster: what the node's credential
/// wrote); each image's outcome (failed pulls with their error) is added
/// from the report file inside the instance when the provider can read it.
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
    let published = tokio::time::timeout(
        DESCRIBE_READ_TIMEOUT,
        cp.cluster
            .node_annotation(&node.name, IMAGE_CACHE_ANNOTATION),
    )
    .await;
    if let Ok(Ok(Some(text))) = published {
        if let Some(mut summary) = parse_image_annotation(&text) {
            summary["source"] = json!("node annotation");
            out["images"] = summary;
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
        serde_json::from_slice::<Value>(&bytes).ok()
    };
    if let Some(report) = detail.await {
        if out["images"].is_null() {
            // No cluster to publish to (or not published yet): the file.
            out["images"] = report;
            out["images"]["source"] = json!("report file");
        } else if report["images"].is_array() {
            out["images"]["images"] = report["images"].clone();
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The local cloud of a test, brought down (store unmounted, loop
    /// device detached, state removed) when dropped, also on panic.
    struct LocalDown(knit_local::Cloud);

    impl Drop for LocalDown {
        fn drop(&mut self) {
            match self.0.down() {
                Ok(r) if r.errors.is_empty() => {}
                Ok(r) => eprintln!("local cloud down left: {:?}", r.errors),
                Err(e) => eprintln!("local cloud down: {e}"),
            }
        }
    }

    /// A server killed during the provider's snapshot call leaves a
    /// snapshot no record names. The failed build's clean-up finds it by
    /// the build's name (its id) in the real local cloud and deletes it;
    /// a recorded snapshot with that name and another build's stay.
    #[test]
    fn clean_up_deletes_the_unrecorded_snapshot_named_after_the_build() {
        knit_local::require_root()
            .expect("this test needs root (the local cloud's block store is a loop-mounted XFS)");
        let dir = tempfile::tempdir().unwrap();
        let config = knit_local::Config {
            state_dir: dir.path().join("local"),
            // No instance is made: no bridge or network is created.
            bridge: format!("kq{:x}", std::process::id()),
            subnet: "10.217.0.0/24".into(),
            ..knit_local::Config::default()
        };
        let cloud = LocalDown(knit_local::Cloud::open(config.clone()).unwrap());
        let provider = crate::provider::local::LocalProvider::new(config).unwrap();
        let store = crate::store::Store::open(&dir.path().join("k.db")).unwrap();
        let cp = Arc::new(ControlPlane::new(
            store,
            Some(Arc::new(provider)),
            Arc::new(crate::bootstrap::NoCluster),
            crate::control::Settings::new(dir.path().join("server")),
            String::new(),
            String::new(),
            String::new(),
        ));
        let disk = cloud
            .0
            .disk_create(&knit_local::DiskSpec {
                name: "data0".into(),
                size: Some(knit_local::Quantity::Text("64Mi".into())),
                interface: knit_local::DiskInterface::Virtio,
                snapshot: None,
                format: None,
            })
            .unwrap();
        let build = SnapshotBuildRecord {
            id: "build-c0ffee".into(),
            name: "web".into(),
            pool: "workers".into(),
            builder_pool: "workers-snap-c0ffee".into(),
            builder_instance: None,
            images: vec![],
            keep_builder: false,
            status: build_state::FAILED.into(),
            step: "stop".into(),
            error: Some("interrupted at step stop".into()),
            snapshot_id: None,
            started_ms: 1,
            finished_ms: Some(2),
        };
        cp.store.insert_snapshot_build(&build).unwrap();
        // What the cut-off call left: named after the build, id unknown.
        let orphan = cloud
            .0
            .snapshot_create_named(&disk.id, Some(&build.id))
            .unwrap();
        // A recorded snapshot under the same name, and another build's.
        let kept = cloud
            .0
            .snapshot_create_named(&disk.id, Some(&build.id))
            .unwrap();
        cp.store
            .add_snapshot(&SnapshotRecord {
                id: kept.id.clone(),
                pool: "workers".into(),
                kubernetes_version: "1.31.4".into(),
                containerd_version: String::new(),
                images: vec![],
                size_bytes: 1,
                created_ms: 1,
            })
            .unwrap();
        let other = cloud
            .0
            .snapshot_create_named(&disk.id, Some("build-0ther0"))
            .unwrap();

        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(clean_up(&cp, &build));

        let mut left: Vec<String> = cloud
            .0
            .snapshots()
            .unwrap()
            .into_iter()
            .map(|s| s.id)
            .collect();
        left.sort();
        let mut want = vec![kept.id.clone(), other.id.clone()];
        want.sort();
        assert_eq!(left, want, "{} should be gone", orphan.id);
        let messages: Vec<String> = cp
            .store
            .snapshot_build_steps(&build.id)
            .unwrap()
            .into_iter()
            .filter(|s| s.step == "cleanup")
            .map(|s| s.message)
            .collect();
        assert!(
            messages.contains(&format!(
                "unrecorded snapshot {} (named {}) deleted",
                orphan.id, build.id
            )),
            "{messages:?}"
        );
        assert_eq!(
            messages.last().map(String::as_str),
            Some(CLEANUP_DONE),
            "{messages:?}"
        );
        // Repeating the clean-up (next start) is harmless.
        rt.block_on(clean_up(&cp, &build));
        assert_eq!(cloud.0.snapshots().unwrap().len(), 2);
        for id in [&kept.id, &other.id] {
            cloud.0.snapshot_delete(id).unwrap();
        }
        cloud.0.disk_delete(&disk.id).unwrap();
    }

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

    /// Two data disks: the builder snapshots the disk the agent mounted
    /// (the last one; before, it took the first, an empty disk), and the
    /// node's configuration names that disk's mount target.
    #[test]
    fn the_builder_snapshots_the_disk_the_agent_mounts() {
        let pool = NodePool::from_yaml(
            "apiVersion: knit.dev/v1alpha1\nkind: NodePool\nmetadata: {name: p}\nspec:\n  dataDisks:\n  - {mountTarget: /mnt/logs}\n  - {mountTarget: /var/lib/container}\n",
        )
        .unwrap();
        let (index, mount) = runtime_disk(&pool).unwrap();
        assert_eq!((index, mount.as_str()), (1, "/var/lib/container"));
        let instance = crate::store::InstanceRecord {
            name: "p-abcde".into(),
            pool: "p".into(),
            provider_id: Some("i-1".into()),
            state: "Running".into(),
            ip: None,
            instance_type: "ecs.g7.large".into(),
            report_token_hash: None,
            last_error: None,
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
            json!({"hit": 2, "miss": 1, "bytesPulled": 42, "failed": 3})
        );
        assert!(parse_image_annotation("hit=x").is_none());
        let rt = tokio::runtime::Runtime::new().unwrap();
        let dir = tempfile::tempdir().unwrap();
        rt.block_on(async {
            let cfg = knit_cluster::ClusterConfig::new(
                dir.path().join("cluster"),
                "127.0.0.1:0".parse().unwrap(),
            );
            let cluster = knit_cluster::EmbeddedCluster::start(cfg).await.unwrap();
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
                status: "Ready".into(),
                phase: None,
                phase_outcome: None,
                error_code: None,
                error: None,
                created_ms: 0,
                updated_ms: 0,
                user_data: None,
            };
            let cache = node_cache(&cp, &node, None).await;
            assert_eq!(cache["images"]["failed"], 3, "{cache}");
            assert_eq!(cache["images"]["source"], "node annotation", "{cache}");
            // A node that published nothing: no report.
            let other = crate::store::NodeRecord {
                name: "n-2".into(),
                ..node
            };
            assert!(node_cache(&cp, &other, None).await["images"].is_null());
            join.stop();
        });
    }
}
