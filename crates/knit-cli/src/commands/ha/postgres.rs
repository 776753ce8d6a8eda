//! PostgreSQL for the HA set: initdb once, started as the postgres user
//! when root, the `knit` role and database, the datastore URL.

use super::*;

/// PostgreSQL's superuser, for setting PostgreSQL up only; the servers
/// connect as `knit`, which is not one.
const ADMIN_ROLE: &str = "knit_admin";

/// The uid/gid PostgreSQL runs as: `postgres` when we are root (it
/// refuses to run as root); `None` otherwise (it runs as us).
pub(super) fn postgres_user() -> Result<Option<(u32, u32)>> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(None);
    }
    let name = CString::new("postgres").map_err(|e| CliError::Failed(e.to_string()))?;
    // SAFETY: getpwnam reads a static entry, copied out at once.
    let pw = unsafe { libc::getpwnam(name.as_ptr()) };
    if pw.is_null() {
        return Err(HaError::Postgres(
            "no `postgres` user: install Debian's postgresql package (scripts/setup.sh --ha)"
                .into(),
        )
        .into());
    }
    // SAFETY: non-null entry from getpwnam.
    Ok(Some(unsafe { ((*pw).pw_uid, (*pw).pw_gid) }))
}

/// The directory of `initdb` and `postgres`: `KNIT_PG_BINDIR`, else the
/// newest version under /usr/lib/postgresql (Debian's layout).
pub(super) fn postgres_bindir() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("KNIT_PG_BINDIR") {
        return Ok(PathBuf::from(dir));
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let v: u32 = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("postgres").is_file().then_some((v, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, p)| p).ok_or_else(|| {
        HaError::Postgres(
            "no server binaries under /usr/lib/postgresql: install Debian's postgresql package (scripts/setup.sh --ha), or set KNIT_PG_BINDIR".into(),
        )
        .into()
    })
}

/// A loopback port free now and none of `taken` (the ports HAProxy is to
/// listen on, not bound yet: the kernel could hand one of them out).
pub(super) fn free_loopback_port(taken: &[u16]) -> Result<u16> {
    port_outside(taken, || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
    })
}

/// The first port `next` offers that is none of `taken`.
fn port_outside(taken: &[u16], mut next: impl FnMut() -> std::io::Result<u16>) -> Result<u16> {
    for _ in 0..64 {
        let port = next().map_err(io("find a free loopback port"))?;
        if !taken.contains(&port) {
            return Ok(port);
        }
    }
    Err(HaError::Postgres(format!(
        "no free loopback port outside {taken:?} in 64 tries"
    ))
    .into())
}

