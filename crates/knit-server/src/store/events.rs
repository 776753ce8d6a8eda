//! Events: what happened to which object, repeated ones counted on one
//! row, old ones pruned; the audit trail (`knit exec`) by its own count and
//! age.

use super::{now_ms, word, Store};
use crate::error::Result;
use knit_api::state::EventType;
use knit_db::{params, Tx};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EventRecord {
    pub id: i64,
    /// When it first happened.
    pub at_ms: i64,
    /// How many times it happened (same type, object, reason and message
    /// within [`EVENT_AGGREGATION_WINDOW_MS`]).
    #[serde(default = "one")]
    pub count: i64,
    /// When it last happened.
    #[serde(default)]
    pub last_ms: i64,
    #[serde(rename = "type")]
    pub event_type: EventType,
    pub object_kind: String,
    pub object_name: String,
    pub reason: String,
    pub message: String,
}

fn one() -> i64 {
    1
}

/// Where recorded events also go, called after the write with the event's
/// row as it now is (its count and last time included). It must not block:
/// it runs on the writer's thread (`crate::kube_events` queues and drops).
pub type EventSink = Box<dyn Fn(&EventRecord) + Send + Sync>;

/// An event repeated within this time is counted on the earlier one.
pub const EVENT_AGGREGATION_WINDOW_MS: i64 = 10 * 60 * 1000;

/// Events are pruned once every this many writes.
const EVENT_PRUNE_EVERY: u64 = 100;

/// The reasons of the audit trail (`knit exec`: `crate::nodes::exec`), as
/// an SQL list: kept under a count and age of their own, so that other
/// events (a node's reports, however many) cannot push them out.
const AUDIT_SQL: &str = "('Exec', 'ExecFailed')";

/// How many events are kept, and how long: the audit trail (`knit exec`)
/// and the others each by their own numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventRetention {
    pub max_count: i64,
    pub max_age_ms: i64,
    pub audit_max_count: i64,
    pub audit_max_age_ms: i64,
}

impl Default for EventRetention {
    fn default() -> Self {
        EventRetention {
            max_count: 10_000,
            max_age_ms: 7 * 24 * 3600 * 1000,
            audit_max_count: 10_000,
            audit_max_age_ms: 90 * 24 * 3600 * 1000,
        }
    }
}

impl Store {
    /// Records an event; one identical to an event of the last
    /// [`EVENT_AGGREGATION_WINDOW_MS`] (same type, object, reason and
    /// message) only counts on that one. Old events are pruned now and then
    /// ([`Store::prune_events`]).
    pub fn add_event(
        &self,
        event_type: EventType,
        kind: &str,
        name: &str,
        reason: &str,
        message: &str,
    ) -> Result<()> {
        let now = now_ms();
        let written =
            self.write(|tx| self.event_in(tx, now, event_type, kind, name, reason, message))?;
        self.event_written(now, written, event_type, kind, name, reason, message)
    }

