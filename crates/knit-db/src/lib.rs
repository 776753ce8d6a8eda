//! One SQL seam over the two datastores knit runs on: SQLite, embedded in
//! one server's state directory (the default), and PostgreSQL, shared by
//! several servers. Callers write portable SQL (`?1`-style placeholders,
//! `ON CONFLICT`, `RETURNING`, `CAST(… AS BIGINT)` around sums) and run it
//! inside [`Db::read`] or [`Db::write`], which give both backends the same
//! meaning: a write transaction sees and changes the database as if it
//! were alone (SQLite's single writer; PostgreSQL's SERIALIZABLE, with the
//! transaction re-run when the server reports a conflict).

mod dialect;
mod error;
pub mod passfile;
#[cfg(feature = "postgres")]
mod postgres;
// Without PostgreSQL: the same names, which no Db ever holds.
#[cfg(not(feature = "postgres"))]
#[path = "postgres_off.rs"]
mod postgres;
pub mod roles;
mod sqlite;
#[cfg(feature = "testing")]
pub mod testing;
#[cfg(feature = "postgres")]
mod tls;
mod value;

use std::path::{Path, PathBuf};
use std::time::Duration;

pub use error::DbError;
pub use postgres::{Listener, Wake};
pub use value::{FromValue, Row, ToValue, Value};

/// Parameters of a statement: `params![a, b]` is `&[a.to_value(), …]`;
/// each is borrowed, never moved (so closures that may run again keep them).
#[macro_export]
macro_rules! params {
    () => { &[] as &[$crate::Value] };
    ($($p:expr),+ $(,)?) => { &[$($crate::ToValue::to_value(&$p)),+] as &[$crate::Value] };
}

/// Where a control plane keeps its state.
#[derive(Clone, PartialEq, Eq)]
pub enum Datastore {
    /// One SQLite file (in the state directory unless a path is given).
    Sqlite(PathBuf),
    /// SQLite in memory: tests only.
    SqliteMemory,
    /// A PostgreSQL connection URL (`postgres://user:password@host:port/db`,
    /// or the password from a file: `postgres://user@host/db?passfile=PATH`).
    Postgres(String),
}

impl std::fmt::Debug for Datastore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.redacted())
    }
}

impl Datastore {
    /// Reads `--datastore`: `sqlite` (the file `default_sqlite`),
    /// `sqlite:PATH`, or a `postgres://` / `postgresql://` URL.
    pub fn parse(text: &str, default_sqlite: &Path) -> Result<Datastore, DbError> {
        let text = text.trim();
        let bad = |rule: &str| DbError::BadDatastore {
            value: redact_url(text),
            rule: rule.to_string(),
        };
        if text == "sqlite" {
            return Ok(Datastore::Sqlite(default_sqlite.to_path_buf()));
        }
        if let Some(path) = text.strip_prefix("sqlite:") {
            if path.is_empty() {
                return Err(bad("sqlite:PATH needs a path"));
            }
            return Ok(Datastore::Sqlite(PathBuf::from(path)));
        }
        if text.starts_with("postgres://") || text.starts_with("postgresql://") {
            return Datastore::parse_postgres(text, bad);
        }
        Err(bad("must be `sqlite`, `sqlite:PATH` or a postgres:// URL"))
    }

    /// A `postgres://` URL, checked as the driver will read it.
    #[cfg(feature = "postgres")]
    fn parse_postgres(text: &str, bad: impl Fn(&str) -> DbError) -> Result<Datastore, DbError> {
        let (without, passfile) = passfile::take(text).map_err(|r| bad(&r))?;
        let tls = tls::settings(&without, |rule| bad(&rule))?;
        let config = tls
            .driver_url
            .parse::<tokio_postgres::Config>()
            .map_err(|e| bad(&format!("not a PostgreSQL connection URL: {e}")))?;
        if let Some(path) = passfile {
            if config.get_password().is_some() || config.get_user().is_none() {
                // The same rules as at connect time, said now.
                passfile::password_for(&path, &config).map_err(|r| bad(&r))?;
            }
        }
        Ok(Datastore::Postgres(text.to_string()))
    }

