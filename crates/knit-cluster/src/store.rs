//! Durable object storage with one monotonically increasing
//! resourceVersion for the whole cluster, and the change feed that watches
//! read. Objects are kept as the JSON the API serves.
//!
//! Two datastores, through one SQL seam (knit-db):
//! - SQLite (one server, the default): this process is the only writer, so
//!   writes are serialized by `Core::state`'s lock and the watch history is
//!   filled as they commit.
//! - PostgreSQL (several servers share the cluster): the resourceVersion
//!   is assigned in the write transaction, which first takes a table lock
//!   every writer takes, so resourceVersion order is commit order on all
//!   servers. The object, its change log entry (`kube_changes`, trimmed to
//!   the watch history window), the resourceVersion and a `NOTIFY` on
//!   [`CHANGES_CHANNEL`] are written by one statement, with the
//!   resourceVersion this server expects (the one after the last change
//!   it knows); when another server wrote in between, the statement
//!   changes nothing and runs again with the stored one. A follower thread
//!   `LISTEN`s on its own connection and reads the changes other servers
//!   made into the same history and feed, in resourceVersion order, each
//!   once; it also reads every [`FOLLOW_FALLBACK`] (a notification lost
//!   with a connection; node Lease renewals, which notify nobody) and
//!   after each reconnect. Preconditions (a
//!   client's resourceVersion) are checked inside the write transaction.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

use knit_db::{params, Backend, Datastore, Db, DbError, Limits, Tx};
use serde_json::{json, Value};
use tokio::sync::broadcast;

use crate::error::{ApiStatus, ClusterError};
use crate::util;

/// Changes kept in memory by default: a watch may start from any
/// resourceVersion still in this window, and a list read at one (a paging
/// run's continue token); older ones get 410 Gone, as from etcd compaction.
pub const HISTORY: usize = 20_000;
const FEED_CAPACITY: usize = 8_192;
/// Largest stored object, serialized (etcd's default request limit,
/// 1.5 MiB): however an object is written (create, update, any patch).
pub const MAX_OBJECT_BYTES: usize = 1536 * 1024;
/// The channel every write but a node Lease's notifies (payload: its
/// resourceVersion).
pub const CHANGES_CHANNEL: &str = "knit_kube_changes";
/// How often a server sharing PostgreSQL reads the change log without a
/// notification (one lost with its connection; node Lease renewals,
/// which notify nobody), and waits before it
/// listens again after the listening connection failed.
pub const FOLLOW_FALLBACK: Duration = Duration::from_secs(1);
/// Taken first by every write transaction on PostgreSQL (see `commit`).
const WRITE_LOCK: &str = "LOCK TABLE kube_meta IN SHARE ROW EXCLUSIVE MODE";
/// The object and its change log entry written on PostgreSQL with the
/// resourceVersion ?4 (only if the stored one is ?4 - 1, else nothing is
/// written and no row returned), in one statement ending with `$last`.
macro_rules! shared_upsert {
    ($last:literal) => {
        concat!(
            "WITH next AS (UPDATE kube_meta SET value = ?4 WHERE key = 'rv' AND value = ?4 - 1 RETURNING value),
     object AS (INSERT INTO kube_objects (resource, namespace, name, rv, body) SELECT ?1, ?2, ?3, value, ?5 FROM next
         ON CONFLICT (resource, namespace, name) DO UPDATE SET rv = excluded.rv, body = excluded.body),
     change AS (INSERT INTO kube_changes (rv, kind, resource, namespace, name, object, previous) SELECT value, ?6, ?1, ?2, ?3, ?5, ?7 FROM next)
     ",
            $last
        )
    };
}
/// A write on PostgreSQL, in one statement: the object, its change log
/// entry and the notification (sent at commit).
const SHARED_UPSERT: &str =
    shared_upsert!("SELECT pg_notify('knit_kube_changes', CAST(value AS TEXT)) FROM next");
/// A node's heartbeat Lease written on PostgreSQL: [`SHARED_UPSERT`]
/// without the notification. 100 renewals a second at 1,000 nodes each
/// woke every server's listening connection, its follower thread and
/// PostgreSQL's notification queue; the other servers read them with the
/// next change that notifies, or within [`FOLLOW_FALLBACK`] (the node
/// lifecycle controller reads Leases only on its tick, seconds apart).
const SHARED_UPSERT_UNNOTIFIED: &str = shared_upsert!("SELECT value FROM next");
/// A deletion on PostgreSQL, as [`SHARED_UPSERT`].
const SHARED_DELETE: &str = "WITH next AS (UPDATE kube_meta SET value = ?4 WHERE key = 'rv' AND value = ?4 - 1 RETURNING value),
     gone AS (DELETE FROM kube_objects WHERE resource = ?1 AND namespace = ?2 AND name = ?3 AND EXISTS (SELECT 1 FROM next)),
     change AS (INSERT INTO kube_changes (rv, kind, resource, namespace, name, object, previous) SELECT value, ?6, ?1, ?2, ?3, ?5, ?7 FROM next)
     SELECT pg_notify('knit_kube_changes', CAST(value AS TEXT)) FROM next";
/// Changes read from the change log per query.
const FOLLOW_BATCH: usize = 1_000;
/// How long a node Lease renewal on PostgreSQL waits for other writes to
/// share its transaction (group commit, [`Batches`]). A kubelet renews
/// every 10 s and gives up after 10 s; a few milliseconds are nothing to
/// it, and at 1,000 nodes they gather about three renewals a transaction.
const LEASE_BATCH_WAIT: Duration = Duration::from_millis(20);
/// The change log is trimmed to the history window every this many writes.
const TRIM_EVERY: u64 = 256;

/// The schema, one step per version (knit-db's migrations). Version 1 is
/// the tables SQLite stores had before they were named `kube_*` (those are
/// moved in by the step); `kube_changes` is written on PostgreSQL only.
/// Version 2's work is PostgreSQL's alone, in [`compress_bodies_with_lz4`].
const SCHEMA: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS kube_objects (
         resource TEXT NOT NULL, namespace TEXT NOT NULL, name TEXT NOT NULL,
         rv INTEGER NOT NULL, body TEXT NOT NULL,
         PRIMARY KEY (resource, namespace, name));
     CREATE TABLE IF NOT EXISTS kube_meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
     CREATE TABLE IF NOT EXISTS kube_node_certs (
         serial TEXT PRIMARY KEY, node TEXT NOT NULL,
         not_after INTEGER NOT NULL, revoked_at INTEGER);
     CREATE INDEX IF NOT EXISTS kube_node_certs_node ON kube_node_certs (node);
     CREATE TABLE IF NOT EXISTS kube_changes (
         rv INTEGER PRIMARY KEY, kind TEXT NOT NULL,
         resource TEXT NOT NULL, namespace TEXT NOT NULL, name TEXT NOT NULL,
         object TEXT NOT NULL, previous TEXT)",
    "SELECT 1",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }

    fn parse(s: &str) -> Option<EventType> {
        match s {
            "ADDED" => Some(EventType::Added),
            "MODIFIED" => Some(EventType::Modified),
            "DELETED" => Some(EventType::Deleted),
            _ => None,
        }
    }
}

/// One change of one object.
#[derive(Debug)]
pub struct Change {
    pub kind: EventType,
    pub resource: String,
    pub namespace: String,
    pub name: String,
    pub rv: u64,
    pub object: Arc<Value>,
    /// The object before a modification (a filtered watch turns a change
    /// into ADDED or DELETED when the object enters or leaves its filter)
    /// or a deletion (a list at an earlier resourceVersion shows it).
    pub previous: Option<Arc<Value>>,
}

pub struct Store {
    core: Arc<Core>,
    /// Dropped with the store: the follower thread (PostgreSQL) ends.
    _stop_follower: Option<mpsc::Sender<()>>,
}

struct Core {
    db: Db,
    /// PostgreSQL: other servers write too (change log, follower).
    shared: bool,
    /// Changes kept in memory (and in the change log on PostgreSQL).
    history: usize,
    state: Mutex<State>,
    /// Signalled when a batch of writes ends (see [`Batches`]).
    batch_ended: Condvar,
    /// Signalled when a write that should not wait is queued, or a writer
    /// waits to write alone: a batch of Lease renewals waiting for more
    /// goes at once.
    batch_hurried: Condvar,
    /// `State::kept`, read without `state`.
    kept: Arc<RwLock<Kept>>,
    /// Revoked node client certificates: serial (hex) → node name. Read on
    /// every request with a client certificate, so not behind `state`.
    revoked: RwLock<HashMap<String, String>>,
}

/// What watches read, changed only with the lock held: every change up to
/// `rv`, in order, each once.
struct State {
    rv: u64,
    history: VecDeque<Arc<Change>>,
    /// Length of `history` at most (the store's window).
    keep: usize,
    /// resourceVersion before the oldest change in `history`.
    history_floor: u64,
    feed: broadcast::Sender<Arc<Change>>,
    /// One feed per resource for watches: a change wakes only the watches
    /// of its resource (1,000 nodes' pod watches are not woken by every
    /// Lease renewal).
    resource_feeds: HashMap<String, broadcast::Sender<Arc<Change>>>,
    /// Every object at `rv`, kept by the changes as they are pushed (the
    /// same lock as [`Core::kept`]).
    kept: Arc<RwLock<Kept>>,
    /// PostgreSQL: writes planned, not yet committed.
    batches: Batches,
}

/// Group commit on PostgreSQL. A write planned from memory does not hold
/// `State` through its round trip: it is planned under the lock from the
/// objects as every write planned before it leaves them, at the next
/// resourceVersion after theirs, and queued. Whoever finds no batch in
/// flight sends all those queued as one transaction (the statements in
/// one round trip, then the commit), without the lock; the writes queued
/// meanwhile go in the next. A batch is all or nothing: each statement
/// is made only if the stored resourceVersion is the one before its own,
/// and if one is not (another server wrote), the batch is rolled back and
/// each of its writes, and each planned after them, is planned again
/// alone from the datastore.
#[derive(Default)]
struct Batches {
    /// A batch is being written (by a writer not holding `State`).
    in_flight: bool,
    /// Writers waiting to write alone: no write joins a batch meanwhile
    /// (the batches would never end under load).
    alone: usize,
    /// Planned while it is: the next batch.
    open: Vec<Queued>,
    /// The resourceVersion of the last write planned (in flight or open).
    planned_upto: Option<u64>,
    /// The objects as the planned writes leave them, with the version of
    /// the last write of each.
    planned: HashMap<(String, String, String), (u64, Arc<Value>)>,
    /// Ended writes: ticket → the object written, or None (planned again
    /// alone).
    ended: HashMap<u64, Option<Value>>,
    next_ticket: u64,
    /// Writes made in batches of more than one (tests see that they are).
    #[cfg(test)]
    grouped: u64,
}

impl Batches {
    fn busy(&self) -> bool {
        self.in_flight || !self.open.is_empty()
    }

    /// The next batch is node Lease renewals only, and nobody waits to
    /// write alone: it may wait for more ([`LEASE_BATCH_WAIT`]).
    fn only_renewals(&self) -> bool {
        self.alone == 0
            && !self.open.is_empty()
            && self
                .open
                .iter()
                .all(|q| is_node_lease_of(&q.key.0, &q.key.1))
    }
}

/// A write planned for a batch.
struct Queued {
    ticket: u64,
    key: (String, String, String),
    rv: u64,
    kind: EventType,
    obj: Value,
    body: String,
    previous: Option<Value>,
}

/// The objects at one resourceVersion: the lists the controllers repeat
/// and the gets memory answers are read here, not from the datastore.
/// Behind a lock of its own, held only to look or to apply one change:
/// a reader never waits for a write's datastore I/O (which holds `State`),
/// so an async worker may read it.
struct Kept {
    rv: u64,
    /// `None` once this server missed changes (it fell behind the change
    /// log): lists and gets read the datastore again.
    objects: Option<Objects>,
}

/// Objects by (resource, namespace, name).
type Objects = BTreeMap<(String, String, String), Arc<Value>>;

/// Where a watch starts: every change after `rv`, or the current state
/// (as synthetic ADDED events) when `rv` is `None`.
pub struct WatchStart {
    pub initial: Vec<Arc<Change>>,
    pub feed: broadcast::Receiver<Arc<Change>>,
    pub rv: u64,
}

/// Objects of one list at one resourceVersion: (list key, object), sorted
/// by key.
pub struct Snapshot {
    pub rv: u64,
    pub items: Vec<(String, ListedBody)>,
    /// Objects at `rv` from the start key on, read or not.
    pub total: usize,
}

/// An object of a [`Snapshot`]: as stored (parsed only if it is served), or
/// as it was before a later change.
pub enum ListedBody {
    Stored(String),
    Kept(Arc<Value>),
}

impl ListedBody {
    pub fn value(&self) -> Result<Value, ClusterError> {
        match self {
            ListedBody::Stored(b) => parse(b),
            ListedBody::Kept(v) => Ok((**v).clone()),
        }
    }
}

/// Why a list at a resourceVersion cannot be served.
#[derive(Debug)]
pub enum SnapshotError {
    /// Older than the changes this server keeps (etcd's compaction).
    Compacted,
    /// Newer than the cluster's resourceVersion.
    Future {
        current: u64,
    },
    Api(ApiStatus),
}

/// A write decided inside its transaction.
enum Plan {
    Write {
        kind: EventType,
        obj: Value,
        previous: Option<Value>,
    },
    /// Nothing to write (a no-op update): the stored object.
    Unchanged(Value),
}

