//! Opt-in smoke test against a real Alibaba Cloud account: a real knit
//! server over the ECS provider makes a one-node pool, attaches an
//! instance made outside knit (automatic mode: preflight from the real
//! facts, rename, stop, new system disk, start), snapshots that
//! instance's data disk, and everything it made is removed by tag, on
//! success, failure and panic alike. It costs money and never runs in CI:
//! it is `#[ignore]`d, and even when asked for it skips, saying why,
//! unless `KNIT_ECS_LIVE=1` and a real key are there. Run it with
//!
//! ```sh
//! KNIT_ECS_LIVE=1 ALIBABA_CLOUD_ACCESS_KEY_ID=… ALIBABA_CLOUD_ACCESS_KEY_SECRET=… \
//! KNIT_ECS_REGION=cn-shanghai KNIT_ECS_VSWITCH=vsw-… KNIT_ECS_SECURITY_GROUPS=sg-… \
//! KNIT_ECS_IMAGE=aliyun_3_x64_20G_alibase_….vhd [KNIT_ECS_INSTANCE_TYPE=ecs.g7.large] \
//! [KNIT_ECS_ENDPOINT=https://…] \
//! cargo test -p knit-server --test ecs_live -- --ignored --nocapture
//! ```
//!
//! Everything it makes carries the run's tag (`knit.dev/pool` for the
//! pool's instance, `knit.dev/smoke-run` for the attached one, the run's
//! name for the snapshot); the sweep deletes by those, waits for
//! instances still being made, and names whatever it could not delete.
//! The knit server listens on loopback, so the pool's node does not join
//! a cluster here: what is smoke-tested is every call knit makes to ECS.

mod support;

use knit_ecs::api::{DataDisk, DescribeInstances, DescribeSnapshots, RunInstances};
use knit_ecs::{Client, ClientConfig, Credentials};
use knit_server::provider::ecs::{client_token, EcsProvider, EcsSettings};
use knit_server::provider::{Provider, TAG_NAME, TAG_POOL};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::TestServer;

/// Tag of the instance made outside knit.
const TAG_RUN: &str = "knit.dev/smoke-run";
/// Longest wait for one thing (an instance Running, an attach, a snapshot).
const WAIT: Duration = Duration::from_secs(900);
const POLL: Duration = Duration::from_secs(10);

struct Live {
    region: String,
    endpoint: Option<String>,
    v_switch: String,
    groups: Vec<String>,
    image: String,
    instance_type: String,
}

/// The run's settings, or why the test does not run.
fn live() -> Result<(Live, Credentials), String> {
    if std::env::var("KNIT_ECS_LIVE").as_deref() != Ok("1") {
        return Err("KNIT_ECS_LIVE is not 1".into());
    }
    let credentials = Credentials::discover().map_err(|e| format!("no real key: {e}"))?;
    let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
    let missing: Vec<&str> = [
        "KNIT_ECS_REGION",
        "KNIT_ECS_VSWITCH",
        "KNIT_ECS_SECURITY_GROUPS",
        "KNIT_ECS_IMAGE",
    ]
    .into_iter()
    .filter(|k| var(k).is_none())
    .collect();
    // Asked for, with a key: a missing setting is a failure, not a skip.
    assert!(
        missing.is_empty(),
        "KNIT_ECS_LIVE=1 but {} not set (see the top of ecs_live.rs)",
        missing.join(", ")
    );
    let get = |k: &str| var(k).unwrap_or_default();
    Ok((
        Live {
            region: get("KNIT_ECS_REGION"),
            endpoint: var("KNIT_ECS_ENDPOINT"),
            v_switch: get("KNIT_ECS_VSWITCH"),
            groups: get("KNIT_ECS_SECURITY_GROUPS")
                .split(',')
                .map(|g| g.trim().to_string())
                .filter(|g| !g.is_empty())
                .collect(),
            image: get("KNIT_ECS_IMAGE"),
            instance_type: var("KNIT_ECS_INSTANCE_TYPE").unwrap_or_else(|| "ecs.g7.large".into()),
        },
        credentials,
    ))
}

/// Deletes everything of the run, by tag, when dropped (success, failure
/// or panic); never panics itself.
struct Sweep {
    client: Client,
    run: String,
}

impl Sweep {
    /// What of the run is still there: instances (by either tag) and
    /// snapshots (by name and knit's tag).
    fn found(&self) -> Result<(Vec<knit_ecs::api::Instance>, Vec<String>), knit_ecs::EcsError> {
        let mut instances = Vec::new();
        for tag in [TAG_POOL, TAG_RUN] {
            let f = DescribeInstances {
                tags: [(tag.to_string(), self.run.clone())].into_iter().collect(),
                ..Default::default()
            };
            for i in self.client.describe_instances(&f)? {
                if !instances
                    .iter()
                    .any(|j: &knit_ecs::api::Instance| j.instance_id == i.instance_id)
                {
                    instances.push(i);
                }
            }
        }
        let snapshots = self
            .client
            .describe_snapshots(&DescribeSnapshots {
                snapshot_name: Some(self.run.clone()),
                ..Default::default()
            })?
            .into_iter()
            .filter(|s| s.tags.map().get("knit.dev/snapshot-name") == Some(&self.run))
            .map(|s| s.snapshot_id)
            .collect();
        Ok((instances, snapshots))
    }

