//! The API against a real server on loopback (TLS, SQLite, an ephemeral
//! port, a temporary state directory). No provider: these tests cover what
//! the API itself decides.

mod support;

use knit_api::views::Items;
use knit_api::{NodeConfig, PhaseEvent, PhaseName, PhaseOutcome};
use knit_client::ClientError;
use serde_json::Value;
use support::TestServer;

/// A server with no provider: these tests cover what the API decides.
fn harness() -> TestServer {
    harness_with_token_ttl(std::time::Duration::from_secs(1800))
}

fn harness_with_token_ttl(ttl: std::time::Duration) -> TestServer {
    let mut srv = TestServer::new();
    srv.settings.join_token_ttl = ttl;
    srv.start(None);
    srv
}

const POOL: &str = "apiVersion: knit.dev/v1alpha1\nkind: NodePool\nmetadata:\n  name: workers\nspec:\n  replicas: 2\n";

/// `raw` (an answer of the server) read as `T` and written back is `raw`:
/// the typed view and the wire agree on every field, null and absence.
fn typed_as_sent<T: serde::de::DeserializeOwned + serde::Serialize>(raw: &Value) {
    let typed: T = serde_json::from_value(raw.clone()).unwrap_or_else(|e| panic!("{e}: {raw}"));
    assert_eq!(&serde_json::to_value(&typed).unwrap(), raw);
}

fn remote(err: ClientError) -> (u16, String, Vec<String>) {
    match err {
        ClientError::Api {
            status,
            code,
            errors,
            ..
        } => (status, code, errors.into_iter().map(|e| e.field).collect()),
        other => panic!("expected a remote error, got {other}"),
    }
}

#[test]
fn every_admin_route_refuses_without_the_token() {
    let h = harness();
    let anonymous = h.client().with_token("");
    let wrong = h.client().with_token("not-the-token");
    for &route in knit_api::routes::Route::ALL {
        let path = route.path();
        let concrete = path
            .replace(":name", "x")
            .replace("*path", "x")
            .replace(":id", "x")
            .replace(":verb", "pause");
        let method = route.method().as_str();
        // Bodies only where the method takes one.
        let body = matches!(method, "POST" | "PUT").then_some("{}");
        let (status, _) = anonymous.raw(method, &concrete, body).unwrap();
        if matches!(
            route.access(),
            knit_api::routes::Access::Role(_) | knit_api::routes::Access::Metrics
        ) {
            assert_eq!(status, 401, "{method} {path} without token");
            let (status, _) = wrong.raw(method, &concrete, body).unwrap();
            assert_eq!(status, 401, "{method} {path} with a wrong token");
        } else {
            // Public or token-bound routes exist (not 404 for lack of a route,
            // except the mirror file that does not exist).
            assert_ne!(status, 405, "{method} {path}");
        }
    }
    // A method a known path does not take is 405 (the router's answer),
    // never the gate's 403 for a route without a declared role.
    for (method, path) in [("PUT", "/healthz"), ("DELETE", "/api/v1/pools")] {
        let (status, body) = anonymous.raw(method, path, None).unwrap();
        assert_eq!(status, 405, "{method} {path}: {body}");
    }
    // The document served lists every route.
    let doc = anonymous.get("/openapi.json").unwrap();
    assert_eq!(doc["openapi"], "3.0.3");
    assert!(doc["paths"]["/api/v1/pools/{name}/scale"]["post"].is_object());
    for &route in knit_api::routes::Route::ALL {
        let method = route.method().as_str().to_lowercase();
        assert!(
            doc["paths"][route.openapi_path()][&method].is_object(),
            "{method} {} is not in /openapi.json",
            route.path()
        );
    }
    assert_eq!(
        anonymous.raw("GET", "/healthz", None).unwrap(),
        (200, "ok\n".to_string())
    );
}

