//! What one client or node may do to the server: body and connection
//! limits, names in URLs, secrets in answers, credentials bound to one node.
//! A real server on loopback (TLS, SQLite, an ephemeral port).

mod support;

use knit_api::state::EventType;
use knit_api::{NodeConfig, PhaseEvent, PhaseName, PhaseOutcome};
use knit_server::ConnectionLimits;
use std::io::Read;
use std::time::Duration;
use support::TestServer;

const POOL: &str = "apiVersion: knit.dev/v1alpha1\nkind: NodePool\nmetadata:\n  name: workers\nspec:\n  replicas: 2\n";

fn harness() -> TestServer {
    let mut srv = TestServer::new();
    srv.start(None);
    srv
}

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

#[test]
fn a_body_over_the_limit_gets_413_with_the_limit() {
    let h = harness();
    let limit = h.server().control.settings().limits.max_body_bytes;
    // 5 MB, as measured: answered, not a dropped connection.
    let big = "x".repeat(5 * 1024 * 1024);
    let (status, body) = h.client().raw("POST", "/api/v1/pools", Some(&big)).unwrap();
    assert_eq!(status, 413, "{body}");
    let v = json(&body);
    assert_eq!(v["code"], "PayloadTooLarge");
    let message = v["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("limit of {limit} bytes")),
        "{message}"
    );
    // Unauthenticated callers get the same answer (the limit comes first).
    let (status, _) = h
        .client()
        .with_token("")
        .raw("POST", "/report/v1/events", Some(&big))
        .unwrap();
    assert_eq!(status, 413);
    // The server still answers normally afterwards.
    assert_eq!(h.client().raw("GET", "/healthz", None).unwrap().0, 200);
}

