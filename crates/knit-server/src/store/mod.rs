//! The control plane's state: one SQLite database, schema versioned by
//! `PRAGMA user_version` and migrated forward at open.
//!
//! Every intent (create or delete an instance) is written here before the
//! reconciler acts on it, so a server killed at any point resumes from the
//! database without losing or duplicating an instance.

use crate::error::{Result, ServerError};
use knit_api::{Cluster, NodePool, PhaseEvent};
use rusqlite::{params, Connection, OptionalExtension};
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::sync::{Mutex, MutexGuard};

/// Ordered migrations; entry `i` takes the schema from version `i` to `i + 1`.
const MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE cluster (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    doc TEXT NOT NULL
);
CREATE TABLE pools (
    name TEXT PRIMARY KEY,
    doc TEXT NOT NULL,
    deleting INTEGER NOT NULL DEFAULT 0,
    created_ms INTEGER NOT NULL,
    updated_ms INTEGER NOT NULL
);
CREATE TABLE instances (
    name TEXT PRIMARY KEY,
    pool TEXT NOT NULL,
    provider_id TEXT,
    state TEXT NOT NULL,
    ip TEXT,
    instance_type TEXT NOT NULL,
    report_token_hash TEXT,
    last_error TEXT,
    created_ms INTEGER NOT NULL,
    updated_ms INTEGER NOT NULL
);
CREATE INDEX instances_pool ON instances (pool);
CREATE TABLE nodes (
    name TEXT PRIMARY KEY,
    instance TEXT NOT NULL,
    pool TEXT NOT NULL,
    status TEXT NOT NULL,
    phase TEXT,
    phase_outcome TEXT,
    error_code TEXT,
    error TEXT,
    created_ms INTEGER NOT NULL,
    updated_ms INTEGER NOT NULL
);
CREATE TABLE timeline (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    node TEXT NOT NULL,
    instance TEXT NOT NULL,
    phase TEXT NOT NULL,
    outcome TEXT NOT NULL,
    reason TEXT,
    error_code TEXT,
    at_ms INTEGER NOT NULL,
    duration_ms INTEGER
);
CREATE INDEX timeline_node ON timeline (node);
CREATE TABLE join_tokens (
    token_hash TEXT PRIMARY KEY,
    token_id TEXT NOT NULL,
    instance TEXT NOT NULL,
    pool TEXT NOT NULL,
    created_ms INTEGER NOT NULL,
    expires_ms INTEGER NOT NULL,
    used_ms INTEGER
);
CREATE TABLE snapshots (
    id TEXT PRIMARY KEY,
    pool TEXT NOT NULL,
    kubernetes_version TEXT NOT NULL,
    containerd_version TEXT NOT NULL,
    images TEXT NOT NULL,
    size_bytes INTEGER NOT NULL,
    created_ms INTEGER NOT NULL
);
CREATE TABLE events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at_ms INTEGER NOT NULL,
    type TEXT NOT NULL,
    object_kind TEXT NOT NULL,
    object_name TEXT NOT NULL,
    reason TEXT NOT NULL,
    message TEXT NOT NULL
);
CREATE TABLE intents (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    action TEXT NOT NULL,
    instance TEXT NOT NULL,
    pool TEXT NOT NULL,
    release INTEGER NOT NULL DEFAULT 1,
    status TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    next_attempt_ms INTEGER NOT NULL DEFAULT 0,
    last_error TEXT,
    created_ms INTEGER NOT NULL,
    updated_ms INTEGER NOT NULL
);
CREATE INDEX intents_status ON intents (status);
"#,
    r#"
CREATE INDEX nodes_pool ON nodes (pool);
CREATE INDEX nodes_instance ON nodes (instance);
CREATE INDEX timeline_instance ON timeline (instance);
"#,
    r#"
ALTER TABLE nodes ADD COLUMN user_data TEXT;
"#,
    // Snapshot builds and their progress, so that a restart knows which
    // build was running, at which step, with which builder.
    r#"
CREATE TABLE snapshot_builds (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    pool TEXT NOT NULL,
    builder_pool TEXT NOT NULL,
    builder_instance TEXT,
    images TEXT NOT NULL,
    keep_builder INTEGER NOT NULL,
    status TEXT NOT NULL,
    step TEXT NOT NULL,
    error TEXT,
    snapshot_id TEXT,
    started_ms INTEGER NOT NULL,
    finished_ms INTEGER
);
CREATE TABLE snapshot_build_steps (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    build TEXT NOT NULL,
    at_ms INTEGER NOT NULL,
    step TEXT NOT NULL,
    message TEXT NOT NULL
);
CREATE INDEX snapshot_build_steps_build ON snapshot_build_steps (build);
"#,
    // Instances added by attach (not created by knit): never released by
    // knit on its own.
    r#"
ALTER TABLE instances ADD COLUMN added INTEGER NOT NULL DEFAULT 0;
"#,
    // Each instance's way to its first Ready and its node repair, so that
    // the join timeout stops applying once a node has joined and a repair
    // resumes at the same step after a restart. Nodes already Ready or
    // initialized count as joined.
    r#"
CREATE TABLE instance_health (
    instance TEXT PRIMARY KEY,
    joined_ms INTEGER,
    join_failed_ms INTEGER,
    unhealthy_since_ms INTEGER,
    repair_step INTEGER NOT NULL DEFAULT 0,
    repair_action TEXT,
    repair_at_ms INTEGER,
    repair_note TEXT,
    updated_ms INTEGER NOT NULL
);
INSERT INTO instance_health (instance, joined_ms, updated_ms)
    SELECT instance, MIN(updated_ms), MIN(updated_ms) FROM nodes
    WHERE status = 'Ready' OR (phase = 'hardening' AND phase_outcome IN ('done', 'skipped'))
    GROUP BY instance;
