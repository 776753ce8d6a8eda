//! API tokens with roles against a real server on loopback (TLS, SQLite,
//! an ephemeral port, a temporary state directory): every route of the
//! router against every role, revocation, expiry, the first admin token.

mod support;

use knit_api::routes::Access;
use knit_api::state::TokenRole;
use knit_api::views::{TokenCreateRequest, TokenCreated};
use knit_client::{Client, ClientError};
use knit_server::route_table;
use serde_json::Value;
use support::TestServer;

fn harness() -> TestServer {
    let mut srv = TestServer::new();
    srv.start(None);
    srv
}

fn create(client: &Client, role: TokenRole, description: &str) -> TokenCreated {
    client
        .create_token(&TokenCreateRequest {
            role,
            ttl_seconds: None,
            description: description.into(),
        })
        .unwrap()
}

/// (status, code, message) of a refused call.
fn refused(err: ClientError) -> (u16, String, String) {
    match err {
        ClientError::Api {
            status,
            code,
            message,
            ..
        } => (status, code, message),
        other => panic!("expected a remote error, got {other}"),
    }
}

/// The code of an answer's JSON error body.
fn code_of(body: &str) -> String {
    serde_json::from_str::<Value>(body)
        .ok()
        .and_then(|v| v["code"].as_str().map(str::to_string))
        .unwrap_or_default()
}

/// Walks every route the router serves with a token of each role: a role
/// below the route's is refused with 403 `InsufficientRole` before the
/// handler runs, a role at or above it passes the gate (whatever the
/// handler then answers to a placeholder request), and no token is 401.
#[test]
fn each_role_against_every_route() {
    let h = harness();
    let tokens: Vec<(TokenRole, Client)> = TokenRole::ALL
        .iter()
        .map(|role| {
            let made = create(h.client(), *role, &format!("{role} walker"));
            (*role, h.client().with_token(&made.secret))
        })
        .collect();
    let anonymous = h.client().with_token("");
    let mut walked = 0;
    for route in route_table() {
        let Access::Role(needs) = route.access else {
            continue;
        };
        walked += 1;
        let concrete = route
            .path
            .replace(":name", "x")
            .replace(":id", "x")
            .replace(":verb", "pause");
        let method = route.method.as_str();
        let body = matches!(method, "POST" | "PUT").then_some("{}");
        let (status, _) = anonymous.raw(method, &concrete, body).unwrap();
        assert_eq!(status, 401, "{method} {concrete} without a token");
        for (role, client) in &tokens {
            let (status, text) = client.raw(method, &concrete, body).unwrap();
            if *role < needs {
                assert_eq!(
                    (status, code_of(&text).as_str()),
                    (403, "InsufficientRole"),
                    "{method} {concrete} with a {role} token: {text}"
                );
                assert!(
                    text.contains(needs.as_str()) && text.contains(role.as_str()),
                    "the refusal names both roles: {text}"
                );
            } else {
                assert!(
                    status != 401 && status != 403,
                    "{method} {concrete} with a {role} token: {status} {text}"
                );
            }
        }
    }
    assert!(walked > 30, "only {walked} routes need a role");
}