enum Outcome {
    Written {
        rv: u64,
        kind: EventType,
        obj: Value,
        previous: Option<Value>,
        revoked: Vec<String>,
    },
    Unchanged(Value),
}

fn too_large(resource: &str, name: &str, bytes: usize) -> ApiStatus {
    ApiStatus::new(
        axum::http::StatusCode::PAYLOAD_TOO_LARGE,
        "RequestEntityTooLarge",
        format!(
            "{resource} \"{name}\" would be {bytes} bytes; the limit for a stored object is {MAX_OBJECT_BYTES} bytes (1.5 MiB)"
        ),
    )
}

/// Ends a batch whose writer panicked: its writes, and those planned
/// after them, are made alone.
struct Unwinding<'c> {
    core: &'c Core,
    /// Empty once the batch was written (nothing to do).
    tickets: Vec<u64>,
}

impl Drop for Unwinding<'_> {
    fn drop(&mut self) {
        if self.tickets.is_empty() {
            return;
        }
        let mut state = self.core.lock();
        let batches = &mut state.batches;
        batches.in_flight = false;
        let open: Vec<u64> = batches.open.drain(..).map(|q| q.ticket).collect();
        for ticket in self.tickets.drain(..).chain(open) {
            batches.ended.insert(ticket, None);
        }
        batches.planned.clear();
        batches.planned_upto = None;
        self.core.batch_ended.notify_all();
    }
}

/// Why a batch was not written.
enum BatchFailed {
    /// The stored resourceVersion was not the one a write was planned
    /// after: another server wrote.
    Moved,
    Db(DbError),
}

impl From<DbError> for BatchFailed {
    fn from(e: DbError) -> Self {
        BatchFailed::Db(e)
    }
}

fn conflict(resource: &str, name: &str) -> ApiStatus {
    ApiStatus::conflict(format!(
        "Operation cannot be fulfilled on {resource} \"{name}\": the object has been modified; please apply your changes to the latest version and try again"
    ))
}

fn not_found(resource: &str, name: &str) -> ApiStatus {
    ApiStatus::not_found(format!("{resource} \"{name}\" not found"))
}

/// Identity fields are the server's, whatever the client sent.
fn keep_identity(base: &Value, next: &mut Value) {
    for key in ["uid", "creationTimestamp", "name", "namespace"] {
        let meta = util::meta_mut(next);
        match base["metadata"].get(key) {
            Some(v) => meta.insert(key.into(), v.clone()),
            None => meta.remove(key),
        };
    }
}

/// `next` equals `base` but for its resourceVersion: a no-op write, which
/// does not bump the resourceVersion (like Kubernetes).
fn same_as(base: &Value, next: &Value) -> bool {
    let mut cmp = next.clone();
    util::meta_mut(&mut cmp).insert(
        "resourceVersion".into(),
        base["metadata"]["resourceVersion"].clone(),
    );
    cmp == *base
}

impl Store {
    /// The SQLite store of one server (the default datastore).
    #[cfg(test)]
    pub fn open(path: &std::path::Path) -> Result<Store, ClusterError> {
        Store::open_datastore(&Datastore::Sqlite(path.to_path_buf()), Limits::default())
    }

    /// The store on `datastore`: SQLite (this server alone) or PostgreSQL
    /// (shared with the other servers on it, whose changes this store's
    /// watches follow).
    #[cfg(test)]
    pub fn open_datastore(datastore: &Datastore, limits: Limits) -> Result<Store, ClusterError> {
        Store::open_with_history(datastore, limits, HISTORY)
    }

    /// Like [`Store::open_datastore`], keeping the last `history` changes
    /// (at least 1) for watches and lists at an earlier resourceVersion.
    pub fn open_with_history(
        datastore: &Datastore,
        limits: Limits,
        history: usize,
    ) -> Result<Store, ClusterError> {
        let keep = history.max(1);
        let db = Db::open(datastore, limits)?;
        db.migrate("cluster", SCHEMA, |tx, step| -> Result<(), ClusterError> {
            match step {
                0 => {
                    adopt_unprefixed_tables(tx)?;
                    tx.execute(
                        "INSERT INTO kube_meta (key, value) VALUES ('rv', 0) ON CONFLICT (key) DO NOTHING",
                        &[],
                    )?;
                }
                1 => compress_bodies_with_lz4(tx)?,
                _ => {}
            }
            Ok(())
        })?;
        let shared = db.backend() == Backend::Postgres;
        db.write(|tx| -> Result<(), ClusterError> {
            // Node certificates issued before they were recorded at signing
            // are still on their CSRs.
            for csr in list_in(tx, "certificatesigningrequests", None)? {
                if let Some(c) = issued_node_cert(&csr) {
                    tx.execute(
                        "INSERT INTO kube_node_certs (serial, node, not_after) VALUES (?1, ?2, ?3) ON CONFLICT (serial) DO NOTHING",
                        params![c.serial, c.node, c.not_after],
                    )?;
                }
            }
            // Certificates that expired need no revocation any more.
            tx.execute(
                "DELETE FROM kube_node_certs WHERE not_after < ?1",
                params![util::now().unix_timestamp()],
            )?;
            Ok(())
        })?;
        let (revoked, rv, changes, objects) = db.read(|tx| -> Result<_, ClusterError> {
            let mut revoked = HashMap::new();
            for r in tx.query(
                "SELECT serial, node FROM kube_node_certs WHERE revoked_at IS NOT NULL",
                &[],
            )? {
                revoked.insert(r.get::<String>(0)?, r.get::<String>(1)?);
            }
            let rv = meta_rv(tx)?;
            // Shared: the watch history starts with the change log, so a
            // watch from a resourceVersion another server gave works here.
            let changes = if shared {
                changes_between(tx, 0, rv, i64::MAX)?.0
            } else {
                Vec::new()
            };
            let mut objects = Objects::new();
            for r in tx.query(
                "SELECT resource, namespace, name, body FROM kube_objects",
                &[],
            )? {
                objects.insert(
                    (r.get(0)?, r.get(1)?, r.get(2)?),
                    Arc::new(parse(&r.get::<String>(3)?)?),
                );
            }
            Ok((revoked, rv, changes, objects))
        })?;
        let mut history: VecDeque<Arc<Change>> = changes.into_iter().map(Arc::new).collect();
        while history.len() > keep {
            history.pop_front();
        }
        let contiguous = history.back().is_none_or(|c| c.rv == rv)
            && history.front().map_or(0, |c| c.rv) + history.len() as u64 == rv + 1;
        if !history.is_empty() && !contiguous {
            tracing::warn!(
                rv,
                "the change log does not end at the cluster's resourceVersion; watches start from it"
            );
            history.clear();
        }
        let history_floor = history.front().map_or(rv, |c| c.rv - 1);
        let (feed, _) = broadcast::channel(FEED_CAPACITY);
        let kept = Arc::new(RwLock::new(Kept {
            rv,
            objects: Some(objects),
        }));
        let core = Arc::new(Core {
            db,
            shared,
            history: keep,
            state: Mutex::new(State {
                rv,
                history,
                keep,
                history_floor,
                feed,
                resource_feeds: HashMap::new(),
                kept: kept.clone(),
                batches: Batches::default(),
            }),
            batch_ended: Condvar::new(),
            batch_hurried: Condvar::new(),
            kept,
            revoked: RwLock::new(revoked),
        });
        let stop = if shared {
            Some(spawn_follower(core.clone())?)
        } else {
            None
        };
        Ok(Store {
            core,
            _stop_follower: stop,
        })
    }

    /// Remember a node client certificate the CA issued, so that deleting
    /// the Node revokes it.
    pub fn record_node_cert(
        &self,
        serial: &str,
        node: &str,
        not_after: i64,
    ) -> Result<(), ClusterError> {
        // One round trip on PostgreSQL: the statement goes with the commit.
        self.core.db.write(|tx| -> Result<(), ClusterError> {
            tx.execute_then_commit(
                "INSERT INTO kube_node_certs (serial, node, not_after) VALUES (?1, ?2, ?3) ON CONFLICT (serial) DO NOTHING",
                params![serial, node, not_after],
            )?;
            Ok(())
        })
    }

    /// The node whose certificate with this serial was revoked, if it was
    /// (by this server, or by another one sharing the datastore).
    pub fn revoked_node(&self, serial: &str) -> Option<String> {
        self.core
            .revoked
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(serial)
            .cloned()
    }

    /// The newest resourceVersion this server's watches have seen.
    pub fn current_rv(&self) -> u64 {
        self.core.lock().rv
    }

    pub fn get(&self, resource: &str, ns: &str, name: &str) -> Result<Option<Value>, ClusterError> {
        // One statement (one round trip on PostgreSQL); parsed after.
        let body = self
            .core
            .db
            .query_once(GET_BODY, params![resource, ns, name])?
            .into_iter()
            .next()
            .map(|r| r.get::<String>(0))
            .transpose()?;
        body.map(|b| parse(&b)).transpose()
    }

    /// One object for a reader, no older than resourceVersion `min` (None:
    /// the newest), from memory when that is enough: always on SQLite
    /// (where memory is the datastore), on PostgreSQL when this server has
    /// seen `min` (a kubelet's `resourceVersion=0`, any version, as
    /// kube-apiserver serves it from its watch cache); otherwise read from
    /// the datastore. A read from memory never waits for a write's I/O.
    pub fn get_served(
        &self,
        resource: &str,
        ns: &str,
        name: &str,
        min: Option<u64>,
    ) -> Result<Option<Arc<Value>>, ClusterError> {
        {
            let kept = self.core.read_kept();
            if let Some(objects) = self.core.serving(&kept, min) {
                return Ok(objects
                    .get(&(resource.to_string(), ns.to_string(), name.to_string()))
                    .cloned());
            }
        }
        Ok(self.get(resource, ns, name)?.map(Arc::new))
    }

    /// One object as this server has it in memory, at whatever version it
    /// has seen (kube-apiserver's admission reads namespaces from its
    /// informer cache so); read from the datastore when memory lacks it
    /// and another server may have just created it.
    pub fn get_seen(
        &self,
        resource: &str,
        ns: &str,
        name: &str,
    ) -> Result<Option<Arc<Value>>, ClusterError> {
        match self.get_served(resource, ns, name, Some(0))? {
            None if !self.serves_from_memory(None) => self.get_served(resource, ns, name, None),
            seen => Ok(seen),
        }
    }

    /// Whether [`Store::get_served`] answers a read no older than `min`
    /// from memory (without waiting on the datastore).
    pub fn serves_from_memory(&self, min: Option<u64>) -> bool {
        self.core.serving(&self.core.read_kept(), min).is_some()
    }

    /// Whether a small write may be done on the caller's async worker now:
    /// on SQLite (a write is an append to the local write-ahead log, not an
    /// fsync: checkpoints run on a thread of their own, a commit's only
    /// when that thread falls far behind) when no write is
    /// in flight (the write would wait on it). On PostgreSQL a write waits
    /// on the network: never.
    pub fn writes_in_place(&self) -> bool {
        self.core.db.backend() == Backend::Sqlite && self.core.state.try_lock().is_ok()
    }

    /// All objects of a resource (in one namespace, or all when `ns` is None),
    /// sorted by namespace and name, with the resourceVersion they are at.
    /// From memory: the objects as of this server's newest resourceVersion
    /// (on PostgreSQL, another server's write of the last moments may not
    /// be read yet; its change follows on the feed, as from a watch cache).
    pub fn list(
        &self,
        resource: &str,
        ns: Option<&str>,
    ) -> Result<(Vec<Value>, u64), ClusterError> {
        if let Some((kept, rv)) = self.core.kept(resource, ns) {
            // Copied after the lock is let go.
            return Ok((kept.iter().map(|v| (**v).clone()).collect(), rv));
        }
        let (bodies, rv) = self.core.db.read(|tx| -> Result<_, ClusterError> {
            Ok((list_raw(tx, resource, ns)?, meta_rv(tx)?))
        })?;
        let items = bodies
            .iter()
            .map(|b| parse(b))
            .collect::<Result<Vec<_>, _>>()?;
        Ok((items, rv))
    }

    /// [`Store::list`] without its copy: the objects kept in memory are
    /// shared (a reader that only looks, such as the embedding process
    /// reading every Node's Ready condition each pass, copies nothing).
    /// Read from the datastore when nothing is kept.
    pub fn list_shared(
        &self,
        resource: &str,
        ns: Option<&str>,
    ) -> Result<(Vec<Arc<Value>>, u64), ClusterError> {
        if let Some(kept) = self.core.kept(resource, ns) {
            return Ok(kept);
        }
        let (items, rv) = self.list(resource, ns)?;
        Ok((items.into_iter().map(Arc::new).collect(), rv))
    }

