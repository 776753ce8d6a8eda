//! Benchmark: API server CPU with N heartbeating kubelet stand-ins.
//!
//! Starts the embedded cluster in this process on 127.0.0.1, mints one pool
//! bootstrap token, starts N `knit-kubelet-sim --lightweight` processes
//! (kubelet's default 40 s lease, 10 s status checks), waits until all
//! Nodes are Ready, then measures this process's CPU time (the API server
//! and its controllers; the stand-ins are other processes) over a window.
//!
//! The datastore is SQLite in the cluster's directory, or with
//! `KNIT_BENCH_DATASTORE=postgres` a throwaway PostgreSQL server of its own
//! (`knit_db::testing::TestPostgres`, on loopback, fsync off) as servers
//! sharing a datastore use it; then the database's work is in other
//! processes, and their CPU over the same window (the postmaster and its
//! children, from /proc/<pid>/stat) is reported beside this process's.
//!
//! Run: `bash bench/cluster-heartbeats.sh [N] [WINDOW_SECS]` (both datastores).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use knit_cluster::{ClusterConfig, EmbeddedCluster};
use knit_db::testing::TestPostgres;

fn cpu_seconds() -> f64 {
    // SAFETY: getrusage fills the struct we own.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

fn rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| l.strip_prefix("VmRSS:")).map(|v| {
                v.trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<f64>()
                    .unwrap_or(0.0)
            })
        })
        .unwrap_or(0.0)
        / 1024.0
}

/// Clock ticks per second, for /proc/<pid>/stat's times.
fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// (ppid, utime + stime + cutime + cstime in ticks) of a process; the
/// children's times are those it has reaped (ended backends).
fn proc_times(pid: u32) -> Option<(u32, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces: fields start after its ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest[0] is field 3 (state): ppid is field 4, utime..cstime 14..17.
    let ppid = f.get(1)?.parse().ok()?;
    let ticks = f
        .get(11..15)?
        .iter()
        .map(|v| v.parse::<u64>().unwrap_or(0))
        .sum();
    Some((ppid, ticks))
}

/// CPU seconds of a PostgreSQL server so far: the postmaster's own and
/// reaped children's, plus every live child's (backends, WAL writer,
/// checkpointer...).
fn postgres_cpu_seconds(postmaster: u32) -> f64 {
    let mut ticks = proc_times(postmaster).map(|(_, t)| t).unwrap_or(0);
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if let Some((ppid, t)) = proc_times(pid) {
            if ppid == postmaster {
                ticks += t;
            }
        }
    }
    ticks as f64 / clock_ticks()
}

