//! A real knit server (TLS, SQLite, reconciler) over the ECS provider over
//! the fake ECS: a pool's replicas become ECS instances carrying knit's tags
//! and user data, and scaling down deletes them.

mod support;

use knit_ecs::fake::{FakeEcs, Fault};
use knit_server::provider::ecs::{EcsProvider, EcsSettings};
use knit_server::provider::{TAG_NAME, TAG_POOL};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::TestServer;

/// Waits (bounded) until `done` holds.
fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn pool_replicas_become_ecs_instances() {
    let fake = FakeEcs::start();
    let mut s = EcsSettings::new(&fake.region());
    s.endpoint = Some(fake.url());
    s.v_switch_id = Some("vsw-fake0001".into());
    s.security_group_ids = vec!["sg-fake0001".into()];
    s.default_image = Some(fake.config().images[0].clone());
    s.poll_interval = Duration::from_millis(10);
    s.retry.first_backoff = Duration::from_millis(1);
    let provider = EcsProvider::new(s, fake.credentials()).unwrap();
    // Throttling on the first creates: the reconciler still gets there.
    fake.inject("RunInstances", Fault::Throttling, 2);

    let mut srv = TestServer::new();
    srv.start(Some(Arc::new(provider)));
    srv.write_agent_checksum();
    let yaml = "apiVersion: knit.dev/v1alpha1\nkind: NodePool\nmetadata:\n  name: workers\nspec:\n  replicas: 2\n";
    srv.client()
        .call("POST", "/api/v1/pools", Some(yaml))
        .unwrap();

    let mine = |f: &FakeEcs| {
        f.instances()
            .into_iter()
            .filter(|i| i.tags.get(TAG_POOL).map(String::as_str) == Some("workers"))
            .collect::<Vec<_>>()
    };
    wait_for("two running ECS instances", || {
        let list = mine(&fake);
        list.len() == 2 && list.iter().all(|i| i.status == "Running")
    });
    for i in mine(&fake) {
        assert!(i.tags.contains_key(TAG_NAME), "{:?}", i.tags);
        assert!(!i.user_data.is_empty(), "knit's user data reached ECS");
        assert_eq!(i.image, fake.config().images[0]);
    }
    // The fake shows an instance Running as soon as RunInstances answers;
    // the server records its id once that answer reaches the reconciler, so
    // wait for the record rather than read it at once.
    let recorded_ids = || -> Vec<String> {
        let recorded = srv.client().get("/api/v1/instances").unwrap();
        recorded["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|i| i["providerId"].as_str().map(str::to_string))
            .collect()
    };
    wait_for("the server to record both instances' ids", || {
        let ids = recorded_ids();
        mine(&fake).iter().all(|i| ids.contains(&i.id))
    });

    srv.client()
        .call(
            "POST",
            "/api/v1/pools/workers/scale",
            Some(r#"{"replicas": 0}"#),
        )
        .unwrap();
    wait_for("the instances deleted", || mine(&fake).is_empty());
    assert!(fake.disks().is_empty(), "disks went with their instances");
}

/// The add-existing preflight over the ECS provider compares the
/// account's values: the instance's region and VPC (DescribeInstances)
/// with the cluster's, and the cluster's account is the key's (STS
/// GetCallerIdentity), not the local cloud's. An instance the key can see
/// is in the key's account, so its account is the key's too.
#[test]
fn attach_preflight_reads_the_accounts_values() {
    let fake = FakeEcs::start();
    let mut s = EcsSettings::new(&fake.region());
    s.endpoint = Some(fake.url());
    s.v_switch_id = Some("vsw-fake0001".into());
    s.security_group_ids = vec!["sg-fake0001".into()];
    s.default_image = Some(fake.config().images[0].clone());
    s.poll_interval = Duration::from_millis(10);
    let provider = EcsProvider::new(s, fake.credentials()).unwrap();
    let existing = fake.add_existing("old-web", "ecs.g7.large", None);
    let mut srv = TestServer::new();
    srv.start(Some(Arc::new(provider)));
    srv.write_agent_checksum();
    let cluster = format!(
        "apiVersion: knit.dev/v1alpha1\nkind: Cluster\nmetadata: {{name: c}}\n\
         spec: {{region: {}, vpc: vpc-fake0001}}\n",
        fake.region()
    );
    srv.client()
        .call("PUT", "/api/v1/cluster", Some(&cluster))
        .unwrap();
    let yaml = "apiVersion: knit.dev/v1alpha1\nkind: NodePool\nmetadata:\n  name: added\nspec:\n  replicas: 0\n";
    srv.client()
        .call("POST", "/api/v1/pools", Some(yaml))
        .unwrap();
    let body = serde_json::json!({"instances": [existing], "dryRun": true}).to_string();
    let report = srv
        .client()
        .call("POST", "/api/v1/pools/added/attach", Some(&body))
        .unwrap();
    let results = report["preflight"][0]["results"].as_array().unwrap();
    let status = |check: &str| {
        results
            .iter()
            .find(|r| r["check"] == check)
            .map(|r| (r["status"].as_str().unwrap_or(""), r["message"].to_string()))
            .unwrap_or_else(|| panic!("no {check} in {report}"))
    };
    for check in ["same-account", "same-region", "same-vpc"] {
        let (st, msg) = status(check);
        assert_eq!(st, "pass", "{check}: {msg}");
    }
    assert!(
        status("same-account").1.contains(&fake.config().account_id),
        "{report}"
    );
    assert!(fake.calls("GetCallerIdentity") >= 1);
}
