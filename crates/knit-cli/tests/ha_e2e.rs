//! `knit up --ha 2` end to end, as root: PostgreSQL (Debian's binaries,
//! its own data directory and port), two knit servers on it and HAProxy in
//! front of the API and the embedded Kubernetes API; `knit get servers`
//! shows both with one leader; a pool's node joins through HAProxy and
//! reaches Ready; the leader is killed by PID and the other takes over, the
//! node keeps renewing its Lease and a second node joins through HAProxy;
//! `knit down` leaves no process of ours. A second test carries one
//! scale-out after another through a leader killed -9, a leader frozen
//! (SIGSTOP) past its lease and the database stopped and started again.
//! A third brings up the set on PostgreSQL data an older `up` made, whose
//! superuser was knit's own role.

mod common;

use common::{is_root, on_path, Env};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const POOL: &str = "apiVersion: knit.dev/v1alpha1
kind: NodePool
metadata: {name: workers}
spec:
  replicas: 0
  systemDisk: {sizeGiB: 20}
";

/// The PIDs `knit up --ha` recorded (`<state>/ha/pids/*.pid`), by name.
fn recorded_pids(state: &Path) -> Vec<(String, u32)> {
    let mut out: Vec<(String, u32)> = std::fs::read_dir(state.join("ha/pids"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_str()?.strip_suffix(".pid")?.to_string();
            let pid = std::fs::read_to_string(e.path())
                .ok()?
                .trim()
                .parse()
                .ok()?;
            Some((name, pid))
        })
        .collect();
    out.sort();
    out
}

/// `knit up --ha 2` for this environment (its own state directory,
/// ports, bridge and subnet); run again, it starts what is not running.
fn up_ha(env: &Env) -> (bool, String, String) {
    let state = env.state_dir();
    let port = env.port;
    let cluster_port = env.cluster_port.unwrap();
    let listen = format!("127.0.0.1:{port},{}:{port}", env.gateway);
    env.knit(&[
        "up",
        "--ha",
        "2",
        "--state-dir",
        state.to_str().unwrap(),
        "--listen",
        &listen,
        "--advertise-address",
        &env.gateway.clone(),
        "--cluster",
        "embedded",
        "--cluster-port",
        &cluster_port.to_string(),
        "--console-listen",
        "off",
        "--parallelism",
        "2",
        "--local-state-dir",
        env.path("local").to_str().unwrap(),
        "--local-bridge",
        &env.bridge.clone(),
        "--local-subnet",
        &env.subnet.clone(),
    ])
}

/// `up_ha` that must succeed (`when` names the step); what it started is
/// handed to the environment's cleanup first, whatever happened.
fn up_ha_ok(env: &mut Env, when: &str) {
    let (ok, out, err) = up_ha(env);
    adopt_all(env);
    assert!(
        ok,
        "knit up --ha 2 {when}:\n{out}\n{err}\n{}",
        logs(&env.state_dir())
    );
}

/// The PID `knit up --ha` recorded for `name` (`server-<i>`, `postgres`).
fn recorded_pid(state: &Path, name: &str) -> u32 {
    recorded_pids(state)
        .into_iter()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("no PID recorded for {name}"))
        .1
}

/// Every recorded process handed to the environment's cleanup.
fn adopt_all(env: &mut Env) {
    for (_, pid) in recorded_pids(&env.state_dir()) {
        env.adopt(pid);
    }
}

