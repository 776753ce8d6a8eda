//! Benchmark: listing 1,000 Nodes with and without `limit`.
//!
//! Starts the embedded cluster in this process on 127.0.0.1 (SQLite in a
//! temporary directory), stores N Nodes shaped like a kubelet's (labels,
//! conditions, addresses, capacity, node info, images: about 2.5 KB each),
//! then times lists over HTTPS with the admin identity on one kept-alive
//! connection: the whole list (and with a selector every Node matches,
//! which makes the server parse and filter each object); the first page with limit 500 and 100; the
//! next page of a limit-500 run (the same snapshot) with nothing changed
//! and after 200 Node changes since its first page (the server undoes them
//! from its change history); every page of a run with limit 500 and 100.
//!
//! Server time is the API server's own, from its `/metrics` read before and
//! after each run (`knit_cluster_request_seconds_total` for verb="list",
//! resource="nodes"): from the request's arrival to its answer built,
//! without the transfer. Client time adds TLS and the body's transfer on
//! loopback. Both are medians of the runs.
//!
//! Run: `bash bench/cluster-list.sh [N] [RUNS]`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use knit_cluster::{ClusterConfig, EmbeddedCluster};
use serde_json::{json, Value};

struct Client {
    agent: ureq::Agent,
    base: String,
}

impl Client {
    fn admin(cluster: &EmbeddedCluster) -> Result<Client, String> {
        let kc: Value = serde_yaml_ng::from_str(
            &std::fs::read_to_string(cluster.admin_kubeconfig_path()).map_err(|e| e.to_string())?,
        )
        .map_err(|e| e.to_string())?;
        let user = &kc["users"][0]["user"];
        let dec = |k: &str| -> Result<String, String> {
            let b = STANDARD
                .decode(user[k].as_str().unwrap_or_default())
                .map_err(|e| e.to_string())?;
            String::from_utf8(b).map_err(|e| e.to_string())
        };
        let (cert, key) = (dec("client-certificate-data")?, dec("client-key-data")?);
        let cfg = knit_cluster::tls::client_config(cluster.ca_pem(), Some((&cert, &key)))
            .map_err(|e| e.to_string())?;
        Ok(Client {
            agent: ureq::AgentBuilder::new()
                .tls_config(Arc::new(cfg))
                .timeout(Duration::from_secs(60))
                .build(),
            base: cluster.endpoint().to_string(),
        })
    }

    fn get(&self, path: &str) -> Result<String, String> {
        self.agent
            .get(&format!("{}{path}", self.base))
            .call()
            .map_err(|e| format!("GET {path}: {e}"))?
            .into_string()
            .map_err(|e| e.to_string())
    }

    fn get_json(&self, path: &str) -> Result<Value, String> {
        serde_json::from_str(&self.get(path)?).map_err(|e| e.to_string())
    }

    fn send(&self, method: &str, path: &str, ct: &str, body: &Value) -> Result<(), String> {
        self.agent
            .request(method, &format!("{}{path}", self.base))
            .set("Content-Type", ct)
            .send_string(&body.to_string())
            .map_err(|e| format!("{method} {path}: {e}"))?;
        Ok(())
    }

    /// (list requests answered, seconds the server spent on them) so far.
    fn server_lists(&self) -> Result<(f64, f64), String> {
        let text = self.get("/metrics")?;
        let sum = |metric: &str| -> f64 {
            text.lines()
                .filter(|l| {
                    l.starts_with(metric)
                        && l.contains("verb=\"list\"")
                        && l.contains("resource=\"nodes\"")
                })
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum()
        };
        Ok((
            sum("knit_cluster_requests_total{"),
            sum("knit_cluster_request_seconds_total{"),
        ))
    }
}

fn node(i: usize) -> Value {
    let name = format!("node-{i:04}");
    let images: Vec<Value> = (0..5)
        .map(|k| json!({"names": [format!("registry.local/system/image-{k}@sha256:{:064x}", k * 7919 + i), format!("registry.local/system/image-{k}:v1.31.{k}")], "sizeBytes": 10_000_000 + k}))
        .collect();
    let conditions: Vec<Value> = ["MemoryPressure", "DiskPressure", "PIDPressure", "Ready"]
        .iter()
        .map(|t| json!({
            "type": t, "status": if *t == "Ready" { "True" } else { "False" },
            "lastHeartbeatTime": "2026-12-02T10:00:00Z", "lastTransitionTime": "2026-12-02T09:00:00Z",
            "reason": format!("Kubelet{t}"), "message": format!("kubelet reports {t}")}))
        .collect();
    json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {
            "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
            "beta.kubernetes.io/os": "linux", "beta.kubernetes.io/arch": "amd64",
            "node.kubernetes.io/instance-type": "local.small", "knit.dev/pool": "workers",
            "topology.kubernetes.io/zone": "local-a"},
            "annotations": {"node.alpha.kubernetes.io/ttl": "0", "volumes.kubernetes.io/controller-managed-attach-detach": "true"}},
        "spec": {"providerID": format!("local://{name}")},
        "status": {
            "capacity": {"cpu": "2", "memory": "4026536Ki", "pods": "110", "ephemeral-storage": "20470Mi"},
            "allocatable": {"cpu": "2", "memory": "3924136Ki", "pods": "110", "ephemeral-storage": "18864Mi"},
            "conditions": conditions,
            "addresses": [{"type": "InternalIP", "address": format!("10.0.{}.{}", i / 250, i % 250 + 2)}, {"type": "Hostname", "address": name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"machineID": format!("{i:032x}"), "systemUUID": format!("{i:032x}"), "bootID": format!("{i:032x}"),
                "kernelVersion": "6.1.0-28-amd64", "osImage": "Debian GNU/Linux 12 (bookworm)", "containerRuntimeVersion": "containerd://1.6.20",
                "kubeletVersion": "v1.31.4", "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64"},
            "images": images}})
}