    /// The objects of a resource (in one namespace, or all when `ns` is
    /// None) whose list key is `from` or after, sorted by key, as they were
    /// at resourceVersion `at` (the newest when None). A list key is the
    /// object's name, or `namespace/name` in a list across the namespaces
    /// of a `namespaced` resource (etcd's key under the list's prefix, as
    /// kube-apiserver pages it). With `want`, at least `want` objects (all
    /// when fewer remain) are read, not necessarily all: the datastore is
    /// read in key order, page by page.
    ///
    /// An earlier version is the stored objects with the changes after it
    /// undone, from the history: one older than the history is
    /// [`SnapshotError::Compacted`].
    pub fn list_snapshot(
        &self,
        resource: &str,
        ns: Option<&str>,
        namespaced: bool,
        at: Option<u64>,
        from: &str,
        want: Option<usize>,
    ) -> Result<Snapshot, SnapshotError> {
        let across = ns.is_none() && namespaced;
        let key_of = |namespace: &str, name: &str| -> String {
            if across {
                format!("{namespace}/{name}")
            } else {
                name.to_string()
            }
        };
        let api = |e: ClusterError| SnapshotError::Api(e.into());
        // Bytewise key order and comparison, as etcd's (PostgreSQL's
        // default collation may not be).
        let postgres = self.core.db.backend() == Backend::Postgres;
        let key_sql = match (across, postgres) {
            (false, false) => "name",
            (false, true) => "name COLLATE \"C\"",
            (true, false) => "(namespace || '/' || name)",
            (true, true) => "(namespace || '/' || name) COLLATE \"C\"",
        };
        let scope_sql = match ns {
            Some(_) => "namespace = ?2",
            None if namespaced => "namespace >= ?2",
            None => "namespace = ?2",
        };
        // Keys hold no NUL (PostgreSQL's text cannot): a start key with one
        // ("<last key>\0", as tokens have it) is every key after the part
        // before it.
        let (from_sql, cmp) = match from.split_once('\0') {
            Some((before, _)) => (before, ">"),
            None => (from, ">="),
        };
        let where_sql = format!("resource = ?1 AND {scope_sql} AND {key_sql} {cmp} ?3");
        let rows_sql =
            format!("SELECT namespace, name, body FROM kube_objects WHERE {where_sql} ORDER BY {key_sql} LIMIT ?4");
        let count_sql = format!("SELECT COUNT(*) FROM kube_objects WHERE {where_sql}");
        let mut at = at;
        // Rows read per round: the objects wanted, one more (is there a
        // next page?) and some for objects changed since `at`.
        let mut fetch = want.map(|w| w.saturating_add(33));
        loop {
            let limit = fetch.map_or(i64::MAX, |f| i64::try_from(f).unwrap_or(i64::MAX));
            let (rows, count, listed) = self
                .core
                .db
                .read(|tx| -> Result<_, ClusterError> {
                    let p = params![resource, ns.unwrap_or(""), from_sql, limit];
                    let rows = tx.query(&rows_sql, p)?;
                    let mut out = Vec::with_capacity(rows.len());
                    for r in rows {
                        let key = key_of(&r.get::<String>(0)?, &r.get::<String>(1)?);
                        out.push((key, r.get::<String>(2)?));
                    }
                    let count: u64 = tx.query_one(&count_sql, &p[..3])?.get(0)?;
                    Ok((out, count, meta_rv(tx)?))
                })
                .map_err(api)?;
            let truncated = fetch.is_some_and(|f| rows.len() >= f);
            let last_read = rows.last().map(|(k, _)| k.clone());
            let mut items: Vec<(String, ListedBody)> = rows
                .into_iter()
                .filter(|(k, _)| k.as_str() >= from)
                .map(|(k, b)| (k, ListedBody::Stored(b)))
                .collect();
            let mut total = i64::try_from(count).unwrap_or(i64::MAX);
            match at {
                None => {}
                Some(at) if at == listed => {}
                Some(at) if at > listed => return Err(SnapshotError::Future { current: listed }),
                Some(at) => {
                    let changes = self.changes_since(resource, ns, at, listed)?;
                    // Each key changed since `at` as it was then: before its
                    // first change since (absent if that change created it),
                    // and whether it is there now (after its last change).
                    let mut then: BTreeMap<String, (Option<Arc<Value>>, bool)> = BTreeMap::new();
                    for c in &changes {
                        let key = key_of(&c.namespace, &c.name);
                        if key.as_str() < from {
                            continue;
                        }
                        let now = c.kind != EventType::Deleted;
                        then.entry(key)
                            .and_modify(|(_, there)| *there = now)
                            .or_insert_with(|| {
                                let before = match c.kind {
                                    EventType::Added => None,
                                    // A deletion logged before deletions kept
                                    // the object before: the deleted object is
                                    // the nearest there is.
                                    _ => {
                                        Some(c.previous.clone().unwrap_or_else(|| c.object.clone()))
                                    }
                                };
                                (before, now)
                            });
                    }
                    for (before, now) in then.values() {
                        total += i64::from(before.is_some()) - i64::from(*now);
                    }
                    items.retain(|(k, _)| !then.contains_key(k));
                    items.extend(
                        then.into_iter().filter_map(|(k, (before, _))| {
                            before.map(|v| (k, ListedBody::Kept(v)))
                        }),
                    );
                }
            }
            items.sort_unstable_by(|a, b| a.0.cmp(&b.0));
            if truncated {
                // Past the last key read, objects are not known yet.
                if let Some(last) = &last_read {
                    items.retain(|(k, _)| k <= last);
                }
                if want.is_some_and(|w| items.len() <= w) {
                    // Too many objects changed since `at`: read more, at
                    // the same version.
                    at = Some(at.unwrap_or(listed));
                    fetch = fetch.map(|f| f.saturating_mul(4));
                    continue;
                }
            }
            return Ok(Snapshot {
                rv: at.unwrap_or(listed),
                items,
                total: usize::try_from(total.max(0)).unwrap_or(usize::MAX),
            });
        }
    }

    /// This resource's changes after `at` up to `listed` (a version this
    /// server's datastore read showed), from the history.
    fn changes_since(
        &self,
        resource: &str,
        ns: Option<&str>,
        at: u64,
        listed: u64,
    ) -> Result<Vec<Arc<Change>>, SnapshotError> {
        let core = &*self.core;
        let mut state = core.lock();
        if core.shared && state.rv < listed {
            core.pull(&mut state, Some(listed))
                .map_err(|e| SnapshotError::Api(e.into()))?;
        }
        if at < state.history_floor {
            return Err(SnapshotError::Compacted);
        }
        if state.rv < listed {
            return Err(SnapshotError::Api(ApiStatus::new(
                axum::http::StatusCode::SERVICE_UNAVAILABLE,
                "ServiceUnavailable",
                format!("this server has not read the changes up to resourceVersion {listed} yet; try again"),
            )));
        }
        Ok(state
            .history
            .iter()
            .filter(|c| {
                c.rv > at
                    && c.rv <= listed
                    && c.resource == resource
                    && ns.is_none_or(|n| n == c.namespace)
            })
            .cloned()
            .collect())
    }

    pub fn create(&self, resource: &str, ns: &str, mut obj: Value) -> Result<Value, ApiStatus> {
        let name = util::name_of(&obj).to_string();
        let meta = util::meta_mut(&mut obj);
        meta.insert("uid".into(), Value::String(util::new_uid()?));
        meta.insert(
            "creationTimestamp".into(),
            Value::String(util::now_rfc3339()),
        );
        meta.remove("deletionTimestamp");
        self.commit((resource, ns, &name), false, |_, current| {
            if current.is_some() {
                return Err(ApiStatus::already_exists(format!(
                    "{resource} \"{name}\" already exists"
                ))
                .with_details(json!({"name": name, "kind": resource})));
            }
            Ok(Plan::Write {
                kind: EventType::Added,
                obj: obj.clone(),
                previous: None,
            })
        })
    }

    /// Replace an object. With `expected_rv`, fails with 409 if the stored
    /// object changed since (optimistic concurrency, as Kubernetes does).
    /// `f` runs in the write transaction (again, should PostgreSQL ask for
    /// the transaction to be re-run), so it only computes.
    pub fn update(
        &self,
        resource: &str,
        ns: &str,
        name: &str,
        expected_rv: Option<u64>,
        mut f: impl FnMut(&Value) -> Result<Value, ApiStatus>,
    ) -> Result<Value, ApiStatus> {
        self.commit((resource, ns, name), false, |_, current| {
            let current = current.ok_or_else(|| not_found(resource, name))?;
            if expected_rv.is_some_and(|e| util::rv_of(current) != Some(e)) {
                return Err(conflict(resource, name));
            }
            let mut next = f(current)?;
            keep_identity(current, &mut next);
            if same_as(current, &next) {
                return Ok(Plan::Unchanged(current.clone()));
            }
            Ok(Plan::Write {
                kind: EventType::Modified,
                obj: next,
                previous: Some(current.clone()),
            })
        })
    }

    /// Like `update` without a precondition, with every object of `see`
    /// (cluster-wide) read in the same write transaction: a choice among
    /// them (a free pod CIDR) cannot collide with another writer's, on
    /// this server or another sharing the datastore.
    pub fn update_seeing(
        &self,
        resource: &str,
        ns: &str,
        name: &str,
        see: &str,
        mut f: impl FnMut(&Value, &[Arc<Value>]) -> Result<Value, ApiStatus>,
    ) -> Result<Value, ApiStatus> {
        self.commit((resource, ns, name), true, |tx, current| {
            let Some(tx) = tx else {
                return Err(ClusterError::Corrupt(format!(
                    "{resource} \"{name}\": a write that reads in its transaction was planned without one"
                ))
                .into());
            };
            let current = current.ok_or_else(|| not_found(resource, name))?;
            // The objects kept in memory (shared, not copied), if the
            // datastore is still at their resourceVersion inside the
            // transaction (where no other write can come between): then
            // they are what the datastore holds. Taken here, after the
            // batches in flight and under the store's lock, they are at
            // the version the write is planned at; taken before, any write
            // in between (a Lease renewal) meant reading every object from
            // the datastore instead.
            let kept = self.core.kept(see, None);
            let read;
            let others = match &kept {
                Some((objects, rv)) if meta_rv(tx)? == *rv => objects,
                _ => {
                    read = list_in(tx, see, None)?
                        .into_iter()
                        .map(Arc::new)
                        .collect::<Vec<_>>();
                    &read
                }
            };
            let mut next = f(current, others)?;
            keep_identity(current, &mut next);
            if same_as(current, &next) {
                return Ok(Plan::Unchanged(current.clone()));
            }
            Ok(Plan::Write {
                kind: EventType::Modified,
                obj: next,
                previous: Some(current.clone()),
            })
        })
    }

    /// Replace `base` (an object read earlier) by `next`, computed from it
    /// without holding the store: 409 if the object changed since `base`
    /// was read (the caller reads again and retries), 404 if it is gone.
    pub fn replace(
        &self,
        resource: &str,
        ns: &str,
        name: &str,
        base: &Value,
        mut next: Value,
    ) -> Result<Value, ApiStatus> {
        keep_identity(base, &mut next);
        const STORED_RV: &str =
            "SELECT rv FROM kube_objects WHERE resource = ?1 AND namespace = ?2 AND name = ?3";
        // The stored object's resourceVersion, None when it is gone.
        let check = |stored: Option<u64>| -> Result<(), ApiStatus> {
            let Some(stored) = stored else {
                return Err(not_found(resource, name));
            };
            if util::rv_of(base) != Some(stored) {
                return Err(conflict(resource, name));
            }
            Ok(())
        };
        // A no-op write does not bump the resourceVersion (like Kubernetes):
        // only checked, without a write transaction.
        if same_as(base, &next) {
            let stored = self
                .core
                .db
                .query_once(STORED_RV, params![resource, ns, name])?
                .into_iter()
                .next()
                .map(|r| r.get::<u64>(0))
                .transpose()?;
            check(stored)?;
            return Ok(base.clone());
        }
        self.commit((resource, ns, name), false, |_, current| {
            check(current.map(|c| util::rv_of(c).unwrap_or(0)))?;
            Ok(Plan::Write {
                kind: EventType::Modified,
                obj: next.clone(),
                previous: Some(base.clone()),
            })
        })
    }

    pub fn delete(&self, resource: &str, ns: &str, name: &str) -> Result<Value, ApiStatus> {
        self.delete_if(resource, ns, name, None)
    }

    /// Delete an object; with `expected_rv`, only if it is still at that
    /// resourceVersion (409 otherwise), checked in the write transaction.
    pub fn delete_if(
        &self,
        resource: &str,
        ns: &str,
        name: &str,
        expected_rv: Option<u64>,
    ) -> Result<Value, ApiStatus> {
        self.commit((resource, ns, name), false, |_, current| {
            let current = current.ok_or_else(|| not_found(resource, name))?;
            if expected_rv.is_some_and(|e| util::rv_of(current) != Some(e)) {
                return Err(conflict(resource, name));
            }
            // The object as it was before: a list at an earlier
            // resourceVersion (a paging run) still shows it.
            Ok(Plan::Write {
                kind: EventType::Deleted,
                obj: current.clone(),
                previous: Some(current.clone()),
            })
        })
    }