/// Waits (60 s at most) until `get servers` lists `n` live servers with
/// exactly one leader among them; the list.
fn one_leader_of(env: &Env, n: usize, not: Option<u64>) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        // A call that fails is reported and asked again within the wait.
        let (ok, out, err) = env.knit(&["get", "servers", "-o", "json"]);
        if !ok {
            eprintln!("knit get servers failed (asked again): {err}");
        }
        let all: Value = serde_json::from_str(&out).unwrap_or(Value::Null);
        let list: Vec<Value> = all["items"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|s| s["stale"] != true)
            .collect();
        let leaders: Vec<&Value> = list.iter().filter(|s| s["leader"] == true).collect();
        if list.len() == n && leaders.len() == 1 && leaders[0]["pid"].as_u64() != not {
            return list;
        }
        assert!(
            Instant::now() < deadline,
            "no single leader among {n} live servers within 60 s: {list:#?}\nlast error: {err}\n{}",
            logs(&env.state_dir())
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// What `knit up --ha` keeps in PostgreSQL and how the servers reach it
/// (docs/security.md): every row of every table of knit's database, read
/// as text, holds no private key and no admin token; `knit` is not a
/// superuser and owns the database; the servers' command lines and
/// environments hold neither password but name the secrets key file.
fn secrets_sealed_and_knit_role_plain(state: &Path) {
    let ha = state.join("ha");
    let read = |f: &str| {
        std::fs::read_to_string(ha.join(f))
            .unwrap()
            .trim()
            .to_string()
    };
    let admin = admin_db(state);
    let (rows, superuser, owner) = admin
        .read(|tx| {
            let tables: Vec<String> = tx
                .query("SELECT tablename::TEXT FROM pg_tables WHERE schemaname = 'public'", &[])?
                .iter()
                .map(|r| r.get(0))
                .collect::<Result<_, _>>()?;
            let mut rows = Vec::new();
            for t in &tables {
                for r in tx.query(&format!("SELECT CAST(t AS TEXT) FROM public.\"{t}\" t"), &[])? {
                    rows.push(format!("{t}: {}", r.get::<String>(0)?));
                }
            }
            let r = tx.query_one(
                "SELECT rolsuper, (SELECT pg_get_userbyid(datdba)::TEXT FROM pg_database WHERE datname = 'knit') FROM pg_roles WHERE rolname = 'knit'",
                &[],
            )?;
            Ok::<_, knit_db::DbError>((rows, r.get::<bool>(0)?, r.get::<String>(1)?))
        })
        .unwrap();
    assert!(!superuser, "the knit role is a superuser");
    assert_eq!(owner, "knit", "knit's database is owned by {owner}");
    let token = read("server-1/admin-token");
    assert!(rows
        .iter()
        .any(|r| r.starts_with("shared_secrets: ") && r.contains("knit-sealed:v1:")));
    for row in &rows {
        assert!(
            !row.contains("PRIVATE KEY"),
            "a private key in clear: {}",
            &row[..row.len().min(80)]
        );
        assert!(
            !row.contains(&token),
            "the admin token in clear in a row of {}",
            row.split(':').next().unwrap_or("")
        );
    }
    let passwords = [read("postgres.password"), read("postgres-admin.password")];
    for (name, pid) in recorded_pids(state) {
        if !name.starts_with("server-") {
            continue;
        }
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
        let (cmdline, environ) = (
            String::from_utf8_lossy(&cmdline),
            String::from_utf8_lossy(&environ),
        );
        assert!(cmdline.contains("--secrets-key-file"), "{name}: {cmdline}");
        for p in &passwords {
            assert!(
                !cmdline.contains(p.as_str()) && !environ.contains(p.as_str()),
                "{name}: a database password in its argv or environment"
            );
        }
    }
}

/// A connection to knit's database as `knit_admin`, the superuser `knit
/// up --ha` sets PostgreSQL up with.
fn admin_db(state: &Path) -> knit_db::Db {
    let ha = state.join("ha");
    let read = |f: &str| {
        std::fs::read_to_string(ha.join(f))
            .unwrap()
            .trim()
            .to_string()
    };
    let recorded: Value = serde_json::from_str(&read("ha.json")).unwrap();
    let port = recorded["postgresPort"].as_u64().unwrap();
    knit_db::Db::open(
        &knit_db::Datastore::Postgres(format!(
            "postgres://knit_admin:{}@127.0.0.1:{port}/knit?sslmode=disable",
            read("postgres-admin.password")
        )),
        knit_db::Limits::default(),
    )
    .unwrap_or_else(|e| panic!("connect as knit_admin: {e}"))
}

/// What an older `knit up --ha` left before any server ran: PostgreSQL's
/// data directory made by initdb with `knit` as its superuser, the
/// password in `postgres.password`.
fn older_postgres(state: &Path) {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    let ha = state.join("ha");
    let dir = ha.join("postgres");
    std::fs::create_dir_all(&dir).unwrap();
    let name = std::ffi::CString::new("postgres").unwrap();
    // SAFETY: getpwnam reads a static entry, copied out at once.
    let pw = unsafe { libc::getpwnam(name.as_ptr()) };
    assert!(!pw.is_null(), "no postgres user");
    // SAFETY: non-null entry from getpwnam.
    let (uid, gid) = unsafe { ((*pw).pw_uid, (*pw).pw_gid) };
    for d in [state, &ha] {
        let mode = std::fs::metadata(d).unwrap().permissions().mode();
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(mode | 0o011)).unwrap();
    }
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::os::unix::fs::chown(&dir, Some(uid), Some(gid)).unwrap();
    let password = format!("older-{}", std::process::id());
    let password_file = ha.join("postgres.password");
    std::fs::write(&password_file, format!("{password}\n")).unwrap();
    std::fs::set_permissions(&password_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let pwfile = dir.join("initdb.pw");
    std::fs::write(&pwfile, format!("{password}\n")).unwrap();
    std::os::unix::fs::chown(&pwfile, Some(uid), Some(gid)).unwrap();
    let bin = knit_db::testing::bindir().expect("PostgreSQL's binaries");
    let out = Command::new(bin.join("initdb"))
        .arg("-D")
        .arg(dir.join("data"))
        .args([
            "-U",
            "knit",
            "--auth-host=scram-sha-256",
            "--auth-local=scram-sha-256",
        ])
        .args(["-E", "UTF8", "--locale=C", "--no-instructions", "--no-sync"])
        .arg(format!("--pwfile={}", pwfile.display()))
        .uid(uid)
        .gid(gid)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "initdb: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::remove_file(&pwfile).unwrap();
}

/// `knit up --ha 2` on PostgreSQL data an older `up` made (its superuser
/// `knit`): the old `knit` is retired (renamed `knit_bootstrap`, no
/// login), `knit_admin` and a plain `knit` are made, and the servers run
/// as that `knit`, their shared secrets sealed.
#[test]
fn an_older_ha_database_gets_a_plain_knit_role() {
    let mut env = ha_env();
    let state = env.state_dir();
    std::fs::create_dir_all(&state).unwrap();
    older_postgres(&state);
    let (ok, out, err) = up_ha(&env);
    adopt_all(&mut env);
    assert!(
        ok,
        "knit up --ha 2 on older data:\n{out}\n{err}\n{}",
        logs(&state)
    );
    assert!(out.contains("renamed knit_bootstrap"), "{out}");
    secrets_sealed_and_knit_role_plain(&state);
    let (superuser, login): (bool, bool) = admin_db(&state)
        .read(|tx| {
            let r = tx.query_one(
                "SELECT rolsuper, rolcanlogin FROM pg_roles WHERE rolname = 'knit_bootstrap'",
                &[],
            )?;
            Ok::<_, knit_db::DbError>((r.get(0)?, r.get(1)?))
        })
        .unwrap();
    assert!(
        superuser && !login,
        "knit_bootstrap: superuser {superuser}, login {login}"
    );
    // Run again: nothing left to convert, the same roles.
    let (ok, out, err) = up_ha(&env);
    assert!(ok, "knit up --ha 2 again:\n{out}\n{err}");
    assert!(!out.contains("renamed knit_bootstrap"), "{out}");
    let out = env.knit_ok(&["down"]);
    eprintln!("knit down:\n{out}");
}

/// A file of PEM data from a kubeconfig's base64 field.
fn pem_file(dir: &Path, name: &str, b64: &str) -> PathBuf {
    let path = dir.join(name);
    let out = Command::new("base64")
        .arg("-d")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin.take().unwrap().write_all(b64.as_bytes())?;
            c.wait_with_output()
        })
        .unwrap();
    assert!(out.status.success(), "base64 -d {name}");
    std::fs::write(&path, out.stdout).unwrap();
    path
}

