//! Instances (created by knit or added by attach) and each one's way to
//! its first Ready and its node repair.

use super::{now_ms, opt_word, word, Store};
use crate::error::Result;
use knit_api::state::{InstanceState, RepairAction};
use rusqlite::{params, OptionalExtension};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InstanceRecord {
    pub name: String,
    pub pool: String,
    pub provider_id: Option<String>,
    pub state: InstanceState,
    pub ip: Option<String>,
    pub instance_type: String,
    #[serde(skip)]
    pub report_token_hash: Option<String>,
    pub last_error: Option<String>,
    pub created_ms: i64,
    pub updated_ms: i64,
    /// Added to its pool by attach (the user's machine), not created by
    /// knit: knit never releases it on its own.
    #[serde(default)]
    pub added: bool,
}

const INSTANCE_COLUMNS: &str =
    "name, pool, provider_id, state, ip, instance_type, report_token_hash, last_error, created_ms, updated_ms, added";

fn instance_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<InstanceRecord> {
    Ok(InstanceRecord {
        name: r.get(0)?,
        pool: r.get(1)?,
        provider_id: r.get(2)?,
        state: word(r, 3)?,
        ip: r.get(4)?,
        instance_type: r.get(5)?,
        report_token_hash: r.get(6)?,
        last_error: r.get(7)?,
        created_ms: r.get(8)?,
        updated_ms: r.get(9)?,
        added: r.get::<_, i64>(10)? != 0,
    })
}

/// One instance's way to its first Ready and its node repair (see
/// `crate::reconcile::repair`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InstanceHealth {
    pub instance: String,
    /// When its node was first Ready (initialized, without a cluster): the
    /// join timeout never applies after this.
    pub joined_ms: Option<i64>,
    /// When the join timeout failed it (so that a node Ready later recovers).
    pub join_failed_ms: Option<i64>,
    /// Since when its joined node is not Ready; `None` while Ready.
    pub unhealthy_since_ms: Option<i64>,
    /// Repair actions taken in the current episode.
    pub repair_step: i64,
    pub repair_action: Option<RepairAction>,
    pub repair_at_ms: Option<i64>,
    /// The last hold message given as an event (so it is given once).
    pub repair_note: Option<String>,
}

impl Store {
    pub fn instances(&self, pool: Option<&str>) -> Result<Vec<InstanceRecord>> {
        let conn = self.conn();
        let sql = format!(
            "SELECT {INSTANCE_COLUMNS} FROM instances WHERE (?1 IS NULL OR pool = ?1) ORDER BY created_ms, name"
        );
        let mut stmt = conn.prepare_cached(&sql)?;
        let rows = stmt
            .query_map(params![pool], instance_row)?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }

    pub fn instance(&self, name: &str) -> Result<Option<InstanceRecord>> {
        let sql = format!("SELECT {INSTANCE_COLUMNS} FROM instances WHERE name = ?1");
        Ok(self
            .conn()
            .query_row(&sql, params![name], instance_row)
            .optional()?)
    }

    pub fn set_instance_state(
        &self,
        name: &str,
        state: InstanceState,
        error: Option<&str>,
    ) -> Result<()> {
        self.conn().execute(
            "UPDATE instances SET state = ?2, last_error = ?3, updated_ms = ?4 WHERE name = ?1",
            params![name, state.as_str(), error, now_ms()],
        )?;
        Ok(())
    }

    pub fn set_instance_created(
        &self,
        name: &str,
        provider_id: &str,
        ip: Option<&str>,
    ) -> Result<()> {
        self.conn().execute(
            "UPDATE instances SET provider_id = ?2, ip = ?3, state = ?4, last_error = NULL, updated_ms = ?5 WHERE name = ?1",
            params![name, provider_id, ip, InstanceState::Running.as_str(), now_ms()],
        )?;
        Ok(())
    }

    pub fn set_report_token_hash(&self, name: &str, hash: &str) -> Result<()> {
        self.conn().execute(
            "UPDATE instances SET report_token_hash = ?2, updated_ms = ?3 WHERE name = ?1",
            params![name, hash, now_ms()],
        )?;
        Ok(())
    }

    pub fn instance_by_report_token(&self, hash: &str) -> Result<Option<InstanceRecord>> {
        let sql = format!("SELECT {INSTANCE_COLUMNS} FROM instances WHERE report_token_hash = ?1");
        Ok(self
            .conn()
            .query_row(&sql, params![hash], instance_row)
            .optional()?)
    }

    /// Forgets a released instance, its node and its timeline.
    pub fn remove_instance(&self, name: &str) -> Result<()> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        tx.execute("DELETE FROM timeline WHERE instance = ?1", params![name])?;
        tx.execute("DELETE FROM nodes WHERE instance = ?1", params![name])?;
        tx.execute("DELETE FROM instances WHERE name = ?1", params![name])?;
        tx.commit()?;
        Ok(())
    }

    /// Every instance's health record, by instance name.
    pub fn instance_health(&self) -> Result<std::collections::HashMap<String, InstanceHealth>> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(
            "SELECT instance, joined_ms, join_failed_ms, unhealthy_since_ms, repair_step, repair_action, repair_at_ms, repair_note FROM instance_health",
        )?;
        let rows = stmt
            .query_map([], |r| {
                Ok(InstanceHealth {
                    instance: r.get(0)?,
                    joined_ms: r.get(1)?,
                    join_failed_ms: r.get(2)?,
                    unhealthy_since_ms: r.get(3)?,
                    repair_step: r.get(4)?,
                    repair_action: opt_word(r, 5)?,
                    repair_at_ms: r.get(6)?,
                    repair_note: r.get(7)?,
                })
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows.into_iter().map(|h| (h.instance.clone(), h)).collect())
    }

    pub fn put_instance_health(&self, h: &InstanceHealth) -> Result<()> {
        self.conn().execute(
            "INSERT INTO instance_health (instance, joined_ms, join_failed_ms, unhealthy_since_ms, repair_step, repair_action, repair_at_ms, repair_note, updated_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
             ON CONFLICT (instance) DO UPDATE SET joined_ms = ?2, join_failed_ms = ?3, unhealthy_since_ms = ?4, repair_step = ?5, repair_action = ?6, repair_at_ms = ?7, repair_note = ?8, updated_ms = ?9",
            params![
                h.instance,
                h.joined_ms,
                h.join_failed_ms,
                h.unhealthy_since_ms,
                h.repair_step,
                h.repair_action.map(RepairAction::as_str),
                h.repair_at_ms,
                h.repair_note,
                now_ms()
            ],
        )?;
        Ok(())
    }

    /// Forgets the health of instances released or detached: attached
    /// again later, an instance joins afresh.
    pub fn prune_instance_health(&self) -> Result<usize> {
        Ok(self.conn().execute(
            "DELETE FROM instance_health WHERE instance NOT IN (SELECT name FROM instances WHERE state != ?1)",
            params![InstanceState::Detached.as_str()],
        )?)
    }
}
