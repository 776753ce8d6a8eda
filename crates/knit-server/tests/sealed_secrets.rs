//! The secrets servers share through PostgreSQL are sealed at rest
//! (docs/security.md): a dump of the database holds no private key and no
//! admin token in clear; a server with another key, or none, refuses to
//! start and changes nothing; rows a release before sealing stored in
//! clear are sealed at the next start with the key.

use knit_db::testing::TestPostgres;
use knit_db::{Datastore, Db, Limits};
use knit_server::{NoCluster, Server, Settings};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn key_file(dir: &Path, name: &str, mode: u32) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, knit_server::sealed::new_key_text().unwrap()).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    path
}

fn settings(dir: &Path, name: &str, url: &str, key: Option<&Path>) -> Settings {
    let mut s = Settings::new(dir.join(name));
    s.listen = "127.0.0.1:0".parse().unwrap();
    s.console = None;
    s.datastore = Datastore::Postgres(url.to_string());
    s.secrets_key_file = key.map(Path::to_path_buf);
    s
}

async fn start(s: Settings) -> knit_server::Result<Server> {
    knit_server::start(s, None, Arc::new(NoCluster)).await
}

/// The database as `pg_dump` writes it (every table, every row).
fn dump(pg: &TestPostgres, db: &str) -> String {
    let bin = knit_db::testing::bindir().expect("PostgreSQL binaries");
    let mut child = Command::new(bin.join("pg_dump"))
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &pg.port().to_string(),
            "-U",
            "knit",
        ])
        .arg(db)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run pg_dump");
    // Bounded: a hung pg_dump is killed, not waited for forever.
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().expect("pg_dump status").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("pg_dump did not finish within 60 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().expect("pg_dump output");
    assert!(
        out.status.success(),
        "pg_dump: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("dump is UTF-8");
    assert!(
        text.contains("COPY public.shared_secrets"),
        "the dump holds the table: {}",
        &text[..text.len().min(2000)]
    );
    text
}

fn stored(db: &Db) -> Vec<(String, String)> {
    db.read(|tx| {
        let rows = tx.query("SELECT name, value FROM shared_secrets ORDER BY name", &[])?;
        rows.iter()
            .map(|r| Ok((r.get(0)?, r.get(1)?)))
            .collect::<Result<Vec<_>, knit_db::DbError>>()
    })
    .unwrap()
}

fn assert_nothing_in_clear(dump: &str, token: &str, ca_key: &str) {
    assert!(!dump.contains("PRIVATE KEY"), "a private key in clear");
    assert!(!dump.contains(token), "the admin token in clear");
    // The key's base64 body, line by line (a dump could re-wrap nothing,
    // but a line of it alone must not be there either).
    for line in ca_key
        .lines()
        .filter(|l| l.len() > 40 && !l.starts_with("-----"))
    {
        assert!(!dump.contains(line), "a line of the CA key in clear");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_secrets_are_sealed_and_a_server_without_the_key_refuses_to_start() {
    let pg = TestPostgres::start().unwrap_or_else(|e| panic!("PostgreSQL for the test: {e}"));
    let db_name = format!("sealed_{}", std::process::id());
    let url = pg.create_database(&db_name).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let key = key_file(dir.path(), "secrets.key", 0o600);
    let other_key = key_file(dir.path(), "other.key", 0o600);

    let a = start(settings(dir.path(), "a", &url, Some(&key)))
        .await
        .unwrap_or_else(|e| panic!("server a: {e}"));
    let token = a.admin_token().to_string();
    let ca_pem = a.ca_pem().to_string();
    let ca_key = std::fs::read_to_string(dir.path().join("a/pki/ca.key")).unwrap();
    assert!(ca_key.contains("PRIVATE KEY"));
    let dumped = dump(&pg, &db_name);
    assert_nothing_in_clear(&dumped, &token, &ca_key);
    assert!(
        dumped.contains("knit-sealed:v1:"),
        "the sealed rows are in the dump"
    );
    // The CA certificate is public and stays readable.
    assert!(dumped.contains("BEGIN CERTIFICATE"));

    // A second server with the same key gets the same CA and token.
    let b = start(settings(dir.path(), "b", &url, Some(&key)))
        .await
        .unwrap_or_else(|e| panic!("server b: {e}"));
    assert_eq!(b.admin_token(), token);
    assert_eq!(b.ca_pem(), ca_pem);
    b.shutdown().await;

    let db = Db::open(&Datastore::Postgres(url.clone()), Limits::default()).unwrap();
    let before = stored(&db);
    assert_eq!(before.len(), 3, "{before:?}");

    // Another key: refused, naming both keys' ids; nothing overwritten,
    // nothing of the secrets written to its state directory.
    let e = start(settings(dir.path(), "c", &url, Some(&other_key)))
        .await
        .err()
        .expect("a server with another key must not start");
    assert_eq!(e.code(), "SecretsKeyWrong", "{e}");
    let text = e.to_string();
    assert!(
        text.contains("--secrets-key-file") && text.contains("nothing was overwritten"),
        "{text}"
    );
    assert_eq!(stored(&db), before);
    assert!(!dir.path().join("c/pki/ca.key").exists());
    assert!(!dir.path().join("c/admin-token").exists());

    // No key at all: refused, naming the flag.
    let e = start(settings(dir.path(), "d", &url, None))
        .await
        .err()
        .expect("a server without the key must not start");
    assert_eq!(e.code(), "SecretsKeyMissing", "{e}");
    assert!(e.to_string().contains("--secrets-key-file PATH"), "{e}");
    assert_eq!(stored(&db), before);

    // A key file others may read: refused, naming the mode and the fix.
    let loose = key_file(dir.path(), "loose.key", 0o644);
    let e = start(settings(dir.path(), "e", &url, Some(&loose)))
        .await
        .err()
        .expect("a key file others can read must be refused");
    assert_eq!(e.code(), "SecretsKeyFile", "{e}");
    assert!(e.to_string().contains("mode 0644"), "{e}");

    // Upgrade: rows stored in clear (as a release before sealing wrote
    // them) are sealed by the first server that starts with the key.
    db.write(|tx| {
        tx.execute(
            "UPDATE shared_secrets SET value = ?1 WHERE name = 'ca.key'",
            knit_db::params![ca_key],
        )?;
        tx.execute(
            "UPDATE shared_secrets SET value = ?1 WHERE name = 'admin-token'",
            knit_db::params![format!("{token}\n")],
        )?;
        Ok::<_, knit_db::DbError>(())
    })
    .unwrap();
    assert!(dump(&pg, &db_name).contains("PRIVATE KEY"));
    let f = start(settings(dir.path(), "f", &url, Some(&key)))
        .await
        .unwrap_or_else(|e| panic!("server f (upgrade): {e}"));
    assert_eq!(f.admin_token(), token);
    assert_eq!(f.ca_pem(), ca_pem);
    f.shutdown().await;
    for (name, value) in stored(&db) {
        if name != "ca.pem" {
            assert!(
                knit_server::sealed::is_sealed(&value),
                "{name} sealed at start"
            );
        }
    }
    assert_nothing_in_clear(&dump(&pg, &db_name), &token, &ca_key);
    a.shutdown().await;
}
