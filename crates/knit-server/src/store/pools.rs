//! The cluster document and the node pools (one JSON document each), and
//! a pool's counts of instances and nodes.

use super::{from_json, now_ms, to_json, word, Store};
use crate::error::{Result, ServerError};
use knit_api::state::InstanceState;
use knit_api::{Cluster, NodePool};
use knit_db::{params, Row};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolRecord {
    pub pool: NodePool,
    pub deleting: bool,
    pub created_ms: i64,
    pub updated_ms: i64,
    /// Raised by every change of the spec (not of its status).
    #[serde(default)]
    pub generation: i64,
    /// The generation the reconciler last planned.
    #[serde(default)]
    pub observed_generation: i64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolCounts {
    pub instances: std::collections::BTreeMap<InstanceState, i64>,
    pub initialized: i64,
    pub ready: i64,
    /// Nodes whose drain has not ended.
    pub draining: i64,
}

fn pool_row(r: &Row) -> Result<PoolRecord> {
    Ok(PoolRecord {
        pool: from_json(&r.get::<String>(0)?)?,
        deleting: r.get(1)?,
        created_ms: r.get(2)?,
        updated_ms: r.get(3)?,
        generation: r.get(4)?,
        observed_generation: r.get(5)?,
    })
}

const POOL_COLUMNS: &str = "doc, deleting, created_ms, updated_ms, generation, observed_generation";

impl Store {
    pub fn cluster(&self) -> Result<Option<Cluster>> {
        let doc: Option<String> = self.read(|tx| {
            Ok(tx
                .query_opt("SELECT doc FROM cluster WHERE id = 1", &[])?
                .map(|r| r.get(0))
                .transpose()?)
        })?;
        doc.map(|d| from_json(&d)).transpose()
    }

    pub fn put_cluster(&self, cluster: &Cluster) -> Result<()> {
        let doc = to_json(cluster)?;
        self.write(|tx| {
            tx.execute(
                "INSERT INTO cluster (id, doc) VALUES (1, ?1) ON CONFLICT (id) DO UPDATE SET doc = excluded.doc",
                params![&doc],
            )?;
            Ok(())
        })
    }

    pub fn insert_pool(&self, pool: &NodePool) -> Result<()> {
        let now = now_ms();
        let doc = to_json(pool)?;
        let changed = self.write(|tx| {
            let changed = tx.execute(
                "INSERT INTO pools (name, doc, created_ms, updated_ms) VALUES (?1, ?2, ?3, ?3) ON CONFLICT (name) DO NOTHING",
                params![&pool.metadata.name, &doc, now],
            )?;
            if changed > 0 {
                // A pool made again under an old name starts afresh.
                tx.execute(
                    "DELETE FROM pool_revisions WHERE pool = ?1",
                    params![&pool.metadata.name],
                )?;
                tx.execute(
                    "DELETE FROM pool_rollouts WHERE pool = ?1",
                    params![&pool.metadata.name],
                )?;
                super::rollouts::record_revision(tx, &pool.metadata.name, 1, &pool.spec, now)?;
            }
            Ok(changed)
        })?;
        if changed == 0 {
            return Err(ServerError::AlreadyExists {
                kind: "pool",
                name: pool.metadata.name.clone(),
            });
        }
        Ok(())
    }

    /// Replaces a pool's document. A changed spec raises its generation,
    /// and a new template (hash) becomes its newest revision, in the same
    /// transaction.
    pub fn update_pool(&self, pool: &NodePool) -> Result<()> {
        let now = now_ms();
        let doc = to_json(pool)?;
        let name = &pool.metadata.name;
        let changed = self.write(|tx| {
            let old = tx.query_opt(
                "SELECT doc, generation FROM pools WHERE name = ?1 AND deleting = 0",
                params![name],
            )?;
            let Some(old) = old else {
                return Ok(0);
            };
            let before: NodePool = from_json(&old.get::<String>(0)?)?;
            let mut generation: i64 = old.get(1)?;
            if before.spec != pool.spec {
                generation += 1;
            }
            let changed = tx.execute(
                "UPDATE pools SET doc = ?2, updated_ms = ?3, generation = ?4 WHERE name = ?1 AND deleting = 0",
                params![name, &doc, now, generation],
            )?;
            super::rollouts::record_revision(tx, name, generation, &pool.spec, now)?;
            Ok(changed)
        })?;
        if changed == 0 {
            return Err(ServerError::NotFound {
                kind: "pool",
                name: pool.metadata.name.clone(),
            });
        }
        Ok(())
    }

    /// A pool that exists and is not being deleted: what changes to a pool
    /// (scale, attach) require. NotFound or Conflict otherwise.
    pub fn live_pool(&self, name: &str) -> Result<PoolRecord> {
        let record = self.pool(name)?.ok_or_else(|| ServerError::NotFound {
            kind: "pool",
            name: name.to_string(),
        })?;
        if record.deleting {
            return Err(ServerError::Conflict(format!(
                "pool {name:?} is being deleted"
            )));
        }
        Ok(record)
    }

    pub fn pool(&self, name: &str) -> Result<Option<PoolRecord>> {
        self.read(|tx| {
            tx.query_opt(
                &format!("SELECT {POOL_COLUMNS} FROM pools WHERE name = ?1"),
                params![name],
            )?
            .as_ref()
            .map(pool_row)
            .transpose()
        })
    }

    pub fn pools(&self) -> Result<Vec<PoolRecord>> {
        let rows =
            self.read(|tx| Ok(tx.query(&format!("SELECT {POOL_COLUMNS}, name FROM pools"), &[])?))?;
        let mut named = rows
            .iter()
            .map(|r| Ok((r.get::<String>(6)?, pool_row(r)?)))
            .collect::<Result<Vec<_>>>()?;
        // By name in byte order on both backends (PostgreSQL's collation
        // may order text differently from SQLite's).
        named.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(named.into_iter().map(|(_, p)| p).collect())
    }

    /// Sets `spec.kubernetesVersion` to `version` on every pool stored
    /// without one, in one transaction (a pool that has one keeps it);
    /// the names of the pools filled. Run once after knit is upgraded, so
    /// that raising the cluster's version later changes no pool by itself.
    pub fn fill_pool_kubernetes_versions(&self, version: &str) -> Result<Vec<String>> {
        self.write(|tx| {
            let rows = tx.query("SELECT name, doc FROM pools", &[])?;
            let mut filled = Vec::new();
            for r in &rows {
                let name: String = r.get(0)?;
                let mut pool: NodePool = from_json(&r.get::<String>(1)?)?;
                if pool.spec.kubernetes_version.is_some() {
                    continue;
                }
                pool.spec.kubernetes_version = Some(version.to_string());
                tx.execute(
                    "UPDATE pools SET doc = ?2 WHERE name = ?1",
                    params![&name, &to_json(&pool)?],
                )?;
                filled.push(name);
            }
            Ok(filled)
        })
    }

    /// Marks a pool for deletion: the reconciler scales it to zero and then
    /// removes the row.
    pub fn mark_pool_deleting(&self, name: &str) -> Result<()> {
        let now = now_ms();
        let changed = self.write(|tx| {
            Ok(tx.execute(
                "UPDATE pools SET deleting = 1, updated_ms = ?2 WHERE name = ?1",
                params![name, now],
            )?)
        })?;
        if changed == 0 {
            return Err(ServerError::NotFound {
                kind: "pool",
                name: name.to_string(),
            });
        }
        Ok(())
    }

    pub fn remove_pool(&self, name: &str) -> Result<()> {
        self.write(|tx| {
            tx.execute("DELETE FROM pools WHERE name = ?1", params![name])?;
            tx.execute("DELETE FROM pool_revisions WHERE pool = ?1", params![name])?;
            tx.execute("DELETE FROM pool_rollouts WHERE pool = ?1", params![name])?;
            Ok(())
        })
    }

    /// A pool's instances by state and its nodes' progress, counted in SQL.
    pub fn pool_counts(&self, pool: &str) -> Result<PoolCounts> {
        self.read(|tx| {
            let instances = tx
                .query(
                    "SELECT state, COUNT(*) FROM instances WHERE pool = ?1 GROUP BY state",
                    params![pool],
                )?
                .iter()
                .map(|r| Ok((word(r, 0)?, r.get::<i64>(1)?)))
                .collect::<Result<_>>()?;
            let row = tx.query_one(
                "SELECT CAST(COALESCE(SUM(CASE WHEN phase = 'hardening' AND phase_outcome IN ('done', 'skipped') THEN 1 ELSE 0 END), 0) AS BIGINT),
                        CAST(COALESCE(SUM(CASE WHEN status = 'Ready' THEN 1 ELSE 0 END), 0) AS BIGINT)
                 FROM nodes WHERE pool = ?1",
                params![pool],
            )?;
            let draining = tx.query_one(
                "SELECT CAST(COUNT(*) AS BIGINT) FROM drains WHERE pool = ?1 AND state <> ?2",
                params![pool, knit_api::state::DrainState::Drained.as_str()],
            )?;
            Ok(PoolCounts {
                instances,
                initialized: row.get(0)?,
                ready: row.get(1)?,
                draining: draining.get(0)?,
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use knit_api::NodePoolSpec;

    #[test]
    fn duplicate_pool_is_refused() {
        crate::store::testing::each_store(|store| {
            let pool = NodePool::new("a", NodePoolSpec::default());
            store.insert_pool(&pool).unwrap();
            assert_eq!(
                store.insert_pool(&pool).unwrap_err().code(),
                "AlreadyExists"
            );
        });
    }

    #[test]
    fn pools_without_a_kubernetes_version_are_filled_once() {
        crate::store::testing::each_store(|store| {
            store
                .insert_pool(&NodePool::new("old", NodePoolSpec::default()))
                .unwrap();
            let own = NodePoolSpec {
                kubernetes_version: Some("1.30.1".into()),
                ..NodePoolSpec::default()
            };
            store.insert_pool(&NodePool::new("own", own)).unwrap();
            assert_eq!(
                store.fill_pool_kubernetes_versions("1.31.4").unwrap(),
                ["old"]
            );
            let version = |name: &str| {
                store
                    .pool(name)
                    .unwrap()
                    .unwrap()
                    .pool
                    .spec
                    .kubernetes_version
            };
            assert_eq!(version("old").as_deref(), Some("1.31.4"));
            assert_eq!(version("own").as_deref(), Some("1.30.1"));
            // Once: a later cluster version changes nothing.
            assert!(store
                .fill_pool_kubernetes_versions("1.32.0")
                .unwrap()
                .is_empty());
            assert_eq!(version("old").as_deref(), Some("1.31.4"));
        });
    }
}