/// The node's Lease renewTime, read through HAProxy with the admin
/// kubeconfig's client certificate.
fn lease_renew_time(env: &Env, kubeconfig: &Path, url: &str, node: &str) -> String {
    let cfg: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(kubeconfig).unwrap()).unwrap();
    let dir = env.path("kube");
    std::fs::create_dir_all(&dir).unwrap();
    let ca = pem_file(
        &dir,
        "ca.crt",
        cfg["clusters"][0]["cluster"]["certificate-authority-data"]
            .as_str()
            .unwrap(),
    );
    let cert = pem_file(
        &dir,
        "admin.crt",
        cfg["users"][0]["user"]["client-certificate-data"]
            .as_str()
            .unwrap(),
    );
    let key = pem_file(
        &dir,
        "admin.key",
        cfg["users"][0]["user"]["client-key-data"].as_str().unwrap(),
    );
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "10", "--max-filesize", "1000000"])
        .arg("--cacert")
        .arg(&ca)
        .arg("--cert")
        .arg(&cert)
        .arg("--key")
        .arg(&key)
        .arg(format!(
            "{url}/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{node}"
        ))
        .output()
        .unwrap();
    let lease: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "lease of {node}: {e}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    lease["spec"]["renewTime"]
        .as_str()
        .unwrap_or_else(|| panic!("no renewTime: {lease}"))
        .to_string()
}

