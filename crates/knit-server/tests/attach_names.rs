//! Issue 27 (2): an instance added with `keepInstanceName` whose name is no
//! node name ('_', a space, non-ASCII) is refused by the preflight — by
//! the dry run and by the attach itself — before anything is changed: no
//! re-image, no stop, the pool's count as it was. Through a real server on
//! loopback over the fake provider.

mod support;

use knit_server::preflight::InstanceFacts;
use serde_json::Value;
use std::sync::Arc;
use support::{instance, FakeCloud, TestServer};

fn attach(srv: &TestServer, body: &Value) -> (u16, Value) {
    let (status, text) = srv
        .client()
        .raw(
            "POST",
            "/api/v1/pools/workers/attach",
            Some(&body.to_string()),
        )
        .unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// The node-name result of the first report of an answer.
fn node_name_result(answer: &Value) -> Value {
    answer["preflight"][0]["results"]
        .as_array()
        .unwrap_or_else(|| panic!("no preflight in {answer}"))
        .iter()
        .find(|r| r["check"] == "node-name")
        .cloned()
        .unwrap_or_else(|| panic!("no node-name check in {answer}"))
}

#[test]
fn a_kept_instance_name_that_is_no_node_name_is_refused_before_any_change() {
    let mut srv = TestServer::new();
    srv.write_agent_checksum();
    let cloud = Arc::new(FakeCloud::default());
    cloud.add(InstanceFacts {
        state: "running".into(),
        ..instance("i-000000000003", "web_01 prod", "10.213.0.9")
    });
    srv.start(Some(cloud.clone()));
    srv.client()
        .call(
            "POST",
            "/api/v1/pools",
            Some("apiVersion: knit.dev/v1alpha1\nkind: NodePool\nmetadata: {name: workers}\nspec: {replicas: 0}\n"),
        )
        .unwrap();
    let body = |dry_run: bool| serde_json::json!({"instances": ["i-000000000003"], "keepInstanceName": true, "dryRun": dry_run});

    let (status, dry) = attach(&srv, &body(true));
    assert_eq!(status, 200, "{dry}");
    assert_eq!(dry["passed"], false, "{dry}");
    let r = node_name_result(&dry);
    assert_eq!(r["status"], "error", "{r}");
    assert_eq!(r["code"], "PreflightNodeNameInvalid", "{r}");
    let message = r["message"].as_str().unwrap_or_default();
    assert!(message.contains("DNS-1123"), "the rule: {r}");
    assert!(message.contains("'_'") && message.contains("spaces"), "{r}");
    let fix = r["fix"].as_str().unwrap_or_default();
    assert!(fix.contains("\"web-01-prod\""), "a name to use: {r}");

    // The attach itself is refused the same way, and nothing was changed.
    let (status, refused) = attach(&srv, &body(false));
    // Answered with every report, as a refused preflight is: nothing added.
    assert_eq!(status, 200, "{refused}");
    assert_eq!(refused["passed"], false, "{refused}");
    assert_eq!(refused["attached"], serde_json::json!([]), "{refused}");
    assert_eq!(
        node_name_result(&refused)["code"],
        "PreflightNodeNameInvalid"
    );
    assert_eq!(
        cloud.changes(),
        Vec::<String>::new(),
        "no re-image, no stop"
    );
    assert_eq!(srv.replicas("workers"), 0, "the pool's count as it was");

    // Without keepInstanceName the pool's rule names the node: it passes.
    let (_, dry) = attach(
        &srv,
        &serde_json::json!({"instances": ["i-000000000003"], "dryRun": true}),
    );
    assert_eq!(node_name_result(&dry)["status"], "pass", "{dry}");
}