    /// Runs `decide` and the write it asks for in one write transaction,
    /// which assigns the next resourceVersion; then adds the change to the
    /// history and feed.
    /// `decide` is given the transaction when `reads_in_tx` (it reads
    /// there); otherwise it may be given none (a write planned for a batch).
    fn commit(
        &self,
        (resource, ns, name): (&str, &str, &str),
        reads_in_tx: bool,
        mut decide: impl FnMut(Option<&mut Tx<'_>>, Option<&Value>) -> Result<Plan, ApiStatus>,
    ) -> Result<Value, ApiStatus> {
        let core = &*self.core;
        if core.shared && !reads_in_tx {
            if let Some(written) = self.commit_batched((resource, ns, name), &mut decide)? {
                return Ok(written);
            }
        }
        let mut state = core.lock();
        if core.shared {
            // Alone: after the batches in flight and queued, so that
            // `known` is what the datastore holds unless another server
            // wrote.
            state.batches.alone += 1;
            core.batch_hurried.notify_one();
            while state.batches.busy() {
                state = core
                    .batch_ended
                    .wait(state)
                    .unwrap_or_else(|p| p.into_inner());
            }
            state.batches.alone -= 1;
        }
        let known = state.rv;
        // The object as this server knows it at `known` (outer None: not
        // kept), so that a write need not read it again. On SQLite that is
        // the datastore (this process writes alone, under this lock). On
        // PostgreSQL it is what the datastore held at `known`: a write
        // planned from it is made only if the datastore is still at
        // `known` (the write statement's own condition), any other plan
        // from it (a conflict, a no-op) is checked against the stored
        // resourceVersion, and when another server wrote since, the write
        // is planned again from the datastore.
        let remembered: Option<Option<Arc<Value>>> =
            core.read_kept().objects.as_ref().map(|objects| {
                objects
                    .get(&(resource.to_string(), ns.to_string(), name.to_string()))
                    .cloned()
            });
        // Ok(None): planned from memory that another server's write made
        // stale; plan again from the datastore.
        let mut attempt = |tx: &mut Tx<'_>,
                           kept: Option<Option<&Value>>|
         -> Result<Option<Outcome>, ApiStatus> {
            let read;
            let (current, from_memory) = match kept {
                Some(current) => (current, true),
                None => {
                    read = get_in(tx, resource, ns, name)?;
                    (read.as_ref(), false)
                }
            };
            let plan = decide(Some(&mut *tx), current);
            if from_memory
                && core.shared
                && !matches!(plan, Ok(Plan::Write { .. }))
                && meta_rv(tx)? != known
            {
                return Ok(None);
            }
            let (kind, mut obj, previous) = match plan? {
                Plan::Unchanged(current) => return Ok(Some(Outcome::Unchanged(current))),
                Plan::Write {
                    kind,
                    obj,
                    previous,
                } => (kind, obj, previous),
            };
            // PostgreSQL: the resourceVersion after the last change this
            // server knows, written with the object (checked there); SQLite:
            // this process is the only writer.
            let mut rv = known + 1;
            if !core.shared {
                rv = tx
                    .query_one(
                        "UPDATE kube_meta SET value = value + 1 WHERE key = 'rv' RETURNING value",
                        &[],
                    )?
                    .get(0)?;
            }
            util::meta_mut(&mut obj)
                .insert("resourceVersion".into(), Value::String(rv.to_string()));
            let mut body = obj.to_string();
            if kind != EventType::Deleted && body.len() > MAX_OBJECT_BYTES {
                return Err(too_large(resource, name, body.len()));
            }
            if core.shared && rv.is_multiple_of(TRIM_EVERY) && rv > core.history as u64 {
                tx.execute(
                    "DELETE FROM kube_changes WHERE rv <= ?1",
                    params![rv - core.history as u64],
                )?;
            }
            if core.shared {
                let sql = match kind {
                    EventType::Deleted => SHARED_DELETE,
                    _ if is_node_lease_of(resource, ns) => SHARED_UPSERT_UNNOTIFIED,
                    _ => SHARED_UPSERT,
                };
                let previous = previous.as_ref().map(Value::to_string);
                // Planned from memory, an object written is the last
                // statement: it goes with the commit in one round trip
                // (with the `BEGIN` and the lock too). A deletion has the
                // node's certificates to revoke after it.
                let last = from_memory && kind != EventType::Deleted;
                let mut expected = true;
                loop {
                    let p = params![
                        resource,
                        ns,
                        name,
                        rv,
                        body.as_str(),
                        kind.as_str(),
                        previous
                    ];
                    let written = if last {
                        tx.execute_then_commit(sql, p)?
                    } else {
                        tx.execute(sql, p)?
                    };
                    if written == 1 {
                        break;
                    }
                    if from_memory {
                        // Nothing written: planned again from the datastore.
                        return Ok(None);
                    }
                    // Another server wrote since this one's last known
                    // change (under the lock now, so the stored value
                    // stays): the next resourceVersion after it.
                    let stored = meta_rv(tx)?;
                    if !expected || stored + 1 == rv {
                        return Err(ClusterError::Corrupt(format!(
                            "resourceVersion {rv} not written with the stored one at {stored}"
                        ))
                        .into());
                    }
                    expected = false;
                    rv = stored + 1;
                    util::meta_mut(&mut obj)
                        .insert("resourceVersion".into(), Value::String(rv.to_string()));
                    body = obj.to_string();
                }
            } else if kind == EventType::Deleted {
                tx.execute(
                    "DELETE FROM kube_objects WHERE resource = ?1 AND namespace = ?2 AND name = ?3",
                    params![resource, ns, name],
                )?;
            } else {
                tx.execute(
                    "INSERT INTO kube_objects (resource, namespace, name, rv, body) VALUES (?1, ?2, ?3, ?4, ?5)
                     ON CONFLICT (resource, namespace, name) DO UPDATE SET rv = excluded.rv, body = excluded.body",
                    params![resource, ns, name, rv, body.as_str()],
                )?;
            }
            let mut revoked = Vec::new();
            if kind == EventType::Deleted && resource == "nodes" {
                // A removed node keeps no working credential: its client
                // certificates are revoked with the Node, atomically.
                tx.execute(
                    "UPDATE kube_node_certs SET revoked_at = ?2 WHERE node = ?1 AND revoked_at IS NULL",
                    params![name, util::now().unix_timestamp()],
                )?;
                for r in tx.query(
                    "SELECT serial FROM kube_node_certs WHERE node = ?1",
                    params![name],
                )? {
                    revoked.push(r.get::<String>(0)?);
                }
            }
            Ok(Some(Outcome::Written {
                rv,
                kind,
                obj,
                previous,
                revoked,
            }))
        };
        let unmade = || -> ApiStatus {
            ClusterError::Corrupt(format!(
                "{resource} \"{name}\": a write planned from the datastore was not made"
            ))
            .into()
        };
        let outcome = if core.shared {
            // Every writer on every server takes this lock first, before the
            // transaction's snapshot (in the round trip of the first
            // statement): writes follow one another without serialization
            // failures, and resourceVersion order is commit order (what the
            // followers rely on).
            let planned = match &remembered {
                Some(kept) => core
                    .db
                    .write_after(WRITE_LOCK, |tx| attempt(tx, Some(kept.as_deref())))?,
                None => None,
            };
            match planned {
                Some(outcome) => outcome,
                // Another server wrote since `known`: planned again from the
                // datastore, in a transaction of its own (the first one may
                // have ended with its statement).
                None => core
                    .db
                    .write_after(WRITE_LOCK, |tx| attempt(tx, None)?.ok_or_else(unmade))?,
            }
        } else {
            core.db.write(|tx| {
                let kept = remembered.as_ref().map(|kept| kept.as_deref());
                attempt(tx, kept)?.ok_or_else(unmade)
            })?
        };
        let (rv, kind, obj, previous, revoked) = match outcome {
            Outcome::Unchanged(current) => return Ok(current),
            Outcome::Written {
                rv,
                kind,
                obj,
                previous,
                revoked,
            } => (rv, kind, obj, previous, revoked),
        };
        if !revoked.is_empty() {
            tracing::info!(
                node = name,
                certificates = revoked.len(),
                "node deleted: its client certificates are revoked"
            );
            core.revoke(revoked.into_iter().map(|s| (s, name.to_string())));
        }
        if core.shared && rv > state.rv + 1 {
            // Other servers' changes committed before this one: theirs first.
            if let Err(e) = core.pull(&mut state, Some(rv - 1)) {
                tracing::warn!(code = e.code(), error = %e, rv, "reading other servers' changes failed; the follower adds them and this one");
            }
        }
        if !core.shared || rv == state.rv + 1 {
            state.push(Arc::new(Change {
                kind,
                resource: resource.to_string(),
                namespace: ns.to_string(),
                name: name.to_string(),
                rv,
                object: Arc::new(obj.clone()),
                previous: previous.map(Arc::new),
            }));
        }
        Ok(obj)
    }

    /// PostgreSQL: the write planned from memory (as the writes planned
    /// before it leave the object) and made in a batch (see [`Batches`]).
    /// None when it is to be made alone: memory lacks the objects, the
    /// plan is no write, an error or a deletion (a Node's certificates are
    /// revoked in its transaction), or its batch was not written.
    fn commit_batched(
        &self,
        (resource, ns, name): (&str, &str, &str),
        decide: &mut impl FnMut(Option<&mut Tx<'_>>, Option<&Value>) -> Result<Plan, ApiStatus>,
    ) -> Result<Option<Value>, ApiStatus> {
        let core = &*self.core;
        let key = (resource.to_string(), ns.to_string(), name.to_string());
        let mut state = core.lock();
        if state.batches.alone > 0 {
            return Ok(None);
        }
        let base = match state.batches.planned.get(&key) {
            Some((_, planned)) => Some(planned.clone()),
            None => match &core.read_kept().objects {
                Some(objects) => objects.get(&key).cloned(),
                None => return Ok(None),
            },
        };
        let Ok(Plan::Write {
            kind,
            mut obj,
            previous,
        }) = decide(None, base.as_deref())
        else {
            return Ok(None);
        };
        if kind == EventType::Deleted {
            return Ok(None);
        }
        let rv = state.batches.planned_upto.unwrap_or(state.rv) + 1;
        util::meta_mut(&mut obj).insert("resourceVersion".into(), Value::String(rv.to_string()));
        let body = obj.to_string();
        if body.len() > MAX_OBJECT_BYTES {
            return Err(too_large(resource, name, body.len()));
        }
        let batches = &mut state.batches;
        let ticket = batches.next_ticket;
        batches.next_ticket += 1;
        batches.planned_upto = Some(rv);
        batches
            .planned
            .insert(key.clone(), (rv, Arc::new(obj.clone())));
        batches.open.push(Queued {
            ticket,
            key,
            rv,
            kind,
            obj,
            body,
            previous,
        });
        if !is_node_lease_of(resource, ns) {
            core.batch_hurried.notify_one();
        }
        loop {
            if let Some(ended) = state.batches.ended.remove(&ticket) {
                return Ok(ended);
            }
            if !state.batches.in_flight && !state.batches.open.is_empty() {
                state = self.write_batch(state);
                continue;
            }
            state = core
                .batch_ended
                .wait(state)
                .unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Writes the queued batch as one transaction, `State` not held
    /// meanwhile; then adds its changes, or has its writes (and those
    /// planned after them) planned again alone.
    fn write_batch<'s>(&'s self, mut state: MutexGuard<'s, State>) -> MutexGuard<'s, State> {
        let core = &*self.core;
        state.batches.in_flight = true;
        // Node Lease renewals wait a moment for others to share their
        // transaction: at 1,000 nodes 100 come a second, one at a time, and
        // each transaction costs PostgreSQL more than its row. Writes
        // queued meanwhile join this batch; any other write, or a writer
        // waiting to write alone, ends the wait (they are wanted now).
        let until = Instant::now() + LEASE_BATCH_WAIT;
        while state.batches.only_renewals() {
            let Some(left) = until.checked_duration_since(Instant::now()) else {
                break;
            };
            state = match core.batch_hurried.wait_timeout(state, left) {
                Ok((state, _)) => state,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
        let batch = std::mem::take(&mut state.batches.open);
        drop(state);
        // Should writing panic, the writers waiting are not left waiting.
        let mut unwinding = Unwinding {
            core,
            tickets: batch.iter().map(|q| q.ticket).collect(),
        };
        let written = self.write_queued(&batch);
        unwinding.tickets.clear();
        drop(unwinding);
        let mut state = core.lock();
        state.batches.in_flight = false;
        match written {
            Ok(true) => {
                #[cfg(test)]
                if batch.len() > 1 {
                    state.batches.grouped += batch.len() as u64;
                }
                for q in batch {
                    if q.rv > state.rv + 1 {
                        // Other servers' changes committed before: theirs first.
                        if let Err(e) = core.pull(&mut state, Some(q.rv - 1)) {
                            tracing::warn!(code = e.code(), error = %e, rv = q.rv, "reading other servers' changes failed; the follower adds them and this one");
                        }
                    }
                    // Not when the follower read it from the change log first.
                    if q.rv == state.rv + 1 {
                        state.push(Arc::new(Change {
                            kind: q.kind,
                            resource: q.key.0.clone(),
                            namespace: q.key.1.clone(),
                            name: q.key.2.clone(),
                            rv: q.rv,
                            object: Arc::new(q.obj.clone()),
                            previous: q.previous.map(Arc::new),
                        }));
                    }
                    let batches = &mut state.batches;
                    if batches
                        .planned
                        .get(&q.key)
                        .is_some_and(|(rv, _)| *rv == q.rv)
                    {
                        batches.planned.remove(&q.key);
                    }
                    batches.ended.insert(q.ticket, Some(q.obj));
                }
                if state.batches.open.is_empty() {
                    state.batches.planned_upto = None;
                }
            }
            outcome => {
                if let Err(e) = outcome {
                    tracing::debug!(code = e.reason, error = %e.message, "a batch of writes failed; each is made alone");
                }
                let batches = &mut state.batches;
                let open = std::mem::take(&mut batches.open);
                for q in batch.iter().chain(&open) {
                    batches.ended.insert(q.ticket, None);
                }
                batches.planned.clear();
                batches.planned_upto = None;
            }
        }
        core.batch_ended.notify_all();
        state
    }

    /// One transaction: every write of `batch` (true), or none (false:
    /// another server wrote since they were planned).
    fn write_queued(&self, batch: &[Queued]) -> Result<bool, ApiStatus> {
        let core = &*self.core;
        let previous: Vec<Option<String>> = batch
            .iter()
            .map(|q| q.previous.as_ref().map(Value::to_string))
            .collect();
        let params: Vec<Vec<knit_db::Value>> = batch
            .iter()
            .zip(&previous)
            .map(|(q, previous)| {
                params![
                    q.key.0,
                    q.key.1,
                    q.key.2,
                    q.rv,
                    q.body.as_str(),
                    q.kind.as_str(),
                    previous
                ]
                .to_vec()
            })
            .collect();
        let mut statements: Vec<(&str, &[knit_db::Value])> = batch
            .iter()
            .zip(&params)
            .map(|(q, params)| {
                let sql = if is_node_lease_of(&q.key.0, &q.key.1) {
                    SHARED_UPSERT_UNNOTIFIED
                } else {
                    SHARED_UPSERT
                };
                (sql, params.as_slice())
            })
            .collect();
        let trims: Vec<Vec<knit_db::Value>> = batch
            .iter()
            .filter(|q| q.rv.is_multiple_of(TRIM_EVERY) && q.rv > core.history as u64)
            .map(|q| params![q.rv - core.history as u64].to_vec())
            .collect();
        for trim in &trims {
            statements.push(("DELETE FROM kube_changes WHERE rv <= ?1", trim.as_slice()));
        }
        let outcome = core.db.write_after(WRITE_LOCK, |tx| {
            if let [(sql, params)] = statements.as_slice() {
                // One write: with the commit in one round trip (nothing is
                // written if its resourceVersion is not the next).
                return Ok(tx.execute_then_commit(sql, params)? == 1);
            }
            let written = tx.execute_all(&statements)?;
            if written[..batch.len()].iter().all(|&n| n == 1) {
                Ok(true)
            } else {
                Err(BatchFailed::Moved)
            }
        });
        match outcome {
            Ok(all) => Ok(all),
            Err(BatchFailed::Moved) => Ok(false),
            Err(BatchFailed::Db(e)) => Err(ClusterError::from(e).into()),
        }
    }

    /// Start a watch of `resource` atomically with respect to writes: no
    /// change is lost or seen twice between `initial` and `feed`.
    pub fn watch(
        &self,
        resource: &str,
        ns: Option<&str>,
        from: Option<u64>,
    ) -> Result<WatchStart, ApiStatus> {
        let core = &*self.core;
        let mut state = core.lock();
        let wanted = |c: &Change| c.resource == resource && ns.is_none_or(|n| n == c.namespace);
        let initial = match from {
            None => {
                let (items, listed) = core.db.read(|tx| -> Result<_, ClusterError> {
                    Ok((list_in(tx, resource, ns)?, meta_rv(tx)?))
                })?;
                if core.shared && listed > state.rv {
                    // The feed continues from the listing's resourceVersion.
                    core.pull(&mut state, Some(listed))?;
                }
                let mut initial: Vec<Arc<Change>> = items
                    .into_iter()
                    .map(|obj| {
                        Arc::new(Change {
                            kind: EventType::Added,
                            resource: resource.to_string(),
                            namespace: util::namespace_of(&obj).to_string(),
                            name: util::name_of(&obj).to_string(),
                            rv: util::rv_of(&obj).unwrap_or(0),
                            object: Arc::new(obj),
                            previous: None,
                        })
                    })
                    .collect();
                initial.extend(
                    state
                        .history
                        .iter()
                        .filter(|c| c.rv > listed && wanted(c))
                        .cloned(),
                );
                initial
            }
            Some(rv) => {
                // `rv` may come from another server, ahead of this one: its
                // changes up to there first. One this server has seen needs
                // no read (the history holds what followed it, the feed
                // the rest): a kubelet's watches start from a list of this
                // server's, and 2,000 reads under this lock slowed a join.
                if core.shared && rv > state.rv {
                    if let Err(e) = core.pull(&mut state, None) {
                        tracing::debug!(code = e.code(), error = %e, "watch: reading other servers' changes failed; the follower adds them");
                    }
                }
                if rv < state.history_floor {
                    return Err(ApiStatus::gone(format!(
                        "too old resource version: {rv} ({})",
                        state.history_floor
                    )));
                }
                state
                    .history
                    .iter()
                    .filter(|c| c.rv > rv && wanted(c))
                    .cloned()
                    .collect()
            }
        };
        Ok(WatchStart {
            initial,
            feed: state
                .resource_feeds
                .entry(resource.to_string())
                .or_insert_with(|| broadcast::channel(FEED_CAPACITY).0)
                .subscribe(),
            rv: state.rv,
        })
    }

    /// Every change but the node Leases' (`kube-node-lease`), for the
    /// built-in controllers. The node lifecycle check reads the Leases on
    /// its own tick, as kube-controller-manager's does: a renewal wakes no
    /// controller (100 a second at 1,000 nodes). Watches of Leases have
    /// every change. The feed closes when this server missed changes (it
    /// was further behind the others than the change log keeps): subscribe
    /// again and list.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Change>> {
        self.core.lock().feed.subscribe()
    }
}

impl Core {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves the database consistent (each
        // write is one transaction), so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The objects kept in memory if they answer a read no older than
    /// `min` (None: the newest): always on SQLite, where this process is
    /// the only writer; on PostgreSQL once this server has seen `min`.
    fn serving<'s>(&self, kept: &'s Kept, min: Option<u64>) -> Option<&'s Objects> {
        let fresh = !self.shared || min.is_some_and(|min| kept.rv >= min);
        kept.objects.as_ref().filter(|_| fresh)
    }

    fn read_kept(&self) -> std::sync::RwLockReadGuard<'_, Kept> {
        // Changed one change at a time, each applied whole: a poisoned
        // lock still holds a consistent map.
        self.kept.read().unwrap_or_else(|p| p.into_inner())
    }

    /// The objects of a resource kept in memory (in one namespace, or all),
    /// sorted by namespace and name, and their resourceVersion.
    fn kept(&self, resource: &str, ns: Option<&str>) -> Option<(Vec<Arc<Value>>, u64)> {
        let kept = self.read_kept();
        let objects = kept.objects.as_ref()?;
        let from = (
            resource.to_string(),
            ns.unwrap_or("").to_string(),
            String::new(),
        );
        let items = objects
            .range(from..)
            .take_while(|((r, n, _), _)| r == resource && ns.is_none_or(|ns| ns == n))
            .map(|(_, v)| v.clone())
            .collect();
        Some((items, kept.rv))
    }

    fn revoke(&self, certs: impl IntoIterator<Item = (String, String)>) {
        let mut set = self.revoked.write().unwrap_or_else(|p| p.into_inner());
        set.extend(certs);
    }

    /// Adds the changes after `state.rv` (up to `upto`) from the change
    /// log: other servers' changes, in resourceVersion order.
    fn pull(&self, state: &mut State, upto: Option<u64>) -> Result<(), ClusterError> {
        let upto = upto.unwrap_or(i64::MAX as u64);
        loop {
            let after = state.rv;
            if after >= upto {
                return Ok(());
            }
            let (changes, revoked) = self
                .db
                .read(|tx| changes_between(tx, after, upto, FOLLOW_BATCH as i64))?;
            let n = changes.len();
            self.revoke(revoked);
            for change in changes {
                if change.rv != state.rv + 1 {
                    // Trimmed before this server read it: watches cannot be
                    // told what they missed. Their feed ends (they list
                    // again) and older resourceVersions are 410 Gone.
                    tracing::error!(
                        from = state.rv,
                        to = change.rv,
                        "this server fell behind the change log: its watches start over"
                    );
                    state.history.clear();
                    state.history_floor = change.rv - 1;
                    state.feed = broadcast::channel(FEED_CAPACITY).0;
                    state.resource_feeds.clear();
                    state
                        .kept
                        .write()
                        .unwrap_or_else(|p| p.into_inner())
                        .objects = None;
                }
                state.push(Arc::new(change));
            }
            if n < FOLLOW_BATCH {
                return Ok(());
            }
        }
    }
}

impl State {
    fn push(&mut self, change: Arc<Change>) {
        if self.history.len() >= self.keep {
            if let Some(old) = self.history.pop_front() {
                self.history_floor = old.rv;
            }
        }
        self.rv = change.rv;
        {
            let mut kept = self.kept.write().unwrap_or_else(|p| p.into_inner());
            kept.rv = change.rv;
            if let Some(objects) = &mut kept.objects {
                let key = (
                    change.resource.clone(),
                    change.namespace.clone(),
                    change.name.clone(),
                );
                match change.kind {
                    EventType::Deleted => objects.remove(&key),
                    _ => objects.insert(key, change.object.clone()),
                };
            }
        }
        self.history.push_back(change.clone());
        // No receiver is not an error: nobody watches yet.
        if let Some(f) = self.resource_feeds.get(&change.resource) {
            if f.receiver_count() == 0 {
                self.resource_feeds.remove(&change.resource);
            } else {
                let _ = f.send(change.clone());
            }
        }
        if !is_node_lease(&change) {
            let _ = self.feed.send(change);
        }
    }
}

/// The namespace of the Leases kubelets renew as their heartbeat.
pub const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";

/// A node's heartbeat Lease: 100 renewals a second at 1,000 nodes, kept
/// out of the controllers' feed (see [`Store::subscribe`]).
fn is_node_lease(c: &Change) -> bool {
    is_node_lease_of(&c.resource, &c.namespace)
}

fn is_node_lease_of(resource: &str, namespace: &str) -> bool {
    resource == "leases" && namespace == NODE_LEASE_NAMESPACE
}

/// The thread that reads other servers' changes when notified (and every
/// [`FOLLOW_FALLBACK`]); it ends when the returned sender is dropped.
fn spawn_follower(core: Arc<Core>) -> Result<mpsc::Sender<()>, ClusterError> {
    let (stop, stopped) = mpsc::channel::<()>();
    let mut listener = core.db.listener(CHANGES_CHANNEL);
    std::thread::Builder::new()
        .name("knit-cluster-follow".into())
        .spawn(move || {
            let mut failing = false;
            let mut deaf = false;
            loop {
                // Notified with resourceVersions: none newer than this
                // server's (its own writes) needs no read.
                let newest = match listener.as_mut().map(|l| l.wait(FOLLOW_FALLBACK)) {
                    Some(Ok(knit_db::Wake::Notified(rvs))) => {
                        rvs.iter().filter_map(|p| p.parse::<u64>().ok()).max()
                    }
                    Some(Ok(knit_db::Wake::Connected)) => {
                        if deaf {
                            deaf = false;
                            tracing::info!("listening for other servers' changes again");
                        }
                        None
                    }
                    Some(Ok(knit_db::Wake::Quiet)) => None,
                    other => {
                        if let Some(Err(e)) = other {
                            if !deaf {
                                deaf = true;
                                tracing::warn!(code = e.code(), error = %e, "listening for other servers' changes failed; reading the change log every {FOLLOW_FALLBACK:?} meanwhile");
                            }
                        }
                        match stopped.recv_timeout(FOLLOW_FALLBACK) {
                            Err(RecvTimeoutError::Timeout) => None,
                            _ => return,
                        }
                    }
                };
                match stopped.try_recv() {
                    Err(mpsc::TryRecvError::Empty) => {}
                    _ => return,
                }
                let result = {
                    let mut state = core.lock();
                    if newest.is_some_and(|rv| rv <= state.rv) {
                        continue;
                    }
                    core.pull(&mut state, None)
                };
                match result {
                    Err(e) if !failing => {
                        failing = true;
                        tracing::warn!(code = e.code(), error = %e, "reading other servers' changes failed; retrying");
                    }
                    Ok(()) if failing => {
                        failing = false;
                        tracing::info!("reading other servers' changes again");
                    }
                    _ => {}
                }
            }
        })
        .map_err(|e| ClusterError::io("the change follower thread", e))?;
    Ok(stop)
}

/// The cluster's resourceVersion as stored.
fn meta_rv(tx: &mut Tx<'_>) -> Result<u64, ClusterError> {
    Ok(tx
        .query_opt("SELECT value FROM kube_meta WHERE key = 'rv'", &[])?
        .map(|r| r.get::<u64>(0))
        .transpose()?
        .unwrap_or(0))
}

/// A row when this PostgreSQL server can compress with lz4.
const HAS_LZ4: &str =
    "SELECT 1 FROM pg_settings WHERE name = 'default_toast_compression' AND 'lz4' = ANY(enumvals)";

/// On PostgreSQL, the object bodies (stored, and twice in the change log)
/// are compressed with lz4 instead of pglz where the server has it
/// (PostgreSQL 14 and later, built with lz4): a big object written often
/// (cluster-info, one signature per bootstrap token) spent PostgreSQL's
/// CPU in pglz, and 1,000 tokens were minted in 5.2–5.8 s instead of 4.0
/// s. Values written before stay as they are, readable either way.
fn compress_bodies_with_lz4(tx: &mut Tx<'_>) -> Result<(), ClusterError> {
    if tx.backend() != Backend::Postgres {
        return Ok(());
    }
    let lz4 = tx.query_opt(HAS_LZ4, &[])?.is_some();
    if lz4 {
        tx.batch(
            "ALTER TABLE kube_objects ALTER COLUMN body SET COMPRESSION lz4;
             ALTER TABLE kube_changes ALTER COLUMN object SET COMPRESSION lz4,
                 ALTER COLUMN previous SET COMPRESSION lz4",
        )?;
    }
    Ok(())
}

/// A revoked certificate's serial and node.
type RevokedCert = (String, String);

/// Changes `after < rv <= upto` of the change log (at most `limit`), and
/// the revoked certificates of the nodes deleted among them.
fn changes_between(
    tx: &mut Tx<'_>,
    after: u64,
    upto: u64,
    limit: i64,
) -> Result<(Vec<Change>, Vec<RevokedCert>), ClusterError> {
    let rows = tx.query(
        "SELECT rv, kind, resource, namespace, name, object, previous FROM kube_changes
         WHERE rv > ?1 AND rv <= ?2 ORDER BY rv LIMIT ?3",
        params![after, upto, limit],
    )?;
    let mut changes = Vec::with_capacity(rows.len());
    let mut revoked = Vec::new();
    for r in rows {
        let kind: String = r.get(1)?;
        let kind = EventType::parse(&kind)
            .ok_or_else(|| ClusterError::Corrupt(format!("change log: event type {kind:?}")))?;
        let change = Change {
            rv: r.get(0)?,
            kind,
            resource: r.get(2)?,
            namespace: r.get(3)?,
            name: r.get(4)?,
            object: Arc::new(parse(&r.get::<String>(5)?)?),
            previous: r
                .get::<Option<String>>(6)?
                .map(|p| parse(&p).map(Arc::new))
                .transpose()?,
        };
        if change.kind == EventType::Deleted && change.resource == "nodes" {
            for s in tx.query(
                "SELECT serial FROM kube_node_certs WHERE node = ?1 AND revoked_at IS NOT NULL",
                params![&change.name],
            )? {
                revoked.push((s.get::<String>(0)?, change.name.clone()));
            }
        }
        changes.push(change);
    }
    Ok((changes, revoked))
}

/// SQLite stores from before the `kube_` prefix (one file per cluster)
/// had the same tables under shorter names: their rows move in.
fn adopt_unprefixed_tables(tx: &mut Tx<'_>) -> Result<(), ClusterError> {
    if tx.backend() != Backend::Sqlite {
        return Ok(());
    }
    let old = tx
        .query_opt(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'objects'",
            &[],
        )?
        .is_some();
    if old {
        tx.batch(
            "INSERT INTO kube_objects (resource, namespace, name, rv, body)
                 SELECT resource, namespace, name, rv, body FROM objects;
             INSERT INTO kube_meta (key, value) SELECT key, value FROM meta;
             INSERT INTO kube_node_certs (serial, node, not_after, revoked_at)
                 SELECT serial, node, not_after, revoked_at FROM node_certs;
             DROP TABLE objects; DROP TABLE meta; DROP TABLE node_certs;",
        )?;
    }
    Ok(())
}

const GET_BODY: &str =
    "SELECT body FROM kube_objects WHERE resource = ?1 AND namespace = ?2 AND name = ?3";

fn get_raw(
    tx: &mut Tx<'_>,
    resource: &str,
    ns: &str,
    name: &str,
) -> Result<Option<String>, ClusterError> {
    Ok(tx
        .query_opt(GET_BODY, params![resource, ns, name])?
        .map(|r| r.get::<String>(0))
        .transpose()?)
}

fn get_in(
    tx: &mut Tx<'_>,
    resource: &str,
    ns: &str,
    name: &str,
) -> Result<Option<Value>, ClusterError> {
    get_raw(tx, resource, ns, name)?
        .map(|b| parse(&b))
        .transpose()
}

fn list_raw(
    tx: &mut Tx<'_>,
    resource: &str,
    ns: Option<&str>,
) -> Result<Vec<String>, ClusterError> {
    let rows = match ns {
        Some(ns) => tx.query(
            "SELECT body FROM kube_objects WHERE resource = ?1 AND namespace = ?2 ORDER BY name",
            params![resource, ns],
        )?,
        None => tx.query(
            "SELECT body FROM kube_objects WHERE resource = ?1 ORDER BY namespace, name",
            params![resource],
        )?,
    };
    Ok(rows
        .iter()
        .map(|r| r.get::<String>(0))
        .collect::<Result<_, DbError>>()?)
}

fn list_in(tx: &mut Tx<'_>, resource: &str, ns: Option<&str>) -> Result<Vec<Value>, ClusterError> {
    list_raw(tx, resource, ns)?
        .iter()
        .map(|b| parse(b))
        .collect()
}

/// A node client certificate a CSR object holds.
pub struct IssuedNodeCert {
    pub serial: String,
    pub node: String,
    pub not_after: i64,
}

pub fn issued_node_cert(csr: &Value) -> Option<IssuedNodeCert> {
    use base64::Engine;
    let b64 = csr["status"]["certificate"].as_str()?;
    let pem = base64::engine::general_purpose::STANDARD.decode(b64).ok()?;
    let cert = crate::pki::pem_cert_identity(std::str::from_utf8(&pem).ok()?)?;
    let node = cert.common_name.strip_prefix(crate::auth::NODE_PREFIX)?;
    Some(IssuedNodeCert {
        serial: cert.serial,
        node: node.to_string(),
        not_after: cert.not_after,
    })
}

fn parse(body: &str) -> Result<Value, ClusterError> {
    serde_json::from_str(body).map_err(|e| ClusterError::Corrupt(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use knit_db::testing::TestPostgres;
    use std::time::Instant;

    fn node(name: &str) -> Value {
        json!({"kind": "Node", "apiVersion": "v1", "metadata": {"name": name}})
    }

    /// A datastore of its own for one test: an SQLite file in a temporary
    /// directory, or a database on a PostgreSQL server of the test's own.
    struct Fixture {
        datastore: Datastore,
        _dir: Option<tempfile::TempDir>,
        _pg: Option<TestPostgres>,
    }

    impl Fixture {
        fn sqlite() -> Fixture {
            let dir = tempfile::tempdir().unwrap();
            Fixture {
                datastore: Datastore::Sqlite(dir.path().join("s.db")),
                _dir: Some(dir),
                _pg: None,
            }
        }

        fn postgres() -> Fixture {
            let pg = TestPostgres::start().expect("a PostgreSQL server for the test");
            let url = pg.create_database("cluster_store").unwrap();
            Fixture {
                datastore: Datastore::Postgres(url),
                _dir: None,
                _pg: Some(pg),
            }
        }

        fn open(&self) -> Store {
            Store::open_datastore(&self.datastore, Limits::default()).unwrap()
        }
    }

    /// Runs `test` on SQLite, then on PostgreSQL.
    fn on_both(test: impl Fn(&Fixture)) {
        test(&Fixture::sqlite());
        test(&Fixture::postgres());
    }

    /// Lists served from memory are what the datastore holds: after
    /// creates, updates and deletes in two namespaces, the same as a store
    /// opened afresh reads (and, on PostgreSQL, as another server's).
    #[test]
    fn lists_from_memory_match_the_datastore() {
        on_both(|f| {
            let s = f.open();
            let cm = |ns: &str, name: &str| json!({"kind": "ConfigMap", "metadata": {"name": name, "namespace": ns}});
            for (ns, name) in [("b", "x"), ("a", "y"), ("a", "x"), ("c", "z")] {
                s.create("configmaps", ns, cm(ns, name)).unwrap();
            }
            s.create("nodes", "", node("n")).unwrap();
            s.update("configmaps", "a", "x", None, |cur| {
                let mut next = cur.clone();
                next["data"] = json!({"k": "v"});
                Ok(next)
            })
            .unwrap();
            s.delete("configmaps", "c", "z").unwrap();
            let names = |items: &[Value]| -> Vec<String> {
                items
                    .iter()
                    .map(|o| format!("{}/{}", util::namespace_of(o), util::name_of(o)))
                    .collect()
            };
            let (all, rv) = s.list("configmaps", None).unwrap();
            assert_eq!(names(&all), ["a/x", "a/y", "b/x"]);
            assert_eq!(all[0]["data"]["k"], json!("v"));
            assert_eq!(rv, s.current_rv());
            let (in_a, _) = s.list("configmaps", Some("a")).unwrap();
            assert_eq!(names(&in_a), ["a/x", "a/y"]);
            assert!(s.list("configmaps", Some("c")).unwrap().0.is_empty());
            let fresh = f.open();
            assert_eq!(fresh.list("configmaps", None).unwrap().0, all);
            assert_eq!(
                fresh.list("nodes", None).unwrap().0,
                s.list("nodes", None).unwrap().0
            );
        });
    }

    /// Reads served from memory, and writes planned from it, are what the
    /// datastore holds: after each create, update (by `update` and by
    /// `replace`) and delete, a get from memory is the stored object; a
    /// write from memory of a stale base still conflicts.
    #[test]
    fn gets_and_writes_from_memory_match_the_datastore() {
        on_both(|f| {
            let s = f.open();
            let shared = matches!(f.datastore, Datastore::Postgres(_));
            assert_eq!(s.serves_from_memory(None), !shared);
            assert!(s.serves_from_memory(Some(0)));
            let check = |name: &str| {
                let stored = s.get("nodes", "", name).unwrap();
                for min in [None, Some(0), Some(s.current_rv())] {
                    let served = s.get_served("nodes", "", name, min).unwrap();
                    assert_eq!(served.as_deref(), stored.as_ref(), "{name} at {min:?}");
                }
                stored
            };
            let created = s.create("nodes", "", node("m")).unwrap();
            assert_eq!(check("m").as_ref(), Some(&created));
            let updated = s
                .update("nodes", "", "m", util::rv_of(&created), |cur| {
                    let mut next = cur.clone();
                    next["spec"] = json!({"unschedulable": true});
                    Ok(next)
                })
                .unwrap();
            assert_eq!(check("m").as_ref(), Some(&updated));
            let mut next = updated.clone();
            next["metadata"]["labels"] = json!({"k": "v"});
            let replaced = s.replace("nodes", "", "m", &updated, next).unwrap();
            assert_eq!(check("m").as_ref(), Some(&replaced));
            assert_eq!(replaced["spec"]["unschedulable"], json!(true));
            let err = s
                .update("nodes", "", "m", util::rv_of(&updated), |cur| {
                    Ok(cur.clone())
                })
                .unwrap_err();
            assert_eq!(err.code, 409, "{}", err.message);
            let err = s
                .replace("nodes", "", "m", &updated, updated.clone())
                .unwrap_err();
            assert_eq!(err.code, 409, "{}", err.message);
            s.delete("nodes", "", "m").unwrap();
            assert_eq!(check("m"), None);
            let err = s
                .update("nodes", "", "m", None, |cur| Ok(cur.clone()))
                .unwrap_err();
            assert_eq!(err.code, 404, "{}", err.message);
        });
    }

    /// A get from memory does not wait for a write in flight (which holds
    /// the store's lock across its datastore I/O), so that an async worker
    /// may serve it.
    #[test]
    fn gets_from_memory_do_not_wait_for_a_write_in_flight() {
        let f = Fixture::sqlite();
        let s = Arc::new(f.open());
        s.create("nodes", "", node("w")).unwrap();
        let writing = s.core.lock();
        let (tx, rx) = mpsc::channel();
        let reader = s.clone();
        std::thread::spawn(move || {
            let served = reader.serves_from_memory(None)
                && reader
                    .get_served("nodes", "", "w", None)
                    .is_ok_and(|o| o.is_some());
            let _ = tx.send(served);
        });
        let answer = rx.recv_timeout(Duration::from_secs(10));
        drop(writing);
        assert_eq!(answer, Ok(true), "the get waited for the write's lock");
    }

    #[test]
    fn resource_versions_grow_and_survive_reopen() {
        on_both(|f| {
            let s = f.open();
            let a = s.create("nodes", "", node("a")).unwrap();
            let b = s.create("nodes", "", node("b")).unwrap();
            assert!(util::rv_of(&b) > util::rv_of(&a));
            let err = s.create("nodes", "", node("a")).unwrap_err();
            assert_eq!(err.code, 409);
            let rv_before = s.current_rv();
            drop(s);
            let s = f.open();
            assert_eq!(s.current_rv(), rv_before);
            let c = s.create("nodes", "", node("c")).unwrap();
            assert!(util::rv_of(&c).unwrap() > rv_before);
            assert_eq!(s.list("nodes", None).unwrap().0.len(), 3);
        });
    }

    #[test]
    fn stale_update_conflicts_and_noop_keeps_version() {
        on_both(|f| {
            let s = f.open();
            let a = s.create("nodes", "", node("a")).unwrap();
            let rv = util::rv_of(&a).unwrap();
            let same = s
                .update("nodes", "", "a", Some(rv), |cur| Ok(cur.clone()))
                .unwrap();
            assert_eq!(util::rv_of(&same), Some(rv));
            assert_eq!(s.current_rv(), rv, "a no-op takes no resourceVersion");
            let mut changed = a.clone();
            changed["spec"] = json!({"unschedulable": true});
            let next = s
                .update("nodes", "", "a", Some(rv), |_| Ok(changed.clone()))
                .unwrap();
            assert!(util::rv_of(&next).unwrap() > rv);
            let err = s
                .update("nodes", "", "a", Some(rv), |_| Ok(changed.clone()))
                .unwrap_err();
            assert_eq!(err.code, 409);
            let err = s
                .replace("nodes", "", "a", &a, changed.clone())
                .unwrap_err();
            assert_eq!(err.code, 409);
            let err = s
                .replace("nodes", "", "gone", &a, changed.clone())
                .unwrap_err();
            assert_eq!(err.code, 404);
        });
    }

    #[test]
    fn oversized_object_is_refused_and_takes_no_version() {
        on_both(|f| {
            let s = f.open();
            let rv = s.current_rv();
            let mut big = node("big");
            big["metadata"]["annotations"] = json!({"x": "y".repeat(MAX_OBJECT_BYTES)});
            let err = s.create("nodes", "", big).unwrap_err();
            assert_eq!(err.code, 413);
            assert!(err.message.contains("1.5 MiB"), "{}", err.message);
            assert_eq!(s.current_rv(), rv);
            assert!(s.get("nodes", "", "big").unwrap().is_none());
            let next = s.create("nodes", "", node("small")).unwrap();
            assert_eq!(
                util::rv_of(&next),
                Some(rv + 1),
                "no gap left by the refusal"
            );
        });
    }

    #[test]
    fn watch_from_version_sees_only_later_changes() {
        on_both(|f| {
            let s = f.open();
            let a = s.create("nodes", "", node("a")).unwrap();
            s.create("nodes", "", node("b")).unwrap();
            s.delete("nodes", "", "a").unwrap();
            let w = s.watch("nodes", None, util::rv_of(&a)).unwrap();
            let kinds: Vec<_> = w.initial.iter().map(|c| (c.kind, c.name.clone())).collect();
            assert_eq!(
                kinds,
                vec![
                    (EventType::Added, "b".to_string()),
                    (EventType::Deleted, "a".to_string())
                ]
            );
            let all = s.watch("nodes", None, None).unwrap();
            assert_eq!(all.initial.len(), 1);
        });
    }

    /// A list at an earlier resourceVersion: the objects as they were
    /// then, whatever changed since (created, modified, deleted); older
    /// than the history is Compacted, newer than the cluster Future.
    #[test]
    fn list_at_an_earlier_version_undoes_later_changes() {
        on_both(|f| {
            let s = Store::open_with_history(&f.datastore, Limits::default(), 8).unwrap();
            for n in ["a", "b", "c", "d"] {
                s.create("nodes", "", node(n)).unwrap();
            }
            s.create("pods", "ns1", node("p")).unwrap();
            let then = s.current_rv();
            s.update("nodes", "", "b", None, |cur| {
                let mut next = cur.clone();
                next["spec"] = json!({"unschedulable": true});
                Ok(next)
            })
            .unwrap();
            s.delete("nodes", "", "c").unwrap();
            s.create("nodes", "", node("bb")).unwrap();
            s.delete("pods", "ns1", "p").unwrap();
            let names = |snap: &Snapshot| -> Vec<(String, Value)> {
                snap.items
                    .iter()
                    .map(|(k, b)| (k.clone(), b.value().unwrap()))
                    .collect()
            };
            let snap = s
                .list_snapshot("nodes", None, false, Some(then), "", None)
                .unwrap();
            assert_eq!(snap.rv, then);
            let items = names(&snap);
            let keys: Vec<_> = items.iter().map(|(k, _)| k.as_str()).collect();
            assert_eq!(keys, ["a", "b", "c", "d"]);
            assert!(items[1].1.get("spec").is_none(), "b as it was");
            assert!(items.iter().all(|(_, o)| util::rv_of(o).unwrap() <= then));
            let from_b = s
                .list_snapshot("nodes", None, false, Some(then), "b\u{0}", None)
                .unwrap();
            let keys: Vec<_> = from_b.items.iter().map(|(k, _)| k.clone()).collect();
            assert_eq!(keys, ["c", "d"]);
            let now = s
                .list_snapshot("nodes", None, false, None, "", None)
                .unwrap();
            let keys: Vec<_> = now.items.iter().map(|(k, _)| k.clone()).collect();
            assert_eq!(keys, ["a", "b", "bb", "d"]);
            assert_eq!(now.rv, s.current_rv());
            // Namespaced: keys are namespace/name across namespaces.
            let pods = s
                .list_snapshot("pods", None, true, Some(then), "", None)
                .unwrap();
            assert_eq!(pods.items[0].0, "ns1/p");
            let pods = s
                .list_snapshot("pods", Some("ns1"), true, Some(then), "", None)
                .unwrap();
            assert_eq!(pods.items[0].0, "p");
            assert!(matches!(
                s.list_snapshot("nodes", None, false, Some(s.current_rv() + 5), "", None),
                Err(SnapshotError::Future { .. })
            ));
            // Past the history window (8 changes): compacted.
            for i in 0..8 {
                s.create("leases", "x", node(&format!("l{i}"))).unwrap();
            }
            assert!(matches!(
                s.list_snapshot("nodes", None, false, Some(then), "", None),
                Err(SnapshotError::Compacted)
            ));
        });
    }

    /// A page (`want`) reads the datastore only so far, yet is the list at
    /// its version when more objects changed since than a read's margin;
    /// `total` counts the objects from the start key at that version.
    #[test]
    fn a_page_is_right_however_many_objects_changed_since() {
        on_both(|f| {
            let s = f.open();
            for i in 0..60 {
                s.create("nodes", "", node(&format!("m-{i:02}"))).unwrap();
            }
            let then = s.current_rv();
            // The first 45 deleted, 45 created before them: a first read of
            // 38 rows (5 wanted + 33) is all new objects.
            for i in 0..45 {
                s.delete("nodes", "", &format!("m-{i:02}")).unwrap();
                s.create("nodes", "", node(&format!("a-{i:02}"))).unwrap();
            }
            let keys = |snap: &Snapshot| -> Vec<String> {
                snap.items.iter().map(|(k, _)| k.clone()).collect()
            };
            let page = s
                .list_snapshot("nodes", None, false, Some(then), "", Some(5))
                .unwrap();
            assert!(page.items.len() > 5);
            let want: Vec<String> = (0..page.items.len()).map(|i| format!("m-{i:02}")).collect();
            assert_eq!(keys(&page), want);
            assert_eq!(page.total, 60);
            let page = s
                .list_snapshot("nodes", None, false, Some(then), "m-50", Some(3))
                .unwrap();
            assert_eq!(keys(&page)[..4], ["m-50", "m-51", "m-52", "m-53"]);
            assert_eq!(page.total, 10);
            let now = s
                .list_snapshot("nodes", None, false, None, "", Some(5))
                .unwrap();
            assert_eq!(
                keys(&now)[..6],
                ["a-00", "a-01", "a-02", "a-03", "a-04", "a-05"]
            );
            assert_eq!(now.total, 60);
            // Across namespaces the key is namespace/name, bytewise: "a-b/x"
            // before "a/x" ('-' < '/').
            for (ns, name) in [("a", "x"), ("a-b", "x"), ("a", "y")] {
                s.create("pods", ns, node(name)).unwrap();
            }
            let pods = s
                .list_snapshot("pods", None, true, None, "", Some(1))
                .unwrap();
            assert_eq!(keys(&pods), ["a-b/x", "a/x", "a/y"]);
            let pods = s
                .list_snapshot("pods", None, true, None, "a-b/x\u{0}", Some(1))
                .unwrap();
            assert_eq!(
                (keys(&pods), pods.total),
                (vec!["a/x".to_string(), "a/y".to_string()], 2)
            );
        });
    }

    #[test]
    fn deleting_a_node_revokes_its_certificates_durably() {
        on_both(|f| {
            let s = f.open();
            let far = util::now().unix_timestamp() + 3600;
            s.record_node_cert("0a0b", "n1", far).unwrap();
            s.record_node_cert("0c0d", "n2", far).unwrap();
            s.create("nodes", "", node("n1")).unwrap();
            assert_eq!(s.revoked_node("0a0b"), None);
            s.delete("nodes", "", "n1").unwrap();
            assert_eq!(s.revoked_node("0a0b").as_deref(), Some("n1"));
            assert_eq!(s.revoked_node("0c0d"), None);
            drop(s);
            assert_eq!(f.open().revoked_node("0a0b").as_deref(), Some("n1"));
        });
    }

    /// A cluster.db written before the tables were named `kube_*` opens
    /// with its objects, resourceVersion and revocations.
    #[test]
    fn sqlite_store_from_before_the_prefix_is_adopted() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cluster.db");
        {
            let conn = rusqlite::Connection::open(&path).unwrap();
            conn.execute_batch(
                "CREATE TABLE objects (
                     resource TEXT NOT NULL, namespace TEXT NOT NULL, name TEXT NOT NULL,
                     rv INTEGER NOT NULL, body TEXT NOT NULL,
                     PRIMARY KEY (resource, namespace, name));
                 CREATE TABLE meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
                 CREATE TABLE node_certs (
                     serial TEXT PRIMARY KEY, node TEXT NOT NULL,
                     not_after INTEGER NOT NULL, revoked_at INTEGER);
                 INSERT INTO objects VALUES ('nodes', '', 'old', 41,
                     '{\"kind\":\"Node\",\"apiVersion\":\"v1\",\"metadata\":{\"name\":\"old\",\"resourceVersion\":\"41\"}}');
                 INSERT INTO meta VALUES ('rv', 42);",
            )
            .unwrap();
            conn.execute(
                "INSERT INTO node_certs VALUES ('ff01', 'gone', ?1, ?2)",
                [util::now().unix_timestamp() + 3600, 1],
            )
            .unwrap();
        }
        let s = Store::open(&path).unwrap();
        assert_eq!(s.current_rv(), 42);
        let old = s.get("nodes", "", "old").unwrap().unwrap();
        assert_eq!(util::rv_of(&old), Some(41));
        assert_eq!(s.revoked_node("ff01").as_deref(), Some("gone"));
        let next = s.create("nodes", "", node("new")).unwrap();
        assert_eq!(util::rv_of(&next), Some(43));
        drop(s);
        let s = Store::open(&path).unwrap();
        assert_eq!(s.list("nodes", None).unwrap().0.len(), 2);
    }

    /// The next change of a feed, waiting at most 10 s (then None).
    fn next_change(feed: &mut broadcast::Receiver<Arc<Change>>) -> Option<Arc<Change>> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match feed.try_recv() {
                Ok(c) => return Some(c),
                Err(broadcast::error::TryRecvError::Empty) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                Err(e) => panic!("feed: {e:?}"),
            }
        }
    }

    /// On PostgreSQL with lz4, a big object's body is compressed with lz4
    /// (stored and in the change log) and reads back whole.
    #[test]
    fn big_bodies_are_compressed_with_lz4_on_postgres() {
        let f = Fixture::postgres();
        let s = f.open();
        let data: serde_json::Map<String, Value> = (0..2_000)
            .map(|i| {
                (
                    format!("jws-kubeconfig-{i:06}"),
                    json!(format!("eyJhbGciOi..{i}")),
                )
            })
            .collect();
        let big = json!({"kind": "ConfigMap", "metadata": {"name": "big", "namespace": "p"}, "data": data});
        s.create("configmaps", "p", big.clone()).unwrap();
        s.update("configmaps", "p", "big", None, |cur| {
            let mut next = cur.clone();
            next["data"]["k"] = json!("v");
            Ok(next)
        })
        .unwrap();
        let db = Db::open(&f.datastore, Limits::default()).unwrap();
        let (has_lz4, methods) = db
            .read(|tx| -> Result<_, ClusterError> {
                let has_lz4 = tx
                    .query_opt(HAS_LZ4, &[])?
                    .is_some();
                let mut methods = vec![];
                for sql in [
                    "SELECT pg_column_compression(body) FROM kube_objects WHERE name = 'big'",
                    "SELECT pg_column_compression(object) FROM kube_changes WHERE name = 'big' AND kind = 'MODIFIED'",
                    "SELECT pg_column_compression(previous) FROM kube_changes WHERE name = 'big' AND kind = 'MODIFIED'",
                ] {
                    methods.push(tx.query_one(sql, &[])?.get::<String>(0)?);
                }
                Ok((has_lz4, methods))
            })
            .unwrap();
        let expected = if has_lz4 { "lz4" } else { "pglz" };
        assert_eq!(methods, [expected; 3]);
        let read = f.open().get("configmaps", "p", "big").unwrap().unwrap();
        assert_eq!(
            read["data"]["jws-kubeconfig-001999"],
            big["data"]["jws-kubeconfig-001999"]
        );
        assert_eq!(read["data"]["k"], "v");
    }

    /// What a watch gives over `within`: its initial changes, then its
    /// feed's.
    fn initial_then_feed(w: &mut WatchStart, within: Duration) -> Vec<(EventType, String)> {
        let mut seen: Vec<_> = w.initial.iter().map(|c| (c.kind, c.name.clone())).collect();
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            match w.feed.try_recv() {
                Ok(c) => seen.push((c.kind, c.name.clone())),
                Err(broadcast::error::TryRecvError::Empty) => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                Err(e) => panic!("the watch's feed ended: {e}"),
            }
        }
        seen
    }