/// Medians over `runs` runs of `f` (each one or more lists): the server's
/// milliseconds, the client's, and the list requests per run.
fn measure(
    c: &Client,
    runs: usize,
    mut f: impl FnMut() -> Result<(), String>,
) -> Result<(f64, f64, f64), String> {
    let mut client = Vec::with_capacity(runs);
    let mut server = Vec::with_capacity(runs);
    let mut requests = 0.0;
    for _ in 0..runs {
        let before = c.server_lists()?;
        let t = Instant::now();
        f()?;
        client.push(t.elapsed().as_secs_f64() * 1000.0);
        let after = c.server_lists()?;
        server.push((after.1 - before.1) * 1000.0);
        requests = after.0 - before.0;
    }
    client.sort_by(f64::total_cmp);
    server.sort_by(f64::total_cmp);
    Ok((client[runs / 2], server[runs / 2], requests))
}

fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().collect();
    let n: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(1000);
    let runs: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(30);
    let rt = tokio::runtime::Runtime::new().map_err(|e| e.to_string())?;
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let mut cfg = ClusterConfig::new(
        dir.path().join("cluster"),
        "127.0.0.1:0".parse().map_err(|e| format!("{e}"))?,
    );
    // No kubelet renews these Nodes' Leases: the node lifecycle controller
    // would rewrite them all while the lists are timed.
    cfg.node_grace_period = Duration::from_secs(24 * 3600);
    let cluster = rt
        .block_on(EmbeddedCluster::start(cfg))
        .map_err(|e| e.to_string())?;
    let c = Client::admin(&cluster)?;
    let started = Instant::now();
    for i in 0..n {
        c.send("POST", "/api/v1/nodes", "application/json", &node(i))?;
    }
    let one = c.get(&format!("/api/v1/nodes/{}", "node-0000"))?.len();
    eprintln!(
        "stored {n} Nodes ({one} bytes each as served) in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let nodes = "/api/v1/nodes";
    // Warm up (connection, caches).
    for _ in 0..3 {
        c.get(nodes)?;
    }
    let token = |limit: usize| -> Result<String, String> {
        let first = c.get_json(&format!("{nodes}?limit={limit}"))?;
        first["metadata"]["continue"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| "no continue token".to_string())
    };
    let walk = |limit: usize| -> Result<(), String> {
        let mut path = format!("{nodes}?limit={limit}");
        let mut seen = 0;
        loop {
            let page = c.get_json(&path)?;
            seen += page["items"].as_array().map_or(0, Vec::len);
            match page["metadata"]["continue"].as_str() {
                Some(t) => path = format!("{nodes}?limit={limit}&continue={t}"),
                None => break,
            }
        }
        if seen == n {
            Ok(())
        } else {
            Err(format!("a walk with limit {limit} saw {seen} of {n}"))
        }
    };
    let mut rows: Vec<(String, (f64, f64, f64))> = Vec::new();
    rows.push((
        "whole list (no limit)".into(),
        measure(&c, runs, || c.get(nodes).map(drop))?,
    ));
    rows.push((
        "whole list, a label selector every Node matches (each parsed and filtered)".into(),
        measure(&c, runs, || {
            c.get(&format!("{nodes}?labelSelector=kubernetes.io%2Fos%3Dlinux"))
                .map(drop)
        })?,
    ));
    for limit in [500, 100] {
        rows.push((
            format!("first page, limit={limit}"),
            measure(&c, runs, || {
                c.get(&format!("{nodes}?limit={limit}")).map(drop)
            })?,
        ));
    }
    let t = token(500)?;
    rows.push((
        "second page, limit=500 (nothing changed)".into(),
        measure(&c, runs, || {
            c.get(&format!("{nodes}?limit=500&continue={t}")).map(drop)
        })?,
    ));
    let t = token(500)?;
    for i in 0..200 {
        c.send(
            "PATCH",
            &format!("/api/v1/nodes/node-{:04}", (i * 7) % n),
            "application/merge-patch+json",
            &json!({"metadata": {"labels": {"bench/changed": format!("{i}")}}}),
        )?;
    }
    rows.push((
        "second page, limit=500 (200 Node changes undone)".into(),
        measure(&c, runs, || {
            c.get(&format!("{nodes}?limit=500&continue={t}")).map(drop)
        })?,
    ));
    for limit in [500, 100] {
        rows.push((
            format!("every page, limit={limit}"),
            measure(&c, runs, || walk(limit))?,
        ));
    }
    println!("| list of {n} Nodes | requests | server ms (p50) | client ms (p50) |");
    println!("|---|---|---|---|");
    for (what, (client, server, requests)) in rows {
        println!("| {what} | {requests:.0} | {server:.1} | {client:.1} |");
    }
    rt.block_on(cluster.shutdown());
    Ok(())
}
