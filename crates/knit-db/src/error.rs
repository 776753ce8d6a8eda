use std::time::Duration;

/// A failure of the datastore. `code()` is stable for scripts and logs.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error("datastore {value:?}: {rule}")]
    BadDatastore { value: String, rule: String },
    #[error("SQLite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("PostgreSQL at {target}: cannot connect: {reason}")]
    Connect { target: String, reason: String },
    #[error("PostgreSQL: {0}")]
    Postgres(String),
    #[error("the database did not answer within {0:?}")]
    Timeout(Duration),
    #[error("column {index}: {reason}")]
    Column { index: usize, reason: String },
    #[error("query `{0}…` returned no row")]
    NoRow(String),
    #[error(
        "the database has schema version {found} of {component}, newer than this knit knows ({known}): use a newer knit"
    )]
    NewerSchema {
        component: String,
        found: i64,
        known: i64,
    },
    #[error("the transaction conflicted with other servers {0} times in a row")]
    Conflict(u32),
    #[error("cannot start {what}: {source}")]
    Spawn {
        what: &'static str,
        source: std::io::Error,
    },
    /// A PostgreSQL datastore asked of a build without the `postgres`
    /// feature (scripts/up.sh's build).
    #[error(
        "a PostgreSQL datastore needs the cargo feature `{feature}`, which this knit was built without (scripts/up.sh builds only what the main job runs): build knit with it: `{command}` (`cargo build --release --locked -p knit-cli` builds every feature)"
    )]
    NotBuiltIn {
        feature: &'static str,
        command: &'static str,
    },
}

impl DbError {
    pub fn code(&self) -> &'static str {
        match self {
            DbError::BadDatastore { .. } => "DB_BAD_DATASTORE",
            DbError::Sqlite(_) => "DB_SQLITE",
            DbError::Connect { .. } => "DB_CONNECT",
            DbError::Postgres(_) => "DB_POSTGRES",
            DbError::Timeout(_) => "DB_TIMEOUT",
            DbError::Column { .. } => "DB_COLUMN",
            DbError::NoRow(_) => "DB_NO_ROW",
            DbError::NewerSchema { .. } => "DB_NEWER_SCHEMA",
            DbError::Conflict(_) => "DB_CONFLICT",
            DbError::Spawn { .. } => "DB_SPAWN",
            DbError::NotBuiltIn { .. } => "DB_NOT_BUILT_IN",
        }
    }

    /// PostgreSQL refused by a build without it.
    pub fn not_built_in() -> DbError {
        DbError::NotBuiltIn {
            feature: "postgres",
            command: "cargo build --release --locked -p knit-cli --no-default-features --features postgres",
        }
    }

    /// A unique or primary key already taken (both backends).
    pub fn is_unique_violation(&self) -> bool {
        match self {
            DbError::Sqlite(rusqlite::Error::SqliteFailure(e, _)) => {
                e.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_PRIMARYKEY
                    || e.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE
            }
            DbError::Postgres(m) => m.starts_with("23505"),
            _ => false,
        }
    }

    /// The database could not be reached or did not answer: worth a retry
    /// later, not a sign of bad data.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, DbError::Connect { .. } | DbError::Timeout(_))
            || matches!(self, DbError::Postgres(m) if m.starts_with("08") || m.starts_with("57P") || m.contains("connection closed"))
    }
}
