//! The build flow (see the module above): a builder pool, its node Ready,
//! detached, prepared by the agent (`knit-agent snapshot-prepare`: kubelet
//! stopped, package cache verified, images pulled, credentials removed),
//! stopped, its runtime disk snapshotted and recorded, the builder released.

use super::cleanup::{clean_up, release_builder};
use super::{invalid, note, progress, remark, runtime_disk, status_of, Cp};
use crate::control::ControlPlane;
use crate::error::{Result, ServerError};
use crate::store::{now_ms, SnapshotBuildRecord, SnapshotRecord};
use crate::userdata::agent;
use knit_api::agent::{
    BuilderCleaned, CacheManifestReport, ImagePull, ImageReport, KubeletStopped, PackageVerified,
    SystemImages, IMAGES_LOG,
};
use knit_api::state::{EventType, InstanceState};
use knit_api::views::{SnapshotBuildRequest, SnapshotBuildStatus};
use knit_api::NodePool;
use std::time::{Duration, Instant};

/// How long the builder node may take to become Ready.
const READY_TIMEOUT: Duration = Duration::from_secs(15 * 60);

/// Bound on each preparation step the agent runs in the builder (a
/// package check reads a few hundred megabytes).
const PREPARE_TIMEOUT: Duration = Duration::from_secs(10 * 60);

/// The `images` step's deadline (the pulls' own retries against an
/// unreachable registry run for tens of minutes); the request's
/// `imagesTimeoutSeconds` overrides it.
const IMAGES_TIMEOUT: Duration = Duration::from_secs(10 * 60);

/// How often the `images` step says it is still pulling, and what.
const IMAGES_PROGRESS_EVERY: Duration = Duration::from_secs(15);

/// What to do when the builder cannot pull.
const REGISTRY_FIX: &str = "the nodes cannot pull from the registry: give the pool registry \
     mirrors its nodes reach (spec.containerd.registryMirrors, e.g. \
     {\"docker.io\": [\"http://10.213.0.1:5000\"]}, and insecureRegistries for plain HTTP), \
     or run `knit registry up --seed` (and `--image` for your own) and name it there; \
     see docs/snapshots.md";

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

/// Starts a build of `req` in the background: checked, recorded (status
/// Running, step `builder`), then run; the answer is the build as recorded.
pub fn start(cp: &Cp, req: SnapshotBuildRequest) -> Result<SnapshotBuildStatus> {
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
        status: knit_api::state::BuildStatus::Running,
        step: "builder".to_string(),
        error: None,
        snapshot_id: None,
        started_ms: now_ms(),
        finished_ms: None,
    };
    cp.store.insert_snapshot_build(&build)?;
    // The build runs on this server; if this server goes, the leader
    // finds it owned by a server that is no longer alive and recovers it.
    cp.store.set_build_owner(&id, &cp.leadership.id)?;
    let task_cp = cp.clone();
    tokio::spawn(async move {
        let result = run(&task_cp, &id, &req).await;
        finish(&task_cp, &id, result).await;
    });
    status_of(cp, build)
}

/// Ends a build: success recorded, or the failure recorded after the
/// builder was cleaned up (so that a finished build leaves nothing behind).
pub(super) async fn finish(cp: &Cp, id: &str, result: Result<SnapshotRecord>) {
    let outcome = match result {
        Ok(snap) => {
            remark(cp, id, "done", &format!("snapshot {} ready", snap.id));
            cp.store
                .finish_snapshot_build(id, knit_api::state::BuildStatus::Succeeded, None)
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
                .add_event(EventType::Warning, "Snapshot", id, "BuildFailed", &msg);
            cp.store
                .finish_snapshot_build(id, knit_api::state::BuildStatus::Failed, Some(&msg))
        }
    };
    if let Err(e) = outcome {
        tracing::error!(build = id, error = %e, "cannot record the end of the build");
    }
}

