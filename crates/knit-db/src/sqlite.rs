//! The embedded backend: one connection, one writer at a time.

use std::path::{Path, PathBuf};
use std::sync::{mpsc, Mutex, MutexGuard};
use std::time::Duration;

use rusqlite::types::{ToSqlOutput, ValueRef};
use rusqlite::{Connection, Transaction, TransactionBehavior};

use crate::{DbError, Limits, Row, Tx, TxInner, Value};

pub struct Sqlite {
    conn: Mutex<Connection>,
    /// Ends the checkpointer thread when dropped (a database file only).
    _checkpointer: Option<mpsc::Sender<()>>,
}

/// How often the write-ahead log is copied into the database file, by a
/// thread of its own: a write is an append to the log, never an fsync, so
/// it may be done where waiting is not allowed (an async worker).
const CHECKPOINT_EVERY: Duration = Duration::from_secs(1);
/// Log pages after which a commit checkpoints by itself: only when the
/// checkpointer falls far behind (SQLite's default is 1,000).
const INLINE_CHECKPOINT_PAGES: i64 = 16_000;

impl rusqlite::ToSql for Value {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(match self {
            Value::Null => ToSqlOutput::Borrowed(ValueRef::Null),
            Value::Int(i) => ToSqlOutput::Borrowed(ValueRef::Integer(*i)),
            Value::Real(f) => ToSqlOutput::Borrowed(ValueRef::Real(*f)),
            Value::Text(s) => ToSqlOutput::Borrowed(ValueRef::Text(s.as_bytes())),
            Value::Blob(b) => ToSqlOutput::Borrowed(ValueRef::Blob(b)),
        })
    }
}