"#,
    // Repeated events are one row with a count and when last seen (as
    // Kubernetes aggregates them), so a flood of refusals is one event.
    r#"
ALTER TABLE events ADD COLUMN count INTEGER NOT NULL DEFAULT 1;
ALTER TABLE events ADD COLUMN last_ms INTEGER NOT NULL DEFAULT 0;
UPDATE events SET last_ms = at_ms;
CREATE INDEX events_key ON events (object_name, reason);
CREATE INDEX events_last ON events (last_ms);
"#,
];

pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Instance lifecycle as the control plane sees it.
pub mod state {
    /// Intent written, not yet sent to the provider.
    pub const PENDING: &str = "Pending";
    /// Provider call in flight; on restart the provider is asked whether it exists.
    pub const CREATING: &str = "Creating";
    pub const RUNNING: &str = "Running";
    /// Creation failed more times than allowed; kept for inspection.
    pub const FAILED: &str = "Failed";
    pub const DELETING: &str = "Deleting";
    /// Removed from its pool with the instance kept (`--release=false`).
    pub const DETACHED: &str = "Detached";
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolRecord {
    pub pool: NodePool,
    pub deleting: bool,
    pub created_ms: i64,
    pub updated_ms: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InstanceRecord {
    pub name: String,
    pub pool: String,
    pub provider_id: Option<String>,
    pub state: String,
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

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeRecord {
    pub name: String,
    pub instance: String,
    pub pool: String,
    pub status: String,
    pub phase: Option<String>,
    pub phase_outcome: Option<String>,
    pub error_code: Option<String>,
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
        self.phase.as_deref() == Some("hardening")
            && matches!(
                self.phase_outcome.as_deref(),
                Some("done") | Some("skipped")
            )
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TimelineEntry {
    pub phase: String,
    pub outcome: String,
    pub reason: Option<String>,
    pub error_code: Option<String>,
    pub at_ms: i64,
    pub duration_ms: Option<i64>,
}

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
    pub event_type: String,
    pub object_kind: String,
    pub object_name: String,
    pub reason: String,
    pub message: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IntentRecord {
    pub id: i64,
    pub action: String,
    pub instance: String,
    pub pool: String,
    pub release: bool,
    pub status: String,
    pub attempts: i64,
    pub next_attempt_ms: i64,
    pub last_error: Option<String>,
}

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

/// A snapshot build's lifecycle.
pub mod build_state {
    pub const RUNNING: &str = "Running";
    pub const SUCCEEDED: &str = "Succeeded";
    pub const FAILED: &str = "Failed";
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
    /// `build_state::*`.
    pub status: String,
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

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JoinTokenRecord {
    pub token_id: String,
    pub instance: String,
    pub pool: String,
    pub created_ms: i64,
    pub expires_ms: i64,
    pub used_ms: Option<i64>,
}

/// What redeeming a join token found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Redeem {
    Ok { instance: String, pool: String },
    Unknown,
    Used { instance: String, used_ms: i64 },
    Expired { instance: String, expires_ms: i64 },
}

/// An existing instance joining a pool (see [`Store::enroll_attached`]).
pub struct Enrollment<'a> {
    pub name: &'a str,
    /// The pool's document after the add (count + 1, marker label).
    pub pool: &'a NodePool,
    pub provider_id: &'a str,
    pub ip: Option<&'a str>,
    pub instance_type: &'a str,
    pub state: &'a str,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolCounts {
    pub instances: std::collections::BTreeMap<String, i64>,
    pub initialized: i64,
    pub ready: i64,
}

pub struct Store {
    conn: Mutex<Connection>,
    event_retention: Mutex<EventRetention>,
    events_written: std::sync::atomic::AtomicU64,
}

fn one() -> i64 {
    1
}

/// An event repeated within this time is counted on the earlier one.
pub const EVENT_AGGREGATION_WINDOW_MS: i64 = 10 * 60 * 1000;
/// Events are pruned once every this many writes.
const EVENT_PRUNE_EVERY: u64 = 100;

/// How many events are kept, and how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventRetention {
    pub max_count: i64,
    pub max_age_ms: i64,
}

impl Default for EventRetention {
    fn default() -> Self {
        EventRetention {
            max_count: 10_000,
            max_age_ms: 7 * 24 * 3600 * 1000,
        }
    }
}

fn to_json<T: Serialize>(value: &T) -> Result<String> {
    serde_json::to_string(value).map_err(|e| ServerError::Internal(format!("encode: {e}")))
}

fn from_json<T: for<'de> Deserialize<'de>>(text: &str) -> Result<T> {
    serde_json::from_str(text)
        .map_err(|e| ServerError::Internal(format!("stored document is unreadable: {e}")))
}

const INSTANCE_COLUMNS: &str =
    "name, pool, provider_id, state, ip, instance_type, report_token_hash, last_error, created_ms, updated_ms, added";

fn instance_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<InstanceRecord> {
    Ok(InstanceRecord {
        name: r.get(0)?,
        pool: r.get(1)?,
        provider_id: r.get(2)?,
        state: r.get(3)?,
        ip: r.get(4)?,
        instance_type: r.get(5)?,
        report_token_hash: r.get(6)?,
        last_error: r.get(7)?,
        created_ms: r.get(8)?,
        updated_ms: r.get(9)?,
        added: r.get::<_, i64>(10)? != 0,
    })
}

const NODE_COLUMNS: &str =
    "name, instance, pool, status, phase, phase_outcome, error_code, error, created_ms, updated_ms, user_data";

fn node_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<NodeRecord> {
    Ok(NodeRecord {
        name: r.get(0)?,
        instance: r.get(1)?,
        pool: r.get(2)?,
        status: r.get(3)?,
        phase: r.get(4)?,
        phase_outcome: r.get(5)?,
        error_code: r.get(6)?,
        error: r.get(7)?,
        created_ms: r.get(8)?,
        updated_ms: r.get(9)?,
        user_data: r.get(10)?,
    })
}

fn intent_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<IntentRecord> {
    Ok(IntentRecord {
        id: r.get(0)?,
        action: r.get(1)?,
        instance: r.get(2)?,
        pool: r.get(3)?,
        release: r.get::<_, i64>(4)? != 0,
        status: r.get(5)?,
        attempts: r.get(6)?,
        next_attempt_ms: r.get(7)?,
        last_error: r.get(8)?,
    })
}

impl Store {
    pub fn open(path: &Path) -> Result<Store> {
        let conn = Connection::open(path)?;
        Store::init(conn)
    }

    pub fn open_in_memory() -> Result<Store> {
        Store::init(Connection::open_in_memory()?)
    }

    fn init(mut conn: Connection) -> Result<Store> {
        // WAL: readers do not block the writer; NORMAL sync is durable across
        // a process kill (only an OS crash may lose the last transaction).
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        migrate(&mut conn)?;
        Ok(Store {
            conn: Mutex::new(conn),
            event_retention: Mutex::new(EventRetention::default()),
            events_written: std::sync::atomic::AtomicU64::new(0),
        })
    }

    fn conn(&self) -> MutexGuard<'_, Connection> {
        // A panic while holding the lock leaves SQLite consistent (every
        // change is a transaction), so a poisoned lock is safe to reuse.
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn schema_version(&self) -> Result<i64> {
        Ok(self
            .conn()
            .query_row("PRAGMA user_version", [], |r| r.get(0))?)
    }

    // ---- cluster

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

    // ---- pools

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

    // ---- instances and intents

    /// Records new instances of a pool and their create intents in one
    /// transaction: either all exist or none.
    pub fn add_create_intents(&self, pool: &str, names: &[(String, String)]) -> Result<()> {
        let now = now_ms();
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        for (name, instance_type) in names {
            tx.execute(
                "INSERT INTO instances (name, pool, state, instance_type, created_ms, updated_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?5)",
                params![name, pool, state::PENDING, instance_type, now],
            )?;
            tx.execute(
                "INSERT INTO intents (action, instance, pool, status, created_ms, updated_ms) VALUES ('create', ?1, ?2, 'pending', ?3, ?3)",
                params![name, pool, now],
            )?;
        }
        tx.commit()?;
        Ok(())
    }

    /// Records an existing instance added to a pool (attach), in one
    /// transaction: records of the same machine left Detached by an earlier
    /// removal go, the instance row (`added`), the pool's new document (its
    /// count one higher) and, when `intent` is set, a pending `attach` intent
    /// that a restarted server resumes. Returns the intent's id.
    pub fn enroll_attached(&self, e: &Enrollment<'_>, intent: bool) -> Result<Option<i64>> {
        let now = now_ms();
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let old: Vec<String> = {
            let mut stmt =
                tx.prepare("SELECT name FROM instances WHERE provider_id = ?1 AND state = ?2")?;
            let rows = stmt
                .query_map(params![e.provider_id, state::DETACHED], |r| r.get(0))?
                .collect::<rusqlite::Result<Vec<String>>>()?;
            rows
        };
        for name in &old {
            tx.execute("DELETE FROM timeline WHERE instance = ?1", params![name])?;
            tx.execute("DELETE FROM nodes WHERE instance = ?1", params![name])?;
            tx.execute("DELETE FROM instances WHERE name = ?1", params![name])?;
        }
        tx.execute(
            "INSERT INTO instances (name, pool, provider_id, state, ip, instance_type, created_ms, updated_ms, added) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?7, 1)",
            params![e.name, e.pool.metadata.name, e.provider_id, e.state, e.ip, e.instance_type, now],
        )?;
        let changed = tx.execute(
            "UPDATE pools SET doc = ?2, updated_ms = ?3 WHERE name = ?1 AND deleting = 0",
            params![e.pool.metadata.name, to_json(e.pool)?, now],
        )?;
        if changed == 0 {
            return Err(ServerError::NotFound {
                kind: "pool",
                name: e.pool.metadata.name.clone(),
            });
        }
        let id = if intent {
            tx.execute(
                "INSERT INTO intents (action, instance, pool, release, status, created_ms, updated_ms) VALUES ('attach', ?1, ?2, 0, 'pending', ?3, ?3)",
                params![e.name, e.pool.metadata.name, now],
            )?;
            Some(tx.last_insert_rowid())
        } else {
            None
        };
        tx.commit()?;
        Ok(id)
    }

    /// Undoes an attach that failed before its node could run, in one
    /// transaction: the instance leaves the pool (`Detached`, kept, with the
    /// reason), the pool's count drops by one, pending attach intents of it
    /// end `failed`. Only an instance still counted in its pool is undone, so
    /// the count drops once: `(pool, from, to)`, or `None` when it had left.
    pub fn undo_attach(&self, name: &str, reason: &str) -> Result<Option<(String, i64, i64)>> {
        let now = now_ms();
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let row: Option<(String, String)> = tx
            .query_row(
                "SELECT pool, state FROM instances WHERE name = ?1",
                params![name],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?;
        tx.execute(
            "UPDATE intents SET status = 'failed', last_error = ?2, updated_ms = ?3 WHERE instance = ?1 AND action = 'attach' AND status = 'pending'",
            params![name, reason, now],
        )?;
        let Some((pool, _)) = row.filter(|(_, st)| {
            matches!(
                st.as_str(),
                state::PENDING | state::CREATING | state::RUNNING | state::FAILED
            )
        }) else {
            tx.commit()?;
            return Ok(None);
        };
        tx.execute(
            "UPDATE instances SET state = ?2, last_error = ?3, updated_ms = ?4 WHERE name = ?1",
            params![name, state::DETACHED, reason, now],
        )?;
        let doc: Option<String> = tx
            .query_row(
                "SELECT doc FROM pools WHERE name = ?1",
                params![pool],
                |r| r.get(0),
            )
            .optional()?;
        let counts = match doc {
            Some(doc) => {
                let mut p: NodePool = from_json(&doc)?;
                let from = p.spec.replicas;
                p.spec.replicas = (from - 1).max(0);
                tx.execute(
                    "UPDATE pools SET doc = ?2, updated_ms = ?3 WHERE name = ?1",
                    params![pool, to_json(&p)?, now],
                )?;
                (from, p.spec.replicas)
            }
            None => (0, 0),
        };
        tx.commit()?;
        Ok(Some((pool, counts.0, counts.1)))
    }

    /// An added instance re-imaged and booting: `Running`, and its join
    /// timeout counts from now (not from when the attach began). Only from
    /// `Creating`: a removal decided meanwhile wins.
    pub fn set_attached_running(&self, name: &str, ip: Option<&str>) -> Result<()> {
        let now = now_ms();
        self.conn().execute(
            "UPDATE instances SET ip = COALESCE(?2, ip), state = ?3, last_error = NULL, created_ms = ?4, updated_ms = ?4 WHERE name = ?1 AND state = ?5",
            params![name, ip, state::RUNNING, now, state::CREATING],
        )?;
        Ok(())
    }

    /// Marks an instance as added (records from before the `added` column).
    pub fn mark_added(&self, name: &str) -> Result<()> {
        self.conn().execute(
            "UPDATE instances SET added = 1 WHERE name = ?1 AND added = 0",
            params![name],
        )?;
        Ok(())
    }

    /// Marks instances for deletion and records their delete intents. An
    /// instance that already has a pending intent is left alone.
    pub fn add_delete_intents(&self, pool: &str, names: &[String], release: bool) -> Result<usize> {
        let now = now_ms();
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let mut added = 0;
        for name in names {
            // A pending create of the same instance is superseded by the delete.
            tx.execute(
                "UPDATE intents SET status = 'cancelled', updated_ms = ?2 WHERE instance = ?1 AND action = 'create' AND status = 'pending'",
                params![name, now],
            )?;
            let exists: bool = tx
                .query_row(
                    "SELECT 1 FROM intents WHERE instance = ?1 AND action = 'delete' AND status = 'pending'",
                    params![name],
                    |_| Ok(true),
                )
                .optional()?
                .unwrap_or(false);
            if exists {
                continue;
            }
            tx.execute(
                "UPDATE instances SET state = ?2, updated_ms = ?3 WHERE name = ?1",
                params![name, state::DELETING, now],
            )?;
            tx.execute(
                "INSERT INTO intents (action, instance, pool, release, status, created_ms, updated_ms) VALUES ('delete', ?1, ?2, ?3, 'pending', ?4, ?4)",
                params![name, pool, release as i64, now],
            )?;
            added += 1;
        }
        tx.commit()?;
        Ok(added)
    }

    pub fn pending_intents(&self) -> Result<Vec<IntentRecord>> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(
            "SELECT id, action, instance, pool, release, status, attempts, next_attempt_ms, last_error FROM intents WHERE status = 'pending' ORDER BY id",
        )?;
        let rows = stmt
            .query_map([], intent_row)?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }

    pub fn intent_status(&self, id: i64) -> Result<Option<String>> {
        Ok(self
            .conn()
            .query_row(
                "SELECT status FROM intents WHERE id = ?1",
                params![id],
                |r| r.get(0),
            )
            .optional()?)
    }

    pub fn finish_intent(&self, id: i64, status: &str, error: Option<&str>) -> Result<()> {
        self.conn().execute(
            "UPDATE intents SET status = ?2, last_error = ?3, updated_ms = ?4 WHERE id = ?1",
            params![id, status, error, now_ms()],
        )?;
        Ok(())
    }

    pub fn retry_intent(
        &self,
        id: i64,
        attempts: i64,
        next_attempt_ms: i64,
        error: &str,
    ) -> Result<()> {
        self.conn().execute(
            "UPDATE intents SET attempts = ?2, next_attempt_ms = ?3, last_error = ?4, updated_ms = ?5 WHERE id = ?1",
            params![id, attempts, next_attempt_ms, error, now_ms()],
        )?;
        Ok(())
    }

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

    pub fn set_instance_state(&self, name: &str, state: &str, error: Option<&str>) -> Result<()> {
        self.conn().execute(
            "UPDATE instances SET state = ?2, last_error = ?3, updated_ms = ?4 WHERE name = ?1",
            params![name, state, error, now_ms()],
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
            params![name, provider_id, ip, state::RUNNING, now_ms()],
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

    // ---- join tokens

    pub fn add_join_token(
        &self,
        token_hash: &str,
        token_id: &str,
        instance: &str,
        pool: &str,
        ttl_ms: i64,
    ) -> Result<()> {
        let now = now_ms();
        self.conn().execute(
            "INSERT INTO join_tokens (token_hash, token_id, instance, pool, created_ms, expires_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            params![token_hash, token_id, instance, pool, now, now + ttl_ms],
        )?;
        Ok(())
    }

    /// The (instance, pool) of a live token — unused and unexpired —
    /// without using it (checks that must pass before the token is spent).
    pub fn live_join_token(&self, token_hash: &str, now: i64) -> Result<Option<(String, String)>> {
        Ok(self
            .conn()
            .query_row(
                "SELECT instance, pool FROM join_tokens WHERE token_hash = ?1 AND used_ms IS NULL AND expires_ms > ?2",
                params![token_hash, now],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?)
    }

    /// Single use: the first redeem of a live token wins, atomically.
    pub fn redeem_join_token(&self, token_hash: &str, now: i64) -> Result<Redeem> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let row: Option<(String, String, i64, Option<i64>)> = tx
            .query_row(
                "SELECT instance, pool, expires_ms, used_ms FROM join_tokens WHERE token_hash = ?1",
                params![token_hash],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
            )
            .optional()?;
        let outcome = match row {
            None => Redeem::Unknown,
            Some((instance, _, _, Some(used_ms))) => Redeem::Used { instance, used_ms },
            Some((instance, _, expires_ms, None)) if expires_ms <= now => Redeem::Expired {
                instance,
                expires_ms,
            },
            Some((instance, pool, _, None)) => {
                tx.execute(
                    "UPDATE join_tokens SET used_ms = ?2 WHERE token_hash = ?1",
                    params![token_hash, now],
                )?;
                Redeem::Ok { instance, pool }
            }
        };
        tx.commit()?;
        Ok(outcome)
    }

    pub fn join_tokens(&self) -> Result<Vec<JoinTokenRecord>> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(
            "SELECT token_id, instance, pool, created_ms, expires_ms, used_ms FROM join_tokens ORDER BY created_ms",
        )?;
        let rows = stmt
            .query_map([], |r| {
                Ok(JoinTokenRecord {
                    token_id: r.get(0)?,
                    instance: r.get(1)?,
                    pool: r.get(2)?,
                    created_ms: r.get(3)?,
                    expires_ms: r.get(4)?,
                    used_ms: r.get(5)?,
                })
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }

    // ---- nodes and their timeline

    /// Appends a phase event and updates the node's current phase; the node
    /// row is created by its first event.
    pub fn record_phase_event(&self, instance: &InstanceRecord, event: &PhaseEvent) -> Result<()> {
        let outcome = serde_json::to_value(event.outcome)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        let error_code = event.error_code.map(|c| c.as_str().to_string());
        let now = now_ms();
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        tx.execute(
            "INSERT INTO timeline (node, instance, phase, outcome, reason, error_code, at_ms, duration_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            params![
                event.node,
                instance.name,
                event.phase.as_str(),
                outcome,
                event.reason,
                error_code,
                event.at_ms as i64,
                event.duration_ms.map(|d| d as i64)
            ],
        )?;
        let failed = outcome == "failed";
        tx.execute(
            "INSERT INTO nodes (name, instance, pool, status, phase, phase_outcome, error_code, error, created_ms, updated_ms)
             VALUES (?1, ?2, ?3, 'NotReady', ?4, ?5, ?6, ?7, ?8, ?8)
             ON CONFLICT(name) DO UPDATE SET phase = excluded.phase, phase_outcome = excluded.phase_outcome,
               error_code = CASE WHEN ?9 THEN excluded.error_code ELSE nodes.error_code END,
               error = CASE WHEN ?9 THEN excluded.error ELSE nodes.error END,
               updated_ms = excluded.updated_ms",
            params![
                event.node,
                instance.name,
                instance.pool,
                event.phase.as_str(),
                outcome,
                error_code,
                if failed { event.reason.clone() } else { None },
                now,
                failed
            ],
        )?;
        tx.commit()?;
        Ok(())
    }

    pub fn set_node_user_data(&self, name: &str, outcome: &str) -> Result<()> {
        self.conn().execute(
            "UPDATE nodes SET user_data = ?2 WHERE name = ?1",
            params![name, outcome],
        )?;
        Ok(())
    }

    pub fn set_node_status(&self, name: &str, status: &str) -> Result<()> {
        self.conn().execute(
            "UPDATE nodes SET status = ?2, updated_ms = ?3 WHERE name = ?1",
            params![name, status, now_ms()],
        )?;
        Ok(())
    }

    pub fn nodes(&self) -> Result<Vec<NodeRecord>> {
        let conn = self.conn();
        let sql = format!("SELECT {NODE_COLUMNS} FROM nodes ORDER BY created_ms, name");
        let mut stmt = conn.prepare_cached(&sql)?;
        let rows = stmt
            .query_map([], node_row)?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }

    /// A pool's instances by state and its nodes' progress, counted in SQL.
    pub fn pool_counts(&self, pool: &str) -> Result<PoolCounts> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(
            "SELECT state, COUNT(*) FROM instances WHERE pool = ?1 GROUP BY state",
        )?;
        let instances = stmt
            .query_map(params![pool], |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?))
            })?
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

    pub fn node(&self, name: &str) -> Result<Option<NodeRecord>> {
        let sql = format!("SELECT {NODE_COLUMNS} FROM nodes WHERE name = ?1");
        Ok(self
            .conn()
            .query_row(&sql, params![name], node_row)
            .optional()?)
    }

    pub fn timeline(&self, node: &str) -> Result<Vec<TimelineEntry>> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(
            "SELECT phase, outcome, reason, error_code, at_ms, duration_ms FROM timeline WHERE node = ?1 ORDER BY at_ms, id",
        )?;
        let rows = stmt
            .query_map(params![node], |r| {
                Ok(TimelineEntry {
                    phase: r.get(0)?,
                    outcome: r.get(1)?,
                    reason: r.get(2)?,
                    error_code: r.get(3)?,
                    at_ms: r.get(4)?,
                    duration_ms: r.get(5)?,
                })
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }

    // ---- events

    /// Records an event; one identical to an event of the last
    /// [`EVENT_AGGREGATION_WINDOW_MS`] (same type, object, reason and
    /// message) only counts on that one. Old events are pruned now and then
    /// ([`Store::prune_events`]).
    pub fn add_event(
        &self,
        event_type: &str,
        kind: &str,
        name: &str,
        reason: &str,
        message: &str,
    ) -> Result<()> {
        let now = now_ms();
        {
            let mut conn = self.conn();
            let tx = conn.transaction()?;
            let counted = tx.execute(
                "UPDATE events SET count = count + 1, last_ms = ?1 WHERE id = (
                   SELECT id FROM events WHERE object_name = ?4 AND reason = ?5 AND type = ?2
                     AND object_kind = ?3 AND message = ?6 AND last_ms >= ?7
                   ORDER BY id DESC LIMIT 1)",
                params![
                    now,
                    event_type,
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
                    params![now, event_type, kind, name, reason, message],
                )?;
            }
            tx.commit()?;
        }
        let written = self
            .events_written
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if written % EVENT_PRUNE_EVERY == EVENT_PRUNE_EVERY - 1 {
            self.prune_events(now)?;
        }
        Ok(())
    }

    pub fn set_event_retention(&self, retention: EventRetention) {
        *self
            .event_retention
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = retention;
    }

    /// Removes events last seen longer ago than the retention's age, then
    /// all but the newest `max_count`. Returns how many went.
    pub fn prune_events(&self, now: i64) -> Result<usize> {
        let retention = *self
            .event_retention
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let conn = self.conn();
        let old = conn.execute(
            "DELETE FROM events WHERE last_ms < ?1",
            params![now - retention.max_age_ms],
        )?;
        let over = conn.execute(
            "DELETE FROM events WHERE id IN (SELECT id FROM events ORDER BY last_ms DESC, id DESC LIMIT -1 OFFSET ?1)",
            params![retention.max_count.max(0)],
        )?;
        Ok(old + over)
    }

    /// The newest `limit` events, oldest first.
    pub fn events(&self, limit: i64) -> Result<Vec<EventRecord>> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(
            "SELECT id, at_ms, type, object_kind, object_name, reason, message, count, last_ms FROM
               (SELECT * FROM events ORDER BY last_ms DESC, id DESC LIMIT ?1) ORDER BY last_ms, id",
        )?;
        let rows = stmt
            .query_map(params![limit], |r| {
                Ok(EventRecord {
                    id: r.get(0)?,
                    at_ms: r.get(1)?,
                    event_type: r.get(2)?,
                    object_kind: r.get(3)?,
                    object_name: r.get(4)?,
                    reason: r.get(5)?,
                    message: r.get(6)?,
                    count: r.get(7)?,
                    last_ms: r.get(8)?,
                })
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }

    // ---- snapshots

    pub fn add_snapshot(&self, s: &SnapshotRecord) -> Result<()> {
        self.conn().execute(
            "INSERT INTO snapshots (id, pool, kubernetes_version, containerd_version, images, size_bytes, created_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            params![s.id, s.pool, s.kubernetes_version, s.containerd_version, to_json(&s.images)?, s.size_bytes, s.created_ms],
        )?;
        Ok(())
    }

    /// Whether a record was removed.
    pub fn delete_snapshot(&self, id: &str) -> Result<bool> {
        Ok(self
            .conn()
            .execute("DELETE FROM snapshots WHERE id = ?1", params![id])?
            > 0)
    }

    pub fn snapshots(&self) -> Result<Vec<SnapshotRecord>> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(
            "SELECT id, pool, kubernetes_version, containerd_version, images, size_bytes, created_ms FROM snapshots ORDER BY created_ms",
        )?;
        let rows = stmt
            .query_map([], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, String>(3)?,
                    r.get::<_, String>(4)?,
                    r.get::<_, i64>(5)?,
                    r.get::<_, i64>(6)?,
                ))
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        rows.into_iter()
            .map(
                |(
                    id,
                    pool,
                    kubernetes_version,
                    containerd_version,
                    images,
                    size_bytes,
                    created_ms,
                )| {
                    Ok(SnapshotRecord {
                        id,
                        pool,
                        kubernetes_version,
                        containerd_version,
                        images: from_json(&images)?,
                        size_bytes,
                        created_ms,
                    })
                },
            )
            .collect()
    }
}

