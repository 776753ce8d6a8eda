//! What a node's start-up leaves for the tools users run (issue 28 item 7):
//! a real node of the local cloud joins the embedded cluster, then
//! - `/metrics`, scraped over HTTPS with the metrics reader token (not the
//!   admin token), holds `knit_node_startup_seconds` for the pool and the
//!   provider at each stage (running, ready, initialized): parsed, one
//!   observation each, buckets cumulative, `+Inf` the count;
//! - the real kubectl shows knit's events about the node
//!   (`kubectl get events`, `kubectl describe node`), reported by `knit`,
//!   and its removal's events once the pool is scaled in.
//!
//! Needs root and the workspace's binaries (see local_e2e.rs); kubectl is
//! required (installed by scripts/setup.sh --tests).

mod common;

use common::browser::https_agent;
use common::Env;
use serde_json::Value;
use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

const POOL: &str = "apiVersion: knit.dev/v1alpha1
kind: NodePool
metadata: {name: workers}
spec:
  replicas: 0
  systemDisk: {sizeGiB: 20}
  dataDisks: [{sizeGiB: 40, interface: nvme}]
";

/// One histogram series of the Prometheus text: its buckets (upper bound,
/// cumulative count) in the text's order, sum and count.
#[derive(Debug, Default)]
struct Series {
    buckets: Vec<(f64, u64)>,
    sum: f64,
    count: u64,
}

/// The `name` histograms of a Prometheus text, by their labels other than
/// `le` (as `k="v",...`).
fn histograms(text: &str, name: &str) -> BTreeMap<String, Series> {
    let mut out: BTreeMap<String, Series> = BTreeMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let (metric, labels) = match series.split_once('{') {
            Some((m, rest)) => (m, rest.trim_end_matches('}')),
            None => (series, ""),
        };
        let mut le = None;
        let mut rest = Vec::new();
        for pair in labels.split(',').filter(|p| !p.is_empty()) {
            match pair.strip_prefix("le=") {
                Some(v) => le = Some(v.trim_matches('"').to_string()),
                None => rest.push(pair),
            }
        }
        let entry = || rest.join(",");
        if metric == format!("{name}_bucket") {
            let le = le.expect("a bucket has le");
            let bound = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().unwrap()
            };
            out.entry(entry())
                .or_default()
                .buckets
                .push((bound, value.parse().unwrap()));
        } else if metric == format!("{name}_sum") {
            out.entry(entry()).or_default().sum = value.parse().unwrap();
        } else if metric == format!("{name}_count") {
            out.entry(entry()).or_default().count = value.parse().unwrap();
        }
    }
    out
}

