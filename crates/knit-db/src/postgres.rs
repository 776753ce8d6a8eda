//! The shared backend: PostgreSQL through tokio-postgres. Callers block on
//! their statements (as they do on SQLite's), each bounded by the
//! statement timeout, so the store stays synchronous and works from any
//! thread. A pooled connection's I/O is driven by the thread that runs a
//! statement on it (see [`Driven`]); the listening connection runs on a
//! small runtime of its own.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use tokio_postgres::types::{to_sql_checked, IsNull, ToSql, Type};
use tokio_postgres::{Client, Config, NoTls, Statement};

use crate::dialect;
use crate::{DbError, Limits, Row, Tx, TxInner, Value};

/// Serialization conflicts re-run a write transaction up to this many times.
const MAX_ATTEMPTS: u32 = 12;
/// Prepared statements kept per connection.
const STATEMENT_CACHE: usize = 256;

pub struct Postgres {
    config: Config,
    /// `None` with sslmode=disable.
    tls: Option<tokio_postgres_rustls::MakeRustlsConnect>,
    target: String,
    /// The listening connections' runtime.
    runtime: Option<tokio::runtime::Runtime>,
    handle: tokio::runtime::Handle,
    pool: Mutex<PoolState>,
    returned: Condvar,
    limits: Limits,
}

struct PoolState {
    idle: Vec<Conn>,
    open: usize,
}

pub struct Conn {
    client: Client,
    io: Driven,
    statements: HashMap<String, Statement>,
    /// A statement failed with a serialization conflict or a deadlock:
    /// the transaction is worth running again.
    conflicted: bool,
    /// A call timed out or the connection dropped: not reused.
    broken: bool,
    /// The transaction's `BEGIN`, not sent yet: it goes in the same round
    /// trip as the transaction's first statement (pipelined), which saves
    /// one round trip per transaction.
    begin: Option<String>,
    /// The connection turned out closed (the server ended it).
    closed: bool,
    /// Statements of the current transaction that were answered.
    answered: u32,
    /// The transaction ended with its last statement
    /// ([`Postgres::execute_then_commit`]): no `COMMIT` or `ROLLBACK`
    /// follows.
    ended: bool,
}