    /// Without the `postgres` feature: refused, naming it.
    #[cfg(not(feature = "postgres"))]
    fn parse_postgres(_text: &str, _bad: impl Fn(&str) -> DbError) -> Result<Datastore, DbError> {
        Err(DbError::not_built_in())
    }

    /// Shared by several servers (so a leader must be elected).
    pub fn is_shared(&self) -> bool {
        matches!(self, Datastore::Postgres(_))
    }

    /// The datastore as it may be logged: a URL's password replaced.
    pub fn redacted(&self) -> String {
        match self {
            Datastore::Sqlite(p) => format!("sqlite:{}", p.display()),
            Datastore::SqliteMemory => "sqlite::memory:".into(),
            Datastore::Postgres(url) => redact_url(url),
        }
    }
}

/// `postgres://user:secret@host/db` → `postgres://user:***@host/db`.
fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let Some((auth, host)) = rest.split_once('@') else {
        return url.to_string();
    };
    match auth.split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
        None => url.to_string(),
    }
}

/// Limits of the database calls.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Connecting to PostgreSQL.
    pub connect_timeout: Duration,
    /// One statement (PostgreSQL), or waiting for SQLite's lock.
    pub statement_timeout: Duration,
    /// Open PostgreSQL connections of this process.
    pub max_connections: usize,
    /// How long PostgreSQL lets a transaction of ours sit idle before it
    /// ends the session. Our transactions do no other I/O, so one idle
    /// this long belongs to a process that is frozen (SIGSTOP, a paused
    /// VM) or gone: its row locks — a fenced write holds the leader lease
    /// row FOR SHARE — must not stop another server taking the lease.
    pub idle_in_transaction_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            connect_timeout: Duration::from_secs(5),
            statement_timeout: Duration::from_secs(15),
            max_connections: 8,
            idle_in_transaction_timeout: Duration::from_secs(5),
        }
    }
}

/// Which backend a [`Db`] runs on (for the rare statement that differs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

pub struct Db {
    inner: Inner,
}

enum Inner {
    Sqlite(sqlite::Sqlite),
    Postgres(Box<postgres::Postgres>),
}

/// A transaction in progress: every statement of a [`Db::read`] or
/// [`Db::write`] goes through it.
pub struct Tx<'a> {
    inner: TxInner<'a>,
}

enum TxInner<'a> {
    Sqlite(&'a rusqlite::Transaction<'a>),
    // Without the feature there is no Postgres to make one with.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    Postgres(&'a mut postgres::Conn, &'a postgres::Postgres),
}

impl Db {
    pub fn open(store: &Datastore, limits: Limits) -> Result<Db, DbError> {
        let inner = match store {
            Datastore::Sqlite(path) => Inner::Sqlite(sqlite::Sqlite::open(Some(path), limits)?),
            Datastore::SqliteMemory => Inner::Sqlite(sqlite::Sqlite::open(None, limits)?),
            Datastore::Postgres(url) => {
                Inner::Postgres(Box::new(postgres::Postgres::open(url, limits)?))
            }
        };
        Ok(Db { inner })
    }

    pub fn backend(&self) -> Backend {
        match self.inner {
            Inner::Sqlite(_) => Backend::Sqlite,
            Inner::Postgres(_) => Backend::Postgres,
        }
    }

