//! What a rollout needs to survive a restart: each pool's generation and
//! the generation the reconciler last planned, the template hash every
//! instance was made from, the pool's revisions (for `rollout undo`) and
//! a rollout stopped by its progress deadline.

use super::{from_json, now_ms, to_json, word, Store};
use crate::error::Result;
use knit_api::state::InstanceState;
use knit_api::update::pool_template_hash;
use knit_api::{Cluster, NodePool, NodePoolSpec};
use knit_db::{params, Tx};
use std::collections::HashMap;

/// How many revisions of a pool are kept (as a Deployment's
/// `revisionHistoryLimit` of 10).
pub const REVISION_HISTORY_LIMIT: i64 = 10;

/// The schema step. Instances made before it have no hash: the step gives
/// each its pool's current one (computed in Rust, [`backfill`]), once, so
/// that upgrading knit never rolls a pool by itself. Every pool's current
/// spec is its revision 1.
pub const SCHEMA: &str = r#"
ALTER TABLE pools ADD COLUMN generation INTEGER NOT NULL DEFAULT 1;
ALTER TABLE pools ADD COLUMN observed_generation INTEGER NOT NULL DEFAULT 0;
ALTER TABLE instances ADD COLUMN template_hash TEXT;
CREATE TABLE pool_revisions (
    pool TEXT NOT NULL,
    revision INTEGER NOT NULL,
    generation INTEGER NOT NULL,
    template_hash TEXT NOT NULL,
    spec TEXT NOT NULL,
    created_ms INTEGER NOT NULL,
    PRIMARY KEY (pool, revision)
);
CREATE TABLE pool_rollouts (
    pool TEXT PRIMARY KEY,
    template_hash TEXT NOT NULL,
    reason TEXT NOT NULL,
    message TEXT NOT NULL,
    stopped_ms INTEGER NOT NULL
);
"#;

/// One revision of a pool: the spec a template hash was first made from.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolRevision {
    pub revision: i64,
    pub generation: i64,
    pub template_hash: String,
    pub spec: NodePoolSpec,
    pub created_ms: i64,
}

/// Why a pool's rollout stopped (its progress deadline), for the template
/// hash it was rolling to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RolloutStop {
    pub template_hash: String,
    pub reason: String,
    pub message: String,
    pub stopped_ms: i64,
}

/// The cluster's Kubernetes version, read in `tx`.
fn cluster_version(tx: &mut Tx<'_>) -> Result<String> {
    let doc: Option<String> = tx
        .query_opt("SELECT doc FROM cluster WHERE id = 1", &[])?
        .map(|r| r.get(0))
        .transpose()?;
    let cluster: Cluster = match doc {
        Some(d) => from_json(&d)?,
        None => Cluster::default(),
    };
    Ok(cluster.spec.kubernetes_version)
}

/// The hash new machines of the pool named `pool` are made with, read in
/// `tx`; `None` when there is no such pool.
pub(super) fn current_hash(tx: &mut Tx<'_>, pool: &str) -> Result<Option<String>> {
    let doc: Option<String> = tx
        .query_opt("SELECT doc FROM pools WHERE name = ?1", params![pool])?
        .map(|r| r.get(0))
        .transpose()?;
    let Some(doc) = doc else {
        return Ok(None);
    };
    let pool: NodePool = from_json(&doc)?;
    let version = cluster_version(tx)?;
    Ok(Some(pool_template_hash(&pool.spec, &version)))
}

