//! Pool rollouts end to end on the local cloud, one pool of three nodes
//! joined to the embedded cluster (`updateStrategy: {maxSurge: 1,
//! maxUnavailable: 0}`), while a sampler reads the pool every ~200 ms and
//! every sample is checked: never more than 4 instances counting toward the
//! pool, never fewer than 3 Ready nodes.
//!
//! 1. The instance type changes: the nodes are replaced one at a time;
//!    `knit rollout status` exits 0; every node is up to date (`knit get
//!    nodes` UP-TO-DATE yes) and of the new type.
//! 2. `knit rollout restart`, paused once the first replacement is made:
//!    nothing more is replaced while paused; resumed, it finishes.
//! 3. Another change, the server killed with SIGKILL midway and started
//!    again: the rollout finishes with no extra or lost machine. Then
//!    `knit rollout undo`: back to the previous template (and its labels).
//! 4. A pod on each node under a PodDisruptionBudget that allows no
//!    eviction, then `rollout restart`: the rollout holds at the drain of
//!    the first old node (shown Blocked, `rollout status` not done); the
//!    budget relaxed, it finishes.
//!
//! Needs root, the node image and the workspace's binaries (as local_e2e);
//! kubectl (Debian's, at /usr/bin/kubectl). Everything is released by the
//! `Env` guard on success, failure and panic.

mod common;

use common::Env;
use serde_json::Value;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn pool_yaml(replicas: u32, instance_type: &str, tier: &str) -> String {
    format!(
        "apiVersion: knit.dev/v1alpha1
kind: NodePool
metadata: {{name: workers}}
spec:
  replicas: {replicas}
  instanceTypes: [{instance_type}]
  labels: {{tier: {tier}}}
  systemDisk: {{sizeGiB: 20}}
  preUserData: touch /var/.skip-yum
  joinTimeoutSeconds: 300
  updateStrategy: {{type: RollingUpdate, maxSurge: 1, maxUnavailable: 0}}
  drain: {{timeoutSeconds: 900, onTimeout: wait}}
"
    )
}

