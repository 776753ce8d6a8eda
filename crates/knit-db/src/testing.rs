//! A real PostgreSQL server for tests: its own data directory and loopback
//! port, started from the installed server binaries (Debian's `postgresql`
//! package), stopped by its PID and removed on drop — on success, failure
//! and panic. As root the server runs as the `postgres` user (PostgreSQL
//! refuses to run as root), in a directory given to that user.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{Datastore, Db, Limits};

/// initdb writes a few MiB with `--no-sync`: seconds, even on a busy host.
const INITDB_TIMEOUT: Duration = Duration::from_secs(120);
/// What is kept of initdb's output for an error message.
const INITDB_OUTPUT_CAP: usize = 64 << 10;

pub struct TestPostgres {
    child: Option<Child>,
    dir: tempfile::TempDir,
    port: u16,
    /// `-c name=value` settings beyond the defaults (TLS, say).
    settings: Vec<String>,
}

/// The directory of `initdb` and `postgres`: `KNIT_PG_BINDIR`, else the
/// newest version under /usr/lib/postgresql.
pub fn bindir() -> Option<PathBuf> {
    if let Ok(dir) = std::env::var("KNIT_PG_BINDIR") {
        return Some(PathBuf::from(dir));
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .flatten()
        .filter_map(|e| {
            let v: u32 = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("postgres").exists().then_some((v, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, p)| p)
}

/// The uid/gid the server runs as: `postgres` when we are root.
fn server_user() -> Option<(u32, u32)> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    let name = std::ffi::CString::new("postgres").ok()?;
    // SAFETY: getpwnam reads a static entry; copied out at once.
    let pw = unsafe { libc::getpwnam(name.as_ptr()) };
    if pw.is_null() {
        return None;
    }
    // SAFETY: non-null entry from getpwnam.
    Some(unsafe { ((*pw).pw_uid, (*pw).pw_gid) })
}

fn chown_tree(path: &Path, uid: u32, gid: u32) -> std::io::Result<()> {
    std::os::unix::fs::chown(path, Some(uid), Some(gid))
}

fn as_server_user(cmd: &mut Command) {
    if let Some((uid, gid)) = server_user() {
        cmd.uid(uid).gid(gid);
    }
    // SAFETY: prctl only; runs in the child before exec.
    unsafe {
        cmd.pre_exec(|| {
            // The server ends with the test process, even on SIGKILL.
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
}

/// The server on `dir`'s data and socket directories, logging to `log`,
/// with `settings` (`name=value`) beyond the defaults.
fn spawn_server(
    bin: &Path,
    dir: &Path,
    port: u16,
    settings: &[String],
    log: std::fs::File,
) -> Result<Child, String> {
    let mut server = Command::new(bin.join("postgres"));
    server
        .arg("-D")
        .arg(dir.join("data"))
        .args(["-p", &port.to_string(), "-k"])
        .arg(dir.join("run"))
        .args([
            "-c",
            "listen_addresses=127.0.0.1",
            "-c",
            "fsync=off",
            "-c",
            "max_connections=200",
        ]);
    for setting in settings {
        server.arg("-c").arg(setting);
    }
    server
        .stdin(Stdio::null())
        .stdout(log.try_clone().map_err(|e| e.to_string())?)
        .stderr(log);
    as_server_user(&mut server);
    server.spawn().map_err(|e| format!("start postgres: {e}"))
}

impl TestPostgres {
    /// Starts a server; `Err` says what is missing (install `postgresql`).
    pub fn start() -> Result<TestPostgres, String> {
        TestPostgres::start_with(None, false)
    }

    /// Starts a server that also offers TLS with this certificate chain
    /// and key (PEM), as `ssl = on` in postgresql.conf does; plain
    /// connections are still accepted, as with a stock server.
    pub fn start_tls(cert_pem: &str, key_pem: &str) -> Result<TestPostgres, String> {
        TestPostgres::start_with(Some((cert_pem, key_pem)), false)
    }

    /// Starts a server where every role but the superuser `knit` must
    /// give its password over TCP (scram-sha-256), as a production
    /// server asks: for tests of passwords and of knit's own role.
    pub fn start_with_password_auth() -> Result<TestPostgres, String> {
        TestPostgres::start_with(None, true)
    }

    fn start_with(tls: Option<(&str, &str)>, passwords: bool) -> Result<TestPostgres, String> {
        let bin = bindir().ok_or(
            "PostgreSQL server binaries not found under /usr/lib/postgresql (install the `postgresql` package, or set KNIT_PG_BINDIR)",
        )?;
        let dir = tempfile::Builder::new()
            .prefix("knit-pg-test-")
            .tempdir()
            .map_err(|e| format!("temporary directory: {e}"))?;
        let data = dir.path().join("data");
        let sockets = dir.path().join("run");
        std::fs::create_dir_all(&sockets).map_err(|e| e.to_string())?;
        if let Some((uid, gid)) = server_user() {
            for p in [dir.path(), &sockets] {
                chown_tree(p, uid, gid).map_err(|e| format!("chown {}: {e}", p.display()))?;
            }
        }
        let mut initdb = Command::new(bin.join("initdb"));
        initdb.args(["-D"]).arg(&data).args([
            "-U",
            "knit",
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-sync",
            "--no-instructions",
        ]);
        as_server_user(&mut initdb);
        let out = knit_os::command::run(&mut initdb, INITDB_TIMEOUT, INITDB_OUTPUT_CAP)
            .map_err(|e| format!("initdb: {e}"))?;
        if !out.success() {
            return Err(format!("initdb failed: {}", out.stderr_text()));
        }
        if passwords {
            let hba = data.join("pg_hba.conf");
            std::fs::write(
                &hba,
                "local all all trust\nhost all knit 127.0.0.1/32 trust\nhost all all 127.0.0.1/32 scram-sha-256\n",
            )
            .map_err(|e| format!("write {}: {e}", hba.display()))?;
            if let Some((uid, gid)) = server_user() {
                chown_tree(&hba, uid, gid).map_err(|e| format!("chown {}: {e}", hba.display()))?;
            }
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("free port: {e}"))?
            .port();
        let log = std::fs::File::create(dir.path().join("postgres.log"))
            .map_err(|e| format!("log file: {e}"))?;
        if let Some((uid, gid)) = server_user() {
            let _ = chown_tree(&dir.path().join("postgres.log"), uid, gid);
        }
        let mut settings = Vec::new();
        if let Some((cert, key)) = tls {
            let tls_dir = dir.path().join("tls");
            std::fs::create_dir_all(&tls_dir).map_err(|e| e.to_string())?;
            let (cert_file, key_file) = (tls_dir.join("server.crt"), tls_dir.join("server.key"));
            // PostgreSQL refuses a key file others can read.
            for (path, text, mode) in [(&cert_file, cert, 0o644), (&key_file, key, 0o600)] {
                std::fs::write(path, text)
                    .and_then(|_| {
                        std::fs::set_permissions(
                            path,
                            std::os::unix::fs::PermissionsExt::from_mode(mode),
                        )
                    })
                    .map_err(|e| format!("write {}: {e}", path.display()))?;
            }
            if let Some((uid, gid)) = server_user() {
                for p in [&tls_dir, &cert_file, &key_file] {
                    chown_tree(p, uid, gid).map_err(|e| format!("chown {}: {e}", p.display()))?;
                }
            }
            settings.push("ssl=on".to_string());
            settings.push(format!("ssl_cert_file={}", cert_file.display()));
            settings.push(format!("ssl_key_file={}", key_file.display()));
        }
        let child = spawn_server(&bin, dir.path(), port, &settings, log)?;
        let pg = TestPostgres {
            child: Some(child),
            dir,
            port,
            settings,
        };
        pg.wait_ready()?;
        Ok(pg)
    }

    fn wait_ready(&self) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match Db::open(
                &Datastore::Postgres(self.url("postgres")),
                Limits::default(),
            ) {
                Ok(_) => return Ok(()),
                Err(e) if Instant::now() > deadline => {
                    return Err(format!(
                        "PostgreSQL did not start: {e}; log: {}",
                        self.log()
                    ))
                }
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's log so far (for a failing test's message).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("postgres.log")).unwrap_or_default()
    }

    /// The URL of database `db` on this server.
    pub fn url(&self, db: &str) -> String {
        format!("postgres://knit@127.0.0.1:{}/{db}", self.port)
    }

    /// Creates database `name` (a fresh one per test) and gives its URL.
    pub fn create_database(&self, name: &str) -> Result<String, String> {
        let admin = Db::open(
            &Datastore::Postgres(self.url("postgres")),
            Limits::default(),
        )
        .map_err(|e| e.to_string())?;
        // CREATE DATABASE cannot run in a transaction block: run it as a
        // statement of its own in autocommit (READ COMMITTED BEGIN would wrap it).
        admin
            .autocommit(&format!("CREATE DATABASE \"{name}\""))
            .map_err(|e| e.to_string())?;
        Ok(self.url(name))
    }

    /// The server's PID (for tests that stop or kill it on purpose).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Stops the server (fast shutdown) and waits for it; `restart` starts
    /// it again on the same port and data.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SAFETY: a signal to our own child, by its PID.
            unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
            let deadline = Instant::now() + Duration::from_secs(20);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn restart(&mut self) -> Result<(), String> {
        self.stop();
        let bin = bindir().ok_or("PostgreSQL binaries vanished")?;
        let log = std::fs::OpenOptions::new()
            .append(true)
            .open(self.dir.path().join("postgres.log"))
            .map_err(|e| e.to_string())?;
        self.child = Some(spawn_server(
            &bin,
            self.dir.path(),
            self.port,
            &self.settings,
            log,
        )?);
        self.wait_ready()
    }
}

impl Drop for TestPostgres {
    fn drop(&mut self) {
        self.stop();
    }
}
