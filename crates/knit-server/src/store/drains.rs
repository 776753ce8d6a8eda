//! Drains: the drain of a node whose instance is being removed, stored
//! beside the delete intent it belongs to, so that a restarted server (or
//! the next leader) resumes it where it stood — the timeout counted from
//! the first start, never from the restart — and each step of it, the
//! node's drain timeline.

use super::{now_ms, word, Store};
use crate::error::Result;
use knit_api::state::DrainState;
use knit_db::{params, Row};
use serde::{Deserialize, Serialize};

pub(super) const SCHEMA: &str = r#"
CREATE TABLE drains (
    instance TEXT PRIMARY KEY,
    intent_id INTEGER NOT NULL,
    node TEXT NOT NULL,
    pool TEXT NOT NULL,
    state TEXT NOT NULL,
    started_ms INTEGER NOT NULL,
    updated_ms INTEGER NOT NULL,
    timed_out_ms INTEGER,
    reason TEXT,
    budget TEXT,
    pods_left INTEGER NOT NULL DEFAULT 0,
    evicted INTEGER NOT NULL DEFAULT 0,
    blocked_passes INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX drains_node ON drains (node);
CREATE INDEX drains_pool ON drains (pool);
CREATE TABLE drain_steps (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    instance TEXT NOT NULL,
    at_ms INTEGER NOT NULL,
    state TEXT NOT NULL,
    message TEXT NOT NULL
);
CREATE INDEX drain_steps_instance ON drain_steps (instance);
"#;

/// One node's drain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DrainRecord {
    pub instance: String,
    /// The delete intent (or, for a snapshot builder, 0) it belongs to.
    pub intent_id: i64,
    pub node: String,
    pub pool: String,
    pub state: DrainState,
    pub started_ms: i64,
    pub updated_ms: i64,
    pub timed_out_ms: Option<i64>,
    pub reason: Option<String>,
    /// The PodDisruptionBudget(s) that refused an eviction (`ns/name`).
    pub budget: Option<String>,
    pub pods_left: i64,
    pub evicted: i64,
    /// Passes in a row that evicted nothing (the backoff's exponent).
    pub blocked_passes: i64,
}

/// One step of a drain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DrainStep {
    pub at_ms: i64,
    pub state: DrainState,
    pub message: String,
}

const COLUMNS: &str = "instance, intent_id, node, pool, state, started_ms, updated_ms, timed_out_ms, reason, budget, pods_left, evicted, blocked_passes";

fn drain_row(r: &Row) -> Result<DrainRecord> {
    Ok(DrainRecord {
        instance: r.get(0)?,
        intent_id: r.get(1)?,
        node: r.get(2)?,
        pool: r.get(3)?,
        state: word(r, 4)?,
        started_ms: r.get(5)?,
        updated_ms: r.get(6)?,
        timed_out_ms: r.get(7)?,
        reason: r.get(8)?,
        budget: r.get(9)?,
        pods_left: r.get(10)?,
        evicted: r.get(11)?,
        blocked_passes: r.get(12)?,
    })
}

impl Store {
    /// The drain of `instance`'s node for `intent_id`: the stored one when
    /// it belongs to that intent, else a new one (started now, its first
    /// step written) replacing any of an earlier removal.
    pub fn start_drain(
        &self,
        intent_id: i64,
        instance: &str,
        node: &str,
        pool: &str,
    ) -> Result<DrainRecord> {
        let now = now_ms();
        let sql = format!("SELECT {COLUMNS} FROM drains WHERE instance = ?1");
        self.write(|tx| {
            if let Some(row) = tx.query_opt(&sql, params![instance])? {
                let found = drain_row(&row)?;
                if found.intent_id == intent_id && found.node == node {
                    return Ok(found);
                }
                tx.execute("DELETE FROM drains WHERE instance = ?1", params![instance])?;
                tx.execute(
                    "DELETE FROM drain_steps WHERE instance = ?1",
                    params![instance],
                )?;
            }
            tx.execute(
                "INSERT INTO drains (instance, intent_id, node, pool, state, started_ms, updated_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?6)",
                params![instance, intent_id, node, pool, DrainState::Draining.as_str(), now],
            )?;
            tx.execute(
                "INSERT INTO drain_steps (instance, at_ms, state, message) VALUES (?1, ?2, ?3, ?4)",
                params![
                    instance,
                    now,
                    DrainState::Draining.as_str(),
                    format!("drain of node {node} started: cordon, then evict its pods")
                ],
            )?;
            let row = tx.query_one(&sql, params![instance])?;
            drain_row(&row)
        })
    }