const BUILD_COLUMNS: &str = "id, name, pool, builder_pool, builder_instance, images, keep_builder, status, step, error, snapshot_id, started_ms, finished_ms";

fn build_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<(SnapshotBuildRecord, String)> {
    Ok((
        SnapshotBuildRecord {
            id: r.get(0)?,
            name: r.get(1)?,
            pool: r.get(2)?,
            builder_pool: r.get(3)?,
            builder_instance: r.get(4)?,
            images: Vec::new(),
            keep_builder: r.get::<_, i64>(6)? != 0,
            status: r.get(7)?,
            step: r.get(8)?,
            error: r.get(9)?,
            snapshot_id: r.get(10)?,
            started_ms: r.get(11)?,
            finished_ms: r.get(12)?,
        },
        r.get(5)?,
    ))
}

fn with_images((mut b, images): (SnapshotBuildRecord, String)) -> Result<SnapshotBuildRecord> {
    b.images = from_json(&images)?;
    Ok(b)
}

impl Store {
    // ---- snapshot builds

    pub fn insert_snapshot_build(&self, b: &SnapshotBuildRecord) -> Result<()> {
        let sql = format!(
            "INSERT INTO snapshot_builds ({BUILD_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)"
        );
        self.conn().execute(
            &sql,
            params![
                b.id,
                b.name,
                b.pool,
                b.builder_pool,
                b.builder_instance,
                to_json(&b.images)?,
                b.keep_builder as i64,
                b.status,
                b.step,
                b.error,
                b.snapshot_id,
                b.started_ms,
                b.finished_ms
            ],
        )?;
        Ok(())
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
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        tx.execute(
            "INSERT INTO snapshot_build_steps (build, at_ms, step, message) VALUES (?1, ?2, ?3, ?4)",
            params![id, now_ms(), step, message],
        )?;
        if current {
            tx.execute(
                "UPDATE snapshot_builds SET step = ?2 WHERE id = ?1",
                params![id, step],
            )?;
        }
        tx.commit()?;
        Ok(())
    }

