//! The seam's promises, on both backends: the same portable SQL gives the
//! same answers; a failed closure changes nothing; a newer schema is
//! refused; concurrent writers on PostgreSQL do not lose updates.

use knit_db::testing::TestPostgres;
use knit_db::{params, Backend, Datastore, Db, DbError, Limits};

const STEPS: &[&str] = &[
    "CREATE TABLE items (id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL UNIQUE, n INTEGER NOT NULL DEFAULT 0, note TEXT)",
    "ALTER TABLE items ADD COLUMN flag INTEGER NOT NULL DEFAULT 0",
];

fn exercise(db: &Db) {
    db.migrate("test", STEPS, |_, _| Ok::<_, DbError>(()))
        .unwrap();
    assert_eq!(db.schema_version("test").unwrap(), 2);
    // Again: nothing to do.
    db.migrate("test", STEPS, |_, _| Ok::<_, DbError>(()))
        .unwrap();

    let id: i64 = db
        .write(|tx| {
            tx.query_one(
                "INSERT INTO items (name, n, note) VALUES (?1, ?2, ?3) RETURNING id",
                params!["a", 5i64, None::<String>],
            )?
            .get(0)
        })
        .unwrap();
    assert!(id >= 1);
    db.write(|tx| {
        tx.execute(
            "INSERT INTO items (name, n, flag) VALUES (?1, ?2, ?3) ON CONFLICT (name) DO NOTHING",
            params!["a", 99i64, true],
        )?;
        tx.execute(
            "INSERT INTO items (name, n, flag) VALUES (?1, ?2, ?3)",
            params!["b", 7i64, true],
        )
    })
    .unwrap();
    let rows = db
        .read(|tx| {
            tx.query(
                "SELECT name, n, note, flag, CAST(SUM(n) OVER () AS BIGINT) FROM items ORDER BY name",
                &[],
            )
        })
        .unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0].get::<String>(0).unwrap(), "a");
    assert_eq!(rows[0].get::<i64>(1).unwrap(), 5);
    assert_eq!(rows[0].get::<Option<String>>(2).unwrap(), None);
    assert!(!rows[0].get::<bool>(3).unwrap());
    assert!(rows[1].get::<bool>(3).unwrap());
    assert_eq!(rows[1].get::<i64>(4).unwrap(), 12);
    // Reading a column as the wrong type says which and why.
    let err = rows[0].get::<String>(1).unwrap_err();
    assert_eq!(err.code(), "DB_COLUMN");

    // A closure that fails leaves nothing behind.
    let failed: Result<(), DbError> = db.write(|tx| {
        tx.execute("UPDATE items SET n = 1000", &[])?;
        tx.execute("INSERT INTO items (name) VALUES (?1)", params!["a"])?;
        Ok(())
    });
    assert!(failed.unwrap_err().is_unique_violation());
    let total: i64 = db
        .read(|tx| {
            tx.query_one("SELECT CAST(SUM(n) AS BIGINT) FROM items", &[])?
                .get(0)
        })
        .unwrap();
    assert_eq!(total, 12);

    // The last statement with its commit (one round trip on PostgreSQL):
    // written with the statements before it; when it fails, they are
    // undone with it, and the connection serves the next transaction
    // (whose first and last statement it is, sent with its BEGIN).
    let sum = |db: &Db| -> i64 {
        db.read(|tx| {
            tx.query_one("SELECT CAST(SUM(n) AS BIGINT) FROM items", &[])?
                .get(0)
        })
        .unwrap()
    };
    let changed = db
        .write(|tx| {
            tx.execute("UPDATE items SET n = n + 1 WHERE name = ?1", params!["a"])?;
            tx.execute_then_commit("UPDATE items SET n = n + 1 WHERE name = ?1", params!["b"])
        })
        .unwrap();
    assert_eq!((changed, sum(db)), (1, 14));
    let failed: Result<u64, DbError> = db.write(|tx| {
        tx.execute("UPDATE items SET n = 1000", &[])?;
        tx.execute_then_commit("INSERT INTO items (name) VALUES (?1)", params!["a"])
    });
    assert!(failed.unwrap_err().is_unique_violation());
    assert_eq!(sum(db), 14);
    for _ in 0..3 {
        db.write(|tx| {
            tx.execute_then_commit("UPDATE items SET n = n - 1 WHERE name = ?1", params!["a"])
        })
        .unwrap();
    }
    assert_eq!(sum(db), 11);

    // A newer schema than this code knows is refused, with both versions.
    let err = db
        .migrate("test", &STEPS[..1], |_, _| Ok::<_, DbError>(()))
        .unwrap_err();
    assert_eq!(err.code(), "DB_NEWER_SCHEMA", "{err}");
    assert!(err.to_string().contains("version 2"), "{err}");
}

#[test]
fn sqlite_keeps_the_seams_promises() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(
        &Datastore::Sqlite(dir.path().join("t.db")),
        Limits::default(),
    )
    .unwrap();
    assert_eq!(db.backend(), Backend::Sqlite);
    exercise(&db);
}