    /// Runs `f` in a read-only view of one moment of the database.
    pub fn read<T, E: From<DbError>>(
        &self,
        f: impl FnMut(&mut Tx<'_>) -> Result<T, E>,
    ) -> Result<T, E> {
        off_the_async_workers(|| match &self.inner {
            Inner::Sqlite(db) => db.run(false, f),
            Inner::Postgres(db) => db.run(false, f),
        })
    }

    /// Runs `f` in a write transaction, committed when `f` returns `Ok`.
    /// On PostgreSQL `f` may run more than once (a serialization conflict
    /// with another server re-runs it), so it must only touch the database.
    pub fn write<T, E: From<DbError>>(
        &self,
        f: impl FnMut(&mut Tx<'_>) -> Result<T, E>,
    ) -> Result<T, E> {
        off_the_async_workers(|| match &self.inner {
            Inner::Sqlite(db) => db.run(true, f),
            Inner::Postgres(db) => db.run(true, f),
        })
    }

    /// Like [`Db::write`], with `first` (a `LOCK TABLE` statement, no
    /// parameters) run right after `BEGIN`, before the transaction's
    /// snapshot. On PostgreSQL both go in the round trip of `f`'s first
    /// statement; SQLite, whose writer is alone, does not run it.
    pub fn write_after<T, E: From<DbError>>(
        &self,
        first: &str,
        f: impl FnMut(&mut Tx<'_>) -> Result<T, E>,
    ) -> Result<T, E> {
        off_the_async_workers(|| match &self.inner {
            Inner::Sqlite(db) => db.run(true, f),
            Inner::Postgres(db) => db.write_after(first, f),
        })
    }

    /// The rows of one read-only statement, which sees one moment of the
    /// database. On PostgreSQL it runs outside an explicit transaction:
    /// one round trip where [`Db::read`] takes two.
    pub fn query_once(&self, sql: &str, params: &[Value]) -> Result<Vec<Row>, DbError> {
        off_the_async_workers(|| match &self.inner {
            Inner::Sqlite(db) => db.run(false, |tx| tx.query(sql, params)),
            Inner::Postgres(db) => db.query_once(sql, params),
        })
    }

    /// A connection of its own that `LISTEN`s on `channel` (PostgreSQL;
    /// `None` on SQLite, where no other server writes). It connects on
    /// its first [`Listener::wait`] and again after it ends.
    pub fn listener(&self, channel: &str) -> Option<Listener> {
        match &self.inner {
            Inner::Sqlite(_) => None,
            Inner::Postgres(db) => Some(db.listener(channel)),
        }
    }

    /// Brings `component`'s schema to `steps.len()`: step `i` takes it from
    /// version `i` to `i + 1`, in the transaction that records the new
    /// version; `after_step(tx, i)` runs there too. A database with a newer
    /// version than `steps` knows is refused. On SQLite the version is the
    /// file's `user_version` (one component per file); on PostgreSQL a row
    /// of `knit_schema`, and servers starting together migrate one at a time.
    pub fn migrate<E: From<DbError>>(
        &self,
        component: &str,
        steps: &[&str],
        after_step: impl FnMut(&mut Tx<'_>, usize) -> Result<(), E>,
    ) -> Result<(), E> {
        off_the_async_workers(|| match &self.inner {
            Inner::Sqlite(db) => db.migrate(component, steps, after_step),
            Inner::Postgres(db) => db.migrate(component, steps, after_step),
        })
    }

    /// One statement outside any transaction (`CREATE DATABASE`, `VACUUM`).
    pub fn autocommit(&self, sql: &str) -> Result<(), DbError> {
        off_the_async_workers(|| match &self.inner {
            Inner::Sqlite(db) => db.autocommit(sql),
            Inner::Postgres(db) => db.autocommit(sql),
        })
    }

    /// `component`'s schema version (0 for none).
    pub fn schema_version(&self, component: &str) -> Result<i64, DbError> {
        off_the_async_workers(|| match &self.inner {
            Inner::Sqlite(db) => db.schema_version(),
            Inner::Postgres(db) => db.schema_version(component),
        })
    }
}

/// Runs `f`, which waits on the database (a lock, a connection, a round
/// trip), without losing the async worker thread that called it: on a
/// multi-threaded tokio runtime the worker's other tasks are handed to
/// another thread first (`block_in_place`), so accepting connections,
/// TLS handshakes and health checks go on while a transaction waits. With
/// two cores a runtime has two workers, and two requests waiting on a
/// slow database used to stop the whole server. Elsewhere (a plain thread,
/// a blocking-pool thread, a current-thread runtime) `f` simply runs.
/// Inside [`run_in_place`], `f` runs on the calling thread too.
fn off_the_async_workers<T>(f: impl FnOnce() -> T) -> T {
    use tokio::runtime::{Handle, RuntimeFlavor};
    if IN_PLACE.get() {
        return f();
    }
    match Handle::try_current() {
        Ok(h) if h.runtime_flavor() == RuntimeFlavor::MultiThread => tokio::task::block_in_place(f),
        _ => f(),
    }
}

thread_local! {
    /// Set by [`run_in_place`] for the work it runs.
    static IN_PLACE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` with its datastore work done on this thread, even on an async
/// worker (no `block_in_place` hand-off of the worker, which costs more
/// than a short statement): for a caller that knows the work cannot wait,
/// such as an SQLite write when no other write is in flight.
pub fn run_in_place<T>(f: impl FnOnce() -> T) -> T {
    struct Reset(bool);
    impl Drop for Reset {
        fn drop(&mut self) {
            IN_PLACE.set(self.0);
        }
    }
    let _reset = Reset(IN_PLACE.replace(true));
    f()
}

impl Tx<'_> {
    pub fn backend(&self) -> Backend {
        match self.inner {
            TxInner::Sqlite(_) => Backend::Sqlite,
            TxInner::Postgres(..) => Backend::Postgres,
        }
    }

    /// Runs one statement; the number of rows it changed.
    pub fn execute(&mut self, sql: &str, params: &[Value]) -> Result<u64, DbError> {
        match &mut self.inner {
            TxInner::Sqlite(tx) => sqlite::execute(tx, sql, params),
            TxInner::Postgres(conn, db) => db.execute(conn, sql, params),
        }
    }

    /// Runs the transaction's last statement, the number of rows it
    /// changed; nothing may run in the transaction after it. On PostgreSQL
    /// the statement and `COMMIT` go in one round trip: when this returns
    /// the transaction has ended (committed, or rolled back if the
    /// statement failed). On SQLite the commit follows when the
    /// transaction's work returns, as after any statement.
    pub fn execute_then_commit(&mut self, sql: &str, params: &[Value]) -> Result<u64, DbError> {
        match &mut self.inner {
            TxInner::Sqlite(tx) => sqlite::execute(tx, sql, params),
            TxInner::Postgres(conn, db) => db.execute_then_commit(conn, sql, params),
        }
    }

    /// Runs `statements` in order; the rows each changed. On PostgreSQL
    /// they are sent together, one round trip for all (pipelined).
    pub fn execute_all(&mut self, statements: &[(&str, &[Value])]) -> Result<Vec<u64>, DbError> {
        match &mut self.inner {
            TxInner::Sqlite(tx) => statements
                .iter()
                .map(|(sql, params)| sqlite::execute(tx, sql, params))
                .collect(),
            TxInner::Postgres(conn, db) => db.execute_all(conn, statements),
        }
    }

    /// Every row of a query.
    pub fn query(&mut self, sql: &str, params: &[Value]) -> Result<Vec<Row>, DbError> {
        match &mut self.inner {
            TxInner::Sqlite(tx) => sqlite::query(tx, sql, params),
            TxInner::Postgres(conn, db) => db.query(conn, sql, params),
        }
    }

    /// The first row of a query, if any.
    pub fn query_opt(&mut self, sql: &str, params: &[Value]) -> Result<Option<Row>, DbError> {
        Ok(self.query(sql, params)?.into_iter().next())
    }

    /// The first row of a query that always has one (`COUNT(*)`, …).
    pub fn query_one(&mut self, sql: &str, params: &[Value]) -> Result<Row, DbError> {
        self.query_opt(sql, params)?
            .ok_or_else(|| DbError::NoRow(dialect::first_words(sql)))
    }

    /// Statements without parameters, `;`-separated (schema changes).
    pub fn batch(&mut self, sql: &str) -> Result<(), DbError> {
        match &mut self.inner {
            TxInner::Sqlite(tx) => Ok(tx.execute_batch(sql)?),
            TxInner::Postgres(conn, db) => db.batch(conn, &dialect::postgres_ddl(sql)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_place_holds_for_its_work_only_even_when_it_panics() {
        assert!(!IN_PLACE.get());
        run_in_place(|| {
            assert!(IN_PLACE.get());
            run_in_place(|| assert!(IN_PLACE.get()));
            assert!(IN_PLACE.get(), "a nested call keeps the outer one's");
        });
        assert!(!IN_PLACE.get());
        let panicked = std::panic::catch_unwind(|| run_in_place(|| panic!("in place")));
        assert!(panicked.is_err());
        assert!(!IN_PLACE.get(), "reset by the panic's unwinding");
    }
}