#[test]
fn idle_connections_beyond_the_cap_neither_stop_requests_nor_stay_open() {
    let mut h = TestServer::new();
    h.settings.limits = ConnectionLimits {
        max_connections: 4,
        handshake_timeout: Duration::from_secs(1),
        header_timeout: Duration::from_secs(1),
        idle_timeout: Duration::from_secs(1),
        ..ConnectionLimits::default()
    };
    h.start(None);
    let addr = h.server().addr;
    // Three times the cap of sockets that never say a word: the four
    // admitted are closed at the handshake timeout, the rest at once.
    let idle: Vec<std::net::TcpStream> = (0..12)
        .map(|_| std::net::TcpStream::connect(addr).unwrap())
        .collect();
    // A real request is served all the same (once idle ones are closed;
    // a connection refused over the cap is tried again).
    let until = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        match h.client().raw("GET", "/healthz", None) {
            Ok((status, body)) => {
                assert_eq!((status, body.as_str()), (200, "ok\n"));
                break;
            }
            Err(e) => assert!(
                std::time::Instant::now() < until,
                "no answer within 60 s: {e}"
            ),
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // And every idle socket is closed by the server: EOF, not a hang.
    for mut s in idle {
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let mut buf = [0u8; 16];
        match s.read(&mut buf) {
            Ok(0) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            other => panic!("idle connection not closed by the server: {other:?}"),
        }
    }
}

#[test]
fn names_in_urls_are_validated_with_field_value_and_rule() {
    let h = harness();
    for path in [
        "/api/v1/pools/..%2Fevil",
        "/api/v1/pools/..%2Fevil/scale",
        "/api/v1/nodes/x%2F..%2Fvictim",
        "/api/v1/nodes/x%2F..%2Fvictim/logs",
    ] {
        let method = if path.ends_with("/scale") {
            "POST"
        } else {
            "GET"
        };
        let body = (method == "POST").then_some("{\"replicas\": 1}");
        let (status, text) = h.client().raw(method, path, body).unwrap();
        assert_eq!(status, 422, "{path}: {text}");
        let v = json(&text);
        assert_eq!(v["errors"][0]["field"], "metadata.name", "{text}");
        assert!(
            v["errors"][0]["value"].as_str().unwrap().contains(".."),
            "{text}"
        );
        assert!(
            v["errors"][0]["rule"]
                .as_str()
                .unwrap()
                .contains("DNS-1123"),
            "{text}"
        );
    }
    // A path that matches no route: a JSON error with a message, not an
    // empty 404.
    let (status, text) = h.client().raw("GET", "/api/v1/evil", None).unwrap();
    assert_eq!(status, 404);
    let v = json(&text);
    assert_eq!(v["code"], "NotFound");
    assert!(
        v["message"].as_str().unwrap().contains("/api/v1/evil"),
        "{text}"
    );
}

#[test]
fn a_pools_password_is_never_returned() {
    let h = harness();
    let secret = "Zz-very-Secret-9";
    let pool = POOL.replace(
        "replicas: 2\n",
        &format!("replicas: 2\n  login: {{password: {secret}}}\n"),
    );
    let created = h
        .client()
        .call("POST", "/api/v1/pools", Some(&pool))
        .unwrap();
    for (what, body) in [
        ("create", created.to_string()),
        (
            "get",
            h.client()
                .raw("GET", "/api/v1/pools/workers", None)
                .unwrap()
                .1,
        ),
        (
            "list",
            h.client().raw("GET", "/api/v1/pools", None).unwrap().1,
        ),
        (
            "events",
            h.client().raw("GET", "/api/v1/events", None).unwrap().1,
        ),
    ] {
        assert!(!body.contains(secret), "{what} shows the password: {body}");
    }
    let got = h.client().get("/api/v1/pools/workers").unwrap();
    assert_eq!(got["spec"]["login"]["passwordSet"], true);
    assert!(got["spec"]["login"].get("password").is_none());
    h.client()
        .call("PUT", "/api/v1/pools/workers", Some(POOL))
        .unwrap();
    let got = h.client().get("/api/v1/pools/workers").unwrap();
    assert_eq!(got["spec"]["login"]["passwordSet"], false);
}

#[test]
fn quota_exceeded_says_how_to_raise_the_quota() {
    let h = harness();
    let (status, text) = h
        .client()
        .raw(
            "POST",
            "/api/v1/pools",
            Some(&POOL.replace("replicas: 2", "replicas: 11")),
        )
        .unwrap();
    assert_eq!(status, 422, "{text}");
    let message = json(&text)["message"].as_str().unwrap().to_string();
    for needle in ["quota is 10", "edition basic", "nodeQuota", "edition: pro"] {
        assert!(message.contains(needle), "{needle}: {message}");
    }
}

/// A pool, one created instance and its join token.
fn instance_with_token(h: &TestServer, name: &str, id: &str, ip: &str) -> String {
    let cp = &h.server().control;
    cp.store()
        .add_create_intents("workers", &[(name.into(), "ecs.g7.large".into())])
        .unwrap();
    cp.store().set_instance_created(name, id, Some(ip)).unwrap();
    cp.issue_join_token(name, "workers").unwrap()
}

fn event(node: &str, id: &str, outcome: PhaseOutcome) -> String {
    serde_json::to_string(&PhaseEvent {
        node: node.into(),
        instance_id: id.into(),
        phase: PhaseName::TimeSync,
        outcome,
        reason: None,
        error_code: None,
        at_ms: 1,
        duration_ms: None,
    })
    .unwrap()
}

#[test]
fn a_report_token_speaks_only_for_its_own_node() {
    let h = harness();
    h.client()
        .call("POST", "/api/v1/pools", Some(POOL))
        .unwrap();
    let a = instance_with_token(&h, "workers-aaaaa", "i-000a", "10.213.0.10");
    let _b = instance_with_token(&h, "workers-bbbbb", "i-000b", "10.213.0.11");
    let (status, yaml) = h
        .client()
        .with_token(&a)
        .raw("POST", "/bootstrap/v1/config", None)
        .unwrap();
    assert_eq!(status, 200, "{yaml}");
    let config = NodeConfig::from_yaml(&yaml).unwrap();
    let node_a = h.client().with_token(&config.cluster.report_token.unwrap());
    // Its own node: accepted.
    let (status, text) = node_a
        .raw(
            "POST",
            "/report/v1/events",
            Some(&event("local.i-000a", "i-000a", PhaseOutcome::Started)),
        )
        .unwrap();
    assert_eq!(status, 204, "{text}");
    // Node B by name (with A's instance id, or B's): refused, B untouched.
    for id in ["i-000a", "i-000b"] {
        let (status, text) = node_a
            .raw(
                "POST",
                "/report/v1/events",
                Some(&event("local.i-000b", id, PhaseOutcome::Failed)),
            )
            .unwrap();
        assert_eq!(status, 403, "{text}");
        let v = json(&text);
        assert_eq!(v["code"], "Forbidden");
        assert!(
            v["message"].as_str().unwrap().contains("local.i-000a"),
            "{text}"
        );
    }
    let (status, _) = h
        .client()
        .raw("GET", "/api/v1/nodes/local.i-000b", None)
        .unwrap();
    assert_eq!(status, 404, "no node B was made by A's reports");
}

#[test]
fn an_attach_token_at_the_bootstrap_endpoint_is_refused_and_not_spent() {
    let h = harness();
    h.write_agent_checksum();
    h.client()
        .call("POST", "/api/v1/pools", Some(POOL))
        .unwrap();
    let answer = h
        .client()
        .call("POST", "/api/v1/pools/workers/attach-script", Some("{}"))
        .unwrap();
    let script = answer["script"].as_str().unwrap();
    let token = script
        .split("knitattach.")
        .nth(1)
        .map(|rest| {
            let t: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric())
                .collect();
            format!("knitattach.{t}")
        })
        .expect("the script carries its attach token");
    let (status, text) = h
        .client()
        .with_token(&token)
        .raw("POST", "/bootstrap/v1/config", None)
        .unwrap();
    assert_eq!(status, 401, "{text}");
    assert!(text.contains("attach token"), "{text}");
    let tokens = h.client().get("/api/v1/jointokens").unwrap();
    let items = tokens["items"].as_array().unwrap();
    assert_eq!(items.len(), 1);
    assert!(
        items[0]["usedMs"].is_null(),
        "the attach token was spent: {tokens}"
    );
}