/// What to read when a step fails: each server's log, HAProxy's.
fn logs(state: &Path) -> String {
    let mut out = String::new();
    for name in ["server-1/server.log", "server-2/server.log", "haproxy.log"] {
        let text = std::fs::read_to_string(state.join("ha").join(name)).unwrap_or_default();
        out.push_str(&format!("--- {name} (tail)\n{}\n", common::tail(&text, 40)));
    }
    out
}

/// `knit scale pool workers --replicas N --wait` (300 s at most): its
/// output, which must say every node is initialized and Ready.
fn scale_ready(env: &Env, n: u32) -> String {
    let replicas = n.to_string();
    let (ok, out, err) = env.knit(&[
        "scale",
        "pool",
        "workers",
        "--replicas",
        &replicas,
        "--wait",
        "--timeout",
        "300",
    ]);
    assert!(
        ok && out.contains(&format!("{n}/{n} initialized and Ready")),
        "scale to {n}:\n{out}\n{err}\n{}",
        logs(&env.state_dir())
    );
    out
}

/// The environment of an HA test (root, HAProxy and PostgreSQL's server
/// binaries required), with the package built.
fn ha_env() -> Env {
    assert!(is_root(), "this test needs root");
    assert!(
        on_path("haproxy"),
        "haproxy is not installed: scripts/setup.sh installs Debian's haproxy package"
    );
    assert!(
        Path::new("/usr/lib/postgresql").is_dir(),
        "PostgreSQL's server binaries are not installed: scripts/setup.sh installs Debian's postgresql package"
    );
    let env = Env::builder().cluster(true).parallelism(2).build();
    env.build_package(true);
    env
}