#[test]
fn pool_validation_lists_every_invalid_field() {
    let h = harness();
    let bad = r#"
apiVersion: knit.dev/v1alpha1
kind: NodePool
metadata: {name: Workers}
spec:
  replicas: -3
  type: spot
  dataDisks: [{sizeGiB: 10, fsType: btrfs}]
  kubelet: {eventRecordQPS: 60, eventBurst: 5}
  customNodeName: {prefix: "1abc"}
  login: {password: "weak"}
"#;
    let (status, code, fields) = remote(
        h.client()
            .call("POST", "/api/v1/pools", Some(bad))
            .unwrap_err(),
    );
    assert_eq!((status, code.as_str()), (422, "ConfigInvalid"));
    for want in [
        "metadata.name",
        "spec.type",
        "spec.replicas",
        "spec.dataDisks[0].sizeGiB",
        "spec.dataDisks[0].fsType",
        "spec.kubelet.eventRecordQPS",
        "spec.kubelet.eventBurst",
        "spec.customNodeName.prefix",
        "spec.login.password",
    ] {
        assert!(fields.iter().any(|f| f == want), "{want} not in {fields:?}");
    }
    // Unknown field and bad syntax: 400 with the parser's message.
    let (status, code, _) = remote(
        h.client()
            .call(
                "POST",
                "/api/v1/pools",
                Some("apiVersion: knit.dev/v1alpha1\nkind: NodePool\nspec: {replicaz: 1}\n"),
            )
            .unwrap_err(),
    );
    assert_eq!((status, code.as_str()), (400, "ConfigParse"));
    // Nothing half-created.
    assert_eq!(
        h.client().get("/api/v1/pools").unwrap()["items"]
            .as_array()
            .unwrap()
            .len(),
        0
    );
    assert_eq!(
        h.client().get("/api/v1/instances").unwrap()["items"]
            .as_array()
            .unwrap()
            .len(),
        0
    );
}