/// Polls `f` every 500 ms until it gives a value, at most `secs`.
fn until<T>(env: &Env, what: &str, secs: u64, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "{what} not within {secs} s\n{}",
            env.server_log_tail()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// One sample: instances counting toward the pool and Ready nodes.
#[derive(Debug, Clone, Copy)]
struct Sample {
    at_ms: u128,
    instances: i64,
    ready: i64,
}

/// Reads the pool through `knit get pool -o json` every ~200 ms on its own
/// thread (the same command as `env.cmd()`, rebuilt there).
struct Sampler {
    started: Instant,
    stop: Arc<AtomicBool>,
    samples: Arc<Mutex<Vec<Sample>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Sampler {
    fn start(env: &Env) -> Sampler {
        let template = env.cmd();
        let program = template.get_program().to_owned();
        let args: Vec<_> = template.get_args().map(|a| a.to_owned()).collect();
        let envs: Vec<_> = template
            .get_envs()
            .map(|(k, v)| (k.to_owned(), v.map(|v| v.to_owned())))
            .collect();
        let dir = template.get_current_dir().map(|d| d.to_owned());
        let stop = Arc::new(AtomicBool::new(false));
        let samples = Arc::new(Mutex::new(Vec::new()));
        let started = Instant::now();
        let thread = std::thread::spawn({
            let (stop, samples) = (Arc::clone(&stop), Arc::clone(&samples));
            move || {
                while !stop.load(Ordering::Relaxed) {
                    let mut cmd = Command::new(&program);
                    cmd.args(&args);
                    for (k, v) in &envs {
                        match v {
                            Some(v) => cmd.env(k, v),
                            None => cmd.env_remove(k),
                        };
                    }
                    if let Some(d) = &dir {
                        cmd.current_dir(d);
                    }
                    cmd.args(["get", "pool", "workers", "-o", "json"]);
                    if let Ok(out) = cmd.output() {
                        if let Ok(v) = serde_json::from_slice::<Value>(&out.stdout) {
                            let st = &v["status"];
                            if let (Some(instances), Some(ready)) =
                                (st["instances"].as_i64(), st["ready"].as_i64())
                            {
                                let at_ms = started.elapsed().as_millis();
                                if let Ok(mut s) = samples.lock() {
                                    s.push(Sample {
                                        at_ms,
                                        instances,
                                        ready,
                                    });
                                }
                            }
                        }
                    }
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
        });
        Sampler {
            started,
            stop,
            samples,
            thread: Some(thread),
        }
    }

    /// Stops sampling; every sample taken.
    fn finish(mut self) -> Vec<Sample> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.join().expect("the sampler thread panicked");
        }
        let samples = self.samples.lock().map(|s| s.clone()).unwrap_or_default();
        samples
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn rollout(env: &Env) -> Value {
    env.pool()["status"]["rollout"].clone()
}

fn rollout_status_ok(env: &Env) {
    let (ok, out, err) = env.knit(&["rollout", "status", "pool", "workers", "--timeout", "10m"]);
    assert!(
        ok,
        "rollout status failed:\n{out}{err}\n{}",
        env.server_log_tail()
    );
    assert!(out.contains("successfully rolled out"), "{out}");
    // The last old node is released after the rollout counts as done.
    until(env, "the old nodes gone", 120, || {
        (env.nodes_of("workers").len() == 3 && env.provider_names().len() == 3).then_some(())
    });
}

/// Instance names of pool `workers` counting toward it, and their types.
fn instance_types(env: &Env) -> Vec<(String, String)> {
    env.store_instances()
        .into_iter()
        .filter(|i| i["pool"] == "workers" && i["state"] != "Deleting" && i["state"] != "Detached")
        .map(|i| {
            (
                i["name"].as_str().unwrap_or_default().to_string(),
                i["instanceType"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

fn apply(env: &Env, yaml: &str) {
    let file = env.path("workers.yaml");
    std::fs::write(&file, yaml).unwrap();
    env.knit_ok(&["apply", "-f", file.to_str().unwrap()]);
}

fn kubectl(env: &Env, args: &[&str], stdin: Option<&str>) -> String {
    use std::io::Write;
    let mut child = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(env.path("server/cluster/admin.kubeconfig"))
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("kubectl (Debian's kubernetes-client) must be installed");
    if let Some(text) = stdin {
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
    }
    drop(child.stdin.take());
    let out = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "kubectl {args:?}: {text}");
    text
}

#[test]
fn a_rolling_update_holds_its_bounds_pauses_undoes_and_waits_for_a_budget() {
    let mut env = Env::builder().cluster(true).parallelism(2).build();
    env.start(true);
    env.create("pool", &pool_yaml(0, "ecs.g7.large", "a"));
    let out = env.scale_wait("workers", 3);
    assert!(out.contains("3/3 initialized and Ready"), "{out}");
    let first = instance_types(&env);
    assert_eq!(first.len(), 3);
    assert!(first.iter().all(|(_, t)| t == "ecs.g7.large"), "{first:?}");
    let generation = env.pool()["metadata"]["generation"].as_i64().unwrap();
    let sampler = Sampler::start(&env);

    // 1. The instance type changes: a rolling update.
    apply(&env, &pool_yaml(3, "ecs.g7.xlarge", "a"));
    let pool = env.pool();
    assert_eq!(
        pool["metadata"]["generation"].as_i64().unwrap(),
        generation + 1
    );
    rollout_status_ok(&env);
    let now = instance_types(&env);
    assert_eq!(now.len(), 3, "{now:?}");
    assert!(now.iter().all(|(_, t)| t == "ecs.g7.xlarge"), "{now:?}");
    assert!(
        now.iter().all(|(n, _)| first.iter().all(|(o, _)| o != n)),
        "every node replaced: {first:?} -> {now:?}"
    );
    let table = env.knit_ok(&["get", "nodes"]);
    assert!(table.contains("UP-TO-DATE"), "{table}");
    for node in env.nodes_of("workers") {
        assert_eq!(
            node["upToDate"],
            true,
            "{node}\npool status: {}\ninstances: {:?}\nevents: {}",
            env.pool()["status"],
            env.store_instances(),
            env.knit_ok(&["get", "events"])
        );
    }
    let pools = env.knit_ok(&["get", "pools"]);
    assert!(pools.contains("UP-TO-DATE"), "{pools}");
    let pool = env.pool();
    assert_eq!(pool["status"]["updatedReplicas"], 3);
    assert_eq!(
        pool["status"]["observedGeneration"],
        pool["metadata"]["generation"]
    );

    // 2. Restart, paused after the first replacement is made.
    env.knit_ok(&["rollout", "restart", "pool", "workers"]);
    until(&env, "the first replacement made", 120, || {
        (rollout(&env)["updated"].as_i64().unwrap_or(0) >= 1).then_some(())
    });
    env.knit_ok(&["rollout", "pause", "pool", "workers"]);
    std::thread::sleep(Duration::from_secs(3));
    let held = rollout(&env);
    assert_eq!(held["state"], "Paused", "{held}");
    let (done, out, _) = env.knit(&["rollout", "status", "pool", "workers", "--no-watch"]);
    assert!(!done && out.contains("paused"), "{out}");
    // Paused: whatever was under way settles, then nothing more moves.
    std::thread::sleep(Duration::from_secs(20));
    let before = rollout(&env)["outdated"].as_i64().unwrap();
    assert!(before >= 1, "paused midway: {}", rollout(&env));
    std::thread::sleep(Duration::from_secs(10));
    assert_eq!(
        rollout(&env)["outdated"].as_i64().unwrap(),
        before,
        "nothing replaced while paused"
    );
    env.knit_ok(&["rollout", "resume", "pool", "workers"]);
    rollout_status_ok(&env);

    // 3. Undo: the template (and labels) of the previous revision. The
    // rollout to it survives the server killed with SIGKILL midway.
    apply(&env, &pool_yaml(3, "ecs.g7.2xlarge", "b"));
    until(&env, "the first replacement made", 120, || {
        (rollout(&env)["updated"].as_i64().unwrap_or(0) >= 1).then_some(())
    });
    let killed_ms = sampler.started.elapsed().as_millis();
    env.kill_server();
    let machines = env.provider_names();
    assert!(machines.len() <= 4, "{machines:?}");
    env.start_server();
    // The embedded cluster restarts with the server: its nodes report
    // Ready again within a few heartbeats. Ready samples of that window
    // say nothing about the rollout and are not held to the bound.
    let restarted_ms = sampler.started.elapsed().as_millis() + 20_000;
    rollout_status_ok(&env);
    assert!(instance_types(&env)
        .iter()
        .all(|(_, t)| t == "ecs.g7.2xlarge"));
    let history = env.knit_ok(&["rollout", "history", "pool", "workers"]);
    assert!(history.contains("spec.instanceTypes"), "{history}");
    env.knit_ok(&["rollout", "undo", "pool", "workers"]);
    let pool = env.pool();
    assert_eq!(pool["spec"]["instanceTypes"][0], "ecs.g7.xlarge", "{pool}");
    assert_eq!(pool["spec"]["labels"]["tier"], "a", "{pool}");
    rollout_status_ok(&env);
    assert!(instance_types(&env)
        .iter()
        .all(|(_, t)| t == "ecs.g7.xlarge"));

    // 4. A budget in the way: the rollout holds at the drain.
    let nodes: Vec<String> = env
        .nodes_of("workers")
        .iter()
        .map(|n| n["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(nodes.len(), 3);
    for (i, node) in nodes.iter().enumerate() {
        kubectl(
            &env,
            &["create", "--validate=false", "-f", "-"],
            Some(&format!(
                "apiVersion: v1
kind: Pod
metadata: {{name: web-{i}, labels: {{app: web}}}}
spec:
  nodeName: {node}
  terminationGracePeriodSeconds: 1
  containers: [{{name: app, image: registry.local/web:1}}]
"
            )),
        );
    }
    kubectl(
        &env,
        &["create", "--validate=false", "-f", "-"],
        Some(
            "apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: web}
spec: {minAvailable: 3, selector: {matchLabels: {app: web}}}
",
        ),
    );
    until(&env, "the pods Running and the budget at 0", 60, || {
        let b: Value =
            serde_json::from_str(&kubectl(&env, &["get", "pdb", "web", "-o", "json"], None))
                .unwrap();
        (b["status"]["currentHealthy"] == 3 && b["status"]["disruptionsAllowed"] == 0).then_some(())
    });
    env.knit_ok(&["rollout", "restart", "pool", "workers"]);
    let blocked = until(
        &env,
        "an old node's drain blocked by the budget",
        180,
        || {
            env.nodes_of("workers")
                .into_iter()
                .find(|n| n["drain"]["state"] == "Blocked")
        },
    );
    assert!(
        blocked["drain"]["blockingBudget"]
            .as_str()
            .unwrap_or_default()
            .starts_with("default/web"),
        "{blocked}"
    );
    std::thread::sleep(Duration::from_secs(10));
    let r = rollout(&env);
    assert_eq!(r["state"], "Progressing", "{r}");
    assert!(
        r["outdated"].as_i64().unwrap() >= 2,
        "held at the drain: {r}"
    );
    assert!(
        env.provider_names().len() <= 4,
        "no machine beyond the surge while the drain waits: {:?}",
        env.provider_names()
    );
    let (done, out, _) = env.knit(&["rollout", "status", "pool", "workers", "--no-watch"]);
    assert!(!done, "{out}");
    kubectl(
        &env,
        &[
            "patch",
            "pdb",
            "web",
            "--type=merge",
            "-p",
            r#"{"spec":{"minAvailable":0}}"#,
        ],
        None,
    );
    rollout_status_ok(&env);
    let reasons: Vec<String> = env.json(&["get", "events", "-o", "json"])["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["reason"].as_str().map(str::to_string))
        .collect();
    for want in [
        "RollingUpdate",
        "RolloutPaused",
        "RolloutResumed",
        "RolledBack",
        "DrainBlocked",
    ] {
        assert!(reasons.iter().any(|r| r == want), "{want} in {reasons:?}");
    }

    // The bounds held at every sample.
    let samples = sampler.finish();
    assert!(samples.len() > 50, "too few samples: {}", samples.len());
    for s in &samples {
        assert!(
            s.instances <= 4,
            "more than desired + maxSurge {} ms in: {s:?}",
            s.at_ms
        );
        let restarting = (killed_ms..restarted_ms).contains(&s.at_ms);
        assert!(
            s.ready >= 3 || restarting,
            "fewer than desired - maxUnavailable Ready {} ms in: {s:?}",
            s.at_ms
        );
    }
    let lowest = samples.iter().map(|s| s.ready).min().unwrap_or(0);
    let highest = samples.iter().map(|s| s.instances).max().unwrap_or(0);
    eprintln!(
        "{} samples: instances at most {highest}, Ready at least {lowest}",
        samples.len()
    );
}