    /// Two servers on one PostgreSQL database: each one's watches see the
    /// other's changes, in resourceVersion order and once; preconditions
    /// hold across them; a revocation by one is seen by the other.
    #[test]
    fn two_servers_share_one_postgres_database() {
        let f = Fixture::postgres();
        let a = f.open();
        let b = f.open();
        let mut w = a.watch("nodes", None, None).unwrap();
        assert!(w.initial.is_empty());

        b.create("nodes", "", node("x")).unwrap();
        a.create("nodes", "", node("y")).unwrap();
        let x = b
            .update("nodes", "", "x", None, |cur| {
                let mut next = cur.clone();
                next["spec"] = json!({"unschedulable": true});
                Ok(next)
            })
            .unwrap();
        a.delete("nodes", "", "y").unwrap();
        b.delete("nodes", "", "x").unwrap();
        // Only A's follower brings B's last change (A writes nothing after).
        let written = Instant::now();
        let expected = [
            (EventType::Added, "x"),
            (EventType::Added, "y"),
            (EventType::Modified, "x"),
            (EventType::Deleted, "y"),
            (EventType::Deleted, "x"),
        ];
        let mut rvs = Vec::new();
        for (kind, name) in expected {
            let c = next_change(&mut w.feed).unwrap_or_else(|| panic!("no {kind:?} {name}"));
            assert_eq!((c.kind, c.name.as_str()), (kind, name));
            if c.kind == EventType::Modified {
                assert_eq!(c.object["spec"]["unschedulable"], json!(true));
                assert!(
                    c.previous.is_some(),
                    "a change from another server has its previous object"
                );
                assert_eq!(util::rv_of(&c.object), util::rv_of(&x));
            }
            rvs.push(c.rv);
        }
        eprintln!(
            "B's last change reached A's feed after {} ms (notified; read without one every {} ms)",
            written.elapsed().as_millis(),
            FOLLOW_FALLBACK.as_millis()
        );
        assert!(
            rvs.windows(2).all(|p| p[1] == p[0] + 1),
            "every resourceVersion once, in order: {rvs:?}"
        );
        // Nothing twice: after a notification of each change and two reads
        // without one, the feed is empty.
        std::thread::sleep(FOLLOW_FALLBACK * 2 + Duration::from_millis(200));
        assert!(matches!(
            w.feed.try_recv(),
            Err(broadcast::error::TryRecvError::Empty)
        ));

        // A watch on A from a resourceVersion B gave (B's list): the change
        // B made after it reaches it once, from A's history if A's follower
        // read it already, else from the feed when it does (a version A
        // has seen, it reads nothing from the datastore for).
        let (_, listed) = b.list("nodes", None).unwrap();
        b.create("nodes", "", node("z")).unwrap();
        let mut from_b = a.watch("nodes", None, Some(listed)).unwrap();
        let names = initial_then_feed(
            &mut from_b,
            FOLLOW_FALLBACK * 2 + Duration::from_millis(500),
        );
        assert_eq!(names, vec![(EventType::Added, "z".to_string())]);
        // From a version ahead of A (B's write A has not read yet, or has):
        // nothing before it, and the write itself not twice.
        let ahead = b.create("nodes", "", node("z2")).unwrap();
        let mut from_ahead = a.watch("nodes", None, util::rv_of(&ahead)).unwrap();
        let names = initial_then_feed(
            &mut from_ahead,
            FOLLOW_FALLBACK * 2 + Duration::from_millis(500),
        );
        assert_eq!(names, vec![], "nothing after B's last write");
        b.delete("nodes", "", "z2").unwrap();
        // And a fresh watch on A lists what B wrote.
        let fresh = a.watch("nodes", None, None).unwrap();
        assert_eq!(fresh.initial.len(), 1);
        assert_eq!(fresh.initial[0].name, "z");

        // Optimistic concurrency across servers.
        let seen_by_a = a.get("nodes", "", "z").unwrap().unwrap();
        let old_rv = util::rv_of(&seen_by_a);
        b.update("nodes", "", "z", old_rv, |cur| {
            let mut next = cur.clone();
            next["metadata"]["labels"] = json!({"by": "b"});
            Ok(next)
        })
        .unwrap();
        let err = a
            .update("nodes", "", "z", old_rv, |cur| {
                let mut next = cur.clone();
                next["metadata"]["labels"] = json!({"by": "a"});
                Ok(next)
            })
            .unwrap_err();
        assert_eq!(err.code, 409, "{}", err.message);
        let mut stale = seen_by_a.clone();
        stale["metadata"]["labels"] = json!({"by": "a"});
        let err = a.replace("nodes", "", "z", &seen_by_a, stale).unwrap_err();
        assert_eq!(err.code, 409, "{}", err.message);
        let stored = b.get("nodes", "", "z").unwrap().unwrap();
        assert_eq!(stored["metadata"]["labels"]["by"], json!("b"));
        let err = a.create("nodes", "", node("z")).unwrap_err();
        assert_eq!(err.code, 409);
        // Right after B's write, A's newest read is B's object (read from
        // the datastore whether or not A's follower has it yet), and a write
        // on A without a precondition keeps B's change (planned again from
        // the datastore if A's memory was behind).
        let by_b = b
            .update("nodes", "", "z", None, |cur| {
                let mut next = cur.clone();
                next["metadata"]["annotations"] = json!({"b": "yes"});
                Ok(next)
            })
            .unwrap();
        let newest = a.get_served("nodes", "", "z", None).unwrap().unwrap();
        assert_eq!(*newest, by_b);
        let at_least = a
            .get_served("nodes", "", "z", util::rv_of(&by_b))
            .unwrap()
            .unwrap();
        assert_eq!(*at_least, by_b);
        let merged = a
            .update("nodes", "", "z", None, |cur| {
                let mut next = cur.clone();
                next["metadata"]["annotations"]["a"] = json!("yes");
                Ok(next)
            })
            .unwrap();
        assert_eq!(
            merged["metadata"]["annotations"],
            json!({"a": "yes", "b": "yes"})
        );

        // A revocation through B is seen by A.
        let far = util::now().unix_timestamp() + 3600;
        b.record_node_cert("0b0b", "z", far).unwrap();
        b.delete("nodes", "", "z").unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while a.revoked_node("0b0b").is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(a.revoked_node("0b0b").as_deref(), Some("z"));
    }

