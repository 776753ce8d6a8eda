//! What a build leaves behind, removed: its builder instance released (or
//! kept stopped), its builder pool deleted, a snapshot no record names
//! deleted. Retried; what cannot be removed is reported as leaked.

use super::{remark, Cp};
use crate::control::ControlPlane;
use crate::error::{Result, ServerError};
use crate::store::SnapshotBuildRecord;
use knit_api::state::{EventType, InstanceState};
use std::time::Duration;

/// Provider calls of a clean-up are retried this many times.
const CLEANUP_ATTEMPTS: u32 = 5;

/// The `cleanup` message that ends a complete clean-up; a failed build
/// without it is cleaned up again at the next start.
pub(super) const CLEANUP_DONE: &str = "clean-up complete";

/// What happens to a builder that left its pool (Detached): released, or
/// with `keepBuilder` stopped and kept. A builder still in its pool goes
/// with the pool. Returns what was done.
pub(super) async fn release_builder(cp: &Cp, b: &SnapshotBuildRecord) -> Result<String> {
    let Some(instance) = &b.builder_instance else {
        return Ok("no builder instance yet".to_string());
    };
    let Some(rec) = cp.store.instance(instance)? else {
        return Ok(format!("builder instance {instance} already gone"));
    };
    if rec.state != InstanceState::Detached {
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
        EventType::Normal,
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
pub(super) async fn clean_up(cp: &Cp, b: &SnapshotBuildRecord) {
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
        .add_event(EventType::Warning, "Snapshot", &b.id, "CleanupFailed", &msg);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::SnapshotRecord;
    use knit_api::state::BuildStatus;
    use std::sync::Arc;

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
            Arc::new(crate::cluster::seam::NoCluster),
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
            status: BuildStatus::Failed,
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
}
