//! Control-plane figures for docs/benchmarks.md:
//! 1. reconcile decision time for a 1,000-node pool (pure planning, and a
//!    full planning pass that reads the SQLite store and writes intents);
//! 2. API latency p50/p99 under a concurrent load generator on loopback
//!    (real TLS server, keep-alive HTTPS clients on threads);
//! 3. server RSS with 1,000 nodes and their phase timelines stored;
//! 4. the API latency of 2. again with the server's datastore on PostgreSQL
//!    (a throwaway server of its own from Debian's binaries, on loopback,
//!    `knit_db::testing::TestPostgres`), the same 1,000 nodes stored, and
//!    the ratio to SQLite. Skipped, saying why, when PostgreSQL cannot be
//!    started here (not root, binaries not installed).
//!
//! Run: `cargo run --release -p knit-server --example bench_control_plane`
//! (no provider is involved; everything stays on 127.0.0.1 and a temp dir).

use knit_api::state::InstanceState;
use knit_api::{NodePool, NodePoolSpec, PhaseEvent, PhaseName, PhaseOutcome};
use knit_client::{Client, ClientConfig};
use knit_db::testing::TestPostgres;
use knit_db::Datastore;
use knit_server::store::InstanceRecord;
use knit_server::{reconcile_plan, ControlPlane, NoCluster, Server, Settings};
use std::sync::Arc;
use std::time::{Duration, Instant};

