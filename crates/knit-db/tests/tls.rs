//! TLS to a real PostgreSQL (a TestPostgres with `ssl = on` and a
//! certificate this test signs): each `sslmode` does what libpq's does —
//! `verify-full` proves the server by its CA and its name, `verify-ca` by
//! its CA only, `require` encrypts without proving, `disable` does not
//! encrypt — and a certificate from another CA, or for another name, is
//! refused with the reason.

use knit_db::testing::TestPostgres;
use knit_db::{Datastore, Db, DbError, Limits};
use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};

struct Ca {
    cert: rcgen::Certificate,
    key: KeyPair,
}

fn ca(name: &str) -> Ca {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let cert = params.self_signed(&key).unwrap();
    Ca { cert, key }
}

/// A server certificate for `names` signed by `ca`: (cert PEM, key PEM).
fn server_cert(ca: &Ca, names: &[&str]) -> (String, String) {
    let key = KeyPair::generate().unwrap();
    let params =
        CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).unwrap();
    let cert = params.signed_by(&key, &ca.cert, &ca.key).unwrap();
    (cert.pem(), key.serialize_pem())
}

fn start(ca: &Ca, names: &[&str]) -> Option<TestPostgres> {
    let (cert, key) = server_cert(ca, names);
    match TestPostgres::start_tls(&cert, &key) {
        Ok(pg) => Some(pg),
        Err(e) => {
            knit_test_support::missing(format!(
                "PostgreSQL for the test (scripts/setup.sh --tests installs it): {e}"
            ));
            None
        }
    }
}

fn open(url: &str) -> Result<Db, DbError> {
    Db::open(
        &Datastore::parse(url, std::path::Path::new("unused"))?,
        Limits::default(),
    )
}

/// Whether this connection is encrypted, by the server's own account.
fn encrypted(db: &Db) -> bool {
    db.read(|tx| {
        tx.query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )?
        .get::<bool>(0)
    })
    .unwrap()
}

fn ca_file(dir: &std::path::Path, name: &str, ca: &Ca) -> String {
    let path = dir.join(name);
    std::fs::write(&path, ca.cert.pem()).unwrap();
    path.display().to_string()
}

#[test]
fn each_sslmode_proves_what_libpq_proves() {
    let ours = ca("knit test CA");
    let Some(pg) = start(&ours, &["127.0.0.1", "localhost"]) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let root = ca_file(dir.path(), "ca.pem", &ours);
    let base = pg.url("postgres");

    let full = open(&format!("{base}?sslmode=verify-full&sslrootcert={root}")).unwrap();
    assert!(encrypted(&full), "verify-full: not encrypted");
    let require = open(&format!("{base}?sslmode=require")).unwrap();
    assert!(encrypted(&require), "require: not encrypted");
    // `prefer`, the default, takes the TLS the server offers.
    let prefer = open(&base).unwrap();
    assert!(encrypted(&prefer), "prefer: not encrypted");
    let plain = open(&format!("{base}?sslmode=disable")).unwrap();
    assert!(!encrypted(&plain), "disable: encrypted");

    // Another CA's certificate list: refused, with the certificate named.
    let theirs = ca("some other CA");
    let other_root = ca_file(dir.path(), "other.pem", &theirs);
    for mode in ["verify-full", "verify-ca", "require"] {
        let err = open(&format!("{base}?sslmode={mode}&sslrootcert={other_root}"))
            .err()
            .unwrap_or_else(|| panic!("{mode} with another CA connected"));
        assert_eq!(err.code(), "DB_CONNECT", "{mode}: {err}");
        assert!(
            err.to_string().to_lowercase().contains("certificate"),
            "{mode}: {err}"
        );
    }
}

#[test]
fn verify_full_checks_the_name_and_verify_ca_does_not() {
    let ours = ca("knit test CA");
    // A certificate that names another host than the URL's 127.0.0.1.
    let Some(pg) = start(&ours, &["db.example.internal"]) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let root = ca_file(dir.path(), "ca.pem", &ours);
    let base = pg.url("postgres");
    let err = open(&format!("{base}?sslmode=verify-full&sslrootcert={root}"))
        .err()
        .expect("verify-full accepted a certificate for another name");
    assert_eq!(err.code(), "DB_CONNECT", "{err}");
    assert!(
        err.to_string().contains("not valid for name")
            || err.to_string().to_lowercase().contains("name"),
        "{err}"
    );
    let ca_only = open(&format!("{base}?sslmode=verify-ca&sslrootcert={root}")).unwrap();
    assert!(encrypted(&ca_only));
}

#[test]
fn require_refuses_a_server_without_tls() {
    let pg = match TestPostgres::start() {
        Ok(pg) => pg,
        Err(e) => {
            knit_test_support::missing(format!(
                "PostgreSQL for the test (scripts/setup.sh --tests installs it): {e}"
            ));
            return;
        }
    };
    let base = pg.url("postgres");
    let err = open(&format!("{base}?sslmode=require"))
        .err()
        .expect("require connected without TLS");
    assert_eq!(err.code(), "DB_CONNECT", "{err}");
    // `prefer` falls back to plain, as libpq does.
    assert!(!encrypted(&open(&base).unwrap()));
}