    /// A node Lease renewal on PostgreSQL notifies nobody (other writes
    /// do); another server's watch of Leases still gets it, in order,
    /// read without a notification.
    #[test]
    fn node_lease_renewals_notify_nobody_and_still_reach_other_servers() {
        let f = Fixture::postgres();
        let a = f.open();
        let b = f.open();
        let db = Db::open(&f.datastore, Limits::default()).unwrap();
        let mut listener = db.listener(CHANGES_CHANNEL).expect("PostgreSQL listens");
        assert_eq!(
            listener.wait(Duration::from_secs(10)).unwrap(),
            knit_db::Wake::Connected
        );
        let mut w = b.watch("leases", Some(NODE_LEASE_NAMESPACE), None).unwrap();
        let lease = |renew: &str| {
            json!({"metadata": {"name": "n1", "namespace": NODE_LEASE_NAMESPACE},
                   "spec": {"holderIdentity": "n1", "renewTime": renew}})
        };
        a.create("leases", NODE_LEASE_NAMESPACE, lease("1"))
            .unwrap();
        a.update("leases", NODE_LEASE_NAMESPACE, "n1", None, |_| {
            Ok(lease("2"))
        })
        .unwrap();
        // More than a fallback read's interval: nothing was notified.
        assert_eq!(
            listener.wait(FOLLOW_FALLBACK * 2).unwrap(),
            knit_db::Wake::Quiet
        );
        for (kind, renew) in [(EventType::Added, "1"), (EventType::Modified, "2")] {
            let c = next_change(&mut w.feed).unwrap_or_else(|| panic!("no {kind:?}"));
            assert_eq!(c.kind, kind);
            assert_eq!(c.object["spec"]["renewTime"], json!(renew));
        }
        // Any other write still notifies.
        a.create("nodes", "", node("n1")).unwrap();
        assert!(matches!(
            listener.wait(Duration::from_secs(10)).unwrap(),
            knit_db::Wake::Notified(_)
        ));
    }

