//! PostgreSQL in a build without the `postgres` feature: the names of
//! postgres.rs as types without values, so that the SQLite code paths need
//! no `cfg` of their own. [`Postgres::open`] is the only way to make one
//! and it refuses, naming the feature; every other method is unreachable
//! by construction (matching on a value of an empty enum).

use crate::{DbError, Limits, Row, Tx, Value};
use std::time::Duration;

/// What [`Listener::wait`] saw (as with the feature).
#[derive(Debug, PartialEq, Eq)]
pub enum Wake {
    Notified(Vec<String>),
    Connected,
    Quiet,
}

pub enum Postgres {}

pub enum Conn {}

/// Never made: [`Postgres::listener`] needs a [`Postgres`].
pub struct Listener(());

impl Postgres {
    pub fn open(_url: &str, _limits: Limits) -> Result<Postgres, DbError> {
        Err(DbError::not_built_in())
    }

    pub fn run<T, E: From<DbError>>(
        &self,
        _write: bool,
        _f: impl FnMut(&mut Tx<'_>) -> Result<T, E>,
    ) -> Result<T, E> {
        match *self {}
    }

    pub fn write_after<T, E: From<DbError>>(
        &self,
        _first: &str,
        _f: impl FnMut(&mut Tx<'_>) -> Result<T, E>,
    ) -> Result<T, E> {
        match *self {}
    }

    pub fn query_once(&self, _sql: &str, _params: &[Value]) -> Result<Vec<Row>, DbError> {
        match *self {}
    }

    pub fn migrate<E: From<DbError>>(
        &self,
        _component: &str,
        _steps: &[&str],
        _after_step: impl FnMut(&mut Tx<'_>, usize) -> Result<(), E>,
    ) -> Result<(), E> {
        match *self {}
    }

    pub fn autocommit(&self, _sql: &str) -> Result<(), DbError> {
        match *self {}
    }

    pub fn schema_version(&self, _component: &str) -> Result<i64, DbError> {
        match *self {}
    }

    pub fn execute(&self, _conn: &mut Conn, _sql: &str, _params: &[Value]) -> Result<u64, DbError> {
        match *self {}
    }

    pub fn execute_all(
        &self,
        _conn: &mut Conn,
        _statements: &[(&str, &[Value])],
    ) -> Result<Vec<u64>, DbError> {
        match *self {}
    }

    pub fn execute_then_commit(
        &self,
        _conn: &mut Conn,
        _sql: &str,
        _params: &[Value],
    ) -> Result<u64, DbError> {
        match *self {}
    }

    pub fn query(
        &self,
        _conn: &mut Conn,
        _sql: &str,
        _params: &[Value],
    ) -> Result<Vec<Row>, DbError> {
        match *self {}
    }

    pub fn batch(&self, _conn: &mut Conn, _sql: &str) -> Result<(), DbError> {
        match *self {}
    }

    pub fn listener(&self, _channel: &str) -> Listener {
        match *self {}
    }
}

impl Listener {
    pub fn wait(&mut self, _timeout: Duration) -> Result<Wake, DbError> {
        Err(DbError::not_built_in())
    }
}
