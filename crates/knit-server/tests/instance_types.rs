//! A pool's instance types are asked of the provider at pool write
//! (issue 25): on ECS through DescribeInstanceTypes (the fake ECS), on the
//! local cloud from its catalog. An unknown type is refused naming the
//! entry, the value, the provider and a few types it knows, and nothing is
//! stored; a provider that cannot answer lets the write through with a
//! warning; an update asks only about the types it adds.

mod support;

use knit_client::ClientError;
use knit_ecs::fake::{FakeEcs, Fault};
use knit_server::provider::ecs::{EcsProvider, EcsSettings};
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;
use support::TestServer;

fn pool(name: &str, types: &str) -> String {
    format!(
        "apiVersion: knit.dev/v1alpha1\nkind: NodePool\nmetadata:\n  name: {name}\nspec:\n  replicas: 0\n  instanceTypes: [{types}]\n"
    )
}

/// The status, code and the (field, value, rule) of each field error.
fn refused(err: ClientError) -> (u16, String, Vec<(String, String, String)>) {
    match err {
        ClientError::Api {
            status,
            code,
            errors,
            ..
        } => (
            status,
            code,
            errors
                .into_iter()
                .map(|e| (e.field, e.value, e.rule))
                .collect(),
        ),
        other => panic!("expected a refusal, got {other}"),
    }
}