    /// Writes an event inside `tx` (counted on an identical recent one);
    /// the row when a sink wants it. [`Store::event_written`] finishes it
    /// after the transaction commits.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn event_in(
        &self,
        tx: &mut Tx<'_>,
        now: i64,
        event_type: EventType,
        kind: &str,
        name: &str,
        reason: &str,
        message: &str,
    ) -> Result<Option<(i64, i64, i64, i64)>> {
        let counted = tx.execute(
            "UPDATE events SET count = count + 1, last_ms = ?1 WHERE id = (
               SELECT id FROM events WHERE object_name = ?4 AND reason = ?5 AND type = ?2
                 AND object_kind = ?3 AND message = ?6 AND last_ms >= ?7
               ORDER BY id DESC LIMIT 1)",
            params![
                now,
                event_type.as_str(),
                kind,
                name,
                reason,
                message,
                now - EVENT_AGGREGATION_WINDOW_MS
            ],
        )?;
        if counted == 0 {
            tx.execute(
                "INSERT INTO events (at_ms, last_ms, count, type, object_kind, object_name, reason, message) VALUES (?1, ?1, 1, ?2, ?3, ?4, ?5, ?6)",
                params![now, event_type.as_str(), kind, name, reason, message],
            )?;
        }
        if self.event_sink.get().is_none() {
            return Ok(None);
        }
        // The row just counted or made (the newest of its kind).
        let row = tx.query_one(
            "SELECT id, at_ms, count, last_ms FROM events WHERE object_name = ?3 AND reason = ?4
               AND type = ?1 AND object_kind = ?2 AND message = ?5 ORDER BY id DESC LIMIT 1",
            params![event_type.as_str(), kind, name, reason, message],
        )?;
        Ok(Some((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?)))
    }

    /// After an event's transaction committed: the sink, the count of
    /// writes and now and then the pruning.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn event_written(
        &self,
        now: i64,
        written: Option<(i64, i64, i64, i64)>,
        event_type: EventType,
        kind: &str,
        name: &str,
        reason: &str,
        message: &str,
    ) -> Result<()> {
        if let (Some(sink), Some((id, at_ms, count, last_ms))) = (self.event_sink.get(), written) {
            sink(&EventRecord {
                id,
                at_ms,
                count,
                last_ms,
                event_type,
                object_kind: kind.to_string(),
                object_name: name.to_string(),
                reason: reason.to_string(),
                message: message.to_string(),
            });
        }
        // After the write (which may run more than once on PostgreSQL):
        // the count of writes and the pruning are this process's own.
        let written = self
            .events_written
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if written % EVENT_PRUNE_EVERY == EVENT_PRUNE_EVERY - 1 {
            self.prune_events(now)?;
        }
        Ok(())
    }

    /// Sends every event recorded from now on to `sink` as well (once per
    /// store; `false` when one is set already).
    pub fn set_event_sink(&self, sink: EventSink) -> bool {
        self.event_sink.set(sink).is_ok()
    }

    pub fn set_event_retention(&self, retention: EventRetention) {
        *self
            .event_retention
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = retention;
    }

    /// Removes events last seen longer ago than the retention's age, then
    /// all but the newest `max_count`: the audit trail and the other events
    /// each against their own numbers. Returns how many went.
    pub fn prune_events(&self, now: i64) -> Result<usize> {
        let retention = *self
            .event_retention
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let mut removed = 0;
        for (set, max_age, max_count) in [
            (
                format!("reason NOT IN {AUDIT_SQL}"),
                retention.max_age_ms,
                retention.max_count,
            ),
            (
                format!("reason IN {AUDIT_SQL}"),
                retention.audit_max_age_ms,
                retention.audit_max_count,
            ),
        ] {
            let cutoff = now - max_age;
            let keep = max_count.max(0);
            removed += self.write(|tx| {
                let old = tx.execute(
                    &format!("DELETE FROM events WHERE {set} AND last_ms < ?1"),
                    params![cutoff],
                )?;
                // All but the newest `keep` (written without `LIMIT -1
                // OFFSET`, which PostgreSQL does not take).
                let over = tx.execute(
                    &format!("DELETE FROM events WHERE {set} AND id NOT IN (SELECT id FROM events WHERE {set} ORDER BY last_ms DESC, id DESC LIMIT ?1)"),
                    params![keep],
                )?;
                Ok(old + over)
            })?;
        }
        Ok(removed as usize)
    }

    /// The newest `limit` events, oldest first.
    pub fn events(&self, limit: i64) -> Result<Vec<EventRecord>> {
        self.read(|tx| {
            tx.query(
                "SELECT id, at_ms, type, object_kind, object_name, reason, message, count, last_ms FROM
                   (SELECT * FROM events ORDER BY last_ms DESC, id DESC LIMIT ?1) AS newest ORDER BY last_ms, id",
                params![limit],
            )?
            .iter()
            .map(|r| {
                Ok(EventRecord {
                    id: r.get(0)?,
                    at_ms: r.get(1)?,
                    event_type: word(r, 2)?,
                    object_kind: r.get(3)?,
                    object_name: r.get(4)?,
                    reason: r.get(5)?,
                    message: r.get(6)?,
                    count: r.get(7)?,
                    last_ms: r.get(8)?,
                })
            })
            .collect()
        })
    }
}