#[test]
fn a_node_start_up_in_metrics_and_its_events_in_kubectl() {
    assert!(
        common::on_path("kubectl"),
        "kubectl is needed (scripts/setup.sh --tests installs it)"
    );
    let mut env = Env::builder().cluster(true).parallelism(1).build();
    let (ok, out, err) = env.knit(&[
        "package",
        "build",
        "--state-dir",
        env.state_dir().to_str().unwrap(),
    ]);
    assert!(ok, "package build: {out}{err}");
    env.start_server();
    env.create("pool", POOL);
    let out = env.scale_wait("workers", 1);
    assert!(out.contains("1/1 initialized and Ready"), "{out}");
    let nodes = env.json(&["get", "nodes", "-o", "json"]);
    let node = nodes["items"][0]["name"].as_str().unwrap().to_string();

    // /metrics with the reader token the server made; never the admin one.
    let ca = std::fs::read_to_string(env.state_dir().join("pki/ca.pem")).unwrap();
    let token = std::fs::read_to_string(env.state_dir().join("metrics-token")).unwrap();
    let admin = std::fs::read_to_string(env.state_dir().join("admin-token")).unwrap();
    assert_ne!(token.trim(), admin.trim());
    let agent = https_agent(&ca);
    let url = format!("https://127.0.0.1:{}/metrics", env.port);
    let scrape = |bearer: &str| match agent
        .get(&url)
        .set("Authorization", &format!("Bearer {}", bearer.trim()))
        .call()
    {
        Ok(r) => (200, r.into_string().unwrap()),
        Err(ureq::Error::Status(code, r)) => (code, r.into_string().unwrap_or_default()),
        Err(e) => panic!("GET {url}: {e}"),
    };
    assert_eq!(scrape("not-a-token").0, 401);
    assert_eq!(scrape(&admin).0, 200);
    // The reader token reads /metrics and nothing else.
    let pools = format!("https://127.0.0.1:{}/api/v1/pools", env.port);
    match agent
        .get(&pools)
        .set("Authorization", &format!("Bearer {}", token.trim()))
        .call()
    {
        Err(ureq::Error::Status(401, _)) => {}
        other => panic!("GET {pools} with the metrics token: {other:?}"),
    }
    // The ready stage is recorded by the reconciler's next pass after the
    // Node's Ready, which `--wait` may have seen first.
    let deadline = Instant::now() + Duration::from_secs(60);
    let startup = loop {
        let (status, text) = scrape(&token);
        assert_eq!(status, 200, "{text}");
        let all = histograms(&text, "knit_node_startup_seconds");
        if all.len() == 3 || Instant::now() > deadline {
            break all;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    let mut sums = BTreeMap::new();
    for stage in ["running", "ready", "initialized"] {
        let key = format!("pool=\"workers\",provider=\"local\",stage=\"{stage}\"");
        let s = startup
            .get(&key)
            .unwrap_or_else(|| panic!("no {key} in {startup:#?}"));
        assert_eq!(s.count, 1, "{key}: {s:?}");
        assert!(s.sum > 0.0, "{key}: {s:?}");
        assert!(
            s.buckets
                .windows(2)
                .all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1),
            "{key}: buckets not cumulative: {s:?}"
        );
        assert_eq!(s.buckets.last(), Some(&(f64::INFINITY, 1)), "{key}");
        // The observation lies in the first bucket that counts it.
        let (bound, _) = s.buckets.iter().find(|b| b.1 == 1).unwrap();
        assert!(s.sum <= *bound, "{key}: {s:?}");
        sums.insert(stage, s.sum);
    }
    // The machine ran before its node could be Ready or initialized.
    assert!(sums["running"] <= sums["ready"], "{sums:?}");
    assert!(sums["running"] <= sums["initialized"], "{sums:?}");
    eprintln!("start-up of {node} (s): {sums:?}");

    // knit's events about the node, through the real kubectl.
    let kubeconfig = env.state_dir().join("cluster/admin.kubeconfig");
    let kubectl = |args: &[&str]| {
        let out = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .arg("--request-timeout=20s")
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let selector = format!("involvedObject.name={node}");
    let reasons = |want: &[&str]| {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let list: Value = serde_json::from_str(&kubectl(&[
                "get",
                "events",
                "--field-selector",
                &selector,
                "-o",
                "json",
            ]))
            .unwrap();
            let items = list["items"].as_array().cloned().unwrap_or_default();
            let have: Vec<String> = items
                .iter()
                .filter(|e| e["source"]["component"] == "knit")
                .filter_map(|e| e["reason"].as_str().map(str::to_string))
                .collect();
            if want.iter().all(|w| have.iter().any(|h| h == w)) {
                return items;
            }
            assert!(
                Instant::now() < deadline,
                "{want:?} not among knit's events about {node}: {have:?}"
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    };
    let items = reasons(&["Initialized"]);
    let initialized = items.iter().find(|e| e["reason"] == "Initialized").unwrap();
    assert_eq!(initialized["involvedObject"]["kind"], "Node");
    assert_eq!(initialized["type"], "Normal");
    let described = kubectl(&["describe", "node", &node]);
    let events = described.split("Events:").nth(1).unwrap_or_default();
    assert!(
        events.contains("Initialized") && events.contains("knit"),
        "{described}"
    );
    let table = kubectl(&["get", "events"]);
    assert!(
        table
            .lines()
            .any(|l| l.contains(&format!("node/{node}")) && l.contains("Initialized")),
        "{table}"
    );

    // Its removal: the drain is an event on the Node too.
    env.scale_wait("workers", 0);
    reasons(&["Drained"]);
}