    pub fn set_snapshot_build_instance(&self, id: &str, instance: &str) -> Result<()> {
        self.conn().execute(
            "UPDATE snapshot_builds SET builder_instance = ?2 WHERE id = ?1",
            params![id, instance],
        )?;
        Ok(())
    }

    pub fn set_snapshot_build_snapshot(&self, id: &str, snapshot_id: &str) -> Result<()> {
        self.conn().execute(
            "UPDATE snapshot_builds SET snapshot_id = ?2 WHERE id = ?1",
            params![id, snapshot_id],
        )?;
        Ok(())
    }

    /// Ends a running build with `status`; false if it had already ended.
    pub fn finish_snapshot_build(
        &self,
        id: &str,
        status: &str,
        error: Option<&str>,
    ) -> Result<bool> {
        Ok(self.conn().execute(
            "UPDATE snapshot_builds SET status = ?2, error = ?3, finished_ms = ?4 WHERE id = ?1 AND status = ?5",
            params![id, status, error, now_ms(), build_state::RUNNING],
        )? > 0)
    }

    pub fn snapshot_build(&self, id: &str) -> Result<Option<SnapshotBuildRecord>> {
        let sql = format!("SELECT {BUILD_COLUMNS} FROM snapshot_builds WHERE id = ?1");
        self.conn()
            .query_row(&sql, params![id], build_row)
            .optional()?
            .map(with_images)
            .transpose()
    }

