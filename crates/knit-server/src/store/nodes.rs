//! Nodes, as their agents report them, and each node's phase timeline.

use super::instances::InstanceRecord;
use super::{now_ms, opt_word, word, Store};
use crate::error::Result;
use knit_api::state::NodeStatus;
use knit_api::{ErrorCode, PhaseEvent, PhaseName, PhaseOutcome};
use knit_db::{params, Row};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeRecord {
    pub name: String,
    pub instance: String,
    pub pool: String,
    pub status: NodeStatus,
    pub phase: Option<PhaseName>,
    pub phase_outcome: Option<PhaseOutcome>,
    pub error_code: Option<ErrorCode>,
    pub error: Option<String>,
    pub created_ms: i64,
    pub updated_ms: i64,
    /// Outcome of the pool's user-data script once known: `succeeded` or
    /// `failed: <why>`.
    pub user_data: Option<String>,
}

impl NodeRecord {
    /// The agent finished its last phase (or a phase failed: it stops there).
    pub fn initialized(&self) -> bool {
        self.phase == Some(PhaseName::LAST)
            && self.phase_outcome.is_some_and(PhaseOutcome::is_success)
    }
}

/// Each instance's nodes, looked up by instance name: a pass over 1,000
/// instances scanning all nodes for each was a million string compares.
pub fn nodes_by_instance(
    nodes: &[NodeRecord],
) -> std::collections::HashMap<&str, Vec<&NodeRecord>> {
    let mut by_instance: std::collections::HashMap<&str, Vec<&NodeRecord>> =
        std::collections::HashMap::with_capacity(nodes.len());
    for n in nodes {
        by_instance.entry(n.instance.as_str()).or_default().push(n);
    }
    by_instance
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TimelineEntry {
    pub phase: PhaseName,
    pub outcome: PhaseOutcome,
    pub reason: Option<String>,
    pub error_code: Option<ErrorCode>,
    pub at_ms: i64,
    pub duration_ms: Option<i64>,
}

/// Timeline rows kept per node (ten phases, two rows each, a few
/// dozen runs); older ones are dropped as new ones come.
pub const MAX_TIMELINE_PER_NODE: i64 = 1000;

const NODE_COLUMNS: &str =
    "name, instance, pool, status, phase, phase_outcome, error_code, error, created_ms, updated_ms, user_data";

fn node_row(r: &Row) -> Result<NodeRecord> {
    Ok(NodeRecord {
        name: r.get(0)?,
        instance: r.get(1)?,
        pool: r.get(2)?,
        status: word(r, 3)?,
        phase: opt_word(r, 4)?,
        phase_outcome: opt_word(r, 5)?,
        error_code: opt_word(r, 6)?,
        error: r.get(7)?,
        created_ms: r.get(8)?,
        updated_ms: r.get(9)?,
        user_data: r.get(10)?,
    })
}

impl Store {
    /// Appends a phase event and updates the node's current phase; the node
    /// row is created by its first event.
    pub fn record_phase_event(&self, instance: &InstanceRecord, event: &PhaseEvent) -> Result<()> {
        let outcome = event.outcome.as_str();
        let error_code = event.error_code.map(ErrorCode::as_str);
        let now = now_ms();
        let failed = event.outcome == PhaseOutcome::Failed;
        self.write(|tx| {
            tx.execute(
                "INSERT INTO timeline (node, instance, phase, outcome, reason, error_code, at_ms, duration_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                params![
                    &event.node,
                    &instance.name,
                    event.phase.as_str(),
                    outcome,
                    &event.reason,
                    error_code,
                    event.at_ms as i64,
                    event.duration_ms.map(|d| d as i64)
                ],
            )?;
            // Bounded per node: the oldest rows beyond the newest
            // MAX_TIMELINE_PER_NODE go (a node reporting in a loop).
            tx.execute(
                "DELETE FROM timeline WHERE node = ?1 AND id <= (
                   SELECT id FROM timeline WHERE node = ?1 ORDER BY id DESC LIMIT 1 OFFSET ?2)",
                params![&event.node, MAX_TIMELINE_PER_NODE],
            )?;
            tx.execute(
                "INSERT INTO nodes (name, instance, pool, status, phase, phase_outcome, error_code, error, created_ms, updated_ms)
                 VALUES (?1, ?2, ?3, ?10, ?4, ?5, ?6, ?7, ?8, ?8)
                 ON CONFLICT (name) DO UPDATE SET phase = excluded.phase, phase_outcome = excluded.phase_outcome,
                   error_code = CASE WHEN ?9 = 1 THEN excluded.error_code ELSE nodes.error_code END,
                   error = CASE WHEN ?9 = 1 THEN excluded.error ELSE nodes.error END,
                   updated_ms = excluded.updated_ms",
                params![
                    &event.node,
                    &instance.name,
                    &instance.pool,
                    event.phase.as_str(),
                    outcome,
                    error_code,
                    if failed { event.reason.clone() } else { None },
                    now,
                    failed,
                    NodeStatus::NotReady.as_str()
                ],
            )?;
            Ok(())
        })
    }

    pub fn set_node_user_data(&self, name: &str, outcome: &str) -> Result<()> {
        self.write(|tx| {
            tx.execute(
                "UPDATE nodes SET user_data = ?2 WHERE name = ?1",
                params![name, outcome],
            )?;
            Ok(())
        })
    }

    pub fn set_node_status(&self, name: &str, status: NodeStatus) -> Result<()> {
        let now = now_ms();
        self.write(|tx| {
            tx.execute(
                "UPDATE nodes SET status = ?2, updated_ms = ?3 WHERE name = ?1",
                params![name, status.as_str(), now],
            )?;
            Ok(())
        })
    }

    pub fn nodes(&self) -> Result<Vec<NodeRecord>> {
        self.nodes_where("TRUE")
    }

    /// The nodes whose user-data outcome is not recorded yet: the
    /// reconciler looks for these every pass, and once every node has one
    /// (the steady state) the answer is empty: no row is decoded.
    pub fn nodes_without_user_data(&self) -> Result<Vec<NodeRecord>> {
        self.nodes_where("user_data IS NULL")
    }

    /// Each node's name and recorded status: what the reconciler compares
    /// with the cluster's every pass, without the rest of every row.
    pub fn node_statuses(&self) -> Result<Vec<(String, NodeStatus)>> {
        self.read(|tx| {
            tx.query("SELECT name, status FROM nodes", &[])?
                .iter()
                .map(|r| Ok((r.get(0)?, word(r, 1)?)))
                .collect()
        })
    }

    /// The nodes `condition` (SQL over the nodes table, never user input)
    /// holds for, oldest first.
    fn nodes_where(&self, condition: &str) -> Result<Vec<NodeRecord>> {
        let sql = format!("SELECT {NODE_COLUMNS} FROM nodes WHERE {condition} ORDER BY created_ms");
        let mut rows = self.read(|tx| {
            tx.query(&sql, &[])?
                .iter()
                .map(node_row)
                .collect::<Result<Vec<_>>>()
        })?;
        // Names in byte order on both backends.
        rows.sort_by(|a, b| (a.created_ms, &a.name).cmp(&(b.created_ms, &b.name)));
        Ok(rows)
    }

    pub fn node(&self, name: &str) -> Result<Option<NodeRecord>> {
        let sql = format!("SELECT {NODE_COLUMNS} FROM nodes WHERE name = ?1");
        self.read(|tx| {
            tx.query_opt(&sql, params![name])?
                .as_ref()
                .map(node_row)
                .transpose()
        })
    }

    /// The name of an instance's node, once it reported.
    pub fn node_of_instance(&self, instance: &str) -> Result<Option<String>> {
        self.read(|tx| {
            tx.query_opt(
                "SELECT name FROM nodes WHERE instance = ?1 ORDER BY created_ms DESC LIMIT 1",
                params![instance],
            )?
            .map(|r| r.get(0))
            .transpose()
            .map_err(Into::into)
        })
    }

    pub fn timeline(&self, node: &str) -> Result<Vec<TimelineEntry>> {
        self.read(|tx| {
            tx.query(
                "SELECT phase, outcome, reason, error_code, at_ms, duration_ms FROM timeline WHERE node = ?1 ORDER BY at_ms, id",
                params![node],
            )?
            .iter()
            .map(|r| {
                Ok(TimelineEntry {
                    phase: word(r, 0)?,
                    outcome: word(r, 1)?,
                    reason: r.get(2)?,
                    error_code: opt_word(r, 3)?,
                    at_ms: r.get(4)?,
                    duration_ms: r.get(5)?,
                })
            })
            .collect()
        })
    }
}

