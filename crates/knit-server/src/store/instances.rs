//! Instances (created by knit or added by attach) and each one's way to
//! its first Ready and its node repair.

use super::{now_ms, opt_word, word, Store};
use crate::error::{Result, ServerError};
use crate::provider_error::ProviderErrorKind;
use knit_api::state::{EventType, InstanceState, IntentStatus, RepairAction};
use knit_db::{params, Row};
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
    /// The provider's kind of `last_error`, when it was a provider's error
    /// (what the autoscaler tells a capacity failure by).
    #[serde(skip)]
    pub last_error_kind: Option<ProviderErrorKind>,
    pub created_ms: i64,
    pub updated_ms: i64,
    /// Added to its pool by attach (the user's machine), not created by
    /// knit: knit never releases it on its own.
    #[serde(default)]
    pub added: bool,
}

#[cfg(test)]
impl InstanceRecord {
    /// An instance of pool `p` with type `t`, for the pure functions' tests.
    pub(crate) fn example(name: &str, state: InstanceState) -> InstanceRecord {
        InstanceRecord {
            name: name.into(),
            pool: "p".into(),
            provider_id: None,
            state,
            ip: None,
            instance_type: "t".into(),
            report_token_hash: None,
            last_error: None,
            last_error_kind: None,
            created_ms: 0,
            updated_ms: 0,
            added: false,
        }
    }
}

const INSTANCE_COLUMNS: &str =
    "name, pool, provider_id, state, ip, instance_type, report_token_hash, last_error, created_ms, updated_ms, added, last_error_kind";

