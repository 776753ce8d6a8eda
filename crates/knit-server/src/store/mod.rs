//! The control plane's state: one database — SQLite in the state
//! directory, or PostgreSQL shared by several servers — reached through
//! `knit_db`, its schema versioned (component `knit-server`) and migrated
//! forward at open.
//!
//! Every read goes through [`Store::read`] and every write through
//! [`Store::write`]: one transaction each, and the one place where a check
//! before every write belongs. A write's closure may run more than once on
//! PostgreSQL (a conflict with another server re-runs it), so closures only
//! touch the database, and never call another `Store` method.
//!
//! Every intent (create or delete an instance) is written here before the
//! reconciler acts on it, so a server killed at any point resumes from the
//! database without losing or duplicating an instance.

use crate::error::{Result, ServerError};
use knit_api::FieldError;
use knit_db::{Datastore, Db, DbError, Limits, Row, Tx};
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::str::FromStr;
use std::sync::Mutex;

mod api_tokens;
pub(crate) mod attach;
mod drains;
mod events;
pub(crate) mod fence;
mod instances;
mod intents;
mod leader;
mod nodes;
mod pools;
mod rollouts;
mod snapshots;
#[cfg(test)]
pub(crate) mod testing;
mod tokens;

// The record types at `crate::store::…`, where every caller finds them.
pub use api_tokens::{ApiTokenRecord, TokenCheck, LAST_USED_GRANULARITY_MS};
pub use attach::AttachRecord;
pub use drains::{DrainRecord, DrainStep};
pub use events::{EventRecord, EventRetention, EventSink, EVENT_AGGREGATION_WINDOW_MS};
pub use fence::{current_fence, Fence};
pub use instances::{InstanceHealth, InstanceRecord};
pub use intents::IntentRecord;
pub use leader::{Lease, ServerRecord};
pub use nodes::{nodes_by_instance, NodeRecord, TimelineEntry, MAX_TIMELINE_PER_NODE};
pub use pools::{PoolCounts, PoolRecord};
pub use rollouts::{PoolRevision, RolloutStop, TemplateCount, REVISION_HISTORY_LIMIT};
pub use snapshots::{BuildStep, SnapshotBuildRecord, SnapshotRecord};
pub use tokens::{Enrollment, JoinTokenRecord, Redeem};

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
    // Attach records and attach-command options, kept as JSON files under
    // `<state>/attach/` before: the step also imports those files.
    attach::SCHEMA,
    // Servers sharing the datastore, the leader lease, shared secrets,
    // and which server runs a snapshot build.
    leader::SCHEMA,
    // The drain of each node being removed and its steps, so that a
    // restarted server or the next leader resumes it.
    drains::SCHEMA,
    // Rollouts: pool generations, each instance's template hash (backfilled
    // with its pool's current one, so an upgrade rolls nothing), pool
    // revisions and stopped rollouts.
    rollouts::SCHEMA,
    // API tokens with roles; the admin token file is stored as the first
    // admin token at the next start (`Store::seed_first_admin_token`).
    api_tokens::SCHEMA,
    // The provider's kind of an instance's and an intent's last error
    // (`ProviderErrorKind`, NULL for any other error), so that its readers
    // (the autoscaler's out-of-resources report) decide on the kind, never
    // on the text.
    r#"
ALTER TABLE instances ADD COLUMN last_error_kind TEXT;
ALTER TABLE intents ADD COLUMN last_error_kind TEXT;
"#,
];

pub use knit_os::time::now_ms;

/// The component name of the store's schema version.
const COMPONENT: &str = "knit-server";

pub struct Store {
    db: Db,
    event_retention: Mutex<EventRetention>,
    events_written: std::sync::atomic::AtomicU64,
    /// Where each recorded event also goes once written (knit's node
    /// events published as Kubernetes Events: `crate::kube_events`).
    event_sink: std::sync::OnceLock<events::EventSink>,
}

fn to_json<T: Serialize>(value: &T) -> Result<String> {
    serde_json::to_string(value).map_err(|e| ServerError::Internal(format!("encode: {e}")))
}

fn from_json<T: for<'de> Deserialize<'de>>(text: &str) -> Result<T> {
    serde_json::from_str(text)
        .map_err(|e| ServerError::Internal(format!("stored document is unreadable: {e}")))
}

/// A state word of column `idx` as its enum. The columns hold the enums'
/// own words, so another word is a database this knit cannot read.
fn word<T: FromStr<Err = FieldError>>(r: &Row, idx: usize) -> Result<T> {
    let text: String = r.get(idx)?;
    parse_word(idx, &text)
}