impl Sqlite {
    pub fn open(path: Option<&Path>, limits: Limits) -> Result<Sqlite, DbError> {
        let conn = match path {
            Some(p) => Connection::open(p)?,
            None => Connection::open_in_memory()?,
        };
        // WAL: readers do not block the writer; NORMAL sync is durable across
        // a process kill (only an OS crash may lose the last transaction).
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        conn.busy_timeout(limits.statement_timeout)?;
        conn.set_prepared_statement_cache_capacity(256);
        let checkpointer = match path {
            Some(p) => {
                conn.pragma_update(None, "wal_autocheckpoint", INLINE_CHECKPOINT_PAGES)?;
                Some(spawn_checkpointer(p.to_path_buf())?)
            }
            None => None,
        };
        Ok(Sqlite {
            conn: Mutex::new(conn),
            _checkpointer: checkpointer,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Connection> {
        // A panic while holding the lock leaves SQLite consistent (every
        // change is a transaction), so a poisoned lock is safe to reuse.
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn run<T, E: From<DbError>>(
        &self,
        write: bool,
        mut f: impl FnMut(&mut Tx<'_>) -> Result<T, E>,
    ) -> Result<T, E> {
        let mut conn = self.lock();
        // IMMEDIATE: a write takes the lock at its start, so it never fails
        // half-way on another connection's write (`knit` tools open the file too).
        let behavior = if write {
            TransactionBehavior::Immediate
        } else {
            TransactionBehavior::Deferred
        };
        let tx = conn
            .transaction_with_behavior(behavior)
            .map_err(DbError::from)?;
        let out = f(&mut Tx {
            inner: TxInner::Sqlite(&tx),
        })?;
        tx.commit().map_err(DbError::from)?;
        Ok(out)
    }

    pub fn migrate<E: From<DbError>>(
        &self,
        component: &str,
        steps: &[&str],
        mut after_step: impl FnMut(&mut Tx<'_>, usize) -> Result<(), E>,
    ) -> Result<(), E> {
        let mut conn = self.lock();
        let current: i64 = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(DbError::from)?;
        let known = steps.len() as i64;
        if current > known {
            return Err(DbError::NewerSchema {
                component: component.to_string(),
                found: current,
                known,
            }
            .into());
        }
        for (i, sql) in steps.iter().enumerate().skip(current as usize) {
            let tx = conn.transaction().map_err(DbError::from)?;
            tx.execute_batch(sql).map_err(DbError::from)?;
            after_step(
                &mut Tx {
                    inner: TxInner::Sqlite(&tx),
                },
                i,
            )?;
            tx.pragma_update(None, "user_version", (i + 1) as i64)
                .map_err(DbError::from)?;
            tx.commit().map_err(DbError::from)?;
        }
        Ok(())
    }

    pub fn autocommit(&self, sql: &str) -> Result<(), DbError> {
        Ok(self.lock().execute_batch(sql)?)
    }

    pub fn schema_version(&self) -> Result<i64, DbError> {
        Ok(self
            .lock()
            .query_row("PRAGMA user_version", [], |r| r.get(0))?)
    }
}

/// The thread that checkpoints the log every [`CHECKPOINT_EVERY`] on a
/// connection of its own (PASSIVE: it never waits for, nor blocks, a
/// reader or the writer); it ends when the returned sender is dropped.
fn spawn_checkpointer(path: PathBuf) -> Result<mpsc::Sender<()>, DbError> {
    let conn = Connection::open(&path)?;
    conn.busy_timeout(Duration::from_secs(5))?;
    let (stop, stopped) = mpsc::channel::<()>();
    std::thread::Builder::new()
        .name("sqlite-checkpoint".into())
        .spawn(move || {
            // Said once per run of failures (a full disk fails every try).
            let mut failing = false;
            while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(CHECKPOINT_EVERY)
            {
                match conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
                    Err(e) if !failing => {
                        failing = true;
                        tracing::warn!(path = %path.display(), error = %e, "checkpointing the SQLite log failed; retried every second, said again once it works");
                    }
                    Err(_) => {}
                    Ok(()) if failing => {
                        failing = false;
                        tracing::info!(path = %path.display(), "checkpointing the SQLite log works again");
                    }
                    Ok(()) => {}
                }
            }
        })
        .map_err(|source| DbError::Spawn {
            what: "the SQLite checkpointer thread",
            source,
        })?;
    Ok(stop)
}

pub fn execute(tx: &Transaction<'_>, sql: &str, params: &[Value]) -> Result<u64, DbError> {
    let mut st = tx.prepare_cached(sql)?;
    Ok(st.execute(rusqlite::params_from_iter(params.iter()))? as u64)
}

pub fn query(tx: &Transaction<'_>, sql: &str, params: &[Value]) -> Result<Vec<Row>, DbError> {
    let mut st = tx.prepare_cached(sql)?;
    let columns = st.column_count();
    let mut rows = st.query(rusqlite::params_from_iter(params.iter()))?;
    let mut out = Vec::new();
    while let Some(r) = rows.next()? {
        let mut values = Vec::with_capacity(columns);
        for i in 0..columns {
            values.push(match r.get_ref(i)? {
                ValueRef::Null => Value::Null,
                ValueRef::Integer(v) => Value::Int(v),
                ValueRef::Real(v) => Value::Real(v),
                ValueRef::Text(t) => Value::Text(
                    std::str::from_utf8(t)
                        .map_err(|e| DbError::Column {
                            index: i,
                            reason: format!("text is not UTF-8: {e}"),
                        })?
                        .to_string(),
                ),
                ValueRef::Blob(b) => Value::Blob(b.to_vec()),
            });
        }
        out.push(Row { values });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    /// Commits append to the log; the checkpointer thread, not a commit,
    /// copies them into the database file.
    #[test]
    fn the_log_is_checkpointed_by_a_thread_of_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.db");
        let db = Sqlite::open(Some(&path), Limits::default()).unwrap();
        let inline: i64 = db
            .lock()
            .query_row("PRAGMA wal_autocheckpoint", [], |r| r.get(0))
            .unwrap();
        assert_eq!(inline, INLINE_CHECKPOINT_PAGES);
        db.run(true, |tx| {
            tx.execute("CREATE TABLE t (v BLOB)", &[]).map(|_| ())
        })
        .unwrap();
        for _ in 0..64 {
            db.run(true, |tx| {
                tx.execute(
                    "INSERT INTO t (v) VALUES (?1)",
                    &[Value::Blob(vec![7; 4096])],
                )
                .map(|_| ())
            })
            .unwrap();
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        let db_file = || std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        while db_file() < 64 * 4096 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(db_file() >= 64 * 4096, "the rows reached the database file");
    }
}