/// Records `spec` as the pool's newest revision when its hash is not the
/// newest's already: a hash seen before moves to the top (as a Deployment
/// reuses an old ReplicaSet), and only the newest
/// [`REVISION_HISTORY_LIMIT`] are kept.
pub(super) fn record_revision(
    tx: &mut Tx<'_>,
    pool: &str,
    generation: i64,
    spec: &NodePoolSpec,
    now: i64,
) -> Result<()> {
    let version = cluster_version(tx)?;
    let hash = pool_template_hash(spec, &version);
    let newest = tx.query_opt(
        "SELECT revision, template_hash FROM pool_revisions WHERE pool = ?1 ORDER BY revision DESC LIMIT 1",
        params![pool],
    )?;
    let next = match newest {
        Some(r) if r.get::<String>(1)? == hash => return Ok(()),
        Some(r) => r.get::<i64>(0)? + 1,
        None => 1,
    };
    let doc = to_json(spec)?;
    tx.execute(
        "DELETE FROM pool_revisions WHERE pool = ?1 AND template_hash = ?2",
        params![pool, &hash],
    )?;
    tx.execute(
        "INSERT INTO pool_revisions (pool, revision, generation, template_hash, spec, created_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        params![pool, next, generation, &hash, &doc, now],
    )?;
    tx.execute(
        "DELETE FROM pool_revisions WHERE pool = ?1 AND revision <= ?2",
        params![pool, next - REVISION_HISTORY_LIMIT],
    )?;
    Ok(())
}

/// Instances of one state in a pool: how many, and how many of them were
/// made from another template than the pool's current one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TemplateCount {
    pub instances: i64,
    pub out_of_date: i64,
}

/// The schema step's Rust half: every instance without a hash gets its
/// pool's current one, and every pool its first revision.
pub(super) fn backfill(tx: &mut Tx<'_>) -> Result<()> {
    let pools = tx.query("SELECT name, doc, generation FROM pools", &[])?;
    let now = now_ms();
    for row in pools {
        let name: String = row.get(0)?;
        let pool: NodePool = from_json(&row.get::<String>(1)?)?;
        let generation: i64 = row.get(2)?;
        let version = cluster_version(tx)?;
        let hash = pool_template_hash(&pool.spec, &version);
        tx.execute(
            "UPDATE instances SET template_hash = ?2 WHERE pool = ?1 AND template_hash IS NULL",
            params![&name, &hash],
        )?;
        record_revision(tx, &name, generation, &pool.spec, now)?;
    }
    Ok(())
}

impl Store {
    /// A pool's instances by state, each state's count with how many of
    /// them were made from another template than `current` (added ones
    /// and ones without a hash are never out of date), counted in SQL: the
    /// reconciler asks this every pass, and at a thousand instances reading
    /// and decoding every row for two numbers was most of its allocations.
    pub fn instance_template_counts(
        &self,
        pool: &str,
        current: &str,
    ) -> Result<Vec<(InstanceState, TemplateCount)>> {
        self.read(|tx| {
            tx.query(
                "SELECT state, CAST(COUNT(*) AS BIGINT),
                        CAST(COALESCE(SUM(CASE WHEN added = 0 AND template_hash IS NOT NULL AND template_hash <> ?2 THEN 1 ELSE 0 END), 0) AS BIGINT)
                 FROM instances WHERE pool = ?1 GROUP BY state",
                params![pool, current],
            )?
            .iter()
            .map(|r| {
                Ok((
                    word(r, 0)?,
                    TemplateCount {
                        instances: r.get(1)?,
                        out_of_date: r.get(2)?,
                    },
                ))
            })
            .collect()
        })
    }

    /// Each instance's template hash (`None`: added by attach, or made
    /// by no pool's template), by instance name; one pool's or all.
    pub fn instance_hashes(&self, pool: Option<&str>) -> Result<HashMap<String, Option<String>>> {
        self.read(|tx| {
            tx.query(
                "SELECT name, template_hash FROM instances WHERE (CAST(?1 AS TEXT) IS NULL OR pool = ?1)",
                params![pool],
            )?
            .iter()
            .map(|r| Ok((r.get(0)?, r.get(1)?)))
            .collect()
        })
    }

    /// Records that `instance` now runs the template `hash` (updated in
    /// place, on the same machine); `false` when it records another than
    /// `from` (a rollout since changed it) or is gone.
    pub fn set_instance_hash(&self, instance: &str, from: &str, hash: &str) -> Result<bool> {
        self.write(|tx| {
            let n = tx.execute(
                "UPDATE instances SET template_hash = ?3 WHERE name = ?1 AND template_hash = ?2",
                params![instance, from, hash],
            )?;
            Ok(n > 0)
        })
    }