/// `knit-agent <args>` in the builder: its answer; a failure as a provider
/// error naming the step.
async fn prepare<T: serde::de::DeserializeOwned>(
    cp: &ControlPlane,
    provider_id: &str,
    args: &[&str],
) -> Result<T> {
    let provider = cp.provider()?;
    agent::ask(provider.as_ref(), provider_id, args, PREPARE_TIMEOUT)
        .await?
        .map_err(|failure| {
            ServerError::from(crate::provider::ProviderError::failed(
                provider.name(),
                format!(
                    "in the builder, `knit-agent {}` failed: {}",
                    args.join(" "),
                    agent::describe(&failure)
                ),
            ))
        })
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

/// Why the pulls failed, from the kubelet's report: each failed image with
/// its registry's error.
pub fn pull_failures(report: &ImageReport) -> Vec<String> {
    report
        .images
        .iter()
        .filter_map(|i| i.error.as_ref().map(|e| format!("{}: {e}", i.image)))
        .collect()
}

/// Pulls `images` through CRI in the builder with a deadline (the agent
/// ends the pulls there, and the exec is bounded a little later should it
/// hang), noting progress every few seconds. A pull that fails or does not
/// finish fails the build with the registry's error and the fix.
async fn pull_images(
    cp: &ControlPlane,
    id: &str,
    provider_id: &str,
    images: &[String],
    limit: Duration,
) -> Result<ImageReport> {
    let secs = limit.as_secs().max(1);
    let secs_arg = secs.to_string();
    let images_arg = images.join(",");
    let provider = cp.provider()?;
    let started = Instant::now();
    let args = [
        "snapshot-prepare",
        "pull-images",
        "--timeout-seconds",
        &secs_arg,
        "--images",
        &images_arg,
    ];
    let pull = agent::ask::<ImagePull>(
        provider.as_ref(),
        provider_id,
        &args,
        limit + Duration::from_secs(30),
    );
    tokio::pin!(pull);
    let mut tick = tokio::time::interval(IMAGES_PROGRESS_EVERY);
    tick.tick().await;
    let outcome = loop {
        tokio::select! {
            r = &mut pull => break r,
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
    let why = match outcome {
        Err(e) if crate::provider::is_limit_error(&e) => {
            return Err(timed_out(last_pull_line(cp, provider_id).await))
        }
        Err(e) => return Err(e),
        Ok(Ok(ImagePull::Pulled { report })) => return Ok(report),
        Ok(Ok(ImagePull::TimedOut { last_log_line })) => return Err(timed_out(last_log_line)),
        Ok(Err(failure)) => format!("the pull failed: {}", agent::describe(&failure)),
        Ok(Ok(ImagePull::Failed {
            exit_code,
            report,
            last_log_line,
        })) => {
            let failures = report.as_ref().map(pull_failures).unwrap_or_default();
            if failures.is_empty() {
                format!("the pull exited {exit_code}: {last_log_line}")
            } else {
                format!(
                    "{} image(s) could not be pulled: {}",
                    failures.len(),
                    failures.join("; ")
                )
            }
        }
    };
    Err(ServerError::Conflict(format!(
        "images: {why}; {REGISTRY_FIX}"
    )))
}

/// The `clean` step's message: what the disk kept and what went.
fn clean_message(c: &BuilderCleaned, used: i64) -> String {
    let mut removed = c.removed.join(", ");
    if c.removed_count > c.removed.len() as u64 {
        removed.push_str(&format!(
            " and {} more",
            c.removed_count - c.removed.len() as u64
        ));
    }
    format!(
        "data disk scrubbed to the keep-list: kept {}; removed {} path(s){}; {} containerd object(s) deleted (tasks, containers, leases, active snapshots); containerd stopped; freed blocks {}; disk synced ({used} bytes used)",
        if c.kept.is_empty() {
            "nothing".to_string()
        } else {
            c.kept.join(", ")
        },
        c.removed_count,
        if removed.is_empty() {
            String::new()
        } else {
            format!(" ({removed})")
        },
        c.runtime_deleted,
        if c.trimmed {
            "discarded"
        } else {
            "not discarded (no discard on this disk)"
        },
    )
}

/// The taint every builder node registers with: no workload is meant to
/// run there (what runs is removed before the snapshot, but nothing should
/// be placed there to begin with). A scheduler keeps pods without the
/// toleration away; the drain at `detach` evicts any pod bound by hand.
pub const BUILDER_TAINT_KEY: &str = "knit.dev/snapshot-builder";

/// The builder pool: the source's configuration, one node, fresh disks,
/// and the builder taint (registered with the Node, so that it is there
/// before any pod could be placed).
pub fn builder_pool_of(source: &NodePool, name: &str) -> NodePool {
    let mut pool = source.clone();
    pool.metadata.name = name.to_string();
    pool.spec.replicas = 1;
    pool.spec.scaling = None;
    for d in &mut pool.spec.data_disks {
        d.snapshot_id = None;
        d.auto_format = true;
        d.size_gib = d.size_gib.max(40);
    }
    pool.spec.taints.retain(|t| t.key != BUILDER_TAINT_KEY);
    pool.spec.taints.push(knit_api::Taint {
        key: BUILDER_TAINT_KEY.to_string(),
        value: "true".to_string(),
        effect: "NoSchedule".to_string(),
    });
    pool
}

async fn run(cp: &Cp, id: &str, req: &SnapshotBuildRequest) -> Result<SnapshotRecord> {
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

    let pool = builder_pool_of(&source, &builder_pool);
    pool.validate()?;
    cp.store.insert_pool(&pool)?;
    cp.store.add_event(
        EventType::Normal,
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
    req: &SnapshotBuildRequest,
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
            if i.state == InstanceState::Failed {
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
            .filter(|n| n.phase_outcome == Some(knit_api::PhaseOutcome::Failed))
        {
            return Err(ServerError::Conflict(format!(
                "builder node {instance} failed in phase {}: {} {}",
                n.phase.map_or("", |p| p.as_str()),
                n.error_code.map_or("", |c| c.as_str()),
                n.error.clone().unwrap_or_default()
            )));
        }
        Ok(node.filter(|n| {
            if attached {
                n.status == knit_api::state::NodeStatus::Ready
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

    // Out of the cluster, instance kept and running. The node is drained
    // first (crate::drain: cordoned, its pods evicted), while its kubelet
    // still runs to confirm the pods are gone; then the kubelet stops so
    // that it cannot register the Node again; containerd stays for the
    // pulls.
    if attached {
        note(
            cp,
            id,
            "detach",
            format!("draining node {} (cordon, evict its pods)", node.name),
        )?;
        cp.drain_to_end(&instance, &node.name, builder_pool).await?;
    }
    note(
        cp,
        id,
        "detach",
        format!(
            "stopping the kubelet on {instance}, then removing node {} from the cluster",
            node.name
        ),
    )?;
    prepare::<KubeletStopped>(cp, &provider_id, &["snapshot-prepare", "stop-kubelet"]).await?;
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
            .set_instance_state(&instance, InstanceState::Detached, None)?;
    }
    cp.store.add_event(
        EventType::Normal,
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
    let provider = cp.provider()?;
    let no_cache = |why: String| {
        ServerError::Conflict(format!(
            "the builder has no package cache on the runtime disk (data disk #{disk_index}, is it mounted at {mount}?): {why}"
        ))
    };
    let manifest = agent::ask::<CacheManifestReport>(
        provider.as_ref(),
        &provider_id,
        &["cache-manifest", "--mount", &mount],
        PREPARE_TIMEOUT,
    )
    .await
    .map_err(|e| no_cache(e.to_string()))?
    .map_err(|failure| no_cache(agent::describe(&failure)))?;
    let cache = manifest.cache;
    let verified = agent::ask::<PackageVerified>(
        provider.as_ref(),
        &provider_id,
        &["snapshot-prepare", "verify-package", "--mount", &mount],
        PREPARE_TIMEOUT,
    )
    .await?
    .map_err(|failure| {
        ServerError::Conflict(format!(
            "the package cache in {cache} does not match its manifest: {}",
            agent::describe(&failure)
        ))
    })?;
    let kubernetes_version = verified.kubernetes_version;
    progress(
        cp,
        id,
        "package",
        format!(
            "Kubernetes {kubernetes_version} package cached in {cache}: {} files match their sha256",
            verified.files
        ),
    )
    .await?;

    // System and business images, through CRI on the instance's containerd.
    let system = prepare::<SystemImages>(cp, &provider_id, &["snapshot-prepare", "system-images"])
        .await?
        .images;
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
        let report = pull_images(cp, id, &provider_id, &all, limit).await?;
        for img in &report.images {
            let digest = img
                .repo_digests
                .first()
                .and_then(|d| d.rsplit_once('@'))
                .map(|(_, d)| d)
                .unwrap_or_default();
            images.push(format!("{}@{digest}", img.image));
        }
        progress(
            cp,
            id,
            "images",
            format!(
                "{} image(s) present ({} already there, {} pulled, {} bytes) in {:.1}s",
                images.len(),
                report.hit,
                report.miss,
                report.bytes_pulled,
                t.elapsed().as_secs_f64()
            ),
        )
        .await?;
    }
    // Only the image store and the package cache travel: the agent
    // removes everything else from the disk (its keep-list), containers
    // and credentials included.
    let cleaned = prepare::<BuilderCleaned>(
        cp,
        &provider_id,
        &["snapshot-prepare", "clean", "--mount", &mount],
    )
    .await?;
    let containerd_version = cleaned.containerd_version.clone();
    let used = i64::try_from(cleaned.used_bytes).unwrap_or(i64::MAX);
    progress(cp, id, "clean", clean_message(&cleaned, used)).await?;

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
        EventType::Normal,
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The builder pool carries the builder taint (once, even when the
    /// source already names it), and the node's configuration registers
    /// the Node with it, beside the source's own taints.
    #[test]
    fn the_builder_registers_tainted() {
        let source = NodePool::from_yaml(
            "apiVersion: knit.dev/v1alpha1\nkind: NodePool\nmetadata: {name: p}\nspec:\n  replicas: 5\n  taints: [{key: dedicated, value: web, effect: NoExecute}, {key: knit.dev/snapshot-builder, value: 'no', effect: NoSchedule}]\n  dataDisks: [{sizeGiB: 20, snapshotId: s-1}]\n",
        )
        .unwrap();
        let pool = builder_pool_of(&source, "p-snap-abc");
        pool.validate().unwrap();
        assert_eq!(pool.spec.replicas, 1);
        assert_eq!(pool.spec.data_disks[0].snapshot_id, None);
        let taints: Vec<String> = pool
            .spec
            .taints
            .iter()
            .map(|t| format!("{}={}:{}", t.key, t.value, t.effect))
            .collect();
        assert_eq!(
            taints,
            [
                "dedicated=web:NoExecute",
                "knit.dev/snapshot-builder=true:NoSchedule"
            ]
        );
        let instance = crate::store::InstanceRecord {
            name: "p-snap-abc-x1".into(),
            pool: "p-snap-abc".into(),
            provider_id: Some("i-1".into()),
            state: InstanceState::Running,
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
        assert_eq!(config.node.taints, pool.spec.taints);
    }
}
