//! Durable object storage (SQLite) with one monotonically increasing
//! resourceVersion for the whole cluster, and the change feed that watches
//! read. Objects are kept as the JSON the API serves.

use std::collections::{HashMap, VecDeque};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use rusqlite::{params, Connection, OptionalExtension};
use serde_json::{json, Value};
use tokio::sync::broadcast;

use crate::error::{ApiStatus, ClusterError};
use crate::util;

/// Watch events kept in memory: a watch may start from any resourceVersion
/// still in this window; older ones get 410 Gone, as from etcd compaction.
const HISTORY: usize = 20_000;
const FEED_CAPACITY: usize = 8_192;
/// Largest stored object, serialized (etcd's default request limit,
/// 1.5 MiB): however an object is written (create, update, any patch).
pub const MAX_OBJECT_BYTES: usize = 1536 * 1024;

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
    /// The object before a modification: a filtered watch turns a change
    /// into ADDED or DELETED when the object enters or leaves its filter.
    pub previous: Option<Arc<Value>>,
}

pub struct Store {
    inner: Mutex<Inner>,
    feed: broadcast::Sender<Arc<Change>>,
    /// Revoked node client certificates: serial (hex) → node name. Read on
    /// every request with a client certificate, so not behind `inner`.
    revoked: RwLock<HashMap<String, String>>,
}

struct Inner {
    conn: Connection,
    rv: u64,
    history: VecDeque<Arc<Change>>,
    /// resourceVersion before the oldest change in `history`.
    history_floor: u64,
}

/// Where a watch starts: every change after `rv`, or the current state
/// (as synthetic ADDED events) when `rv` is `None`.
pub struct WatchStart {
    pub initial: Vec<Arc<Change>>,
    pub feed: broadcast::Receiver<Arc<Change>>,
    pub rv: u64,
}