#[test]
fn postgres_keeps_the_seams_promises() {
    let pg = TestPostgres::start().expect("PostgreSQL for the test");
    let url = pg.create_database("seam").unwrap();
    let db = Db::open(&Datastore::Postgres(url), Limits::default()).unwrap();
    assert_eq!(db.backend(), Backend::Postgres);
    exercise(&db);
}

/// Two servers incrementing one counter at once: SERIALIZABLE plus the
/// seam's re-run on conflict loses no increment.
#[test]
fn postgres_concurrent_writers_lose_no_update() {
    let pg = TestPostgres::start().expect("PostgreSQL for the test");
    let url = pg.create_database("race").unwrap();
    let setup = Db::open(&Datastore::Postgres(url.clone()), Limits::default()).unwrap();
    setup
        .write(|tx| {
            tx.batch("CREATE TABLE counter (id INTEGER PRIMARY KEY, n INTEGER NOT NULL)")?;
            tx.execute("INSERT INTO counter (id, n) VALUES (1, 0)", &[])
        })
        .unwrap();
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let url = url.clone();
            std::thread::spawn(move || {
                let db = Db::open(&Datastore::Postgres(url), Limits::default()).unwrap();
                for _ in 0..25 {
                    db.write(|tx| {
                        let n: i64 = tx
                            .query_one("SELECT n FROM counter WHERE id = 1", &[])?
                            .get(0)?;
                        tx.execute("UPDATE counter SET n = ?1 WHERE id = 1", params![n + 1])
                    })
                    .unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let n: i64 = setup
        .read(|tx| {
            tx.query_one("SELECT n FROM counter WHERE id = 1", &[])?
                .get(0)
        })
        .unwrap();
    assert_eq!(n, 100);
}

/// A process frozen in the middle of a transaction (SIGSTOP, a paused VM)
/// does not hold its row locks for as long as it is frozen: PostgreSQL
/// ends its session once it sat idle in the transaction past the limit,
/// and another writer of the same row goes on while the frozen one still
/// sleeps. Under `knit up --ha` a leader frozen inside a fenced write held
/// the lease row and the other server could never take the lease.
#[test]
fn postgres_ends_a_transaction_frozen_with_its_locks() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Duration;
    let pg = TestPostgres::start().expect("PostgreSQL for the test");
    let url = pg.create_database("frozen").unwrap();
    let limits = Limits {
        idle_in_transaction_timeout: Duration::from_secs(1),
        ..Limits::default()
    };
    let setup = Db::open(&Datastore::Postgres(url.clone()), limits).unwrap();
    setup
        .write(|tx| {
            tx.batch("CREATE TABLE lease (id INTEGER PRIMARY KEY, holder TEXT NOT NULL)")?;
            tx.execute("INSERT INTO lease (id, holder) VALUES (1, 'a')", &[])
        })
        .unwrap();
    let locked = Arc::new(AtomicBool::new(false));
    let woke = Arc::new(AtomicBool::new(false));
    let frozen = {
        let (url, locked, woke) = (url.clone(), locked.clone(), woke.clone());
        std::thread::spawn(move || {
            let db = Db::open(&Datastore::Postgres(url), limits).unwrap();
            let mut first = true;
            db.write(|tx| {
                tx.query("SELECT holder FROM lease WHERE id = 1 FOR SHARE", &[])?;
                if std::mem::take(&mut first) {
                    locked.store(true, Ordering::SeqCst);
                    // Frozen with the row locked, far past the limit.
                    std::thread::sleep(Duration::from_secs(8));
                    woke.store(true, Ordering::SeqCst);
                }
                Ok::<_, DbError>(())
            })
        })
    };
    while !locked.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(20));
    }
    setup
        .write(|tx| tx.execute("UPDATE lease SET holder = 'b' WHERE id = 1", &[]))
        .unwrap();
    assert!(
        !woke.load(Ordering::SeqCst),
        "the update waited for the frozen transaction to wake"
    );
    // Woken, the frozen writer finds its session ended: an error, never
    // a commit of what it did before it froze.
    assert!(frozen.join().unwrap().is_err());
}

/// PostgreSQL restarted while the pool held idle connections: the next
/// transaction is not an error (the closed connections are dropped, or
/// the work runs again on a new one when the first statement finds its
/// connection closed). `knit up --ha` restarts PostgreSQL under running
/// servers; a client's first call after it failed with "connection closed".
#[test]
fn postgres_restart_between_calls_is_not_an_error() {
    let mut pg = TestPostgres::start().expect("PostgreSQL for the test");
    let url = pg.create_database("idle").unwrap();
    let db = Db::open(&Datastore::Postgres(url), Limits::default()).unwrap();
    db.write(|tx| tx.batch("CREATE TABLE t (x INTEGER)"))
        .unwrap();
    pg.stop();
    pg.restart().unwrap();
    db.write(|tx| tx.execute("INSERT INTO t VALUES (1)", &[]))
        .expect("the first write after a restart");
    let n: i64 = db
        .read(|tx| tx.query_one("SELECT COUNT(*) FROM t", &[])?.get(0))
        .unwrap();
    assert_eq!(n, 1);
}

