//! The cluster document and the node pools (one JSON document each), and
//! a pool's counts of instances and nodes.

use super::{from_json, now_ms, to_json, word, Store};
use crate::error::{Result, ServerError};
use knit_api::state::InstanceState;
use knit_api::{Cluster, NodePool};
use rusqlite::{params, OptionalExtension};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolRecord {
    pub pool: NodePool,
    pub deleting: bool,
    pub created_ms: i64,
    pub updated_ms: i64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolCounts {
    pub instances: std::collections::BTreeMap<InstanceState, i64>,
    pub initialized: i64,
    pub ready: i64,
}

impl Store {
    pub fn cluster(&self) -> Result<Option<Cluster>> {
        let doc: Option<String> = self
            .conn()
            .query_row("SELECT doc FROM cluster WHERE id = 1", [], |r| r.get(0))
            .optional()?;
        doc.map(|d| from_json(&d)).transpose()
    }

    pub fn put_cluster(&self, cluster: &Cluster) -> Result<()> {
        self.conn().execute(
            "INSERT INTO cluster (id, doc) VALUES (1, ?1) ON CONFLICT(id) DO UPDATE SET doc = excluded.doc",
            params![to_json(cluster)?],
        )?;
        Ok(())
    }

    pub fn insert_pool(&self, pool: &NodePool) -> Result<()> {
        let now = now_ms();
        let changed = self.conn().execute(
            "INSERT INTO pools (name, doc, created_ms, updated_ms) VALUES (?1, ?2, ?3, ?3) ON CONFLICT(name) DO NOTHING",
            params![pool.metadata.name, to_json(pool)?, now],
        )?;
        if changed == 0 {
            return Err(ServerError::AlreadyExists {
                kind: "pool",
                name: pool.metadata.name.clone(),
            });
        }
        Ok(())
    }

    pub fn update_pool(&self, pool: &NodePool) -> Result<()> {
        let changed = self.conn().execute(
            "UPDATE pools SET doc = ?2, updated_ms = ?3 WHERE name = ?1 AND deleting = 0",
            params![pool.metadata.name, to_json(pool)?, now_ms()],
        )?;
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
        let row: Option<(String, i64, i64, i64)> = self
            .conn()
            .query_row(
                "SELECT doc, deleting, created_ms, updated_ms FROM pools WHERE name = ?1",
                params![name],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
            )
            .optional()?;
        row.map(|(doc, deleting, created_ms, updated_ms)| {
            Ok(PoolRecord {
                pool: from_json(&doc)?,
                deleting: deleting != 0,
                created_ms,
                updated_ms,
            })
        })
        .transpose()
    }

    pub fn pools(&self) -> Result<Vec<PoolRecord>> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(
            "SELECT doc, deleting, created_ms, updated_ms FROM pools ORDER BY name",
        )?;
        let rows = stmt
            .query_map([], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, i64>(1)?,
                    r.get(2)?,
                    r.get(3)?,
                ))
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        rows.into_iter()
            .map(|(doc, deleting, created_ms, updated_ms)| {
                Ok(PoolRecord {
                    pool: from_json(&doc)?,
                    deleting: deleting != 0,
                    created_ms,
                    updated_ms,
                })
            })
            .collect()
    }

    /// Marks a pool for deletion: the reconciler scales it to zero and then
    /// removes the row.
    pub fn mark_pool_deleting(&self, name: &str) -> Result<()> {
        let changed = self.conn().execute(
            "UPDATE pools SET deleting = 1, updated_ms = ?2 WHERE name = ?1",
            params![name, now_ms()],
        )?;
        if changed == 0 {
            return Err(ServerError::NotFound {
                kind: "pool",
                name: name.to_string(),
            });
        }
        Ok(())
    }

    pub fn remove_pool(&self, name: &str) -> Result<()> {
        self.conn()
            .execute("DELETE FROM pools WHERE name = ?1", params![name])?;
        Ok(())
    }

    /// A pool's instances by state and its nodes' progress, counted in SQL.
    pub fn pool_counts(&self, pool: &str) -> Result<PoolCounts> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(
            "SELECT state, COUNT(*) FROM instances WHERE pool = ?1 GROUP BY state",
        )?;
        let instances = stmt
            .query_map(params![pool], |r| Ok((word(r, 0)?, r.get::<_, i64>(1)?)))?
            .collect::<rusqlite::Result<_>>()?;
        let (initialized, ready) = conn.query_row(
            "SELECT COALESCE(SUM(phase = 'hardening' AND phase_outcome IN ('done', 'skipped')), 0),
                    COALESCE(SUM(status = 'Ready'), 0) FROM nodes WHERE pool = ?1",
            params![pool],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        Ok(PoolCounts {
            instances,
            initialized,
            ready,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use knit_api::NodePoolSpec;

    #[test]
    fn duplicate_pool_is_refused() {
        let store = Store::open_in_memory().unwrap();
        let pool = NodePool::new("a", NodePoolSpec::default());
        store.insert_pool(&pool).unwrap();
        assert_eq!(
            store.insert_pool(&pool).unwrap_err().code(),
            "AlreadyExists"
        );
    }
}