/// What each role is for, on real requests: a viewer reads (and
/// `/metrics`) but changes nothing; an operator changes pools but neither
/// runs commands on machines, reads node logs nor manages tokens.
#[test]
fn viewer_reads_operator_changes_admin_manages() {
    let h = harness();
    let viewer = h
        .client()
        .with_token(&create(h.client(), TokenRole::Viewer, "dashboards").secret);
    let operator = h
        .client()
        .with_token(&create(h.client(), TokenRole::Operator, "ci").secret);
    let pool = "apiVersion: knit.dev/v1alpha1\nkind: NodePool\nmetadata:\n  name: tokens-pool\nspec:\n  replicas: 0\n";

    let (status, code, message) = refused(
        viewer
            .call("POST", "/api/v1/pools", Some(pool))
            .unwrap_err(),
    );
    assert_eq!(
        (status, code.as_str()),
        (403, "InsufficientRole"),
        "{message}"
    );
    assert!(message.contains("POST /api/v1/pools"), "{message}");
    assert!(viewer.list_pools().unwrap().is_empty(), "nothing was made");
    assert_eq!(viewer.raw("GET", "/metrics", None).unwrap().0, 200);

    operator.call("POST", "/api/v1/pools", Some(pool)).unwrap();
    assert_eq!(viewer.list_pools().unwrap().len(), 1);
    let exec = r#"{"kind": "node", "name": "x", "argv": ["true"]}"#;
    for (method, path, body) in [
        ("POST", "/api/v1/exec", Some(exec)),
        ("GET", "/api/v1/nodes/x/logs", None),
        ("GET", "/api/v1/tokens", None),
        ("POST", "/api/v1/tokens", Some(r#"{"role": "admin"}"#)),
    ] {
        let (status, code, _) = refused(operator.call(method, path, body).unwrap_err());
        assert_eq!(
            (status, code.as_str()),
            (403, "InsufficientRole"),
            "{method} {path}"
        );
    }
    // An operator cannot make itself an admin.
    assert_eq!(h.client().list_tokens().unwrap().len(), 3);
    h.client().delete_pool("tokens-pool").unwrap();
}

/// The metrics reader token reads `/metrics` and nothing else.
#[test]
fn the_metrics_reader_token_reads_metrics_only() {
    let h = harness();
    let secret = std::fs::read_to_string(h.settings.state_dir.join("metrics-token")).unwrap();
    let reader = h.client().with_token(secret.trim());
    assert_eq!(reader.raw("GET", "/metrics", None).unwrap().0, 200);
    let (status, text) = reader.raw("GET", "/api/v1/pools", None).unwrap();
    assert_eq!((status, code_of(&text).as_str()), (401, "Unauthorized"));
    let (status, _) = h
        .client()
        .with_token("nope")
        .raw("GET", "/metrics", None)
        .unwrap();
    assert_eq!(status, 401);
}

/// A revoked token is refused at once, an expired one too (401 each,
/// saying which); list shows neither secret nor hash, and when a token was
/// last used.
#[test]
fn revoked_and_expired_tokens_are_refused() {
    let h = harness();
    let made = create(h.client(), TokenRole::Viewer, "short-lived");
    assert!(made.token.id.starts_with("tok-"), "{:?}", made.token);
    let viewer = h.client().with_token(&made.secret);
    viewer.list_pools().unwrap();

    let listed = h.client().list_tokens().unwrap();
    let raw = serde_json::to_string(&listed.iter().map(|d| &d.raw).collect::<Vec<_>>()).unwrap();
    assert!(!raw.contains(&made.secret), "a secret in the list: {raw}");
    assert!(!raw.contains(&h.server().admin_token()[..16]), "{raw}");
    let mine = listed
        .iter()
        .find(|d| d.view.id == made.token.id)
        .expect("listed");
    assert_eq!(mine.view.role, TokenRole::Viewer);
    assert_eq!(mine.view.description, "short-lived");
    // The caller's own token is marked; its last use is written off the
    // request's path, so it is waited for.
    assert!(listed
        .iter()
        .any(|d| d.view.current && d.view.role == TokenRole::Admin));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let seen = h.client().list_tokens().unwrap();
        if seen
            .iter()
            .any(|d| d.view.id == made.token.id && d.view.last_used_ms.is_some())
        {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "last use never recorded: {seen:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }

    let revoked = h.client().revoke_token(&made.token.id).unwrap();
    assert_eq!(revoked.id, made.token.id);
    let (status, code, message) = refused(viewer.list_pools().unwrap_err());
    assert_eq!((status, code.as_str()), (401, "Unauthorized"));
    assert!(
        message.contains("revoked") && message.contains(&made.token.id),
        "{message}"
    );
    assert!(h
        .client()
        .list_tokens()
        .unwrap()
        .iter()
        .all(|d| d.view.id != made.token.id));

    // Expired: stored with an end already past (no waiting on a clock).
    let secret = "expired-token-secret-0123456789";
    h.server()
        .control
        .store()
        .add_api_token(
            "tok-expired0001",
            &knit_server::token_hash(secret),
            TokenRole::Admin,
            "",
            Some(knit_server::store::now_ms() - 1),
        )
        .unwrap();
    let (status, code, message) = refused(h.client().with_token(secret).list_pools().unwrap_err());
    assert_eq!((status, code.as_str()), (401, "Unauthorized"));
    assert!(message.contains("expired"), "{message}");

    // A TTL out of range is refused naming the field.
    let (status, text) = h
        .client()
        .raw(
            "POST",
            "/api/v1/tokens",
            Some(r#"{"role": "viewer", "ttlSeconds": 0}"#),
        )
        .unwrap();
    assert_eq!(status, 422, "{text}");
    assert!(text.contains("ttlSeconds"), "{text}");
}

/// The admin token file is the first admin token: it works, is listed as
/// an admin, cannot be revoked while it is the last admin, and can be once
/// another admin exists; a server restart does not bring it back.
#[test]
fn the_first_admin_token_is_revocable_once_another_admin_exists() {
    let mut h = harness();
    let first = h.client().list_tokens().unwrap();
    assert_eq!(first.len(), 1, "{first:?}");
    let first = &first[0].view;
    assert_eq!((first.role, first.current), (TokenRole::Admin, true));

    let (status, code, message) = refused(h.client().revoke_token(&first.id).unwrap_err());
    assert_eq!(
        (status, code.as_str()),
        (409, "LastAdminToken"),
        "{message}"
    );
    assert!(
        message.contains("knit token create --role admin"),
        "{message}"
    );

    let second = create(h.client(), TokenRole::Admin, "the next admin");
    let admin = h.client().with_token(&second.secret);
    admin.revoke_token(&first.id).unwrap();
    let (status, _, _) = refused(h.client().list_pools().unwrap_err());
    assert_eq!(status, 401, "the admin token file is revoked");
    let (status, code, _) = refused(admin.revoke_token(&second.token.id).unwrap_err());
    assert_eq!((status, code.as_str()), (409, "LastAdminToken"));

    // Restarted on the same state: the file's token stays revoked.
    let settings = h.settings.clone();
    h.stop();
    h.settings = settings;
    h.start(None);
    let (status, _, _) = refused(h.client().list_pools().unwrap_err());
    assert_eq!(status, 401, "the admin token file is revoked for good");
    let admin = h.client().with_token(&second.secret);
    assert_eq!(admin.list_tokens().unwrap().len(), 1);
}