/// A database that is down gives a clear, typed error within the limit,
/// and the same `Db` works again once it is back.
#[test]
fn postgres_down_then_back() {
    let mut pg = TestPostgres::start().expect("PostgreSQL for the test");
    let url = pg.create_database("restart").unwrap();
    let limits = Limits {
        connect_timeout: std::time::Duration::from_secs(2),
        statement_timeout: std::time::Duration::from_secs(3),
        max_connections: 2,
        ..Limits::default()
    };
    let db = Db::open(&Datastore::Postgres(url), limits).unwrap();
    db.write(|tx| tx.batch("CREATE TABLE t (x INTEGER)"))
        .unwrap();
    pg.stop();
    let err = db
        .write(|tx| tx.execute("INSERT INTO t VALUES (1)", &[]))
        .unwrap_err();
    assert!(err.is_unavailable(), "{} {err}", err.code());
    pg.restart().unwrap();
    // The broken connection was dropped; the next call connects again.
    let mut ok = false;
    for _ in 0..3 {
        if db
            .write(|tx| tx.execute("INSERT INTO t VALUES (1)", &[]))
            .is_ok()
        {
            ok = true;
            break;
        }
    }
    assert!(ok, "the datastore did not come back after the restart");
}

#[test]
fn datastore_flag_is_parsed_with_clear_errors() {
    let def = std::path::Path::new("/state/knit.db");
    assert_eq!(
        Datastore::parse("sqlite", def).unwrap(),
        Datastore::Sqlite(def.into())
    );
    let pg = Datastore::parse("postgres://knit:secret@db:5432/knit", def).unwrap();
    assert!(pg.is_shared());
    assert_eq!(pg.redacted(), "postgres://knit:***@db:5432/knit");
    let err = Datastore::parse("mysql://x", def).unwrap_err();
    assert_eq!(err.code(), "DB_BAD_DATASTORE");
    assert!(err.to_string().contains("postgres://"), "{err}");
}

/// A listener gets the notifications of committed transactions only, with
/// their payloads; when its connection is ended it says so, connects again
/// on the next wait, and hears the notifications sent after. Also: a
/// write's `LOCK TABLE` after `BEGIN` and a one-statement read.
#[test]
fn postgres_listener_hears_commits_and_reconnects() {
    use knit_db::Wake;
    use std::time::Duration;
    let pg = TestPostgres::start().expect("PostgreSQL for the test");
    let url = pg.create_database("listen").unwrap();
    let db = Db::open(&Datastore::Postgres(url), Limits::default()).unwrap();
    db.write(|tx| tx.batch("CREATE TABLE t (x INTEGER)"))
        .unwrap();
    let mut l = db.listener("knit_test").expect("a listener on PostgreSQL");
    assert_eq!(l.wait(Duration::from_secs(5)).unwrap(), Wake::Connected);
    let notify = |payload: &str, commit: bool| {
        let r: Result<(), DbError> =
            db.write_after("LOCK TABLE t IN SHARE ROW EXCLUSIVE MODE", |tx| {
                tx.execute("INSERT INTO t VALUES (1)", &[])?;
                tx.query(
                    "SELECT CAST(1 AS BIGINT) FROM pg_notify('knit_test', ?1)",
                    params![payload],
                )?;
                if commit {
                    Ok(())
                } else {
                    Err(DbError::NoRow("rolled back on purpose".into()))
                }
            });
        assert_eq!(r.is_ok(), commit);
    };
    notify("rolled back", false);
    notify("7", true);
    notify("8", true);
    let mut heard = Vec::new();
    while heard.len() < 2 {
        match l.wait(Duration::from_secs(10)).unwrap() {
            Wake::Notified(p) => heard.extend(p),
            other => panic!("expected notifications, got {other:?}"),
        }
    }
    assert_eq!(heard, ["7", "8"]);
    let rows = db
        .query_once("SELECT CAST(COUNT(*) AS BIGINT) FROM t", &[])
        .unwrap();
    assert_eq!(
        rows[0].get::<i64>(0).unwrap(),
        2,
        "the rolled back insert is not there"
    );
    // The server ends the listening connection (as a restart would).
    db.write(|tx| {
        tx.query(
            "SELECT CAST(1 AS BIGINT) FROM pg_stat_activity, pg_terminate_backend(pid) WHERE query LIKE 'LISTEN%' AND pid <> pg_backend_pid()",
            &[],
        )
    })
    .unwrap();
    let err = loop {
        match l.wait(Duration::from_secs(10)) {
            Err(e) => break e,
            Ok(Wake::Quiet) => panic!("the ended connection was not noticed"),
            Ok(_) => {}
        }
    };
    assert!(err.is_unavailable(), "{} {err}", err.code());
    assert_eq!(l.wait(Duration::from_secs(5)).unwrap(), Wake::Connected);
    notify("9", true);
    assert_eq!(
        l.wait(Duration::from_secs(10)).unwrap(),
        Wake::Notified(vec!["9".into()])
    );
    let sqlite = Db::open(&Datastore::SqliteMemory, Limits::default()).unwrap();
    assert!(sqlite.listener("knit_test").is_none());
}