/// PostgreSQL for the HA set: initdb once (the superuser `knit_admin`, a
/// password kept in a root-only file, password authentication), then
/// started on its own loopback port, as the postgres user when root;
/// reused when it already runs. The servers' role `knit` owns database
/// `knit` and nothing more (no SUPERUSER, CREATEDB, CREATEROLE). Returns
/// the datastore URL, which names the password file (`passfile=`).
/// `taken`: the ports HAProxy listens on, which PostgreSQL's must not be.
pub(super) fn postgres_up(layout: &Layout, n: u32, taken: &[u16]) -> Result<String> {
    let bin = postgres_bindir()?;
    let user = postgres_user()?;
    let dir = layout.postgres_dir();
    let data = layout.postgres_data();
    let run = dir.join("run");
    let pg = |m: String| CliError::from(HaError::Postgres(m));
    for d in [&dir, &run] {
        std::fs::create_dir_all(d).map_err(io(format!("create {}", d.display())))?;
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o700))
            .map_err(io(format!("chmod {}", d.display())))?;
        if let Some((uid, gid)) = user {
            std::os::unix::fs::chown(d, Some(uid), Some(gid))
                .map_err(io(format!("chown {}", d.display())))?;
        }
    }
    if user.is_some() {
        // The postgres user must pass through the state directory to its
        // own: search (x) only, nothing listed or read.
        for d in [&layout.state_dir, &layout.root] {
            let mode = std::fs::metadata(d)
                .map_err(io(format!("stat {}", d.display())))?
                .permissions()
                .mode();
            if mode & 0o001 == 0 {
                std::fs::set_permissions(d, std::fs::Permissions::from_mode(mode | 0o011))
                    .map_err(io(format!("chmod {}", d.display())))?;
            }
        }
    }
    let password = knit_os::durable::read_or_create_token(&layout.password_file())?;
    let admin_password = knit_os::durable::read_or_create_token(&layout.admin_password_file())?;
    let mut recorded: Option<Recorded> = std::fs::read(layout.recorded_file())
        .ok()
        .and_then(|raw| serde_json::from_slice(&raw).ok());
    if !data.join("PG_VERSION").is_file() {
        println!("PostgreSQL: initdb {} ({})", data.display(), bin.display());
        // A data directory an interrupted initdb left: initdb wants it empty.
        if data.exists() {
            std::fs::remove_dir_all(&data).map_err(io(format!("remove {}", data.display())))?;
        }
        let pwfile = dir.join("initdb.pw");
        std::fs::write(&pwfile, format!("{admin_password}\n"))
            .and_then(|_| std::fs::set_permissions(&pwfile, std::fs::Permissions::from_mode(0o600)))
            .map_err(io(format!("write {}", pwfile.display())))?;
        if let Some((uid, gid)) = user {
            std::os::unix::fs::chown(&pwfile, Some(uid), Some(gid))
                .map_err(io(format!("chown {}", pwfile.display())))?;
        }
        let mut initdb = Command::new(bin.join("initdb"));
        initdb
            .arg("-D")
            .arg(&data)
            .args([
                "-U",
                ADMIN_ROLE,
                "--auth-host=scram-sha-256",
                "--auth-local=scram-sha-256",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-instructions",
            ])
            .arg(format!("--pwfile={}", pwfile.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if let Some((uid, gid)) = user {
            initdb.uid(uid).gid(gid);
        }
        let out = run_bounded(&mut initdb, Duration::from_secs(120));
        let _ = std::fs::remove_file(&pwfile);
        let out = out.map_err(|e| pg(format!("initdb: {e}")))?;
        if !out.status.success() {
            return Err(pg(format!(
                "initdb failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
    }
    let port = match &recorded {
        Some(r) if taken.contains(&r.postgres_port) => {
            return Err(HaError::Postgres(format!(
                "PostgreSQL's port {} (recorded in {}) is also one HAProxy is to listen on ({taken:?}): choose other ports with --listen / --cluster-port",
                r.postgres_port,
                layout.recorded_file().display()
            ))
            .into());
        }
        Some(r) => r.postgres_port,
        None => {
            let r = Recorded {
                postgres_port: free_loopback_port(taken)?,
            };
            let raw = serde_json::to_vec_pretty(&r).map_err(|e| CliError::Failed(e.to_string()))?;
            knit_os::durable::write(&layout.recorded_file(), &raw, 0o600)?;
            let port = r.postgres_port;
            recorded = Some(r);
            port
        }
    };
    let _ = recorded;
    let url = |db: &str| format!("postgres://{ADMIN_ROLE}:{admin_password}@127.0.0.1:{port}/{db}");
    // A data directory an older `up` made: its superuser is `knit`.
    let legacy_url = format!("postgres://knit:{password}@127.0.0.1:{port}/postgres");
    let log_path = dir.join("postgres.log");
    if let Some(pid) = layout.running_one("postgres") {
        println!("PostgreSQL already running (pid {pid}) on 127.0.0.1:{port}");
    } else {
        let log = append_log(&log_path)?;
        // Each server holds a pool of connections, its embedded cluster another.
        let max_connections = (40 * n + 20).max(100);
        let mut server = Command::new(bin.join("postgres"));
        server
            .arg("-D")
            .arg(&data)
            .args(["-p", &port.to_string(), "-k"])
            .arg(&run)
            .args(["-c", "listen_addresses=127.0.0.1"])
            .args(["-c", &format!("max_connections={max_connections}")])
            .stdout(log.try_clone().map_err(io("dup log"))?)
            .stderr(log);
        let mut child = spawn_recorded(&mut server, &layout.pid_file("postgres"), user)?;
        let pid = child.id();
        println!(
            "PostgreSQL (pid {pid}) starting on 127.0.0.1:{port}; data {}; log {}",
            data.display(),
            log_path.display()
        );
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(pg(format!(
                    "exited ({status}) at start; see {}",
                    log_path.display()
                )));
            }
            if open_db(&url("postgres")).is_ok() || open_db(&legacy_url).is_ok() {
                break;
            }
            if Instant::now() > deadline {
                return Err(pg(format!(
                    "did not accept connections within {} s (pid {pid} left running for `knit down`); see {}",
                    START_TIMEOUT.as_secs(),
                    log_path.display()
                )));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    let admin = admin_connection(&url("postgres"), &legacy_url, &admin_password)?;
    // A `knit` that is a superuser (made by an older `up` as initdb's own
    // role): renamed out of the way, and a plain `knit` made in its place.
    if knit_db::roles::retire_superuser(&admin, "knit", "knit_bootstrap")
        .map_err(|e| pg(format!("retire the superuser knit: {e}")))?
    {
        println!("PostgreSQL: the superuser role knit of an older `up` renamed knit_bootstrap (no login); knit is made again without SUPERUSER");
    }
    knit_db::roles::ensure_owner(&admin, "knit", &password, "knit")
        .map_err(|e| pg(format!("knit's role and database: {e}")))?;
    let admin_on_knit = open_db(&url("knit")).map_err(|e| pg(format!("connect: {e}")))?;
    knit_db::roles::give_objects(&admin_on_knit, "knit")
        .map_err(|e| pg(format!("give knit's tables to its role: {e}")))?;
    // The servers read the password from this file (libpq's format), so
    // it is in no URL, command line or environment.
    let pgpass = layout.pgpass_file();
    knit_os::durable::write(
        &pgpass,
        format!("127.0.0.1:{port}:knit:knit:{password}\n").as_bytes(),
        0o600,
    )?;
    Ok(format!(
        "postgres://knit@127.0.0.1:{port}/knit?sslmode=disable&passfile={}",
        url_encoded(&pgpass)
    ))
}

/// A path as a URL query value: bytes other than letters, digits and
/// `/._-` percent-encoded.
pub(super) fn url_encoded(path: &Path) -> String {
    path.as_os_str()
        .as_bytes()
        .iter()
        .map(|&b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'/' | b'.' | b'_' | b'-' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The administrative connection: as `knit_admin`, or, on a data directory
/// an older `up` made (whose superuser is `knit`), as `knit` once to make
/// `knit_admin`.
pub(super) fn admin_connection(
    admin_url: &str,
    legacy_url: &str,
    admin_password: &str,
) -> Result<knit_db::Db> {
    let pg = |m: String| CliError::from(HaError::Postgres(m));
    let first = match open_db(admin_url) {
        Ok(db) => return Ok(db),
        Err(e) => e,
    };
    let Ok(legacy) = open_db(legacy_url) else {
        return Err(pg(format!("connect as {ADMIN_ROLE}: {first}")));
    };
    knit_db::roles::ensure_admin(&legacy, ADMIN_ROLE, admin_password)
        .map_err(|e| pg(format!("create role {ADMIN_ROLE}: {e}")))?;
    println!("PostgreSQL: administrative role {ADMIN_ROLE} made");
    open_db(admin_url).map_err(|e| pg(format!("connect as {ADMIN_ROLE}: {e}")))
}

pub(super) fn open_db(url: &str) -> std::result::Result<knit_db::Db, knit_db::DbError> {
    knit_db::Db::open(
        &knit_db::Datastore::Postgres(url.to_string()),
        knit_db::Limits::default(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn postgres_never_gets_a_port_haproxy_is_to_listen_on() {
        // The kernel offers the cluster API's port first (it is free until
        // HAProxy binds it): the next one is taken instead.
        let mut offers = [37501, 37501, 40000].into_iter();
        let port = port_outside(&[35047, 37501], || Ok(offers.next().unwrap_or(0))).unwrap();
        assert_eq!(port, 40000);
        let err = port_outside(&[1], || Ok(1)).unwrap_err();
        assert!(err.to_string().contains("no free loopback port"), "{err}");
    }
}