impl Drop for Postgres {
    fn drop(&mut self) {
        if let Ok(mut pool) = self.pool.lock() {
            pool.idle.clear();
        }
        // Not a blocking shutdown: the store may be dropped on an async thread.
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

impl Postgres {
    pub fn open(url: &str, limits: Limits) -> Result<Postgres, DbError> {
        let bad = |rule: String| DbError::BadDatastore {
            value: crate::redact_url(url),
            rule,
        };
        let (without, passfile) = crate::passfile::take(url).map_err(bad)?;
        let tls_settings = crate::tls::settings(&without, bad)?;
        let tls = crate::tls::connector(&tls_settings, bad)?;
        let mut config: Config = tls_settings
            .driver_url
            .parse()
            .map_err(|e| bad(format!("not a PostgreSQL connection URL: {e}")))?;
        if let Some(path) = passfile {
            let password = crate::passfile::password_for(&path, &config).map_err(bad)?;
            config.password(password);
        }
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(limits.connect_timeout);
        }
        // A server that vanished without closing the connection is noticed.
        config.keepalives(true);
        config.keepalives_idle(Duration::from_secs(10));
        if config.get_application_name().is_none() {
            config.application_name("knit");
        }
        let target = describe_target(&config);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("knit-db-postgres")
            .enable_all()
            .build()
            .map_err(|e| DbError::Postgres(format!("start the connection runtime: {e}")))?;
        let handle = runtime.handle().clone();
        let db = Postgres {
            config,
            tls,
            target,
            runtime: Some(runtime),
            handle,
            pool: Mutex::new(PoolState {
                idle: Vec::new(),
                open: 0,
            }),
            returned: Condvar::new(),
            limits,
        };
        // Fail at start, with the reason, when the database is unreachable.
        let conn = db.get()?;
        db.put(conn);
        Ok(db)
    }

    fn connect(&self) -> Result<Conn, DbError> {
        let no_answer = |_| DbError::Connect {
            target: self.target.clone(),
            reason: format!("no answer within {:?}", self.limits.statement_timeout),
        };
        let refused = |e: tokio_postgres::Error| DbError::Connect {
            target: self.target.clone(),
            // The TLS error (a certificate refused, say) is the source.
            reason: match std::error::Error::source(&e) {
                Some(cause) => format!("{e}: {cause}"),
                None => e.to_string(),
            },
        };
        let ended = |r: Result<(), tokio_postgres::Error>| {
            if let Err(e) = r {
                tracing::debug!(error = %e, "PostgreSQL connection ended");
            }
        };
        let mut io = Driven::new()?;
        let limit = self.limits.statement_timeout;
        // The two connections differ in type: each boxed where it is made.
        let client = match &self.tls {
            None => {
                let (client, connection) = io
                    .run(limit, self.config.connect(NoTls))
                    .map_err(no_answer)?
                    .map_err(refused)?;
                io.connection = Some(Box::pin(async move { ended(connection.await) }));
                client
            }
            Some(tls) => {
                let (client, connection) = io
                    .run(limit, self.config.connect(tls.clone()))
                    .map_err(no_answer)?
                    .map_err(refused)?;
                io.connection = Some(Box::pin(async move { ended(connection.await) }));
                client
            }
        };
        let mut conn = Conn {
            client,
            io,
            statements: HashMap::new(),
            conflicted: false,
            broken: false,
            begin: None,
            closed: false,
            answered: 0,
            ended: false,
        };
        // The server bounds a statement too: a call we stopped waiting for
        // does not go on holding locks.
        let ms = self.limits.statement_timeout.as_millis();
        let idle_ms = self.limits.idle_in_transaction_timeout.as_millis().max(1);
        self.batch(
            &mut conn,
            &format!(
                "SET statement_timeout = {ms}; SET idle_in_transaction_session_timeout = {idle_ms}"
            ),
        )?;
        Ok(conn)
    }

    /// A connection from the pool, a new one, or (all in use) the first
    /// one returned within the statement timeout.
    fn get(&self) -> Result<Conn, DbError> {
        let deadline = Instant::now() + self.limits.statement_timeout;
        let mut pool = self.pool.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(conn) = pool.idle.pop() {
                // Closed while idle (the server restarted, say): dropped,
                // never handed out to fail the caller's transaction.
                if conn.client.is_closed() {
                    pool.open = pool.open.saturating_sub(1);
                    continue;
                }
                return Ok(conn);
            }
            if pool.open < self.limits.max_connections.max(1) {
                pool.open += 1;
                drop(pool);
                return self.connect().inspect_err(|_| self.forget_one());
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(DbError::Timeout(self.limits.statement_timeout));
            }
            pool = self
                .returned
                .wait_timeout(pool, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    fn forget_one(&self) {
        let mut pool = self.pool.lock().unwrap_or_else(|p| p.into_inner());
        pool.open = pool.open.saturating_sub(1);
        self.returned.notify_one();
    }

    /// Drops every idle connection (outside the pool's lock: each one's
    /// runtime is shut down as it goes).
    fn forget_idle(&self) {
        let idle = {
            let mut pool = self.pool.lock().unwrap_or_else(|p| p.into_inner());
            let idle = std::mem::take(&mut pool.idle);
            pool.open = pool.open.saturating_sub(idle.len());
            idle
        };
        if !idle.is_empty() {
            self.returned.notify_all();
        }
        drop(idle);
    }

    fn put(&self, mut conn: Conn) {
        conn.begin = None;
        conn.ended = false;
        if conn.broken || conn.client.is_closed() {
            self.forget_one();
            return;
        }
        let mut pool = self.pool.lock().unwrap_or_else(|p| p.into_inner());
        pool.idle.push(conn);
        self.returned.notify_one();
    }

    pub fn run<T, E: From<DbError>>(
        &self,
        write: bool,
        f: impl FnMut(&mut Tx<'_>) -> Result<T, E>,
    ) -> Result<T, E> {
        let begin = if write {
            "BEGIN ISOLATION LEVEL SERIALIZABLE"
        } else {
            "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
        };
        self.run_with(begin, None, f)
    }

    /// A write transaction whose `BEGIN` is followed by `first` (a `LOCK
    /// TABLE`): both go in the round trip of the transaction's first
    /// statement.
    pub fn write_after<T, E: From<DbError>>(
        &self,
        first: &str,
        f: impl FnMut(&mut Tx<'_>) -> Result<T, E>,
    ) -> Result<T, E> {
        self.run_with("BEGIN ISOLATION LEVEL SERIALIZABLE", Some(first), f)
    }

    /// One read-only statement outside an explicit transaction: one
    /// snapshot, one round trip (no `BEGIN`, no `COMMIT`).
    pub fn query_once(&self, sql: &str, params: &[Value]) -> Result<Vec<Row>, DbError> {
        let mut conn = self.get()?;
        let result = self.query(&mut conn, sql, params);
        self.put(conn);
        result
    }

    fn run_with<T, E: From<DbError>>(
        &self,
        begin: &'static str,
        first: Option<&str>,
        mut f: impl FnMut(&mut Tx<'_>) -> Result<T, E>,
    ) -> Result<T, E> {
        let begin = match first {
            Some(first) => format!("{begin}; {first}"),
            None => begin.to_string(),
        };
        let mut attempt = 0;
        loop {
            attempt += 1;
            let mut conn = self.get()?;
            conn.begin = Some(begin.clone());
            conn.answered = 0;
            let result = f(&mut Tx {
                inner: TxInner::Postgres(&mut conn, self),
            });
            // No statement ran, or the last one ended the transaction:
            // there is no transaction to end.
            let idle = conn.begin.take().is_some() || conn.ended;
            let again = match result {
                Ok(value) if idle => {
                    self.put(conn);
                    return Ok(value);
                }
                Ok(value) => match self.batch(&mut conn, "COMMIT") {
                    Ok(()) => {
                        self.put(conn);
                        return Ok(value);
                    }
                    Err(e) if conn.conflicted && attempt < MAX_ATTEMPTS => {
                        tracing::debug!(error = %e, attempt, "transaction conflicted at commit; running it again");
                        true
                    }
                    Err(e) => {
                        self.put(conn);
                        return Err(e.into());
                    }
                },
                Err(e) => {
                    let conflicted = conn.conflicted;
                    // A connection found closed at the transaction's first
                    // statement did nothing: the work is run again on
                    // another connection, once.
                    let stale = conn.closed && conn.answered == 0 && attempt == 1;
                    if stale {
                        // Nobody reads an idle connection: those idle beside
                        // it were likely closed too (a restarted server
                        // closes them all), and would each fail a retry.
                        self.forget_idle();
                    }
                    if !idle && !conn.closed {
                        let _ = self.batch(&mut conn, "ROLLBACK");
                    }
                    if !((conflicted || stale) && attempt < MAX_ATTEMPTS) {
                        self.put(conn);
                        return Err(e);
                    }
                    true
                }
            };
            if again {
                conn.conflicted = false;
                self.put(conn);
                // Spread the retries of servers that collided.
                let jitter = (std::process::id() as u64 + attempt as u64 * 7) % 10;
                std::thread::sleep(Duration::from_millis((5u64 << attempt.min(6)) + jitter));
            }
        }
    }

    pub fn migrate<E: From<DbError>>(
        &self,
        component: &str,
        steps: &[&str],
        mut after_step: impl FnMut(&mut Tx<'_>, usize) -> Result<(), E>,
    ) -> Result<(), E> {
        // READ COMMITTED: after waiting for the lock, another server's
        // finished migration is visible.
        self.run_with("BEGIN", None, |tx| {
            tx.batch("SELECT pg_advisory_xact_lock(7401730117)")?;
            tx.batch(
                "CREATE TABLE IF NOT EXISTS knit_schema (component TEXT PRIMARY KEY, version INTEGER NOT NULL)",
            )?;
            let current: i64 = tx
                .query_opt(
                    "SELECT version FROM knit_schema WHERE component = ?1",
                    crate::params![component],
                )?
                .map(|r| r.get(0))
                .transpose()?
                .unwrap_or(0);
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
                tx.batch(sql)?;
                after_step(tx, i)?;
            }
            tx.execute(
                "INSERT INTO knit_schema (component, version) VALUES (?1, ?2) ON CONFLICT (component) DO UPDATE SET version = excluded.version",
                crate::params![component, known],
            )?;
            Ok(())
        })
    }

    pub fn autocommit(&self, sql: &str) -> Result<(), DbError> {
        let mut conn = self.get()?;
        let result = self.batch(&mut conn, sql);
        self.put(conn);
        result
    }

    pub fn schema_version(&self, component: &str) -> Result<i64, DbError> {
        self.run(false, |tx| {
            let exists = tx
                .query_one("SELECT to_regclass('knit_schema') IS NOT NULL", &[])?
                .get::<bool>(0)?;
            if !exists {
                return Ok(0);
            }
            Ok(tx
                .query_opt(
                    "SELECT version FROM knit_schema WHERE component = ?1",
                    crate::params![component],
                )?
                .map(|r| r.get(0))
                .transpose()?
                .unwrap_or(0))
        })
    }

    fn statement(&self, conn: &mut Conn, sql: &str) -> Result<Statement, DbError> {
        if let Some(s) = conn.statements.get(sql) {
            return Ok(s.clone());
        }
        let translated = dialect::postgres_placeholders(sql);
        let prepared = self.call(conn, |c| c.prepare(&translated))?;
        if conn.statements.len() >= STATEMENT_CACHE {
            conn.statements.clear();
        }
        conn.statements.insert(sql.to_string(), prepared.clone());
        Ok(prepared)
    }

    /// One call on the connection: a timeout breaks it, a conflict marks it.
    fn call<'c, T, F, Fut>(&self, conn: &'c mut Conn, f: F) -> Result<T, DbError>
    where
        F: FnOnce(&'c Client) -> Fut + Send,
        Fut: Future<Output = Result<T, tokio_postgres::Error>> + Send,
        T: Send,
    {
        let limit = self.limits.statement_timeout;
        let client: &'c Client = &conn.client;
        let io = &mut conn.io;
        let outcome = match conn.begin.take() {
            None => io.run(limit, f(client)),
            Some(begin) => io
                .run(limit, async {
                    // Sent in this order, answered in this order.
                    futures::join!(client.batch_execute(&begin), f(client))
                })
                .map(|(began, result)| match began {
                    Ok(()) => result,
                    Err(e) => {
                        // Never reused: the statement may have run
                        // outside a transaction; closing ends it.
                        conn.broken = true;
                        Err(e)
                    }
                }),
        };
        match outcome {
            Err(timeout) => {
                conn.broken = true;
                Err(timeout)
            }
            Ok(Err(e)) => {
                let err = pg_error(&e);
                // The server ended the session (shut down, or a crash
                // elsewhere): what an idle connection reads first when
                // its statement is sent after that.
                let mut ended_by_server = false;
                if let Some(code) = e.code() {
                    let code = code.code();
                    if code == "40001" || code == "40P01" {
                        conn.conflicted = true;
                    }
                    ended_by_server = code == "57P01" || code == "57P02";
                }
                if e.is_closed() || ended_by_server {
                    conn.broken = true;
                    conn.closed = true;
                }
                Err(err)
            }
            Ok(Ok(v)) => {
                conn.answered += 1;
                Ok(v)
            }
        }
    }

    pub fn execute(&self, conn: &mut Conn, sql: &str, params: &[Value]) -> Result<u64, DbError> {
        let stmt = self.statement(conn, sql)?;
        let refs: Vec<&(dyn ToSql + Sync)> = params.iter().map(|p| p as _).collect();
        self.call(conn, |c| async move { c.execute(&stmt, &refs).await })
    }

    /// Every statement sent at once (with the transaction's `BEGIN` too if
    /// they are its first): one round trip, answered in order.
    pub fn execute_all(
        &self,
        conn: &mut Conn,
        statements: &[(&str, &[Value])],
    ) -> Result<Vec<u64>, DbError> {
        let prepared = statements
            .iter()
            .map(|(sql, _)| self.statement(conn, sql))
            .collect::<Result<Vec<_>, _>>()?;
        let refs: Vec<Vec<&(dyn ToSql + Sync)>> = statements
            .iter()
            .map(|(_, params)| params.iter().map(|p| p as _).collect())
            .collect();
        self.call(conn, |c| async move {
            let sent = prepared
                .iter()
                .zip(&refs)
                .map(|(stmt, params)| c.execute(stmt, params));
            futures::future::join_all(sent)
                .await
                .into_iter()
                .collect::<Result<Vec<u64>, _>>()
        })
    }

    /// `sql` and `COMMIT` sent together (with the transaction's `BEGIN`
    /// too if `sql` is its first statement): one round trip. Answered in
    /// order; a failed statement makes the `COMMIT` a rollback. The
    /// transaction has ended either way.
    pub fn execute_then_commit(
        &self,
        conn: &mut Conn,
        sql: &str,
        params: &[Value],
    ) -> Result<u64, DbError> {
        let stmt = self.statement(conn, sql)?;
        let refs: Vec<&(dyn ToSql + Sync)> = params.iter().map(|p| p as _).collect();
        conn.ended = true;
        self.call(conn, |c| async move {
            let (written, committed) =
                futures::join!(c.execute(&stmt, &refs), c.batch_execute("COMMIT"));
            let written = written?;
            committed?;
            Ok(written)
        })
    }

    pub fn query(&self, conn: &mut Conn, sql: &str, params: &[Value]) -> Result<Vec<Row>, DbError> {
        let stmt = self.statement(conn, sql)?;
        let refs: Vec<&(dyn ToSql + Sync)> = params.iter().map(|p| p as _).collect();
        let rows = self.call(conn, |c| async move { c.query(&stmt, &refs).await })?;
        rows.iter().map(pg_row).collect()
    }

    pub fn batch(&self, conn: &mut Conn, sql: &str) -> Result<(), DbError> {
        self.call(conn, |c| c.batch_execute(sql))
    }
}

/// A pooled connection's I/O, driven by the thread that runs a statement
/// on it: its socket is registered with a current-thread runtime of its
/// own, which has no thread — the caller sends the statement, waits in
/// epoll for the answer and reads it. A shared runtime's thread did this
/// before: every round trip was handed to that thread and back, two
/// thread wake-ups per statement. While the connection sits in the pool
/// nobody reads it: a server that closed it is noticed by the next
/// statement (see [`Postgres::run_with`]).
struct Driven {
    /// The connection's own work (its `Connection` future); `None` before
    /// it is made and after it ended.
    connection: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
    /// `None` only while being dropped.
    runtime: Option<tokio::runtime::Runtime>,
}

impl Driven {
    fn new() -> Result<Driven, DbError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| DbError::Postgres(format!("start a connection's runtime: {e}")))?;
        Ok(Driven {
            connection: None,
            runtime: Some(runtime),
        })
    }

    /// Runs `fut` to its end, at most `limit`, driving the connection
    /// meanwhile, on this thread.
    fn run<F>(&mut self, limit: Duration, fut: F) -> Result<F::Output, DbError>
    where
        F: Future + Send,
        F::Output: Send,
    {
        let Driven {
            connection,
            runtime,
        } = self;
        let Some(runtime) = runtime.as_ref() else {
            return Err(DbError::Postgres("the connection's runtime is gone".into()));
        };
        let work = async {
            tokio::pin!(fut);
            loop {
                let Some(io) = connection.as_mut() else {
                    // Ended: the statement's future fails (closed) or ends.
                    return fut.await;
                };
                tokio::select! {
                    biased;
                    out = &mut fut => return out,
                    () = io.as_mut() => *connection = None,
                }
            }
        };
        let timed = async { tokio::time::timeout(limit, work).await };
        on_this_thread(|| runtime.block_on(timed)).map_err(|_| DbError::Timeout(limit))
    }
}

impl Drop for Driven {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            // The socket leaves its runtime's reactor while it is there.
            let enter = runtime.enter();
            self.connection = None;
            drop(enter);
            // Not a blocking shutdown: a pool may be dropped on an async thread.
            runtime.shutdown_background();
        }
    }
}

/// Runs `f`, which blocks on a connection's runtime, where that is
/// allowed: an async worker of a multi-thread runtime first hands its
/// other tasks to another thread (`block_in_place`; a no-op where the
/// caller did already, or off the workers); a thread that drives a
/// current-thread runtime (a `#[tokio::test]`, say) may not block on
/// another runtime at all, so `f` runs on a thread of its own there.
/// (`crate::off_the_async_workers`, around every `Db` call, runs such a
/// thread's work in place: right for SQLite, not for a runtime's
/// `block_on`.)
fn on_this_thread<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current().map(|h| h.runtime_flavor()) {
        Err(_) => f(),
        Ok(RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        Ok(_) => std::thread::scope(|s| match s.spawn(f).join() {
            Ok(out) => out,
            Err(panic) => std::panic::resume_unwind(panic),
        }),
    }
}

fn describe_target(config: &Config) -> String {
    let host = config
        .get_hosts()
        .first()
        .map(|h| match h {
            tokio_postgres::config::Host::Tcp(h) => h.clone(),
            tokio_postgres::config::Host::Unix(p) => p.display().to_string(),
        })
        .unwrap_or_else(|| "localhost".into());
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let db = config.get_dbname().unwrap_or("(default)");
    format!("{host}:{port}/{db}")
}

/// SQLSTATE first, then the server's message: callers match on the code.
fn pg_error(e: &tokio_postgres::Error) -> DbError {
    match e.as_db_error() {
        Some(db) => DbError::Postgres(format!(
            "{} {}{}",
            db.code().code(),
            db.message(),
            db.detail().map(|d| format!(" ({d})")).unwrap_or_default()
        )),
        None => DbError::Postgres(e.to_string()),
    }
}

impl ToSql for Value {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut tokio_postgres::types::private::BytesMut,
    ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        match self {
            Value::Null => Ok(IsNull::Yes),
            Value::Int(i) => match *ty {
                Type::INT2 => i16::try_from(*i)?.to_sql(ty, out),
                Type::INT4 => i32::try_from(*i)?.to_sql(ty, out),
                Type::BOOL => (*i != 0).to_sql(ty, out),
                Type::FLOAT8 => (*i as f64).to_sql(ty, out),
                Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME | Type::UNKNOWN => {
                    i.to_string().to_sql(ty, out)
                }
                _ => i.to_sql(ty, out),
            },
            Value::Real(f) => f.to_sql(ty, out),
            Value::Text(s) => s.as_str().to_sql(ty, out),
            Value::Blob(b) => b.as_slice().to_sql(ty, out),
        }
    }

    fn accepts(_: &Type) -> bool {
        true
    }

    to_sql_checked!();
}

fn pg_row(row: &tokio_postgres::Row) -> Result<Row, DbError> {
    let mut values = Vec::with_capacity(row.len());
    for (i, col) in row.columns().iter().enumerate() {
        let bad = |e: tokio_postgres::Error| DbError::Column {
            index: i,
            reason: e.to_string(),
        };
        let v = match *col.type_() {
            Type::INT8 => row.try_get::<_, Option<i64>>(i).map_err(bad)?.map(Value::Int),
            Type::INT4 => row
                .try_get::<_, Option<i32>>(i)
                .map_err(bad)?
                .map(|v| Value::Int(v.into())),
            Type::INT2 => row
                .try_get::<_, Option<i16>>(i)
                .map_err(bad)?
                .map(|v| Value::Int(v.into())),
            Type::BOOL => row
                .try_get::<_, Option<bool>>(i)
                .map_err(bad)?
                .map(|v| Value::Int(v as i64)),
            Type::FLOAT8 => row.try_get::<_, Option<f64>>(i).map_err(bad)?.map(Value::Real),
            Type::FLOAT4 => row
                .try_get::<_, Option<f32>>(i)
                .map_err(bad)?
                .map(|v| Value::Real(v.into())),
            Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME | Type::UNKNOWN => row
                .try_get::<_, Option<String>>(i)
                .map_err(bad)?
                .map(Value::Text),
            Type::BYTEA => row
                .try_get::<_, Option<Vec<u8>>>(i)
                .map_err(bad)?
                .map(Value::Blob),
            ref other => {
                return Err(DbError::Column {
                    index: i,
                    reason: format!(
                        "column {:?} has type {other}, which knit does not read (CAST it to BIGINT or TEXT)",
                        col.name()
                    ),
                })
            }
        };
        values.push(v.unwrap_or(Value::Null));
    }
    Ok(Row { values })
}

/// What [`Listener::wait`] saw.
#[derive(Debug, PartialEq, Eq)]
pub enum Wake {
    /// Notifications arrived: their payloads, in order (some may have been
    /// dropped when the caller fell far behind; there is at least one).
    Notified(Vec<String>),
    /// The listening connection was (re)made: notifications sent while
    /// there was none are lost, so the caller reads what it may have missed.
    Connected,
    /// Nothing within the timeout.
    Quiet,
}

/// Notifications queued for the caller; more are dropped (the caller is
/// woken anyway and reads everything new).
const NOTIFY_QUEUE: usize = 4_096;

/// A dedicated connection that `LISTEN`s on one channel, made again after
/// it ends (on the next [`Listener::wait`]).
pub struct Listener {
    handle: tokio::runtime::Handle,
    config: Config,
    tls: Option<tokio_postgres_rustls::MakeRustlsConnect>,
    target: String,
    channel: String,
    timeout: Duration,
    live: Option<Live>,
}

struct Live {
    /// Kept: dropping it closes the connection.
    _client: Client,
    events: std::sync::mpsc::Receiver<Result<String, String>>,
}

impl Postgres {
    pub fn listener(&self, channel: &str) -> Listener {
        Listener {
            handle: self.handle.clone(),
            config: self.config.clone(),
            tls: self.tls.clone(),
            target: self.target.clone(),
            channel: channel.to_string(),
            timeout: self.limits.statement_timeout,
            live: None,
        }
    }
}

impl Listener {
    /// Waits at most `timeout` for notifications. Connects first when
    /// there is no connection (then [`Wake::Connected`] at once); an error
    /// is a connection that could not be made or that ended (the next call
    /// connects again).
    pub fn wait(&mut self, timeout: Duration) -> Result<Wake, DbError> {
        use std::sync::mpsc::RecvTimeoutError;
        let Some(live) = &self.live else {
            self.live = Some(self.connect()?);
            return Ok(Wake::Connected);
        };
        let first = match live.events.recv_timeout(timeout) {
            Ok(event) => event,
            Err(RecvTimeoutError::Timeout) => return Ok(Wake::Quiet),
            Err(RecvTimeoutError::Disconnected) => Err("the connection ended".to_string()),
        };
        let mut payloads = Vec::new();
        let mut ended = None;
        for event in std::iter::once(first).chain(live.events.try_iter()) {
            match event {
                Ok(p) => payloads.push(p),
                Err(reason) => ended = Some(reason),
            }
        }
        if let Some(reason) = ended {
            self.live = None;
            return Err(DbError::Connect {
                target: self.target.clone(),
                reason: format!("listening on {:?}: {reason}", self.channel),
            });
        }
        Ok(Wake::Notified(payloads))
    }