    /// Deletes until nothing is left or [`WAIT`] has passed: the ids left.
    fn sweep(&self) -> Vec<String> {
        let started = Instant::now();
        loop {
            let left = match self.found() {
                Ok((instances, snapshots)) => {
                    for s in &snapshots {
                        match self.client.delete_snapshot(s) {
                            Ok(()) => eprintln!("sweep: deleted snapshot {s}"),
                            Err(e) => eprintln!("sweep: snapshot {s}: {e}"),
                        }
                    }
                    for i in &instances {
                        // A Pending instance cannot be deleted yet.
                        if i.status == "Pending" {
                            continue;
                        }
                        match self.client.delete_instance(&i.instance_id, true) {
                            Ok(()) => eprintln!("sweep: deleted instance {}", i.instance_id),
                            Err(e) if e.is_not_found() => {}
                            Err(e) => eprintln!("sweep: instance {}: {e}", i.instance_id),
                        }
                    }
                    instances
                        .into_iter()
                        .map(|i| i.instance_id)
                        .chain(snapshots)
                        .collect::<Vec<_>>()
                }
                Err(e) => {
                    eprintln!("sweep: listing the run's resources: {e}");
                    vec![format!("(unlisted: {e})")]
                }
            };
            if left.is_empty() {
                return left;
            }
            if started.elapsed() > WAIT {
                return left;
            }
            std::thread::sleep(POLL);
        }
    }
}

impl Drop for Sweep {
    fn drop(&mut self) {
        let left = self.sweep();
        if left.is_empty() {
            eprintln!("sweep: nothing tagged {} is left", self.run);
        } else {
            eprintln!(
                "sweep: LEFT BEHIND, delete by hand (tag {TAG_POOL} or {TAG_RUN} = {}): {left:?}",
                self.run
            );
        }
    }
}

fn wait_for<T>(what: &str, mut probe: impl FnMut() -> Option<T>) -> T {
    let started = Instant::now();
    loop {
        if let Some(v) = probe() {
            return v;
        }
        assert!(
            started.elapsed() < WAIT,
            "{what}: not after {} s",
            WAIT.as_secs()
        );
        std::thread::sleep(POLL);
    }
}

fn random_hex(bytes: usize) -> String {
    let mut b = vec![0u8; bytes];
    getrandom::getrandom(&mut b).expect("random bytes");
    hex::encode(b)
}