#[test]
fn pool_lifecycle_quota_and_immutability() {
    let h = harness();
    let created = h
        .client()
        .call("POST", "/api/v1/pools", Some(POOL))
        .unwrap();
    assert_eq!(created["status"]["desired"], 2);
    let (status, code, _) = remote(
        h.client()
            .call("POST", "/api/v1/pools", Some(POOL))
            .unwrap_err(),
    );
    assert_eq!((status, code.as_str()), (409, "AlreadyExists"));

    // Without a provider the intents are written and wait.
    let instances = h.client().get("/api/v1/instances").unwrap();
    assert_eq!(
        instances["items"].as_array().unwrap().len(),
        0,
        "planning runs only with a provider"
    );
    let scaled = h
        .client()
        .call(
            "POST",
            "/api/v1/pools/workers/scale",
            Some(r#"{"replicas": 4}"#),
        )
        .unwrap();
    assert_eq!(scaled["spec"]["replicas"], 4);
    assert_eq!(scaled["status"]["pending"], 4);

    // Basic edition: 10 nodes.
    let (status, code, _) = remote(
        h.client()
            .call(
                "POST",
                "/api/v1/pools/workers/scale",
                Some(r#"{"replicas": 11}"#),
            )
            .unwrap_err(),
    );
    assert_eq!((status, code.as_str()), (422, "QuotaExceeded"));
    let (status, code, _) = remote(
        h.client()
            .call(
                "POST",
                "/api/v1/pools/nope/scale",
                Some(r#"{"replicas": 1}"#),
            )
            .unwrap_err(),
    );
    assert_eq!((status, code.as_str()), (404, "NotFound"));

    // Hardening cannot change after creation.
    let hardened = POOL.replace(
        "replicas: 2\n",
        "replicas: 4\n  hardening: {profile: mlps-l3}\n",
    );
    let (status, _, fields) = remote(
        h.client()
            .call("PUT", "/api/v1/pools/workers", Some(&hardened))
            .unwrap_err(),
    );
    assert_eq!(status, 422);
    assert_eq!(fields, vec!["spec.hardening.profile"]);
    // Apply under another name than the URL's.
    let (status, _, fields) = remote(
        h.client()
            .call("PUT", "/api/v1/pools/other", Some(POOL))
            .unwrap_err(),
    );
    assert_eq!((status, fields), (422, vec!["metadata.name".to_string()]));

    let metrics = h.client().get("/metrics").unwrap();
    let text = metrics.as_str().unwrap();
    assert!(
        text.contains("knit_pool_desired_nodes{pool=\"workers\"} 4"),
        "{text}"
    );
    assert!(
        text.contains("knit_pool_instances{pool=\"workers\"} 4"),
        "{text}"
    );

    let events = h.client().get("/api/v1/events").unwrap();
    let reasons: Vec<&str> = events["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["reason"].as_str().unwrap())
        .collect();
    assert!(
        reasons.contains(&"Created")
            && reasons.contains(&"Scaled")
            && reasons.contains(&"ScaleOut"),
        "{reasons:?}"
    );
}

#[test]
fn bootstrap_token_is_single_use_and_reports_build_the_timeline() {
    let h = harness();
    h.client()
        .call("POST", "/api/v1/pools", Some(POOL))
        .unwrap();
    let cp = &h.server().control;
    cp.store()
        .add_create_intents(
            "workers",
            &[("workers-abcde".into(), "ecs.g7.large".into())],
        )
        .unwrap();
    cp.store()
        .set_instance_created("workers-abcde", "i-0001", Some("10.213.0.9"))
        .unwrap();
    let token = cp.issue_join_token("workers-abcde", "workers").unwrap();

    let node_client = h.client().with_token(&token);
    let (status, yaml) = node_client
        .raw("POST", "/bootstrap/v1/config", None)
        .unwrap();
    assert_eq!(status, 200, "{yaml}");
    let config = NodeConfig::from_yaml(&yaml).unwrap();
    assert_eq!(config.node.instance_id.as_deref(), Some("i-0001"));
    assert_eq!(config.node.ip.as_deref(), Some("10.213.0.9"));
    assert_eq!(config.node.labels["knit.dev/pool"], "workers");
    assert_eq!(
        config.cluster.control_plane_ca_cert.as_deref(),
        Some(h.server().ca_pem())
    );
    let report_url = config.cluster.report_url.clone().unwrap();
    assert!(report_url.ends_with("/report/v1/events"), "{report_url}");
    assert!(config
        .kubernetes
        .url
        .unwrap()
        .ends_with("/mirror/pkg/kubernetes/kubernetes-1.31.4-linux-amd64.tar.gz"));

    // Second use, and an unknown token: refused, and recorded.
    let (status, body) = node_client
        .raw("POST", "/bootstrap/v1/config", None)
        .unwrap();
    assert_eq!(status, 401);
    assert!(
        body.contains("TokenRefused") && body.contains("already used"),
        "{body}"
    );
    let (status, _) = h
        .client()
        .with_token("made-up")
        .raw("POST", "/bootstrap/v1/config", None)
        .unwrap();
    assert_eq!(status, 401);
    let events = h.client().get("/api/v1/events").unwrap();
    let refused = events["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["reason"] == "BootstrapRefused")
        .count();
    assert_eq!(refused, 2);
    let tokens = h.client().get("/api/v1/jointokens").unwrap();
    assert!(
        !tokens.to_string().contains(&token),
        "the secret must never be listed"
    );

    // Reports: with the instance's report token only.
    let report_token = config.cluster.report_token.unwrap();
    let reporter = h.client().with_token(&report_token);
    let mut at = 1_000;
    for (phase, outcome, duration) in [
        (PhaseName::TimeSync, PhaseOutcome::Started, None),
        (PhaseName::TimeSync, PhaseOutcome::Done, Some(12)),
        (PhaseName::DataDisk, PhaseOutcome::Skipped, Some(1)),
        (
            PhaseName::KubernetesComponents,
            PhaseOutcome::Failed,
            Some(40),
        ),
    ] {
        at += 50;
        let event = PhaseEvent {
            node: "local.i-0001".into(),
            instance_id: "i-0001".into(),
            phase,
            outcome,
            reason: (outcome == PhaseOutcome::Failed).then(|| "download failed".to_string()),
            error_code: (outcome == PhaseOutcome::Failed)
                .then_some(knit_api::ErrorCode::FailDownloadKubernetes),
            at_ms: at,
            duration_ms: duration,
        };
        let (status, body) = reporter
            .raw(
                "POST",
                "/report/v1/events",
                Some(&serde_json::to_string(&event).unwrap()),
            )
            .unwrap();
        assert_eq!(status, 204, "{body}");
    }
    let (status, _) = h
        .client()
        .with_token("wrong")
        .raw("POST", "/report/v1/events", Some("{}"))
        .unwrap();
    assert_eq!(status, 401);

    let node = h.client().get("/api/v1/nodes/local.i-0001").unwrap();
    assert_eq!(node["timeline"].as_array().unwrap().len(), 4);
    assert_eq!(node["errorCode"], "FailDownloadKubernetes");
    assert_eq!(node["phase"], "kubernetes-components");
    assert_eq!(node["providerId"], "i-0001");
    // The typed views read every answer and write it back unchanged.
    typed_as_sent::<knit_api::views::NodeView>(&node);
    for (path, check) in [
        (
            "/api/v1/nodes",
            typed_as_sent::<Items<knit_api::views::NodeView>> as fn(&Value),
        ),
        (
            "/api/v1/instances",
            typed_as_sent::<Items<knit_api::views::InstanceView>>,
        ),
        (
            "/api/v1/pools",
            typed_as_sent::<Items<knit_api::views::PoolView>>,
        ),
        (
            "/api/v1/events",
            typed_as_sent::<Items<knit_api::views::EventView>>,
        ),
        (
            "/api/v1/jointokens",
            typed_as_sent::<Items<knit_api::views::JoinTokenView>>,
        ),
    ] {
        check(&h.client().get(path).unwrap());
    }
    let metrics = h.client().get("/metrics").unwrap();
    assert!(metrics
        .as_str()
        .unwrap()
        .contains("knit_phase_duration_seconds_count{phase=\"time-sync\"} 1"));
}

#[test]
fn mirror_serves_files_and_nothing_outside() {
    let h = harness();
    let mirror = &h.server().control.mirror_dir();
    std::fs::create_dir_all(mirror.join("bin")).unwrap();
    std::fs::write(mirror.join("bin/knit-agent"), b"agent-bytes").unwrap();
    let public = h.client().with_token("");
    assert_eq!(
        public.raw("GET", "/mirror/bin/knit-agent", None).unwrap(),
        (200, "agent-bytes".to_string())
    );
    assert_eq!(
        public.raw("GET", "/mirror/bin/missing", None).unwrap().0,
        404
    );
    assert_eq!(
        public.raw("GET", "/mirror/../knit.db", None).unwrap().0,
        404
    );
    assert_eq!(
        public
            .raw("GET", "/mirror/bin/%2e%2e/%2e%2e/admin-token", None)
            .unwrap()
            .0,
        404
    );
    // The Debian repository: apt asks a flat repository for `./Release`.
    std::fs::create_dir_all(mirror.join("debian/pool")).unwrap();
    std::fs::write(mirror.join("debian/Release"), b"Origin: knit\n").unwrap();
    assert_eq!(
        public.raw("GET", "/mirror/debian/./Release", None).unwrap(),
        (200, "Origin: knit\n".to_string())
    );
    assert_eq!(
        public
            .raw("GET", "/mirror/debian/./%2e%2e/%2e%2e/knit.db", None)
            .unwrap()
            .0,
        404
    );
    assert_eq!(public.raw("GET", "/mirror/./", None).unwrap().0, 404);
}

#[test]
fn cluster_spec_is_validated_and_quota_checked() {
    let h = harness();
    let cluster = h.client().get("/api/v1/cluster").unwrap();
    assert_eq!(cluster["spec"]["edition"], "basic");
    let (status, _, fields) = remote(
        h.client()
            .call("PUT", "/api/v1/cluster", Some("apiVersion: knit.dev/v1alpha1\nkind: Cluster\nmetadata: {name: c}\nspec: {edition: gold, network: {plugin: calico}}\n"))
            .unwrap_err(),
    );
    assert_eq!(status, 422);
    assert_eq!(fields, vec!["spec.edition", "spec.network.plugin"]);
    h.client()
        .call(
            "POST",
            "/api/v1/pools",
            Some(&POOL.replace("replicas: 2", "replicas: 8")),
        )
        .unwrap();
    let (status, code, _) = remote(
        h.client()
            .call("PUT", "/api/v1/cluster", Some("apiVersion: knit.dev/v1alpha1\nkind: Cluster\nmetadata: {name: c}\nspec: {nodeQuota: 5}\n"))
            .unwrap_err(),
    );
    assert_eq!((status, code.as_str()), (422, "QuotaExceeded"));
}

#[test]
fn expired_bootstrap_token_is_refused() {
    // A zero lifetime: the token is expired the moment it is made.
    let h = harness_with_token_ttl(std::time::Duration::ZERO);
    h.client()
        .call("POST", "/api/v1/pools", Some(POOL))
        .unwrap();
    let cp = &h.server().control;
    cp.store()
        .add_create_intents(
            "workers",
            &[("workers-zzzzz".into(), "ecs.g7.large".into())],
        )
        .unwrap();
    let token = cp.issue_join_token("workers-zzzzz", "workers").unwrap();
    let (status, body) = h
        .client()
        .with_token(&token)
        .raw("POST", "/bootstrap/v1/config", None)
        .unwrap();
    assert_eq!(status, 401);
    assert!(body.contains("expired"), "{body}");
    let tokens = h.client().get("/api/v1/jointokens").unwrap();
    assert!(
        tokens["items"][0]["usedMs"].is_null(),
        "an expired token is not consumed"
    );
}

/// A server whose datastore makes every write wait (another process holds
/// SQLite's write lock) still answers `/healthz` and reads that need no
/// write: a request waiting on the database must not hold up the async
/// workers that accept connections and answer the rest. Under `knit up
/// --ha` HAProxy's health checks go through those workers; starved, they
/// failed, HAProxy marked the only server left down and every client's
/// connection was closed during the TLS handshake.
#[test]
fn health_answers_while_writes_wait_for_the_database() {
    use std::sync::mpsc;
    use std::time::Duration;
    let h = harness();
    let token = h.server().admin_token().to_string();
    let holder = rusqlite::Connection::open(h.settings.db_path()).unwrap();
    holder.execute_batch("BEGIN EXCLUSIVE").unwrap();
    // More waiting writes than the runtime has workers (two).
    let writers: Vec<_> = (0..4)
        .map(|i| {
            let client = h.client().with_token(&token);
            std::thread::spawn(move || {
                let pool = POOL.replace("name: workers", &format!("name: waiting-{i}"));
                client.call("POST", "/api/v1/pools", Some(&pool))
            })
        })
        .collect();
    // Every writer has reached the database (or is queued behind it).
    std::thread::sleep(Duration::from_secs(1));
    let (tx, rx) = mpsc::channel();
    let probe = h.client().with_token("");
    std::thread::spawn(move || {
        let _ = tx.send(probe.raw("GET", "/healthz", None));
    });
    // Far below the database's 15 s lock wait: an answer only then would
    // mean the health check waited for the database.
    let answer = rx.recv_timeout(Duration::from_secs(5));
    holder.execute_batch("COMMIT").unwrap();
    for w in writers {
        w.join().unwrap().unwrap();
    }
    match answer {
        Ok(Ok((200, body))) => assert_eq!(body, "ok\n"),
        Ok(other) => panic!("/healthz while writes waited: {other:?}"),
        Err(_) => panic!("/healthz did not answer within 5 s while writes waited for the database"),
    }
}
