//! A pool's instance types in order against the fake ECS: its first type
//! sold out (RunInstances answers `OperationDenied.NoStock`), the instance
//! is made with the second through the real ECS provider and reconciler,
//! and an event says which type had no stock and which was tried.

mod support;

use knit_ecs::fake::FakeEcs;
use knit_server::provider::ecs::{EcsProvider, EcsSettings};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::TestServer;

#[test]
fn a_sold_out_type_falls_back_to_the_next_on_ecs() {
    let fake = FakeEcs::start();
    fake.set_sold_out("ecs.g7.large", true);
    let mut s = EcsSettings::new(&fake.region());
    s.endpoint = Some(fake.url());
    s.v_switch_id = Some("vsw-fake0001".into());
    s.security_group_ids = vec!["sg-fake0001".into()];
    s.default_image = Some(fake.config().images[0].clone());
    s.poll_interval = Duration::from_millis(10);
    s.retry.first_backoff = Duration::from_millis(1);
    let provider = EcsProvider::new(s, fake.credentials()).unwrap();

    let mut srv = TestServer::new();
    srv.start(Some(Arc::new(provider)));
    srv.write_agent_checksum();
    let yaml = "apiVersion: knit.dev/v1alpha1\nkind: NodePool\nmetadata:\n  name: workers\nspec:\n  replicas: 1\n  instanceTypes: [ecs.g7.large, ecs.g7.xlarge]\n";
    srv.client()
        .call("POST", "/api/v1/pools", Some(yaml))
        .unwrap();

    let deadline = Instant::now() + Duration::from_secs(120);
    let instance = loop {
        let instances = srv
            .server()
            .control
            .store()
            .instances(Some("workers"))
            .unwrap();
        if let Some(i) = instances.iter().find(|i| i.provider_id.is_some()) {
            break i.clone();
        }
        assert!(Instant::now() < deadline, "{instances:?}");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(instance.instance_type, "ecs.g7.xlarge");
    let id = instance.provider_id.clone().unwrap();
    assert_eq!(
        fake.instance(&id).map(|i| i.instance_type),
        Some("ecs.g7.xlarge".to_string())
    );
    // Only the one instance was made: the sold-out type made nothing.
    assert_eq!(fake.instances().len(), 1);
    let events = srv.client().get("/api/v1/events?limit=200").unwrap();
    let fallback: Vec<String> = events["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["reason"] == "InstanceTypeFallback")
        .map(|e| e["message"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(fallback.len(), 1, "{events}");
    assert!(
        fallback[0].starts_with("ecs.g7.large has no capacity")
            && fallback[0].contains("OperationDenied.NoStock")
            && fallback[0].ends_with("trying ecs.g7.xlarge"),
        "{fallback:?}"
    );
}