#[test]
#[ignore = "live: needs KNIT_ECS_LIVE=1 and a real Alibaba Cloud key; costs money"]
fn live_pool_attach_snapshot_cleanup() {
    let (cfg, credentials) = match live() {
        Ok(x) => x,
        Err(why) => {
            eprintln!("SKIPPED ecs_live: {why}; nothing was called (see the top of ecs_live.rs)");
            return;
        }
    };
    let run = format!("knit-smoke-{}", random_hex(4));
    eprintln!("run {run} in {}", cfg.region);
    let client_config = ClientConfig::new(&cfg.region, cfg.endpoint.as_deref()).unwrap();
    // Declared first, dropped last: after the server has stopped making
    // instances for the pool.
    let sweep = Sweep {
        client: Client::new(client_config.clone(), credentials.clone()),
        run: run.clone(),
    };
    let ecs = Client::new(client_config, credentials.clone());
    let settings = || {
        let mut s = EcsSettings::new(&cfg.region);
        s.endpoint = cfg.endpoint.clone();
        s.v_switch_id = Some(cfg.v_switch.clone());
        s.security_group_ids = cfg.groups.clone();
        s.default_image = Some(cfg.image.clone());
        s.wait_limit = WAIT;
        s
    };
    let me = ecs.get_caller_identity().expect("the key works (STS)");
    eprintln!("account {} as {}", me.account_id, me.arn);

    // 1. A one-node pool through a real knit server.
    let mut srv = TestServer::new();
    srv.start(Some(Arc::new(
        EcsProvider::new(settings(), credentials.clone()).unwrap(),
    )));
    srv.write_agent_checksum();
    let pool = format!(
        "apiVersion: knit.dev/v1alpha1\nkind: NodePool\nmetadata:\n  name: {run}\n\
         spec:\n  replicas: 1\n  instanceTypes: [{}]\n",
        cfg.instance_type
    );
    srv.client()
        .call("POST", "/api/v1/pools", Some(&pool))
        .unwrap();
    let node = wait_for("the pool's instance Running at ECS", || {
        let f = DescribeInstances {
            tags: [(TAG_POOL.to_string(), run.clone())].into_iter().collect(),
            ..Default::default()
        };
        let found = ecs.describe_instances(&f).ok()?;
        found.into_iter().find(|i| i.status == "Running")
    });
    let tags = node.tags.map();
    assert!(tags.contains_key(TAG_NAME), "{tags:?}");
    eprintln!(
        "pool instance {} ({:?})",
        node.instance_id,
        node.private_ip()
    );
    wait_for("the server records it", || {
        let items = srv.client().get("/api/v1/instances").ok()?;
        items["items"]
            .as_array()?
            .iter()
            .any(|i| i["providerId"] == node.instance_id.as_str())
            .then_some(())
    });

    // 2. An instance made outside knit, then attached to the pool.
    let existing = ecs
        .run_instances(&RunInstances {
            image_id: cfg.image.clone(),
            instance_type: cfg.instance_type.clone(),
            v_switch_id: Some(cfg.v_switch.clone()),
            security_group_ids: cfg.groups.clone(),
            instance_name: format!("{run}-existing"),
            host_name: Some(format!("{run}-existing")),
            system_disk_gib: Some(40),
            system_disk_category: Some("cloud_essd".into()),
            data_disks: vec![DataDisk {
                size_gib: Some(20),
                category: Some("cloud_essd".into()),
                delete_with_instance: true,
                ..Default::default()
            }],
            tags: [(TAG_RUN.to_string(), run.clone())].into_iter().collect(),
            client_token: client_token("smoke", &[&run]),
            ..Default::default()
        })
        .unwrap();
    let before = wait_for("the outside instance Running", || {
        ecs.describe_instance(&existing)
            .ok()
            .flatten()
            .filter(|i| i.status == "Running")
    });
    let old_system: Vec<String> = ecs
        .describe_disks(&existing, "system")
        .unwrap()
        .into_iter()
        .map(|d| d.disk_id)
        .collect();
    // The cluster is in the key's region and the vSwitch's VPC: what the
    // preflight compares the instance's real facts with.
    let cluster = format!(
        "apiVersion: knit.dev/v1alpha1\nkind: Cluster\nmetadata: {{name: {run}}}\n\
         spec: {{region: {}, vpc: {}}}\n",
        cfg.region, before.vpc_attributes.vpc_id
    );
    srv.client()
        .call("PUT", "/api/v1/cluster", Some(&cluster))
        .unwrap();
    // No key pair: a password pool's rule; the password is never printed.
    let password = format!("Kn1t-{}", random_hex(8));
    let dry = srv
        .client()
        .call(
            "POST",
            &format!("/api/v1/pools/{run}/attach"),
            Some(
                &serde_json::json!({"instances": [existing], "dryRun": true,
                                    "password": password})
                .to_string(),
            ),
        )
        .unwrap();
    eprintln!(
        "preflight from the real facts:\n{}",
        serde_json::to_string_pretty(&dry["preflight"]).unwrap()
    );
    assert_eq!(
        dry["passed"], true,
        "the preflight must pass for the attach (security group rules, RAM role …)"
    );
    let attached = srv
        .client()
        .call(
            "POST",
            &format!("/api/v1/pools/{run}/attach"),
            Some(&serde_json::json!({"instances": [existing], "password": password}).to_string()),
        )
        .unwrap();
    let outcome = &attached["attached"][0];
    assert_eq!(outcome["providerId"], existing.as_str(), "{attached}");
    let after = wait_for("the attached instance Running again", || {
        ecs.describe_instance(&existing)
            .ok()
            .flatten()
            .filter(|i| i.status == "Running")
    });
    let node_name = outcome["nodeName"].as_str().unwrap_or_default();
    assert_eq!(after.instance_name, node_name, "renamed at ECS");
    assert_ne!(after.instance_name, before.instance_name);
    let new_system: Vec<String> = ecs
        .describe_disks(&existing, "system")
        .unwrap()
        .into_iter()
        .map(|d| d.disk_id)
        .collect();
    assert_ne!(new_system, old_system, "a new system disk");
    eprintln!("attached {existing} as {node_name}");

    // 3. A snapshot of the attached instance's data disk.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let provider = EcsProvider::new(settings(), credentials).unwrap();
    let snap = rt
        .block_on(provider.snapshot_create(&existing, 0, &run))
        .unwrap();
    eprintln!("snapshot {} of {} bytes", snap.id, snap.size_bytes);
    assert!(snap.size_bytes >= 20 << 30);
    let named = rt.block_on(provider.snapshots_named(&run)).unwrap();
    assert_eq!(named, vec![snap.id.clone()]);

    // 4. The pool scaled to zero: the server deletes its instance.
    srv.client()
        .call(
            "POST",
            &format!("/api/v1/pools/{run}/scale"),
            Some(r#"{"replicas": 0}"#),
        )
        .unwrap();
    wait_for("the pool's instance deleted", || {
        ecs.describe_instance(&node.instance_id)
            .ok()?
            .is_none()
            .then_some(())
    });
    drop(srv);

    // 5. Nothing of the run is left (the drop sweeps again, finding none).
    let left = sweep.sweep();
    assert!(left.is_empty(), "left behind: {left:?}");
}