    /// Every build, oldest first.
    pub fn snapshot_builds(&self) -> Result<Vec<SnapshotBuildRecord>> {
        let conn = self.conn();
        let sql = format!("SELECT {BUILD_COLUMNS} FROM snapshot_builds ORDER BY started_ms, id");
        let mut stmt = conn.prepare_cached(&sql)?;
        let rows = stmt
            .query_map([], build_row)?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        rows.into_iter().map(with_images).collect()
    }

    pub fn snapshot_build_steps(&self, id: &str) -> Result<Vec<BuildStep>> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(
            "SELECT at_ms, step, message FROM snapshot_build_steps WHERE build = ?1 ORDER BY id",
        )?;
        let rows = stmt
            .query_map(params![id], |r| {
                Ok(BuildStep {
                    at_ms: r.get(0)?,
                    step: r.get(1)?,
                    message: r.get(2)?,
                })
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }
}

/// One instance's way to its first Ready and its node repair (see
/// `crate::repair`).
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
    pub repair_action: Option<String>,
    pub repair_at_ms: Option<i64>,
    /// The last hold message given as an event (so it is given once).
    pub repair_note: Option<String>,
}

impl Store {
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
                    repair_action: r.get(5)?,
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
                h.repair_action,
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
            params![state::DETACHED],
        )?)
    }
}

