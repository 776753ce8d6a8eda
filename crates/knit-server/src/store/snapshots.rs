//! Snapshots, and snapshot builds with their progress steps.

use super::{from_json, now_ms, to_json, word, Store};
use crate::error::Result;
use knit_api::state::BuildStatus;
use knit_db::{params, Row};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotRecord {
    pub id: String,
    pub pool: String,
    pub kubernetes_version: String,
    pub containerd_version: String,
    pub images: Vec<String>,
    pub size_bytes: i64,
    pub created_ms: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotBuildRecord {
    pub id: String,
    /// The snapshot's name at the provider.
    pub name: String,
    /// The source pool.
    pub pool: String,
    pub builder_pool: String,
    pub builder_instance: Option<String>,
    /// The business images asked for (besides the system images).
    pub images: Vec<String>,
    pub keep_builder: bool,
    pub status: BuildStatus,
    /// The step of the latest progress message: where the build is, or
    /// where it stopped.
    pub step: String,
    pub error: Option<String>,
    /// The provider's snapshot, recorded as soon as it exists (before the
    /// snapshot's own record), so that an interrupted build can remove it.
    pub snapshot_id: Option<String>,
    pub started_ms: i64,
    pub finished_ms: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BuildStep {
    pub at_ms: i64,
    pub step: String,
    pub message: String,
}

const BUILD_COLUMNS: &str = "id, name, pool, builder_pool, builder_instance, images, keep_builder, status, step, error, snapshot_id, started_ms, finished_ms";

fn build_row(r: &Row) -> Result<SnapshotBuildRecord> {
    Ok(SnapshotBuildRecord {
        id: r.get(0)?,
        name: r.get(1)?,
        pool: r.get(2)?,
        builder_pool: r.get(3)?,
        builder_instance: r.get(4)?,
        images: from_json(&r.get::<String>(5)?)?,
        keep_builder: r.get(6)?,
        status: word(r, 7)?,
        step: r.get(8)?,
        error: r.get(9)?,
        snapshot_id: r.get(10)?,
        started_ms: r.get(11)?,
        finished_ms: r.get(12)?,
    })
}

impl Store {
    pub fn add_snapshot(&self, s: &SnapshotRecord) -> Result<()> {
        let images = to_json(&s.images)?;
        self.write(|tx| {
            tx.execute(
                "INSERT INTO snapshots (id, pool, kubernetes_version, containerd_version, images, size_bytes, created_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                params![&s.id, &s.pool, &s.kubernetes_version, &s.containerd_version, &images, s.size_bytes, s.created_ms],
            )?;
            Ok(())
        })
    }

    /// Whether a record was removed.
    pub fn delete_snapshot(&self, id: &str) -> Result<bool> {
        let removed =
            self.write(|tx| Ok(tx.execute("DELETE FROM snapshots WHERE id = ?1", params![id])?))?;
        Ok(removed > 0)
    }

    pub fn snapshots(&self) -> Result<Vec<SnapshotRecord>> {
        let mut rows = self.read(|tx| {
            tx.query(
                "SELECT id, pool, kubernetes_version, containerd_version, images, size_bytes, created_ms FROM snapshots ORDER BY created_ms",
                &[],
            )?
            .iter()
            .map(|r| {
                Ok(SnapshotRecord {
                    id: r.get(0)?,
                    pool: r.get(1)?,
                    kubernetes_version: r.get(2)?,
                    containerd_version: r.get(3)?,
                    images: from_json(&r.get::<String>(4)?)?,
                    size_bytes: r.get(5)?,
                    created_ms: r.get(6)?,
                })
            })
            .collect::<Result<Vec<_>>>()
        })?;
        // Ties in the same order on both backends.
        rows.sort_by(|a, b| (a.created_ms, &a.id).cmp(&(b.created_ms, &b.id)));
        Ok(rows)
    }

    pub fn insert_snapshot_build(&self, b: &SnapshotBuildRecord) -> Result<()> {
        let sql = format!(
            "INSERT INTO snapshot_builds ({BUILD_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)"
        );
        let images = to_json(&b.images)?;
        self.write(|tx| {
            tx.execute(
                &sql,
                params![
                    &b.id,
                    &b.name,
                    &b.pool,
                    &b.builder_pool,
                    &b.builder_instance,
                    &images,
                    b.keep_builder,
                    b.status.as_str(),
                    &b.step,
                    &b.error,
                    &b.snapshot_id,
                    b.started_ms,
                    b.finished_ms
                ],
            )?;
            Ok(())
        })
    }

    /// Appends a progress message; with `current` the build's step becomes
    /// `step` (final and clean-up messages leave it where the build was).
    pub fn add_snapshot_build_step(
        &self,
        id: &str,
        step: &str,
        message: &str,
        current: bool,
    ) -> Result<()> {
        let now = now_ms();
        self.write(|tx| {
            tx.execute(
                "INSERT INTO snapshot_build_steps (build, at_ms, step, message) VALUES (?1, ?2, ?3, ?4)",
                params![id, now, step, message],
            )?;
            if current {
                tx.execute(
                    "UPDATE snapshot_builds SET step = ?2 WHERE id = ?1",
                    params![id, step],
                )?;
            }
            Ok(())
        })
    }

    pub fn set_snapshot_build_instance(&self, id: &str, instance: &str) -> Result<()> {
        self.write(|tx| {
            tx.execute(
                "UPDATE snapshot_builds SET builder_instance = ?2 WHERE id = ?1",
                params![id, instance],
            )?;
            Ok(())
        })
    }

    pub fn set_snapshot_build_snapshot(&self, id: &str, snapshot_id: &str) -> Result<()> {
        self.write(|tx| {
            tx.execute(
                "UPDATE snapshot_builds SET snapshot_id = ?2 WHERE id = ?1",
                params![id, snapshot_id],
            )?;
            Ok(())
        })
    }

    /// Ends a running build with `status`; false if it had already ended.
    pub fn finish_snapshot_build(
        &self,
        id: &str,
        status: BuildStatus,
        error: Option<&str>,
    ) -> Result<bool> {
        let now = now_ms();
        let changed = self.write(|tx| {
            Ok(tx.execute(
                "UPDATE snapshot_builds SET status = ?2, error = ?3, finished_ms = ?4 WHERE id = ?1 AND status = ?5",
                params![
                    id,
                    status.as_str(),
                    error,
                    now,
                    BuildStatus::Running.as_str()
                ],
            )?)
        })?;
        Ok(changed > 0)
    }

    pub fn snapshot_build(&self, id: &str) -> Result<Option<SnapshotBuildRecord>> {
        let sql = format!("SELECT {BUILD_COLUMNS} FROM snapshot_builds WHERE id = ?1");
        self.read(|tx| {
            tx.query_opt(&sql, params![id])?
                .as_ref()
                .map(build_row)
                .transpose()
        })
    }

    /// Every build, oldest first.
    pub fn snapshot_builds(&self) -> Result<Vec<SnapshotBuildRecord>> {
        let sql = format!("SELECT {BUILD_COLUMNS} FROM snapshot_builds ORDER BY started_ms");
        let mut rows = self.read(|tx| {
            tx.query(&sql, &[])?
                .iter()
                .map(build_row)
                .collect::<Result<Vec<_>>>()
        })?;
        // Ids in byte order on both backends.
        rows.sort_by(|a, b| (a.started_ms, &a.id).cmp(&(b.started_ms, &b.id)));
        Ok(rows)
    }

    pub fn snapshot_build_steps(&self, id: &str) -> Result<Vec<BuildStep>> {
        self.read(|tx| {
            tx.query(
                "SELECT at_ms, step, message FROM snapshot_build_steps WHERE build = ?1 ORDER BY id",
                params![id],
            )?
            .iter()
            .map(|r| {
                Ok(BuildStep {
                    at_ms: r.get(0)?,
                    step: r.get(1)?,
                    message: r.get(2)?,
                })
            })
            .collect()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_builds_keep_their_steps_across_reopen() {
        crate::store::testing::on_both_backends(|backend| {
            let store = backend.open();
            let b = SnapshotBuildRecord {
                id: "build-1".into(),
                name: "n".into(),
                pool: "p".into(),
                builder_pool: "p-snap-1".into(),
                builder_instance: None,
                images: vec!["docker.io/a:1".into()],
                keep_builder: true,
                status: BuildStatus::Running,
                step: "builder".into(),
                error: None,
                snapshot_id: None,
                started_ms: 1,
                finished_ms: None,
            };
            store.insert_snapshot_build(&b).unwrap();
            store
                .add_snapshot_build_step("build-1", "ready", "node Ready", true)
                .unwrap();
            store
                .set_snapshot_build_instance("build-1", "p-snap-1-x")
                .unwrap();
            store.set_snapshot_build_snapshot("build-1", "s-1").unwrap();
            drop(store);
            let store = backend.open();
            let got = store.snapshot_build("build-1").unwrap().unwrap();
            assert_eq!(got.step, "ready");
            assert_eq!(got.builder_instance.as_deref(), Some("p-snap-1-x"));
            assert_eq!(got.snapshot_id.as_deref(), Some("s-1"));
            assert_eq!(got.images, b.images);
            assert!(got.keep_builder);
            assert!(store
                .finish_snapshot_build("build-1", BuildStatus::Failed, Some("x"))
                .unwrap());
            // Ended once: a second end changes nothing.
            assert!(!store
                .finish_snapshot_build("build-1", BuildStatus::Succeeded, None)
                .unwrap());
            store
                .add_snapshot_build_step("build-1", "failed", "x", false)
                .unwrap();
            let all = store.snapshot_builds().unwrap();
            assert_eq!(all.len(), 1);
            assert_eq!(all[0].status, BuildStatus::Failed);
            assert_eq!(all[0].step, "ready");
            assert!(all[0].finished_ms.is_some());
            let steps = store.snapshot_build_steps("build-1").unwrap();
            let names: Vec<&str> = steps.iter().map(|s| s.step.as_str()).collect();
            assert_eq!(names, vec!["ready", "failed"]);
        });
    }
}