#[test]
fn two_servers_behind_haproxy_survive_the_loss_of_one() {
    let mut env = ha_env();
    let state = env.state_dir();
    let port = env.port;
    let cluster_port = env.cluster_port.unwrap();
    let (ok, out, err) = up_ha(&env);
    // Whatever happened, what was recorded is ended with the environment.
    adopt_all(&mut env);
    let server_log = |i: u32| {
        std::fs::read_to_string(state.join(format!("ha/server-{i}/server.log")))
            .map(|s| common::tail(&s, 40))
            .unwrap_or_default()
    };
    assert!(
        ok,
        "knit up --ha 2:\n{out}\n{err}\nserver 1:\n{}\nserver 2:\n{}",
        server_log(1),
        server_log(2)
    );
    eprintln!("knit up --ha 2:\n{out}");
    let names: Vec<String> = recorded_pids(&state).into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["haproxy", "postgres", "server-1", "server-2"]);
    for needle in [
        "PostgreSQL (pid",
        "knit server 2 (pid",
        "HAProxy (pid",
        "logs:",
    ] {
        assert!(out.contains(needle), "{needle:?} missing in:\n{out}");
    }

    // Both servers, one leader; the same CA and admin token on both: the
    // client config (HAProxy's address, server 1's CA and token) works
    // against server 2 directly.
    let list = one_leader_of(&env, 2, None);
    eprintln!("servers: {list:#?}");
    let table = env.knit_ok(&["get", "servers"]);
    assert!(
        table.contains("LEADER") && table.lines().count() == 3,
        "{table}"
    );
    let config = std::fs::read_to_string(env.path("config")).unwrap();
    assert!(
        config.contains(&format!("https://127.0.0.1:{port}")),
        "{config}"
    );
    let direct = env.path("config-server-2");
    std::fs::write(
        &direct,
        config.replace(
            &format!("https://127.0.0.1:{port}"),
            &format!("https://127.0.2.2:{port}"),
        ),
    )
    .unwrap();
    let out = Command::new(common::knit())
        .args(["--config", direct.to_str().unwrap(), "get", "pools"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "server 2 with server 1's CA and token: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    secrets_sealed_and_knit_role_plain(&state);

    // A node joins through HAProxy (the advertised address is its own).
    env.create("pool", POOL);
    scale_ready(&env, 1);
    let first = env.nodes_of("workers")[0].clone();
    let first_name = first["name"].as_str().unwrap().to_string();
    let first_ip = first["ip"].as_str().unwrap().to_string();
    let proxy_log = || std::fs::read_to_string(state.join("ha/haproxy.log")).unwrap_or_default();
    assert!(
        proxy_log()
            .lines()
            .any(|l| l.starts_with(&format!("{first_ip}:")) && l.contains(" knit-api ")),
        "the node's calls did not go through HAProxy:\n{}",
        common::tail(&proxy_log(), 30)
    );

    // The leader killed by its PID: the other server leads.
    let leader = list.iter().find(|s| s["leader"] == true).unwrap();
    let leader_pid = leader["pid"].as_u64().unwrap() as u32;
    assert!(
        recorded_pids(&state)
            .iter()
            .any(|(n, p)| n.starts_with("server-") && *p == leader_pid),
        "the leader's pid {leader_pid} is not one up recorded"
    );
    let kubeconfig = state.join("ha/server-1/cluster/admin.kubeconfig");
    let kube_url = format!("https://127.0.0.1:{cluster_port}");
    let before = lease_renew_time(&env, &kubeconfig, &kube_url, &first_name);
    // SAFETY: kill(2) on a server this test's `knit up` started (recorded, checked above).
    unsafe { libc::kill(leader_pid as i32, libc::SIGKILL) };
    let deadline = Instant::now() + Duration::from_secs(10);
    while env.runs_here(leader_pid) {
        assert!(Instant::now() < deadline, "the killed server still runs");
        std::thread::sleep(Duration::from_millis(100));
    }
    let after_kill = one_leader_of(&env, 1, Some(leader_pid as u64));
    eprintln!("after the leader's death: {after_kill:#?}");

    // The first node keeps heartbeating through HAProxy to the survivor.
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let now = lease_renew_time(&env, &kubeconfig, &kube_url, &first_name);
        if now != before {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the node's Lease was not renewed after the server's death (still {now})"
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    // A new node joins with one server left.
    scale_ready(&env, 2);
    let second = env
        .nodes_of("workers")
        .into_iter()
        .find(|n| n["name"] != first_name.as_str())
        .unwrap();
    let second_ip = second["ip"].as_str().unwrap().to_string();
    assert!(
        proxy_log()
            .lines()
            .any(|l| l.starts_with(&format!("{second_ip}:")) && l.contains(" knit-api ")),
        "the second node's calls did not go through HAProxy:\n{}",
        common::tail(&proxy_log(), 30)
    );

    // Down: pools, servers, HAProxy, PostgreSQL, the local cloud.
    let started = recorded_pids(&state);
    assert_eq!(started.len(), 4, "{started:?}");
    let out = env.knit_ok(&["down"]);
    eprintln!("knit down:\n{out}");
    for needle in [
        "nodepool/workers deleted",
        "HAProxy (pid",
        "PostgreSQL (pid",
        "local cloud in",
    ] {
        assert!(out.contains(needle), "{needle:?} missing in:\n{out}");
    }
    for (name, pid) in started {
        assert!(!env.runs_here(pid), "{name} (pid {pid}) still runs");
    }
    assert_eq!(env.processes_here(), vec![], "processes left");
    assert!(!Env::link_exists(&env.bridge), "the bridge is left");
}

/// The recorded server (`server-<i>`) with this PID, if any.
fn server_name(state: &Path, pid: u32) -> Option<String> {
    recorded_pids(state)
        .into_iter()
        .find(|(n, p)| n.starts_with("server-") && *p == pid)
        .map(|(n, _)| n)
}

fn server_log_of(state: &Path, name: &str) -> String {
    std::fs::read_to_string(state.join("ha").join(name).join("server.log")).unwrap_or_default()
}

/// The live leader's PID (60 s at most for there to be exactly one).
fn leader_pid(env: &Env, n: usize, not: Option<u64>) -> u32 {
    let list = one_leader_of(env, n, not);
    list.iter().find(|s| s["leader"] == true).unwrap()["pid"]
        .as_u64()
        .unwrap() as u32
}

/// Signals a process `knit up` started for this test (checked first).
fn signal(env: &Env, pid: u32, sig: i32) {
    assert!(
        recorded_pids(&env.state_dir())
            .iter()
            .any(|(_, p)| *p == pid),
        "pid {pid} is not one this test's `knit up` recorded"
    );
    assert!(env.runs_here(pid), "pid {pid} does not run here");
    // SAFETY: kill(2) on a process this test's `knit up` started (checked above).
    unsafe { libc::kill(pid as i32, sig) };
}

fn wait_gone(env: &Env, pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while env.runs_here(pid) {
        assert!(Instant::now() < deadline, "pid {pid} still runs after 30 s");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Whether `pid` holds the local cloud's state lock (`local/lock`, an
/// flock: /proc/locks names its holder and the file's inode).
fn holds_local_lock(env: &Env, pid: u32) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = std::fs::metadata(env.path("local").join("lock")) else {
        return false;
    };
    let inode = format!(":{}", meta.ino());
    std::fs::read_to_string("/proc/locks")
        .unwrap_or_default()
        .lines()
        .any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.get(1) == Some(&"FLOCK")
                && f.get(4) == Some(&pid.to_string().as_str())
                && f.get(5).is_some_and(|i| i.ends_with(&inode))
        })
}

/// Freezes a server (SIGSTOP) at a moment it is not inside the local
/// cloud: the local cloud's state lock is one flock on this host (a
/// stand-in's limit, docs/local-cloud.md), and a server frozen holding it
/// would stop the other server's creates too, which no real cloud does.
fn freeze_outside_the_local_cloud(env: &Env, pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(30);
    // Every thread stopped (a group stop reaches them one by one).
    let stopped = || {
        let state = |stat: String| {
            stat.rsplit_once(") ")
                .is_some_and(|(_, rest)| rest.starts_with('T'))
        };
        std::fs::read_dir(format!("/proc/{pid}/task"))
            .map(|tasks| {
                tasks
                    .flatten()
                    .all(|t| std::fs::read_to_string(t.path().join("stat")).is_ok_and(state))
            })
            .unwrap_or(false)
    };
    loop {
        signal(env, pid, libc::SIGSTOP);
        // Stopped for certain before the locks are read.
        while !stopped() {
            assert!(Instant::now() < deadline, "pid {pid} did not stop");
            std::thread::sleep(Duration::from_millis(5));
        }
        if !holds_local_lock(env, pid) {
            return;
        }
        signal(env, pid, libc::SIGCONT);
        assert!(
            Instant::now() < deadline,
            "pid {pid} held the local cloud's lock at every try for 30 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A frozen server is thawed whatever happens, so cleanup can end it.
struct Thaw(u32);
impl Drop for Thaw {
    fn drop(&mut self) {
        // SAFETY: SIGCONT to the server this test stopped; harmless if gone.
        unsafe { libc::kill(self.0 as i32, libc::SIGCONT) };
    }
}

/// Waits (60 s at most) until the store lists at least `n` instances of
/// `workers` with a provider id; how many it lists.
fn wait_created(env: &Env, n: usize) -> usize {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let made = env
            .store_instances()
            .iter()
            .filter(|i| i["pool"] == "workers" && i["providerId"].is_string())
            .count();
        if made >= n {
            return made;
        }
        assert!(
            Instant::now() < deadline,
            "fewer than {n} instances made within 60 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Exactly `n` instances: the same names in the store and at the local
/// cloud, none twice, every one made once (one `Created` or `Adopted`
/// event, never both, never two) and none left Deleting.
fn exactly(env: &Env, n: usize) {
    let stored: Vec<Value> = env
        .store_instances()
        .into_iter()
        .filter(|i| i["pool"] == "workers")
        .collect();
    let mut names: Vec<String> = stored
        .iter()
        .map(|i| i["name"].as_str().unwrap().to_string())
        .collect();
    names.sort();
    let at_provider = env.provider_names();
    assert_eq!(
        at_provider, names,
        "the local cloud's instances differ from the store's"
    );
    assert_eq!(names.len(), n, "{names:?}");
    for i in &stored {
        assert_eq!(i["state"], "Running", "{i}");
    }
    let events = env.json(&["get", "events", "-o", "json"]);
    for name in &names {
        let made: i64 = events["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|e| {
                e["objectName"] == name.as_str()
                    && (e["reason"] == "Created" || e["reason"] == "Adopted")
            })
            .map(|e| e["count"].as_i64().unwrap_or(1))
            .sum();
        assert_eq!(made, 1, "{name} was made {made} times: {events:#}");
    }
}

/// Two servers on PostgreSQL through a scale-out, three times: the leader
/// killed -9 in the middle of 0 → 6 (the other takes over and finishes:
/// six instances, one create each); a leader frozen (SIGSTOP) past its
/// lease with a create in flight, then woken (its write is refused with
/// NotLeader, the instance the other server adopted stays healthy); the
/// database stopped in the middle of 8 → 10 and started again (the work
/// finishes once it is back). Every node Ready; nothing made twice.
#[test]
fn scale_out_survives_a_killed_leader_a_frozen_leader_and_a_database_restart() {
    let mut env = ha_env();
    let state = env.state_dir();
    up_ha_ok(&mut env, "at first");
    env.create("pool", POOL);

    // 1. The leader killed -9 while 0 → 6 is being carried out.
    let leader = leader_pid(&env, 2, None);
    env.knit_ok(&["scale", "pool", "workers", "--replicas", "6"]);
    let made = wait_created(&env, 1);
    signal(&env, leader, libc::SIGKILL);
    let killed_at = Instant::now();
    wait_gone(&env, leader);
    let survivor = leader_pid(&env, 1, Some(leader as u64));
    eprintln!(
        "leader {leader} killed with {made} of 6 instances made; {survivor} led {:.1} s later",
        killed_at.elapsed().as_secs_f64()
    );
    scale_ready(&env, 6);
    exactly(&env, 6);

    // The killed server back (knit up starts what is missing), with a
    // create of its own to be held for 20 s once it runs one.
    let killed = server_name(&state, leader).unwrap();
    env.set_env("KNIT_SERVER_DELAY_AT", Some("create-provider-returned:20"));
    up_ha_ok(&mut env, "again");
    env.set_env("KNIT_SERVER_DELAY_AT", None);
    let restarted = recorded_pid(&state, &killed);
    // It leads once the survivor stops cleanly (which hands the lease
    // over); the survivor is started again, without the delay.
    let survivor_name = server_name(&state, survivor).unwrap();
    signal(&env, survivor, libc::SIGTERM);
    wait_gone(&env, survivor);
    assert_eq!(leader_pid(&env, 1, Some(survivor as u64)), restarted);
    up_ha_ok(&mut env, "a third time");
    let other = recorded_pid(&state, &survivor_name);
    assert_eq!(leader_pid(&env, 2, None), restarted);

    // 2. The leader frozen with a create in flight, past its lease.
    env.knit_ok(&["scale", "pool", "workers", "--replicas", "8"]);
    let deadline = Instant::now() + Duration::from_secs(120);
    while !server_log_of(&state, &killed).contains("delayed at create-provider-returned") {
        assert!(
            Instant::now() < deadline,
            "the leader held no create within 120 s:\n{}",
            logs(&state)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    freeze_outside_the_local_cloud(&env, restarted);
    let thaw = Thaw(restarted);
    let frozen_at = Instant::now();
    assert_eq!(leader_pid(&env, 1, Some(restarted as u64)), other);
    eprintln!(
        "leader {restarted} frozen; {other} led {:.1} s later",
        frozen_at.elapsed().as_secs_f64()
    );
    scale_ready(&env, 8);
    // Woken past its 20 s hold: the held create goes on with the old
    // lease, and its write is refused.
    while frozen_at.elapsed() < Duration::from_secs(22) {
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(thaw);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !server_log_of(&state, &killed).contains("not the leader any more") {
        assert!(
            Instant::now() < deadline,
            "the woken server's write was not refused within 60 s:\n{}",
            common::tail(&server_log_of(&state, &killed), 40)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(
        leader_pid(&env, 2, None),
        other,
        "the woken server leads again"
    );
    exactly(&env, 8);

    // 3. The database stopped in the middle of 8 → 10, while the local
    // cloud boots the new instances (so the leader cannot record them),
    // then started again. Ten is the basic edition's node quota.
    let postgres = recorded_pid(&state, "postgres");
    env.knit_ok(&["scale", "pool", "workers", "--replicas", "10"]);
    let deadline = Instant::now() + Duration::from_secs(60);
    while env.provider_names().len() < 9 {
        assert!(
            Instant::now() < deadline,
            "no create of 8 → 10 reached the local cloud within 60 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // SIGINT: PostgreSQL's fast shutdown (every session ended at once).
    signal(&env, postgres, libc::SIGINT);
    wait_gone(&env, postgres);
    eprintln!(
        "PostgreSQL stopped with {} instances at the local cloud",
        env.provider_names().len()
    );
    std::thread::sleep(Duration::from_secs(5));
    up_ha_ok(&mut env, "after the database stopped");
    scale_ready(&env, 10);
    exactly(&env, 10);
    one_leader_of(&env, 2, None);

    let out = env.knit_ok(&["down"]);
    eprintln!("knit down:\n{out}");
    assert_eq!(env.processes_here(), vec![], "processes left");
    assert!(!Env::link_exists(&env.bridge), "the bridge is left");
}