fn migrate(conn: &mut Connection) -> Result<()> {
    let current: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    let known = MIGRATIONS.len() as i64;
    if current > known {
        return Err(ServerError::Internal(format!(
            "the database has schema version {current}, newer than this knit server knows ({known}): use a newer knit"
        )));
    }
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(current as usize) {
        let tx = conn.transaction()?;
        tx.execute_batch(sql)?;
        tx.pragma_update(None, "user_version", (i + 1) as i64)?;
        tx.commit()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use knit_api::{NodePoolSpec, PhaseName, PhaseOutcome};

    #[test]
    fn migrates_an_empty_database_and_reopens() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("knit.db");
        let store = Store::open(&path).unwrap();
        assert_eq!(store.schema_version().unwrap(), MIGRATIONS.len() as i64);
        store
            .insert_pool(&NodePool::new("a", NodePoolSpec::default()))
            .unwrap();
        drop(store);
        let again = Store::open(&path).unwrap();
        assert_eq!(again.pools().unwrap().len(), 1);
    }

    #[test]
    fn migrates_forward_from_version_1() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("knit.db");
        {
            let conn = Connection::open(&path).unwrap();
            conn.execute_batch(MIGRATIONS[0]).unwrap();
            conn.pragma_update(None, "user_version", 1).unwrap();
            conn.execute(
                "INSERT INTO nodes (name, instance, pool, status, created_ms, updated_ms) VALUES ('n', 'i', 'p', 'Ready', 0, 0)",
                [],
            )
            .unwrap();
        }
        let store = Store::open(&path).unwrap();
        assert_eq!(store.schema_version().unwrap(), MIGRATIONS.len() as i64);
        assert_eq!(store.pool_counts("p").unwrap().ready, 1);
    }

    #[test]
    fn refuses_a_newer_schema() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("knit.db");
        {
            let conn = Connection::open(&path).unwrap();
            conn.pragma_update(None, "user_version", 99).unwrap();
        }
        let err = Store::open(&path).err().unwrap();
        assert!(err.to_string().contains("schema version 99"), "{err}");
    }

    #[test]
    fn snapshot_builds_keep_their_steps_across_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("knit.db");
        let store = Store::open(&path).unwrap();
        let b = SnapshotBuildRecord {
            id: "build-1".into(),
            name: "n".into(),
            pool: "p".into(),
            builder_pool: "p-snap-1".into(),
            builder_instance: None,
            images: vec!["docker.io/a:1".into()],
            keep_builder: true,
            status: build_state::RUNNING.into(),
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
        let store = Store::open(&path).unwrap();
        let got = store.snapshot_build("build-1").unwrap().unwrap();
        assert_eq!(got.step, "ready");
        assert_eq!(got.builder_instance.as_deref(), Some("p-snap-1-x"));
        assert_eq!(got.snapshot_id.as_deref(), Some("s-1"));
        assert_eq!(got.images, b.images);
        assert!(got.keep_builder);
        assert!(store
            .finish_snapshot_build("build-1", build_state::FAILED, Some("x"))
            .unwrap());
        // Ended once: a second end changes nothing.
        assert!(!store
            .finish_snapshot_build("build-1", build_state::SUCCEEDED, None)
            .unwrap());
        store
            .add_snapshot_build_step("build-1", "failed", "x", false)
            .unwrap();
        let all = store.snapshot_builds().unwrap();
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].status, build_state::FAILED);
        assert_eq!(all[0].step, "ready");
        assert!(all[0].finished_ms.is_some());
        let steps = store.snapshot_build_steps("build-1").unwrap();
        let names: Vec<&str> = steps.iter().map(|s| s.step.as_str()).collect();
        assert_eq!(names, vec!["ready", "failed"]);
    }

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

    #[test]
    fn join_tokens_are_single_use_and_expire() {
        let store = Store::open_in_memory().unwrap();
        store
            .add_join_token("h1", "abcdef", "i-1", "p", 60_000)
            .unwrap();
        store
            .add_join_token("h2", "ghijkl", "i-2", "p", -1)
            .unwrap();
        let now = now_ms();
        assert_eq!(
            store.redeem_join_token("h1", now).unwrap(),
            Redeem::Ok {
                instance: "i-1".into(),
                pool: "p".into()
            }
        );
        assert!(matches!(
            store.redeem_join_token("h1", now).unwrap(),
            Redeem::Used { .. }
        ));
        assert!(matches!(
            store.redeem_join_token("h2", now).unwrap(),
            Redeem::Expired { .. }
        ));
        assert_eq!(
            store.redeem_join_token("nope", now).unwrap(),
            Redeem::Unknown
        );
    }

    #[test]
    fn intents_and_timeline() {
        let store = Store::open_in_memory().unwrap();
        store
            .add_create_intents(
                "p",
                &[("p-a".into(), "t".into()), ("p-b".into(), "t".into())],
            )
            .unwrap();
        assert_eq!(store.pending_intents().unwrap().len(), 2);
        // Deleting a not-yet-created instance cancels its create.
        assert_eq!(
            store
                .add_delete_intents("p", &["p-b".into()], true)
                .unwrap(),
            1
        );
        assert_eq!(
            store
                .add_delete_intents("p", &["p-b".into()], true)
                .unwrap(),
            0
        );
        let pending = store.pending_intents().unwrap();
        let actions: Vec<(&str, &str)> = pending
            .iter()
            .map(|i| (i.action.as_str(), i.instance.as_str()))
            .collect();
        assert_eq!(actions, vec![("create", "p-a"), ("delete", "p-b")]);

        let instance = store.instance("p-a").unwrap().unwrap();
        let event = PhaseEvent {
            node: "local.i-1".into(),
            instance_id: "i-1".into(),
            phase: PhaseName::DataDisk,
            outcome: PhaseOutcome::Failed,
            reason: Some("no disk".into()),
            error_code: Some(knit_api::ErrorCode::FailDataDiskNotFound),
            at_ms: 5,
            duration_ms: Some(3),
        };
        store.record_phase_event(&instance, &event).unwrap();
        let node = store.node("local.i-1").unwrap().unwrap();
        assert_eq!(node.error_code.as_deref(), Some("FailDataDiskNotFound"));
        assert_eq!(node.phase_outcome.as_deref(), Some("failed"));
        assert_eq!(store.timeline("local.i-1").unwrap().len(), 1);
        store.remove_instance("p-a").unwrap();
        assert!(store.node("local.i-1").unwrap().is_none());
    }
}