impl Store {
    pub fn open(path: &Path) -> Result<Store, ClusterError> {
        let conn = Connection::open(path)?;
        // WAL without a sync per commit: heartbeats write often, and a lost
        // last heartbeat after a power cut is harmless.
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS objects (
                 resource TEXT NOT NULL, namespace TEXT NOT NULL, name TEXT NOT NULL,
                 rv INTEGER NOT NULL, body TEXT NOT NULL,
                 PRIMARY KEY (resource, namespace, name));
             CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
             CREATE TABLE IF NOT EXISTS node_certs (
                 serial TEXT PRIMARY KEY, node TEXT NOT NULL,
                 not_after INTEGER NOT NULL, revoked_at INTEGER);
             CREATE INDEX IF NOT EXISTS node_certs_node ON node_certs (node);",
        )?;
        // Node certificates issued before they were recorded at signing
        // are still on their CSRs.
        for csr in list_in(&conn, "certificatesigningrequests", None)? {
            if let Some(c) = issued_node_cert(&csr) {
                conn.execute(
                    "INSERT OR IGNORE INTO node_certs (serial, node, not_after) VALUES (?1, ?2, ?3)",
                    params![c.serial, c.node, c.not_after],
                )?;
            }
        }
        // Certificates that expired need no revocation any more.
        conn.execute(
            "DELETE FROM node_certs WHERE not_after < ?1",
            params![util::now().unix_timestamp()],
        )?;
        let mut revoked = HashMap::new();
        {
            let mut st =
                conn.prepare("SELECT serial, node FROM node_certs WHERE revoked_at IS NOT NULL")?;
            let mut rows = st.query([])?;
            while let Some(r) = rows.next()? {
                revoked.insert(r.get::<_, String>(0)?, r.get::<_, String>(1)?);
            }
        }
        let rv: u64 = conn
            .query_row("SELECT value FROM meta WHERE key = 'rv'", [], |r| {
                r.get::<_, i64>(0)
            })
            .optional()?
            .unwrap_or(0) as u64;
        let (feed, _) = broadcast::channel(FEED_CAPACITY);
        Ok(Store {
            inner: Mutex::new(Inner {
                conn,
                rv,
                history: VecDeque::new(),
                history_floor: rv,
            }),
            feed,
            revoked: RwLock::new(revoked),
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
        self.lock().conn.execute(
            "INSERT OR IGNORE INTO node_certs (serial, node, not_after) VALUES (?1, ?2, ?3)",
            params![serial, node, not_after],
        )?;
        Ok(())
    }

    /// The node whose certificate with this serial was revoked, if it was.
    pub fn revoked_node(&self, serial: &str) -> Option<String> {
        self.revoked
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(serial)
            .cloned()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves SQLite consistent (each write
        // is one transaction), so a poisoned lock is still usable.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn current_rv(&self) -> u64 {
        self.lock().rv
    }

    pub fn get(&self, resource: &str, ns: &str, name: &str) -> Result<Option<Value>, ClusterError> {
        // Parsed after the lock is released.
        let body = get_raw(&self.lock().conn, resource, ns, name)?;
        body.map(|b| parse(&b)).transpose()
    }

    /// All objects of a resource (in one namespace, or all when `ns` is None),
    /// sorted by namespace and name, with the store's resourceVersion.
    pub fn list(
        &self,
        resource: &str,
        ns: Option<&str>,
    ) -> Result<(Vec<Value>, u64), ClusterError> {
        let (bodies, rv) = {
            let inner = self.lock();
            (list_raw(&inner.conn, resource, ns)?, inner.rv)
        };
        let items = bodies
            .iter()
            .map(|b| parse(b))
            .collect::<Result<Vec<_>, _>>()?;
        Ok((items, rv))
    }

    pub fn create(&self, resource: &str, ns: &str, mut obj: Value) -> Result<Value, ApiStatus> {
        let mut inner = self.lock();
        let name = util::name_of(&obj).to_string();
        if get_in(&inner.conn, resource, ns, &name)?.is_some() {
            return Err(
                ApiStatus::already_exists(format!("{resource} \"{name}\" already exists"))
                    .with_details(json!({"name": name, "kind": resource})),
            );
        }
        let meta = util::meta_mut(&mut obj);
        meta.insert("uid".into(), Value::String(util::new_uid()?));
        meta.insert(
            "creationTimestamp".into(),
            Value::String(util::now_rfc3339()),
        );
        meta.remove("deletionTimestamp");
        self.write(
            &mut inner,
            EventType::Added,
            (resource, ns, &name),
            obj,
            None,
        )
    }

    /// Replace an object. With `expected_rv`, fails with 409 if the stored
    /// object changed since (optimistic concurrency, as Kubernetes does).
    pub fn update(
        &self,
        resource: &str,
        ns: &str,
        name: &str,
        expected_rv: Option<u64>,
        f: impl FnOnce(&Value) -> Result<Value, ApiStatus>,
    ) -> Result<Value, ApiStatus> {
        let mut inner = self.lock();
        let current = get_in(&inner.conn, resource, ns, name)?
            .ok_or_else(|| ApiStatus::not_found(format!("{resource} \"{name}\" not found")))?;
        if let Some(expected) = expected_rv {
            if util::rv_of(&current) != Some(expected) {
                return Err(ApiStatus::conflict(format!(
                    "Operation cannot be fulfilled on {resource} \"{name}\": the object has been modified; please apply your changes to the latest version and try again"
                )));
            }
        }
        let mut next = f(&current)?;
        // Identity fields are the server's, whatever the client sent.
        for key in ["uid", "creationTimestamp", "name", "namespace"] {
            let meta = util::meta_mut(&mut next);
            match current["metadata"].get(key) {
                Some(v) => meta.insert(key.into(), v.clone()),
                None => meta.remove(key),
            };
        }
        // A no-op write does not bump the resourceVersion (like Kubernetes).
        let mut cmp = next.clone();
        util::meta_mut(&mut cmp).insert(
            "resourceVersion".into(),
            current["metadata"]["resourceVersion"].clone(),
        );
        if cmp == current {
            return Ok(current);
        }
        self.write(
            &mut inner,
            EventType::Modified,
            (resource, ns, name),
            next,
            Some(current),
        )
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
        for key in ["uid", "creationTimestamp", "name", "namespace"] {
            let meta = util::meta_mut(&mut next);
            match base["metadata"].get(key) {
                Some(v) => meta.insert(key.into(), v.clone()),
                None => meta.remove(key),
            };
        }
        let mut cmp = next.clone();
        util::meta_mut(&mut cmp).insert(
            "resourceVersion".into(),
            base["metadata"]["resourceVersion"].clone(),
        );
        let unchanged = cmp == *base;
        let mut inner = self.lock();
        let stored_rv: Option<i64> = inner
            .conn
            .query_row(
                "SELECT rv FROM objects WHERE resource = ?1 AND namespace = ?2 AND name = ?3",
                params![resource, ns, name],
                |r| r.get(0),
            )
            .optional()
            .map_err(ClusterError::from)?;
        let Some(stored_rv) = stored_rv else {
            return Err(ApiStatus::not_found(format!(
                "{resource} \"{name}\" not found"
            )));
        };
        if util::rv_of(base) != Some(stored_rv as u64) {
            return Err(ApiStatus::conflict(format!(
                "Operation cannot be fulfilled on {resource} \"{name}\": the object has been modified; please apply your changes to the latest version and try again"
            )));
        }
        // A no-op write does not bump the resourceVersion (like Kubernetes).
        if unchanged {
            return Ok(base.clone());
        }
        self.write(
            &mut inner,
            EventType::Modified,
            (resource, ns, name),
            next,
            Some(base.clone()),
        )
    }

    pub fn delete(&self, resource: &str, ns: &str, name: &str) -> Result<Value, ApiStatus> {
        let mut inner = self.lock();
        let current = get_in(&inner.conn, resource, ns, name)?
            .ok_or_else(|| ApiStatus::not_found(format!("{resource} \"{name}\" not found")))?;
        self.write(
            &mut inner,
            EventType::Deleted,
            (resource, ns, name),
            current,
            None,
        )
    }

    fn write(
        &self,
        inner: &mut Inner,
        kind: EventType,
        (resource, ns, name): (&str, &str, &str),
        mut obj: Value,
        previous: Option<Value>,
    ) -> Result<Value, ApiStatus> {
        let rv = inner.rv + 1;
        util::meta_mut(&mut obj).insert("resourceVersion".into(), Value::String(rv.to_string()));
        let body = obj.to_string();
        if kind != EventType::Deleted && body.len() > MAX_OBJECT_BYTES {
            return Err(ApiStatus::new(
                axum::http::StatusCode::PAYLOAD_TOO_LARGE,
                "RequestEntityTooLarge",
                format!(
                    "{resource} \"{name}\" would be {} bytes; the limit for a stored object is {MAX_OBJECT_BYTES} bytes (1.5 MiB)",
                    body.len()
                ),
            ));
        }
        let tx = inner.conn.transaction()?;
        let mut revoked = Vec::new();
        if kind == EventType::Deleted {
            tx.execute(
                "DELETE FROM objects WHERE resource = ?1 AND namespace = ?2 AND name = ?3",
                params![resource, ns, name],
            )?;
            if resource == "nodes" {
                // A removed node keeps no working credential: its client
                // certificates are revoked with the Node, atomically.
                tx.execute(
                    "UPDATE node_certs SET revoked_at = ?2 WHERE node = ?1 AND revoked_at IS NULL",
                    params![name, util::now().unix_timestamp()],
                )?;
                let mut st = tx.prepare("SELECT serial FROM node_certs WHERE node = ?1")?;
                let mut rows = st.query(params![name])?;
                while let Some(r) = rows.next()? {
                    revoked.push(r.get::<_, String>(0)?);
                }
            }
        } else {
            tx.execute(
                "INSERT OR REPLACE INTO objects (resource, namespace, name, rv, body) VALUES (?1, ?2, ?3, ?4, ?5)",
                params![resource, ns, name, rv as i64, body],
            )?;
        }
        tx.execute(
            "INSERT OR REPLACE INTO meta (key, value) VALUES ('rv', ?1)",
            params![rv as i64],
        )?;
        tx.commit()?;
        if !revoked.is_empty() {
            tracing::info!(
                node = name,
                certificates = revoked.len(),
                "node deleted: its client certificates are revoked"
            );
            let mut set = self.revoked.write().unwrap_or_else(|p| p.into_inner());
            for serial in revoked {
                set.insert(serial, name.to_string());
            }
        }
        inner.rv = rv;
        let change = Arc::new(Change {
            kind,
            resource: resource.to_string(),
            namespace: ns.to_string(),
            name: name.to_string(),
            rv,
            object: Arc::new(obj.clone()),
            previous: previous.map(Arc::new),
        });
        if inner.history.len() >= HISTORY {
            if let Some(old) = inner.history.pop_front() {
                inner.history_floor = old.rv;
            }
        }
        inner.history.push_back(change.clone());
        // No receiver is not an error: nobody watches yet.
        let _ = self.feed.send(change);
        Ok(obj)
    }

    /// Start a watch of `resource` atomically with respect to writes: no
    /// change is lost or seen twice between `initial` and `feed`.
    pub fn watch(
        &self,
        resource: &str,
        ns: Option<&str>,
        from: Option<u64>,
    ) -> Result<WatchStart, ApiStatus> {
        let inner = self.lock();
        let initial = match from {
            None => list_in(&inner.conn, resource, ns)?
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
                .collect(),
            Some(rv) if rv < inner.history_floor => {
                return Err(ApiStatus::gone(format!(
                    "too old resource version: {rv} ({})",
                    inner.history_floor
                )))
            }
            Some(rv) => inner
                .history
                .iter()
                .filter(|c| {
                    c.rv > rv && c.resource == resource && ns.is_none_or(|n| n == c.namespace)
                })
                .cloned()
                .collect(),
        };
        Ok(WatchStart {
            initial,
            feed: self.feed.subscribe(),
            rv: inner.rv,
        })
    }

    /// Every change, for the built-in controllers.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Change>> {
        self.feed.subscribe()
    }
}

fn get_raw(
    conn: &Connection,
    resource: &str,
    ns: &str,
    name: &str,
) -> Result<Option<String>, ClusterError> {
    Ok(conn
        .query_row(
            "SELECT body FROM objects WHERE resource = ?1 AND namespace = ?2 AND name = ?3",
            params![resource, ns, name],
            |r| r.get(0),
        )
        .optional()?)
}

fn get_in(
    conn: &Connection,
    resource: &str,
    ns: &str,
    name: &str,
) -> Result<Option<Value>, ClusterError> {
    get_raw(conn, resource, ns, name)?
        .map(|b| parse(&b))
        .transpose()
}

fn list_raw(
    conn: &Connection,
    resource: &str,
    ns: Option<&str>,
) -> Result<Vec<String>, ClusterError> {
    let mut out = Vec::new();
    let mut push = |rows: &mut rusqlite::Rows<'_>| -> Result<(), ClusterError> {
        while let Some(row) = rows.next()? {
            out.push(row.get::<_, String>(0)?);
        }
        Ok(())
    };
    match ns {
        Some(ns) => {
            let mut st = conn.prepare_cached(
                "SELECT body FROM objects WHERE resource = ?1 AND namespace = ?2 ORDER BY name",
            )?;
            push(&mut st.query(params![resource, ns])?)?;
        }
        None => {
            let mut st = conn.prepare_cached(
                "SELECT body FROM objects WHERE resource = ?1 ORDER BY namespace, name",
            )?;
            push(&mut st.query(params![resource])?)?;
        }
    }
    Ok(out)
}

