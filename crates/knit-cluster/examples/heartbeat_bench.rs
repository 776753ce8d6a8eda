//! Benchmark: API server CPU with N heartbeating kubelet stand-ins.
//!
//! Starts the embedded cluster in this process on 127.0.0.1, mints one pool
//! bootstrap token, starts N `knit-kubelet-sim --lightweight` processes
//! (kubelet's default 40 s lease, 10 s status checks), waits until all
//! Nodes are Ready, then measures this process's CPU time (the API server
//! and its controllers; the stand-ins are other processes) over a window.
//!
//! Run: `bash bench/cluster-heartbeats.sh [N] [WINDOW_SECS]`

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use knit_cluster::{ClusterConfig, EmbeddedCluster};

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
    let cluster = EmbeddedCluster::start(ClusterConfig::new(
        dir.path().join("cluster"),
        "127.0.0.1:0".parse()?,
    ))
    .await?;
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
        let (cpu0, rv0, t0) = (cpu_seconds(), cluster_rv(&cluster).await?, Instant::now());
        tokio::time::sleep(window).await;
        let (cpu1, rv1, t1) = (cpu_seconds(), cluster_rv(&cluster).await?, Instant::now());
        let wall = (t1 - t0).as_secs_f64();
        println!("| nodes | all Ready after | window | API server CPU (% of one core) | writes/s | API server RSS |");
        println!("|---|---|---|---|---|---|");
        println!(
            "| {nodes} | {:.1} s | {:.0} s | {:.2} % | {:.1} | {:.0} MiB |",
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
        serde_yaml::from_str(&std::fs::read_to_string(cluster.admin_kubeconfig_path())?)?;
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