#[test]
fn a_bootstrap_token_is_never_bound_to_no_node() {
    let h = harness();
    h.client()
        .call("POST", "/api/v1/pools", Some(POOL))
        .unwrap();
    let cp = &h.server().control;
    // Not created yet at the provider: no instance id, so no node name.
    cp.store()
        .add_create_intents(
            "workers",
            &[("workers-ccccc".into(), "ecs.g7.large".into())],
        )
        .unwrap();
    let token = cp.issue_join_token("workers-ccccc", "workers").unwrap();
    let (status, text) = h
        .client()
        .with_token(&token)
        .raw("POST", "/bootstrap/v1/config", None)
        .unwrap();
    assert_eq!(status, 409, "{text}");
    assert!(text.contains("node name cannot be computed"), "{text}");
    // Not spent: once the instance is known, the same token works.
    cp.store()
        .set_instance_created("workers-ccccc", "i-000c", Some("10.213.0.12"))
        .unwrap();
    let (status, text) = h
        .client()
        .with_token(&token)
        .raw("POST", "/bootstrap/v1/config", None)
        .unwrap();
    assert_eq!(status, 200, "{text}");
}

#[test]
fn a_thousand_refused_bootstraps_are_one_event_with_a_count() {
    let h = harness();
    let stranger = h.client().with_token("made-up-token");
    for _ in 0..1000 {
        let (status, _) = stranger.raw("POST", "/bootstrap/v1/config", None).unwrap();
        assert_eq!(status, 401);
    }
    let events = h.client().get("/api/v1/events?limit=10000").unwrap();
    let refused: Vec<&serde_json::Value> = events["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["reason"] == "BootstrapRefused")
        .collect();
    assert_eq!(refused.len(), 1, "{refused:#?}");
    assert_eq!(refused[0]["count"], 1000);
    assert!(refused[0]["lastMs"].as_i64().unwrap() >= refused[0]["atMs"].as_i64().unwrap());
    let metrics = h.client().get("/metrics").unwrap();
    assert!(
        metrics
            .as_str()
            .unwrap()
            .contains("knit_bootstrap_refused_total 1000"),
        "every refusal is still counted"
    );
}

/// On both datastores: SQLite, and a real PostgreSQL of the test's own.
#[test]
fn events_are_kept_by_count_and_by_age() {
    use knit_db::{testing::TestPostgres, Datastore, Limits};
    let pg = TestPostgres::start().unwrap_or_else(|e| panic!("PostgreSQL for the test: {e}"));
    let url = pg.create_database("events").unwrap();
    for datastore in [Datastore::SqliteMemory, Datastore::Postgres(url)] {
        let store = knit_server::store::Store::open_datastore(&datastore, Limits::default())
            .unwrap_or_else(|e| panic!("{datastore:?}: {e}"));
        events_are_kept_on(&store);
    }
}

fn events_are_kept_on(store: &knit_server::store::Store) {
    use knit_server::store::{now_ms, EventRetention};
    store.set_event_retention(EventRetention {
        max_count: 5,
        max_age_ms: 3_600_000,
        ..EventRetention::default()
    });
    for i in 0..12 {
        store
            .add_event(
                EventType::Normal,
                "Node",
                &format!("n{i}"),
                "Ready",
                "ready",
            )
            .unwrap();
    }
    // Beyond the count: the oldest go, the newest stay.
    store.prune_events(now_ms()).unwrap();
    let kept: Vec<String> = store
        .events(100)
        .unwrap()
        .into_iter()
        .map(|e| e.object_name)
        .collect();
    assert_eq!(kept, vec!["n7", "n8", "n9", "n10", "n11"]);
    // Older than the age: gone.
    assert_eq!(store.prune_events(now_ms() + 2 * 3_600_000).unwrap(), 5);
    assert!(store.events(100).unwrap().is_empty());
}

#[test]
fn a_server_whose_ca_is_gone_refuses_to_start_and_says_how_to_recover() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let mut settings = knit_server::Settings::new(state.clone());
    settings.listen = "127.0.0.1:0".parse().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let start = |s: knit_server::Settings| {
        rt.block_on(knit_server::start(
            s,
            None,
            std::sync::Arc::new(knit_server::NoCluster),
        ))
    };
    let first = start(settings.clone()).unwrap();
    rt.block_on(first.shutdown());
    std::fs::remove_file(state.join("pki/ca.pem")).unwrap();
    std::fs::remove_file(state.join("pki/ca.key")).unwrap();
    let err = start(settings)
        .err()
        .expect("a start without the CA is refused");
    let text = err.to_string();
    assert_eq!(err.code(), "PkiError");
    assert!(
        text.contains("ca.pem") && text.contains("admin-token"),
        "{text}"
    );
    assert!(text.contains("Restore"), "{text}");
    assert!(!state.join("pki/ca.pem").exists(), "no new CA was made");
}
