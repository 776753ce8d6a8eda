//! When a server takes the lead (at start, alone): builds whose server
//! ended are failed (or, when their snapshot was recorded, completed), and
//! their builders cleaned up.

use super::build::finish;
use super::cleanup::{clean_up, release_builder, CLEANUP_DONE};
use super::{progress, remark, Cp};
use crate::error::{Result, ServerError};
use crate::store::{SnapshotBuildRecord, SnapshotRecord};
use knit_api::state::{BuildStatus, EventType};

/// At server start: every build still recorded as running was cut off by
/// the server's end. One whose snapshot was recorded only lacked the
/// release: it is released and the build succeeds. Any other is marked
/// failed at its step now, and its builder cleaned up in the background
/// (instance released unless `keepBuilder`, then stopped; builder pool
/// removed; a provider snapshot not yet recorded deleted).
pub fn recover(cp: &Cp) -> Result<()> {
    // A running build is interrupted when the server running it is gone:
    // not this server and not one that heartbeats (with several servers,
    // the leader runs this when it takes the lead).
    let live = cp.live_servers()?;
    let mut interrupted: Vec<SnapshotBuildRecord> = Vec::new();
    for b in cp.store.snapshot_builds()? {
        if b.status != BuildStatus::Running {
            continue;
        }
        let owner = cp.store.build_owner(&b.id)?;
        let owner_alive = owner.is_some_and(|o| live.contains(&o));
        if !owner_alive {
            interrupted.push(b);
        }
    }
    // Failed builds whose clean-up did not end (the server died during it,
    // or a provider call kept failing): once more, unless their server is
    // alive and still at it.
    let mut unclean = Vec::new();
    for b in cp.store.snapshot_builds()? {
        let owner_alive = cp
            .store
            .build_owner(&b.id)?
            .is_some_and(|o| live.contains(&o));
        if b.status == BuildStatus::Failed
            && !owner_alive
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
    // This server takes them over: a later pass sees their owner alive.
    for b in interrupted.iter().chain(&unclean) {
        cp.store.set_build_owner(&b.id, &cp.leadership.id)?;
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
            .finish_snapshot_build(&b.id, BuildStatus::Failed, Some(&msg))?;
        cp.store.add_event(
            EventType::Warning,
            "Snapshot",
            &b.id,
            "BuildInterrupted",
            &msg,
        )?;
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