    /// Stores where a drain stands; `step`, when given, is appended to its
    /// timeline (a step is written only when something changed).
    pub fn update_drain(&self, drain: &DrainRecord, step: Option<&str>) -> Result<()> {
        let now = now_ms();
        self.write(|tx| {
            tx.execute(
                "UPDATE drains SET state = ?2, updated_ms = ?3, timed_out_ms = ?4, reason = ?5, budget = ?6, pods_left = ?7, evicted = ?8, blocked_passes = ?9 WHERE instance = ?1 AND intent_id = ?10",
                params![
                    &drain.instance,
                    drain.state.as_str(),
                    now,
                    drain.timed_out_ms,
                    &drain.reason,
                    &drain.budget,
                    drain.pods_left,
                    drain.evicted,
                    drain.blocked_passes,
                    drain.intent_id
                ],
            )?;
            if let Some(message) = step {
                tx.execute(
                    "INSERT INTO drain_steps (instance, at_ms, state, message) VALUES (?1, ?2, ?3, ?4)",
                    params![&drain.instance, now, drain.state.as_str(), message],
                )?;
            }
            Ok(())
        })
    }

    /// Forgets the drain of `instance` for `intent_id` and its steps (an
    /// in-place update's drain, ended by the node's uncordon): a later
    /// removal starts its own.
    pub fn forget_drain(&self, instance: &str, intent_id: i64) -> Result<()> {
        self.write(|tx| {
            let n = tx.execute(
                "DELETE FROM drains WHERE instance = ?1 AND intent_id = ?2",
                params![instance, intent_id],
            )?;
            if n > 0 {
                tx.execute(
                    "DELETE FROM drain_steps WHERE instance = ?1",
                    params![instance],
                )?;
            }
            Ok(())
        })
    }

    /// The drain of one instance's node, if one was started.
    pub fn drain(&self, instance: &str) -> Result<Option<DrainRecord>> {
        let sql = format!("SELECT {COLUMNS} FROM drains WHERE instance = ?1");
        self.read(|tx| {
            tx.query_opt(&sql, params![instance])?
                .map(|r| drain_row(&r))
                .transpose()
        })
    }

    /// Every stored drain.
    pub fn drains(&self) -> Result<Vec<DrainRecord>> {
        let sql = format!("SELECT {COLUMNS} FROM drains ORDER BY started_ms");
        self.read(|tx| tx.query(&sql, &[])?.iter().map(drain_row).collect())
    }

    /// A drain's steps, oldest first.
    pub fn drain_steps(&self, instance: &str) -> Result<Vec<DrainStep>> {
        self.read(|tx| {
            tx.query(
                "SELECT at_ms, state, message FROM drain_steps WHERE instance = ?1 ORDER BY id",
                params![instance],
            )?
            .iter()
            .map(|r| {
                Ok(DrainStep {
                    at_ms: r.get(0)?,
                    state: word(r, 1)?,
                    message: r.get(2)?,
                })
            })
            .collect()
        })
    }
}

#[cfg(test)]
mod tests {
    use knit_api::state::DrainState;

    #[test]
    fn a_drain_is_resumed_for_its_intent_and_replaced_for_another() {
        crate::store::testing::each_store(|store| {
            let d = store.start_drain(7, "p-a", "local.i-1", "p").unwrap();
            assert_eq!(d.state, DrainState::Draining);
            assert_eq!(store.pool_counts("p").unwrap().draining, 1);
            let mut blocked = d.clone();
            blocked.state = DrainState::Blocked;
            blocked.budget = Some("default/web".into());
            blocked.pods_left = 2;
            blocked.blocked_passes = 3;
            store
                .update_drain(&blocked, Some("eviction refused"))
                .unwrap();
            // The same intent again (a restart): resumed, not restarted.
            let again = store.start_drain(7, "p-a", "local.i-1", "p").unwrap();
            assert_eq!(again.started_ms, d.started_ms);
            assert_eq!(again.state, DrainState::Blocked);
            assert_eq!(again.budget.as_deref(), Some("default/web"));
            assert_eq!(again.blocked_passes, 3);
            let steps = store.drain_steps("p-a").unwrap();
            assert_eq!(steps.len(), 2);
            assert_eq!(steps[1].message, "eviction refused");
            // Drained: no longer counted.
            let mut done = again.clone();
            done.state = DrainState::Drained;
            store.update_drain(&done, None).unwrap();
            assert_eq!(store.pool_counts("p").unwrap().draining, 0);
            // Another removal of the same instance starts afresh.
            let fresh = store.start_drain(9, "p-a", "local.i-1", "p").unwrap();
            assert_eq!(fresh.state, DrainState::Draining);
            assert_eq!(store.drain_steps("p-a").unwrap().len(), 1);
            assert_eq!(store.drains().unwrap().len(), 1);
            // Released: its drain goes with it.
            store.remove_instance("p-a").unwrap();
            assert!(store.drain("p-a").unwrap().is_none());
            assert!(store.drain_steps("p-a").unwrap().is_empty());
        });
    }
}