    /// Says the reconciler planned the pool at `generation`.
    pub fn set_observed_generation(&self, pool: &str, generation: i64) -> Result<()> {
        self.write(|tx| {
            tx.execute(
                "UPDATE pools SET observed_generation = ?2 WHERE name = ?1 AND observed_generation <> ?2",
                params![pool, generation],
            )?;
            Ok(())
        })
    }

    /// The pool's kept revisions, oldest first.
    pub fn pool_revisions(&self, pool: &str) -> Result<Vec<PoolRevision>> {
        let rows = self.read(|tx| {
            tx.query(
                "SELECT revision, generation, template_hash, spec, created_ms FROM pool_revisions WHERE pool = ?1 ORDER BY revision",
                params![pool],
            )?
            .iter()
            .map(|r| {
                Ok((
                    r.get::<i64>(0)?,
                    r.get::<i64>(1)?,
                    r.get::<String>(2)?,
                    r.get::<String>(3)?,
                    r.get::<i64>(4)?,
                ))
            })
            .collect::<Result<Vec<_>>>()
        })?;
        rows.into_iter()
            .map(|(revision, generation, template_hash, spec, created_ms)| {
                Ok(PoolRevision {
                    revision,
                    generation,
                    template_hash,
                    spec: from_json(&spec)?,
                    created_ms,
                })
            })
            .collect()
    }

    /// The pool's stopped rollout, if one is.
    pub fn rollout_stop(&self, pool: &str) -> Result<Option<RolloutStop>> {
        self.read(|tx| {
            tx.query_opt(
                "SELECT template_hash, reason, message, stopped_ms FROM pool_rollouts WHERE pool = ?1",
                params![pool],
            )?
            .map(|r| {
                Ok(RolloutStop {
                    template_hash: r.get(0)?,
                    reason: r.get(1)?,
                    message: r.get(2)?,
                    stopped_ms: r.get(3)?,
                })
            })
            .transpose()
        })
    }

    /// Stops the pool's rollout to `stop.template_hash`; `false` when it
    /// was stopped already (for that hash).
    pub fn stop_rollout(&self, pool: &str, stop: &RolloutStop) -> Result<bool> {
        self.write(|tx| {
            let same = tx
                .query_opt(
                    "SELECT 1 FROM pool_rollouts WHERE pool = ?1 AND template_hash = ?2",
                    params![pool, &stop.template_hash],
                )?
                .is_some();
            if same {
                return Ok(false);
            }
            tx.execute("DELETE FROM pool_rollouts WHERE pool = ?1", params![pool])?;
            tx.execute(
                "INSERT INTO pool_rollouts (pool, template_hash, reason, message, stopped_ms) VALUES (?1, ?2, ?3, ?4, ?5)",
                params![pool, &stop.template_hash, &stop.reason, &stop.message, stop.stopped_ms],
            )?;
            Ok(true)
        })
    }

    /// Lets a stopped rollout go on (`rollout resume`, a new template).
    pub fn clear_rollout_stop(&self, pool: &str) -> Result<bool> {
        let removed = self.write(|tx| {
            Ok(tx.execute("DELETE FROM pool_rollouts WHERE pool = ?1", params![pool])?)
        })?;
        Ok(removed > 0)
    }
}

#[cfg(test)]
mod tests {
    use knit_api::state::InstanceState;
    use knit_api::{NodePool, NodePoolSpec};