    /// Node Lease renewals made side by side on one server share
    /// transactions (each waits a moment for others); every renewal is
    /// kept, and another server reads them all, in order, unnotified.
    #[test]
    fn node_lease_renewals_side_by_side_share_transactions() {
        const NODES: usize = 8;
        const RENEWALS: usize = 5;
        let f = Fixture::postgres();
        let a = Arc::new(f.open());
        let b = f.open();
        let lease = |n: usize, renew: usize| {
            json!({"metadata": {"name": format!("n{n}"), "namespace": NODE_LEASE_NAMESPACE},
                   "spec": {"holderIdentity": format!("n{n}"), "renewTime": renew}})
        };
        for n in 0..NODES {
            a.create("leases", NODE_LEASE_NAMESPACE, lease(n, 0))
                .unwrap();
        }
        let start = a.current_rv();
        // Lease renewals stay off the controllers' feed: a watch sees them.
        let mut w = b.watch("leases", Some(NODE_LEASE_NAMESPACE), None).unwrap();
        let renewers: Vec<_> = (0..NODES)
            .map(|n| {
                let a = a.clone();
                std::thread::spawn(move || {
                    for i in 1..=RENEWALS {
                        a.update(
                            "leases",
                            NODE_LEASE_NAMESPACE,
                            &format!("n{n}"),
                            None,
                            |_| Ok(lease(n, i)),
                        )
                        .unwrap();
                    }
                })
            })
            .collect();
        for r in renewers {
            r.join().unwrap();
        }
        assert_eq!(a.current_rv(), start + (NODES * RENEWALS) as u64);
        assert!(
            a.core.lock().batches.grouped > 0,
            "renewals side by side share transactions"
        );
        let mut rv = start;
        while rv < start + (NODES * RENEWALS) as u64 {
            let c = next_change(&mut w.feed).expect("every renewal reaches the other server");
            if c.rv <= start {
                continue;
            }
            assert_eq!(c.rv, rv + 1, "in order, none twice, no gap");
            rv = c.rv;
        }
        for n in 0..NODES {
            for s in [&*a, &b] {
                let got = s
                    .get("leases", NODE_LEASE_NAMESPACE, &format!("n{n}"))
                    .unwrap()
                    .unwrap();
                assert_eq!(got["spec"]["renewTime"], json!(RENEWALS), "{got}");
            }
        }
    }

