//! The embedded backend: one connection, one writer at a time.

use std::path::Path;
use std::sync::{Mutex, MutexGuard};

use rusqlite::types::{ToSqlOutput, ValueRef};
use rusqlite::{Connection, Transaction, TransactionBehavior};

use crate::{DbError, Limits, Row, Tx, TxInner, Value};

pub struct Sqlite {
    conn: Mutex<Connection>,
}

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
        Ok(Sqlite {
            conn: Mutex::new(conn),
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