/// [`word`] of a column that may be NULL.
fn opt_word<T: FromStr<Err = FieldError>>(r: &Row, idx: usize) -> Result<Option<T>> {
    let text: Option<String> = r.get(idx)?;
    text.map(|t| parse_word(idx, &t)).transpose()
}

fn parse_word<T: FromStr<Err = FieldError>>(idx: usize, text: &str) -> Result<T> {
    text.parse().map_err(|e: FieldError| {
        DbError::Column {
            index: idx,
            reason: format!("stored {e}"),
        }
        .into()
    })
}

impl Store {
    /// The SQLite file `path` (created if missing).
    pub fn open(path: &Path) -> Result<Store> {
        Store::open_datastore(&Datastore::Sqlite(path.to_path_buf()), Limits::default())
    }

    /// SQLite in memory (tests).
    pub fn open_in_memory() -> Result<Store> {
        Store::open_datastore(&Datastore::SqliteMemory, Limits::default())
    }

    /// `datastore` (SQLite or PostgreSQL), its schema migrated forward; a
    /// newer schema than this knit knows is refused.
    pub fn open_datastore(datastore: &Datastore, limits: Limits) -> Result<Store> {
        let db = Db::open(datastore, limits)?;
        // Servers before the attach tables kept their records as files
        // beside the SQLite file; a PostgreSQL datastore never had them.
        let legacy = match datastore {
            Datastore::Sqlite(path) => Some(attach::legacy_dir(path)),
            Datastore::SqliteMemory | Datastore::Postgres(_) => None,
        };
        let mut imported = None;
        db.migrate(COMPONENT, MIGRATIONS, |tx, step| {
            if MIGRATIONS[step] == attach::SCHEMA {
                imported = attach::import_legacy_files(tx, legacy.as_deref())?;
            }
            if MIGRATIONS[step] == rollouts::SCHEMA {
                rollouts::backfill(tx)?;
            }
            Ok::<_, ServerError>(())
        })?;
        // Only once the import is committed.
        if let Some(dir) = imported {
            attach::retire_legacy_dir(&dir);
        }
        Ok(Store {
            db,
            event_retention: Mutex::new(EventRetention::default()),
            events_written: std::sync::atomic::AtomicU64::new(0),
            event_sink: std::sync::OnceLock::new(),
        })
    }

    pub fn schema_version(&self) -> Result<i64> {
        Ok(self.db.schema_version(COMPONENT)?)
    }

