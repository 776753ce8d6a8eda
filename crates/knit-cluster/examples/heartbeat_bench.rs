//! Benchmark: API server CPU with N heartbeating kubelet stand-ins.
//!
//! Starts the embedded cluster in this process on 127.0.0.1, mints one
//! bootstrap token per node (bound to its name), starts N
//! `knit-kubelet-sim --lightweight` processes (kubelet's default 40 s
//! lease, 10 s status checks), waits until all
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
//! With `KNIT_BENCH_API=1`, the API at that size under the same heartbeat
//! load follows (see [`api_at_size`]).
//!
//! Run: `bash bench/cluster-heartbeats.sh [N] [WINDOW_SECS]` (both datastores),
//! `bash bench/api-at-size.sh [N]` (the API at size).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use knit_cluster::{ClusterConfig, EmbeddedCluster};
use knit_db::testing::TestPostgres;

mod common;
use common::{cpu_seconds, raise_fd_limit};

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

// The allocator the `knit` binary serves the API with.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The server's async workers: `KNIT_BENCH_WORKERS` (2, one per core
    // here, as `knit server` starts them on this host).
    let workers = match std::env::var("KNIT_BENCH_WORKERS") {
        Ok(n) => n
            .parse::<usize>()
            .map_err(|e| format!("KNIT_BENCH_WORKERS={n}: {e}"))?,
        Err(_) => 2,
    };
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()?
        .block_on(run())
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
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
    // Every stand-in (and kubectl) connects from 127.0.0.1: one address,
    // as behind a load balancer, so the per-address cap is the total.
    cfg.connections.max_per_address = cfg.connections.max_connections;
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
    // One bootstrap token per node, bound to its name, as knit mints them
    // (each node is given the CA: cluster-info is signed in a batch):
    // an unbound token is bound to the first node it is approved for and
    // retired once that Node registers, so one shared token serves one node.
    let bootstrap_kubeconfig = |i: usize| -> Result<PathBuf, Box<dyn std::error::Error>> {
        let node = format!("bench-{i:04}");
        let token = cluster
            .create_bootstrap_token_signed_in_batch(Some(&node), Duration::from_secs(3600))?;
        let n = dir.path().join(format!("n{i}"));
        std::fs::create_dir_all(&n)?;
        let boot = n.join("bootstrap-kubelet.conf");
        std::fs::write(
            &boot,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {}\n    certificate-authority-data: {}\ncontexts:\n- name: b\n  context: {{cluster: c, user: b}}\ncurrent-context: b\nusers:\n- name: b\n  user:\n    token: {}\n",
                cluster.endpoint(),
                STANDARD.encode(cluster.ca_pem()),
                token.token()
            ),
        )?;
        Ok(boot)
    };
    let minting = Instant::now();
    let boots = (0..nodes)
        .map(bootstrap_kubeconfig)
        .collect::<Result<Vec<_>, _>>()?;
    // A scale-out mints them too, one per machine, before any joins.
    println!(
        "{nodes} bootstrap tokens minted in {:.1} s",
        minting.elapsed().as_secs_f64()
    );
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
            .arg(format!("--bootstrap-kubeconfig={}", boots[i].display()))
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
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        // What the join asked of the API and how many writes it made
        // (`KNIT_BENCH_JOIN_METRICS=FILE`: the metrics text at all Ready).
        if let Ok(file) = std::env::var("KNIT_BENCH_JOIN_METRICS") {
            let text = format!(
                "# resourceVersion at all Ready: {}\n{}",
                cluster_rv(&cluster).await?,
                cluster.metrics_text()
            );
            std::fs::write(&file, text).map_err(|e| format!("{file}: {e}"))?;
        }
        // Let start-up work (CSRs, registrations, spent tokens) drain, then
        // measure (KNIT_BENCH_SETTLE seconds, 60 by default: 1,000 spent
        // tokens are retired after their nodes register).
        let settle = std::env::var("KNIT_BENCH_SETTLE")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(60);
        tokio::time::sleep(Duration::from_secs(settle)).await;
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
        if std::env::var_os("KNIT_BENCH_API").is_some() {
            api_at_size(&cluster, nodes, cpu_seconds).await?;
        }
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