    #[test]
    fn generations_count_spec_changes_and_revisions_keep_ten_templates() {
        crate::store::testing::each_store(|store| {
            let mut pool = NodePool::new("p", NodePoolSpec::default());
            store.insert_pool(&pool).unwrap();
            let record = store.pool("p").unwrap().unwrap();
            assert_eq!((record.generation, record.observed_generation), (1, 0));
            assert_eq!(store.pool_revisions("p").unwrap().len(), 1);
            // The same document again: no new generation.
            store.update_pool(&pool).unwrap();
            assert_eq!(store.pool("p").unwrap().unwrap().generation, 1);
            // A scale is a spec change, not a new template.
            pool.spec.replicas = 4;
            store.update_pool(&pool).unwrap();
            assert_eq!(store.pool("p").unwrap().unwrap().generation, 2);
            assert_eq!(store.pool_revisions("p").unwrap().len(), 1);
            for i in 0..12 {
                pool.spec.instance_types = vec![format!("t{i}")];
                store.update_pool(&pool).unwrap();
            }
            let revisions = store.pool_revisions("p").unwrap();
            assert_eq!(revisions.len(), 10);
            assert_eq!(revisions[9].revision, 13);
            assert_eq!(revisions[9].generation, 14);
            assert_eq!(revisions[9].spec.instance_types, vec!["t11".to_string()]);
            // Back to a kept template: its revision moves to the top.
            pool.spec.instance_types = vec!["t5".into()];
            store.update_pool(&pool).unwrap();
            let revisions = store.pool_revisions("p").unwrap();
            assert_eq!(revisions.len(), 9, "t5's old row moved, t2 was dropped");
            assert_eq!(revisions.last().unwrap().revision, 14);
            store.set_observed_generation("p", 15).unwrap();
            assert_eq!(store.pool("p").unwrap().unwrap().observed_generation, 15);
        });
    }

    #[test]
    fn new_instances_carry_the_hash_and_a_stop_is_kept_once() {
        crate::store::testing::each_store(|store| {
            let pool = NodePool::new("p", NodePoolSpec::default());
            store.insert_pool(&pool).unwrap();
            store
                .add_create_intents("p", &[("p-a".into(), "t".into())])
                .unwrap();
            let want = knit_api::update::pool_template_hash(
                &pool.spec,
                &knit_api::Cluster::default().spec.kubernetes_version,
            );
            assert_eq!(
                store.instance_hashes(Some("p")).unwrap()["p-a"],
                Some(want.clone())
            );
            let stop = super::RolloutStop {
                template_hash: want,
                reason: "ProgressDeadlineExceeded".into(),
                message: "m".into(),
                stopped_ms: 1,
            };
            assert!(store.stop_rollout("p", &stop).unwrap());
            assert!(!store.stop_rollout("p", &stop).unwrap());
            assert_eq!(store.rollout_stop("p").unwrap(), Some(stop));
            assert!(store.clear_rollout_stop("p").unwrap());
            assert_eq!(store.rollout_stop("p").unwrap(), None);
        });
    }

    #[test]
    fn template_counts_count_by_state_and_never_an_added_instance_as_old() {
        crate::store::testing::each_store(|store| {
            crate::store::testing::pool_with_instances(store, "p", &["p-a", "p-b", "p-c"]);
            crate::store::testing::pool_with_instances(store, "q", &["q-a"]);
            let current = store.instance_hashes(Some("p")).unwrap()["p-a"]
                .clone()
                .unwrap();
            // p-b from an older template, p-c from it and then added back
            // by attach (never rolled), q-a older but in another pool.
            store
                .db()
                .write(|tx| {
                    tx.execute(
                        "UPDATE instances SET template_hash = 'old' WHERE name IN ('p-b', 'p-c', 'q-a')",
                        &[],
                    )?;
                    tx.execute("UPDATE instances SET added = 1 WHERE name = 'p-c'", &[])
                })
                .unwrap();
            let counts = store.instance_template_counts("p", &current).unwrap();
            assert_eq!(
                counts,
                vec![(
                    InstanceState::Pending,
                    super::TemplateCount {
                        instances: 3,
                        out_of_date: 1
                    }
                )]
            );
            assert!(store
                .instance_template_counts("none", &current)
                .unwrap()
                .is_empty());
        });
    }
}