    /// Every read of the store: `f` sees one moment of the database.
    fn read<T>(&self, f: impl FnMut(&mut Tx<'_>) -> Result<T>) -> Result<T> {
        self.db.read(f)
    }

    /// Every write of the store, in one transaction committed when `f`
    /// returns `Ok`. The single choke point of writes: a check that must
    /// hold for every write goes here. `f` may run more than once (on
    /// PostgreSQL a conflict re-runs it), so it only touches the database.
    ///
    /// Leader work (a task under `fence::fenced`, which `ha` starts) first proves, in the
    /// same transaction, that its lease is still the current one.
    fn write<T>(&self, mut f: impl FnMut(&mut Tx<'_>) -> Result<T>) -> Result<T> {
        match fence::current_fence() {
            Some(fence) => self.db.write(|tx| {
                leader::check_fence(tx, &fence.holder, fence.epoch)?;
                f(tx)
            }),
            None => self.db.write(f),
        }
    }

    /// Proves that the lease the current leader work runs under is still
    /// the current one, in a transaction that writes nothing; `Ok` outside
    /// leader work. Called right before a provider call that destroys
    /// something: a leader that lost its lease while it was paused must
    /// not release an instance the new leader made under the same name.
    pub fn prove_lease(&self) -> Result<()> {
        if fence::current_fence().is_none() {
            return Ok(());
        }
        self.write(|_| Ok(()))
    }

    /// A write that is no leader's work (the lease itself, heartbeats).
    fn write_unfenced<T>(&self, f: impl FnMut(&mut Tx<'_>) -> Result<T>) -> Result<T> {
        self.db.write(f)
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{each_store, on_both_backends};
    use super::*;
    use knit_api::{NodePool, NodePoolSpec};

    #[test]
    fn migrates_an_empty_database_and_reopens() {
        on_both_backends(|backend| {
            let store = backend.open();
            assert_eq!(store.schema_version().unwrap(), MIGRATIONS.len() as i64);
            store
                .insert_pool(&NodePool::new("a", NodePoolSpec::default()))
                .unwrap();
            drop(store);
            let again = backend.open();
            assert_eq!(again.schema_version().unwrap(), MIGRATIONS.len() as i64);
            assert_eq!(again.pools().unwrap().len(), 1);
        });
    }

    /// An SQLite file at `version` (the first `version` migrations), as an
    /// older server left it.
    fn sqlite_at_version(path: &Path, version: usize) -> Db {
        let db = Db::open(&Datastore::Sqlite(path.to_path_buf()), Limits::default()).unwrap();
        db.migrate(COMPONENT, &MIGRATIONS[..version], |_, _| {
            Ok::<_, DbError>(())
        })
        .unwrap();
        db
    }

    /// A database an older server wrote, at schema version 1, with a
    /// node: every later step runs over it (both backends).
    #[test]
    fn migrates_forward_from_version_1() {
        on_both_backends(|backend| {
            {
                let db = Db::open(&backend.datastore, Limits::default()).unwrap();
                db.migrate(COMPONENT, &MIGRATIONS[..1], |_, _| Ok::<_, DbError>(()))
                    .unwrap();
                db.write(|tx| {
                    tx.execute(
                        "INSERT INTO nodes (name, instance, pool, status, created_ms, updated_ms) VALUES ('n', 'i', 'p', 'Ready', 0, 0)",
                        &[],
                    )
                })
                .unwrap();
                assert_eq!(db.schema_version(COMPONENT).unwrap(), 1);
            }
            let store = backend.open();
            assert_eq!(store.schema_version().unwrap(), MIGRATIONS.len() as i64);
            assert_eq!(store.pool_counts("p").unwrap().ready, 1);
            // Migration 6 counted the Ready node as joined.
            assert!(store.instance_health().unwrap()["i"].joined_ms.is_some());
        });
    }

    /// Instances an older server made have no template hash: the rollout
    /// step gives each its pool's current one (and the pool its first
    /// revision), so that upgrading knit rolls nothing.
    #[test]
    fn the_rollout_step_backfills_hashes_so_an_upgrade_rolls_nothing() {
        on_both_backends(|backend| {
            let pool = NodePool::new("p", NodePoolSpec::default());
            let step = MIGRATIONS
                .iter()
                .position(|m| *m == rollouts::SCHEMA)
                .unwrap();
            {
                let db = Db::open(&backend.datastore, Limits::default()).unwrap();
                db.migrate(COMPONENT, &MIGRATIONS[..step], |_, _| Ok::<_, DbError>(()))
                    .unwrap();
                let doc = to_json(&pool).unwrap();
                db.write(|tx| {
                    tx.execute(
                        "INSERT INTO pools (name, doc, created_ms, updated_ms) VALUES ('p', ?1, 0, 0)",
                        knit_db::params![&doc],
                    )?;
                    tx.execute(
                        "INSERT INTO instances (name, pool, state, instance_type, created_ms, updated_ms) VALUES ('p-old', 'p', 'Running', 't', 0, 0)",
                        &[],
                    )
                })
                .unwrap();
            }
            let store = backend.open();
            let want = knit_api::update::pool_template_hash(
                &pool.spec,
                &knit_api::Cluster::default().spec.kubernetes_version,
            );
            assert_eq!(
                store.instance_hashes(Some("p")).unwrap()["p-old"],
                Some(want.clone())
            );
            let revisions = store.pool_revisions("p").unwrap();
            assert_eq!(revisions.len(), 1);
            assert_eq!(revisions[0].template_hash, want);
            let record = store.pool("p").unwrap().unwrap();
            assert_eq!(record.generation, 1);
        });
    }

    /// SQLite only: the version is the file's `user_version`.
    #[test]
    fn refuses_a_newer_schema() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("knit.db");
        {
            let db = sqlite_at_version(&path, 0);
            db.autocommit("PRAGMA user_version = 99").unwrap();
        }
        let err = Store::open(&path).err().unwrap();
        assert!(err.to_string().contains("schema version 99"), "{err}");
        assert_eq!(err.code(), "StoreError");
    }

    /// PostgreSQL: a database whose knit-server schema is newer than this
    /// knit is refused too, naming both versions.
    #[test]
    fn refuses_a_newer_schema_on_postgres() {
        let backend = testing::TestStore::postgres();
        drop(backend.open());
        let db = Db::open(&backend.datastore, Limits::default()).unwrap();
        db.write(|tx| {
            tx.execute(
                "UPDATE knit_schema SET version = 99 WHERE component = ?1",
                knit_db::params![COMPONENT],
            )
        })
        .unwrap();
        let err = Store::open_datastore(&backend.datastore, Limits::default())
            .err()
            .unwrap();
        assert!(err.to_string().contains("schema version 99"), "{err}");
    }

    /// Texts of the first column of `sql`'s rows.
    fn words(store: &Store, sql: &str) -> Vec<String> {
        store
            .db()
            .read(|tx| {
                tx.query(sql, &[])?
                    .iter()
                    .map(|r| r.get::<String>(0))
                    .collect::<std::result::Result<Vec<_>, DbError>>()
            })
            .unwrap()
    }

    /// The typed states are written as the words older servers wrote (and
    /// read back): a database moves between versions unchanged.
    #[test]
    fn typed_states_keep_their_words_in_the_columns() {
        each_store(typed_states_keep_their_words);
    }

    fn typed_states_keep_their_words(store: &Store) {
        use knit_api::state::{EventType, InstanceState, IntentStatus, NodeStatus};
        use knit_api::{PhaseEvent, PhaseName, PhaseOutcome};
        store
            .add_create_intents("p", &[("p-a".into(), "t".into())])
            .unwrap();
        let intent = store.pending_intents().unwrap().remove(0);
        store
            .finish_intent(intent.id, IntentStatus::Done, None)
            .unwrap();
        store
            .add_delete_intents("p", &["p-a".into()], false)
            .unwrap();
        store
            .set_instance_state("p-a", InstanceState::Detached, None)
            .unwrap();
        let instance = store.instance("p-a").unwrap().unwrap();
        let event = PhaseEvent {
            node: "n".into(),
            instance_id: "i".into(),
            phase: PhaseName::Hardening,
            outcome: PhaseOutcome::Skipped,
            reason: None,
            error_code: None,
            at_ms: 1,
            duration_ms: Some(1),
        };
        let failed = PhaseEvent {
            phase: PhaseName::Join,
            outcome: PhaseOutcome::Failed,
            error_code: Some(knit_api::ErrorCode::FailJoin),
            ..event.clone()
        };
        store.record_phase_event(&instance, &failed).unwrap();
        store.record_phase_event(&instance, &event).unwrap();
        store
            .put_instance_health(&InstanceHealth {
                instance: "p-a".into(),
                repair_action: Some(knit_api::state::RepairAction::RestartServices),
                ..InstanceHealth::default()
            })
            .unwrap();
        let fresh = store.node("n").unwrap().unwrap().status;
        store.set_node_status("n", NodeStatus::Unknown).unwrap();
        store
            .add_event(EventType::Warning, "Node", "n", "NodeUnknown", "gone")
            .unwrap();

        let words = |sql: &str| words(store, sql);
        assert_eq!(words("SELECT state FROM instances"), ["Detached"]);
        assert_eq!(
            words("SELECT action || ' ' || status FROM intents ORDER BY id"),
            ["create done", "delete pending"]
        );
        assert_eq!(fresh, NodeStatus::NotReady);
        assert_eq!(
            words("SELECT status || ' ' || phase_outcome FROM nodes"),
            ["Unknown skipped"]
        );
        assert_eq!(
            words("SELECT phase || ' ' || error_code FROM nodes"),
            ["hardening FailJoin"]
        );
        assert_eq!(
            words("SELECT phase || ' ' || outcome || ' ' || coalesce(error_code, '-') FROM timeline ORDER BY id"),
            ["join failed FailJoin", "hardening skipped -"]
        );
        assert_eq!(
            words("SELECT repair_action FROM instance_health"),
            ["restart-services"]
        );
        let node = store.node("n").unwrap().unwrap();
        assert_eq!(node.phase, Some(PhaseName::Hardening));
        assert_eq!(node.error_code, Some(knit_api::ErrorCode::FailJoin));
        let timeline = store.timeline("n").unwrap();
        assert_eq!(timeline[0].phase, PhaseName::Join);
        assert_eq!(timeline[0].error_code, Some(knit_api::ErrorCode::FailJoin));
        assert_eq!(
            store.instance_health().unwrap()["p-a"].repair_action,
            Some(knit_api::state::RepairAction::RestartServices)
        );
        assert_eq!(words("SELECT type FROM events"), ["Warning"]);
        assert!(store.node("n").unwrap().unwrap().initialized());
    }

    #[test]
    fn an_unknown_state_word_is_an_error_naming_the_field() {
        each_store(|store| {
            store
                .db()
                .write(|tx| {
                    tx.execute(
                        "INSERT INTO instances (name, pool, state, instance_type, created_ms, updated_ms) VALUES ('a', 'p', 'Sleeping', 't', 0, 0)",
                        &[],
                    )
                })
                .unwrap();
            let err = store.instances(None).unwrap_err().to_string();
            assert!(
                err.contains("instance.state: value \"Sleeping\" must be one of"),
                "{err}"
            );
            store
                .db()
                .write(|tx| {
                    tx.execute(
                        "INSERT INTO nodes (name, instance, pool, status, phase, created_ms, updated_ms) VALUES ('n', 'a', 'p', 'Ready', 'Join', 0, 0)",
                        &[],
                    )
                })
                .unwrap();
            let err = store.nodes().unwrap_err().to_string();
            assert!(
                err.contains("phase.name: value \"Join\" must be one of time-sync"),
                "{err}"
            );
        });
    }
}