#[cfg(test)]
mod tests {
    use knit_api::state::NodeStatus;
    use knit_api::{PhaseEvent, PhaseName, PhaseOutcome};

    #[test]
    fn statuses_and_nodes_awaiting_user_data_come_from_their_own_reads() {
        crate::store::testing::each_store(|store| {
            crate::store::testing::pool_with_instances(store, "p", &["p-a", "p-b"]);
            for (instance, node) in [("p-a", "na"), ("p-b", "nb")] {
                let record = store.instance(instance).unwrap().unwrap();
                let done = PhaseEvent {
                    node: node.into(),
                    instance_id: instance.into(),
                    phase: PhaseName::LAST,
                    outcome: PhaseOutcome::Done,
                    reason: None,
                    error_code: None,
                    at_ms: 1,
                    duration_ms: Some(1),
                };
                store.record_phase_event(&record, &done).unwrap();
            }
            store.set_node_status("na", NodeStatus::Ready).unwrap();
            store.set_node_user_data("nb", "succeeded").unwrap();
            let mut statuses = store.node_statuses().unwrap();
            statuses.sort_by(|a, b| a.0.cmp(&b.0));
            assert_eq!(
                statuses,
                vec![
                    ("na".to_string(), NodeStatus::Ready),
                    ("nb".to_string(), NodeStatus::NotReady)
                ]
            );
            let waiting: Vec<String> = store
                .nodes_without_user_data()
                .unwrap()
                .into_iter()
                .map(|n| n.name)
                .collect();
            assert_eq!(waiting, vec!["na".to_string()]);
            assert_eq!(store.nodes().unwrap().len(), 2);
        });
    }
}