/// Ready nodes, as the server keeps them (the embedding process's
/// [`knit_cluster::NodeReader`]): read every 100 ms without serializing
/// 1,000 Nodes each time, so the time to all Ready is known to 0.1 s and
/// its reading adds next to nothing to the join it measures.
async fn count_ready(cluster: &EmbeddedCluster) -> Result<usize, Box<dyn std::error::Error>> {
    let reader = cluster.node_reader();
    let nodes = tokio::task::spawn_blocking(move || reader.nodes()).await??;
    Ok(nodes
        .iter()
        .filter(|n| {
            n["status"]["conditions"].as_array().is_some_and(|c| {
                c.iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            })
        })
        .count())
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
    let agent = admin_agent(cluster)?;
    let url = format!("{}{}", cluster.endpoint(), path);
    let body = tokio::task::spawn_blocking(move || -> Result<String, String> {
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

/// An HTTPS client with the admin kubeconfig's credential (30 s timeout).
fn admin_agent(cluster: &EmbeddedCluster) -> Result<ureq::Agent, Box<dyn std::error::Error>> {
    let kc: serde_json::Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(cluster.admin_kubeconfig_path())?)?;
    let dec = |k: &str| -> Result<String, Box<dyn std::error::Error>> {
        Ok(String::from_utf8(STANDARD.decode(
            kc["users"][0]["user"][k].as_str().unwrap_or(""),
        )?)?)
    };
    let (cert, key) = (dec("client-certificate-data")?, dec("client-key-data")?);
    let cfg = knit_cluster::tls::client_config(cluster.ca_pem(), Some((&cert, &key)))
        .map_err(|e| e.to_string())?;
    Ok(ureq::AgentBuilder::new()
        .tls_config(std::sync::Arc::new(cfg))
        .timeout(Duration::from_secs(30))
        .build())
}

/// The API at size, under the heartbeat load that is running: the real
/// kubectl's `get nodes` (its default pages of 500, and the whole list in
/// one answer) timed RUNS times, then a watch fan-out: WATCHERS real
/// `kubectl get nodes --watch` processes, and a Node annotated PATCHES times
/// (5 per second) with its send time; each watcher's receipt of each change
/// gives one delay. Prints p50/p99 of each and this process's CPU (the API
/// server; the kubectls are other processes) while the watchers run.
/// Knobs: KNIT_BENCH_API_RUNS (30), KNIT_BENCH_WATCHERS (50),
/// KNIT_BENCH_PATCHES (100).
async fn api_at_size(
    cluster: &EmbeddedCluster,
    nodes: usize,
    cpu_seconds: fn() -> f64,
) -> Result<(), Box<dyn std::error::Error>> {
    let knob = |name: &str, default: usize| -> Result<usize, Box<dyn std::error::Error>> {
        match std::env::var(name) {
            Ok(v) => Ok(v.parse().map_err(|_| format!("{name}={v}: not a number"))?),
            Err(_) => Ok(default),
        }
    };
    let runs = knob("KNIT_BENCH_API_RUNS", 30)?;
    let watchers = knob("KNIT_BENCH_WATCHERS", 50)?;
    let patches = knob("KNIT_BENCH_PATCHES", 100)?;
    let kubeconfig = cluster.admin_kubeconfig_path().to_path_buf();

    let mut rows = Vec::new();
    for (what, chunk) in [
        ("`kubectl get nodes` (pages of 500, its default)", "500"),
        ("`kubectl get nodes --chunk-size=0` (one answer)", "0"),
    ] {
        let mut ms = Vec::with_capacity(runs);
        for _ in 0..runs {
            let kc = kubeconfig.clone();
            let chunk = chunk.to_string();
            let (took, lines) = tokio::task::spawn_blocking(move || {
                let t = Instant::now();
                let out = Command::new("kubectl")
                    .arg(format!("--kubeconfig={}", kc.display()))
                    .args(["get", "nodes", "--no-headers", "--request-timeout=60s"])
                    .arg(format!("--chunk-size={chunk}"))
                    .stdin(Stdio::null())
                    .stderr(Stdio::inherit())
                    .output()?;
                let took = t.elapsed();
                if !out.status.success() {
                    return Err(std::io::Error::other(format!("kubectl: {}", out.status)));
                }
                Ok::<_, std::io::Error>((
                    took,
                    out.stdout
                        .split(|b| *b == b'\n')
                        .filter(|l| !l.is_empty())
                        .count(),
                ))
            })
            .await??;
            if lines != nodes {
                return Err(format!("kubectl listed {lines} nodes of {nodes}").into());
            }
            ms.push(took.as_secs_f64() * 1e3);
        }
        let (p50, p99, max) = percentiles(&mut ms);
        rows.push(format!(
            "| {what} | {} | {p50:.0} | {p99:.0} | {max:.0} |",
            ms.len()
        ));
    }
    println!();
    println!("| {nodes} Nodes, heartbeats running | runs | p50 ms | p99 ms | max ms |");
    println!("|---|---|---|---|---|");
    for row in rows {
        println!("{row}");
    }

    // The watch fan-out.
    let (tx, rx) = std::sync::mpsc::channel::<(usize, f64)>();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<()>();
    let mut kubectls = Vec::with_capacity(watchers);
    for _ in 0..watchers {
        let mut child = Command::new("kubectl")
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .args(["get", "nodes", "--watch", "--request-timeout=0"])
            // custom-columns prints one row per Node of the first list
            // too (jsonpath would print the List once).
            .args([
                "--no-headers",
                r"-o=custom-columns=N:.metadata.name,S:.metadata.annotations.bench\.knit\.dev/sent",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?;
        let stdout = child.stdout.take().ok_or("kubectl without stdout")?;
        let (tx, ready_tx) = (tx.clone(), ready_tx.clone());
        std::thread::spawn(move || {
            use std::io::BufRead;
            let mut seen = 0usize;
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                seen += 1;
                if seen == nodes {
                    let _ = ready_tx.send(());
                }
                // "bench-0000   SEQ:NANOS" for a patched version.
                let Some(mark) = line.split_whitespace().nth(1) else {
                    continue;
                };
                let Some((seq, sent)) = mark.split_once(':') else {
                    continue;
                };
                let (Ok(seq), Ok(sent)) = (seq.parse::<usize>(), sent.parse::<u128>()) else {
                    continue;
                };
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos())
                    .unwrap_or(0);
                let _ = tx.send((seq, now.saturating_sub(sent) as f64 / 1e6));
            }
        });
        kubectls.push(child);
    }
    drop((tx, ready_tx));
    let result = async {
        for _ in 0..watchers {
            ready_rx
                .recv_timeout(Duration::from_secs(300))
                .map_err(|_| "a watcher never listed every node")?;
        }
        let (cpu0, t0) = (cpu_seconds(), Instant::now());
        for seq in 1..=patches {
            let sent = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)?
                .as_nanos();
            let patch = format!(
                r#"{{"metadata":{{"annotations":{{"bench.knit.dev/sent":"{seq}:{sent}"}}}}}}"#
            );
            admin_patch(cluster, "/api/v1/nodes/bench-0000", patch).await?;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        // Late receipts: up to 10 s after the last change.
        let mut delays = Vec::with_capacity(watchers * patches);
        let deadline = Instant::now() + Duration::from_secs(10);
        while delays.len() < watchers * patches {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok((seq, ms)) if seq >= 1 => delays.push(ms),
                Ok(_) => {}
                Err(_) => break,
            }
        }
        let (cpu1, t1) = (cpu_seconds(), Instant::now());
        let wall = (t1 - t0).as_secs_f64();
        let got = delays.len();
        let (p50, p99, max) = percentiles(&mut delays);
        println!(
            "| watch fan-out: a Node change to each of {watchers} `kubectl get nodes --watch` ({got} of {} receipts) | {patches} | {p50:.1} | {p99:.1} | {max:.1} |",
            watchers * patches
        );
        println!(
            "API server CPU while the watchers ran: {:.2} % of a core over {wall:.0} s",
            100.0 * (cpu1 - cpu0) / wall
        );
        Ok::<(), Box<dyn std::error::Error>>(())
    }
    .await;
    for c in &mut kubectls {
        let _ = c.kill();
        let _ = c.wait();
    }
    result
}

/// p50, p99 and max of a sample (sorted in place); zeros when empty.
fn percentiles(ms: &mut [f64]) -> (f64, f64, f64) {
    if ms.is_empty() {
        return (0.0, 0.0, 0.0);
    }
    ms.sort_by(f64::total_cmp);
    let at = |q: f64| ms[((ms.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.99), ms[ms.len() - 1])
}

/// A merge patch with the admin credential, like `kubectl annotate`.
async fn admin_patch(
    cluster: &EmbeddedCluster,
    path: &str,
    body: String,
) -> Result<(), Box<dyn std::error::Error>> {
    let agent = admin_agent(cluster)?;
    let url = format!("{}{}", cluster.endpoint(), path);
    tokio::task::spawn_blocking(move || {
        agent
            .request("PATCH", &url)
            .set("Content-Type", "application/merge-patch+json")
            .send_string(&body)
            .map(|_| ())
            .map_err(|e| e.to_string())
    })
    .await??;
    Ok(())
}
