//! The store's tests run on both backends: SQLite in a temporary directory
//! and a real PostgreSQL (a server of the test's own, from the installed
//! binaries, on a loopback port, stopped and removed on drop — on success,
//! failure and panic), each with a fresh database.

use super::Store;
use knit_db::testing::TestPostgres;
use knit_db::{Datastore, Db, Limits};

/// One backend's database for one test; opened as often as the test likes
/// (a reopen sees what the previous `Store` wrote).
pub(crate) struct TestStore {
    pub name: &'static str,
    pub datastore: Datastore,
    _dir: Option<tempfile::TempDir>,
    _pg: Option<TestPostgres>,
}

impl TestStore {
    pub fn sqlite() -> TestStore {
        let dir = tempfile::tempdir().expect("temporary directory");
        TestStore {
            name: "SQLite",
            datastore: Datastore::Sqlite(dir.path().join("knit.db")),
            _dir: Some(dir),
            _pg: None,
        }
    }

    pub fn postgres() -> TestStore {
        let pg = TestPostgres::start()
            .unwrap_or_else(|e| panic!("PostgreSQL for the store's tests: {e}"));
        let url = pg
            .create_database("knit")
            .unwrap_or_else(|e| panic!("database for the store's tests: {e}"));
        TestStore {
            name: "PostgreSQL",
            datastore: Datastore::Postgres(url),
            _dir: None,
            _pg: Some(pg),
        }
    }

    pub fn open(&self) -> Store {
        Store::open_datastore(&self.datastore, Limits::default())
            .unwrap_or_else(|e| panic!("open the store on {}: {e}", self.name))
    }
}

/// Runs `test` on SQLite, then on PostgreSQL, each on a fresh database.
pub(crate) fn on_both_backends(test: impl Fn(&TestStore)) {
    for backend in [TestStore::sqlite(), TestStore::postgres()] {
        eprintln!("store test on {}", backend.name);
        test(&backend);
    }
}

/// [`on_both_backends`] with the store opened once.
pub(crate) fn each_store(test: impl Fn(&Store)) {
    on_both_backends(|backend| test(&backend.open()));
}

/// A pool `pool` with default spec and one pending instance per name (of
/// type "t"), each with its create intent.
pub(crate) fn pool_with_instances(store: &Store, pool: &str, names: &[&str]) {
    store
        .insert_pool(&knit_api::NodePool::new(
            pool,
            knit_api::NodePoolSpec::default(),
        ))
        .expect("insert the pool");
    let made: Vec<(String, String)> = names
        .iter()
        .map(|n| (n.to_string(), "t".to_string()))
        .collect();
    store
        .add_create_intents(pool, &made)
        .expect("create intents");
}

impl Store {
    /// The database itself, for tests that write or read raw SQL.
    pub(crate) fn db(&self) -> &Db {
        &self.db
    }
}
