//! Durable object storage (SQLite) with one monotonically increasing
//! resourceVersion for the whole cluster, and the change feed that watches
//! read. Objects are kept as the JSON the API serves.

use std::collections::VecDeque;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

use rusqlite::{params, Connection, OptionalExtension};
use serde_json::{json, Value};
use tokio::sync::broadcast;

use crate::error::{ApiStatus, ClusterError};
use crate::util;

/// Watch events kept in memory: a watch may start from any resourceVersion
/// still in this window; older ones get 410 Gone, as from etcd compaction.
const HISTORY: usize = 20_000;
const FEED_CAPACITY: usize = 8_192;

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
             CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);",
        )?;
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
        })
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
        get_in(&self.lock().conn, resource, ns, name)
    }

    /// All objects of a resource (in one namespace, or all when `ns` is None),
    /// sorted by namespace and name, with the store's resourceVersion.
    pub fn list(
        &self,
        resource: &str,
        ns: Option<&str>,
    ) -> Result<(Vec<Value>, u64), ClusterError> {
        let inner = self.lock();
        Ok((list_in(&inner.conn, resource, ns)?, inner.rv))
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
        let tx = inner.conn.transaction()?;
        if kind == EventType::Deleted {
            tx.execute(
                "DELETE FROM objects WHERE resource = ?1 AND namespace = ?2 AND name = ?3",
                params![resource, ns, name],
            )?;
        } else {
            tx.execute(
                "INSERT OR REPLACE INTO objects (resource, namespace, name, rv, body) VALUES (?1, ?2, ?3, ?4, ?5)",
                params![resource, ns, name, rv as i64, obj.to_string()],
            )?;
        }
        tx.execute(
            "INSERT OR REPLACE INTO meta (key, value) VALUES ('rv', ?1)",
            params![rv as i64],
        )?;
        tx.commit()?;
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

fn get_in(
    conn: &Connection,
    resource: &str,
    ns: &str,
    name: &str,
) -> Result<Option<Value>, ClusterError> {
    let body: Option<String> = conn
        .query_row(
            "SELECT body FROM objects WHERE resource = ?1 AND namespace = ?2 AND name = ?3",
            params![resource, ns, name],
            |r| r.get(0),
        )
        .optional()?;
    body.map(|b| parse(&b)).transpose()
}

fn list_in(
    conn: &Connection,
    resource: &str,
    ns: Option<&str>,
) -> Result<Vec<Value>, ClusterError> {
    let mut out = Vec::new();
    let mut push = |rows: &mut rusqlite::Rows<'_>| -> Result<(), ClusterError> {
        while let Some(row) = rows.next()? {
            out.push(parse(&row.get::<_, String>(0)?)?);
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