fn raise_fd_limit() {
    // SAFETY: get/setrlimit on our own process.
    unsafe {
        let mut l: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) == 0 {
            l.rlim_cur = l.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &l);
        }
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let sim = PathBuf::from(
        args.get(1)
            .ok_or("usage: heartbeat_bench SIM_BINARY [NODES] [WINDOW_SECS]")?,
    );
    let nodes: usize = args.get(2).map(|s| s.parse()).transpose()?.unwrap_or(1000);
    let window = Duration::from_secs(args.get(3).map(|s| s.parse()).transpose()?.unwrap_or(60));
    raise_fd_limit();

    let dir = tempfile::tempdir()?;
    let mut cfg = ClusterConfig::new(dir.path().join("cluster"), "127.0.0.1:0".parse()?);
    let choice = std::env::var("KNIT_BENCH_DATASTORE").unwrap_or_else(|_| "sqlite".into());
    let pg = match choice.as_str() {
        "sqlite" => None,
        "postgres" => {
            let pg = TestPostgres::start().map_err(|e| format!("PostgreSQL: {e}"))?;
            let url = pg
                .create_database("knit_bench")
                .map_err(|e| format!("PostgreSQL database: {e}"))?;
            cfg.datastore = Some(knit_db::Datastore::Postgres(url));
            Some(pg)
        }
        other => return Err(format!("KNIT_BENCH_DATASTORE={other}: sqlite or postgres").into()),
    };
    let pg_cpu = || {
        pg.as_ref()
            .and_then(TestPostgres::pid)
            .map(postgres_cpu_seconds)
    };
    let cluster = EmbeddedCluster::start(cfg).await?;
    let token = cluster.create_bootstrap_token(None, Duration::from_secs(3600), &[])?;
    let boot = dir.path().join("bootstrap-kubelet.conf");
    std::fs::write(
        &boot,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {}\n    certificate-authority-data: {}\ncontexts:\n- name: b\n  context: {{cluster: c, user: b}}\ncurrent-context: b\nusers:\n- name: b\n  user:\n    token: {}\n",
            cluster.endpoint(),
            STANDARD.encode(cluster.ca_pem()),
            token.token()
        ),
    )?;
    let config = dir.path().join("config.yaml");
    std::fs::write(
        &config,
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n",
    )?;

    let started = Instant::now();
    let mut children: Vec<Child> = Vec::with_capacity(nodes);
    let spawn = |i: usize| -> std::io::Result<Child> {
        let n = dir.path().join(format!("n{i}"));
        Command::new(&sim)
            .arg(format!("--bootstrap-kubeconfig={}", boot.display()))
            .arg(format!("--kubeconfig={}", n.join("kubelet.conf").display()))
            .arg(format!("--config={}", config.display()))
            .arg(format!("--hostname-override=bench-{i:04}"))
            .arg(format!("--cert-dir={}", n.join("pki").display()))
            .arg("--lightweight")
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
    };
    let result = async {
        for i in 0..nodes {
            children.push(spawn(i)?);
            if i % 25 == 24 {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        let ready_after = loop {
            let ready = count_ready(&cluster).await?;
            if ready == nodes {
                break started.elapsed();
            }
            if started.elapsed() > Duration::from_secs(900) {
                return Err(format!("only {ready}/{nodes} nodes Ready after 900 s").into());
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        };
        // Let start-up work (CSRs, registrations) drain, then measure.
        tokio::time::sleep(Duration::from_secs(15)).await;
        let (cpu0, db0, rv0, t0) = (
            cpu_seconds(),
            pg_cpu(),
            cluster_rv(&cluster).await?,
            Instant::now(),
        );
        tokio::time::sleep(window).await;
        let (cpu1, db1, rv1, t1) = (
            cpu_seconds(),
            pg_cpu(),
            cluster_rv(&cluster).await?,
            Instant::now(),
        );
        let wall = (t1 - t0).as_secs_f64();
        let db = match (db0, db1) {
            (Some(a), Some(b)) => format!("{:.2} %", 100.0 * (b - a) / wall),
            _ => "(in process)".to_string(),
        };
        println!("| datastore | nodes | all Ready after | window | API server CPU (% of one core) | PostgreSQL processes' CPU | writes/s | API server RSS |");
        println!("|---|---|---|---|---|---|---|---|");
        println!(
            "| {choice} | {nodes} | {:.1} s | {:.0} s | {:.2} % | {db} | {:.1} | {:.0} MiB |",
            ready_after.as_secs_f64(),
            wall,
            100.0 * (cpu1 - cpu0) / wall,
            (rv1 - rv0) as f64 / wall,
            rss_mib()
        );
        Ok::<(), Box<dyn std::error::Error>>(())
    }
    .await;
    for c in &mut children {
        let _ = c.kill();
        let _ = c.wait();
    }
    cluster.shutdown().await;
    drop(pg);
    result
}

/// Ready nodes, read over HTTPS with the admin credential like any client.
async fn count_ready(cluster: &EmbeddedCluster) -> Result<usize, Box<dyn std::error::Error>> {
    let list = admin_get(cluster, "/api/v1/nodes").await?;
    Ok(list["items"]
        .as_array()
        .map(|items| {
            items
                .iter()
                .filter(|n| {
                    n["status"]["conditions"].as_array().is_some_and(|c| {
                        c.iter()
                            .any(|c| c["type"] == "Ready" && c["status"] == "True")
                    })
                })
                .count()
        })
        .unwrap_or(0))
}

async fn cluster_rv(cluster: &EmbeddedCluster) -> Result<u64, Box<dyn std::error::Error>> {
    let list = admin_get(cluster, "/api/v1/namespaces").await?;
    Ok(list["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or("0")
        .parse()?)
}

async fn admin_get(
    cluster: &EmbeddedCluster,
    path: &str,
) -> Result<serde_json::Value, Box<dyn std::error::Error>> {
    let kc: serde_json::Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(cluster.admin_kubeconfig_path())?)?;
    let dec = |k: &str| -> Result<String, Box<dyn std::error::Error>> {
        Ok(String::from_utf8(STANDARD.decode(
            kc["users"][0]["user"][k].as_str().unwrap_or(""),
        )?)?)
    };
    let (cert, key, ca) = (
        dec("client-certificate-data")?,
        dec("client-key-data")?,
        cluster.ca_pem().to_string(),
    );
    let url = format!("{}{}", cluster.endpoint(), path);
    let body = tokio::task::spawn_blocking(move || -> Result<String, String> {
        let cfg = knit_cluster::tls::client_config(&ca, Some((&cert, &key)))
            .map_err(|e| e.to_string())?;
        let agent = ureq::AgentBuilder::new()
            .tls_config(std::sync::Arc::new(cfg))
            .build();
        agent
            .get(&url)
            .call()
            .map_err(|e| e.to_string())?
            .into_string()
            .map_err(|e| e.to_string())
    })
    .await??;
    Ok(serde_json::from_str(&body)?)
}