fn warnings(view: &Value) -> Vec<String> {
    view["warnings"]
        .as_array()
        .map(|w| {
            w.iter()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn ecs_refuses_a_type_describe_instance_types_does_not_know() {
    let fake = FakeEcs::start();
    let mut s = EcsSettings::new(&fake.region());
    s.endpoint = Some(fake.url());
    s.v_switch_id = Some("vsw-fake0001".into());
    s.security_group_ids = vec!["sg-fake0001".into()];
    s.default_image = Some(fake.config().images[0].clone());
    s.poll_interval = Duration::from_millis(10);
    s.retry.first_backoff = Duration::from_millis(1);
    s.retry.max_backoff = Duration::from_millis(2);
    let provider = EcsProvider::new(s, fake.credentials()).unwrap();
    let mut srv = TestServer::new();
    srv.start(Some(Arc::new(provider)));
    let c = srv.client();

    // Create: the second entry of the fallback list is unknown.
    let bad = pool("web", "ecs.g7.large, ecs.g7.huge");
    let (status, code, errors) = refused(
        c.call("POST", "/api/v1/pools", Some(&bad))
            .expect_err("refused"),
    );
    assert_eq!((status, code.as_str()), (422, "ConfigInvalid"));
    assert_eq!(errors.len(), 1, "{errors:?}");
    let (field, value, rule) = &errors[0];
    assert_eq!(field, "spec.instanceTypes[1]");
    assert_eq!(value, "\"ecs.g7.huge\"");
    assert!(
        rule.starts_with("not an instance type of provider ecs (it knows ")
            && rule.contains("ecs.g7.large")
            && rule.contains("ecs.g7.xlarge"),
        "{rule}"
    );
    let missing = c.call("GET", "/api/v1/pools/web", None).expect_err("none");
    assert_eq!(refused(missing).0, 404);
    // The dry run and apply (create through PUT) refuse the same way.
    for (method, path) in [
        ("POST", "/api/v1/pools?dryRun=All"),
        ("PUT", "/api/v1/pools/web"),
    ] {
        let e = c.call(method, path, Some(&bad)).expect_err("refused");
        let (status, _, errors) = refused(e);
        assert_eq!(status, 422, "{method} {path}");
        assert_eq!(errors[0].0, "spec.instanceTypes[1]", "{method} {path}");
    }

    // Known types (the attach preflight's and the fallback tests') pass.
    let good = pool("web", "ecs.g7.large, ecs.c7.xlarge, ecs.t1.small");
    let view = c.call("POST", "/api/v1/pools", Some(&good)).unwrap();
    assert!(warnings(&view).is_empty(), "{view}");

    // Update: an added unknown type is refused, the stored spec kept.
    let e = c
        .call(
            "PUT",
            "/api/v1/pools/web",
            Some(&pool("web", "ecs.g7.large, ecs.nope9.large")),
        )
        .expect_err("refused");
    let (status, _, errors) = refused(e);
    assert_eq!(status, 422);
    assert_eq!(errors[0].0, "spec.instanceTypes[1]");
    assert_eq!(errors[0].1, "\"ecs.nope9.large\"");
    // No type of that family: the examples are the catalog's that ECS has.
    assert!(errors[0].2.contains("ecs.g7.large"), "{errors:?}");
    let stored = c.get("/api/v1/pools/web").unwrap();
    assert_eq!(stored["spec"]["instanceTypes"][2], "ecs.t1.small");

    // ECS does not answer: an update that adds a type is let through with
    // a warning naming the types not checked.
    fake.inject("DescribeInstanceTypes", Fault::ServerError, 1000);
    let view = c
        .call(
            "PUT",
            "/api/v1/pools/web",
            Some(&pool("web", "ecs.g7.large, ecs.r7.large")),
        )
        .unwrap();
    let w = warnings(&view);
    assert!(
        w.iter().any(|w| w.contains("ecs.r7.large")
            && w.contains("not checked")
            && w.contains("InternalError")),
        "{view}"
    );
    // Types the stored pool already lists are not asked again: this
    // update (a type removed) makes no call.
    let calls = fake.calls("DescribeInstanceTypes");
    let view = c
        .call(
            "PUT",
            "/api/v1/pools/web",
            Some(&pool("web", "ecs.r7.large")),
        )
        .unwrap();
    assert!(warnings(&view).is_empty(), "{view}");
    assert_eq!(fake.calls("DescribeInstanceTypes"), calls);
}

/// The local cloud's helper binary, next to this test's own directory.
fn local_helper() -> Option<std::path::PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let helper = exe.parent()?.parent()?.join("knit-local");
    helper.exists().then_some(helper)
}

/// Takes the local cloud down (bridge, state) on drop.
struct Down(knit_local::Cloud);

impl Drop for Down {
    fn drop(&mut self) {
        match self.0.down() {
            Ok(r) if r.errors.is_empty() => {}
            Ok(r) => eprintln!("down left errors: {:?}", r.errors),
            Err(e) => eprintln!("down failed: {e}"),
        }
    }
}

#[test]
fn the_local_cloud_refuses_a_type_it_cannot_size() {
    if local_helper().is_none() {
        return knit_test_support::missing(
            "no knit-local binary next to the tests (cargo build -p knit-local)",
        );
    }
    let tmp = tempfile::Builder::new()
        .prefix("knit-itypes-")
        .tempdir()
        .unwrap();
    let pid = std::process::id();
    // No machine is made (replicas 0): the subnet is never brought up, so
    // any private one serves.
    let config = knit_local::Config {
        state_dir: tmp.path().join("local"),
        bridge: format!("kt{pid:x}"),
        subnet: "10.254.77.0/24".into(),
        metadata_port: 80,
        helper: local_helper(),
    };
    let _down = Down(knit_local::Cloud::open(config.clone()).unwrap());
    let provider = knit_server::provider::local::LocalProvider::new(config).unwrap();
    let mut srv = TestServer::new();
    srv.start(Some(Arc::new(provider)));
    let c = srv.client();

    let e = c
        .call(
            "POST",
            "/api/v1/pools",
            Some(&pool("web", "ecs.nope.large, local.small")),
        )
        .expect_err("refused");
    let (status, code, errors) = refused(e);
    assert_eq!((status, code.as_str()), (422, "ConfigInvalid"));
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].0, "spec.instanceTypes[0]");
    assert_eq!(errors[0].1, "\"ecs.nope.large\"");
    assert!(
        errors[0].2.starts_with(
            "not an instance type of provider local (it knows local.small, ecs.g7.large"
        ),
        "{errors:?}"
    );
    // The catalog's types and the local cloud's own are accepted.
    let view = c
        .call(
            "POST",
            "/api/v1/pools",
            Some(&pool("web", "local.small, ecs.g7.large, ecs.t1.small")),
        )
        .unwrap();
    assert!(warnings(&view).is_empty(), "{view}");
}