const NODES: usize = 1000;

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn main() {
    let dir = tempfile::tempdir().expect("temp dir");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");

    // 1a. Pure planning over 1,000 instances (scale-in of 100 is the heavier
    // path: it sorts).
    let instances: Vec<InstanceRecord> = (0..NODES)
        .map(|i| InstanceRecord {
            name: format!("workers-{i:05}"),
            pool: "workers".into(),
            provider_id: Some(format!("i-{i:012}")),
            state: InstanceState::Running,
            ip: Some(format!("10.213.{}.{}", i / 250, i % 250 + 2)),
            instance_type: "ecs.g7.large".into(),
            report_token_hash: None,
            last_error: None,
            last_error_kind: None,
            created_ms: i as i64,
            updated_ms: i as i64,
            added: false,
        })
        .collect();
    let mut samples = Vec::new();
    for _ in 0..200 {
        let t = Instant::now();
        let p = reconcile_plan(NODES - 100, &instances, &Default::default());
        samples.push(t.elapsed());
        assert_eq!(p.delete.len(), 100);
    }
    samples.sort();
    println!(
        "plan() over {NODES} instances (scale-in by 100): p50 {:.3} ms, p99 {:.3} ms",
        ms(percentile(&samples, 0.5)),
        ms(percentile(&samples, 0.99))
    );

    // 1b. Full planning pass against the store, via a real server.
    let mut settings = Settings::new(dir.path().join("state"));
    settings.listen = "127.0.0.1:0".parse().expect("addr");
    let rss_before = rss_kib();
    let server = rt
        .block_on(knit_server::start(settings, None, Arc::new(NoCluster)))
        .expect("server");
    let cp = server.control.clone();
    let mut spec = NodePoolSpec {
        replicas: NODES as i64,
        ..Default::default()
    };
    populate(&cp, &spec, &instances);
    let rss_loaded = rss_kib();
    // Desired 900: one pass plans 100 deletions and writes their intents.
    spec.replicas = (NODES - 100) as i64;
    cp.store()
        .update_pool(&NodePool::new("workers", spec.clone()))
        .expect("update");
    let t = Instant::now();
    rt.block_on(cp.plan_all()).expect("plan");
    let first = t.elapsed();
    let mut steady = Vec::new();
    for _ in 0..50 {
        let t = Instant::now();
        rt.block_on(cp.plan_all()).expect("plan");
        steady.push(t.elapsed());
    }
    steady.sort();
    println!(
        "plan_all() with {NODES} instances in SQLite: scale-in pass (writes 100 intents) {:.1} ms; steady pass p50 {:.2} ms, p99 {:.2} ms",
        ms(first),
        ms(percentile(&steady, 0.5)),
        ms(percentile(&steady, 0.99))
    );

    // 2. API latency under concurrent load.
    let sqlite = api_latency(&server);
    for row in &sqlite {
        println!(
            "GET {}: {} requests, {} concurrent clients: p50 {:.2} ms, p99 {:.2} ms, {:.0} req/s",
            row.path, row.requests, row.threads, row.p50, row.p99, row.rps
        );
    }
    println!(
        "RSS: {} MiB before start, {} MiB with {NODES} nodes and {} timeline events stored, {} MiB after the load",
        rss_before / 1024,
        rss_loaded / 1024,
        NODES * PhaseName::ALL.len() * 2,
        rss_kib() / 1024
    );
    rt.block_on(server.shutdown());

    // 4. The same API latency with the datastore on PostgreSQL.
    let pg = match TestPostgres::start() {
        Ok(pg) => pg,
        Err(e) => {
            println!("PostgreSQL: skipped, no server could be started here: {e}");
            return;
        }
    };
    let url = match pg.create_database("knit_bench") {
        Ok(url) => url,
        Err(e) => {
            println!("PostgreSQL: skipped, no database could be created: {e}");
            return;
        }
    };
    let mut settings = Settings::new(dir.path().join("state-pg"));
    settings.listen = "127.0.0.1:0".parse().expect("addr");
    settings.datastore = Datastore::Postgres(url);
    let key = dir.path().join("secrets.key");
    std::fs::write(&key, knit_server::sealed::new_key_text().expect("key")).expect("key file");
    std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .expect("key file mode");
    settings.secrets_key_file = Some(key);
    let server = rt
        .block_on(knit_server::start(settings, None, Arc::new(NoCluster)))
        .expect("server on PostgreSQL");
    spec.replicas = NODES as i64;
    let t = Instant::now();
    populate(&server.control, &spec, &instances);
    println!(
        "PostgreSQL (loopback, fsync off): {NODES} nodes and their timelines stored in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let postgres = api_latency(&server);
    println!("API latency, same run, same load: SQLite vs PostgreSQL");
    println!(
        "| request | clients | SQLite p50 / p99 | PostgreSQL p50 / p99 | p50 ratio | p99 ratio |"
    );
    println!("|---|---|---|---|---|---|");
    for (a, b) in sqlite.iter().zip(&postgres) {
        println!(
            "| GET {} | {} | {:.2} / {:.2} ms | {:.2} / {:.2} ms | {:.2}x | {:.2}x |",
            a.path,
            a.threads,
            a.p50,
            a.p99,
            b.p50,
            b.p99,
            b.p50 / a.p50,
            b.p99 / a.p99
        );
    }
    rt.block_on(server.shutdown());
    drop(pg);
}

/// The pool, its 1,000 instances created, and each node's phases (every
/// one of `PhaseName::ALL`, started + done) in the server's store.
fn populate(cp: &ControlPlane, spec: &NodePoolSpec, instances: &[InstanceRecord]) {
    let mut cluster = knit_api::Cluster::default();
    cluster.spec.edition = "pro".into();
    cp.store().put_cluster(&cluster).expect("cluster");
    cp.store()
        .insert_pool(&NodePool::new("workers", spec.clone()))
        .expect("pool");
    let names: Vec<(String, String)> = instances
        .iter()
        .map(|i| (i.name.clone(), i.instance_type.clone()))
        .collect();
    cp.store()
        .add_create_intents("workers", &names)
        .expect("intents");
    for i in instances {
        cp.store()
            .set_instance_created(
                &i.name,
                i.provider_id.as_deref().unwrap_or(""),
                i.ip.as_deref(),
            )
            .expect("created");
    }
    // Each node: every phase, started + done.
    for (n, i) in instances.iter().enumerate() {
        let record = cp.store().instance(&i.name).expect("read").expect("exists");
        let node = format!("local.{}", i.provider_id.as_deref().unwrap_or(""));
        for (k, phase) in PhaseName::ALL.iter().enumerate() {
            for outcome in [PhaseOutcome::Started, PhaseOutcome::Done] {
                let event = PhaseEvent {
                    node: node.clone(),
                    instance_id: i.provider_id.clone().unwrap_or_default(),
                    phase: *phase,
                    outcome,
                    reason: None,
                    error_code: None,
                    at_ms: (n * 100 + k * 10) as u64,
                    duration_ms: (outcome == PhaseOutcome::Done).then_some(10),
                };
                cp.store()
                    .record_phase_event(&record, &event)
                    .expect("event");
            }
        }
    }
}

struct Latency {
    path: &'static str,
    threads: usize,
    requests: usize,
    p50: f64,
    p99: f64,
    rps: f64,
}

/// GETs from keep-alive HTTPS clients on threads, per path: p50/p99 (ms)
/// and throughput.
fn api_latency(server: &Server) -> Vec<Latency> {
    let config = ClientConfig {
        server: server.local_url.clone(),
        token: server.admin_token().to_string(),
        ca_cert: server.ca_pem().to_string(),
        state_dir: None,
        pid: None,
    };
    let mut out = Vec::new();
    for (path, threads, per_thread) in [
        ("/api/v1/pools/workers", 8, 250),
        ("/healthz", 8, 500),
        ("/api/v1/nodes/local.i-000000000500", 8, 250),
        ("/api/v1/nodes", 4, 25),
    ] {
        let started = Instant::now();
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                let config = config.clone();
                let path = path.to_string();
                std::thread::spawn(move || {
                    let client = Client::new(&config).expect("client");
                    let mut lat = Vec::with_capacity(per_thread);
                    for _ in 0..per_thread {
                        let t = Instant::now();
                        let (status, _) = client.raw("GET", &path, None).expect("request");
                        assert_eq!(status, 200, "{path}");
                        lat.push(t.elapsed());
                    }
                    lat
                })
            })
            .collect();
        let mut all: Vec<Duration> = handles
            .into_iter()
            .flat_map(|h| h.join().expect("thread"))
            .collect();
        let wall = started.elapsed();
        all.sort();
        out.push(Latency {
            path,
            threads,
            requests: all.len(),
            p50: ms(percentile(&all, 0.5)),
            p99: ms(percentile(&all, 0.99)),
            rps: all.len() as f64 / wall.as_secs_f64(),
        });
    }
    out
}