    /// Writers side by side on two servers increment one counter: no
    /// increment is lost, both feeds have every change in order, and
    /// writes on one server share batches.
    #[test]
    fn writers_side_by_side_on_two_servers_lose_no_update_and_share_batches() {
        const THREADS: usize = 4;
        const EACH: usize = 25;
        let f = Fixture::postgres();
        let a = Arc::new(f.open());
        let b = Arc::new(f.open());
        let counter = json!({"metadata": {"name": "counter"}, "data": {"n": 0}});
        a.create("configmaps", "default", counter).unwrap();
        let start = a.current_rv();
        let caught_up = std::time::Instant::now();
        while b.current_rv() < start {
            assert!(
                caught_up.elapsed() < Duration::from_secs(10),
                "b reads a's change"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        let mut feeds = [a.subscribe(), b.subscribe()];
        let writers: Vec<_> = (0..THREADS * 2)
            .map(|t| {
                let s = if t % 2 == 0 { a.clone() } else { b.clone() };
                std::thread::spawn(move || {
                    for i in 0..EACH {
                        s.update("configmaps", "default", "counter", None, |cur| {
                            let mut next = cur.clone();
                            next["data"]["n"] = json!(cur["data"]["n"].as_u64().unwrap() + 1);
                            Ok(next)
                        })
                        .unwrap();
                        s.create("leases", "default", node(&format!("w{t}-{i}")))
                            .unwrap();
                    }
                })
            })
            .collect();
        for w in writers {
            w.join().unwrap();
        }
        let total = THREADS * 2 * EACH;
        for s in [&a, &b] {
            let n = s.get("configmaps", "default", "counter").unwrap().unwrap();
            assert_eq!(n["data"]["n"], json!(total), "no increment lost: {n}");
        }
        for feed in &mut feeds {
            let mut rv = start;
            for _ in 0..total * 2 {
                let c = next_change(feed).expect("every change reaches both servers");
                assert_eq!(c.rv, rv + 1, "in order, none twice, no gap");
                rv = c.rv;
            }
        }
        let grouped = a.core.lock().batches.grouped + b.core.lock().batches.grouped;
        assert!(grouped > 0, "writers side by side share batches");
    }

    /// Both servers write at once: each one's controllers' feed has every
    /// change, in resourceVersion order with no gap and none twice.
    #[test]
    fn concurrent_writes_on_two_servers_reach_both_feeds_in_order() {
        const EACH: usize = 40;
        let f = Fixture::postgres();
        let a = Arc::new(f.open());
        let b = Arc::new(f.open());
        let start = a.current_rv();
        let mut feeds = [a.subscribe(), b.subscribe()];
        let writers: Vec<_> = [("a", a.clone()), ("b", b.clone())]
            .into_iter()
            .map(|(who, s)| {
                std::thread::spawn(move || {
                    for i in 0..EACH {
                        let name = format!("{who}-{i}");
                        s.create("leases", "default", node(&name)).unwrap();
                        s.update("leases", "default", &name, None, |cur| {
                            let mut next = cur.clone();
                            next["spec"] = json!({"renewTime": i});
                            Ok(next)
                        })
                        .unwrap();
                    }
                })
            })
            .collect();
        for w in writers {
            w.join().unwrap();
        }
        for feed in &mut feeds {
            let mut rv = start;
            for _ in 0..EACH * 4 {
                let c = next_change(feed).expect("every change reaches both servers");
                assert_eq!(c.rv, rv + 1, "in order, none twice, no gap");
                rv = c.rv;
            }
        }
        assert_eq!(a.current_rv(), start + (EACH * 4) as u64);
        assert_eq!(b.current_rv(), a.current_rv());
    }
}
