//! knit's own PostgreSQL role (`roles::ensure_owner`) and the password
//! from a file (`passfile=` in the URL), against a real PostgreSQL that
//! asks every role but its superuser for a scram-sha-256 password.

use knit_db::testing::TestPostgres;
use knit_db::{params, roles, Datastore, Db, DbError, Limits};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

fn open(url: &str) -> Result<Db, DbError> {
    Db::open(&Datastore::Postgres(url.to_string()), Limits::default())
}

fn passfile(dir: &Path, name: &str, line: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, format!("# knit\n{line}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path.display().to_string()
}

#[test]
fn knit_role_owns_its_database_is_no_superuser_and_logs_in_from_a_passfile() {
    let pg = TestPostgres::start_with_password_auth()
        .unwrap_or_else(|e| panic!("PostgreSQL for the test: {e}"));
    let port = pg.port();
    let dir = tempfile::tempdir().unwrap();
    let admin = open(&pg.url("postgres")).unwrap();
    // A database an older knit made as a superuser: its tables are the
    // superuser's until they are given to the knit role.
    admin.autocommit("CREATE DATABASE appdb").unwrap();
    let admin_on_db = open(&pg.url("appdb")).unwrap();
    admin_on_db
        .write(|tx| {
            tx.batch("CREATE TABLE legacy (v TEXT NOT NULL); CREATE TABLE more_rows (n INTEGER)")
        })
        .unwrap();

    roles::ensure_owner(&admin, "app", "first-password", "appdb").unwrap();
    roles::give_objects(&admin_on_db, "app").unwrap();

    let url = |file: &str| {
        format!("postgres://app@127.0.0.1:{port}/appdb?sslmode=disable&passfile={file}")
    };
    let good = passfile(
        dir.path(),
        "good",
        &format!("127.0.0.1:{port}:appdb:app:first-password"),
    );
    let app =
        open(&url(&good)).unwrap_or_else(|e| panic!("the knit role through its passfile: {e}"));
    let (user, sup, createdb, createrole, owner): (String, bool, bool, bool, String) = app
        .read(|tx| {
            let r = tx.query_one(
                "SELECT current_user::TEXT, rolsuper, rolcreatedb, rolcreaterole, \
                 (SELECT pg_get_userbyid(datdba)::TEXT FROM pg_database WHERE datname = current_database()) \
                 FROM pg_roles WHERE rolname = current_user",
                &[],
            )?;
            Ok::<_, DbError>((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
        })
        .unwrap();
    assert_eq!(user, "app");
    assert!(!sup, "the knit role is a superuser");
    assert!(
        !createdb && !createrole,
        "CREATEDB {createdb}, CREATEROLE {createrole}"
    );
    assert_eq!(owner, "app", "the knit role owns its database");
    // It owns the tables made before it (and makes its own).
    app.write(|tx| {
        tx.execute("INSERT INTO legacy (v) VALUES (?1)", params!["x"])?;
        tx.batch("ALTER TABLE more_rows ADD COLUMN m INTEGER; CREATE TABLE fresh (v TEXT)")
    })
    .unwrap_or_else(|e| panic!("the knit role on its own tables: {e}"));
    // And nothing beyond its database.
    let e = app.autocommit("CREATE DATABASE another").unwrap_err();
    assert!(e.to_string().contains("permission denied"), "{e}");
    let e = app.autocommit("CREATE ROLE intruder").unwrap_err();
    assert!(e.to_string().contains("permission denied"), "{e}");
    drop(app);

    // A wrong password in the file is refused by the server, and the
    // password is in no error; no password at all is refused too.
    let wrong = passfile(
        dir.path(),
        "wrong",
        &format!("*:{port}:appdb:app:not-the-password"),
    );
    let e = open(&url(&wrong))
        .err()
        .expect("a wrong password must be refused");
    assert_eq!(e.code(), "DB_CONNECT", "{e}");
    assert!(!e.to_string().contains("not-the-password"), "{e}");
    let e = open(&format!(
        "postgres://app@127.0.0.1:{port}/appdb?sslmode=disable"
    ))
    .err()
    .expect("no password must be refused");
    assert_eq!(e.code(), "DB_CONNECT", "{e}");

    // Run again (every `knit up --ha` does) with a new password: the
    // old file no longer works, one with the new password does.
    roles::ensure_owner(&admin, "app", "second-password", "appdb").unwrap();
    assert!(open(&url(&good)).is_err());
    let second = passfile(dir.path(), "second", "127.0.0.1:*:*:app:second-password");
    open(&url(&second)).unwrap_or_else(|e| panic!("after the password changed: {e}"));

    // Another login role cannot even connect to knit's database.
    admin
        .autocommit("CREATE ROLE other LOGIN PASSWORD 'other-password'")
        .unwrap();
    let other = passfile(dir.path(), "other", "*:*:*:other:other-password");
    let e = open(&format!(
        "postgres://other@127.0.0.1:{port}/appdb?sslmode=disable&passfile={other}"
    ))
    .err()
    .expect("another role must not connect to knit's database");
    assert!(e.to_string().contains("permission denied"), "{e}");
}

#[test]
fn a_passfile_beside_a_url_password_or_readable_by_others_is_refused_at_parse() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pgpass");
    std::fs::write(&path, "*:*:*:*:secret-word\n").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let p = path.display();
    let e = Datastore::parse(
        &format!("postgres://knit:inline@127.0.0.1:5432/knit?passfile={p}"),
        Path::new("/unused"),
    )
    .unwrap_err();
    assert_eq!(e.code(), "DB_BAD_DATASTORE");
    assert!(e.to_string().contains("password too"), "{e}");
    assert!(!e.to_string().contains("inline"), "{e}");
    // Parsing does not read the file; opening does, and refuses its mode.
    let url = format!("postgres://knit@127.0.0.1:1/knit?sslmode=disable&passfile={p}");
    Datastore::parse(&url, Path::new("/unused")).unwrap();
    let e = open(&url).err().expect("a passfile others can read");
    assert_eq!(e.code(), "DB_BAD_DATASTORE");
    let text = e.to_string();
    assert!(
        text.contains("mode 0644") && text.contains("chmod 600"),
        "{text}"
    );
    assert!(!text.contains("secret-word"), "{text}");
}

#[test]
fn a_superuser_knit_of_an_older_release_is_retired_and_made_again_plain() {
    // TestPostgres's own superuser is `knit`, made by initdb: exactly what
    // an older `knit up --ha` left (its tables owned by that superuser).
    let pg = TestPostgres::start_with_password_auth()
        .unwrap_or_else(|e| panic!("PostgreSQL for the test: {e}"));
    let port = pg.port();
    let dir = tempfile::tempdir().unwrap();
    let legacy = open(&pg.url("postgres")).unwrap();
    legacy.autocommit("CREATE DATABASE knit").unwrap();
    open(&pg.url("knit"))
        .unwrap()
        .write(|tx| tx.batch("CREATE TABLE shared_secrets (name TEXT PRIMARY KEY, value TEXT)"))
        .unwrap();
    assert!(roles::ensure_admin(&legacy, "knit_admin", "admin-password").unwrap());
    assert!(!roles::ensure_admin(&legacy, "knit_admin", "admin-password").unwrap());
    drop(legacy);

    let admin_pass = passfile(dir.path(), "admin", "*:*:*:knit_admin:admin-password");
    let admin_url = |db: &str| {
        format!("postgres://knit_admin@127.0.0.1:{port}/{db}?sslmode=disable&passfile={admin_pass}")
    };
    let admin = open(&admin_url("postgres"))
        .unwrap_or_else(|e| panic!("the administrative role by its password: {e}"));
    assert!(roles::retire_superuser(&admin, "knit", "knit_bootstrap").unwrap());
    assert!(!roles::retire_superuser(&admin, "knit", "knit_bootstrap").unwrap());
    roles::ensure_owner(&admin, "knit", "knit-password", "knit").unwrap();
    roles::give_objects(&open(&admin_url("knit")).unwrap(), "knit").unwrap();

    let knit_pass = passfile(dir.path(), "knit", "*:*:knit:knit:knit-password");
    let knit = open(&format!(
        "postgres://knit@127.0.0.1:{port}/knit?sslmode=disable&passfile={knit_pass}"
    ))
    .unwrap_or_else(|e| panic!("the new knit role: {e}"));
    let (sup, owner): (bool, String) = knit
        .read(|tx| {
            let r = tx.query_one(
                "SELECT rolsuper, (SELECT pg_get_userbyid(datdba)::TEXT FROM pg_database WHERE datname = 'knit') \
                 FROM pg_roles WHERE rolname = current_user",
                &[],
            )?;
            Ok::<_, DbError>((r.get(0)?, r.get(1)?))
        })
        .unwrap();
    assert!(!sup, "knit is still a superuser");
    assert_eq!(owner, "knit");
    knit.write(|tx| {
        tx.execute(
            "INSERT INTO shared_secrets (name, value) VALUES (?1, ?2)",
            params!["a", "b"],
        )
    })
    .unwrap_or_else(|e| panic!("knit on the table the superuser made: {e}"));
    // The retired superuser cannot log in any more.
    let can_login: bool = admin
        .read(|tx| {
            tx.query_one(
                "SELECT rolcanlogin FROM pg_roles WHERE rolname = 'knit_bootstrap'",
                &[],
            )?
            .get(0)
        })
        .unwrap();
    assert!(!can_login, "the retired superuser can still log in");
}