fn list_in(
    conn: &Connection,
    resource: &str,
    ns: Option<&str>,
) -> Result<Vec<Value>, ClusterError> {
    list_raw(conn, resource, ns)?
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

    fn node(name: &str) -> Value {
        json!({"kind": "Node", "apiVersion": "v1", "metadata": {"name": name}})
    }

    #[test]
    fn resource_versions_grow_and_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        let s = Store::open(&path).unwrap();
        let a = s.create("nodes", "", node("a")).unwrap();
        let b = s.create("nodes", "", node("b")).unwrap();
        assert!(util::rv_of(&b) > util::rv_of(&a));
        let err = s.create("nodes", "", node("a")).unwrap_err();
        assert_eq!(err.code, 409);
        let rv_before = s.current_rv();
        drop(s);
        let s = Store::open(&path).unwrap();
        assert_eq!(s.current_rv(), rv_before);
        let c = s.create("nodes", "", node("c")).unwrap();
        assert!(util::rv_of(&c).unwrap() > rv_before);
        assert_eq!(s.list("nodes", None).unwrap().0.len(), 3);
    }

    #[test]
    fn stale_update_conflicts_and_noop_keeps_version() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(&dir.path().join("s.db")).unwrap();
        let a = s.create("nodes", "", node("a")).unwrap();
        let rv = util::rv_of(&a).unwrap();
        let same = s
            .update("nodes", "", "a", Some(rv), |cur| Ok(cur.clone()))
            .unwrap();
        assert_eq!(util::rv_of(&same), Some(rv));
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
    }

    #[test]
    fn watch_from_version_sees_only_later_changes() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(&dir.path().join("s.db")).unwrap();
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
    }
}