    fn connect(&self) -> Result<Live, DbError> {
        let failed = |reason: String| DbError::Connect {
            target: self.target.clone(),
            reason: format!("listening on {:?}: {reason}", self.channel),
        };
        let (send, events) = std::sync::mpsc::sync_channel(NOTIFY_QUEUE);
        let timeout = self.timeout;
        let _enter = self.handle.enter();
        let connect = async {
            let client = match &self.tls {
                None => {
                    let (client, connection) = self.config.connect(NoTls).await?;
                    self.handle.spawn(forward(connection, send));
                    client
                }
                Some(tls) => {
                    let (client, connection) = self.config.connect(tls.clone()).await?;
                    self.handle.spawn(forward(connection, send));
                    client
                }
            };
            // A channel name is an identifier: quoted, quotes doubled.
            let quoted = self.channel.replace('"', "\"\"");
            client
                .batch_execute(&format!("LISTEN \"{quoted}\""))
                .await?;
            Ok::<_, tokio_postgres::Error>(client)
        };
        let client =
            futures::executor::block_on(async { tokio::time::timeout(timeout, connect).await })
                .map_err(|_| failed(format!("no answer within {timeout:?}")))?
                .map_err(|e| failed(pg_error(&e).to_string()))?;
        Ok(Live {
            _client: client,
            events,
        })
    }
}

/// Drives a listening connection: its notifications' payloads to `send`,
/// then why it ended.
async fn forward<S, T>(
    mut connection: tokio_postgres::Connection<S, T>,
    send: std::sync::mpsc::SyncSender<Result<String, String>>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use futures::StreamExt;
    let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
    while let Some(message) = messages.next().await {
        match message {
            Ok(tokio_postgres::AsyncMessage::Notification(n)) => {
                // Full: the caller has wake-ups enough queued.
                let _ = send.try_send(Ok(n.payload().to_string()));
            }
            Ok(_) => {}
            Err(e) => {
                let _ = send.try_send(Err(e.to_string()));
                return;
            }
        }
    }
    let _ = send.try_send(Err("closed by the server".into()));
}