fn instance_row(r: &Row) -> Result<InstanceRecord> {
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
        added: r.get(10)?,
        last_error_kind: opt_word(r, 11)?,
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
        let sql = format!(
            "SELECT {INSTANCE_COLUMNS} FROM instances WHERE (CAST(?1 AS TEXT) IS NULL OR pool = ?1) ORDER BY created_ms"
        );
        let mut rows = self.read(|tx| {
            tx.query(&sql, params![pool])?
                .iter()
                .map(instance_row)
                .collect::<Result<Vec<_>>>()
        })?;
        // Names in byte order on both backends (PostgreSQL's collation
        // may order text differently from SQLite's).
        rows.sort_by(|a, b| (a.created_ms, &a.name).cmp(&(b.created_ms, &b.name)));
        Ok(rows)
    }

    pub fn instance(&self, name: &str) -> Result<Option<InstanceRecord>> {
        let sql = format!("SELECT {INSTANCE_COLUMNS} FROM instances WHERE name = ?1");
        self.read(|tx| {
            tx.query_opt(&sql, params![name])?
                .as_ref()
                .map(instance_row)
                .transpose()
        })
    }

    /// The instance's state, with `error` (text only, no provider kind) as
    /// its last error.
    pub fn set_instance_state(
        &self,
        name: &str,
        state: InstanceState,
        error: Option<&str>,
    ) -> Result<()> {
        self.write_instance_state(name, state, error, None)
    }

    /// The instance's state after a failed call: `error` is its last
    /// error, kept with the provider's kind when it is a provider's.
    pub fn set_instance_failure(
        &self,
        name: &str,
        state: InstanceState,
        error: &ServerError,
    ) -> Result<()> {
        self.write_instance_state(name, state, Some(&error.to_string()), error.provider_kind())
    }

    fn write_instance_state(
        &self,
        name: &str,
        state: InstanceState,
        error: Option<&str>,
        kind: Option<ProviderErrorKind>,
    ) -> Result<()> {
        let now = now_ms();
        let kind = kind.map(ProviderErrorKind::as_str);
        self.write(|tx| {
            tx.execute(
                "UPDATE instances SET state = ?2, last_error = ?3, last_error_kind = ?5, updated_ms = ?4 WHERE name = ?1",
                params![name, state.as_str(), error, now, kind],
            )?;
            if state == InstanceState::Detached {
                forget_join_credentials(tx, name)?;
            }
            Ok(())
        })
    }

    /// The type an instance was made with, when a fallback chose another
    /// than the one planned (`crate::provider::fallback`).
    pub fn set_instance_type(&self, name: &str, instance_type: &str) -> Result<()> {
        let now = now_ms();
        self.write(|tx| {
            tx.execute(
                "UPDATE instances SET instance_type = ?2, updated_ms = ?3 WHERE name = ?1",
                params![name, instance_type, now],
            )?;
            Ok(())
        })
    }

    pub fn set_instance_created(
        &self,
        name: &str,
        provider_id: &str,
        ip: Option<&str>,
    ) -> Result<()> {
        let now = now_ms();
        self.write(|tx| {
            tx.execute(
                "UPDATE instances SET provider_id = ?2, ip = ?3, state = ?4, last_error = NULL, last_error_kind = NULL, updated_ms = ?5 WHERE name = ?1",
                params![name, provider_id, ip, InstanceState::Running.as_str(), now],
            )?;
            Ok(())
        })
    }

    /// The instance made (or found) at the provider, its create intent done
    /// and the event saying so, in one transaction: a server killed between
    /// them leaves all or none, so the next leader neither loses the event
    /// nor makes the instance again.
    pub fn record_instance_created(
        &self,
        name: &str,
        provider_id: &str,
        ip: Option<&str>,
        intent_id: i64,
        reason: &str,
        message: &str,
    ) -> Result<()> {
        let now = now_ms();
        let written = self.write(|tx| {
            tx.execute(
                "UPDATE instances SET provider_id = ?2, ip = ?3, state = ?4, last_error = NULL, last_error_kind = NULL, updated_ms = ?5 WHERE name = ?1",
                params![name, provider_id, ip, InstanceState::Running.as_str(), now],
            )?;
            tx.execute(
                "UPDATE intents SET status = ?2, last_error = NULL, last_error_kind = NULL, updated_ms = ?3 WHERE id = ?1",
                params![intent_id, IntentStatus::Done.as_str(), now],
            )?;
            self.event_in(tx, now, EventType::Normal, "Instance", name, reason, message)
        })?;
        self.event_written(
            now,
            written,
            EventType::Normal,
            "Instance",
            name,
            reason,
            message,
        )
    }

    pub fn set_report_token_hash(&self, name: &str, hash: &str) -> Result<()> {
        let now = now_ms();
        self.write(|tx| {
            tx.execute(
                "UPDATE instances SET report_token_hash = ?2, updated_ms = ?3 WHERE name = ?1",
                params![name, hash, now],
            )?;
            Ok(())
        })
    }

    pub fn instance_by_report_token(&self, hash: &str) -> Result<Option<InstanceRecord>> {
        // An instance that left the pool reports nothing more (its token
        // is cleared as it leaves; the state is checked as well).
        let sql = format!(
            "SELECT {INSTANCE_COLUMNS} FROM instances WHERE report_token_hash = ?1 AND state != ?2"
        );
        self.read(|tx| {
            tx.query_opt(&sql, params![hash, InstanceState::Detached.as_str()])?
                .as_ref()
                .map(instance_row)
                .transpose()
        })
    }

    /// Forgets a released instance, its node and its timeline.
    pub fn remove_instance(&self, name: &str) -> Result<()> {
        self.write(|tx| {
            tx.execute("DELETE FROM timeline WHERE instance = ?1", params![name])?;
            tx.execute("DELETE FROM nodes WHERE instance = ?1", params![name])?;
            tx.execute("DELETE FROM drains WHERE instance = ?1", params![name])?;
            tx.execute("DELETE FROM drain_steps WHERE instance = ?1", params![name])?;
            forget_join_credentials(tx, name)?;
            tx.execute("DELETE FROM instances WHERE name = ?1", params![name])?;
            Ok(())
        })
    }

    /// Every instance's health record, by instance name.
    pub fn instance_health(&self) -> Result<std::collections::HashMap<String, InstanceHealth>> {
        let rows = self.read(|tx| {
            tx.query(
                "SELECT instance, joined_ms, join_failed_ms, unhealthy_since_ms, repair_step, repair_action, repair_at_ms, repair_note FROM instance_health",
                &[],
            )?
            .iter()
            .map(|r| {
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
            })
            .collect::<Result<Vec<_>>>()
        })?;
        Ok(rows.into_iter().map(|h| (h.instance.clone(), h)).collect())
    }

    pub fn put_instance_health(&self, h: &InstanceHealth) -> Result<()> {
        let now = now_ms();
        self.write(|tx| {
            tx.execute(
                "INSERT INTO instance_health (instance, joined_ms, join_failed_ms, unhealthy_since_ms, repair_step, repair_action, repair_at_ms, repair_note, updated_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
                 ON CONFLICT (instance) DO UPDATE SET joined_ms = excluded.joined_ms, join_failed_ms = excluded.join_failed_ms,
                   unhealthy_since_ms = excluded.unhealthy_since_ms, repair_step = excluded.repair_step,
                   repair_action = excluded.repair_action, repair_at_ms = excluded.repair_at_ms,
                   repair_note = excluded.repair_note, updated_ms = excluded.updated_ms",
                params![
                    &h.instance,
                    h.joined_ms,
                    h.join_failed_ms,
                    h.unhealthy_since_ms,
                    h.repair_step,
                    h.repair_action.map(RepairAction::as_str),
                    h.repair_at_ms,
                    &h.repair_note,
                    now
                ],
            )?;
            Ok(())
        })
    }

    /// Forgets the health of instances released or detached: attached
    /// again later, an instance joins afresh.
    pub fn prune_instance_health(&self) -> Result<usize> {
        let removed = self.write(|tx| {
            Ok(tx.execute(
                "DELETE FROM instance_health WHERE instance NOT IN (SELECT name FROM instances WHERE state != ?1)",
                params![InstanceState::Detached.as_str()],
            )?)
        })?;
        Ok(removed as usize)
    }
}
/// An instance that left (released or detached): its join tokens go and
/// its report token is cleared, so neither is accepted again.
pub(super) fn forget_join_credentials(tx: &mut knit_db::Tx<'_>, name: &str) -> Result<()> {
    tx.execute("DELETE FROM join_tokens WHERE instance = ?1", params![name])?;
    tx.execute(
        "UPDATE instances SET report_token_hash = NULL WHERE name = ?1",
        params![name],
    )?;
    Ok(())
}
